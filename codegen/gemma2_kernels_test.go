package codegen

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"xmix/bundle"
	"xmix/ptx"
)

// The row-kernel variants Gemma 2 adds: GeGLU (tanh GELU) with its mlp.act ops, norms of
// (1 + w), the post-attention / post-feedforward norm of the delta, the embedding scale.

func TestGeluMulMatchesReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(61, 62))
	for _, w := range []int{160, 1000, 1300} {
		sets := testOps(w)
		for _, name := range []string{"none", "capture", "steer", "chain"} {
			c := SiluConfig{Inter: w, Ops: sets[name], Act: ActGeluTanh}
			k := must(t)(SiluMul(fmt.Sprintf("gelu_%d_%s", w, name), c))
			if k.Op != "gelu_tanh_mul" {
				t.Fatalf("op %q", k.Op)
			}
			// Gates up to |12| cover both saturated ends (x and 0) and the curved middle.
			args := []targ{{name: "gu", f32: randF32(rng, testRows*2*w, 12)}, {name: "act", out: testRows * w}}
			if name == "none" {
				args = append(args, nullPtr(bundle.GatedActBF16), nullPtr(bundle.GatedGuBF16))
			} else {
				args = append(args, miTargs(rng, c.Ops)...)
			}
			checkKernel(t, k, c.Launch(testRows), args)
		}
	}
}

// TestGeluMulExtremes: gates far past either end, where g³ overflows f32, give g and -0
// rather than NaN, as the reference does.
func TestGeluMulExtremes(t *testing.T) {
	c := SiluConfig{Inter: 8, Act: ActGeluTanh}
	k := must(t)(SiluMul("gelu_ext", c))
	gate := []float32{1e30, -1e30, 3e38, -3e38, 80, -80, 0, 1}
	gu := append(append([]float32(nil), gate...), 1, 1, 1, 1, 1, 1, 1, 1)
	out := emulate(t, k, c.Launch(1), []targ{{name: "gu", f32: gu}, {name: "act", out: 8}, nullPtr(bundle.GatedActBF16), nullPtr(bundle.GatedGuBF16)})[1]
	want := []float32{1e30, 0, 3e38, 0, 80, 0, 0, 0.841192}
	for i, w := range want {
		if d := out[i] - w; d > 1e-6*max(1, w) || d < -1e-6*max(1, w) {
			t.Errorf("gelu(%g) = %g, want %g", gate[i], out[i], w)
		}
	}
}

func TestSiluConfigRejectsUnknownActivation(t *testing.T) {
	if _, err := SiluMul("x", SiluConfig{Inter: 64, Act: "relu"}); err == nil {
		t.Fatal("relu accepted")
	}
}

// gemmaRowArgs is rowNormArgs with delta_w after delta when c.DeltaNorm.
func gemmaRowArgs(rng *rand.Rand, c RowConfig, rows int) []targ {
	args := rowNormArgs(rng, c, rows)
	if !c.DeltaNorm {
		return args
	}
	// Gemma's post-norm weights sit around 0: (1 + w) around 1.
	return slices.Insert(args, 2, weightArg("delta_w", randF32(rng, c.Hidden, 0.5), c.WDtype))
}

func TestRowNormGemmaMatchesReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(63, 64))
	for _, w := range []int{256, 1000} {
		sets := testOps(w)
		for _, dt := range []ptx.Type{ptx.F32, ptx.BF16} {
			for _, v := range []struct {
				name string
				c    RowConfig
			}{
				{"embed_scaled", RowConfig{Load: "embed", Vocab: 50, EmbedScale: 48, ResidOps: sets["steer"]}},
				{"embed_scaled_probe", RowConfig{Load: "embed", Vocab: 50, EmbedScale: 59.75, NormOps: sets["probe"]}},
				{"post_norm", RowConfig{Load: "add", DeltaNorm: true}},
				{"post_norm_delta_ops", RowConfig{Load: "add", DeltaNorm: true, DeltaOps: sets["steer"], ResidOps: sets["project"]}},
				{"post_norm_chain_final", RowConfig{Load: "add", DeltaNorm: true, DeltaOps: sets["capture"], ResidOps: sets["chain"], Gather: true}},
				{"offset_only", RowConfig{Load: "add", NormOps: sets["capture"]}},
			} {
				c := v.c
				c.Hidden, c.Eps, c.WDtype, c.WOffset = w, 1e-6, dt, 1
				k := must(t)(RowNorm(fmt.Sprintf("row_gemma_%s_%s_%d", v.name, dt, w), c))
				if c.DeltaNorm && !slices.Contains(paramNames(k), "delta_w") {
					t.Fatalf("%s: params %v lack delta_w", v.name, paramNames(k))
				}
				checkKernel(t, k, c.Launch(testRows), gemmaRowArgs(rng, c, testRows))
			}
		}
	}
}

// TestRowNormGemmaOffsetIsOnePlusW: a (1 + w) norm equals a plain norm whose weights are
// 1 + w, in the reference and in the kernel.
func TestRowNormGemmaOffsetIsOnePlusW(t *testing.T) {
	rng := rand.New(rand.NewPCG(65, 66))
	const h = 300
	c := RowConfig{Hidden: h, Eps: 1e-6, WDtype: ptx.F32, Load: "add", WOffset: 1}
	plain := c
	plain.WOffset = 0
	args := rowNormArgs(rng, c, testRows)
	shifted := slices.Clone(args)
	shifted[2].f32 = slices.Clone(args[2].f32)
	for i := range shifted[2].f32 {
		shifted[2].f32[i]++
	}
	ko, kp := must(t)(RowNorm("off", c)), must(t)(RowNorm("plain", plain))
	a, b := emulate(t, ko, c.Launch(testRows), args)[3], emulate(t, kp, c.Launch(testRows), shifted)[3]
	if e := relL2(f64(a), f64(b)); !(e <= 1e-6) {
		t.Fatalf("(1 + w) norm vs norm by 1 + w: relative error %.3g", e)
	}
}

