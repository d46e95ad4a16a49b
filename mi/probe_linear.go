package mi

import (
	"math"

	"xmix/ptx"
)

// probe_linear: x·w + bias, through the activation (none or sigmoid), into one column.
func init() {
	Register(Template{
		Name: "probe_linear", Kind: Read, Vec: true, Out: 1, Bias: Optional, Activations: []string{"sigmoid"},
		Args: map[string]Arg{
			"w":          {Kind: Vector, Required: true},
			"bias":       {Kind: Scalar, Omit: true, Slot: SlotBias},
			"activation": {Kind: Word, Words: []string{"none", "sigmoid"}},
		},
		OutCols: func(int, int) int { return 1 },
		Ref: func(r Row) bool {
			s := dot64(r.X, r.Vec)
			if r.Bias >= 0 {
				s += float64(r.Scal[r.Bias])
			}
			if r.Activation == "sigmoid" {
				s = 1 / (1 + math.Exp(-s))
			}
			r.Out[0] = float32(s)
			return true
		},
		Emit: func(e Emitter, o *Op, x []ptx.Reg) {
			k := e.Kernel()
			s := e.Dot(x)
			if o.Bias >= 0 {
				k.Emit("add.rn.f32", s, s, e.Scalar(o.Bias))
			}
			if o.Activation == "sigmoid" {
				// 1 / (1 + 2^(-s*log2 e))
				t := k.Reg(ptx.F32)
				k.Emit("mul.rn.f32", t, s, ptx.F32Imm(-1.4426950408889634))
				k.Emit("ex2.approx.f32", t, t)
				k.Emit("add.rn.f32", t, t, ptx.F32Imm(1))
				k.Emit("rcp.rn.f32", s, t)
			}
			e.StoreFirst(s)
		},
	})
}
