package ptx

import (
	"errors"
	"fmt"
	"strings"
)

// Validate checks what ptxas would reject and the emulator would trip over: the module
// header, declared registers, known opcodes with the right type suffixes, modifiers and
// operand counts, operand kinds (addresses where memory is accessed, registers where results
// go, register classes that fit the instruction type), symbols that resolve to a parameter,
// a shared array or a label, and unique labels. It returns every problem found, each naming
// the kernel and the instruction index.
func Validate(m *Module) error {
	var errs []error
	if m.Version == "" {
		errs = append(errs, errors.New("module: missing .version"))
	}
	if m.Target == "" {
		errs = append(errs, errors.New("module: missing .target"))
	}
	seen := map[string]bool{}
	for _, k := range m.Kernels {
		if seen[k.Name] {
			errs = append(errs, fmt.Errorf("kernel %s: duplicate entry", k.Name))
		}
		seen[k.Name] = true
		errs = append(errs, validateKernel(k, m.Target)...)
	}
	return errors.Join(errs...)
}

type kernelCheck struct {
	k      *Kernel
	target string // the module's, which sm_90a-only instructions need to be sm_90(a)
	counts map[string]int
	params map[string]Type
	// byteParams are the array parameters (Param.Len > 0): mov.u64 takes their address.
	byteParams map[string]bool
	shared     map[string]bool
	labels     map[string]bool
	errs       []error
}

func validateKernel(k *Kernel, target string) []error {
	c := &kernelCheck{k: k, target: target, counts: k.regCounts(), params: map[string]Type{}, byteParams: map[string]bool{}, shared: map[string]bool{}, labels: map[string]bool{}}
	if k.Name == "" {
		c.errs = append(c.errs, errors.New("kernel with no name"))
	}
	for _, p := range k.Params {
		if _, dup := c.params[p.Name]; dup {
			c.kerr("duplicate parameter %s", p.Name)
		}
		c.params[p.Name] = p.T
		if p.Len > 0 {
			c.byteParams[p.Name] = true
			if p.T != B8 || p.Align <= 0 || p.Align&(p.Align-1) != 0 {
				c.kerr("parameter %s: an array parameter is .b8 with a power-of-two alignment", p.Name)
			}
		}
	}
	if k.ClusterX < 0 || k.ClusterX > maxCluster {
		c.kerr("cluster size %d is outside 1..%d", k.ClusterX, maxCluster)
	}
	extern := 0
	for _, s := range k.Shared {
		if c.shared[s.Name] || c.params[s.Name] != 0 {
			c.kerr("duplicate symbol %s", s.Name)
		}
		switch {
		case s.Extern:
			extern++
			if s.Len != 0 || s.Align < 1 || s.Align&(s.Align-1) != 0 {
				c.kerr("dynamic shared %s: bad length %d (want 0) or alignment %d", s.Name, s.Len, s.Align)
			}
		case s.Len < 1 || s.Align < 1 || s.Align&(s.Align-1) != 0:
			c.kerr("shared %s: bad length %d or alignment %d", s.Name, s.Len, s.Align)
		}
		c.shared[s.Name] = true
	}
	if extern > 1 {
		c.kerr("%d dynamic shared arrays; a kernel has at most one", extern)
	}
	for i, in := range k.Body {
		if in.Label == "" {
			continue
		}
		if c.labels[in.Label] {
			c.ierr(i, in, "duplicate label %s", in.Label)
		}
		c.labels[in.Label] = true
	}
	for i, in := range k.Body {
		if in.Label == "" {
			c.instr(i, in)
		}
	}
	return c.errs
}

func (c *kernelCheck) kerr(format string, args ...any) {
	c.errs = append(c.errs, fmt.Errorf("kernel %s: %s", c.k.Name, fmt.Sprintf(format, args...)))
}

func (c *kernelCheck) ierr(i int, in Instr, format string, args ...any) {
	c.errs = append(c.errs, fmt.Errorf("kernel %s: instr %d (%s): %s", c.k.Name, i, in, fmt.Sprintf(format, args...)))
}

