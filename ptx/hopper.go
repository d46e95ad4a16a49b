package ptx

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
)

// Hopper (sm_90) instructions of the copy-engine GEMM: mbarriers, bulk and tensor copies into
// shared memory, thread-block clusters (mapa, barrier.cluster), the fences they need, and the
// warpgroup MMA (wgmma) that reads its operands from that shared memory. Each is accepted in
// exactly the spellings listed in asyncForms; anything else with the same base opcode is an
// error that lists them.

// TensorAddr is a tensor copy's source [map, {c0, c1}]: Map is the 64-bit address of the tensor
// map, Coords the element coordinates, innermost first.
type TensorAddr struct {
	Map    Operand
	Coords Vec
}

func (a TensorAddr) operand() string {
	if a.Map == nil {
		return "[<nil>, " + a.Coords.operand() + "]"
	}
	return "[" + a.Map.operand() + ", " + a.Coords.operand() + "]"
}

// Cluster special registers: the CTA's rank in its cluster and the cluster's size.
const (
	ClusterCtaRank  Special = "%cluster_ctarank"
	ClusterNCtaRank Special = "%cluster_nctarank"
)

// Operand kinds of an async form, one letter each:
//
//	s  shared address: [reg32+off] or [shared array+off]
//	g  global (generic) address: [reg64+off]
//	t  tensor source [reg64, {reg32, reg32}]
//	u  32-bit register or integer immediate
//	a  shared address value: 32-bit register or shared array symbol
//	d  32-bit destination register
//	D  64-bit destination register
//	P  predicate destination
//	8  the immediate 128
//	w  wgmma.wait_group's count: an integer immediate 0..7
//	C  wgmma's accumulators: a vector {d0, ...} of N/2 f32 registers, N from the shape
//	q  64-bit source register (a shared-memory matrix descriptor)
//	e  scale-d: the immediate 1 (D = A*B + D) or a predicate (false: D = A*B)
//	n  imm-scale-a/b: the immediate 1 or -1 (-1 negates the operand)
//	0  imm-trans-a/b: the immediate 0 (K-major operands only)
//	_  the sink destination "_" (Sink)
//	h  16-bit register or integer immediate (a multicast copy's ctaMask)
type asyncForm struct {
	kinds   string
	version string // the PTX ISA version that introduced the form
}

var asyncForms = map[string]asyncForm{
	"mbarrier.init.shared::cta.b64":             {"su", "7.8"},
	"mbarrier.arrive.shared::cta.b64":           {"Ds", "7.8"},
	"mbarrier.arrive.expect_tx.shared::cta.b64": {"Dsu", "7.8"},
	"mbarrier.try_wait.parity.shared::cta.b64":  {"Psu", "7.8"},
	// An arrival on any CTA's mbarrier of the cluster (its address from mapa), with the
	// default semantics (release, CTA scope), as CUTLASS's cluster barriers arrive.
	"mbarrier.arrive.shared::cluster.b64":                                         {"_s", "8.0"},
	"cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes":           {"sgus", "7.8"},
	"cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes": {"sts", "7.8"},
	// The same box written to every CTA of the cluster whose rank's bit is set in ctaMask, at
	// the same offsets of their shared memory, each completing its own mbarrier there.
	"cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster": {"stsh", "7.8"},
	"mapa.shared::cluster.u32":                   {"dau", "7.8"},
	"barrier.cluster.arrive":                     {"", "7.8"},
	"barrier.cluster.arrive.release":             {"", "8.0"},
	"barrier.cluster.wait":                       {"", "7.8"},
	"barrier.cluster.wait.acquire":               {"", "8.0"},
	"fence.mbarrier_init.release.cluster":        {"", "8.0"},
	"fence.proxy.async.shared::cta":              {"", "8.0"},
	"fence.proxy.tensormap::generic.acquire.gpu": {"g8", "8.3"},
	// Warpgroup MMA, sm_90a only (ArchTarget): D[64xN] (+)= A[64x16] . B[16xN] with A and B
	// in shared memory, both K-major bf16, described by 64-bit descriptors, and D in f32
	// registers spread over the warpgroup's 128 threads. N of the shape is any multiple of 8
	// from 8 to 256 (wgmmaShape); the key spells it N.
	"wgmma.fence.sync.aligned":                            {"", "8.0"},
	"wgmma.commit_group.sync.aligned":                     {"", "8.0"},
	"wgmma.wait_group.sync.aligned":                       {"w", "8.0"},
	"wgmma.mma_async.sync.aligned.m64nNk16.f32.bf16.bf16": {"Cqqenn00", "8.0"},
}

