// Package ptx builds, prints, parses and validates the subset of NVIDIA PTX that xmix's code
// generator emits. It knows nothing about transformers: codegen decides what a kernel computes,
// this package only says how it is spelled. The printer is a near one-to-one mapping from
// instructions to lines; anything it cannot print is an error naming the instruction.
package ptx

import (
	"fmt"
	"maps"
	"math"
	"sort"
	"strconv"
	"strings"
)

// Version and Target are what every generated module declares. PTX ISA 8.0 is the first to
// know sm_90 well and is accepted by every CUDA 12+ driver. Print raises a module's version
// to what its instructions need (MinVersion: 8.3 for the tensor-map fence) and its target
// sm_90 to sm_90a where a kernel uses wgmma (printTarget), so that modules without them
// print exactly as before.
const (
	Version = "8.0"
	Target  = "sm_90"
)

// Type is a PTX fundamental type.
type Type uint8

const (
	Pred Type = iota + 1
	B8
	B16
	B32
	B64
	U8
	U16
	U32
	U64
	S8
	S16
	S32
	S64
	F16
	BF16
	F32
	F64
)

var typeFacts = [...]struct {
	name  string
	bits  int
	class string // register name prefix; registers of one class share a declaration
}{
	Pred: {"pred", 1, "p"},
	B8:   {"b8", 8, "rs"},
	B16:  {"b16", 16, "rs"},
	B32:  {"b32", 32, "r"},
	B64:  {"b64", 64, "rd"},
	U8:   {"u8", 8, "rs"},
	U16:  {"u16", 16, "rs"},
	U32:  {"u32", 32, "r"},
	U64:  {"u64", 64, "rd"},
	S8:   {"s8", 8, "rs"},
	S16:  {"s16", 16, "rs"},
	S32:  {"s32", 32, "r"},
	S64:  {"s64", 64, "rd"},
	F16:  {"f16", 16, "rs"},
	BF16: {"bf16", 16, "rs"},
	F32:  {"f32", 32, "f"},
	F64:  {"f64", 64, "fd"},
}

// regClassDecl is the type each register class is declared with.
var regClassDecl = map[string]string{"p": "pred", "rs": "b16", "r": "b32", "rd": "b64", "f": "f32", "fd": "f64"}

func (t Type) String() string {
	if int(t) < len(typeFacts) && typeFacts[t].name != "" {
		return typeFacts[t].name
	}
	return fmt.Sprintf("type(%d)", int(t))
}

// Bits is the width of the type in bits.
func (t Type) Bits() int { return typeFacts[t].bits }

// Bytes is the width of the type in bytes (pred counts as 1).
func (t Type) Bytes() int {
	if t == Pred {
		return 1
	}
	return typeFacts[t].bits / 8
}

// ParseType maps a PTX type name ("f32", with or without the dot) to a Type.
func ParseType(s string) (Type, bool) {
	s = strings.TrimPrefix(s, ".")
	for t := range typeFacts {
		if typeFacts[t].name == s && s != "" {
			return Type(t), true
		}
	}
	return 0, false
}

// Operand is anything that can stand in an instruction's operand list.
type Operand interface{ operand() string }

// Reg is a virtual register. Registers are numbered per class (%f3, %rd7, %p1).
type Reg struct {
	T Type
	N int
}

func (r Reg) operand() string { return "%" + typeFacts[r.T].class + strconv.Itoa(r.N) }
func (r Reg) String() string  { return r.operand() }

// Imm is an integer immediate.
type Imm int64

func (i Imm) operand() string { return strconv.FormatInt(int64(i), 10) }

// U64Imm is a 64-bit unsigned immediate, printed in hex (constants above 2^63).
type U64Imm uint64

func (u U64Imm) operand() string { return fmt.Sprintf("0x%016x", uint64(u)) }

// F32Imm is a float immediate, printed in PTX's exact hex form (0f3F800000).
type F32Imm float32

func (f F32Imm) operand() string { return fmt.Sprintf("0f%08X", math.Float32bits(float32(f))) }

// Sym names a parameter, a shared array or a label.
type Sym string

func (s Sym) operand() string { return string(s) }

// Sink is the operand "_": a destination whose value is discarded, the only one an
// mbarrier.arrive on another CTA's barrier (.shared::cluster) may have.
const Sink Sym = "_"

// Special is a read-only special register such as %tid.x.
type Special string

const (
	TidX    Special = "%tid.x"
	TidY    Special = "%tid.y"
	NTidX   Special = "%ntid.x"
	CtaidX  Special = "%ctaid.x"
	CtaidY  Special = "%ctaid.y"
	CtaidZ  Special = "%ctaid.z"
	NCtaidX Special = "%nctaid.x"
	NCtaidY Special = "%nctaid.y"
	NCtaidZ Special = "%nctaid.z"
	LaneID  Special = "%laneid"
	// GlobalTimer is the GPU's nanosecond clock, one for every SM (the step trace's stamps).
	GlobalTimer Special = "%globaltimer"
	// SMID is the SM the thread runs on (the step trace's records; not necessarily contiguous
	// over the GPU's SMs, per the PTX ISA).
	SMID Special = "%smid"
)

