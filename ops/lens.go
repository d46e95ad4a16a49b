package ops

import (
	"fmt"
	"math"
	"sort"
)

func init() {
	Register("lens_logits", func(attrs []byte) (Runner, error) {
		a, err := decodeLens(attrs)
		if err != nil {
			return nil, fmt.Errorf("lens_logits: %w", err)
		}
		return RunnerFunc(a.runLogits), nil
	})
	Register("lens_topk", func(attrs []byte) (Runner, error) {
		a, err := decodeLens(attrs)
		if err != nil {
			return nil, fmt.Errorf("lens_topk: %w", err)
		}
		return RunnerFunc(a.runTopK), nil
	})
}

// LensAttrs configure the logit lens's ops. "lens_logits" (parameters any_mask, ctl_mask,
// resid [rows, Hidden], w [Hidden], head [Vocab, Hidden], out [rows, Vocab], rows) writes,
// for each row whose mask has Bit, RMSNorm(resid row) * w times the LM head; "lens_topk"
// (any_mask, ctl_mask, logits [rows, Vocab], out [rows, OutWidth]) writes the row's K
// largest logits' ids (as f32) at OutCol and the logits at OutCol+K, by logit descending,
// ties by lower id, NaN never picked, id Vocab and -inf once nothing is left. Both do
// nothing at all when any_mask[0] lacks Bit. Rows come from the rows parameter and the
// grid's x respectively.
type LensAttrs struct {
	Hidden   int     `json:"hidden"`
	Vocab    int     `json:"vocab"`
	Eps      float32 `json:"eps"`
	WDtype   string  `json:"wdtype"`
	Bit      int     `json:"bit"`
	K        int     `json:"k"`
	OutWidth int     `json:"out_width"`
	OutCol   int     `json:"out_col"`
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
	}
	return a, nil
}

func (a LensAttrs) weights(arg Arg) weights {
	if a.WDtype == "bf16" {
		return weights{bf16: arg.U16()}
	}
	return weights{f32: arg.F32()}
}

func (a LensAttrs) runLogits(args []Arg, _ Launch) error {
	ws := 4
	if a.WDtype == "bf16" {
		ws = 2
	}
	if len(args) != 7 {
		return fmt.Errorf("lens_logits: %d arguments, want 7", len(args))
	}
	rows := args[6].Int()
	if err := CheckArgs("lens_logits", args[:6], 4, 4*rows, 4*rows*a.Hidden, ws*a.Hidden, ws*a.Vocab*a.Hidden, 4*rows*a.Vocab); err != nil {
		return err
	}
	if args[0].U32()[0]>>a.Bit&1 == 0 {
		return nil
	}
	mask, resid, w, head, out := args[1].U32(), args[2].F32(), a.weights(args[3]), a.weights(args[4]), args[5].F32()
	h := a.Hidden
	x := make([]float32, h)
	for r := range rows {
		if mask[r]>>a.Bit&1 == 0 {
			continue
		}
		copy(x, resid[r*h:(r+1)*h])
		rmsNorm(x, w, a.Eps)
		o := out[r*a.Vocab : (r+1)*a.Vocab]
		ParallelFor(a.Vocab, func(lo, hi int) {
			for v := lo; v < hi; v++ {
				var s float64
				for i, xi := range x {
					s += float64(xi) * float64(head.at(v*h+i))
				}
				o[v] = float32(s)
			}
		})
	}
	return nil
}

func (a LensAttrs) runTopK(args []Arg, l Launch) error {
	rows := l.Grid[0]
	if err := CheckArgs("lens_topk", args, 4, 4*rows, 4*rows*a.Vocab, 4*rows*a.OutWidth); err != nil {
		return err
	}
	if args[0].U32()[0]>>a.Bit&1 == 0 {
		return nil
	}
	mask, logits, out := args[1].U32(), args[2].F32(), args[3].F32()
	for r := range rows {
		if mask[r]>>a.Bit&1 != 0 {
			ids, vals := TopK(logits[r*a.Vocab:(r+1)*a.Vocab], a.K)
			o := out[r*a.OutWidth+a.OutCol:]
			for j := range a.K {
				o[j], o[a.K+j] = float32(ids[j]), vals[j]
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
