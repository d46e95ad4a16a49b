package passes

import (
	"fmt"

	"xmix/ir"
)

// The passes over the graph, in the order Passes runs them.

// fuseRows puts each norm in the row kernel of the value it normalises: the embedding's
// (embed + norm: one kernel gathers and normalises each row) and each residual add's (add +
// norm), taking in a norm of the delta right before the add (Gemma 2's post-norms: the
// normalised delta is then a value of the kernel's, where its hooks are). The fused node
// keeps the add's (or the embedding's) name.
func fuseRows(p *Program) error {
	g := p.Graph
	var nodes []*ir.Node
	at := func(i int, op ir.Op) *ir.Node {
		if i < len(g.Nodes) && g.Nodes[i].Op == op {
			return g.Nodes[i]
		}
		return nil
	}
	for i := 0; i < len(g.Nodes); i++ {
		n := g.Nodes[i]
		var post *ir.Node // the delta's norm
		if add := at(i+1, ir.OpAdd); n.Op == ir.OpNorm && add != nil && add.In[1] == n.Out[0] {
			post, n = n, add
			i++
		}
		norm := at(i+1, ir.OpNorm)
		if n.Op != ir.OpEmbed && n.Op != ir.OpAdd || norm == nil || norm.In[0] != n.Out[0] {
			if post != nil || n.Op == ir.OpEmbed || n.Op == ir.OpAdd || n.Op == ir.OpNorm {
				return fmt.Errorf("node %s (%s): no row kernel of an embedding or a residual add with its norm", n.Name, n.Op)
			}
			nodes = append(nodes, n)
			continue
		}
		i++
		a := norm.Attrs.(ir.NormAttrs)
		f := &ir.Node{Op: ir.OpAddNorm, Name: n.Name, Layer: n.Layer, In: n.In, Out: []*ir.Value{n.Out[0], norm.Out[0]},
			W: append(append([]ir.Use(nil), n.W...), norm.W...), Attrs: a}
		switch {
		case n.Op == ir.OpEmbed:
			e := n.Attrs.(ir.EmbedAttrs)
			f.Op, a.Vocab, a.EmbedScale = ir.OpEmbedNorm, e.Vocab, e.Scale
			f.Attrs = a
		case post != nil:
			if post.Attrs != norm.Attrs {
				return fmt.Errorf("node %s: the delta's norm (%s) and the residual's (%s) differ: one row kernel takes one eps and weight offset", n.Name, post.Name, norm.Name)
			}
			d := post.Out[0]
			d.InKernel = true
			f.In = []*ir.Value{n.In[0], post.In[0]}
			f.Out = append(f.Out, d)
			f.W = append(f.W, ir.Use{Role: "delta_w", Weight: post.Weight("w")})
		}
		for _, v := range f.Out {
			v.Def = f
		}
		nodes = append(nodes, f)
	}
	g.Nodes = nodes
	return nil
}

// shardTP cuts the forward for p.TP ranks, Megatron-style: the column-parallel projections
// (q, k, v; gate and up; each expert's) keep a rank's output features, so attention keeps
// its heads and the MLP its columns; the row-parallel ones (o, down) sum the ranks' partial
// outputs in an all-reduce inserted after them, before the add+norm kernel that carries the
// residual hooks' MI ops; the LM head keeps a rank's vocabulary rows and an all-gather
// assembles whole logits rows. Embedding, norms and the router are whole on every rank. A
// hook moves to the value the collective defines.
func shardTP(p *Program) error {
	g := p.Graph
	tp := max(1, p.TP)
	g.TP = tp
	if tp == 1 {
		return nil
	}
	for _, s := range g.State() {
		s.Heads /= tp
	}
	for i := 0; i < len(g.Nodes); i++ {
		n := g.Nodes[i]
		switch a := n.Attrs.(type) {
		case ir.MatmulAttrs:
			w := n.Weight("w")
			switch a.Split {
			case ir.Column:
				cutColumns(n.Out[0], tp)
				shard(w, ir.Column)
			case ir.Row:
				shard(w, ir.Row)
				i = insertCollective(g, i, a.Reduce, ir.AllReduceSum, "")
			case ir.Vocab:
				cutColumns(n.Out[0], tp)
				if usedElsewhere(g, w, n) { // tied: the embedding stays whole for the lookup
					lm := &ir.Weight{Name: "lm_head", Tensors: w.Tensors, Shape: w.Shape, Dtype: w.Dtype, Global: w.Name}
					n.W[0].Weight, w = lm, lm
				}
				shard(w, ir.Vocab)
				i = insertCollective(g, i, a.Gather, ir.AllGatherCols, a.Shard)
			}
		case ir.RopeAttrs:
			a.Heads, a.KVHeads = a.Heads/tp, a.KVHeads/tp
			n.Attrs = a
			if b := n.Weight("bias"); b != nil {
				shard(b, ir.Column)
			}
		case ir.AttentionAttrs:
			a.Heads, a.KVHeads = a.Heads/tp, a.KVHeads/tp
			n.Attrs = a
			cutColumns(n.Out[0], tp)
		case ir.ActivationAttrs:
			a.Inter /= tp
			n.Attrs = a
			cutColumns(n.Out[0], tp)
		case ir.ExpertsAttrs:
			a.Inter /= tp
			n.Attrs = a
			shard(n.Weight("gate_up"), ir.Column)
			shard(n.Weight("down"), ir.Row)
			i = insertCollective(g, i, a.Reduce, ir.AllReduceSum, "")
		}
	}
	return nil
}

