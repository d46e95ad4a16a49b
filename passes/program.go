// Package passes turns parsed specs into a planned program: the model's forward as a graph
// (package ir, from its family's builder), MI ops resolved to hook values of it, their
// arguments bound and checked, app bits and buffers assigned, then the graph rewritten:
// row kernels fused, sharded for tensor parallelism, MI ops attached and placed in the
// kernels that host them, heavy ops guarded, buffers planned. The pass list is data (see
// Passes); the verifiers can run after each pass. Nothing here generates PTX; a custom
// kernel's PTX is only parsed and checked against its signature (custom.go).
package passes

import (
	"errors"
	"fmt"
	"sort"

	"xmix/frontend"
	"xmix/ir"
	"xmix/mi"
)

// Program is what the passes transform: the model's forward and the apps on it.
type Program struct {
	Model *frontend.Model
	// Graph is the forward (build-graph), with the MI ops once attach-mi and place-mi ran;
	// Plain is the same forward without them (app-free), which a step that enables no app
	// runs instead.
	Graph, Plain *ir.Graph
	// Solo, in a program of two to MaxSoloApps apps, is the forward with each app's ops
	// alone, one graph an app in bit order: a step whose rows enable that app and no other
	// may run it instead of Graph, so that an app does not pay for the other apps' ops
	// deployed beside it (a row kernel that hosts ops of several apps is compiled with all
	// of them).
	Solo []*SoloGraph
	Apps []*AppPlan
	Ops  []*MIOp // one per (app op, layer), sorted into forward order by attach-mi
	// Latches are the token sets of the after_token conditions, indexed by latch bit: the
	// host sets bit i of a row's latch word once a token of Latches[i] has appeared in the
	// request at or before the row's position.
	Latches [][]int
	// TP is the tensor-parallel degree to compile for (0 or 1: one device); check-tp
	// refuses what cannot be split.
	TP int
	// VectorSlots is how many requests may hold per-request vectors at once: each
	// per_request vector gets a device pool of that many slots.
	VectorSlots int
	// Fuse is the set of fusions (Fusions) the fuse passes apply.
	Fuse map[string]bool
}

// SoloGraph is the forward with one app's ops alone (Program.Solo). Its ops are copies of
// the app's ops' MI, placed in its own kernels; the app's MIOps record where they run in
// Graph, not here.
type SoloGraph struct {
	App   *AppPlan
	Graph *ir.Graph
	// ops maps each copied MI to the op it copies (placement reads the op's template).
	ops map[*ir.MI]*MIOp
}

// graphs are the program's forwards: Graph, then Plain and the Solo graphs once made.
func (p *Program) graphs() []*ir.Graph {
	gs := []*ir.Graph{p.Graph}
	if p.Plain != nil {
		gs = append(gs, p.Plain)
	}
	for _, s := range p.Solo {
		gs = append(gs, s.Graph)
	}
	return gs
}

// PerRequestVectors says whether some app has a per_request vector (the bundle then
// reserves vector slots).
func (p *Program) PerRequestVectors() bool {
	for _, a := range p.Apps {
		for _, v := range a.Vectors {
			if v.PerRequest {
				return true
			}
		}
	}
	return false
}

// AppPlan is one app as deployed: its bit, its scalar table, its vectors and exports.
type AppPlan struct {
	Spec    *frontend.App
	Name    string
	Bit     int
	Scalars []Scalar
	Vectors []Vector
	Exports []Export
	// LayerMasks are the ops a request may run at fewer of their layers (at: {per_request:
	// true}); their mask words sit in the scalar table after Scalars.
	LayerMasks []LayerMask
}

// LayerMask is one app op's per-request layer mask: Words words of 32 bits in the app's
// scalar table from column Col, bit l%32 of word Col+l/32 set when the request runs the op
// at layer l (every bit by default). Layers are the op's compiled layers, ascending.
type LayerMask struct {
	OpIndex int
	Col     int
	Words   int
	Layers  []int
	Pos     frontend.Pos
}

// TableWidth is how many columns a row of the app's scalar table has: its scalars, then
// the words of its layer masks.
func (a *AppPlan) TableWidth() int {
	n := len(a.Scalars)
	for _, m := range a.LayerMasks {
		n += m.Words
	}
	return n
}

