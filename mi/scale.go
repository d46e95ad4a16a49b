package mi

import "xmix/ptx"

// scale: x *= alpha, or x[i] *= vector[i] when the op has a vector instead of alpha.
func init() {
	Register(Template{
		Name: "scale", Kind: Write, Vec: true, Writes: true, Alpha: Optional, VecOrAlpha: true, Elementwise: true,
		Args: map[string]Arg{
			"alpha":  {Kind: Scalar, Unless: "vector"},
			"vector": {Kind: Vector},
		},
		Ref: func(r Row) bool {
			if r.Alpha >= 0 {
				alpha := r.Scal[r.Alpha]
				for k := range r.X {
					r.X[k] *= alpha
				}
				return true
			}
			for k := range r.X {
				r.X[k] *= r.Vec[k]
			}
			return true
		},
		// The tail element is left alone, so that it stays zero whatever the factor.
		Emit: func(e Emitter, o *Op, x []ptx.Reg) {
			if o.Alpha >= 0 {
				alpha := e.Scalar(o.Alpha)
				for j := range x {
					e.Maybe(e.Pred(j), "mul.rn.f32", x[j], x[j], alpha)
				}
				return
			}
			vec := e.Vec()
			for j := range x {
				v, p := vec(j)
				e.Maybe(p, "mul.rn.f32", x[j], x[j], v)
			}
		},
	})
}
