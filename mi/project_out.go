package mi

import "xmix/ptx"

// project_out: x -= (x·d) d for the unit direction d (directional ablation).
func init() {
	Register(Template{
		Name: "project_out", Kind: Write, Vec: true, Writes: true, FoldsNorm: true,
		Args: map[string]Arg{"direction": {Kind: Vector, Required: true, Unit: true}},
		Ref: func(r Row) bool {
			d := float32(dot64(r.X, r.Vec))
			for k := range r.X {
				r.X[k] -= float32(d * r.Vec[k])
			}
			return true
		},
		Emit: emitProjectOut,
	})
}

func emitProjectOut(e Emitter, o *Op, x []ptx.Reg) {
	tot, have, fold := e.NormTotal()
	if !fold {
		e.Axpy(e.Dot(x), x, true)
		return
	}
	// The residual op right before the add+norm kernel's norm (refusal ablation at every
	// layer): one reduction yields both x·d and ‖x‖², and ‖x − (x·d)d‖² = ‖x‖² − (x·d)² for
	// the unit d, so the norm needs no reduction of its own. When the projection removes most
	// of the row that difference loses precision: have is then false, and the norm sums the
	// squares itself, as it does on rows without the op.
	k := e.Kernel()
	p, ss := e.DotSquares(x)
	e.Axpy(p, x, true)
	t := k.Reg(ptx.F32)
	k.Emit("mul.rn.f32", t, p, p)
	k.Emit("sub.rn.f32", tot, ss, t)
	k.Emit("mul.rn.f32", t, ss, ptx.F32Imm(0.25))
	k.Emit("setp.ge.f32", have, tot, t)
}
