package codegen

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"xmix/bundle"
	"xmix/ptx"
)

// testVSlot are the vector slots of the rows of router tests with a per-request vector.
var testVSlot = []uint32{1, 0, bundle.NoRow, 0, 0}

// routerArgs lays out the router kernel's arguments for k: x, w, idx, wts, the control
// block, then each op's parameters (vec, scal, out) from the given data.
func routerArgs(t *testing.T, k *Kernel, x, w []float32, wdt ptx.Type, rows, topK int, data map[string][]float32) []targ {
	t.Helper()
	var args []targ
	for _, p := range k.Params {
		a := targ{name: p.Name}
		switch p.Name {
		case "x":
			a.f32 = x
		case "w":
			if wdt == ptx.BF16 {
				a.bf16 = w
			} else {
				a.f32 = w
			}
		case "idx":
			a.out, a.dtype = rows*topK, "u32"
		case "wts":
			a.out = rows * topK
		case "ctl_mask":
			a.u32 = testMask
		case "ctl_vslot":
			a.u32 = testVSlot
		case "mi0_fired":
			a = firedArg(p.Name, rows, 4)
		default:
			d, ok := data[p.Name]
			if !ok {
				t.Fatalf("no test data for parameter %s", p.Name)
			}
			a.f32 = d
			if p.Name == "mi0_out" || p.Name == "mi1_out" || p.Name == "mi2_out" {
				a.out = len(d)
			}
		}
		args = append(args, a)
	}
	return args
}

func TestRouterKernel(t *testing.T) {
	for _, c := range []struct {
		hidden, experts, topK int
		wdt                   ptx.Type
	}{{96, 8, 2, ptx.BF16}, {64, 4, 2, ptx.F32}, {40, 64, 4, ptx.F32}, {33, 3, 1, ptx.BF16}} {
		t.Run(fmt.Sprintf("h%d_e%d_k%d_%s", c.hidden, c.experts, c.topK, c.wdt), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(c.experts), 5))
			E := c.experts
			x := randF32(rng, testRows*c.hidden, 1)
			w := randF32(rng, E*c.hidden, 0.5)
			bias := make([]float32, E)
			bias[E-1] = 100 // far above any logit: the last expert always wins where applied
			mask := make([]float32, E)
			for e := 0; e < E-c.topK; e++ {
				mask[e] = 1 // leave exactly top-k experts unmasked
			}
			capture := MIOp{Template: "capture", Bit: testBit, Width: E, Alpha: -1, Bias: -1, Out: "cap", OutWidth: E}
			biasOp := MIOp{Template: "router_bias", Bit: testBit, Width: E, Vec: "b", Scal: "s", Alpha: 0, Bias: -1}
			maskOp := MIOp{Template: "router_mask", Bit: testBit, Width: E, Vec: "m", Alpha: -1, Bias: -1}
			var bareIdx []uint32
			var bareWts []float32
			for _, set := range []struct {
				name string
				ops  []MIOp
				data map[string][]float32
			}{
				{"bare", nil, nil},
				{"bias", []MIOp{biasOp}, map[string][]float32{"mi0_vec": bias, "mi0_scal": {1}}},
				{"mask", []MIOp{maskOp}, map[string][]float32{"mi0_vec": mask}},
				// The capture sees the logits after the bias, before the mask.
				{"chain", []MIOp{biasOp, capture, maskOp}, map[string][]float32{"mi0_vec": bias, "mi0_scal": {1},
					"mi1_out": randF32(rng, testRows*E, 1), "mi2_vec": mask}},
			} {
				rc := RouterConfig{Hidden: c.hidden, Experts: E, TopK: c.topK, WDtype: c.wdt, Ops: set.ops}
				k, err := Router("router_"+set.name, rc)
				if err != nil {
					t.Fatal(err)
				}
				args := routerArgs(t, k, x, w, c.wdt, testRows, c.topK, set.data)
				l := rc.Launch(testRows)
				checkKernel(t, k, l, args)
				outs := emulate(t, k, l, args)
				got, wts := make([]uint32, testRows*c.topK), outs[3]
				for i := range got {
					got[i] = math.Float32bits(outs[2][i]) // idx is parameter 2
				}
				for r := range testRows {
					on := testMask[r]>>testBit&1 == 1
					var sum float32
					picked := map[uint32]bool{}
					for s := range c.topK {
						e := got[r*c.topK+s]
						if e >= uint32(E) || picked[e] {
							t.Fatalf("%s: row %d: expert %d picked (twice or out of range): %v", set.name, r, e, got)
						}
						picked[e] = true
						sum += wts[r*c.topK+s]
					}
					if sum < 0.999 || sum > 1.001 {
						t.Fatalf("%s: row %d: weights sum to %v", set.name, r, sum)
					}
					if set.name == "bare" {
						continue
					}
					if !on {
						// Rows without the app route exactly as the bare kernel does.
						for s := range c.topK {
							q := r*c.topK + s
							if got[q] != bareIdx[q] || math.Float32bits(wts[q]) != math.Float32bits(bareWts[q]) {
								t.Fatalf("%s: row %d without the app: slot %d = (%d, %v), bare (%d, %v)", set.name, r, s, got[q], wts[q], bareIdx[q], bareWts[q])
							}
						}
						continue
					}
					if set.name != "mask" && !picked[uint32(E-1)] {
						t.Fatalf("%s: row %d: biased expert %d not picked: %v", set.name, r, E-1, got[r*c.topK:(r+1)*c.topK])
					}
					if set.name != "bias" {
						for e := range picked {
							if mask[e] != 0 {
								t.Fatalf("%s: row %d picked masked expert %d", set.name, r, e)
							}
						}
					}
				}
				if set.name == "bare" {
					bareIdx, bareWts = got, wts
				}
			}
		})
	}
}

