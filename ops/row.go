package ops

import (
	"fmt"
	"math"

	"xmix/bundle"
	"xmix/mi"
)

// RowNormAttrs are the attributes of op "row_norm" (bundle.OpRowNorm): load a residual row
// (embedding lookup or residual + delta), apply MI ops, store it, RMSNorm it into out, and
// (without gather) bf16 of that into out_bf16 unless it is empty. See codegen.RowNorm for the
// parameter list.
type RowNormAttrs struct {
	Hidden   int     `json:"hidden"`
	Vocab    int     `json:"vocab,omitempty"`
	Eps      float32 `json:"eps"`
	WDtype   string  `json:"wdtype"` // f32 | bf16: storage of table and w
	Load     string  `json:"load"`   // embed | add
	Gather   bool    `json:"gather,omitempty"`
	DeltaOps []mi.Op `json:"delta_ops,omitempty"`
	ResidOps []mi.Op `json:"resid_ops,omitempty"`
	NormOps  []mi.Op `json:"norm_ops,omitempty"`
	// WOffset is added to every norm weight: the norms multiply by (WOffset + w), Gemma's
	// (1 + w) with 1.
	WOffset float32 `json:"w_offset,omitempty"`
	// DeltaNorm (load add): delta is RMS-normalised with weight delta_w (the argument after
	// delta) before the delta ops and the add (Gemma 2's post-attention and post-feedforward
	// norms).
	DeltaNorm bool `json:"delta_norm,omitempty"`
	// EmbedScale (load embed), when not 0, multiplies the embedded row before the residual
	// ops (Gemma's sqrt(hidden)).
	EmbedScale float32 `json:"embed_scale,omitempty"`
	// OutOptional (not gather): out may be 0 where out_bf16 is not, the bf16 copy alone
	// (bundle.BF16Copy.Droppable): the backend drops the f32 output that no node reads.
	OutOptional bool `json:"out_optional,omitempty"`
}

// checkRow checks the attributes every row kernel (row_norm, row_renorm) shares.
func checkRow(hidden int, wdtype string) error {
	if hidden <= 0 {
		return fmt.Errorf("hidden %d", hidden)
	}
	if wdtype != "f32" && wdtype != "bf16" {
		return fmt.Errorf("weight dtype %q is not f32 or bf16", wdtype)
	}
	return nil
}

func init() {
	Register(bundle.OpRowNorm, func(attrs []byte) (Runner, error) {
		var a RowNormAttrs
		if err := DecodeAttrs(attrs, &a); err != nil {
			return nil, err
		}
		if err := checkRow(a.Hidden, a.WDtype); err != nil {
			return nil, err
		}
		switch {
		case a.Load == "embed" && a.Vocab > 0 && len(a.DeltaOps) == 0 && !a.DeltaNorm:
		case a.Load == "add" && a.Vocab == 0 && a.EmbedScale == 0:
		default:
			return nil, fmt.Errorf("load %q with vocab %d, %d delta ops, delta norm %v, embed scale %g", a.Load, a.Vocab, len(a.DeltaOps), a.DeltaNorm, a.EmbedScale)
		}
		if a.OutOptional && a.Gather {
			return nil, fmt.Errorf("out_optional with gather: a gathering norm has no bf16 copy to write instead")
		}
		return named(bundle.OpRowNorm, a.run), nil
	})
	for op, act := range GatedActivations {
		Register(op, func(attrs []byte) (Runner, error) {
			var a SiluMulAttrs
			if err := DecodeAttrs(attrs, &a); err != nil {
				return nil, err
			}
			if a.Inter <= 0 {
				return nil, fmt.Errorf("inter %d", a.Inter)
			}
			return named(op, func(args []Arg, l Launch) error { return a.run(args, l, act) }), nil
		})
	}
}

// GatedActivations are the gated-MLP ops, act(gate) * up, by op name: SwiGLU's SiLU (Llama,
// Qwen, Mistral) and GeGLU's tanh-approximated GELU (Gemma 2's gelu_pytorch_tanh).
var GatedActivations = map[string]func(float32) float32{
	"silu_mul":      Silu,
	"gelu_tanh_mul": GeluTanh,
}

// weights views a weight argument as float32 values widened from its storage type.
type weights struct {
	f32  []float32
	bf16 []uint16
}

func (w weights) at(i int) float32 {
	if w.bf16 != nil {
		return BF16ToF32(w.bf16[i])
	}
	return w.f32[i]
}

// viewWeights views a weight argument stored as dtype ("bf16", else f32).
func viewWeights(dtype string, arg Arg) weights {
	if dtype == "bf16" {
		return weights{bf16: arg.U16()}
	}
	return weights{f32: arg.F32()}
}

func (a RowNormAttrs) weights(arg Arg) weights { return viewWeights(a.WDtype, arg) }

