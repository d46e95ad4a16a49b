package ir

import "fmt"

// Builder writes a graph in forward order: each method appends one node and returns what it
// defines. Layer sets the layer the next nodes, hooks and weights belong to.
type Builder struct {
	G     *Graph
	layer int
	// WDtype is the storage of the weights it makes.
	WDtype Dtype
}

// NewBuilder starts a graph.
func NewBuilder(name, family string, wdtype Dtype) *Builder {
	return &Builder{G: &Graph{Name: name, Family: family, TP: 1}, layer: -1, WDtype: wdtype}
}

// Layer makes the nodes, hooks and weights that follow layer l's (-1: whole-model).
func (b *Builder) Layer(l int) { b.layer = l }

// name prefixes s with the layer: "L3.s" (whole-model: s).
func (b *Builder) name(s string) string {
	if b.layer < 0 {
		return s
	}
	return fmt.Sprintf("L%d.%s", b.layer, s)
}

// Weight declares the layer's weight buffer name (made once: a tied LM head reads the
// embedding's) from the checkpoint tensors, stacked along the first dimension.
func (b *Builder) Weight(name string, shape []int, tensors ...string) *Weight {
	return b.weight(b.name(name), shape, tensors)
}

// Table declares a whole-model table the compiler computes (not read from the checkpoint).
func (b *Builder) Table(name string, shape ...int) *Weight {
	w := b.weight(name, shape, nil)
	w.Computed, w.Dtype = true, F32
	return w
}

func (b *Builder) weight(full string, shape []int, tensors []string) *Weight {
	for _, n := range b.G.Nodes {
		for _, u := range n.W {
			if u.Weight.Name == full {
				return u.Weight
			}
		}
	}
	return &Weight{Name: full, Tensors: tensors, Shape: shape, Dtype: b.WDtype}
}

// Hook names v as hook name of the current layer (or of the whole model).
func (b *Builder) Hook(v *Value, name string) *Value {
	v.Hooks = append(v.Hooks, Hook{Name: name, Layer: b.layer})
	return v
}

// HookAt names v as hook name of layer l.
func (b *Builder) HookAt(v *Value, name string, l int) *Value {
	v.Hooks = append(v.Hooks, Hook{Name: name, Layer: l})
	return v
}

// add appends a node.
func (b *Builder) add(n *Node) *Node {
	n.Layer = b.layer
	b.G.Nodes = append(b.G.Nodes, n)
	for _, v := range n.Out {
		v.Def = n
	}
	return n
}

// value makes a value named in the current layer.
func (b *Builder) value(name string, rows Rows, width int, class string) *Value {
	return b.G.NewValue(b.name(name), rows, width, class)
}

// Embed is the embedding lookup of the step's tokens in table [vocab, hidden], times scale
// (0: not scaled).
func (b *Builder) Embed(node string, table *Weight, scale float32, class string) *Value {
	x := b.value(node, Tokens, table.Shape[1], class)
	b.add(&Node{Op: OpEmbed, Name: b.name(node), Out: []*Value{x}, W: []Use{{"table", table}},
		Attrs: EmbedAttrs{Vocab: table.Shape[0], Scale: scale}})
	return x
}

// Norm is RMSNorm(x) * (a.Offset + w) into rows of rows (Samples: the sampled rows only).
func (b *Builder) Norm(node, value string, x *Value, w *Weight, a NormAttrs, rows Rows, class string) *Value {
	y := b.value(value, rows, x.Width, class)
	b.add(&Node{Op: OpNorm, Name: b.name(node), In: []*Value{x}, Out: []*Value{y}, W: []Use{{"w", w}}, Attrs: a})
	return y
}

// Softcap caps x at cap*tanh(x/cap).
func (b *Builder) Softcap(node, value string, x *Value, limit float32) *Value {
	y := b.value(value, x.Rows, x.Width, x.Class)
	b.add(&Node{Op: OpSoftcap, Name: b.name(node), In: []*Value{x}, Out: []*Value{y}, Attrs: SoftcapAttrs{Cap: limit}})
	return y
}

// Add is the residual add resid + delta.
func (b *Builder) Add(node, value string, resid, delta *Value) *Value {
	y := b.value(value, resid.Rows, resid.Width, resid.Class)
	b.add(&Node{Op: OpAdd, Name: b.name(node), In: []*Value{resid, delta}, Out: []*Value{y}})
	return y
}

