package bundle

import "math"

// ProductLimit is Scalar.Limit for a scalar that scales v: the largest magnitude whose
// product with every value of v stays finite in f32, MaxFloat32 over v's largest magnitude.
// With residual set, the product is added to the residual stream, whose next RMSNorm sums
// the squares of the row: the limit also keeps that sum finite, sqrt(MaxFloat32) over v's
// norm (beyond it the norm would silently zero the row). The compiler bounds a scalar with
// it, and the loader again when v is replaced.
func ProductLimit(v []float32, residual bool) float32 {
	var m, ss float64
	for _, x := range v {
		m = max(m, math.Abs(float64(x)))
		ss += float64(x) * float64(x)
	}
	l := math.MaxFloat32 / max(m, 1)
	if residual && ss > 0 {
		l = min(l, math.Sqrt(math.MaxFloat32/ss))
	}
	return roundDown(l)
}

// roundDown is the largest float32 at most x.
func roundDown(x float64) float32 {
	f := float32(x)
	if float64(f) > x {
		f = math.Nextafter32(f, 0)
	}
	return f
}

// MaxAbs is the largest magnitude of v.
func MaxAbs(v []float32) float64 {
	var m float64
	for _, x := range v {
		m = max(m, math.Abs(float64(x)))
	}
	return m
}
