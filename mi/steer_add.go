package mi

import "xmix/ptx"

// steer_add: x += alpha * vector.
func init() {
	Register(Template{
		Name: "steer_add", Kind: Write, Vec: true, Writes: true, Alpha: Required, Elementwise: true,
		Args: map[string]Arg{
			"vector": {Kind: Vector, Required: true},
			"alpha":  {Kind: Scalar, Default: 1, Scales: "vector"},
		},
		Ref:  steerAdd,
		Emit: emitSteerAdd,
	})
}

func steerAdd(r Row) bool {
	axpy(r.X, r.Scal[r.Alpha], r.Vec)
	return true
}

func emitSteerAdd(e Emitter, o *Op, x []ptx.Reg) { e.Axpy(e.Scalar(o.Alpha), x, false) }
