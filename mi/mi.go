// Package mi holds the MI templates, one file each. A template's entry is everything the
// toolchain knows about it: the arguments a spec gives it and how they bind, the facts its
// kernels rely on (its vector, scalars and output), the hooks it may sit at and how it
// behaves under tensor parallelism, its reference (the living definition, which the CPU
// backend runs and the PTX is tested against) and its PTX emitter. Register panics at init,
// naming the template, when a piece is missing; adding a template is one file here and its
// test.
package mi

import (
	"fmt"
	"sort"

	"xmix/ptx"
)

// Kind says whether a template reads the hooked value (into an app buffer) or writes it.
type Kind string

const (
	Read  Kind = "read"
	Write Kind = "write"
)

// ArgKind says what an argument of a template accepts.
type ArgKind int

const (
	Vector ArgKind = iota // a param of the hook's width
	Scalar                // a number, or a param of one element; lives in the scalar table
	Word                  // one of Arg.Words
	Head                  // an attention head index of the model; becomes a column mask
	Count                 // a whole number fixed at compile time (logit_lens's k)
)

// Slot says which scalar index of an op a scalar argument binds.
type Slot int

const (
	SlotAlpha Slot = iota // the op's Alpha: the template's first scalar
	SlotBias              // its Bias: the second
)

// Arg is one argument of a template.
type Arg struct {
	Kind     ArgKind
	Required bool
	Default  float32
	Words    []string
	Unit     bool // a vector normalised to unit length at compile time
	Omit     bool // a scalar: when absent the op does without it (index -1)
	Slot     Slot // a scalar: the index it binds
	// Scales, for a scalar, names the vector argument it multiplies: their product must stay
	// finite in f32, which bounds the scalar.
	Scales string
	// Unless names an argument that replaces this scalar: with it given, the scalar is not
	// bound, and giving both is an error.
	Unless string
}

// Use says whether a template reads one of its scalars.
type Use int

const (
	Unused   Use = iota
	Optional     // read when its index is >= 0
	Required
)

// Template is one MI template.
type Template struct {
	Name string
	Kind Kind
	Args map[string]Arg
	// Hooks, when set, are the only hooks it may sit at.
	Hooks []string
	// Elementwise: nothing in it reduces over the row, so it may sit at the logits (whose
	// kernel spreads a row over many blocks).
	Elementwise bool
	// Heavy ops are not fused: they run as nodes of their own, which exit at once when no
	// row of the batch enables the app; they take no conditions.
	Heavy bool
	// Max bounds a Count argument.
	Max int
	// OutCols is how many columns a read writes per row, for a hook of width (k: its Count
	// argument).
	OutCols func(width, k int) int
	// Check, when set, validates the bound op; it returns a message and a hint, or "" when
	// the op is fine.
	Check func(c CheckArgs) (msg, hint string)
	// Sharded are the hooks of a tensor-parallel shard (attn.*, mlp.act) where it still
	// means what it means unsharded: its vector is cut with the heads (head_ablate at
	// attn.z). At other sharded hooks the compiler refuses it under tensor parallelism.
	Sharded []string

	// What its kernels rely on. Vec: it reads a [width] f32 vector; Out: it writes this many
	// f32 per row into its buffer (-1: the width; 0: none); Writes: it rewrites the hooked
	// row. Alpha and Bias are its two scalars (SlotAlpha, SlotBias); VecOrAlpha: it reads
	// its vector or Scal[Alpha], never both (the vector exactly when Alpha is -1).
	Vec         bool
	Out         int
	Writes      bool
	Alpha, Bias Use
	VecOrAlpha  bool
	// Activations are the words its Activation may be besides "" (identity).
	Activations []string
	// FoldsNorm: at the residual of an add+norm kernel it computes the norm's sum of squares
	// along with its own reduction, and leaves the norm's total valid (project_out).
	FoldsNorm bool

	// RunsIn names the kernels that run it when it is not fused row code (token_override: the
	// sampler; logit_lens: its own heavy kernels); Ref and Emit are then nil, and those
	// kernels' reference ops are its reference.
	RunsIn string
	// Ref applies the op to one row (the reference; ops runs it) and says whether it fired.
	Ref func(r Row) bool
	// Emit writes the op's PTX into a row kernel over x, the thread's part of the row.
	Emit func(e Emitter, o *Op, x []ptx.Reg)
}

// Row is one row as a reference sees it.
type Row struct {
	*Op
	X    []float32 // the hooked row, width elements, changed in place by a write
	Vec  []float32 // the op's vector (the row's request's, when it brings one)
	Scal []float32 // the row's scalars
	Out  []float32 // the op's output columns of the row
}