// TestExpertKernels runs the expert kernels on routings that exercise the grouping by
// expert: rows that share experts, rows that share none, more pairs on one expert than a
// group holds, and batches past the shared windows (moeDownPairs, moeGateUpWindow).
func TestExpertKernels(t *testing.T) {
	type routing func(rng *rand.Rand, rows int, c MoEConfig) []uint32
	random := func(rng *rand.Rand, rows int, c MoEConfig) []uint32 {
		idx := make([]uint32, rows*c.TopK)
		for i := range idx {
			idx[i] = uint32(rng.IntN(c.Experts))
		}
		idx[1] = 1000 // clamped to the last expert by kernel and reference alike
		return idx
	}
	// Every row picks the same experts, slot s expert s: each expert serves every row.
	same := func(_ *rand.Rand, rows int, c MoEConfig) []uint32 {
		idx := make([]uint32, rows*c.TopK)
		for i := range idx {
			idx[i] = uint32(i % c.TopK)
		}
		return idx
	}
	// Each pair its own expert (rows*TopK <= Experts).
	distinct := func(rng *rand.Rand, rows int, c MoEConfig) []uint32 {
		idx := make([]uint32, rows*c.TopK)
		for i, e := range rng.Perm(c.Experts)[:len(idx)] {
			idx[i] = uint32(e)
		}
		return idx
	}
	for _, tc := range []struct {
		c     MoEConfig
		rows  int
		route string
	}{
		{MoEConfig{Hidden: 64, Inter: 40, Experts: 4, TopK: 2, WDtype: ptx.BF16}, testRows, "random"},
		{MoEConfig{Hidden: 50, Inter: 24, Experts: 8, TopK: 2, WDtype: ptx.F32}, testRows, "random"},
		{MoEConfig{Hidden: 32, Inter: 17, Experts: 3, TopK: 3, WDtype: ptx.BF16}, testRows, "random"},
		{MoEConfig{Hidden: 32, Inter: 24, Experts: 8, TopK: 2, WDtype: ptx.BF16}, 4, "distinct"},
		{MoEConfig{Hidden: 32, Inter: 24, Experts: 8, TopK: 2, WDtype: ptx.BF16}, 8, "same"},
		// 37 rows on one expert: four full groups and a padded tail of 5.
		{MoEConfig{Hidden: 24, Inter: 12, Experts: 4, TopK: 2, WDtype: ptx.F32}, 37, "same"},
		{MoEConfig{Hidden: 24, Inter: 12, Experts: 4, TopK: 2, WDtype: ptx.BF16}, 37, "random"},
		// 41 chunks of down's reduction: lanes 0..8 take two.
		{MoEConfig{Hidden: 24, Inter: 328, Experts: 4, TopK: 2, WDtype: ptx.BF16}, 9, "random"},
		// 1042 pairs: three down windows and two gate/up windows.
		{MoEConfig{Hidden: 16, Inter: 8, Experts: 3, TopK: 2, WDtype: ptx.BF16}, 521, "random"},
	} {
		c := tc.c
		t.Run(fmt.Sprintf("h%d_i%d_e%d_k%d_%s_r%d_%s", c.Hidden, c.Inter, c.Experts, c.TopK, c.WDtype, tc.rows, tc.route), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(c.Hidden), uint64(tc.rows)))
			rows := tc.rows
			idx := map[string]routing{"random": random, "same": same, "distinct": distinct}[tc.route](rng, rows, c)
			wdata := func(n int) targ {
				if c.WDtype == ptx.BF16 {
					return targ{name: "w", bf16: randF32(rng, n, 0.3)}
				}
				return targ{name: "w", f32: randF32(rng, n, 0.3)}
			}
			gu, err := ExpertGateUp("moe_gate_up_test", c)
			if err != nil {
				t.Fatal(err)
			}
			checkKernel(t, gu, c.LaunchGateUp(rows), []targ{
				{name: "x", f32: randF32(rng, rows*c.Hidden, 1)}, wdata(c.Experts * 2 * c.Inter * c.Hidden),
				{name: "idx", u32: idx}, {name: "act", out: rows * c.TopK * c.Inter},
			})
			down, err := ExpertDown("moe_down_test", c)
			if err != nil {
				t.Fatal(err)
			}
			checkKernel(t, down, c.LaunchDown(rows), []targ{
				{name: "act", f32: randF32(rng, rows*c.TopK*c.Inter, 1)}, wdata(c.Experts * c.Hidden * c.Inter),
				{name: "idx", u32: idx}, {name: "wts", f32: randF32(rng, rows*c.TopK, 1)}, {name: "y", out: rows * c.Hidden},
			})
		})
	}
}

