package mi

import (
	"fmt"
	"math"

	"xmix/ptx"
)

// clamp_projection: x += (clamp(x·d, min, max) - x·d) d for the unit direction d; a missing
// bound is open. Inside its bounds the row is left alone, and the op does not count as fired.
// At the residual of an add+norm kernel it hands the norm its sum of squares (FoldsNorm), as
// project_out does.
func init() {
	Register(Template{
		Name: "clamp_projection", Kind: Write, Vec: true, Writes: true, Alpha: Optional, Bias: Optional, FoldsNorm: true,
		Args: map[string]Arg{
			"direction": {Kind: Vector, Required: true, Unit: true},
			"min":       {Kind: Scalar, Omit: true},
			"max":       {Kind: Scalar, Omit: true, Slot: SlotBias},
		},
		Check: checkClampBounds,
		Ref: func(r Row) bool {
			p := float32(dot64(r.X, r.Vec))
			c := clamp(p, r)
			axpy(r.X, c-p, r.Vec)
			return c != p
		},
		Emit: emitClampProjection,
	})
}

func emitClampProjection(e Emitter, o *Op, x []ptx.Reg) {
	k := e.Kernel()
	tot, have, fold := e.NormTotal()
	var p, ss ptx.Reg
	if fold {
		p, ss = e.DotSquares(x)
	} else {
		p = e.Dot(x)
	}
	c := k.Reg(ptx.F32)
	k.Emit("mov.f32", c, p)
	if o.Alpha >= 0 {
		k.Emit("max.f32", c, c, e.Scalar(o.Alpha))
	}
	if o.Bias >= 0 {
		k.Emit("min.f32", c, c, e.Scalar(o.Bias))
	}
	moved := k.Reg(ptx.Pred)
	k.Emit("setp.neu.f32", moved, c, p)
	e.Changed(moved)
	if fold {
		// The residual op right before the add+norm kernel's norm (side-effect-free steering
		// at every layer it steers): one reduction yields x·d and ‖x‖². A row left alone keeps
		// its sum of squares, the bits the norm's own reduction gives (blockReduce2); a moved
		// row's is ‖x‖² − p² + c² for the unit d. Where that is under a quarter of ‖x‖² (most
		// of the row went with the projection, so the difference lost precision), have is
		// false and the norm sums the squares itself.
		t := k.Reg(ptx.F32)
		k.Emit("mul.rn.f32", t, p, p)
		k.Emit("sub.rn.f32", tot, ss, t)
		k.Emit("fma.rn.f32", tot, c, c, tot)
		k.Emit("mul.rn.f32", t, ss, ptx.F32Imm(0.25))
		k.Emit("setp.ge.f32", have, tot, t)
		kept := k.Reg(ptx.Pred)
		k.Emit("not.pred", kept, moved)
		e.Maybe(&kept, "mov.f32", tot, ss)
		k.Emit("or.pred", have, have, kept)
	}
	moveProjection(e, c, p, x)
}

// clamp is p within the row's bounds, as PTX max and min have it: a NaN operand loses to the
// other.
func clamp(p float32, r Row) float32 {
	c := p
	if r.Alpha >= 0 {
		if lo := r.Scal[r.Alpha]; c < lo || isNaN(c) {
			c = lo
		}
	}
	if r.Bias >= 0 {
		if hi := r.Scal[r.Bias]; c > hi || isNaN(c) {
			c = hi
		}
	}
	return c
}

func isNaN(v float32) bool { return math.IsNaN(float64(v)) }

func checkClampBounds(c CheckArgs) (string, string) {
	switch {
	case c.Alpha < 0 && c.Bias < 0:
		return "clamp_projection needs min, max or both", "add args: {min: ..., max: ...}"
	case c.Alpha >= 0 && c.Bias >= 0 && c.Scalars[c.Alpha] > c.Scalars[c.Bias]:
		return fmt.Sprintf("clamp_projection: min %v is above max %v", c.Scalars[c.Alpha], c.Scalars[c.Bias]), "swap min and max"
	}
	return "", ""
}
