package loader

import (
	"math"
	"math/rand/v2"
	"testing"
)

// TestDecodeF32sEitherHost: the copy a little-endian host makes and the decode any other host
// makes give the same floats, bit for bit (NaN payloads, infinities, negative zero included).
func TestDecodeF32sEitherHost(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	want := []float32{float32(math.NaN()), float32(math.Inf(-1)), float32(math.Copysign(0, -1)), math.Float32frombits(0x7fc00123)}
	for range 1000 {
		want = append(want, math.Float32frombits(r.Uint32()))
	}
	src := appendF32s(nil, want)
	defer func(saved bool) { hostLittleEndian = saved }(hostLittleEndian)
	for _, le := range []bool{true, false} {
		hostLittleEndian = le
		got := make([]float32, len(want))
		decodeF32s(got, src)
		for i := range want {
			if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
				t.Fatalf("little-endian path %v: value %d is %#x, want %#x", le, i, math.Float32bits(got[i]), math.Float32bits(want[i]))
			}
		}
	}
}
