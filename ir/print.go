package ir

import (
	"fmt"
	"sort"
	"strings"
)

// String prints the graph as text, one node a line:
//
//	name: %out:T4096, ... = op %in, ...  role=weight ... attrs   # hooks
//
// %v:T4096 is value v of 4096 elements per token row (S: per sampled row; a dtype other
// than f32 follows, @buffer once planned); a view prints as %v=%base[lo:hi]. Fused and
// standalone MI ops follow their node, one a line, by group.
func (g *Graph) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "graph %s (%s), tp %d\n", g.Name, g.Family, g.TP)
	for _, w := range append(g.Weights(), g.Params()...) {
		fmt.Fprintf(&b, "  weight %s %v %s", w.Name, w.Shape, w.Dtype)
		if w.Split != Replicated {
			fmt.Fprintf(&b, " split=%s", w.Split)
		}
		if len(w.Extents) > 0 {
			fmt.Fprintf(&b, " extents=%v", w.Extents)
		}
		if w.Computed {
			b.WriteString(" computed")
		}
		if len(w.Tensors) > 0 {
			fmt.Fprintf(&b, " <- %s", strings.Join(w.Tensors, ", "))
		}
		b.WriteByte('\n')
	}
	if len(g.Refused) > 0 {
		var hs []string
		for h := range g.Refused {
			hs = append(hs, h)
		}
		sort.Strings(hs)
		fmt.Fprintf(&b, "  refused hooks: %s\n", strings.Join(hs, ", "))
	}
	for _, n := range g.Nodes {
		b.WriteString(n.String())
		b.WriteByte('\n')
		for _, u := range n.Unfused {
			fmt.Fprintf(&b, "      unfused %s\n", u)
		}
		for gi, group := range n.MI {
			for _, m := range group {
				fmt.Fprintf(&b, "      mi[%s] %s\n", Ops[n.Op].Groups[gi].Name, m)
			}
		}
		for _, v := range n.Out {
			for _, w := range append([]*Value{v}, v.Views...) {
				for _, m := range w.MI {
					fmt.Fprintf(&b, "      mi@%s %s\n", w.Name, m)
				}
			}
		}
	}
	return b.String()
}

// String prints the node as a line of the graph's text.
func (n *Node) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "  %s: ", n.Name)
	if len(n.Out) > 0 {
		for i, v := range n.Out {
			if i > 0 {
				b.WriteString(", ")
			}
			b.WriteString(v.decl())
		}
		b.WriteString(" = ")
	}
	b.WriteString(n.Op.String())
	for i, v := range n.In {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(" %" + v.Name)
	}
	for _, u := range n.W {
		fmt.Fprintf(&b, " %s=%s", u.Role, u.Weight.Name)
	}
	for _, s := range n.State {
		fmt.Fprintf(&b, " cache=%s", s.Name)
	}
	if a := attrsText(n.Attrs); a != "" {
		b.WriteString(" " + a)
	}
	for _, p := range n.Parts {
		if a := attrsText(p.Attrs); a != "" {
			b.WriteString(" " + a)
		}
	}
	if n.SkipUnless != 0 {
		fmt.Fprintf(&b, " skip_unless=%#x", n.SkipUnless)
	}
	var hooks []string
	for _, v := range n.Out {
		for _, w := range append([]*Value{v}, v.Views...) {
			if w.Of != nil {
				hooks = append(hooks, fmt.Sprintf("%s=%%%s[%d:%d]", w.decl(), v.Name, w.Offset, w.Offset+w.Width))
				continue
			}
			for _, h := range w.Hooks {
				hooks = append(hooks, h.String())
			}
		}
	}
	if len(hooks) > 0 {
		b.WriteString("   # " + strings.Join(hooks, " "))
	}
	return b.String()
}

