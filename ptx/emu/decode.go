package emu

import (
	"fmt"
	"math"

	"xmix/ptx"
)

// code is a decoded operation. Variants that change the arithmetic (mul.hi, mul.wide) get
// their own code so the interpreter never looks at modifier strings.
type code uint8

const (
	cNop code = iota
	cMov
	cLd
	cSt
	cPrefetch
	cAdd
	cSub
	cMul
	cMulHi
	cMulWide
	cMad
	cMadHi
	cMadWide
	cFma
	cDiv
	cRem
	cMin
	cMax
	cNeg
	cAbs
	cNot
	cAnd
	cOr
	cXor
	cShl
	cShr
	cPopc
	cClz
	cSqrt
	cRsqrt
	cRcp
	cEx2
	cLg2
	cSin
	cCos
	cTanh
	cSetp
	cSelp
	cCvt
	cShfl
	cBar
	cAtom
	cBra
	cExit
	cMma     // warp-collective, resolved with shfl in block.collective
	cPack    // mov.b32 d, {lo, hi}
	cCvtPack // cvt.rn.bf16x2.f32 d, hi, lo
	cPrmt    // prmt.b32 d, a, b, selector
	cClusterArrive
	cClusterWait
	cMbarInit
	cMbarArrive
	cMbarWait
	cBulk   // cp.async.bulk global -> shared
	cTensor // cp.async.bulk.tensor.2d global -> shared
	cMapa
	cTrap
	cWgmma    // wgmma.mma_async: warp-collective like cMma (fence, commit and wait decode to cNop)
	cGridWait // griddepcontrol.wait: the grid ahead has ended (the thread's loads are no longer early)
)

var simple = map[string]code{
	"mov": cMov, "cvta": cMov, "add": cAdd, "sub": cSub, "mul": cMul, "mad": cMad, "fma": cFma, "div": cDiv, "rem": cRem,
	"min": cMin, "max": cMax, "neg": cNeg, "abs": cAbs, "not": cNot, "and": cAnd, "or": cOr,
	"xor": cXor, "shl": cShl, "shr": cShr, "popc": cPopc, "clz": cClz, "sqrt": cSqrt,
	"rsqrt": cRsqrt, "rcp": cRcp, "ex2": cEx2, "lg2": cLg2, "sin": cSin, "cos": cCos,
	"tanh": cTanh, "setp": cSetp, "selp": cSelp, "cvt": cCvt, "shfl": cShfl, "bar": cBar,
	"barrier": cBar, "atom": cAtom, "red": cAtom, "bra": cBra, "ret": cExit, "exit": cExit,
	"membar": cNop, "fence": cNop, "griddepcontrol": cNop, "prefetch": cPrefetch, "ld": cLd, "st": cSt, "mma": cMma,
	"prmt": cPrmt, "mbarrier": cMbarInit, "cp": cBulk, "mapa": cMapa, "trap": cTrap,
	"wgmma": cWgmma,
}

// Modes of setp, shfl, atom and cvt, kept in inst.mode.
const (
	cmpEq uint8 = iota
	cmpNe
	cmpLt
	cmpLe
	cmpGt
	cmpGe
	cmpLo
	cmpLs
	cmpHi
	cmpHs
	cmpEqu
	cmpNeu
	cmpLtu
	cmpLeu
	cmpGtu
	cmpGeu
	cmpNum
	cmpNan
)

var cmpNames = []string{"eq", "ne", "lt", "le", "gt", "ge", "lo", "ls", "hi", "hs", "equ", "neu", "ltu", "leu", "gtu", "geu", "num", "nan"}

const (
	boolNone uint8 = iota
	boolAnd
	boolOr
	boolXor
)

const (
	shflBfly uint8 = iota
	shflDown
	shflUp
	shflIdx
)

const (
	atomAdd uint8 = iota
	atomMin
	atomMax
	atomExch
	atomCas
	atomAnd
	atomOr
	atomXor
	atomInc
	atomDec
)

var atomNames = []string{"add", "min", "max", "exch", "cas", "and", "or", "xor", "inc", "dec"}

const (
	rndNearest uint8 = iota // rn and the default
	rndZero
	rndDown
	rndUp
)

// Memory spaces.
const (
	spGlobal  uint8 = iota
	spShared        // this block's shared memory
	spCluster       // any block of the cluster's (an address from mapa, or this block's)
)

// opnd is a source value: a register slot, or an immediate when reg < 0.
type opnd struct {
	reg int32
	imm uint64
}