// reg checks that r is declared: %r<N> declares %r0..%r(N-1).
func (c *kernelCheck) reg(i int, in Instr, r Reg) bool {
	if int(r.T) >= len(typeFacts) || typeFacts[r.T].class == "" {
		c.ierr(i, in, "register with bad type %d", r.T)
		return false
	}
	if n, ok := c.counts[classOf(r.T)]; !ok || r.N < 0 || r.N > n {
		c.ierr(i, in, "register %s is not declared", r)
		return false
	}
	return true
}

func (c *kernelCheck) instr(i int, in Instr) {
	if in.Guard != nil && c.reg(i, in, *in.Guard) && in.Guard.T != Pred {
		c.ierr(i, in, "guard %s is not a predicate", *in.Guard)
	}
	o := ParseOpcode(in.Op)
	if isAsync(o) {
		c.asyncInstr(i, in, o)
		return
	}
	f, ok := opTable[o.Base]
	if !ok {
		c.ierr(i, in, "unknown opcode %s", o.Base)
		return
	}
	for _, m := range o.Mods {
		if !strings.Contains(f.mods, " "+m+" ") {
			c.ierr(i, in, "modifier .%s is not valid for %s", m, o.Base)
		}
	}
	if nt := typeCount(o, f); len(o.Types) != nt {
		c.ierr(i, in, "%s takes %d type suffixes, has %d", o.Base, nt, len(o.Types))
		return
	}
	for _, t := range o.Types {
		if !f.types.has(t) {
			c.ierr(i, in, "type .%s is not valid for %s", t, o.Base)
			return
		}
	}
	if rule := modRule(o); rule != "" {
		c.ierr(i, in, "%s %s", o.Base, rule)
	}
	if o.Base == "setp" && (len(in.Args) == 4) != (o.count("and or xor") == 1) {
		c.ierr(i, in, "setp takes a fourth predicate operand exactly when it has .and/.or/.xor")
	}
	nOK := false
	for _, n := range f.nargs {
		nOK = nOK || n == len(in.Args)
	}
	if !nOK {
		c.ierr(i, in, "%s takes %v operands, has %d", o.Base, f.nargs, len(in.Args))
		return
	}
	if o.Base == "cvt" && (len(in.Args) == 3) != o.Has("bf16x2") {
		c.ierr(i, in, "cvt takes three operands exactly when it packs (.bf16x2)")
		return
	}
	want := operandTypes(o, len(in.Args))
	for j, a := range in.Args {
		c.operand(i, in, o, f, j, a, want[j])
	}
}

// operandTypes is the type each operand must fit, 0 where any kind of value goes.
func operandTypes(o Opcode, n int) []Type {
	t := o.Type()
	ts := make([]Type, n)
	for j := range ts {
		ts[j] = t
	}
	switch o.Base {
	case "mul", "mad":
		if o.Has("wide") {
			ts[0] = wider(t)
			if o.Base == "mad" {
				ts[3] = wider(t)
			}
		}
	case "shl", "shr":
		ts[2] = U32
	case "setp":
		ts[0] = Pred
		if n == 4 {
			ts[3] = Pred
		}
	case "selp":
		ts[3] = Pred
	case "cvt":
		if o.Has("bf16x2") {
			ts[0] = B32
			break
		}
		ts[1] = o.Types[1]
	case "mma":
		ts[0], ts[1], ts[2], ts[3] = F32, B32, B32, F32
	case "shfl":
		ts[2], ts[3], ts[4] = U32, U32, U32
	case "popc", "clz":
		ts[0] = U32
	case "bar", "barrier":
		ts[0] = U32
		if n == 2 {
			ts[1] = U32
		}
	case "bra":
		ts[0] = 0
	}
	return ts
}

// halfOf is the type of each half of a packed b32 or b64.
func halfOf(t Type) Type {
	if t == B64 {
		return B32
	}
	return B16
}

func wider(t Type) Type {
	switch t {
	case U16:
		return U32
	case S16:
		return S32
	case U32:
		return U64
	case S32:
		return S64
	}
	return t
}