// decl is how a value prints where it is defined.
func (v *Value) decl() string {
	s := fmt.Sprintf("%%%s:%s%d", v.Name, v.Rows, v.Width)
	if v.Dtype != F32 {
		s += v.Dtype.String()
	}
	if v.InKernel {
		s += "(in kernel)"
	}
	if v.Buffer != "" {
		s += "@" + v.Buffer
	}
	return s
}

// attrsText prints an op's attributes as key=value pairs.
func attrsText(a any) string {
	switch a := a.(type) {
	case nil:
		return ""
	case EmbedAttrs:
		if a.Scale != 0 {
			return fmt.Sprintf("vocab=%d scale=%g", a.Vocab, a.Scale)
		}
		return fmt.Sprintf("vocab=%d", a.Vocab)
	case NormAttrs:
		s := fmt.Sprintf("eps=%g", a.Eps)
		if a.Offset != 0 {
			s += fmt.Sprintf(" offset=%g", a.Offset)
		}
		if a.Vocab > 0 {
			s += fmt.Sprintf(" vocab=%d", a.Vocab)
		}
		if a.EmbedScale != 0 {
			s += fmt.Sprintf(" scale=%g", a.EmbedScale)
		}
		return s
	case SoftcapAttrs:
		return fmt.Sprintf("cap=%g", a.Cap)
	case MatmulAttrs:
		s := "split=" + a.Split.String()
		if a.Reduce != "" {
			s += " reduce=" + a.Reduce
		}
		return s
	case RopeAttrs:
		s := fmt.Sprintf("heads=%d/%d dim=%d", a.Heads, a.KVHeads, a.HeadDim)
		if a.QKNorm {
			s += fmt.Sprintf(" qk_norm eps=%g", a.Eps)
		}
		if a.Bias {
			s += " bias"
		}
		return s
	case AttentionAttrs:
		s := fmt.Sprintf("heads=%d/%d dim=%d scale=%g", a.Heads, a.KVHeads, a.HeadDim, a.Scale)
		if a.Softcap != 0 {
			s += fmt.Sprintf(" softcap=%g", a.Softcap)
		}
		if a.Window != 0 {
			s += fmt.Sprintf(" window=%d", a.Window)
		}
		return s
	case ActivationAttrs:
		return fmt.Sprintf("fn=%s inter=%d", a.Fn, a.Inter)
	case RouterAttrs:
		return fmt.Sprintf("experts=%d top_k=%d", a.Experts, a.TopK)
	case ExpertsAttrs:
		return fmt.Sprintf("experts=%d top_k=%d inter=%d", a.Experts, a.TopK, a.Inter)
	case SampleAttrs:
		return fmt.Sprintf("vocab=%d eos=%v logprobs=%d", a.Vocab, a.EOS, a.Logprobs)
	case CollectiveAttrs:
		return a.Op
	case CustomAttrs:
		return fmt.Sprintf("kernel=%s entry=%s %s", a.MI.Custom.Name, a.MI.Custom.Entry, a.MI)
	case LensAttrs:
		return a.MI.String()
	}
	return fmt.Sprintf("%+v", a)
}

// String prints the op as one line: app.opN template, app bit, site, what it binds.
func (m *MI) String() string {
	s := fmt.Sprintf("%s.op%d %s bit=%d at=%s width=%d", m.App, m.OpIndex, m.Template, m.Bit, m.Site, m.Width)
	if m.Vec != "" {
		s += " vec=" + m.Vec
	}
	if m.Out != "" {
		s += fmt.Sprintf(" out=%s@%d", m.Out, m.OutCol)
	}
	if m.Alpha >= 0 {
		s += fmt.Sprintf(" alpha=scal[%d]", m.Alpha)
	}
	if m.Bias >= 0 {
		s += fmt.Sprintf(" bias=scal[%d]", m.Bias)
	}
	var gs []string
	for _, g := range m.Gates {
		gs = append(gs, g.Kind)
	}
	if len(gs) > 0 {
		s += " when " + strings.Join(gs, " and ")
	}
	return s
}