func (s Special) operand() string { return string(s) }

// Addr is a memory operand [base+offset]; base is a register or a symbol.
type Addr struct {
	Base   Operand
	Offset int64
}

func (a Addr) operand() string {
	if a.Offset == 0 {
		return "[" + a.Base.operand() + "]"
	}
	if a.Offset < 0 {
		return fmt.Sprintf("[%s+%d]", a.Base.operand(), a.Offset) // PTX accepts "+-8"
	}
	return fmt.Sprintf("[%s+%d]", a.Base.operand(), a.Offset)
}

// Vec is a brace-enclosed register vector used by vector loads and stores ({%f1, %f2}).
type Vec []Reg

func (v Vec) operand() string {
	parts := make([]string, len(v))
	for i, r := range v {
		parts[i] = r.operand()
	}
	return "{" + strings.Join(parts, ", ") + "}"
}

// Instr is one instruction, or a label when Label is set. Op is the full opcode with its
// modifiers ("ld.global.nc.v4.f32"); Guard, when set, predicates it (@%p1 or @!%p1).
type Instr struct {
	Label    string
	Guard    *Reg
	GuardNeg bool
	Op       string
	Args     []Operand
}

// Param is a kernel parameter. One with Len > 0 is a byte array passed by value (`.param
// .align A .b8 name[Len]`, a tensor map): a kernel takes its address with mov and cvta.param.
type Param struct {
	Name  string
	T     Type
	Align int
	Len   int
}

// Shared is a block-shared array declaration. An Extern one is the kernel's dynamic shared
// memory (`.extern .shared .align A .b8 name[];`): its size is given at launch and Len is 0.
type Shared struct {
	Name   string
	Align  int
	T      Type
	Len    int
	Extern bool
}

// Kernel is one .entry function being built or parsed.
type Kernel struct {
	Name    string
	Params  []Param
	Shared  []Shared
	MaxNTid int // .maxntid hint; 0 = none
	// MinBlocks is the .minnctapersm hint (with MaxNTid): ptxas keeps the registers low enough
	// for that many blocks an SM. 0 = none.
	MinBlocks int
	// MaxNReg is the .maxnreg bound on a thread's registers: ptxas allocates no more, so a
	// block of MaxNTid threads fits an SM beside what else the kernel must share it with.
	// 0 = none.
	MaxNReg int
	// ClusterX is the .reqnctapercluster size: the grid runs in clusters of ClusterX
	// consecutive CTAs along x. 0 = no cluster.
	ClusterX int
	Body     []Instr
	// RegDecls is filled by the parser (class -> count); the builder derives it from next.
	RegDecls map[string]int
	next     map[string]int
	labels   int
}

// NewKernel starts a kernel with the given entry name.
func NewKernel(name string) *Kernel {
	return &Kernel{Name: name, next: map[string]int{}}
}

// Param declares a parameter and returns the symbol that ld.param reads.
func (k *Kernel) Param(name string, t Type) Sym {
	k.Params = append(k.Params, Param{Name: name, T: t})
	return Sym(name)
}

// Reg allocates a fresh register of type t; in a parsed kernel, past the ones it declares.
func (k *Kernel) Reg(t Type) Reg {
	if k.next == nil {
		k.next = maps.Clone(k.RegDecls)
		if k.next == nil {
			k.next = map[string]int{}
		}
	}
	c := typeFacts[t].class
	k.next[c]++
	return Reg{T: t, N: k.next[c]}
}

// Regs allocates n fresh registers of type t.
func (k *Kernel) Regs(t Type, n int) []Reg {
	rs := make([]Reg, n)
	for i := range rs {
		rs[i] = k.Reg(t)
	}
	return rs
}

// DeclareShared declares a shared array of n elements of type t and returns its symbol.
func (k *Kernel) DeclareShared(name string, t Type, n int) Sym {
	k.Shared = append(k.Shared, Shared{Name: name, Align: 16, T: t, Len: n})
	return Sym(name)
}

// ByteParam declares a parameter of n bytes aligned to align, passed by value, and returns
// its symbol (mov.u64 of it and cvta.param.u64 give its generic address).
func (k *Kernel) ByteParam(name string, align, n int) Sym {
	k.Params = append(k.Params, Param{Name: name, T: B8, Align: align, Len: n})
	return Sym(name)
}

// DeclareDynamicShared declares the kernel's dynamic shared memory, a byte array aligned to
// align whose size the launch gives, and returns its symbol. A kernel has at most one.
func (k *Kernel) DeclareDynamicShared(name string, align int) Sym {
	k.Shared = append(k.Shared, Shared{Name: name, Align: align, T: B8, Extern: true})
	return Sym(name)
}

