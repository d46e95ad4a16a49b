// Package ir is the compiler's program in the middle: the model's forward as a straight
// list of typed nodes over named values, with the weights each node reads, the MI ops placed
// on it, and (after plan-buffers) where every value lives. A family's builder
// (package models) writes it, the passes (package passes) rewrite it, codegen lowers it to
// kernels. It knows nothing about PTX or about specs: its ops are the transformer's
// (embed, norm, matmul, rope, attention, activation, moe, sample, collective) and the MI
// ops', its values are activations of token rows or sampled rows.
package ir

import "fmt"

// Graph is one forward pass: nodes in execution order.
type Graph struct {
	Name   string // the model's name
	Family string
	TP     int // tensor-parallel degree the widths are of (1: one device)
	Nodes  []*Node
	// Refused are hooks the family names but cannot fire yet, with why (a hint for the
	// error that refuses an op there).
	Refused map[string]string
	// nextID numbers values.
	nextID int
}

// Rows says which rows a value has.
type Rows uint8

const (
	// Tokens: one row per token of the step (prompt chunks and decode rows).
	Tokens Rows = iota
	// Samples: one row per sampled token (a decode row, or a prompt's last row).
	Samples
)

func (r Rows) String() string {
	if r == Samples {
		return "S"
	}
	return "T"
}

// Dtype is an element type.
type Dtype uint8

const (
	F32 Dtype = iota
	BF16
	U32
)

var dtypeNames = [...]string{F32: "f32", BF16: "bf16", U32: "u32"}

func (d Dtype) String() string { return dtypeNames[d] }

// Hook is a name MI ops attach to: a per-layer hook (Layer >= 0) or a whole-model one
// (Layer -1).
type Hook struct {
	Name  string
	Layer int
}

func (h Hook) String() string {
	if h.Layer < 0 {
		return h.Name
	}
	return fmt.Sprintf("L%d.%s", h.Layer, h.Name)
}

// The classes of the residual stream and of the deltas added to it: an MI op's product
// written there reaches the next RMSNorm's sum of squares.
const (
	Residual = "act.resid"
	Delta    = "act.delta"
)

// Value is one activation: Rows rows of Width elements.
type Value struct {
	ID    int
	Name  string // unique in the graph: "L3.resid_post", "L3.qkv"
	Rows  Rows
	Width int
	Dtype Dtype
	// Class groups the values that share one buffer (plan-buffers): the residual stream,
	// the normalised rows, the projection deltas...
	Class string
	// Hooks are the hook names the value is, in forward order: one value can be two (a
	// layer's resid_post is the next one's resid_pre).
	Hooks []Hook
	// Of, when set, makes the value a view: columns [Offset, Offset+Width) of Of's rows
	// (attn.q of the fused qkv projection).
	Of     *Value
	Offset int
	// Views are the views of this value, in the order they were made.
	Views []*Value
	// InKernel: the value exists only inside its node's kernel (the router's logits), so MI
	// ops at it must be fused there, and it has no buffer.
	InKernel bool
	// Def is the node that defines it (for a view, its base's).
	Def *Node
	// MI are the MI ops attached at it (attach-mi), in the order they run, until place-mi
	// puts them in the node that hosts them.
	MI []*MI
	// Buffer is the bundle buffer holding it (plan-buffers).
	Buffer string
}

// Base is the value a view is of (the value itself when it is none).
func (v *Value) Base() *Value {
	for v.Of != nil {
		v = v.Of
	}
	return v
}

// Weight is one weight buffer: its tensors in the checkpoint, stacked along the first
// dimension, and how tensor parallelism cuts it.
type Weight struct {
	Name    string   // the bundle buffer: "L3.wqkv"
	Tensors []string // Hugging Face names, in stacking order
	Shape   []int    // whole (unsharded)
	// Parts are the rows of each tensor when they differ (q, k and v of a fused projection);
	// nil: equal parts of Shape[0].
	Parts []int
	Dtype Dtype
	Split Split
	// Extents are each tensor's size along the cut dimension (Split.Dim), set by shard-tp.
	Extents []int
	// Global names the weight whose synthetic values this one is cut from, when not its own
	// (a tied LM head cut from the embedding).
	Global string
	// Computed: a table the compiler computes (Params: the RoPE frequencies), not a
	// checkpoint tensor.
	Computed bool
}