// CheckArgs are what Template.Check sees of a bound op.
type CheckArgs struct {
	Alpha, Bias int
	Scalars     []float32
	Model       string // the model's name and vocabulary size
	Vocab       int
}

// Emitter is a row kernel an op's PTX goes into (package codegen implements it): the
// thread's part of the row in registers, the op's parameters loaded.
type Emitter interface {
	// Kernel is where raw instructions go.
	Kernel() *ptx.Kernel
	// Scalar loads the row's Scal[idx].
	Scalar(idx int) ptx.Reg
	// Dot is the block-wide dot product of x with the op's vector; every thread gets it.
	Dot(x []ptx.Reg) ptx.Reg
	// Axpy sets x += a*vec (sub: x -= a*vec), product and sum rounded separately.
	Axpy(a ptx.Reg, x []ptx.Reg, sub bool)
	// Vec prepares loads of the op's vector: element j of the thread, 0 outside the row,
	// and the predicate under which j is inside it (nil: always).
	Vec() func(j int) (ptx.Reg, *ptx.Reg)
	// Pred is the predicate under which element j is inside the row (nil: always).
	Pred(j int) *ptx.Reg
	// Maybe emits one instruction, under p unless p is nil.
	Maybe(p *ptx.Reg, op string, args ...ptx.Operand)
	// StoreOut stores x into the op's output columns of the row; StoreFirst stores v, by one
	// thread, at the op's first output column.
	StoreOut(x []ptx.Reg)
	StoreFirst(v ptx.Reg)
	// Changed tells the kernel that the op fired only where p holds (its fired byte).
	Changed(p ptx.Reg)
	// NormTotal is, in an add+norm kernel folding the norm into the op (FoldsNorm), the
	// registers of the norm's sum of squares and of whether it holds; ok false elsewhere.
	NormTotal() (tot, have ptx.Reg, ok bool)
	// DotSquares is Dot and the block-wide sum of squares of x, reduced together.
	DotSquares(x []ptx.Reg) (dot, squares ptx.Reg)
	// Tid is the thread's index in the block.
	Tid() ptx.Reg
	// Index is the op's place among its kernel's ops (it names the op's labels).
	Index() int
}

var templates = map[string]*Template{}

// Register adds t; called from the init function of t's file. It panics, naming t, when a
// piece is missing: every template has a kind and, unless another kernel runs it, a
// reference and an emitter; a read has its output columns.
func Register(t Template) {
	fail := func(what string) { panic(fmt.Sprintf("mi: template %q: %s", t.Name, what)) } // a programming error
	switch {
	case t.Name == "":
		fail("no name")
	case templates[t.Name] != nil:
		fail("registered twice")
	case t.Kind != Read && t.Kind != Write:
		fail("kind is neither read nor write")
	case t.RunsIn == "" && (t.Ref == nil || t.Emit == nil):
		fail("no reference or no emitter (and no RunsIn naming the kernels that run it)")
	case t.Kind == Read && t.OutCols == nil:
		fail("a read without OutCols")
	case t.Kind == Write && !t.Writes && t.RunsIn == "":
		fail("a write whose kernels do not write the row")
	}
	for name, a := range t.Args {
		if a.Kind == Count && t.Max <= 0 {
			fail("count argument " + name + " without Max")
		}
	}
	if t.Args == nil {
		t.Args = map[string]Arg{}
	}
	templates[t.Name] = &t
}

// Lookup returns the template called name.
func Lookup(name string) (*Template, bool) {
	t, ok := templates[name]
	return t, ok
}

// Names lists the templates, sorted.
func Names() []string {
	ns := make([]string, 0, len(templates))
	for n := range templates {
		ns = append(ns, n)
	}
	sort.Strings(ns)
	return ns
}

// ElementwiseNames lists the templates that may sit at the logits, sorted.
func ElementwiseNames() []string {
	var ns []string
	for _, n := range Names() {
		if templates[n].Elementwise {
			ns = append(ns, n)
		}
	}
	return ns
}

// dot64 is x·v summed in float64, the references' reduction.
func dot64(x, v []float32) float64 {
	var s float64
	for k := range v {
		s += float64(x[k]) * float64(v[k])
	}
	return s
}

// axpy sets x += a*v, the product rounded to f32 before the sum (as mul.rn then add.rn;
// the conversion keeps Go from fusing them).
func axpy(x []float32, a float32, v []float32) {
	for k := range x {
		x[k] += float32(a * v[k])
	}
}
