package codegen

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"xmix/ops"
	"xmix/ptx"
)

func fill(n int, v float32) []float32 {
	out := make([]float32, n)
	for i := range out {
		out[i] = v
	}
	return out
}

// TestLensKernels runs the lens's norm and top-k kernels, emulated and on their references,
// over rows of which some enable the app, then with the app's bit clear in any_mask: nothing
// may be written. The top-k runs over three slices (the last one short), with a tie across a
// slice boundary, a NaN, -inf logits and a row with fewer than k logits that are not NaN.
func TestLensKernels(t *testing.T) {
	const rows, outW = 4, 12
	r := rand.New(rand.NewPCG(51, 52))
	c := LensConfig{Hidden: 96, Vocab: 2*lensTopKSlice + 452, Eps: 1e-5, WDtype: ptx.BF16, Bit: 3, K: 5, OutWidth: outW, OutCol: 1}
	if c.Parts() != 3 {
		t.Fatalf("%d parts, want 3", c.Parts())
	}
	mask := []uint32{1 << 3, 1, 1<<3 | 1, 1 << 3}
	for _, wdt := range []ptx.Type{ptx.BF16, ptx.F32} {
		c.WDtype = wdt
		nk := must(t)(LensNorm("lens_norm_test", c))
		w := targ{name: "w", f32: randF32(r, c.Hidden, 1)}
		if wdt == ptx.BF16 {
			w = targ{name: "w", bf16: w.f32}
		}
		for _, any := range []uint32{1<<3 | 1, 1} {
			args := []targ{{name: "any_mask", u32: []uint32{any}}, {name: "resid", f32: randF32(r, rows*c.Hidden, 2)}, w,
				{name: "out", f32: fill(rows*c.Hidden, -3), out: rows * c.Hidden}}
			checkKernel(t, nk, c.RowsLaunch(rows), args)
			out := emulate(t, nk, c.RowsLaunch(rows), args)[3]
			if written := slices.ContainsFunc(out, func(v float32) bool { return v != -3 }); written != (any&(1<<3) != 0) {
				t.Fatalf("%s any_mask %b: written %v", wdt, any, written)
			}
		}
	}

	pk, mk := must(t)(LensTopKPart("lens_topk_part_test", c)), must(t)(LensTopK("lens_topk_test", c))
	logits := randF32(r, rows*c.Vocab, 4)
	logits[lensTopKSlice-1], logits[lensTopKSlice] = 40, 40 // a tie across slices: id 1023 first
	logits[c.Vocab-1] = 30                                  // the last id of the short slice
	logits[7] = float32(math.NaN())
	logits[9], logits[2*lensTopKSlice+5] = float32(math.Inf(-1)), float32(math.Inf(1))
	row3 := logits[3*c.Vocab : 4*c.Vocab]
	for i := range row3 {
		row3[i] = float32(math.NaN())
	}
	row3[5], row3[1500], row3[2400] = 1, float32(math.Inf(-1)), 2 // three picks, then nothing left
	for _, any := range []uint32{1<<3 | 1, 1} {
		cand := fill(rows*c.CandWidth(), -9)
		pa := []targ{{name: "any_mask", u32: []uint32{any}}, {name: "ctl_mask", u32: mask},
			{name: "logits", f32: logits}, {name: "cand", f32: cand, out: len(cand)}}
		gotCand := emulate(t, pk, c.PartLaunch(rows), pa)[3]
		wantCand := reference(t, pk, c.PartLaunch(rows), pa)[3]
		sameBits(t, "candidates", gotCand, wantCand)
		out := fill(rows*outW, -9)
		ma := []targ{{name: "any_mask", u32: []uint32{any}}, {name: "ctl_mask", u32: mask},
			{name: "cand", f32: wantCand}, {name: "out", f32: out, out: len(out)}}
		res := emulate(t, mk, c.RowsLaunch(rows), ma)[3]
		sameBits(t, "top k", res, reference(t, mk, c.RowsLaunch(rows), ma)[3])
		for row := range rows {
			o := res[row*outW : (row+1)*outW]
			if any&(1<<3) == 0 || mask[row]&(1<<3) == 0 {
				if slices.ContainsFunc(o, func(v float32) bool { return v != -9 }) {
					t.Fatalf("any_mask %b: row %d written: %v", any, row, o)
				}
				continue
			}
			ids, vals := ops.TopK(logits[row*c.Vocab:(row+1)*c.Vocab], c.K)
			for j := range c.K {
				if o[1+j] != float32(ids[j]) || o[1+c.K+j] != vals[j] {
					t.Fatalf("row %d pick %d: id %v logit %v, want %d %v", row, j, o[1+j], o[1+c.K+j], ids[j], vals[j])
				}
			}
			switch {
			case row == 0 && (o[1] != float32(2*lensTopKSlice+5) || o[2] != lensTopKSlice-1 || o[3] != lensTopKSlice || o[4] != float32(c.Vocab-1)):
				t.Fatalf("row 0: ids %v, want +inf at %d, the tie %d, %d, then %d", o[1:1+c.K], 2*lensTopKSlice+5, lensTopKSlice-1, lensTopKSlice, c.Vocab-1)
			case row == 3 && (o[1] != 2400 || o[2] != 5 || o[3] != 1500 || o[4] != float32(c.Vocab) || o[5] != float32(c.Vocab)):
				t.Fatalf("row 3: ids %v, want 2400, 5, 1500, then none (%d)", o[1:1+c.K], c.Vocab)
			}
		}
	}
}

// sameBits fails unless got and want hold the same bits (NaN included).
func sameBits(t *testing.T, what string, got, want []float32) {
	t.Helper()
	for i := range want {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			t.Fatalf("%s[%d]: emulated %v, reference %v", what, i, got[i], want[i])
		}
	}
}