// Split is how tensor parallelism cuts a weight or a node's work (Megatron-style).
type Split uint8

const (
	Replicated Split = iota
	// Column: each rank takes its part of the output features (rows of W; heads of q, k, v;
	// columns of gate and up).
	Column
	// Row: each rank takes its part of the input features (columns of W), and an all-reduce
	// sums the ranks' partial outputs.
	Row
	// Vocab: the LM head, column-parallel over the vocabulary, its logits all-gathered.
	Vocab
)

var splitNames = [...]string{Replicated: "replicated", Column: "column", Row: "row", Vocab: "vocab"}

func (s Split) String() string { return splitNames[s] }

// State is a buffer the forward keeps across steps: a layer's K or V cache pages, of Heads
// heads (per rank after shard-tp) of HeadDim per position.
type State struct {
	Name           string // "L3.kcache"
	Heads, HeadDim int
	Dtype          Dtype
}

// Weights lists the checkpoint weights the nodes read, in order of first use.
func (g *Graph) Weights() []*Weight { return g.weights(false) }

// Params lists the tables the compiler computes that the nodes read, in order of first use.
func (g *Graph) Params() []*Weight { return g.weights(true) }

func (g *Graph) weights(computed bool) []*Weight {
	var out []*Weight
	seen := map[*Weight]bool{}
	for _, n := range g.Nodes {
		for _, u := range n.W {
			if u.Weight.Computed == computed && !seen[u.Weight] {
				seen[u.Weight] = true
				out = append(out, u.Weight)
			}
		}
	}
	return out
}

// State lists the caches the nodes use, in order of first use.
func (g *Graph) State() []*State {
	var out []*State
	seen := map[*State]bool{}
	for _, n := range g.Nodes {
		for _, s := range n.State {
			if !seen[s] {
				seen[s] = true
				out = append(out, s)
			}
		}
	}
	return out
}

// Use is a weight a node reads in one role ("w", "bias", "q_norm").
type Use struct {
	Role   string
	Weight *Weight
}

// Node is one operation of the forward.
type Node struct {
	Op    Op
	Name  string // unique: "L3.o", "L3.attention", "embed"
	Layer int    // -1 for whole-model nodes
	In    []*Value
	Out   []*Value
	W     []Use
	// State is the cache the node writes (rope) or reads (attention).
	State []*State
	// Attrs holds the op's parameters (the type OpFacts names).
	Attrs any
	// MI are the MI ops the node carries, by group (OpFacts.Groups): fused into a row
	// kernel, or the ops of a standalone MI node.
	MI [][]*MI
	// SkipUnless marks a heavy node that does nothing unless a row of the step enables an
	// app of these bits (guard-heavy).
	SkipUnless uint32
	// Parts, in a fused node (OpFact.Parts), are the nodes it fuses as they were, over the
	// same values: where a bucket's kernels cannot fuse them (a GEMM on tensor cores),
	// lowering emits the parts instead.
	Parts []*Node
	// Unfused says which fusions the fuse passes left undone at this node, and why (an MI op
	// at a value the fused kernel would not hold): `xmixc check --dump-ir` prints it.
	Unfused []string
}

// W returns the weight of role, or nil.
func (n *Node) Weight(role string) *Weight {
	for _, u := range n.W {
		if u.Role == role {
			return u.Weight
		}
	}
	return nil
}

// HasMI says whether the node carries any MI op.
func (n *Node) HasMI() bool {
	for _, g := range n.MI {
		if len(g) > 0 {
			return true
		}
	}
	return false
}

// AllMI lists the MI ops the node runs: its groups', group after group, or the one op of a
// custom kernel or a logit lens.
func (n *Node) AllMI() []*MI {
	switch a := n.Attrs.(type) {
	case CustomAttrs:
		return []*MI{a.MI}
	case LensAttrs:
		return []*MI{a.MI}
	}
	var out []*MI
	for _, g := range n.MI {
		out = append(out, g...)
	}
	return out
}

// Values lists every value in definition order, each base followed by its views.
func (g *Graph) Values() []*Value {
	var out []*Value
	for _, n := range g.Nodes {
		for _, v := range n.Out {
			out = append(out, v)
			out = append(out, v.Views...)
		}
	}
	return out
}