// ArchTarget is the target the arch-specific Hopper instructions (wgmma) need: sm_90a, whose
// code runs on sm_90 GPUs only. A module whose target is sm_90 is printed with sm_90a when
// one of its kernels uses them (printTarget), the way its version is raised.
const ArchTarget = "sm_90a"

// needsArch reports whether o exists only on ArchTarget.
func needsArch(o Opcode) bool { return o.Base == "wgmma" }

// wgmmaShape writes the m64n<N>k16 part of op as m64nNk16, the way asyncForms spells it, and
// returns N; n is 0 where op has no such part and -1 where N does not fit an int. Whether N is
// allowed is wgmmaN's business, so that a wrong N is reported as such.
func wgmmaShape(op string) (key string, n int) {
	parts := strings.Split(op, ".")
	for i, p := range parts {
		mid, ok := strings.CutPrefix(p, "m64n")
		mid, ok2 := strings.CutSuffix(mid, "k16")
		if !ok || !ok2 || mid == "" || strings.Trim(mid, "0123456789") != "" {
			continue
		}
		n, err := strconv.Atoi(mid)
		if err != nil {
			n = -1
		}
		parts[i] = "m64nNk16"
		return strings.Join(parts, "."), n
	}
	return op, 0
}

// wgmmaN reports whether n is an N the bf16 wgmma shapes m64nNk16 allow.
func wgmmaN(n int) bool { return n >= 8 && n <= 256 && n%8 == 0 }

// formOf looks op up in asyncForms, a wgmma.mma_async by its shape's spelling with N; n is
// that N (0 for the other forms).
func formOf(op string) (f asyncForm, n int, ok bool) {
	key, n := wgmmaShape(op)
	f, ok = asyncForms[key]
	return f, n, ok
}

// isAsync reports whether o is one of the opcodes only asyncForms spells.
func isAsync(o Opcode) bool {
	switch o.Base {
	case "mbarrier", "cp", "mapa":
		return true
	case "barrier":
		return o.Has("cluster")
	case "fence":
		return o.Has("proxy") || o.Has("mbarrier_init")
	case "wgmma":
		return true
	}
	return false
}

// formsOf lists the accepted spellings with base opcode base, sorted; a shape with N says
// which N it takes.
func formsOf(base string) []string {
	var fs []string
	for op := range asyncForms {
		if ParseOpcode(op).Base == base {
			if strings.Contains(op, "m64nNk16") {
				op += " (N a multiple of 8 from 8 to 256)"
			}
			fs = append(fs, op)
		}
	}
	sort.Strings(fs)
	return fs
}

// asyncInstr validates an instruction that isAsync: the exact spelling, then each operand.
func (c *kernelCheck) asyncInstr(i int, in Instr, o Opcode) {
	f, n, ok := formOf(in.Op)
	if !ok {
		c.ierr(i, in, "unsupported form of %s; supported: %s", o.Base, strings.Join(formsOf(o.Base), ", "))
		return
	}
	if strings.Contains(f.kinds, "C") && !wgmmaN(n) {
		c.ierr(i, in, "shape m64nNk16 needs N a multiple of 8 from 8 to 256")
		return
	}
	if needsArch(o) && !archTargetOK(c.target) {
		c.ierr(i, in, "%s needs .target %s; the module's is %s", o.Base, ArchTarget, c.target)
	}
	if len(in.Args) != len(f.kinds) {
		c.ierr(i, in, "%s takes %d operands, has %d", in.Op, len(f.kinds), len(in.Args))
		return
	}
	for j, a := range in.Args {
		if a == nil {
			c.ierr(i, in, "operand %d is nil", j)
			continue
		}
		if msg := c.asyncOperand(i, in, f.kinds[j], a, n); msg != "" {
			c.ierr(i, in, "operand %d: %s", j, msg)
		}
	}
}

