package testsuite

import (
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// The float64 Gemma 2 reference checked against itself on properties its semantics imply
// (causality, the window's reach, GQA as repeated KV heads, the caps' bounds, RoPE's
// relative positions) and against a forward computed by hand where the layers vanish.

// tinyGemma2 is a 2-layer Gemma 2 small enough to recompute often: GQA groups of 2, layer 0
// sliding with a window of 3, caps that bend scores and logits of these weights.
func tinyGemma2() Gemma2Dims {
	return Gemma2Dims{Hidden: 24, Intermediate: 40, Layers: 2, Heads: 4, KVHeads: 2, HeadDim: 8, Vocab: 50,
		RopeTheta: 10000, RMSEps: 1e-6, QueryPreAttnScalar: 8, AttnSoftcap: 1.5, FinalSoftcap: 3,
		EmbedScale: math.Sqrt(24), SlidingWindow: 3, Sliding: []bool{true, false}, Tied: true}
}

// randomGemma2 fills every tensor the forward reads: projections scaled to keep activations
// of order 1, norm weights around 0 (Gemma's (1 + w)), embeddings of norm about 1.
func randomGemma2(c Gemma2Dims, seed uint64) *Gemma2Ref {
	r := rand.New(rand.NewPCG(seed, seed+1))
	shapes := map[string][2]int{
		"model.embed_tokens.weight": {c.Vocab, c.Hidden}, "model.norm.weight": {1, c.Hidden}, "lm_head.weight": {c.Vocab, c.Hidden},
	}
	q, kv := c.Heads*c.HeadDim, c.KVHeads*c.HeadDim
	for l := range c.Layers {
		for name, s := range map[string][2]int{
			"input_layernorm": {1, c.Hidden}, "self_attn.q_proj": {q, c.Hidden}, "self_attn.k_proj": {kv, c.Hidden},
			"self_attn.v_proj": {kv, c.Hidden}, "self_attn.o_proj": {c.Hidden, q}, "post_attention_layernorm": {1, c.Hidden},
			"pre_feedforward_layernorm": {1, c.Hidden}, "mlp.gate_proj": {c.Intermediate, c.Hidden},
			"mlp.up_proj": {c.Intermediate, c.Hidden}, "mlp.down_proj": {c.Hidden, c.Intermediate},
			"post_feedforward_layernorm": {1, c.Hidden},
		} {
			shapes[fmt.Sprintf("model.layers.%d.%s.weight", l, name)] = s
		}
	}
	w := map[string][]float64{}
	for _, name := range slices.Sorted(maps.Keys(shapes)) {
		s := shapes[name]
		std := 1.5 / math.Sqrt(float64(s[1]))
		switch {
		case s[0] == 1:
			std = 0.3
		case name == "model.embed_tokens.weight":
			std = 1 / math.Sqrt(float64(c.Hidden))
		}
		v := make([]float64, s[0]*s[1])
		for i := range v {
			v[i] = std * r.NormFloat64()
		}
		w[name] = v
	}
	return &Gemma2Ref{C: c, W: w}
}

func TestGemma2RefGeluTanh(t *testing.T) {
	// PyTorch's gelu(1, approximate="tanh"), and within 1e-3 of the exact (erf) GELU.
	if g := GeluTanh(1); math.Abs(g-0.8411919906082768) > 1e-12 {
		t.Errorf("gelu_tanh(1) = %.16g", g)
	}
	worst := 0.0
	for x := -8.0; x <= 8; x += 1.0 / 64 {
		worst = math.Max(worst, math.Abs(GeluTanh(x)-x*0.5*(1+math.Erf(x/math.Sqrt2))))
	}
	if worst > 1e-3 || worst == 0 {
		t.Errorf("tanh GELU vs erf GELU: %.3g", worst)
	}
}

// TestGemma2RefCausal: position t's logits and hidden states are those of the prefix
// tokens[:t+1], bit for bit.
func TestGemma2RefCausal(t *testing.T) {
	ref := randomGemma2(tinyGemma2(), 1)
	tokens := []int{2, 17, 33, 4, 4, 49, 0, 21}
	logits, hidden := ref.Forward(tokens)
	for n := 1; n < len(tokens); n += 3 {
		pl, ph := ref.Forward(tokens[:n])
		if !slices.Equal(pl[n-1], logits[n-1]) || !slices.Equal(ph[1].Out[n-1], hidden[1].Out[n-1]) {
			t.Fatalf("position %d depends on later tokens", n-1)
		}
	}
}

// TestGemma2RefWindowReach: through L sliding layers of window W, token 0 reaches positions
// up to L*(W-1) and no further; one full layer lets it reach everything.
func TestGemma2RefWindowReach(t *testing.T) {
	c := tinyGemma2()
	c.Sliding = []bool{true, true}
	ref := randomGemma2(c, 2)
	a := []int{2, 17, 33, 4, 4, 49, 0, 21, 8}
	b := slices.Clone(a)
	b[0] = 40
	la, _ := ref.Forward(a)
	lb, _ := ref.Forward(b)
	reach := c.Layers * (c.SlidingWindow - 1) // 4
	for p := range a {
		same := slices.Equal(la[p], lb[p])
		if same != (p > reach) {
			t.Errorf("all sliding: token 0 changes position %d: %v (reach %d)", p, !same, reach)
		}
	}
	ref.C.Sliding = []bool{true, false}
	la, _ = ref.Forward(a)
	lb, _ = ref.Forward(b)
	if slices.Equal(la[len(a)-1], lb[len(a)-1]) {
		t.Error("a full layer does not carry token 0 to the last position")
	}
}

// TestGemma2RefGQA: kv heads shared by groups of 2 query heads give what each query head's
// own copy of its kv head gives (repeat_kv).
func TestGemma2RefGQA(t *testing.T) {
	ref := randomGemma2(tinyGemma2(), 3)
	wide := &Gemma2Ref{C: ref.C, W: map[string][]float64{}}
	wide.C.KVHeads = ref.C.Heads
	group, row := ref.C.Heads/ref.C.KVHeads, ref.C.HeadDim*ref.C.Hidden
	for name, v := range ref.W {
		wide.W[name] = v
		if strings.HasSuffix(name, ".k_proj.weight") || strings.HasSuffix(name, ".v_proj.weight") {
			var rep []float64
			for h := range ref.C.KVHeads {
				for range group {
					rep = append(rep, v[h*row:(h+1)*row]...)
				}
			}
			wide.W[name] = rep
		}
	}
	tokens := []int{2, 9, 31, 7, 14}
	got, _ := ref.Forward(tokens)
	want, _ := wide.Forward(tokens)
	if e := maxRel(got, want); e > 1e-12 {
		t.Fatalf("GQA vs repeated kv heads: %.3g", e)
	}
}

func maxRel(a, b [][]float64) float64 {
	worst := 0.0
	for i := range a {
		var num, den float64
		for j := range a[i] {
			num += (a[i][j] - b[i][j]) * (a[i][j] - b[i][j])
			den += b[i][j] * b[i][j]
		}
		worst = math.Max(worst, math.Sqrt(num/den))
	}
	return worst
}

// TestGemma2RefCaps: capped logits stay inside the cap (and do reach near it with these
// weights); a cap far above every value changes nothing measurable; no cap is 0.
func TestGemma2RefCaps(t *testing.T) {
	ref := randomGemma2(tinyGemma2(), 4)
	tokens := []int{2, 17, 33, 4, 4, 49}
	logits, _ := ref.Forward(tokens)
	top := 0.0
	for _, row := range logits {
		for _, v := range row {
			if math.Abs(v) >= ref.C.FinalSoftcap {
				t.Fatalf("logit %g outside the cap %g", v, ref.C.FinalSoftcap)
			}
			top = math.Max(top, math.Abs(v))
		}
	}
	if top < 0.5*ref.C.FinalSoftcap {
		t.Fatalf("largest logit %g: the cap of %g never bends", top, ref.C.FinalSoftcap)
	}
	far, none := *ref, *ref
	far.C.AttnSoftcap, far.C.FinalSoftcap = 1e9, 1e9
	none.C.AttnSoftcap, none.C.FinalSoftcap = 0, 0
	lf, _ := far.Forward(tokens)
	ln, _ := none.Forward(tokens)
	if e := maxRel(lf, ln); e > 1e-12 {
		t.Fatalf("caps of 1e9 vs none: %.3g", e)
	}
	if e := maxRel(logits, ln); e < 1e-2 {
		t.Fatalf("the caps change logits by only %.3g", e)
	}
}

// TestGemma2RefWithoutLayers: with every projection zero each layer adds nothing (a
// post-norm of zeros is zeros), so the logits are cap*tanh(head . norm(scale*embed) / cap),
// computed here by hand.
func TestGemma2RefWithoutLayers(t *testing.T) {
	ref := randomGemma2(tinyGemma2(), 5)
	for name, v := range ref.W {
		if strings.HasSuffix(name, "_proj.weight") {
			clear(v)
		}
	}
	c := ref.C
	tok := 17
	emb, nw := ref.W["model.embed_tokens.weight"], ref.W["model.norm.weight"]
	var ss float64
	for i := range c.Hidden {
		x := emb[tok*c.Hidden+i] * c.EmbedScale
		ss += x * x
	}
	inv := 1 / math.Sqrt(ss/float64(c.Hidden)+c.RMSEps)
	logits, hidden := ref.Forward([]int{3, tok})
	for v := range c.Vocab {
		var dot float64
		for i := range c.Hidden {
			dot += emb[v*c.Hidden+i] * emb[tok*c.Hidden+i] * c.EmbedScale * inv * (1 + nw[i])
		}
		if want := c.FinalSoftcap * math.Tanh(dot/c.FinalSoftcap); math.Abs(logits[1][v]-want) > 1e-12 {
			t.Fatalf("logit %d: %.15g, by hand %.15g", v, logits[1][v], want)
		}
	}
	for i := range c.Hidden {
		if hidden[1].Out[1][i] != emb[tok*c.Hidden+i]*c.EmbedScale {
			t.Fatalf("layer 1's output differs from the scaled embedding at %d", i)
		}
	}
}

// TestGemma2RefRope: rotate_half RoPE leaves position 0 alone and makes q.k depend on the
// positions' difference only.
func TestGemma2RefRope(t *testing.T) {
	r := rand.New(rand.NewPCG(6, 7))
	q, k := make([]float64, 16), make([]float64, 16)
	for i := range q {
		q[i], k[i] = r.NormFloat64(), r.NormFloat64()
	}
	dot := func(i, j int) float64 {
		a, b := slices.Clone(q), slices.Clone(k)
		ropeHalf(a, i, 10000)
		ropeHalf(b, j, 10000)
		var s float64
		for d := range a {
			s += a[d] * b[d]
		}
		return s
	}
	a := slices.Clone(q)
	ropeHalf(a, 0, 10000)
	if !slices.Equal(a, q) {
		t.Error("position 0 rotates")
	}
	if d := dot(7, 3) - dot(107, 103); math.Abs(d) > 1e-9 {
		t.Errorf("q.k at (7, 3) and (107, 103) differ by %g", d)
	}
	if d := dot(7, 3) - dot(7, 4); math.Abs(d) < 1e-6 {
		t.Error("q.k does not depend on the distance")
	}
}
