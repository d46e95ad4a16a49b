package loader

import (
	"bytes"
	"fmt"
	"strings"
	"testing"

	"xmix/bundle"
	"xmix/checkpoint"
	"xmix/safetensors"
)

// seqTensor is an F32 tensor whose element i is base+i, so any slice of it is recognisable.
func seqTensor(name string, base float32, shape ...int) *safetensors.Tensor {
	t := f32T(name, shape...)
	v := make([]float32, len(t.Data)/4)
	for i := range v {
		v[i] = base + float32(i)
	}
	copy(t.Data, putF32s(v))
	return &t
}

// rowsOf returns rows [lo, hi) of an f32 matrix of cols columns.
func rowsOf(v []float32, cols, lo, hi int) []float32 { return v[lo*cols : hi*cols] }

// colsOf returns columns [lo, hi) of every row of an f32 matrix of cols columns.
func colsOf(v []float32, cols, lo, hi int) []float32 {
	var out []float32
	for r := 0; r < len(v)/cols; r++ {
		out = append(out, v[r*cols+lo:r*cols+hi]...)
	}
	return out
}

// fused QKV (rows cut per tensor) and an O projection (columns cut), at tp 2 and 4.
func shardCases(tp int) []struct {
	buf  bundle.Buffer
	want func(ts map[string][]float32, rank int) []float32
} {
	const h = 4 // hidden: the columns of q/k/v, the rows of o
	return []struct {
		buf  bundle.Buffer
		want func(ts map[string][]float32, rank int) []float32
	}{
		{bundle.Buffer{Name: "wqkv", Kind: bundle.KindWeight, Dtype: "f32", Shape: []int{(8 + 4 + 4) / tp, h},
			Tensors: []string{"q", "k", "v"}, Shard: &bundle.Shard{Dim: 0, Extents: []int{8, 4, 4}}},
			func(ts map[string][]float32, r int) []float32 {
				var out []float32
				for _, n := range []string{"q", "k", "v"} {
					per := len(ts[n]) / h / tp
					out = append(out, rowsOf(ts[n], h, r*per, (r+1)*per)...)
				}
				return out
			}},
		{bundle.Buffer{Name: "wo", Kind: bundle.KindWeight, Dtype: "f32", Shape: []int{h, 8 / tp},
			Tensors: []string{"o"}, Shard: &bundle.Shard{Dim: 1, Extents: []int{8}}},
			func(ts map[string][]float32, r int) []float32 { return colsOf(ts["o"], 8, r*8/tp, (r+1)*8/tp) }},
	}
}

// TestFillRankSlicesCheckpointTensors: every rank's part of a sharded buffer is exactly its
// slice of the checkpoint tensors.
func TestFillRankSlicesCheckpointTensors(t *testing.T) {
	for _, tp := range []int{2, 4} {
		ts := map[string]*safetensors.Tensor{
			"q": seqTensor("q", 0, 8, 4), "k": seqTensor("k", 100, 4, 4), "v": seqTensor("v", 200, 4, 4), "o": seqTensor("o", 300, 4, 8),
		}
		vals := map[string][]float32{}
		for n, x := range ts {
			vals[n], _ = x.Float32s()
		}
		w := &Weights{ck: &checkpoint.Checkpoint{Tensors: ts}, tp: tp}
		for _, c := range shardCases(tp) {
			for r := range tp {
				n, _ := BufferBytes(c.buf)
				dst := make([]byte, n)
				if err := w.FillRank(c.buf, r, dst); err != nil {
					t.Fatalf("tp %d %s rank %d: %v", tp, c.buf.Name, r, err)
				}
				if got, want := fmt.Sprint(getF32s(dst)), fmt.Sprint(c.want(vals, r)); got != want {
					t.Errorf("tp %d %s rank %d:\n got %s\nwant %s", tp, c.buf.Name, r, got, want)
				}
			}
		}
	}
}

