package mi

import (
	"math"

	"xmix/ptx"
)

// router_mask: logits[e] = -inf where mask[e] != 0, so the router never picks expert e.
func init() {
	Register(Template{
		Name: "router_mask", Kind: Write, Vec: true, Writes: true, Hooks: []string{"router_logits"},
		Args: map[string]Arg{"mask": {Kind: Vector, Required: true}},
		Ref: func(r Row) bool {
			for k := range r.X {
				if r.Vec[k] != 0 {
					r.X[k] = float32(math.Inf(-1))
				}
			}
			return true
		},
		Emit: func(e Emitter, _ *Op, x []ptx.Reg) {
			k := e.Kernel()
			vec := e.Vec() // the tail's mask loads as zero
			for j := range x {
				m, _ := vec(j)
				on := k.Reg(ptx.Pred)
				k.Emit("setp.neu.f32", on, m, ptx.F32Imm(0))
				k.EmitIf(on, false, "mov.b32", x[j], ptx.Imm(-8388608)) // 0xFF800000, -inf
			}
		},
	})
}