func TestRowNormGemmaRejects(t *testing.T) {
	for _, c := range []RowConfig{
		{Hidden: 64, Eps: 1e-6, WDtype: ptx.F32, Load: "embed", Vocab: 10, DeltaNorm: true},
		{Hidden: 64, Eps: 1e-6, WDtype: ptx.F32, Load: "add", EmbedScale: 8},
	} {
		if _, err := RowNorm("x", c); err == nil {
			t.Errorf("%+v accepted", c)
		}
	}
}

func f64(v []float32) []float64 {
	out := make([]float64, len(v))
	for i, x := range v {
		out[i] = float64(x)
	}
	return out
}

func TestSoftcapMatchesReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(67, 68))
	for _, w := range []int{300, 1024, 2500} {
		for _, limit := range []float32{30, 50} {
			c := SoftcapConfig{Width: w, Cap: limit}
			k := must(t)(Softcap(fmt.Sprintf("softcap_%d", w), c))
			// Logits from near 0 to far past the cap (saturated at +-cap).
			x := randF32(rng, 3*w, 4*limit)
			x[0], x[1], x[2] = 1e30, -3e38, 0
			checkKernel(t, k, c.Launch(3), []targ{{name: "x", f32: x, out: 3 * w}})
		}
	}
}

// TestSoftcapValues: the ends and the middle of cap * tanh(x / cap), emulated.
func TestSoftcapValues(t *testing.T) {
	c := SoftcapConfig{Width: 6, Cap: 30}
	k := must(t)(Softcap("softcap_values", c))
	x := []float32{0, 1e-3, 30, -30, 1e30, -1e30}
	got := emulate(t, k, c.Launch(1), []targ{{name: "x", f32: x, out: 6}})[0]
	want := []float32{0, 1e-3, 22.847835, -22.847835, 30, -30} // 30 tanh(1) = 22.8478...
	for i := range want {
		if d := got[i] - want[i]; d > 2e-5 || d < -2e-5 {
			t.Errorf("softcap(%g) = %.7g, want %.7g", x[i], got[i], want[i])
		}
	}
}

func TestSoftcapRejects(t *testing.T) {
	for _, c := range []SoftcapConfig{{Width: 0, Cap: 30}, {Width: 10, Cap: 0}, {Width: 10, Cap: float32(math.Inf(1))}} {
		if _, err := Softcap("s", c); err == nil {
			t.Errorf("%+v accepted", c)
		}
	}
}

// TestGemmaLensAndRenorm: the logit lens's norm by (1 + w) and its soft-capped top-k
// logits, and the renorm after a custom kernel by (1 + w), each against its reference.
func TestGemmaLensAndRenorm(t *testing.T) {
	const rows, outW = 3, 12
	r := rand.New(rand.NewPCG(69, 70))
	c := LensConfig{Hidden: 96, Vocab: lensTopKSlice + 300, Eps: 1e-6, WDtype: ptx.BF16, Bit: 2, K: 5, OutWidth: outW, OutCol: 1,
		WOffset: 1, Softcap: 3}
	nk := must(t)(LensNorm("lens_norm_gemma", c))
	checkKernel(t, nk, c.RowsLaunch(rows), []targ{{name: "any_mask", u32: []uint32{1 << 2}}, {name: "resid", f32: randF32(r, rows*c.Hidden, 2)},
		{name: "w", bf16: randF32(r, c.Hidden, 0.5)}, {name: "out", out: rows * c.Hidden}})
	pk, mk := must(t)(LensTopKPart("lens_part_gemma", c)), must(t)(LensTopK("lens_topk_gemma", c))
	mask := []uint32{1 << 2, 1 << 2, 1 << 2}
	pa := []targ{{name: "any_mask", u32: []uint32{1 << 2}}, {name: "ctl_mask", u32: mask},
		{name: "logits", f32: randF32(r, rows*c.Vocab, 6)}, {name: "cand", f32: fill(rows*c.CandWidth(), -9), out: rows * c.CandWidth()}}
	cand := reference(t, pk, c.PartLaunch(rows), pa)[3]
	sameBits(t, "candidates (uncapped)", emulate(t, pk, c.PartLaunch(rows), pa)[3], cand)
	ma := []targ{{name: "any_mask", u32: []uint32{1 << 2}}, {name: "ctl_mask", u32: mask},
		{name: "cand", f32: cand}, {name: "out", f32: fill(rows*outW, -9), out: rows * outW}}
	checkKernel(t, mk, c.RowsLaunch(rows), ma)
	out := emulate(t, mk, c.RowsLaunch(rows), ma)[3]
	for row := range rows {
		for j := range c.K {
			if v := out[row*outW+1+c.K+j]; !(v < 3 && v > 2) { // logits of up to 6, capped at 3
				t.Fatalf("row %d pick %d: capped logit %v", row, j, v)
			}
		}
	}

	rc := RenormConfig{Hidden: 160, Eps: 1e-6, WDtype: ptx.BF16, WOffset: 1}
	k := must(t)(Renorm("renorm_gemma", rc))
	checkKernel(t, k, rc.Launch(rows), []targ{{name: "resid", f32: randF32(r, rows*160, 2)}, {name: "w", bf16: randF32(r, 160, 0.5)},
		{name: "out", out: rows * 160}})
}
