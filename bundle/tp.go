package bundle

import "fmt"

// MaxTP bounds the tensor-parallel degree a bundle may declare; it keeps shard arithmetic
// far from overflow and is well above any host's GPU count.
const MaxTP = 256

// verifyShards checks every Shard against the buffer it cuts: only weight and param buffers
// of a TP > 1 bundle are sharded, and the extents split evenly into the buffer's shape.
func verifyShards(bufs []Buffer, tp int) error {
	byName := map[string]*Buffer{}
	for i := range bufs {
		byName[bufs[i].Name] = &bufs[i]
	}
	for i, buf := range bufs {
		if buf.Shard == nil {
			continue
		}
		if err := verifyShard(buf, tp, byName); err != nil {
			return fmt.Errorf("buffer %d (%q): shard: %w", i, buf.Name, err)
		}
	}
	return nil
}

func verifyShard(buf Buffer, tp int, byName map[string]*Buffer) error {
	s := buf.Shard
	if tp <= 1 {
		return fmt.Errorf("the bundle is not tensor-parallel (tp %d), so no buffer may be sharded", tp)
	}
	if buf.Kind != KindWeight && buf.Kind != KindParam {
		return fmt.Errorf("a %s buffer cannot be sharded; only weight and param buffers are loaded in parts", buf.Kind)
	}
	if len(s.Extents) != len(buf.Tensors) {
		return fmt.Errorf("%d extents for %d tensors; want one per tensor", len(s.Extents), len(buf.Tensors))
	}
	for j, e := range s.Extents {
		if e <= 0 || e%tp != 0 {
			return fmt.Errorf("extent %d of tensor %q does not split into %d equal parts", e, buf.Tensors[j], tp)
		}
	}
	switch s.Dim {
	case 0:
		rows := 0
		for _, e := range s.Extents {
			rows += e / tp
		}
		if rows != buf.Shape[0] {
			return fmt.Errorf("dim 0: the parts of extents %v stack to %d rows, the buffer's shape %v has %d", s.Extents, rows, buf.Shape, buf.Shape[0])
		}
	case 1:
		if len(buf.Shape) != 2 {
			return fmt.Errorf("dim 1 cuts a matrix; the buffer's shape %v is not 2-D", buf.Shape)
		}
		for j, e := range s.Extents {
			if e/tp != buf.Shape[1] {
				return fmt.Errorf("dim 1: tensor %q of %d columns gives parts of %d, the buffer's shape %v has %d", buf.Tensors[j], e, e/tp, buf.Shape, buf.Shape[1])
			}
		}
	default:
		return fmt.Errorf("dim %d: want 0 (rows) or 1 (columns)", s.Dim)
	}
	if s.Global != "" {
		g := byName[s.Global]
		if g == nil || g.Kind != KindWeight || g.Shard != nil {
			return fmt.Errorf("global %q is not an unsharded weight buffer of the manifest", s.Global)
		}
		if buf.Kind != KindWeight {
			return fmt.Errorf("only weight buffers are cut from a global buffer (synthetic weights)")
		}
	}
	return nil
}

// verifyCollective checks a collective node: no kernel launch, a known op, f32 activation
// buffers that hold the rows and columns it moves, at most the template's rows.
func verifyCollective(n *Node, tokens int, bufs []Buffer, tp int) error {
	c := n.Collective
	if tp <= 1 {
		return fmt.Errorf("collective %s in a bundle that is not tensor-parallel (tp %d)", c.Op, tp)
	}
	if n.Kernel != "" || len(n.Args) != 0 || n.Grid != [3]int{} || n.Block != [3]int{} || n.Shared != 0 {
		return fmt.Errorf("a collective node launches no kernel: want no kernel, args, grid, block or shared memory")
	}
	if c.Rows <= 0 || c.Rows > tokens || c.Cols <= 0 {
		return fmt.Errorf("collective %s of %d rows x %d columns: want 1..%d rows (the template's tokens) and at least 1 column", c.Op, c.Rows, c.Cols, tokens)
	}
	outCols := c.Cols
	switch c.Op {
	case AllReduceSum:
		if c.In != c.Out {
			return fmt.Errorf("all_reduce_sum works in place: in %q and out %q differ", c.In, c.Out)
		}
	case AllGatherCols:
		if c.In == c.Out {
			return fmt.Errorf("all_gather_cols cannot work in place on %q", c.In)
		}
		outCols = c.Cols * tp
	default:
		return fmt.Errorf("unknown collective %q (want %s or %s)", c.Op, AllReduceSum, AllGatherCols)
	}
	for _, side := range []struct {
		name string
		cols int
	}{{c.In, c.Cols}, {c.Out, outCols}} {
		if err := collectiveBuffer(bufs, side.name, c.Rows, side.cols); err != nil {
			return fmt.Errorf("collective %s: %w", c.Op, err)
		}
	}
	return nil
}

// collectiveBuffer checks that buffer name is an f32 activation of at least rows x cols.
func collectiveBuffer(bufs []Buffer, name string, rows, cols int) error {
	for _, b := range bufs {
		if b.Name != name {
			continue
		}
		if b.Kind != KindActivation || b.Dtype != "f32" {
			return fmt.Errorf("buffer %q is a %s %s buffer; collectives move f32 activations", name, b.Dtype, b.Kind)
		}
		n := int64(1)
		for _, d := range b.Shape {
			n *= int64(d)
		}
		if int64(rows)*int64(cols) > n {
			return fmt.Errorf("buffer %q of shape %v holds %d elements, fewer than %d rows x %d columns", name, b.Shape, n, rows, cols)
		}
		return nil
	}
	return fmt.Errorf("buffer %q does not exist in the manifest", name)
}
