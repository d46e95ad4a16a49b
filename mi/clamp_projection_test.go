package mi

import (
	"math"
	"testing"
)

// The reference clamp follows PTX max/min, where a NaN operand loses to the other; inside
// its bounds the row is left alone and the op does not fire; its bounds are checked.
func TestClampProjection(t *testing.T) {
	nan := float32(math.NaN())
	r := Row{Op: &Op{Alpha: 0, Bias: 1}, Scal: []float32{-1, 1}}
	if got := clamp(nan, r); got != -1 {
		t.Errorf("clamp(NaN, -1, 1) = %v, want -1 (max.f32 picks the number)", got)
	}
	r.Scal = []float32{nan, 1}
	if got := clamp(0.5, r); got != 0.5 {
		t.Errorf("clamp(0.5, NaN, 1) = %v, want 0.5", got)
	}
	ref, _ := Lookup("clamp_projection")
	in := Row{Op: &Op{Alpha: 0, Bias: 1}, X: []float32{0.3, 0.4}, Vec: []float32{1, 0}, Scal: []float32{-1, 1}}
	if ref.Ref(in) || in.X[0] != 0.3 {
		t.Errorf("a projection inside the bounds fired or moved: %v", in.X)
	}
	in.X[0] = 2
	if !ref.Ref(in) || in.X[0] != 1 || in.X[1] != 0.4 {
		t.Errorf("a projection of 2 clamped to %v, want [1 0.4] and fired", in.X)
	}
	for _, c := range []struct {
		args CheckArgs
		want string
	}{
		{CheckArgs{Alpha: -1, Bias: -1}, "clamp_projection needs min, max or both"},
		{CheckArgs{Alpha: 0, Bias: 1, Scalars: []float32{2, 1}}, "clamp_projection: min 2 is above max 1"},
		{CheckArgs{Alpha: 0, Bias: 1, Scalars: []float32{1, 2}}, ""},
	} {
		if msg, _ := ref.Check(c.args); msg != c.want {
			t.Errorf("check %+v: %q, want %q", c.args, msg, c.want)
		}
	}
}