func (a RowNormAttrs) run(args []Arg, l Launch) error {
	rows, h := l.Grid[0], a.Hidden
	wsize, err := dtypeSize(a.WDtype)
	if err != nil {
		return err
	}
	c := &argCursor{args: args}
	var tokens []uint32
	var table weights
	var resid, delta Arg
	if a.Load == "embed" {
		t, err := c.take("tokens", 4*rows)
		if err != nil {
			return err
		}
		tokens = t.U32()
		tab, err := c.take("table", wsize*a.Vocab*h)
		if err != nil {
			return err
		}
		table = a.weights(tab)
		if resid, err = c.take("resid", 4*rows*h); err != nil {
			return err
		}
	} else {
		if resid, err = c.take("resid", 4*rows*h); err != nil {
			return err
		}
		if delta, err = c.take("delta", 4*rows*h); err != nil {
			return err
		}
	}
	var deltaW weights
	if a.DeltaNorm {
		dw, err := c.take("delta_w", wsize*h)
		if err != nil {
			return err
		}
		deltaW = a.weights(dw)
	}
	wArg, err := c.take("w", wsize*h)
	if err != nil {
		return err
	}
	w := a.weights(wArg)
	outArg, err := c.take("out", 0)
	if err != nil {
		return err
	}
	var outRow []uint32
	var outB []uint16
	if a.Gather {
		o, err := c.take("out_row", 4*rows)
		if err != nil {
			return err
		}
		outRow = o.U32()
	} else {
		ob, err := c.take(bundle.NormOutBF16, 0)
		if err != nil {
			return err
		}
		if outB, err = bf16CopyArg(bundle.NormOutBF16, c.next-1, ob, rows*h); err != nil {
			return err
		}
		if err := checkF32Out("out", outArg, rows*h, a.OutOptional, outB); err != nil {
			return err
		}
	}
	ctl, err := bindCtl(c, rows, a.DeltaOps, a.ResidOps, a.NormOps)
	if err != nil {
		return err
	}
	deltaOps, err := bindMI(c, rows, h, 0, a.DeltaOps)
	if err != nil {
		return err
	}
	residOps, err := bindMI(c, rows, h, len(a.DeltaOps), a.ResidOps)
	if err != nil {
		return err
	}
	normOps, err := bindMI(c, rows, h, len(a.DeltaOps)+len(a.ResidOps), a.NormOps)
	if err != nil {
		return err
	}
	if err := c.done(); err != nil {
		return err
	}
	out := outArg.F32()
	// Rows run in parallel: two naming one out row would race for it. (A gathering norm's
	// out_row holds at least rows words; past them is another step's.)
	wrote := map[uint32]int{}
	for r, o := range outRow[:min(rows, len(outRow))] {
		if o == bundle.NoRow {
			continue
		}
		if (int(o)+1)*h > len(out) {
			return fmt.Errorf("out_row[%d] = %d, but out holds %d rows", r, o, len(out)/h)
		}
		if first, ok := wrote[o]; ok {
			return fmt.Errorf("out_row[%d] and out_row[%d] are both %d: each out row takes one row's norm", first, r, o)
		}
		wrote[o] = r
	}
	rs, ds := resid.F32(), delta.F32()
	ParallelFor(rows, func(lo, hi int) {
		x, d := make([]float32, h), make([]float32, h)
		for r := lo; r < hi; r++ {
			if a.Load == "embed" {
				if tok := int(tokens[r]); tok < a.Vocab {
					for i := range x {
						x[i] = table.at(tok*h + i)
						if a.EmbedScale != 0 {
							x[i] *= a.EmbedScale
						}
					}
				} else {
					clear(x)
				}
			} else {
				copy(d, ds[r*h:(r+1)*h])
				if a.DeltaNorm {
					rmsNorm(d, deltaW, a.Eps, a.WOffset)
				}
				applyMI(deltaOps, r, ctl, d)
				for i := range x {
					x[i] = rs[r*h+i] + d[i]
				}
			}
			applyMI(residOps, r, ctl, x)
			copy(rs[r*h:], x)
			o := r
			if a.Gather {
				if outRow[r] == bundle.NoRow {
					continue
				}
				o = int(outRow[r])
			}
			rmsNorm(x, w, a.Eps, a.WOffset)
			applyMI(normOps, r, ctl, x)
			if out != nil {
				copy(out[o*h:], x)
			}
			if outB != nil {
				putBF16(outB[o*h:], x)
			}
		}
	})
	return nil
}

// rmsNorm replaces x by x * rsqrt(mean(x²) + eps) * (off + w), the order HF's LlamaRMSNorm
// uses (off 0) and Gemma2RMSNorm's (off 1, the sum in f32).
func rmsNorm(x []float32, w weights, eps, off float32) {
	var ss float64
	for _, v := range x {
		ss += float64(v) * float64(v)
	}
	mean := float32(ss) * (1 / float32(len(x)))
	r := float32(1 / math.Sqrt(float64(mean+eps)))
	for i, v := range x {
		x[i] = float32(v*r) * (w.at(i) + off)
	}
}

