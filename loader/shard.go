package loader

import (
	"fmt"
	"sort"

	"xmix/bundle"
	"xmix/safetensors"
)

// part is a run of n consecutive elements of source tensor t from element lo: a rank's
// part of a buffer is its parts, in order.
type part struct{ t, lo, n int }

// matrix is a source tensor seen as rows x cols (cols: the product of the dimensions after
// the first; 1 for a vector).
type matrix struct{ rows, cols int }

func asMatrix(shape []int) matrix {
	m := matrix{rows: 1, cols: 1}
	if len(shape) > 0 {
		m.rows = shape[0]
	}
	for _, d := range shape[min(1, len(shape)):] {
		m.cols *= d
	}
	return m
}

// shardParts lists the parts of tensors (of shapes ms) that rank of tp holds under s: each
// tensor's rows (dim 0) or each row's columns (dim 1) cut into tp equal runs. A nil s (a
// replicated buffer) is every tensor whole.
func shardParts(s *bundle.Shard, ms []matrix, tp, rank int) []part {
	var out []part
	for t, m := range ms {
		switch {
		case s == nil:
			out = append(out, part{t: t, lo: 0, n: m.rows * m.cols})
		case s.Dim == 0:
			per := m.rows / tp
			out = append(out, part{t: t, lo: rank * per * m.cols, n: per * m.cols})
		default:
			per := m.cols / tp
			for i := range m.rows {
				out = append(out, part{t: t, lo: i*m.cols + rank*per, n: per})
			}
		}
	}
	return out
}

// checkRank refuses a rank outside the bundle's degree.
func checkRank(rank, tp int) error {
	if rank < 0 || rank >= tp {
		return fmt.Errorf("rank %d of a bundle with tensor-parallel degree %d", rank, tp)
	}
	return nil
}

// fillParts converts the parts of tensors ts into dst, which holds buffer buf.
func fillParts(buf bundle.Buffer, ts []*safetensors.Tensor, parts []part, dst []byte) error {
	s, err := partsSource(buf, ts, parts)
	if err != nil {
		return err
	}
	if int64(len(dst)) != s.size {
		return fmt.Errorf("buffer %s of shape %v: %d bytes given, it has %d", buf.Name, buf.Shape, len(dst), s.size)
	}
	return s.fill(0, dst)
}

// synthParts is shardParts over the unsharded synthetic buffer, with each part's first
// element as an index into that whole buffer: synthetic values are keyed by that index, so
// rank r's part holds exactly the values of the same elements at tp 1.
func synthParts(buf bundle.Buffer, tp, rank int) (parts []part, global []int) {
	s := buf.Shard
	cols := asMatrix(buf.Shape).cols
	var ms []matrix
	switch {
	case s == nil:
		ms = []matrix{asMatrix(buf.Shape)}
	case s.Dim == 0:
		for _, e := range s.Extents {
			ms = append(ms, matrix{rows: e, cols: cols})
		}
	default: // the cut columns do not depend on tensor boundaries: one matrix of every row
		ms = []matrix{{rows: buf.Shape[0], cols: buf.Shape[1] * tp}}
	}
	starts := make([]int, len(ms))
	for i := 1; i < len(ms); i++ {
		starts[i] = starts[i-1] + ms[i-1].rows*ms[i-1].cols
	}
	parts = shardParts(s, ms, tp, rank)
	global = make([]int, len(parts))
	for i, p := range parts {
		global[i] = starts[p.t] + p.lo
	}
	return parts, global
}

// globalIndexer maps a rank's element index to the unsharded buffer's.
type globalIndexer struct {
	local  []int // first local element of each part
	global []int // first global element of each part
}

func newGlobalIndexer(parts []part, global []int) globalIndexer {
	g := globalIndexer{local: make([]int, len(parts)), global: global}
	for i := 1; i < len(parts); i++ {
		g.local[i] = g.local[i-1] + parts[i-1].n
	}
	return g
}

// runs calls fn(i, g, n) for the runs of local elements lo <= i < hi that lie in one part:
// local elements i..i+n-1 are the unsharded buffer's g..g+n-1. It finds the part of lo
// once and steps from there.
func (g globalIndexer) runs(lo, hi int, fn func(i, global, n int)) {
	k := sort.Search(len(g.local), func(k int) bool { return g.local[k] > lo }) - 1
	for i := lo; i < hi; {
		for k+1 < len(g.local) && g.local[k+1] <= i {
			k++
		}
		end := hi
		if k+1 < len(g.local) {
			end = min(hi, g.local[k+1])
		}
		fn(i, g.global[k]+i-g.local[k], end-i)
		i = end
	}
}
