package ops

import (
	"fmt"
	"math"
)

func init() { Register("attention", buildAttention) }

// AttnAttrs configures op "attention": for each row r and query head h, softmax(q·k*Scale)
// over positions 0..pos[r] of sequence seq[r] (read from the paged cache, kv head
// h/(Heads/KVHeads)), weighted sum of v, written to z[r, h*HeadDim:]. Parameters: qkv, pos,
// seq, block_table, kcache, vcache, z. Rows come from the launch grid (Grid[0]).
type AttnAttrs struct {
	KVAttrs
	Scale float32 `json:"scale"`
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
	return RunnerFunc(func(args []Arg, l Launch) error {
		rows := l.Grid[0]
		d := a.HeadDim
		// The split-K kernel (codegen.AttentionSplit) takes a workspace as an eighth argument;
		// the math is the same.
		if len(args) == 8 {
			args = args[:7]
		}
		if err := CheckArgs("attention", args, 4*rows*a.rowWidth(), 4*rows, 4*rows, 0, 0, 0, 4*rows*a.Heads*d); err != nil {
			return err
		}
		v, err := newKVView("attention", a.KVAttrs, size, rows, args[1], args[2], args[3], args[4], args[5])
		if err != nil {
			return err
		}
		qkv, z := args[0].F32(), args[6].F32()
		group := a.Heads / a.KVHeads
		ParallelFor(rows*a.Heads, func(lo, hi int) {
			var scores []float32
			kbuf, vbuf := make([]float32, d), make([]float32, d)
			for job := lo; job < hi; job++ {
				r, h := job/a.Heads, job%a.Heads
				q := qkv[r*a.rowWidth()+h*d : r*a.rowWidth()+(h+1)*d]
				out := z[(r*a.Heads+h)*d : (r*a.Heads+h+1)*d]
				n := int(v.pos[r]) + 1
				s := int(v.seq[r])
				kvOff := h / group * d
				scores = scores[:0]
				m := float32(math.Inf(-1))
				for t := 0; t < n; t++ {
					v.load(kbuf, v.kcache, v.slot(s, t)*a.KVHeads*d+kvOff)
					sc := dot(q, kbuf) * a.Scale
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
					v.load(vbuf, v.vcache, v.slot(s, t)*a.KVHeads*d+kvOff)
					for i, x := range vbuf {
						out[i] += e * x
					}
				}
				inv := 1 / sum
				for i := range out {
					out[i] *= inv
				}
			}
		})
		return nil
	}), nil
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
