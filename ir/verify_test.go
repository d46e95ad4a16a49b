package ir

import (
	"strings"
	"testing"

	"xmix/mi"
)

// small is a graph of an embedding, a projection and a norm, planned into buffers.
func small() (*Graph, *Value, *Value) {
	b := NewBuilder("t", "llama", BF16)
	x := b.Embed("embed", b.Weight("embed", []int{10, 4}), 0, "act.resid")
	y := b.Matmul("proj", "y", x, b.Weight("w", []int{6, 4}), MatmulAttrs{}, "act.y")
	b.Norm("norm", "n", x, b.Weight("norm", []int{4}), NormAttrs{Eps: 1e-5}, Tokens, "act.xn")
	for _, v := range b.G.Values() {
		v.Buffer = v.Class
	}
	return b.G, x, y
}

func TestVerifyAcceptsAWellFormedGraph(t *testing.T) {
	g, _, _ := small()
	if err := Verify(g); err != nil {
		t.Fatal(err)
	}
}

// Every invariant the verifier checks fails with a message naming the node.
func TestVerifyRefuses(t *testing.T) {
	for _, c := range []struct {
		name   string
		break_ func(g *Graph, x, y *Value)
		want   string
	}{
		{"read before definition", func(g *Graph, x, y *Value) { g.Nodes[0], g.Nodes[1] = g.Nodes[1], g.Nodes[0] },
			"node proj (matmul): reads %embed before it is defined"},
		{"width against the weight", func(g *Graph, x, y *Value) { y.Width = 5 },
			"node proj (matmul): 4 -> 5 columns through weight w of [6 4] on a rank"},
		{"arity", func(g *Graph, x, y *Value) { g.Nodes[1].In = append(g.Nodes[1].In, x) },
			"node proj (matmul): 2 inputs and 1 outputs, want 1 and 1"},
		{"attributes", func(g *Graph, x, y *Value) { g.Nodes[1].Attrs = NormAttrs{} },
			"node proj (matmul): attributes ir.NormAttrs, want ir.MatmulAttrs"},
		{"MI op width", func(g *Graph, x, y *Value) { x.MI = []*MI{{App: "a", Op: mi.Op{Width: 3}}} },
			"node embed (embed): MI op a.op0 of width 3 attached at %embed of 4"},
		{"a buffer overwritten while live", func(g *Graph, x, y *Value) { y.Buffer = "act.resid" },
			"value %embed (buffer act.resid) is overwritten by %y of node proj before node norm reads it"},
		{"a value kept in a kernel read elsewhere", func(g *Graph, x, y *Value) { x.InKernel, x.Buffer = true, "" },
			"node proj (matmul): reads %embed, which lives in the kernel of embed"},
	} {
		g, x, y := small()
		c.break_(g, x, y)
		if err := Verify(g); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %v, want %q", c.name, err, c.want)
		}
	}
}