// TestMoECombineKernel: the dense expert path's combine matches ops.MoECombine, bit for bit in
// the sense of the harness (rows pick experts in either order, an out-of-range id clamps to
// the last expert as the router's consumers do), for widths with and without a tail.
func TestMoECombineKernel(t *testing.T) {
	for _, c := range []MoECombineConfig{{Hidden: 96, Experts: 8, TopK: 2, Stride: 7}, {Hidden: 4096, Experts: 8, TopK: 2, Stride: testRows}, {Hidden: 33, Experts: 3, TopK: 3, Stride: 5}} {
		k, err := MoECombine(fmt.Sprintf("moe_combine_h%d", c.Hidden), c)
		if err != nil {
			t.Fatal(err)
		}
		rng := rand.New(rand.NewPCG(uint64(c.Hidden), 9))
		idx := make([]uint32, testRows*c.TopK)
		for i := range idx {
			idx[i] = uint32(rng.IntN(c.Experts))
		}
		idx[1] = uint32(c.Experts + 5) // clamps to the last expert
		checkKernel(t, k, c.Launch(testRows), []targ{
			{name: "out", f32: randF32(rng, c.Experts*c.Stride*c.Hidden, 1)},
			{name: "idx", u32: idx},
			{name: "wts", f32: randF32(rng, testRows*c.TopK, 1)},
			{name: "y", out: testRows * c.Hidden, tol: 1e-7},
		})
	}
	if _, err := MoECombine("bad", MoECombineConfig{Hidden: 64, Experts: 2, TopK: 3, Stride: 1}); err == nil {
		t.Fatal("top-k 3 of 2 experts: no error")
	}
}
