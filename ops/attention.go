package ops

import (
	"fmt"
	"math"

	"xmix/bundle"
)

func init() { Register(bundle.OpAttention, buildAttention) }

// AttnAttrs configures op "attention": for each row r and query head h, softmax(q·k*Scale)
// over positions 0..pos[r] of sequence seq[r] (read from the paged cache, kv head
// h/(Heads/KVHeads)), weighted sum of v, written to z[r, h*HeadDim:]. Parameters: qkv, pos,
// seq, block_table, kcache, vcache, z, then the decode kernel's z_bf16 (bundle.AttnZBF16:
// bf16 of the rows of z it computes, unless it is empty) or AttnRowsRuns' row count; kernels
// may take more after them (a split workspace, a control word), which the reference
// ignores. Rows come from the launch grid (Grid[0], or Grid[0]/Splits), except for
// AttnRowsRuns.
type AttnAttrs struct {
	KVAttrs
	Scale float32 `json:"scale"`
	// Rows selects the rows computed (the others' z is left as it was): "" every row,
	// AttnRowsSingle the rows alone of their sequence in the call, AttnRowsRuns the others.
	// A prefill step runs one kernel of each, so that decode rows mixed into it take the
	// decode kernel and prompt chunks the tensor-core one (codegen/attention_prefill.go).
	Rows string `json:"rows,omitempty"`
	// Softcap, when not 0, caps every scaled score s at Softcap * tanh(s / Softcap) before
	// the softmax (Gemma 2's attn_logit_softcapping).
	Softcap float32 `json:"softcap,omitempty"`
	// Window, when not 0, limits row r to its last Window positions, pos[r]-Window+1 ..
	// pos[r] (a sliding window: transformers' kv_idx > q_idx - sliding_window).
	Window int `json:"window,omitempty"`
	// Splits, when not 0, is how many blocks along the grid's x each row takes (a decode
	// kernel whose splits of a row form one thread-block cluster): rows are Grid[0]/Splits.
	Splits int `json:"splits,omitempty"`
	// OutOptional (rows ""): z may be 0 where z_bf16 is not, the bf16 copy alone
	// (bundle.BF16Copy.Droppable).
	OutOptional bool `json:"out_optional,omitempty"`
	// Rope (rows "", one block a row): qkv holds q, k and v as the projection wrote them; the
	// op first does op rope_kv's work (without bias or QK-norm) on a copy of each row, cos and
	// sin its arguments 8 and 9, writing the row's k and v into the caches, and attends with
	// the rotated q. qkv is left as it was. Rows of sequence slot PadSeq (the padding rows)
	// write no k and v, so that no row of the call reads what another writes: a padding row,
	// at its own position of the one padding sequence, attends to what the cache held.
	Rope   bool `json:"rope,omitempty"`
	PadSeq int  `json:"pad_seq,omitempty"`
}

// Row selections of op "attention" (AttnAttrs.Rows).
const (
	AttnRowsSingle = "single"
	AttnRowsRuns   = "runs"
)

// AttnRowSingle reports whether row r of a call over len(seq) rows is the only row of its
// sequence slot among its neighbours: rows of one sequence in a step are consecutive, so a
// row whose neighbours hold other sequences is a decode row (or a one-token chunk).
func AttnRowSingle(seq []uint32, r int) bool {
	return (r == 0 || seq[r-1] != seq[r]) && (r+1 == len(seq) || seq[r+1] != seq[r])
}

