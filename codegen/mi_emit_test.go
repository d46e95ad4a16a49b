package codegen

import (
	"math"
	"math/rand/v2"
	"testing"
)

// TestMIPerRequestControl runs, emulated and on the reference, a kernel whose ops read a
// per-sequence scalar table (alpha and an activation threshold per sequence slot) and test
// after_token latch bits, and checks exactly which rows each op changed and by how much.
func TestMIPerRequestControl(t *testing.T) {
	const w, stride, seqs = 200, 2, 2
	rng := rand.New(rand.NewPCG(31, 32))
	// Row r runs sequence seq[r]; slot 2 is the padding sequence.
	seq := []uint32{0, 0, 1, 2, 1}
	latch := []uint32{0b10, 0b11, 0b10, 0b10, 0b01}
	gate := []float32{0.8, 0.8, 0.95, 0.8, 0.8}
	table := []float32{1.5, 0.5, -3, 0.9, 7, 7} // per slot: alpha, threshold
	steer := MIOp{Template: "steer_add", Bit: testBit, Width: w, Vec: "v", Scal: "s", Alpha: 0, Bias: -1,
		ScalStride: stride, ScalRows: seqs + 1,
		Gates: []Gate{{Kind: "activation", Buf: "g", Width: 1, Cmp: ">", Thresh: 2}}}
	latched := MIOp{Template: "scale", Bit: testBit, Width: w, Vec: "s2", Scal: "s", Alpha: 0, Bias: -1,
		ScalStride: stride, ScalRows: seqs + 1, Gates: []Gate{{Kind: "after_token", Latch: 1}}}
	c := MIKernelConfig{Width: w, Stride: w, Ops: []MIOp{steer, latched}}
	k, err := MIKernel("per_request", c)
	if err != nil {
		t.Fatal(err)
	}
	names := paramNames(k)
	wantNames := []string{"x", "ctl_mask", "ctl_seq", "ctl_latch", "mi0_vec", "mi0_scal", "mi0_g0", "mi1_scal"}
	if len(names) != len(wantNames) {
		t.Fatalf("params %v, want %v", names, wantNames)
	}
	for i := range names {
		if names[i] != wantNames[i] {
			t.Fatalf("params %v, want %v", names, wantNames)
		}
	}
	x := randF32(rng, testRows*w, 1)
	v := randF32(rng, w, 1)
	args := []targ{{name: "x", f32: x, out: len(x)}, {name: "ctl_mask", u32: testMask},
		{name: "ctl_seq", u32: seq}, {name: "ctl_latch", u32: latch},
		{name: "mi0_vec", f32: v}, {name: "mi0_scal", f32: table}, {name: "mi0_g0", f32: gate},
		{name: "mi1_scal", f32: table}}
	l := c.Launch(testRows)
	checkKernel(t, k, l, args)
	got := emulate(t, k, l, args)[0]
	var changed int
	for r := range testRows {
		on := testMask[r]>>testBit&1 == 1
		alpha, thresh := table[seq[r]*stride], table[seq[r]*stride+1]
		steered := on && gate[r] > thresh
		scaled := on && latch[r]&0b10 != 0
		if steered || scaled {
			changed++
		}
		for i := range w {
			want := x[r*w+i]
			if steered {
				want += float32(alpha * v[i]) // rounded apart, as the kernel promises
			}
			if scaled {
				want *= alpha
			}
			if math.Float32bits(got[r*w+i]) != math.Float32bits(want) {
				t.Fatalf("row %d [%d] (seq %d, steered %v, scaled %v): %v, want %v", r, i, seq[r], steered, scaled, got[r*w+i], want)
			}
		}
	}
	if changed != 2 {
		t.Fatalf("%d rows changed, want 2: the test covers less than it should", changed)
	}
}