// inst is one decoded instruction.
type inst struct {
	op     code
	t, t2  ptx.Type
	w      uint8  // width of t in bits
	flt    bool   // t is f32 or f64
	sgn    bool   // t is a signed integer
	m      uint64 // mask of t's width
	mode   uint8  // cmp, shfl, atom or rounding mode
	bop    uint8  // setp's boolean combiner; cvt's integer-rounding flag
	sat    bool
	space  uint8
	nvec   uint8
	hasDst bool
	gneg   bool
	guard  int32 // predicate slot, -1 when unguarded
	d      [4]int32
	a, b   opnd
	c, e   opnd
	base   opnd
	off    int64
	target int32
	src    int32   // index in the kernel body, for messages
	frag   []int32 // mma's source slots: a0..a3, b0, b1, c0..c3; wgmma's accumulators
	ext    *asyncArgs
}

// asyncArgs holds the further memory operands of bulk copies: base/off is the shared
// destination, src the global source or the tensor map, mbar the mbarrier to complete.
type asyncArgs struct {
	src, mbar       opnd
	srcOff, mbarOff int64
	coords          [2]opnd
	mask            opnd // a multicast copy's ctaMask
	multicast       bool
}

// Special-register slots follow the kernel's registers in each thread's register file.
const (
	sTidX = iota
	sTidY
	sTidZ
	sNTidX
	sNTidY
	sNTidZ
	sCtaidX
	sCtaidY
	sCtaidZ
	sNCtaidX
	sNCtaidY
	sNCtaidZ
	sLane
	sWarp
	sNWarp
	sClusterRank
	sClusterSize
	sGlobalTimer
	sSMID
	nSpecial
)

var specialSlot = map[ptx.Special]int{
	"%tid.x": sTidX, "%tid.y": sTidY, "%tid.z": sTidZ,
	"%ntid.x": sNTidX, "%ntid.y": sNTidY, "%ntid.z": sNTidZ,
	"%ctaid.x": sCtaidX, "%ctaid.y": sCtaidY, "%ctaid.z": sCtaidZ,
	"%nctaid.x": sNCtaidX, "%nctaid.y": sNCtaidY, "%nctaid.z": sNCtaidZ,
	"%laneid": sLane, "%warpid": sWarp, "%nwarpid": sNWarp,
	ptx.ClusterCtaRank: sClusterRank, ptx.ClusterNCtaRank: sClusterSize, ptx.GlobalTimer: sGlobalTimer,
	ptx.SMID: sSMID,
}

// program is a kernel decoded for one launch: the parameters are folded into ld.param.
type program struct {
	k         *ptx.Kernel
	code      []inst
	nregs     int // register-file slots per thread, specials included
	specials  int // slot of the first special register
	sharedLen int
}

type decoder struct {
	k          *ptx.Kernel
	classOf    map[string]int // class -> first slot
	shared     map[string]uint64
	params     map[string]uint64
	byteParams map[string]uint64
	labels     map[string]int32
	p          *program
}

var classOrder = []string{"p", "rs", "r", "rd", "f", "fd"}

// decode prepares k for a launch with params and dyn bytes of dynamic shared memory.
func decode(k *ptx.Kernel, params []uint64, dyn int) (*program, error) {
	d := &decoder{k: k, classOf: map[string]int{}, shared: map[string]uint64{}, params: map[string]uint64{}, byteParams: map[string]uint64{}, labels: map[string]int32{}, p: &program{k: k}}
	decls := k.RegDecls
	if decls == nil {
		decls = usedRegs(k)
	}
	slots := 0
	for _, c := range classOrder {
		d.classOf[c] = slots
		slots += decls[c] + 1
	}
	d.p.specials = slots
	d.p.nregs = slots + nSpecial
	off := 0
	for _, s := range k.Shared {
		if !s.Extern {
			off = (off + s.Align - 1) / s.Align * s.Align
			d.shared[s.Name] = uint64(off)
			off += s.Len * s.T.Bytes()
		}
	}
	for _, s := range k.Shared {
		if s.Extern {
			off = (off + s.Align - 1) / s.Align * s.Align
			d.shared[s.Name] = uint64(off)
		}
	}
	d.p.sharedLen = off + dyn
	for i, p := range k.Params {
		if p.Len > 0 {
			// A byte-array parameter (a tensor map) stands in global memory, where the
			// launch's value points: mov of its symbol gives that address and cvta.param
			// keeps it, so the kernel reads the bytes where a GPU would read its copy.
			d.byteParams[p.Name] = params[i]
			continue
		}
		d.params[p.Name] = params[i]
	}
	n := int32(0)
	for _, in := range k.Body {
		if in.Label != "" {
			d.labels[in.Label] = n
		} else {
			n++
		}
	}
	for i, in := range k.Body {
		if in.Label != "" {
			continue
		}
		di, err := d.instr(in)
		if err != nil {
			return nil, fmt.Errorf("kernel %s: instr %d (%s): %w", k.Name, i, in, err)
		}
		di.src = int32(i)
		di.w, di.m, di.flt, di.sgn = uint8(width(di.t)), mask(di.t), isFloat(di.t), isSigned(di.t)
		d.p.code = append(d.p.code, di)
	}
	// Falling off the end of the body ends the thread, as ret would.
	d.p.code = append(d.p.code, inst{op: cExit, guard: -1, src: int32(len(k.Body))})
	return d.p, nil
}

