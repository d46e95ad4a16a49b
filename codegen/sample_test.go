package codegen

import (
	"math/rand/v2"
	"testing"
)

func TestSampleKernel(t *testing.T) {
	r := rand.New(rand.NewPCG(41, 42))
	for _, vocab := range []int{1, 100, 333, 2500} {
		c := SampleConfig{Vocab: vocab}
		k, err := Sample("sample_test", c)
		if err != nil {
			t.Fatal(err)
		}
		// Greedy, greedy with ties, keep-all, and nuclei of several widths and temperatures.
		temp := []float32{0, -1, 1, 0.7, 1, 1.5, 0.3, 1, 1}
		topP := []float32{1, 0.5, 1, 0.9, 0.5, 0.95, 0.8, 0, 0.999}
		n := len(temp)
		logits := randF32(r, n*vocab, 4)
		if vocab > 3 {
			logits[vocab+1], logits[vocab+2] = 10, 10 // a tie for sample 1
		}
		rng := make([]uint32, n)
		for i := range rng {
			rng[i] = r.Uint32()
		}
		rng[2], rng[7] = 0xFFFFFFFF, 0 // the ends of the draw
		checkKernel(t, k, c.Launch(n), []targ{
			{name: "logits", f32: logits}, {name: "temperature", f32: temp}, {name: "top_p", f32: topP},
			{name: "rng", u32: rng}, {name: "out", out: n, dtype: "u32"},
		})
	}
}