// Unfolded lists the nodes as they were before the fuse passes: each fused node's parts in
// its place.
func (g *Graph) Unfolded() []*Node {
	var out []*Node
	for _, n := range g.Nodes {
		if len(n.Parts) > 0 {
			out = append(out, n.Parts...)
			continue
		}
		out = append(out, n)
	}
	return out
}

// Index returns n's position in g.Nodes, or -1.
func (g *Graph) Index(n *Node) int {
	for i, m := range g.Nodes {
		if m == n {
			return i
		}
	}
	return -1
}

// Insert puts n at position i of g.Nodes.
func (g *Graph) Insert(i int, n *Node) {
	g.Nodes = append(g.Nodes, nil)
	copy(g.Nodes[i+1:], g.Nodes[i:])
	g.Nodes[i] = n
	for _, v := range n.Out {
		v.Def = n
		for _, w := range v.Views {
			w.Def = n
		}
	}
}

// Users lists the nodes that read v (or a view of it), in order.
func (g *Graph) Users(v *Value) []*Node {
	var out []*Node
	for _, n := range g.Nodes {
		for _, in := range n.In {
			if in == v || in.Base() == v {
				out = append(out, n)
				break
			}
		}
	}
	return out
}

// NewValue makes a value with the next id.
func (g *Graph) NewValue(name string, rows Rows, width int, class string) *Value {
	g.nextID++
	return &Value{ID: g.nextID, Name: name, Rows: rows, Width: width, Dtype: F32, Class: class}
}

// View makes the view of columns [offset, offset+width) of v.
func (g *Graph) View(v *Value, name string, offset, width int) *Value {
	w := g.NewValue(name, v.Rows, width, v.Class)
	w.Of, w.Offset, w.Def = v, offset, v.Def
	v.Views = append(v.Views, w)
	return w
}

// Clone copies g's nodes and values, so that passes may change one copy without the other;
// weights and state are shared.
func (g *Graph) Clone() *Graph {
	c := *g
	c.Nodes = make([]*Node, len(g.Nodes))
	vals := map[*Value]*Value{}
	var val func(v *Value) *Value
	val = func(v *Value) *Value {
		if w, ok := vals[v]; ok {
			return w
		}
		w := *v
		vals[v] = &w
		w.Hooks = append([]Hook(nil), v.Hooks...)
		w.MI = append([]*MI(nil), v.MI...)
		if v.Of != nil {
			w.Of = val(v.Of)
		}
		w.Views = nil
		for _, x := range v.Views {
			w.Views = append(w.Views, val(x))
		}
		return &w
	}
	var node func(n *Node) *Node
	node = func(n *Node) *Node {
		m := *n
		m.In, m.Out, m.Parts = nil, nil, nil
		for _, v := range n.In {
			m.In = append(m.In, val(v))
		}
		for _, v := range n.Out {
			m.Out = append(m.Out, val(v))
		}
		m.W = append([]Use(nil), n.W...)
		m.State = append([]*State(nil), n.State...)
		m.MI = nil
		for _, group := range n.MI {
			m.MI = append(m.MI, append([]*MI(nil), group...))
		}
		for _, p := range n.Parts {
			m.Parts = append(m.Parts, node(p))
		}
		m.Unfused = append([]string(nil), n.Unfused...)
		return &m
	}
	for i, n := range g.Nodes {
		c.Nodes[i] = node(n)
	}
	for _, n := range c.Nodes {
		for _, v := range n.Out {
			v.Def = n
			for _, w := range v.Views {
				w.Def = n
			}
		}
	}
	return &c
}

// HookNames lists the hooks g fires by name, in forward order, and which are per layer.
func (g *Graph) HookNames() (names []string, perLayer map[string]bool) {
	perLayer = map[string]bool{}
	seen := map[string]bool{}
	for _, v := range g.Values() {
		for _, h := range v.Hooks {
			if !seen[h.Name] {
				seen[h.Name] = true
				names = append(names, h.Name)
			}
			perLayer[h.Name] = perLayer[h.Name] || h.Layer >= 0
		}
	}
	return names, perLayer
}