// usedRegs sizes the register file of a kernel that comes straight from the builder, which
// keeps its counts to itself: the highest index used per class.
func usedRegs(k *ptx.Kernel) map[string]int {
	n := map[string]int{}
	see := func(r ptx.Reg) { n[classes[r.T]] = max(n[classes[r.T]], r.N) }
	for _, in := range k.Body {
		if in.Guard != nil {
			see(*in.Guard)
		}
		for _, a := range in.Args {
			switch a := a.(type) {
			case ptx.Reg:
				see(a)
			case ptx.Vec:
				for _, r := range a {
					see(r)
				}
			case ptx.Addr:
				if r, ok := a.Base.(ptx.Reg); ok {
					see(r)
				}
			case ptx.TensorAddr:
				if r, ok := a.Map.(ptx.Reg); ok {
					see(r)
				}
				for _, r := range a.Coords {
					see(r)
				}
			}
		}
	}
	return n
}

func (d *decoder) slot(r ptx.Reg) int32 {
	return int32(d.classOf[classes[r.T]] + r.N)
}

// classes maps each type to its register class, as the printer names them.
var classes = func() map[ptx.Type]string {
	m := map[ptx.Type]string{}
	for t := ptx.Pred; t <= ptx.F64; t++ {
		name := ptx.Reg{T: t}.String() // "%f0"
		m[t] = name[1 : len(name)-1]
	}
	return m
}()

// value decodes a source operand; immediates become the bits of type t.
func (d *decoder) value(a ptx.Operand, t ptx.Type) (opnd, error) {
	switch a := a.(type) {
	case ptx.Reg:
		return opnd{reg: d.slot(a)}, nil
	case ptx.Special:
		s, ok := specialSlot[a]
		if !ok {
			return opnd{}, fmt.Errorf("unsupported special register %s", a)
		}
		return opnd{reg: int32(d.p.specials + s)}, nil
	case ptx.Imm:
		switch t {
		case ptx.F32:
			return opnd{reg: -1, imm: uint64(math.Float32bits(float32(a)))}, nil
		case ptx.F64:
			return opnd{reg: -1, imm: math.Float64bits(float64(a))}, nil
		}
		return opnd{reg: -1, imm: uint64(a)}, nil
	case ptx.F32Imm:
		if t == ptx.F64 {
			return opnd{reg: -1, imm: math.Float64bits(float64(a))}, nil
		}
		return opnd{reg: -1, imm: uint64(math.Float32bits(float32(a)))}, nil
	case ptx.Sym:
		if off, ok := d.shared[string(a)]; ok {
			return opnd{reg: -1, imm: off}, nil
		}
		if addr, ok := d.byteParams[string(a)]; ok {
			return opnd{reg: -1, imm: addr}, nil
		}
		return opnd{}, fmt.Errorf("symbol %s is not a shared array or a byte-array parameter", a)
	}
	return opnd{}, fmt.Errorf("unsupported operand %T", a)
}

func (d *decoder) dst(in *inst, a ptx.Operand) error {
	switch a := a.(type) {
	case ptx.Reg:
		in.d[0], in.nvec = d.slot(a), 1
	case ptx.Vec:
		if len(a) > 4 {
			return fmt.Errorf("vector of %d registers", len(a))
		}
		for i, r := range a {
			in.d[i] = d.slot(r)
		}
		in.nvec = uint8(len(a))
	default:
		return fmt.Errorf("destination must be a register")
	}
	in.hasDst = true
	return nil
}