// TestFillRankSyntheticSlicesTP1: synthetic weights of rank r are the same slice of the
// buffer generated unsharded, and a tied LM head is cut from the embedding's values.
func TestFillRankSyntheticSlicesTP1(t *testing.T) {
	s := &bundle.Synth{Seed: 9, Std: 0.1}
	const tp = 2
	whole := func(name string, shape ...int) []float32 {
		b := bundle.Buffer{Name: name, Kind: bundle.KindWeight, Dtype: "f32", Shape: shape}
		n, _ := BufferBytes(b)
		dst := make([]byte, n)
		if err := fillSynthetic(b, dst, s, 1, 0); err != nil {
			t.Fatal(err)
		}
		return getF32s(dst)
	}
	vals := map[string][]float32{"q": whole("wqkv", 16, 4)[:32], "k": whole("wqkv", 16, 4)[32:48], "v": whole("wqkv", 16, 4)[48:], "o": whole("wo", 4, 8)}
	w := &Weights{synth: s, tp: tp}
	for _, c := range shardCases(tp) {
		for r := range tp {
			n, _ := BufferBytes(c.buf)
			dst := make([]byte, n)
			if err := w.FillRank(c.buf, r, dst); err != nil {
				t.Fatal(err)
			}
			if got, want := fmt.Sprint(getF32s(dst)), fmt.Sprint(c.want(vals, r)); got != want {
				t.Errorf("%s rank %d:\n got %s\nwant %s", c.buf.Name, r, got, want)
			}
		}
	}
	embed := whole("embed", 6, 4)
	head := bundle.Buffer{Name: "lm_head", Kind: bundle.KindWeight, Dtype: "f32", Shape: []int{3, 4}, Tensors: []string{"model.embed_tokens.weight"},
		Shard: &bundle.Shard{Dim: 0, Extents: []int{6}, Global: "embed"}}
	dst := make([]byte, 48)
	if err := w.FillRank(head, 1, dst); err != nil {
		t.Fatal(err)
	}
	if got, want := fmt.Sprint(getF32s(dst)), fmt.Sprint(embed[12:]); got != want {
		t.Errorf("tied head rank 1: got %s, want the embedding's rows 3-5 %s", got, want)
	}
}

func TestFillRankRefuses(t *testing.T) {
	w := &Weights{ck: &checkpoint.Checkpoint{Tensors: map[string]*safetensors.Tensor{"o": seqTensor("o", 0, 4, 6)}}, tp: 2}
	o := bundle.Buffer{Name: "wo", Kind: bundle.KindWeight, Dtype: "f32", Shape: []int{4, 4}, Tensors: []string{"o"}, Shard: &bundle.Shard{Dim: 1, Extents: []int{8}}}
	for _, c := range []struct {
		rank int
		want string
	}{
		{0, "weight tensor o has shape [4 6]; buffer wo cuts a dimension 1 of 8 across ranks"},
		{2, "buffer wo: rank 2 of a bundle with tensor-parallel degree 2"},
	} {
		err := w.FillRank(o, c.rank, make([]byte, 64))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("rank %d: %v, want %q", c.rank, err, c.want)
		}
	}
}

// TestRankParamTensors: a sharded head mask gives each rank its own heads' columns.
func TestRankParamTensors(t *testing.T) {
	mask := putF32s([]float32{0, 0, 1, 1, 0, 0, 0, 0})
	var params bytes.Buffer
	if err := safetensors.Write(&params, []safetensors.Tensor{{Name: "m", Dtype: "F32", Shape: []int{8}, Data: mask}}, nil); err != nil {
		t.Fatal(err)
	}
	b := &bundle.Bundle{Params: params.Bytes(), Manifest: bundle.Manifest{TP: 2, Buffers: []bundle.Buffer{
		{Name: "m", Kind: bundle.KindParam, Dtype: "f32", Shape: []int{4}, Tensors: []string{"m"}, Shard: &bundle.Shard{Dim: 0, Extents: []int{8}}},
	}}}
	for r, want := range []string{"[0 0 1 1]", "[0 0 0 0]"} {
		got, err := RankParamTensors(b, r)
		if err != nil {
			t.Fatal(err)
		}
		if s := fmt.Sprint(getF32s(got["m"])); s != want {
			t.Errorf("rank %d: %s, want %s", r, s, want)
		}
	}
}

// TestGlobalIndexerRuns: runs covers every local element from lo to hi once, in order, each
// at its part's global index, in runs that stop at part ends (empty parts among them),
// wherever lo and hi fall.
func TestGlobalIndexerRuns(t *testing.T) {
	parts := []part{{n: 3, lo: 0}, {n: 0, lo: 7}, {n: 5, lo: 10}, {n: 1, lo: 40}, {n: 4, lo: 50}}
	global := []int{100, 200, 300, 400, 500}
	g := newGlobalIndexer(parts, global)
	var want []int // global index of each local element
	for k, p := range parts {
		for j := range p.n {
			want = append(want, global[k]+j)
		}
	}
	for lo := 0; lo <= len(want); lo++ {
		for hi := lo; hi <= len(want); hi++ {
			var got []int
			next := lo
			g.runs(lo, hi, func(i, gi, n int) {
				if i != next || n < 1 {
					t.Fatalf("[%d, %d): run at %d of %d, want one at %d", lo, hi, i, n, next)
				}
				for j := range n {
					got = append(got, gi+j)
				}
				next = i + n
			})
			if fmt.Sprint(got) != fmt.Sprint(want[lo:hi]) {
				t.Fatalf("[%d, %d): %v, want %v", lo, hi, got, want[lo:hi])
			}
		}
	}
}