// SiluMulAttrs are the attributes of the gated-MLP ops (GatedActivations: "silu_mul",
// "gelu_tanh_mul"): act = f(gate) * up, where gate and up are the two halves of each gu row,
// then MI ops on act's row.
type SiluMulAttrs struct {
	Inter int     `json:"inter"`
	Ops   []mi.Op `json:"ops,omitempty"`
	// Chunked: the kernel spreads each row over blocks (grid y = rows) and takes no control
	// or MI parameters (it carries no MI ops).
	Chunked bool `json:"chunked,omitempty"`
}

func (a SiluMulAttrs) run(args []Arg, l Launch, f func(float32) float32) error {
	rows, n := l.Grid[0], a.Inter
	if a.Chunked {
		rows = l.Grid[1]
	}
	c := &argCursor{args: args}
	guBytes := 8 * rows * n
	if a.Chunked {
		guBytes = 0 // checked once gu_bf16 says which of the two it reads
	}
	gu, err := c.take("gu", guBytes)
	if err != nil {
		return err
	}
	g := gu.F32()
	var act Arg
	var yb []uint16
	if a.Chunked {
		// A chunked kernel carries no MI ops and takes no control parameters; bundle.GatedActBF16
		// gets bf16(act) unless it is empty, and act may be empty then; where
		// bundle.GatedGuBF16 is not empty the kernel reads gu from it, as bf16.
		if act, yb, err = a.chunkedOutputs(c, rows); err != nil {
			return err
		}
		if g, err = a.chunkedInput(c, gu, rows); err != nil {
			return err
		}
	} else if act, err = c.take("act", 4*rows*n); err != nil {
		return err
	}
	var ctl miCtl
	var bound []miBound
	if !a.Chunked {
		if ctl, err = bindCtl(c, rows, a.Ops); err != nil {
			return err
		}
		if bound, err = bindMI(c, rows, n, 0, a.Ops); err != nil {
			return err
		}
	}
	if err := c.done(); err != nil {
		return err
	}
	y := act.F32()
	if y == nil {
		y = make([]float32, rows*n) // bf16(act) alone
	}
	ParallelFor(rows, func(lo, hi int) {
		for r := lo; r < hi; r++ {
			x := y[r*n : (r+1)*n]
			gatedRow(x, g[2*r*n:2*(r+1)*n], f)
			if !a.Chunked {
				applyMI(bound, r, ctl, x)
			}
			if yb != nil {
				putBF16(yb[r*n:], x)
			}
		}
	})
	return nil
}

// chunkedOutputs takes a chunked kernel's act and act_bf16 (as bf16CopyArg reads it) for
// rows rows: either may be empty (a constant 0), not both.
func (a SiluMulAttrs) chunkedOutputs(c *argCursor, rows int) (act Arg, actB []uint16, err error) {
	if act, err = c.take("act", 0); err != nil {
		return
	}
	b, err := c.take(bundle.GatedActBF16, 0)
	if err != nil {
		return
	}
	n := rows * a.Inter
	if actB, err = bf16CopyArg(bundle.GatedActBF16, 2, b, n); err == nil {
		err = checkF32Out("argument 1 (act)", act, n, true, actB)
	}
	return
}

// chunkedInput is what a chunked kernel reads as gu for rows rows: gu, f32, or where its
// last argument (bundle.GatedGuBF16) is not empty, that, as bf16.
func (a SiluMulAttrs) chunkedInput(c *argCursor, gu Arg, rows int) ([]float32, error) {
	b, err := c.take(bundle.GatedGuBF16, 0)
	if err != nil {
		return nil, err
	}
	n := 2 * rows * a.Inter
	guB, err := bf16CopyArg(bundle.GatedGuBF16, 3, b, n)
	switch {
	case err != nil:
		return nil, err
	case guB == nil && len(gu.Mem) < 4*n:
		return nil, fmt.Errorf("argument 0 (gu) holds %d bytes, needs %d", len(gu.Mem), 4*n)
	case guB == nil:
		return gu.F32(), nil
	}
	g := make([]float32, n)
	for i, h := range guB {
		g[i] = BF16ToF32(h)
	}
	return g, nil
}

// gatedRow is x = f(gate) * up over one row gu = [gate | up] of 2*len(x) values.
func gatedRow(x, gu []float32, f func(float32) float32) {
	n := len(x)
	for i := range x {
		x[i] = f(gu[i]) * gu[n+i]
	}
}

// Silu is g / (1 + exp(-g)).
func Silu(g float32) float32 {
	return float32(float64(g) / (1 + math.Exp(-float64(g))))
}

// GeluTanh is GELU's tanh approximation, 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g³))):
// PyTorch's gelu(approximate="tanh"), transformers' gelu_pytorch_tanh.
func GeluTanh(g float32) float32 {
	x := float64(g)
	return float32(0.5 * x * (1 + math.Tanh(math.Sqrt(2/math.Pi)*(x+0.044715*x*x*x))))
}