func (d *decoder) addr(in *inst, a ptx.Operand, o ptx.Opcode) error {
	ad, ok := a.(ptx.Addr)
	if !ok {
		return fmt.Errorf("expected an address operand")
	}
	in.off = ad.Offset
	in.space = spGlobal
	switch {
	case o.Has("shared"), o.Has("shared::cta"):
		in.space = spShared
	case o.Has("shared::cluster"):
		in.space = spCluster
	case o.Has("local"), o.Has("const"):
		return fmt.Errorf("local and const memory are not supported")
	}
	var err error
	in.base, err = d.value(ad.Base, ptx.U64)
	return err
}

func (d *decoder) instr(src ptx.Instr) (inst, error) {
	o := ptx.ParseOpcode(src.Op)
	in := inst{guard: -1, t: o.Type()}
	if src.Guard != nil {
		in.guard, in.gneg = d.slot(*src.Guard), src.GuardNeg
	}
	op, ok := simple[o.Base]
	if !ok {
		return in, fmt.Errorf("unsupported instruction %s", o.Base)
	}
	in.op = op
	args := src.Args
	var err error
	srcs := func(from int, types ...ptx.Type) error {
		ptrs := []*opnd{&in.a, &in.b, &in.c, &in.e}
		for j := from; j < len(args); j++ {
			t := in.t
			if j-from < len(types) {
				t = types[j-from]
			}
			if *ptrs[j-from], err = d.value(args[j], t); err != nil {
				return fmt.Errorf("operand %d: %w", j, err)
			}
		}
		return nil
	}
	switch op {
	case cLd:
		if o.Has("param") {
			ad, ok := args[1].(ptx.Addr)
			name, isSym := ad.Base.(ptx.Sym)
			v, found := d.params[string(name)]
			if !ok || !isSym || !found || ad.Offset != 0 {
				return in, fmt.Errorf("ld.param needs [param] of a declared parameter")
			}
			in.op, in.a = cMov, opnd{reg: -1, imm: v}
			return in, d.dst(&in, args[0])
		}
		if err := d.dst(&in, args[0]); err != nil {
			return in, err
		}
		return in, d.addr(&in, args[1], o)
	case cPrefetch:
		if !o.Has("global") {
			return in, fmt.Errorf("prefetch: only prefetch.global is supported")
		}
		return in, d.addr(&in, args[0], o)
	case cSt:
		if err := d.addr(&in, args[0], o); err != nil {
			return in, err
		}
		switch v := args[1].(type) {
		case ptx.Vec:
			for i, r := range v {
				in.d[i] = d.slot(r)
			}
			in.nvec = uint8(len(v))
		case ptx.Reg:
			in.d[0], in.nvec = d.slot(v), 1
		default:
			// A stored immediate goes through a scratch copy in a.
			in.nvec = 0
			if in.a, err = d.value(v, in.t); err != nil {
				return in, err
			}
		}
		return in, nil
	case cAtom:
		in.mode = 255
		for i, n := range atomNames {
			if o.Has(n) {
				in.mode = uint8(i)
			}
		}
		if in.mode == 255 {
			return in, fmt.Errorf("atomic without an operation")
		}
		if o.Base == "red" {
			if err := d.addr(&in, args[0], o); err != nil {
				return in, err
			}
			return in, srcs(1)
		}
		if err := d.dst(&in, args[0]); err != nil {
			return in, err
		}
		if err := d.addr(&in, args[1], o); err != nil {
			return in, err
		}
		return in, srcs(2)
	case cBra:
		name, ok := args[0].(ptx.Sym)
		target, found := d.labels[string(name)]
		if !ok || !found {
			return in, fmt.Errorf("branch target %v is not a label", args[0])
		}
		in.target = target
		return in, nil
	case cBar:
		switch {
		case o.Has("cluster") && o.Has("arrive"):
			in.op = cClusterArrive
		case o.Has("cluster"):
			in.op = cClusterWait
		case o.Has("warp"):
			in.op = cNop // bar.warp.sync: the lanes of a warp run in order here anyway
		default:
			// bar.sync id[, count]: count 0 stands for every live thread of the block.
			in.a, in.b = opnd{reg: -1}, opnd{reg: -1}
			var err error
			if len(args) > 0 {
				if in.a, err = d.value(args[0], ptx.U32); err != nil {
					return in, err
				}
			}
			if len(args) > 1 {
				if in.b, err = d.value(args[1], ptx.U32); err != nil {
					return in, err
				}
			}
		}
		return in, nil
	case cMbarInit, cBulk, cMapa:
		return in, d.async(&in, o, args)
	case cWgmma:
		return in, d.wgmma(&in, o, args)
	case cMma:
		if err := d.dst(&in, args[0]); err != nil {
			return in, err
		}
		for j, n := range []int{4, 2, 4} {
			v, ok := args[j+1].(ptx.Vec)
			if !ok || len(v) != n {
				return in, fmt.Errorf("mma operand %d: want a vector of %d registers", j+1, n)
			}
			for _, r := range v {
				in.frag = append(in.frag, d.slot(r))
			}
		}
		return in, nil
	case cMov:
		if v, ok := args[1].(ptx.Vec); ok {
			if len(v) != 2 {
				return in, fmt.Errorf("mov packs exactly two registers")
			}
			in.op, in.a, in.b = cPack, opnd{reg: d.slot(v[0])}, opnd{reg: d.slot(v[1])}
			return in, d.dst(&in, args[0])
		}
	case cNop:
		if o.Base == "griddepcontrol" && o.Has("wait") {
			in.op = cGridWait
		}
		return in, nil
	case cExit, cTrap:
		return in, nil
	case cMul, cMad:
		switch {
		case o.Has("hi"):
			in.op++ // cMulHi, cMadHi
		case o.Has("wide"):
			in.op += 2 // cMulWide, cMadWide
		}
	case cSetp:
		in.mode = 255
		for i, n := range cmpNames {
			if o.Has(n) {
				in.mode = uint8(i)
			}
		}
		if in.mode == 255 {
			return in, fmt.Errorf("setp without a comparison")
		}
		switch {
		case o.Has("and"):
			in.bop = boolAnd
		case o.Has("or"):
			in.bop = boolOr
		case o.Has("xor"):
			in.bop = boolXor
		}
		if err := d.dst(&in, args[0]); err != nil {
			return in, err
		}
		return in, srcs(1, in.t, in.t, ptx.Pred)
	case cSelp:
		if err := d.dst(&in, args[0]); err != nil {
			return in, err
		}
		return in, srcs(1, in.t, in.t, ptx.Pred)
	case cCvt:
		for _, m := range o.Mods {
			switch m {
			case "rz", "rzi":
				in.mode = rndZero
			case "rm", "rmi":
				in.mode = rndDown
			case "rp", "rpi":
				in.mode = rndUp
			case "sat":
				in.sat = true
			}
			if len(m) == 3 && m[2] == 'i' {
				in.bop = 1 // round to an integer even when the result is a float
			}
		}
		if o.Has("bf16x2") {
			in.op = cCvtPack
			if err := d.dst(&in, args[0]); err != nil {
				return in, err
			}
			return in, srcs(1, ptx.F32, ptx.F32)
		}
		if len(o.Types) != 2 {
			return in, fmt.Errorf("cvt needs two types")
		}
		in.t2 = o.Types[1]
		if err := d.dst(&in, args[0]); err != nil {
			return in, err
		}
		return in, srcs(1, in.t2)
	case cShfl:
		switch {
		case o.Has("bfly"):
			in.mode = shflBfly
		case o.Has("down"):
			in.mode = shflDown
		case o.Has("up"):
			in.mode = shflUp
		case o.Has("idx"):
			in.mode = shflIdx
		default:
			return in, fmt.Errorf("shfl without a mode")
		}
		if err := d.dst(&in, args[0]); err != nil {
			return in, err
		}
		return in, srcs(1, ptx.B32, ptx.U32, ptx.U32, ptx.U32)
	case cShl, cShr:
		if err := d.dst(&in, args[0]); err != nil {
			return in, err
		}
		return in, srcs(1, in.t, ptx.U32)
	}
	if len(args) == 0 {
		return in, fmt.Errorf("missing operands")
	}
	if err := d.dst(&in, args[0]); err != nil {
		return in, err
	}
	if op == cMadWide {
		return in, srcs(1, in.t, in.t, wideOf(in.t))
	}
	return in, srcs(1)
}

func wideOf(t ptx.Type) ptx.Type {
	switch t {
	case ptx.U16:
		return ptx.U32
	case ptx.S16:
		return ptx.S32
	case ptx.U32:
		return ptx.U64
	case ptx.S32:
		return ptx.S64
	}
	return t
}