// archTargetOK reports whether a module with target t may hold sm_90a-only instructions:
// it names sm_90a, or sm_90, which printTarget raises. An empty target is reported as such
// elsewhere.
func archTargetOK(t string) bool {
	first, _, _ := strings.Cut(t, ",")
	return t == "" || first == Target || first == ArchTarget
}

func isReg32(r Reg) bool { return classOf(r.T) == "r" }
func isReg64(r Reg) bool { return classOf(r.T) == "rd" }

// asyncOperand checks one operand against its kind letter; "" means fine. n is a wgmma
// shape's N (the accumulators number N/2). Undeclared registers are reported by c.reg itself.
func (c *kernelCheck) asyncOperand(i int, in Instr, kind byte, a Operand, n int) string {
	reg := func(r Reg, ok func(Reg) bool, what string) string {
		if !c.reg(i, in, r) || ok(r) {
			return ""
		}
		return fmt.Sprintf("register %s must be %s", r, what)
	}
	switch kind {
	case 's', 'g':
		ad, ok := a.(Addr)
		if !ok {
			return "must be an address [..]"
		}
		switch b := ad.Base.(type) {
		case Reg:
			if kind == 's' {
				return reg(b, isReg32, "a 32-bit register (a shared address)")
			}
			return reg(b, isReg64, "a 64-bit register (a global address)")
		case Sym:
			if kind == 's' && c.shared[string(b)] {
				return ""
			}
			if kind == 's' {
				return fmt.Sprintf("shared array %s does not exist", b)
			}
			return fmt.Sprintf("symbol %s cannot be a global address", b)
		}
		return "address base must be a register or a symbol"
	case 't':
		ta, ok := a.(TensorAddr)
		if !ok {
			return "must be a tensor source [map, {c0, c1}]"
		}
		m, ok := ta.Map.(Reg)
		if !ok {
			return "tensor map must be a 64-bit register"
		}
		if msg := reg(m, isReg64, "a 64-bit register (the tensor map's address)"); msg != "" {
			return msg
		}
		if len(ta.Coords) != 2 {
			return fmt.Sprintf("a 2-D tensor copy takes 2 coordinates, has %d", len(ta.Coords))
		}
		for _, r := range ta.Coords {
			if msg := reg(r, isReg32, "a 32-bit register (a coordinate)"); msg != "" {
				return msg
			}
		}
		return ""
	case 'u':
		switch a := a.(type) {
		case Imm:
			return ""
		case Reg:
			return reg(a, isReg32, "a 32-bit register")
		}
		return "must be a 32-bit register or an integer immediate"
	case 'a':
		switch a := a.(type) {
		case Sym:
			if !c.shared[string(a)] {
				return fmt.Sprintf("shared array %s does not exist", a)
			}
			return ""
		case Reg:
			return reg(a, isReg32, "a 32-bit register (a shared address)")
		}
		return "must be a 32-bit register or a shared array"
	case 'd', 'D', 'P':
		r, ok := a.(Reg)
		if !ok {
			return "destination must be a register"
		}
		switch kind {
		case 'd':
			return reg(r, isReg32, "a 32-bit register")
		case 'D':
			return reg(r, isReg64, "a 64-bit register")
		}
		return reg(r, func(r Reg) bool { return r.T == Pred }, "a predicate")
	case '8':
		if a != Imm(128) {
			return "must be the immediate 128 (a tensor map's size)"
		}
		return ""
	case 'w':
		if v, ok := a.(Imm); !ok || v < 0 || v > 7 {
			return "must be an integer immediate 0..7 (the number of MMA groups left pending)"
		}
		return ""
	case 'C':
		v, ok := a.(Vec)
		if !ok {
			return "must be a vector {d0, ...} of the f32 accumulators"
		}
		if len(v) != n/2 {
			return fmt.Sprintf("m64n%dk16 takes a vector of %d accumulators, has %d", n, n/2, len(v))
		}
		for _, r := range v {
			if msg := reg(r, func(r Reg) bool { return r.T == F32 }, "an f32 register (an accumulator)"); msg != "" {
				return msg
			}
		}
		return ""
	case 'q':
		if r, ok := a.(Reg); ok {
			return reg(r, isReg64, "a 64-bit register (a matrix descriptor)")
		}
		return "must be a 64-bit register (a matrix descriptor)"
	case 'e':
		if r, ok := a.(Reg); ok {
			return reg(r, func(r Reg) bool { return r.T == Pred }, "a predicate (scale-d)")
		}
		if a != Imm(1) {
			return "scale-d must be the immediate 1 (D = A*B + D) or a predicate (false: D = A*B)"
		}
		return ""
	case 'n':
		if a != Imm(1) && a != Imm(-1) {
			return "must be the immediate 1 or -1 (imm-scale: -1 negates the operand)"
		}
		return ""
	case '_':
		if a != Sink {
			return "must be the sink _ (an arrival on another CTA's mbarrier returns no state)"
		}
		return ""
	case 'h':
		switch a := a.(type) {
		case Imm:
			if a < 0 || a > 0xffff {
				return "must be a 16-bit mask (0..65535)"
			}
			return ""
		case Reg:
			return reg(a, func(r Reg) bool { return classOf(r.T) == "rs" }, "a 16-bit register (the CTA mask)")
		}
		return "must be a 16-bit register or an integer immediate (the CTA mask)"
	case '0':
		if a != Imm(0) {
			return "must be the immediate 0 (imm-trans: only K-major operands are supported)"
		}
		return ""
	}
	return fmt.Sprintf("unknown operand kind %q", kind)
}

