package ops

import (
	"fmt"
	"math"
	"sort"
)

func init() {
	for name, run := range map[string]func(LensAttrs, []Arg, Launch) error{
		"lens_norm": LensAttrs.runNorm, "lens_topk_part": LensAttrs.runTopKPart, "lens_topk": LensAttrs.runTopK,
	} {
		Register(name, func(attrs []byte) (Runner, error) {
			a, err := decodeLens(attrs)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", name, err)
			}
			return RunnerFunc(func(args []Arg, l Launch) error { return run(a, args, l) }), nil
		})
	}
}

// LensAttrs configure the logit lens's ops (codegen/lens.go; the LM head between them is a
// guarded "gemm" or "gemm_tc"). Each does nothing at all when any_mask[0] lacks Bit; rows
// come from the grid.
//   - "lens_norm" (any_mask, resid [rows, Hidden], w [Hidden], out [rows, Hidden]), grid x =
//     rows: out = RMSNorm(resid row) * w for every row.
//   - "lens_topk_part" (any_mask, ctl_mask, logits [rows, Vocab], cand [rows, CandWidth]),
//     grid (Parts, rows): for each row whose mask has Bit, the top K of each Slice of its
//     logits, slice p's at cand[row][p*K:] (ids, as f32) and cand[row][Parts*K + p*K:]
//     (logits).
//   - "lens_topk" (any_mask, ctl_mask, cand, out [rows, OutWidth]), grid x = rows: for each
//     row whose mask has Bit, the top K of its candidates, ids at OutCol and logits at
//     OutCol+K.
//
// Top K is by logit descending, ties by lower id, NaN never picked, id Vocab and -inf once
// nothing is left.
type LensAttrs struct {
	Hidden   int     `json:"hidden"`
	Vocab    int     `json:"vocab"`
	Eps      float32 `json:"eps"`
	WDtype   string  `json:"wdtype"`
	Bit      int     `json:"bit"`
	K        int     `json:"k"`
	OutWidth int     `json:"out_width"`
	OutCol   int     `json:"out_col"`
	Slice    int     `json:"slice"`
	// WOffset is added to the final norm's weight (lens_norm); Softcap, when not 0, caps the
	// logits lens_topk writes (the order is the uncapped one's).
	WOffset float32 `json:"w_offset,omitempty"`
	Softcap float32 `json:"softcap,omitempty"`
}

func decodeLens(attrs []byte) (LensAttrs, error) {
	var a LensAttrs
	if err := DecodeAttrs(attrs, &a); err != nil {
		return a, err
	}
	switch {
	case a.Hidden <= 0 || a.Vocab <= 0 || a.Bit < 0 || a.Bit > 31:
		return a, fmt.Errorf("hidden %d, vocab %d, bit %d", a.Hidden, a.Vocab, a.Bit)
	case a.WDtype != "f32" && a.WDtype != "bf16":
		return a, fmt.Errorf("weight dtype %q", a.WDtype)
	case a.K < 1 || a.OutCol < 0 || a.OutCol+2*a.K > a.OutWidth:
		return a, fmt.Errorf("top %d into columns %d.. of %d", a.K, a.OutCol, a.OutWidth)
	case a.Slice < 1:
		return a, fmt.Errorf("top-k slice %d", a.Slice)
	}
	return a, nil
}

// Parts is how many slices lens_topk_part cuts a row into; CandWidth is a row of cand.
func (a LensAttrs) Parts() int     { return (a.Vocab + a.Slice - 1) / a.Slice }
func (a LensAttrs) CandWidth() int { return 2 * a.Parts() * a.K }

func (a LensAttrs) on(anyMask Arg) bool { return anyMask.U32()[0]>>a.Bit&1 != 0 }