// ScalarTable is the control buffer of the app's scalar table (rows of TableWidth, one per
// sequence slot), FiredBuffer the output buffer of its fired bytes.
func (a *AppPlan) ScalarTable() string { return "app." + a.Name + ".scalars" }
func (a *AppPlan) FiredBuffer() string { return "app." + a.Name + ".fired" }

// SlotsBuffer is the buffer of the per-request slots of the vector in buffer vector.
func SlotsBuffer(vector string) string { return vector + ".slots" }

// countedOnDevice says whether op's kernel writes its fired bytes: every fused MI op does;
// custom kernels (a fixed ABI) and logit lenses (no conditions) are counted by the host.
func countedOnDevice(op *MIOp) bool {
	return op.Custom == nil && !templateOf(op).Heavy
}

// FiredColumn is op's byte of its app's fired rows: its place among the app's
// device-counted sites ordered by op, then layer, so that the host sums each op's columns
// as one run; -1 for ops the host counts.
func (p *Program) FiredColumn(op *MIOp) int {
	if !countedOnDevice(op) {
		return -1
	}
	col := 0
	for _, o := range p.Ops {
		if o.App == op.App && countedOnDevice(o) && (o.OpIndex < op.OpIndex || o.OpIndex == op.OpIndex && o.Layer < op.Layer) {
			col++
		}
	}
	return col
}

// FiredWidth is how many bytes a row of the app's fired buffer has: a byte per site counted
// on the device, rounded up to whole words (0: none is).
func (p *Program) FiredWidth(a *AppPlan) int {
	n := 0
	for _, o := range p.Ops {
		if o.App == a && countedOnDevice(o) {
			n++
		}
	}
	return (n + 3) / 4 * 4
}

// Scalar is one entry of an app's scalar table (run-time replaceable). A scalar that
// multiplies a vector (steer_add's alpha) names that vector's buffer in Scales, and Limit is
// bundle.ProductLimit of it (Residual: at a hook of the residual stream); 0: no product is
// known.
type Scalar struct {
	Name     string
	Value    float32
	Scales   string
	Residual bool
	Limit    float32
}

// Vector is an app parameter tensor loaded at compile time; Buffer is its device buffer.
// Param names the app param it holds ("" for vectors the compiler builds, like head masks);
// Unit says it holds that param normalised to unit length. PerRequest: the param is
// per_request, so requests may bring their own value (Data is the default).
type Vector struct {
	Name       string
	Buffer     string
	Data       []float32
	Param      string
	Unit       bool
	PerRequest bool
}

// Export is an app buffer that reads write into; Buffer is its device buffer name.
type Export struct {
	Name   string
	Buffer string
	Width  int
	Export bool
	Pos    frontend.Pos
}

// MIOp is one MI primitive at one hook site: the op as its kernel will take it (ir.MI, which
// the passes fill: resolve-hooks its template and site, bind-args its buffers, scalars and
// output columns, check-conditions and plan-layer-masks its gates, attach-mi the rest), and
// what the passes need of its spec beyond that.
type MIOp struct {
	ir.MI
	App   *AppPlan
	Pos   frontend.Pos
	Kind  string // read | write
	Hook  string
	Layer int // -1 for whole-model hooks
	Key   SiteKey
	Value *ir.Value // the hook's value in the graph

	// VecPerRequest: Vec is a per_request vector; a request holding a vector slot reads its
	// own value from the slot instead.
	VecPerRequest bool

	// Custom kernels (Template CustomTemplate): the kernel and its arguments past the ABI head.
	Custom     *frontend.CustomKernel
	CustomArgs []CustomArg

	// Placement (place-mi): the node the op runs in, the kind of that node (HostEmbed,
	// HostAddNorm, ...) and the op's group there (RoleDelta, ...).
	Node *ir.Node
	Host string
	Role string
}

// Pass is one named transformation of a Program.
type Pass struct {
	Name string
	Run  func(*Program) error
}