// cutColumns makes v and its views one rank's share of their columns.
func cutColumns(v *ir.Value, tp int) {
	v.Width /= tp
	for _, w := range v.Views {
		w.Offset, w.Width = w.Offset/tp, w.Width/tp
	}
}

// shard marks w as cut by split: each tensor's extent along the cut dimension is recorded,
// so that a rank finds its part of each.
func shard(w *ir.Weight, split ir.Split) {
	w.Split = split
	n := len(w.Tensors)
	w.Extents = make([]int, n)
	for i := range w.Extents {
		switch {
		case split == ir.Row:
			w.Extents[i] = w.Shape[1]
		case w.Parts != nil:
			w.Extents[i] = w.Parts[i]
		default:
			w.Extents[i] = w.Shape[0] / n
		}
	}
}

// usedElsewhere says whether a node of g other than n reads w.
func usedElsewhere(g *ir.Graph, w *ir.Weight, n *ir.Node) bool {
	for _, m := range g.Nodes {
		for _, u := range m.W {
			if m != n && u.Weight == w {
				return true
			}
		}
	}
	return false
}

// insertCollective puts a collective of op after node i over its output, which keeps the
// rank's part (renamed, in buffer part when given); the collective's output takes the
// value's name, hooks and readers. It returns the collective's index.
func insertCollective(g *ir.Graph, i int, name, op, part string) int {
	n := g.Nodes[i]
	v := n.Out[0]
	whole := g.NewValue(v.Name, v.Rows, v.Width, v.Class)
	if op == ir.AllGatherCols {
		whole.Width *= g.TP
	}
	whole.Hooks, v.Hooks = v.Hooks, nil
	v.Name += ".part"
	if part != "" {
		v.Class = part
	}
	for _, u := range g.Nodes[i+1:] {
		for j, in := range u.In {
			if in == v {
				u.In[j] = whole
			}
		}
	}
	c := &ir.Node{Op: ir.OpCollective, Name: name, Layer: n.Layer, In: []*ir.Value{v}, Out: []*ir.Value{whole}, Attrs: ir.CollectiveAttrs{Op: op}}
	g.Insert(i+1, c)
	return i + 1
}

// appFree keeps the forward as it is before any MI op joins it (Program.Plain).
func appFree(p *Program) error {
	p.Plain = p.Graph.Clone()
	return nil
}

// MaxSoloApps is the most apps a program deploys for them to get Solo graphs: each is one
// more node list per bucket in the bundle and one more CUDA graph per bucket instantiated at
// load, so a bundle of more apps keeps one list for them all (the nnsight grid's bundle
// deploys 8).
const MaxSoloApps = 8

// appSolo gives each app of a program of two to MaxSoloApps its own copy of the forward as it
// is before any MI op joins it (Program.Solo); attach-mi puts the app's ops alone there.
func appSolo(p *Program) error {
	if len(p.Apps) < 2 || len(p.Apps) > MaxSoloApps {
		return nil
	}
	for _, a := range p.Apps {
		p.Solo = append(p.Solo, &SoloGraph{App: a, Graph: p.Graph.Clone(), ops: map[*ir.MI]*MIOp{}})
	}
	return nil
}