func (a LensAttrs) runNorm(args []Arg, l Launch) error {
	ws, err := dtypeSize(a.WDtype)
	if err != nil {
		return fmt.Errorf("lens_norm: %w", err)
	}
	rows, h := l.Grid[0], a.Hidden
	if err := CheckArgs("lens_norm", args, 4, 4*rows*h, ws*h, 4*rows*h); err != nil {
		return err
	}
	if !a.on(args[0]) {
		return nil
	}
	w, resid, out := viewWeights(a.WDtype, args[2]), args[1].F32(), args[3].F32()
	for r := range rows {
		x := out[r*h : (r+1)*h]
		copy(x, resid[r*h:(r+1)*h])
		rmsNorm(x, w, a.Eps, a.WOffset)
	}
	return nil
}

func (a LensAttrs) runTopKPart(args []Arg, l Launch) error {
	rows, cw := l.Grid[1], a.CandWidth()
	if err := CheckArgs("lens_topk_part", args, 4, 4*rows, 4*rows*a.Vocab, 4*rows*cw); err != nil {
		return err
	}
	if !a.on(args[0]) {
		return nil
	}
	mask, logits, cand := args[1].U32(), args[2].F32(), args[3].F32()
	pk := a.Parts() * a.K
	for r := range rows {
		if mask[r]>>a.Bit&1 == 0 {
			continue
		}
		c := cand[r*cw : (r+1)*cw]
		for p := range a.Parts() {
			lo := p * a.Slice
			n := min(a.Slice, a.Vocab-lo)
			ids, vals := TopK(logits[r*a.Vocab+lo:r*a.Vocab+lo+n], a.K)
			for j := range a.K {
				id := a.Vocab // TopK's "nothing left" is id n
				if ids[j] < n {
					id = lo + ids[j]
				}
				c[p*a.K+j], c[pk+p*a.K+j] = float32(id), vals[j]
			}
		}
	}
	return nil
}

func (a LensAttrs) runTopK(args []Arg, l Launch) error {
	rows := l.Grid[0]
	if err := CheckArgs("lens_topk", args, 4, 4*rows, 4*rows*a.CandWidth(), 4*rows*a.OutWidth); err != nil {
		return err
	}
	if !a.on(args[0]) {
		return nil
	}
	mask, cand, out := args[1].U32(), args[2].F32(), args[3].F32()
	pk, cw := a.Parts()*a.K, a.CandWidth()
	for r := range rows {
		if mask[r]>>a.Bit&1 == 0 {
			continue
		}
		c := cand[r*cw : (r+1)*cw]
		type pick struct {
			id int
			v  float32
		}
		ps := make([]pick, 0, pk)
		for i := range pk {
			if !isNaN(c[pk+i]) {
				ps = append(ps, pick{int(c[i]), c[pk+i]})
			}
		}
		sort.Slice(ps, func(i, j int) bool { return ps[i].v > ps[j].v || ps[i].v == ps[j].v && ps[i].id < ps[j].id })
		o := out[r*a.OutWidth+a.OutCol:]
		for j := range a.K {
			o[j], o[a.K+j] = float32(a.Vocab), float32(math.Inf(-1))
			if j < len(ps) {
				o[j], o[a.K+j] = float32(ps[j].id), ps[j].v
			}
			if a.Softcap > 0 {
				o[a.K+j] = Softcap(o[a.K+j], a.Softcap)
			}
		}
	}
	return nil
}

// TopK returns the k largest values of x and their indices, by value descending and index
// ascending on ties; NaN values are skipped, and missing entries are (len(x), -inf).
func TopK(x []float32, k int) ([]int, []float32) {
	idx := make([]int, 0, len(x))
	for i, v := range x {
		if !isNaN(v) {
			idx = append(idx, i)
		}
	}
	sort.SliceStable(idx, func(p, q int) bool { return x[idx[p]] > x[idx[q]] })
	ids, vals := make([]int, k), make([]float32, k)
	for j := range k {
		ids[j], vals[j] = len(x), float32(math.Inf(-1))
		if j < len(idx) {
			ids[j], vals[j] = idx[j], x[idx[j]]
		}
	}
	return ids, vals
}

func isNaN(v float32) bool { return math.IsNaN(float64(v)) }