// Matmul is x · wᵀ, w of [N, K], cut by split under tensor parallelism.
func (b *Builder) Matmul(node, value string, x *Value, w *Weight, a MatmulAttrs, class string) *Value {
	y := b.value(value, x.Rows, w.Shape[0], class)
	b.add(&Node{Op: OpMatmul, Name: b.name(node), In: []*Value{x}, Out: []*Value{y}, W: []Use{{"w", w}}, Attrs: a})
	return y
}

// View names columns [offset, offset+width) of v.
func (b *Builder) View(v *Value, name string, offset, width int) *Value {
	return b.G.View(v, b.name(name), offset, width)
}

// Rope rotates the heads of qkv in place and writes k and v into the layer's cache, reading
// the frequency tables params and the weights of ws.
func (b *Builder) Rope(node string, qkv *Value, a RopeAttrs, cache [2]*State, ws ...Use) {
	b.add(&Node{Op: OpRope, Name: b.name(node), In: []*Value{qkv}, W: ws, State: cache[:], Attrs: a})
}

// Cache declares the layer's K and V cache pages.
func (b *Builder) Cache(heads, headDim int, dtype Dtype) [2]*State {
	return [2]*State{{Name: b.name("kcache"), Heads: heads, HeadDim: headDim, Dtype: dtype}, {Name: b.name("vcache"), Heads: heads, HeadDim: headDim, Dtype: dtype}}
}

// Attention is the q heads of qkv against the layer's cache: z of heads*head_dim.
func (b *Builder) Attention(node, value string, qkv *Value, cache [2]*State, a AttentionAttrs, class string) *Value {
	z := b.value(value, qkv.Rows, a.Heads*a.HeadDim, class)
	b.add(&Node{Op: OpAttention, Name: b.name(node), In: []*Value{qkv}, Out: []*Value{z}, State: cache[:], Attrs: a})
	return z
}

// Activation is fn(gate) * up over gu = [gate | up].
func (b *Builder) Activation(node, value string, gu *Value, fn string, class string) *Value {
	inter := gu.Width / 2
	y := b.value(value, gu.Rows, inter, class)
	b.add(&Node{Op: OpActivation, Name: b.name(node), In: []*Value{gu}, Out: []*Value{y}, Attrs: ActivationAttrs{Fn: fn, Inter: inter}})
	return y
}

// Router is an MoE router over x: its logits (kept in the kernel), then top-k expert ids
// and weights per row.
func (b *Builder) Router(node string, x *Value, w *Weight, a RouterAttrs) (logits, idx, wts *Value) {
	logits = b.value("router_logits", x.Rows, a.Experts, "")
	logits.InKernel = true
	idx = b.value("moe_idx", x.Rows, a.TopK, "act.moe_idx")
	idx.Dtype = U32
	wts = b.value("moe_w", x.Rows, a.TopK, "act.moe_w")
	b.add(&Node{Op: OpRouter, Name: b.name(node), In: []*Value{x}, Out: []*Value{logits, idx, wts}, W: []Use{{"w", w}}, Attrs: a})
	return logits, idx, wts
}

// Experts is the routed experts' MLP of x, gate and up stacked in gu, down in down.
func (b *Builder) Experts(node, value string, x, idx, wts *Value, gu, down *Weight, a ExpertsAttrs, class string) *Value {
	y := b.value(value, x.Rows, x.Width, class)
	b.add(&Node{Op: OpExperts, Name: b.name(node), In: []*Value{x, idx, wts}, Out: []*Value{y},
		W: []Use{{"gate_up", gu}, {"down", down}}, Attrs: a})
	return y
}

// Sample is the sampler over logits: one token per sampled row.
func (b *Builder) Sample(node string, logits *Value, a SampleAttrs, class string) *Value {
	y := b.value("sampled", Samples, 1, class)
	y.Dtype = U32
	b.add(&Node{Op: OpSample, Name: b.name(node), In: []*Value{logits}, Out: []*Value{y}, Attrs: a})
	return y
}

// Refuse names hook as one the family cannot fire yet, and why.
func (b *Builder) Refuse(hook, why string) {
	if b.G.Refused == nil {
		b.G.Refused = map[string]string{}
	}
	b.G.Refused[hook] = why
}

// Stacked declares a weight of tensors of unequal rows, stacked: parts[i] rows of cols
// columns each (cols 0: vectors).
func (b *Builder) Stacked(name string, parts []int, cols int, tensors ...string) *Weight {
	rows := 0
	for _, p := range parts {
		rows += p
	}
	shape := []int{rows}
	if cols > 0 {
		shape = append(shape, cols)
	}
	w := b.Weight(name, shape, tensors...)
	w.Parts = parts
	return w
}
