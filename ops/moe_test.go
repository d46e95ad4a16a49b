package ops

import (
	"math"
	"math/rand/v2"
	"testing"

	"xmix/mi"
)

func TestRoute(t *testing.T) {
	inf := float32(math.Inf(-1))
	for _, c := range []struct {
		name   string
		logits []float32
		k      int
		idx    []uint32
	}{
		{"plain", []float32{0.1, 2, -1, 1.5}, 2, []uint32{1, 3}},
		{"ties go to the lower index", []float32{1, 3, 3, 3}, 2, []uint32{1, 2}},
		{"masked experts are passed over", []float32{5, inf, 1, inf}, 2, []uint32{0, 2}},
		{"fewer unmasked experts than k", []float32{inf, 2, inf, inf}, 2, []uint32{1, 0}},
		{"top-1", []float32{-3, -2, -1}, 1, []uint32{2}},
	} {
		t.Run(c.name, func(t *testing.T) {
			idx, wts := make([]uint32, c.k), make([]float32, c.k)
			Route(c.logits, c.k, idx, wts)
			// softmax over all experts, then the picked probabilities renormalised.
			var den float64
			for _, l := range c.logits {
				den += math.Exp(float64(l))
			}
			var picked float64
			for i := range idx {
				if idx[i] != c.idx[i] {
					t.Fatalf("idx %v, want %v", idx, c.idx)
				}
				picked += math.Exp(float64(c.logits[idx[i]])) / den
			}
			for i := range idx {
				want := math.Exp(float64(c.logits[idx[i]])) / den / picked
				if math.Abs(float64(wts[i])-want) > 1e-6 {
					t.Fatalf("weights %v: slot %d want %v", wts, i, want)
				}
			}
		})
	}
}

// TestMoEOpsMatchFloat64 chains the three MoE ops on random data and compares with a
// straightforward float64 Mixtral sparse MoE block (Hugging Face order of operations).
func TestMoEOpsMatchFloat64(t *testing.T) {
	const rows, H, I, E, K = 3, 24, 10, 5, 2
	rng := rand.New(rand.NewPCG(1, 2))
	rnd := func(n int, s float64) []float32 {
		v := make([]float32, n)
		for i := range v {
			v[i] = float32((rng.Float64()*2 - 1) * s)
		}
		return v
	}
	x, wg, wgu, wd := rnd(rows*H, 1), rnd(E*H, 1), rnd(E*2*I*H, 0.3), rnd(E*H*I, 0.3)
	mask := []uint32{1, 0, 1}
	bias := []float32{0, 0, 0, 0, 50}
	f32 := func(v []float32) Arg { return Arg{Mem: bytesOf(v)} }
	idx, wts := Arg{Mem: make([]byte, 4*rows*K)}, Arg{Mem: make([]byte, 4*rows*K)}
	act, y := Arg{Mem: make([]byte, 4*rows*K*I)}, Arg{Mem: make([]byte, 4*rows*H)}
	run := func(op string, attrs any, l Launch, args ...Arg) {
		t.Helper()
		r, err := Build(op, EncodeAttrs(attrs))
		if err != nil {
			t.Fatal(err)
		}
		if err := r.Run(args, l); err != nil {
			t.Fatal(err)
		}
	}
	ra := MoERouterAttrs{Hidden: H, Experts: E, TopK: K, WDtype: "f32",
		Ops: []mi.Op{{Template: "router_bias", Width: E, Alpha: 0, Bias: -1}}}
	run("moe_router", ra, Launch{Grid: [3]int{rows, 1, 1}}, f32(x), f32(wg), idx, wts,
		Arg{Mem: bytesOfU32(mask)}, f32(bias), f32([]float32{1}))
	ma := MoEAttrs{Hidden: H, Inter: I, Experts: E, TopK: K, WDtype: "f32"}
	run("moe_gate_up", ma, Launch{Grid: [3]int{1, rows * K, 1}}, f32(x), f32(wgu), idx, act)
	run("moe_down", ma, Launch{Grid: [3]int{1, rows, 1}}, act, f32(wd), idx, wts, y)

	got := y.F32()
	for r := range rows {
		xr := x[r*H : (r+1)*H]
		logits := make([]float64, E)
		for e := range E {
			for i := range H {
				logits[e] += float64(xr[i]) * float64(wg[e*H+i])
			}
			if mask[r] != 0 {
				logits[e] += float64(bias[e])
			}
		}
		// top-2 by logit (softmax is monotonic), weights renormalised.
		a, b := 0, -1
		for e := 1; e < E; e++ {
			if logits[e] > logits[a] {
				a = e
			}
		}
		for e := range E {
			if e != a && (b < 0 || logits[e] > logits[b]) {
				b = e
			}
		}
		if mask[r] != 0 && a != E-1 {
			t.Fatalf("row %d: biased expert not on top", r)
		}
		if uint32(a) != idx.U32()[r*K] || uint32(b) != idx.U32()[r*K+1] {
			t.Fatalf("row %d: experts %v, want [%d %d]", r, idx.U32()[r*K:(r+1)*K], a, b)
		}
		wa := 1 / (1 + math.Exp(logits[b]-logits[a]))
		for h := range H {
			var want float64
			for s, e := range []int{a, b} {
				w := wa
				if s == 1 {
					w = 1 - wa
				}
				var d float64
				for c := range I {
					var g, u float64
					for i := range H {
						g += float64(xr[i]) * float64(wgu[(e*2*I+c)*H+i])
						u += float64(xr[i]) * float64(wgu[(e*2*I+I+c)*H+i])
					}
					d += g / (1 + math.Exp(-g)) * u * float64(wd[(e*H+h)*I+c])
				}
				want += w * d
			}
			if math.Abs(float64(got[r*H+h])-want) > 1e-4*(1+math.Abs(want)) {
				t.Fatalf("row %d col %d: %v, want %v", r, h, got[r*H+h], want)
			}
		}
	}
}

func bytesOf(v []float32) []byte {
	b := make([]byte, 4*len(v))
	copy(Arg{Mem: b}.F32(), v)
	return b
}

func bytesOfU32(v []uint32) []byte {
	b := make([]byte, 4*len(v))
	copy(Arg{Mem: b}.U32(), v)
	return b
}
