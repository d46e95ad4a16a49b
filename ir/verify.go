package ir

import (
	"errors"
	"fmt"
	"slices"
)

// Verify checks the graph's invariants; it reports mistakes of builders and passes, not of
// specs. Nodes and values have unique names; every op has its arity and attributes; a node
// reads only values defined before it (a view within its base); matmul widths agree with
// their weights as cut; MI ops match the width of the value they run on; a value kept in a
// kernel is read by no other node; and once buffers are planned, no value's buffer is
// written by another value while it is still to be read.
func Verify(g *Graph) error {
	var errs []error
	fail := func(n *Node, format string, a ...any) {
		errs = append(errs, fmt.Errorf("node %s (%s): %s", n.Name, n.Op, fmt.Sprintf(format, a...)))
	}
	nodes := map[string]bool{}
	defined := map[*Value]int{} // value -> index of its node
	names := map[string]bool{}
	for i, n := range g.Nodes {
		if n.Op <= OpInvalid || n.Op >= numOps {
			errs = append(errs, fmt.Errorf("node %d (%s): invalid op %d", i, n.Name, n.Op))
			continue
		}
		f := Ops[n.Op]
		if nodes[n.Name] {
			fail(n, "a second node of this name")
		}
		nodes[n.Name] = true
		if len(n.In) != f.In || len(n.Out) < f.Out || len(n.Out) > f.Out+f.MoreOut {
			fail(n, "%d inputs and %d outputs, want %d and %d", len(n.In), len(n.Out), f.In, f.Out)
		}
		if !n.Op.attrsOK(n.Attrs) {
			fail(n, "attributes %T, want %T", n.Attrs, f.Attrs)
		}
		for _, v := range n.In {
			base := v.Base()
			if _, ok := defined[base]; !ok {
				fail(n, "reads %%%s before it is defined", v.Name)
			}
			if v.Of != nil && (v.Offset < 0 || v.Offset+v.Width > base.Width) {
				fail(n, "view %%%s [%d, +%d) outside %%%s of %d", v.Name, v.Offset, v.Width, base.Name, base.Width)
			}
			if base.InKernel && base.Def != n {
				fail(n, "reads %%%s, which lives in the kernel of %s", v.Name, base.Def.Name)
			}
		}
		for _, v := range n.Out {
			if _, again := defined[v]; again || names[v.Name] {
				fail(n, "defines %%%s a second time", v.Name)
			}
			if v.Def != n || v.Of != nil || v.Width <= 0 {
				fail(n, "defines %%%s badly (defined by %v, a view: %v, width %d)", v.Name, v.Def != nil && v.Def == n, v.Of != nil, v.Width)
			}
			defined[v], names[v.Name] = i, true
			for _, w := range append([]*Value{v}, v.Views...) {
				names[w.Name] = true
				for _, m := range w.MI {
					if m.Width != w.Width {
						fail(n, "MI op %s.op%d of width %d attached at %%%s of %d", m.App, m.OpIndex, m.Width, w.Name, w.Width)
					}
				}
			}
		}
		if len(n.MI) > len(f.Groups) {
			fail(n, "%d groups of MI ops, the op has %d", len(n.MI), len(f.Groups))
		}
		for gi, group := range n.MI {
			if gi >= len(f.Groups) {
				break
			}
			on := groupValue(n, f.Groups[gi])
			for _, m := range group {
				if on == nil || m.Width != on.Width {
					fail(n, "MI op %s.op%d of width %d in group %s", m.App, m.OpIndex, m.Width, f.Groups[gi].Name)
				}
			}
		}
		if n.Op == OpMatmul {
			checkMatmul(g, n, fail)
		}
		checkParts(g, n, fail)
	}
	errs = append(errs, checkBuffers(g)...)
	return errors.Join(errs...)
}

// groupValue is the value group gr of n runs on.
func groupValue(n *Node, gr Group) *Value {
	vs := n.In
	if gr.Out {
		vs = n.Out
	}
	if gr.Index < len(vs) {
		return vs[gr.Index]
	}
	return nil
}

// Local is w's shape on one rank of g: cut along its split.
func (g *Graph) Local(w *Weight) []int {
	s := append([]int(nil), w.Shape...)
	switch w.Split {
	case Column, Vocab:
		s[0] /= g.TP
	case Row:
		s[1] /= g.TP
	}
	return s
}

// checkParts checks a fused node's parts: the ops its fact names, each with its attributes
// (a matmul's widths too), the first reading the node's inputs.
func checkParts(g *Graph, n *Node, fail func(*Node, string, ...any)) {
	want := Ops[n.Op].Parts
	if len(n.Parts) != len(want) {
		fail(n, "%d parts, want %d", len(n.Parts), len(want))
		return
	}
	for i, part := range n.Parts {
		if part.Op != want[i] || !part.Op.attrsOK(part.Attrs) {
			fail(n, "part %d is %s with attributes %T, want %s", i, part.Op, part.Attrs, want[i])
			continue
		}
		if part.Op == OpMatmul {
			checkMatmul(g, part, fail)
		}
	}
	if len(n.Parts) > 0 && !slices.Equal(n.Parts[0].In, n.In) {
		fail(n, "its first part reads other values than the node")
	}
}

func checkMatmul(g *Graph, n *Node, fail func(*Node, string, ...any)) {
	w := n.Weight("w")
	if w == nil || len(w.Shape) != 2 {
		fail(n, "no [N, K] weight w")
		return
	}
	s := g.Local(w)
	if k, nOut := n.In[0].Width, n.Out[0].Width; k != s[1] || nOut != s[0] {
		fail(n, "%d -> %d columns through weight %s of %v on a rank", k, nOut, w.Name, s)
	}
}

// checkBuffers checks a planned graph: every value but those kept in a kernel has a buffer,
// and no node writes a value's buffer between the value's definition and its last read.
func checkBuffers(g *Graph) []error {
	planned := false
	for _, v := range g.Values() {
		planned = planned || v.Buffer != ""
	}
	if !planned {
		return nil
	}
	last := map[*Value]int{}
	for i, n := range g.Nodes {
		for _, v := range n.In {
			last[v.Base()] = i
		}
	}
	var errs []error
	for i, n := range g.Nodes {
		for _, v := range n.Out {
			if v.InKernel != (v.Buffer == "") {
				errs = append(errs, fmt.Errorf("value %%%s: buffer %q (kept in a kernel: %v)", v.Name, v.Buffer, v.InKernel))
				continue
			}
			for _, w := range v.Views {
				if w.Buffer != v.Buffer {
					errs = append(errs, fmt.Errorf("view %%%s in buffer %s, its base in %s", w.Name, w.Buffer, v.Buffer))
				}
			}
			if v.InKernel {
				continue
			}
			// The last reader may write the buffer: it reads before it writes (a residual add
			// replacing the residual, a collective in place).
			for j := i + 1; j < last[v]; j++ {
				for _, x := range g.Nodes[j].Out {
					if x.Buffer == v.Buffer {
						errs = append(errs, fmt.Errorf("value %%%s (buffer %s) is overwritten by %%%s of node %s before node %s reads it",
							v.Name, v.Buffer, x.Name, g.Nodes[j].Name, lastReader(g, v, last[v])))
					}
				}
			}
		}
	}
	return errs
}

func lastReader(g *Graph, v *Value, i int) string {
	if i < len(g.Nodes) {
		return g.Nodes[i].Name
	}
	return "?"
}