// NewLabel returns a fresh label name with the given stem.
func (k *Kernel) NewLabel(stem string) string {
	k.labels++
	return fmt.Sprintf("$L_%s_%d", stem, k.labels)
}

// Emit appends one instruction.
func (k *Kernel) Emit(op string, args ...Operand) {
	k.Body = append(k.Body, Instr{Op: op, Args: args})
}

// EmitIf appends one instruction guarded by p (or by !p when neg).
func (k *Kernel) EmitIf(p Reg, neg bool, op string, args ...Operand) {
	g := p
	k.Body = append(k.Body, Instr{Guard: &g, GuardNeg: neg, Op: op, Args: args})
}

// Label places a label at the current position.
func (k *Kernel) Label(name string) { k.Body = append(k.Body, Instr{Label: name}) }

// Module is a PTX translation unit.
type Module struct {
	Version     string
	Target      string
	AddressSize int
	Kernels     []*Kernel
}

// NewModule returns an empty module for the project's target.
func NewModule(kernels ...*Kernel) *Module {
	return &Module{Version: Version, Target: Target, AddressSize: 64, Kernels: kernels}
}

// Kernel returns the entry with the given name, or nil.
func (m *Module) Kernel(name string) *Kernel {
	for _, k := range m.Kernels {
		if k.Name == name {
			return k
		}
	}
	return nil
}

// Print renders the module as PTX text. The output is deterministic.
func (m *Module) Print() (string, error) {
	var b strings.Builder
	b.WriteString("// Generated by xmix codegen. DO NOT EDIT.\n")
	fmt.Fprintf(&b, ".version %s\n.target %s\n.address_size %d\n", m.printVersion(), m.printTarget(), m.AddressSize)
	for _, k := range m.Kernels {
		if err := k.print(&b); err != nil {
			return "", fmt.Errorf("kernel %s: %w", k.Name, err)
		}
	}
	return b.String(), nil
}

func (k *Kernel) regCounts() map[string]int {
	if k.next != nil {
		return k.next
	}
	return k.RegDecls
}

func (k *Kernel) print(b *strings.Builder) error {
	// Dynamic shared memory is declared at module scope, where the JIT takes it; the parser
	// gives it back to the entry that follows.
	for _, s := range k.Shared {
		if s.Extern {
			fmt.Fprintf(b, "\n.extern .shared .align %d .%s %s[];\n", s.Align, s.T, s.Name)
		}
	}
	fmt.Fprintf(b, "\n.visible .entry %s(", k.Name)
	for i, p := range k.Params {
		if i > 0 {
			b.WriteString(",")
		}
		if p.Len > 0 {
			fmt.Fprintf(b, "\n\t.param .align %d .%s %s[%d]", p.Align, p.T, p.Name, p.Len)
			continue
		}
		fmt.Fprintf(b, "\n\t.param .%s %s", p.T, p.Name)
	}
	b.WriteString("\n)")
	if k.MaxNTid > 0 {
		fmt.Fprintf(b, "\n.maxntid %d, 1, 1", k.MaxNTid)
		if k.MinBlocks > 0 {
			fmt.Fprintf(b, "\n.minnctapersm %d", k.MinBlocks)
		}
	}
	if k.MaxNReg > 0 {
		fmt.Fprintf(b, "\n.maxnreg %d", k.MaxNReg)
	}
	if k.ClusterX > 0 {
		fmt.Fprintf(b, "\n.reqnctapercluster %d, 1, 1", k.ClusterX)
	}
	b.WriteString("\n{\n")
	counts := k.regCounts()
	classes := make([]string, 0, len(counts))
	for c := range counts {
		classes = append(classes, c)
	}
	sort.Strings(classes)
	for _, c := range classes {
		if counts[c] > 0 {
			fmt.Fprintf(b, "\t.reg .%s %%%s<%d>;\n", regClassDecl[c], c, counts[c]+1)
		}
	}
	for _, s := range k.Shared {
		if s.Extern {
			continue
		}
		fmt.Fprintf(b, "\t.shared .align %d .%s %s[%d];\n", s.Align, s.T, s.Name, s.Len)
	}
	for i, in := range k.Body {
		if in.Label != "" {
			fmt.Fprintf(b, "%s:\n", in.Label)
			continue
		}
		if in.Op == "" {
			return fmt.Errorf("instruction %d has no opcode", i)
		}
		b.WriteString("\t")
		if in.Guard != nil {
			if in.GuardNeg {
				fmt.Fprintf(b, "@!%s ", in.Guard.operand())
			} else {
				fmt.Fprintf(b, "@%s ", in.Guard.operand())
			}
		}
		b.WriteString(in.Op)
		for j, a := range in.Args {
			if a == nil {
				return fmt.Errorf("instruction %d (%s): operand %d is nil", i, in.Op, j)
			}
			if j == 0 {
				b.WriteString(" ")
			} else {
				b.WriteString(", ")
			}
			b.WriteString(a.operand())
		}
		b.WriteString(";\n")
	}
	b.WriteString("}\n")
	return nil
}
