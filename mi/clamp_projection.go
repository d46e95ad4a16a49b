package mi

import (
	"fmt"
	"math"

	"xmix/ptx"
)

// clamp_projection: x += (clamp(x·d, min, max) - x·d) d for the unit direction d; a missing
// bound is open. Inside its bounds the row is left alone, and the op does not count as fired.
func init() {
	Register(Template{
		Name: "clamp_projection", Kind: Write, Vec: true, Writes: true, Alpha: Optional, Bias: Optional,
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
		Emit: func(e Emitter, o *Op, x []ptx.Reg) {
			k := e.Kernel()
			p := e.Dot(x)
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
			moveProjection(e, c, p, x)
		},
	})
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