func buildAttention(attrs []byte) (Runner, error) {
	var a AttnAttrs
	if err := DecodeAttrs(attrs, &a); err != nil {
		return nil, err
	}
	size, err := a.check()
	if err != nil {
		return nil, fmt.Errorf("attention: %w", err)
	}
	if a.Rows != "" && a.Rows != AttnRowsSingle && a.Rows != AttnRowsRuns {
		return nil, fmt.Errorf("attention: rows %q: want empty, %q or %q", a.Rows, AttnRowsSingle, AttnRowsRuns)
	}
	if a.Window < 0 || !(a.Softcap >= 0) || math.IsInf(float64(a.Softcap), 0) {
		return nil, fmt.Errorf("attention: window %d, softcap %g: want both at least 0 (0: none) and finite", a.Window, a.Softcap)
	}
	if a.Splits < 0 || a.Splits > 0 && a.Rows != "" {
		return nil, fmt.Errorf("attention: %d blocks a row over rows %q: want 0 (one block), or more only over every row (rows \"\")", a.Splits, a.Rows)
	}
	if a.OutOptional && a.Rows != "" {
		return nil, fmt.Errorf("attention: out_optional over rows %q: want it only over every row (rows \"\")", a.Rows)
	}
	if a.Rope && (a.Rows != "" || a.Splits > 0 || a.PadSeq < 0) {
		return nil, fmt.Errorf("attention: rope over rows %q in %d blocks a row, padding slot %d: want it only over every row, one block a row, a slot of at least 0", a.Rows, a.Splits, a.PadSeq)
	}
	return RunnerFunc(func(args []Arg, l Launch) error {
		if a.Rope {
			var err error
			if args, err = a.rotated(args, l, size); err != nil {
				return err
			}
		}
		rows := l.Grid[0]
		if a.Splits > 0 {
			if rows%a.Splits != 0 {
				return fmt.Errorf("attention: grid x %d is not whole rows of %d blocks", rows, a.Splits)
			}
			rows /= a.Splits
		}
		d := a.HeadDim
		var zb []uint16
		switch {
		case a.Rows == AttnRowsRuns:
			// The tensor-core kernel's grid counts blocks of rows; it takes the rows as an
			// eighth argument.
			if len(args) != 8 {
				return fmt.Errorf("attention: rows %q takes 8 arguments (the last the row count), got %d", a.Rows, len(args))
			}
			rows = int(args[7].Bits)
		case len(args) < 8:
			return fmt.Errorf("attention: %d arguments, want at least 8 (the eighth %s)", len(args), bundle.AttnZBF16)
		default:
			var err error
			if zb, err = bf16CopyArg(bundle.AttnZBF16, 7, args[7], rows*a.Heads*d); err != nil {
				return fmt.Errorf("attention: %w", err)
			}
		}
		// Kernels' trailing arguments (the split workspace and chunk word of the decode
		// kernel, the row count) do not change the math.
		if len(args) > 7 {
			args = args[:7]
		}
		if err := checkF32Out("argument 6 (z)", args[6], rows*a.Heads*d, a.OutOptional, zb); err != nil {
			return fmt.Errorf("attention: %w", err)
		}
		if err := CheckArgs("attention", args, 4*rows*a.rowWidth(), 4*rows, 4*rows, 0, 0, 0, -1); err != nil {
			return err
		}
		v, err := newKVView("attention", a.KVAttrs, size, rows, args[1], args[2], args[3], args[4], args[5])
		if err != nil {
			return err
		}
		qkv, z := args[0].F32(), args[6].F32()
		group := a.Heads / a.KVHeads
		seqs := v.seq[:rows]
		ParallelFor(rows*a.Heads, func(lo, hi int) {
			var scores []float32
			kbuf, vbuf, own := make([]float32, d), make([]float32, d), make([]float32, d)
			for job := lo; job < hi; job++ {
				r, h := job/a.Heads, job%a.Heads
				if a.Rows != "" && AttnRowSingle(seqs, r) != (a.Rows == AttnRowsSingle) {
					continue
				}
				q := qkv[r*a.rowWidth()+h*d : r*a.rowWidth()+(h+1)*d]
				out := own // where z is 0
				if z != nil {
					out = z[(r*a.Heads+h)*d : (r*a.Heads+h+1)*d]
				}
				n := int(v.pos[r]) + 1
				first := 0 // the first position the row attends to
				if a.Window > 0 && n > a.Window {
					first = n - a.Window
				}
				s := int(v.seq[r])
				kvOff := h / group * d
				scores = scores[:0]
				m := float32(math.Inf(-1))
				for t := first; t < n; t++ {
					v.load(kbuf, v.kcache, v.slot(s, t)*a.KVHeads*d+kvOff)
					sc := dot(q, kbuf) * a.Scale
					if a.Softcap > 0 {
						sc = Softcap(sc, a.Softcap)
					}
					scores = append(scores, sc)
					m = max(m, sc)
				}
				var sum float32
				for t, sc := range scores {
					e := float32(math.Exp(float64(sc - m)))
					scores[t] = e
					sum += e
				}
				clear(out)
				for t, e := range scores {
					v.load(vbuf, v.vcache, v.slot(s, first+t)*a.KVHeads*d+kvOff)
					for i, x := range vbuf {
						out[i] += e * x
					}
				}
				inv := 1 / sum
				for i := range out {
					out[i] *= inv
				}
				if zb != nil {
					putBF16(zb[(r*a.Heads+h)*d:], out)
				}
			}
		})
		return nil
	}), nil
}

// rotated does op rope_kv's work for an attention with Rope on a copy of qkv (writing the
// caches but for the padding rows') and returns args with the copy in qkv's place and without
// cos and sin.
func (a AttnAttrs) rotated(args []Arg, l Launch, size int) ([]Arg, error) {
	rows := l.Grid[0]
	if len(args) != 10 {
		return nil, fmt.Errorf("attention: rope: %d arguments, want 10 (cos and sin after %s)", len(args), bundle.AttnZBF16)
	}
	if n := 4 * rows * a.rowWidth(); len(args[0].Mem) < n {
		return nil, fmt.Errorf("attention: argument 0 (qkv) holds %d bytes, needs %d", len(args[0].Mem), n)
	}
	v, err := newKVView("attention", a.KVAttrs, size, rows, args[1], args[2], args[3], args[4], args[5])
	if err != nil {
		return nil, err
	}
	cos, sin := args[8].F32(), args[9].F32()
	if err := v.checkTables(cos, sin, rows); err != nil {
		return nil, fmt.Errorf("attention: rope: %w", err)
	}
	qkv := Arg{Mem: append([]byte(nil), args[0].Mem[:4*rows*a.rowWidth()]...)}
	RopeKVAttrs{KVAttrs: a.KVAttrs}.ropeRows(qkv.F32(), cos, sin, v, rows, weights{}, weights{}, weights{},
		func(r int) bool { return int(v.seq[r]) != a.PadSeq })
	return append([]Arg{qkv}, args[1:8]...), nil
}

// load widens len(dst) cache elements starting at element off.
func (v *kvView) load(dst []float32, c Arg, off int) {
	if v.size == 2 {
		for i, h := range c.U16()[off : off+len(dst)] {
			dst[i] = BF16ToF32(h)
		}
		return
	}
	copy(dst, c.F32()[off:off+len(dst)])
}
