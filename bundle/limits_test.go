package bundle

import (
	"math"
	"testing"
)

// TestProductLimitIsTheLargestSafeScalar: the limit keeps the product (and, in the residual
// stream, the sum of its squares) within f32, and the next float32 up does not.
func TestProductLimitIsTheLargestSafeScalar(t *testing.T) {
	up := func(f float32) float64 { return float64(math.Nextafter32(f, math.MaxFloat32)) }
	v := []float32{1, -3, 1e30, 0.5}
	m := float64(float32(1e30))
	if l := ProductLimit(v, false); float64(l)*m > math.MaxFloat32 || up(l)*m <= math.MaxFloat32 {
		t.Errorf("product limit %v", l)
	}
	var ss float64
	for _, x := range v {
		ss += float64(x) * float64(x)
	}
	if l := ProductLimit(v, true); float64(l)*float64(l)*ss > math.MaxFloat32 || up(l)*up(l)*ss <= math.MaxFloat32 {
		t.Errorf("residual limit %v", l)
	}
	if l := ProductLimit([]float32{0.5, -1}, false); l != math.MaxFloat32 {
		t.Errorf("limit of a vector within [-1, 1]: %g", l)
	}
	if l := ProductLimit([]float32{0, 0}, true); l != math.MaxFloat32 {
		t.Errorf("limit of a zero vector: %g", l)
	}
}