// Passes is the pipeline, in order. Each pass may rely on the ones before it.
var Passes = []Pass{
	{"build-graph", buildGraph},
	{"resolve-hooks", resolveHooks},
	{"assign-app-bits", assignAppBits},
	{"declare-app-buffers", declareAppBuffers},
	{"bind-args", bindArgs},
	{"check-conditions", checkConditions},
	{"plan-layer-masks", planLayerMasks},
	{"check-tp", checkTP},
	{"fuse-rows", fuseRows},
	{"shard-tp", shardTP},
	{"app-free", appFree},
	{"app-solo", appSolo},
	{"attach-mi", attachMI},
	{"fuse-qkv-rope", fusePass("qkv-rope")},
	{"fuse-gate-act", fusePass("gate-act")},
	{"place-mi", placeMI},
	{"guard-heavy", guardHeavy},
	{"plan-buffers", planBuffers},
}

// PassNames lists the passes in order.
func PassNames() []string {
	ns := make([]string, len(Passes))
	for i, ps := range Passes {
		ns[i] = ps.Name
	}
	return ns
}

// Options control a compile.
type Options struct {
	// Verify runs the verifier after every pass (always run once at the end).
	Verify bool
	// Trace, when set, is called after each pass.
	Trace func(pass string, p *Program)
	// TP is the tensor-parallel degree (Program.TP).
	TP int
	// VectorSlots, when > 0, replaces the model spec's serving.vector_slots
	// (Program.VectorSlots); it must not exceed max_seqs.
	VectorSlots int
	// Fuse names the fusions to apply (Fusions' names, "all", or "none"; Program.Fuse); nil
	// applies DefaultFusions.
	Fuse []string
}

// MaxApps is how many apps one bundle can deploy (bits of the per-row u32 app mask).
const MaxApps = 32

// MaxLatches is how many distinct after_token token sets one bundle can hold (bits of the
// per-row u32 latch word).
const MaxLatches = 32

// Run builds the program for m and apps and runs every pass.
func Run(m *frontend.Model, apps []*frontend.App, opt Options) (*Program, error) {
	fuse, err := fusionSet(opt.Fuse)
	if err != nil {
		return nil, err
	}
	p := &Program{Model: m, TP: opt.TP, VectorSlots: m.VectorSlots, Fuse: fuse}
	if opt.VectorSlots > 0 {
		if opt.VectorSlots > m.MaxSeqs {
			return nil, fmt.Errorf("--vector-slots %d is more than max_seqs %d (a running request holds at most one)", opt.VectorSlots, m.MaxSeqs)
		}
		p.VectorSlots = opt.VectorSlots
	}
	if p.VectorSlots <= 0 {
		p.VectorSlots = max(1, m.MaxSeqs)
	}
	seen := map[string]frontend.Pos{}
	for _, a := range apps {
		if prev, dup := seen[a.Name]; dup {
			return nil, frontend.Errorf(a.Pos, "rename one of them",
				"app %q is deployed twice (also at %s)", a.Name, prev)
		}
		seen[a.Name] = a.Pos
		p.Apps = append(p.Apps, &AppPlan{Spec: a, Name: a.Name, Bit: -1})
	}
	for _, ps := range Passes {
		if err := ps.Run(p); err != nil {
			return nil, fmt.Errorf("%s: %w", ps.Name, err)
		}
		if opt.Verify {
			if err := Verify(p); err != nil {
				return nil, fmt.Errorf("verifier after %s: %w", ps.Name, err)
			}
		}
		if opt.Trace != nil {
			opt.Trace(ps.Name, p)
		}
	}
	if err := Verify(p); err != nil {
		return nil, fmt.Errorf("verifier: %w", err)
	}
	return p, nil
}