// attachMI puts every op, in forward order (sortOps), at its hook value as its kernel will
// take it: width per rank, app bit and site, per-request pool, scalar table, fired column;
// and a copy of it at the same hook of its app's Solo graph.
func attachMI(p *Program) error {
	sortOps(p)
	solo := map[*AppPlan]*SoloGraph{}
	for _, s := range p.Solo {
		solo[s.App] = s
	}
	for _, op := range p.Ops {
		h := ir.Hook{Name: op.Hook, Layer: op.Layer}
		// shard-tp may have moved the hook to a collective's output.
		op.Value, _ = hookSite(p.Graph, h)
		p.complete(op)
		op.Value.MI = append(op.Value.MI, &op.MI)
		if s := solo[op.App]; s != nil {
			v, _ := hookSite(s.Graph, h)
			if v == nil {
				return fmt.Errorf("app %s: hook %s of layer %d is not in its solo graph", op.App.Name, op.Hook, op.Layer)
			}
			m := op.MI
			s.ops[&m] = op
			v.MI = append(v.MI, &m)
		}
	}
	return nil
}

// complete fills in what op's kernel takes beyond what binding found.
func (p *Program) complete(op *MIOp) {
	a, m := op.App, &op.MI
	m.App, m.Site, m.Bit, m.Width = a.Name, ir.Hook{Name: op.Hook, Layer: op.Layer}, a.Bit, op.Value.Width
	if op.VecPerRequest {
		m.Pool, m.PoolSlots = SlotsBuffer(op.Vec), p.VectorSlots
	}
	if col := p.FiredColumn(op); col >= 0 {
		m.Fired, m.FiredCol, m.FiredWidth = a.FiredBuffer(), col, p.FiredWidth(a)
	}
	scal := op.Alpha >= 0 || op.Bias >= 0
	for _, g := range op.Gates {
		scal = scal || g.Kind == "activation" || g.Kind == "layers"
	}
	if scal {
		m.Scal, m.ScalStride, m.ScalRows = a.ScalarTable(), a.TableWidth(), p.Model.MaxSeqs+1
	}
	if k := op.Custom; k != nil {
		m.Custom = &ir.Custom{Name: k.Name, PTX: k.PTX, Entry: k.Entry}
		for _, s := range k.Signature {
			m.Custom.Signature = append(m.Custom.Signature, ir.Param{Name: s.Name, Type: s.Type})
		}
		for _, ca := range op.CustomArgs {
			m.Custom.Args = append(m.Custom.Args, ir.CustomArg{Name: ca.Name, Type: ca.Type.String(), Buf: ca.Buf, Value: ca.Value})
		}
	}
}

// placeMI puts the ops attached at each value in the kernel that hosts them: fused into the
// row kernel that defines the value (embedding, add+norm, the gated activation, the router,
// the sampler) or that takes it as its delta (add+norm); else a standalone MI kernel right
// after the value's definition (GEMM and attention outputs; the logits). An app's own
// kernels and heavy reads get nodes of their own after the add+norm kernel of their
// resid_post, custom kernels first and a renorm after them.
func placeMI(p *Program) error {
	place := map[*ir.MI]*MIOp{}
	for _, op := range p.Ops {
		place[&op.MI] = op
	}
	placeIn(p.Graph, place, func(op *MIOp, n *ir.Node, role string, rows ir.Rows) { op.placed(n, role, rows) })
	for _, s := range p.Solo {
		// The ops' placement stays Graph's: the manifest's sites name its kernels.
		placeIn(s.Graph, s.ops, func(*MIOp, *ir.Node, string, ir.Rows) {})
	}
	return checkPlacement(p)
}

