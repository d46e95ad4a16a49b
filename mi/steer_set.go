package mi

import "xmix/ptx"

// steer_set: x += (value - x·d) d for the unit direction d: the projection becomes value.
func init() {
	Register(Template{
		Name: "steer_set", Kind: Write, Vec: true, Writes: true, Alpha: Required,
		Args: map[string]Arg{
			"direction": {Kind: Vector, Required: true, Unit: true},
			"value":     {Kind: Scalar},
		},
		Ref: func(r Row) bool {
			p := float32(dot64(r.X, r.Vec))
			axpy(r.X, r.Scal[r.Alpha]-p, r.Vec)
			return true
		},
		Emit: func(e Emitter, o *Op, x []ptx.Reg) {
			p := e.Dot(x)
			c := e.Scalar(o.Alpha)
			moveProjection(e, c, p, x)
		},
	})
}

// moveProjection moves the row along the unit direction from projection p to c.
func moveProjection(e Emitter, c, p ptx.Reg, x []ptx.Reg) {
	e.Kernel().Emit("sub.rn.f32", c, c, p)
	e.Axpy(c, x, false)
}