// isSharedSpace reports whether o names the shared state space in any of its spellings.
func isSharedSpace(o Opcode) bool {
	return o.Has("shared") || o.Has("shared::cta") || o.Has("shared::cluster")
}

// version numbers compare as major.minor; an unreadable one compares as 0.0.
func versionLess(a, b string) bool {
	pa, pb := versionParts(a), versionParts(b)
	return pa[0] < pb[0] || pa[0] == pb[0] && pa[1] < pb[1]
}

func versionParts(v string) [2]int {
	maj, min, _ := strings.Cut(v, ".")
	x, _ := strconv.Atoi(maj)
	y, _ := strconv.Atoi(min)
	return [2]int{x, y}
}

// MinVersion is the lowest PTX ISA version the module's contents need ("" when nothing beyond
// the oldest version xmix knows): clusters and shared::cluster accesses need 7.8, wgmma 8.0,
// the tensor map fence 8.3.
func (m *Module) MinVersion() string {
	need := ""
	bump := func(v string) {
		if need == "" || versionLess(need, v) {
			need = v
		}
	}
	for _, k := range m.Kernels {
		if k.ClusterX > 0 {
			bump("7.8")
		}
		for _, in := range k.Body {
			if f, _, ok := formOf(in.Op); ok {
				bump(f.version)
			} else if strings.Contains(in.Op, "shared::c") {
				bump("7.8")
			}
		}
	}
	return need
}

// printVersion is the version Print declares: the module's, raised to what its contents need.
func (m *Module) printVersion() string {
	if need := m.MinVersion(); need != "" && versionLess(m.Version, need) {
		return need
	}
	return m.Version
}

// printTarget is the target Print declares: the module's, with sm_90 raised to sm_90a when a
// kernel uses an instruction only sm_90a has (wgmma). Other targets are kept: Validate
// reports such an instruction under them.
func (m *Module) printTarget() string {
	first, rest, more := strings.Cut(m.Target, ",")
	if first != Target || !m.usesArch() {
		return m.Target
	}
	if more {
		return ArchTarget + "," + rest
	}
	return ArchTarget
}

// usesArch reports whether a kernel of m holds an instruction only ArchTarget has.
func (m *Module) usesArch() bool {
	for _, k := range m.Kernels {
		for _, in := range k.Body {
			if in.Label == "" && needsArch(ParseOpcode(in.Op)) {
				return true
			}
		}
	}
	return false
}

// maxCluster is the largest portable cluster size.
const maxCluster = 8