func (c *kernelCheck) operand(i int, in Instr, o Opcode, f opFacts, j int, a Operand, t Type) {
	if a == nil {
		c.ierr(i, in, "operand %d is nil", j)
		return
	}
	isDst := j < f.ndst
	wide := o.Base == "ld" || o.Base == "st" || o.Base == "cvt"
	if j == f.addr {
		ad, ok := a.(Addr)
		if !ok {
			c.ierr(i, in, "operand %d must be an address [..]", j)
			return
		}
		c.addr(i, in, o, ad)
		return
	}
	switch a := a.(type) {
	case Reg:
		if c.reg(i, in, a) && t != 0 && !fits(classOf(a.T), t, wide) {
			c.ierr(i, in, "register %s does not fit type .%s of operand %d", a, t, j)
		}
	case Vec:
		if v := vecLen(o, j); v == 0 || len(a) != v {
			c.ierr(i, in, "vector operand %d does not match the opcode's vector width", j)
		}
		if o.Base == "mov" {
			t = halfOf(t) // each register is one half of the packed value
		}
		for _, r := range a {
			if c.reg(i, in, r) && t != 0 && !fits(classOf(r.T), t, wide) {
				c.ierr(i, in, "register %s does not fit type .%s of operand %d", r, t, j)
			}
		}
	case Addr, TensorAddr:
		c.ierr(i, in, "operand %d must not be an address", j)
	case Imm, F32Imm:
		if isDst {
			c.ierr(i, in, "destination operand %d must be a register", j)
		}
		if _, isF := a.(F32Imm); isF && t != 0 && !floatTypes.has(t) {
			c.ierr(i, in, "float immediate for operand %d of type .%s", j, t)
		}
	case Special:
		if isDst || o.Base != "mov" && o.Base != "cvt" {
			c.ierr(i, in, "special register %s may only be read by mov or cvt", a)
		} else if !isSpecial(string(a)) {
			c.ierr(i, in, "unknown special register %s", a)
		}
	case Sym:
		switch {
		case o.Base == "bra":
			if !c.labels[string(a)] {
				c.ierr(i, in, "label %s does not exist", a)
			}
		case o.Base == "mov" && j == 1:
			if !c.shared[string(a)] && !(c.byteParams[string(a)] && o.Type() == U64) {
				c.ierr(i, in, "symbol %s is not a shared array (or, for mov.u64, a byte-array parameter)", a)
			}
		default:
			c.ierr(i, in, "symbol %s cannot be operand %d of %s", a, j, o.Base)
		}
	default:
		c.ierr(i, in, "operand %d has unsupported kind %T", j, a)
	}
	if _, isVec := a.(Vec); o.Base == "mma" && !isVec {
		c.ierr(i, in, "mma operand %d must be a register vector", j)
	}
	if o.Base == "bra" {
		if _, ok := a.(Sym); !ok {
			c.ierr(i, in, "bra needs a label")
		}
	}
	if isDst {
		switch a.(type) {
		case Reg, Vec:
		default:
			c.ierr(i, in, "destination operand %d must be a register", j)
		}
	}
}

// addr checks a memory operand: the base is a 64-bit register for global accesses, a
// register or a declared shared array for shared ones, and a declared parameter for ld.param.
func (c *kernelCheck) addr(i int, in Instr, o Opcode, a Addr) {
	switch b := a.Base.(type) {
	case Reg:
		if !c.reg(i, in, b) {
			return
		}
		if b.T == Pred || b.T == F32 || b.T == F64 || b.T == B16 {
			c.ierr(i, in, "address register %s must be a 32- or 64-bit integer register", b)
		}
		if o.Has("param") {
			c.ierr(i, in, "ld.param needs a parameter name, not a register")
		}
		if !isSharedSpace(o) && b.T != B64 && b.T != U64 && b.T != S64 {
			c.ierr(i, in, "address register %s of a global access must be 64-bit", b)
		}
	case Sym:
		switch {
		case o.Has("param"):
			if _, ok := c.params[string(b)]; !ok {
				c.ierr(i, in, "parameter %s does not exist", b)
			}
		case isSharedSpace(o):
			if !c.shared[string(b)] {
				c.ierr(i, in, "shared array %s does not exist", b)
			}
		default:
			c.ierr(i, in, "symbol %s as an address needs .param or .shared", b)
		}
	default:
		c.ierr(i, in, "address base must be a register or a symbol")
	}
}