// Verify checks the program's invariants: its graphs' (ir.Verify), and its ops'. It
// reports programming errors in passes, not user errors: every op has a width, a known
// template, a placement once planned, and gates that read buffers written before them.
func Verify(p *Program) error {
	var errs []error
	for _, g := range p.graphs() {
		if g == nil {
			continue
		}
		if err := ir.Verify(g); err != nil {
			errs = append(errs, fmt.Errorf("graph %s: %w", g.Name, err))
		}
	}
	bits := map[int]string{}
	for _, a := range p.Apps {
		if a.Bit == -1 { // not assigned yet
			continue
		}
		if a.Bit < 0 || a.Bit >= MaxApps {
			errs = append(errs, fmt.Errorf("app %s: bit %d out of range", a.Name, a.Bit))
		} else if other, dup := bits[a.Bit]; dup {
			errs = append(errs, fmt.Errorf("apps %s and %s share bit %d", other, a.Name, a.Bit))
		}
		bits[a.Bit] = a.Name
	}
	for i, op := range p.Ops {
		where := fmt.Sprintf("op %d (%s %s at %s layer %d)", i, op.App.Name, op.Template, op.Hook, op.Layer)
		if op.Width <= 0 {
			errs = append(errs, fmt.Errorf("%s: width %d", where, op.Width))
		}
		if _, ok := mi.Lookup(op.Template); !ok && (op.Template != CustomTemplate || op.Custom == nil) {
			errs = append(errs, fmt.Errorf("%s: unknown template", where))
		}
		if op.Alpha >= len(op.App.Scalars) || op.Bias >= len(op.App.Scalars) {
			errs = append(errs, fmt.Errorf("%s: scalar index out of the app's table", where))
		}
		if op.VecPerRequest && (op.Vec == "" || op.App.vector(op.Vec) == nil || !op.App.vector(op.Vec).PerRequest) {
			errs = append(errs, fmt.Errorf("%s: per-request vector %q is not a per_request vector of the app", where, op.Vec))
		}
		for j, g := range op.Gates {
			if g.Kind == "activation" && (g.Thresh < 1 || g.Thresh > len(op.App.Scalars)) {
				errs = append(errs, fmt.Errorf("%s: gate %d: threshold index %d out of the app's table", where, j, g.Thresh-1))
			}
			if g.Kind == "after_token" && (g.Latch < 0 || g.Latch >= len(p.Latches)) {
				errs = append(errs, fmt.Errorf("%s: gate %d: latch %d of %d", where, j, g.Latch, len(p.Latches)))
			}
			if g.Kind == "layers" && (g.Word < len(op.App.Scalars) || g.Word >= op.App.TableWidth() || g.Bit != op.Layer%32) {
				errs = append(errs, fmt.Errorf("%s: gate %d: layer mask word %d bit %d outside the app's mask columns", where, j, g.Word, g.Bit))
			}
		}
		if op.Value == nil {
			errs = append(errs, fmt.Errorf("%s: not at a hook value of its width", where))
		}
		if op.Kind == string(mi.Read) && op.Out != "" && op.OutCol+outWidth(templateOf(op), op) > op.OutWidth {
			errs = append(errs, fmt.Errorf("%s: output columns exceed buffer width %d", where, op.OutWidth))
		}
	}
	return errors.Join(errs...)
}

// sortOps puts ops into forward order. Ops at one hook of one layer (one site) run in a
// defined order that users rely on: apps in the order the build line deploys them (their
// bits), then each app's ops in spec order. So a read listed before a write at the same hook
// sees the value before the write, and a read after it sees the written value. The fused
// host kernels apply their ops in this order; a custom kernel and a logit lens at
// resid_post run as nodes after the add+norm kernel, so after every fused op at that site
// (HookOrder numbers them so).
func sortOps(p *Program) {
	sort.SliceStable(p.Ops, func(i, j int) bool {
		a, b := p.Ops[i], p.Ops[j]
		if a.Key != b.Key {
			return a.Key.Less(b.Key)
		}
		if a.App.Bit != b.App.Bit {
			return a.App.Bit < b.App.Bit
		}
		return a.OpIndex < b.OpIndex
	})
}

// HookOrder numbers each op of p.Ops (indexed alike) by when it runs at its site, from 1: the
// fused ops in sortOps's order, then custom kernels, then logit lenses (their nodes follow
// the host kernel).
func (p *Program) HookOrder() []int {
	rank := func(op *MIOp) int {
		switch op.Host {
		case HostCustom:
			return 1
		case HostLens:
			return 2
		}
		return 0
	}
	idx := make([]int, len(p.Ops))
	for i := range idx {
		idx[i] = i
	}
	sort.SliceStable(idx, func(a, b int) bool {
		x, y := p.Ops[idx[a]], p.Ops[idx[b]]
		if x.Key != y.Key {
			return x.Key.Less(y.Key)
		}
		return rank(x) < rank(y)
	})
	order := make([]int, len(p.Ops))
	n := 0
	for j, i := range idx {
		if j > 0 && p.Ops[idx[j-1]].Key != p.Ops[i].Key {
			n = 0
		}
		n++
		order[i] = n
	}
	return order
}