// placeIn is place-mi over one graph: ops maps each attached MI to its op, and placed
// records where each runs.
func placeIn(g *ir.Graph, place map[*ir.MI]*MIOp, placed func(op *MIOp, n *ir.Node, role string, rows ir.Rows)) {
	for _, v := range g.Values() {
		if len(v.MI) == 0 {
			continue
		}
		var fused, custom, heavy []*ir.MI
		for _, m := range v.MI {
			switch {
			case m.Custom != nil:
				custom = append(custom, m)
			case templateOf(place[m]).Heavy:
				heavy = append(heavy, m)
			default:
				fused = append(fused, m)
			}
		}
		v.MI = nil
		if len(fused) > 0 {
			n, group := host(g, v)
			for len(n.MI) <= group {
				n.MI = append(n.MI, nil)
			}
			n.MI[group] = append(n.MI[group], fused...)
			for _, m := range fused {
				placed(place[m], n, ir.Ops[n.Op].Groups[group].Name, v.Rows)
			}
		}
		at := g.Index(v.Def) + 1
		for _, m := range custom {
			n := &ir.Node{Op: ir.OpCustom, Name: fmt.Sprintf("%s.%s.%s", v.Name, m.App, m.Custom.Name), Layer: v.Def.Layer,
				In: []*ir.Value{v}, Attrs: ir.CustomAttrs{MI: m}}
			g.Insert(at, n)
			at++
			placed(place[m], n, RoleWhole, v.Rows)
		}
		if len(custom) > 0 {
			// The add+norm kernel normalised the residual before the custom kernels changed it.
			d := v.Def
			g.Insert(at, &ir.Node{Op: ir.OpRenorm, Name: fmt.Sprintf("L%d.renorm", d.Layer), Layer: d.Layer,
				In: []*ir.Value{v, d.Out[1]}, W: []ir.Use{{Role: "w", Weight: d.Weight("w")}}, Attrs: d.Attrs})
			at++
		}
		for _, m := range heavy {
			n := &ir.Node{Op: ir.OpLens, Name: fmt.Sprintf("%s.%s.op%d", v.Name, m.App, m.OpIndex), Layer: v.Def.Layer,
				In: []*ir.Value{v}, Attrs: ir.LensAttrs{MI: m}}
			g.Insert(at, n)
			at++
			placed(place[m], n, RoleWhole, v.Rows)
		}
	}
}

// host is the node whose kernel runs v's fused ops, and the group: v's defining node when
// one of its groups is over v, else a reader's whose group is over v as an input, else a
// standalone MI node made after v's definition (and after those made before it for other
// views of the same value).
func host(g *ir.Graph, v *ir.Value) (*ir.Node, int) {
	if d := v.Def; v.Of == nil {
		if gi := groupOf(d, v, true); gi >= 0 {
			return d, gi
		}
		for _, u := range g.Users(v) {
			if gi := groupOf(u, v, false); gi >= 0 {
				return u, gi
			}
		}
	}
	at := g.Index(v.Def) + 1
	for at < len(g.Nodes) && g.Nodes[at].Op == ir.OpMI && g.Nodes[at].In[0].Base() == v.Base() {
		at++
	}
	n := &ir.Node{Op: ir.OpMI, Name: v.Name, Layer: v.Def.Layer, In: []*ir.Value{v}}
	g.Insert(at, n)
	return n, 0
}

// groupOf is the index of n's group over v (as an output or an input), or -1.
func groupOf(n *ir.Node, v *ir.Value, out bool) int {
	for i, gr := range ir.Ops[n.Op].Groups {
		vs := n.In
		if gr.Out {
			vs = n.Out
		}
		if gr.Out == out && gr.Index < len(vs) && vs[gr.Index] == v {
			return i
		}
	}
	return -1
}

// placed records where op runs: node n, in group role, over rows.
func (op *MIOp) placed(n *ir.Node, role string, rows ir.Rows) {
	op.Node, op.Role = n, role
	op.Host = hostKinds[n.Op]
	if n.Op == ir.OpMI && rows == ir.Samples {
		op.Host = HostLogits
	}
	switch role {
	case RoleDelta, RoleResid, RoleNorm:
	default:
		op.Role = RoleWhole
	}
}

// guardHeavy marks every heavy node with its app's bit: it does nothing unless a row of the
// step enables the app (its kernels exit at once on ctl.any_mask), so a backend may leave it
// out of the step.
func guardHeavy(p *Program) error {
	for _, g := range p.graphs() {
		for _, n := range g.Nodes {
			if a, ok := n.Attrs.(ir.LensAttrs); ok {
				n.SkipUnless = 1 << a.MI.Bit
			}
		}
	}
	return nil
}

// planBuffers gives every value of both graphs its buffer: its class's (a view its base's;
// values kept in a kernel none). The verifier checks that no value's buffer is written while
// it is still to be read.
func planBuffers(p *Program) error {
	for _, g := range p.graphs() {
		for _, v := range g.Values() {
			if !v.InKernel {
				v.Buffer = v.Base().Class
			}
		}
	}
	return nil
}
