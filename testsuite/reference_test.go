package testsuite

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"xmix/bundle"
	"xmix/compile"
	"xmix/loader"
	"xmix/loader/cpu"
	"xmix/ops"
)

// naiveLlama is an independent, straightforward float64 Llama forward (Hugging Face
// conventions) that reads the same weights as the bundle. It recomputes the whole sequence
// for every position: slow and obviously right.
type naiveLlama struct {
	c    bundle.ModelConfig
	w    map[string][]float64
	invF []float64
}

func newNaive(b *bundle.Bundle, be interface{ Buffer(string) []byte }) *naiveLlama {
	n := &naiveLlama{c: b.Manifest.Model, w: map[string][]float64{}}
	for _, buf := range b.Manifest.Buffers {
		if buf.Kind != bundle.KindWeight {
			continue
		}
		raw := be.Buffer(buf.Name)
		var v []float64
		if buf.Dtype == "bf16" {
			for _, h := range (ops.Arg{Mem: raw}).U16() {
				v = append(v, float64(ops.BF16ToF32(h)))
			}
		} else {
			for _, f := range (ops.Arg{Mem: raw}).F32() {
				v = append(v, float64(f))
			}
		}
		n.w[buf.Name] = v
	}
	c := n.c
	for i := 0; i < c.HeadDim/2; i++ {
		inv := 1 / math.Pow(c.RopeTheta, float64(2*i)/float64(c.HeadDim))
		if s := c.RopeScaling; s != nil {
			wavelen := 2 * math.Pi / inv
			lowWave := float64(s.OriginalMaxPos) / s.LowFreqFactor
			highWave := float64(s.OriginalMaxPos) / s.HighFreqFactor
			switch {
			case wavelen < highWave:
			case wavelen > lowWave:
				inv /= s.Factor
			default:
				sm := (float64(s.OriginalMaxPos)/wavelen - s.LowFreqFactor) / (s.HighFreqFactor - s.LowFreqFactor)
				inv = (1-sm)*inv/s.Factor + sm*inv
			}
		}
		n.invF = append(n.invF, inv)
	}
	return n
}

func (n *naiveLlama) rmsnorm(x []float64, w []float64) []float64 {
	var ss float64
	for _, v := range x {
		ss += v * v
	}
	r := 1 / math.Sqrt(ss/float64(len(x))+n.c.RMSEps)
	out := make([]float64, len(x))
	for i := range x {
		out[i] = x[i] * r * w[i]
	}
	return out
}

// headNorm is Qwen3's QK-norm: RMSNorm over each head of x in place.
func (n *naiveLlama) headNorm(x []float64, w []float64) {
	D := n.c.HeadDim
	for h := 0; h < len(x); h += D {
		copy(x[h:h+D], n.rmsnorm(x[h:h+D], w))
	}
}

// matvec: y = W x with W [rows, len(x)] starting at row r0.
func matvec(w []float64, r0, rows int, x []float64) []float64 {
	k := len(x)
	y := make([]float64, rows)
	for r := range rows {
		var s float64
		row := w[(r0+r)*k : (r0+r+1)*k]
		for i, v := range x {
			s += row[i] * v
		}
		y[r] = s
	}
	return y
}

func (n *naiveLlama) rope(x []float64, pos int) {
	d := n.c.HeadDim
	for i := 0; i < d/2; i++ {
		a := float64(pos) * n.invF[i]
		c, s := math.Cos(a), math.Sin(a)
		x0, x1 := x[i], x[i+d/2]
		x[i] = x0*c - x1*s
		x[i+d/2] = x1*c + x0*s
	}
}

// logits returns the next-token logits after tokens.
func (n *naiveLlama) logits(tokens []int) []float64 {
	c := n.c
	H, D := c.Hidden, c.HeadDim
	T := len(tokens)
	x := make([][]float64, T)
	for t, tok := range tokens {
		x[t] = append([]float64(nil), n.w["embed"][tok*H:(tok+1)*H]...)
	}
	for l := range c.Layers {
		lw := func(s string) []float64 { return n.w[layerName(l, s)] }
		ks, vs, qs := make([][]float64, T), make([][]float64, T), make([][]float64, T)
		for t := range T {
			h := n.rmsnorm(x[t], lw("attn_norm"))
			q := matvec(lw("wqkv"), 0, c.Heads*D, h)
			k := matvec(lw("wqkv"), c.Heads*D, c.KVHeads*D, h)
			v := matvec(lw("wqkv"), (c.Heads+c.KVHeads)*D, c.KVHeads*D, h)
			if c.QKVBias {
				b := lw("qkv_bias")
				for i := range q {
					q[i] += b[i]
				}
				for i := range k {
					k[i] += b[c.Heads*D+i]
					v[i] += b[(c.Heads+c.KVHeads)*D+i]
				}
			}
			if c.QKNorm {
				n.headNorm(q, lw("q_norm"))
				n.headNorm(k, lw("k_norm"))
			}
			for hd := range c.Heads {
				n.rope(q[hd*D:(hd+1)*D], t)
			}
			for hd := range c.KVHeads {
				n.rope(k[hd*D:(hd+1)*D], t)
			}
			qs[t], ks[t], vs[t] = q, k, v
		}
		for t := range T {
			z := make([]float64, c.Heads*D)
			for hd := range c.Heads {
				kv := hd / (c.Heads / c.KVHeads)
				scores := make([]float64, t+1)
				mx := math.Inf(-1)
				for j := 0; j <= t; j++ {
					var s float64
					for i := range D {
						s += qs[t][hd*D+i] * ks[j][kv*D+i]
					}
					scores[j] = s / math.Sqrt(float64(D))
					mx = math.Max(mx, scores[j])
				}
				var sum float64
				for j := range scores {
					scores[j] = math.Exp(scores[j] - mx)
					sum += scores[j]
				}
				for j := range scores {
					for i := range D {
						z[hd*D+i] += scores[j] / sum * vs[j][kv*D+i]
					}
				}
			}
			o := matvec(lw("wo"), 0, H, z)
			for i := range H {
				x[t][i] += o[i]
			}
			h := n.rmsnorm(x[t], lw("mlp_norm"))
			var d []float64
			if c.Experts > 0 {
				d = n.moe(l, h)
			} else {
				d = n.swiglu(lw("wgu"), lw("wdown"), 0, h)
			}
			for i := range H {
				x[t][i] += d[i]
			}
		}
	}
	h := n.rmsnorm(x[T-1], n.w["final_norm"])
	head := n.w["lm_head"]
	if c.TieEmbeddings {
		head = n.w["embed"]
	}
	return matvec(head, 0, c.Vocab, h)
}

// swiglu is down(silu(gate h) * up h) for the MLP whose gate and up rows start at row
// 2I*e of wgu and whose down rows start at row H*e of wdown (expert e; 0 for a dense MLP).
func (n *naiveLlama) swiglu(wgu, wdown []float64, e int, h []float64) []float64 {
	I, H := n.c.Intermediate, n.c.Hidden
	gu := matvec(wgu, 2*I*e, 2*I, h)
	act := make([]float64, I)
	for i := range act {
		g := gu[i]
		act[i] = g / (1 + math.Exp(-g)) * gu[I+i]
	}
	return matvec(wdown, H*e, H, act)
}

// moe is Hugging Face's MixtralSparseMoeBlock for one token: softmax over the router
// logits, the top-k probabilities (ties to the lower index) renormalised to sum 1, and the
// weighted sum of those experts' SwiGLU outputs.
func (n *naiveLlama) moe(l int, h []float64) []float64 {
	c := n.c
	logits := matvec(n.w[layerName(l, "router")], 0, c.Experts, h)
	mx := math.Inf(-1)
	for _, v := range logits {
		mx = math.Max(mx, v)
	}
	p := make([]float64, c.Experts)
	var sum float64
	for e, v := range logits {
		p[e] = math.Exp(v - mx)
		sum += p[e]
	}
	taken := make([]bool, c.Experts)
	var picks []int
	var tot float64
	for range c.TopK {
		best := -1
		for e := range p {
			if !taken[e] && (best < 0 || p[e] > p[best]) {
				best = e
			}
		}
		taken[best] = true
		picks = append(picks, best)
		tot += p[best] / sum
	}
	out := make([]float64, c.Hidden)
	for _, e := range picks {
		y := n.swiglu(n.w[layerName(l, "experts_gu")], n.w[layerName(l, "experts_down")], e, h)
		for i := range out {
			out[i] += p[e] / sum / tot * y[i]
		}
	}
	return out
}

func layerName(l int, s string) string { return "L" + strconv.Itoa(l) + "." + s }

func TestForwardMatchesFloat64Reference(t *testing.T) {
	for _, c := range []struct {
		name, spec string
		opt        compile.Options
	}{
		{"llama", SmallModel, compile.Options{}}, {"qwen2", SmallQwen2, compile.Options{}}, {"qwen3", SmallQwen3, compile.Options{}},
		// Mistral is Llama's forward under another name (no QK-norm here).
		{"mistral", strings.Replace(SmallQwen3, "family: qwen3", "family: mistral", 1), compile.Options{}},
		// The prefill chunk (16 rows) runs every expert densely by default, the decode buckets
		// grouped; --moe grouped runs the expert kernels everywhere.
		{"mixtral", SmallMixtral, compile.Options{}},
		{"mixtral-grouped", SmallMixtral, compile.Options{MoE: "grouped"}},
	} {
		t.Run(c.name, func(t *testing.T) { checkForwardReference(t, CompileWith(t, c.opt, c.spec)) })
	}
}

// randomizeVectors gives the bias and QK-norm weights random values: synthetic weights make
// every 1-D weight 1, which would hide a bias or norm weight read at the wrong index.
func randomizeVectors(b *bundle.Bundle, be *cpu.Backend) {
	r := rand.New(rand.NewPCG(7, 8))
	for _, buf := range b.Manifest.Buffers {
		scale, offset := 0.0, 0.0
		switch {
		case strings.HasSuffix(buf.Name, ".qkv_bias"):
			scale = 0.5
		case strings.HasSuffix(buf.Name, ".q_norm"), strings.HasSuffix(buf.Name, ".k_norm"):
			scale, offset = 0.5, 1
		default:
			continue
		}
		raw := be.Buffer(buf.Name)
		if buf.Dtype == "f32" {
			for i := 0; i < len(raw)/4; i++ {
				binary.LittleEndian.PutUint32(raw[4*i:], math.Float32bits(float32(offset+scale*(2*r.Float64()-1))))
			}
			continue
		}
		for i := 0; i < len(raw)/2; i++ {
			binary.LittleEndian.PutUint16(raw[2*i:], ops.F32ToBF16(float32(offset+scale*(2*r.Float64()-1))))
		}
	}
}

func checkForwardReference(t *testing.T, b *bundle.Bundle) {
	be := newCPU(t, b).(*cpu.Backend)
	randomizeVectors(b, be)
	rec := &LogitRecorder{Backend: be, Vocab: b.Manifest.Model.Vocab}
	eng, err := loader.NewEngine(b, rec)
	if err != nil {
		t.Fatal(err)
	}
	prompt := []int{72, 101, 108, 108, 111}
	res, err := eng.Generate([]loader.Request{{Prompt: prompt, MaxTokens: 6}})
	if err != nil {
		t.Fatal(err)
	}
	ref := newNaive(b, be)
	seq := append([]int{b.Manifest.Model.BOS}, prompt...)
	for step, got := range rec.Steps {
		want := ref.logits(seq)
		var num, den float64
		for i, w := range want {
			d := float64(got[i]) - w
			num += d * d
			den += w * w
		}
		if e := math.Sqrt(num / den); e > 1e-4 {
			t.Fatalf("step %d: logits relative error %.3g > 1e-4", step, e)
		}
		best := 0
		for i, w := range want {
			if w > want[best] {
				best = i
			}
		}
		if step < len(res[0].Tokens) && res[0].Tokens[step] != best {
			t.Fatalf("step %d: greedy token %d, reference argmax %d", step, res[0].Tokens[step], best)
		}
		if step < len(res[0].Tokens) {
			seq = append(seq, res[0].Tokens[step])
		}
	}
	if len(rec.Steps) != 6 {
		t.Fatalf("%d steps recorded, want 6 (1 prefill + 5 decode)", len(rec.Steps))
	}
}

// TestBiasedModelRefusesQKVHooks: Qwen2's biases are added in RopeKV, after the attn.q/k/v
// hooks, so an op there is refused at its position rather than shown unbiased values.
func TestBiasedModelRefusesQKVHooks(t *testing.T) {
	dir := t.TempDir()
	mp, ap := filepath.Join(dir, "m.yaml"), filepath.Join(dir, "a.yaml")
	if err := os.WriteFile(mp, []byte(SmallQwen2), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(ap, []byte(captureAt("attn.k", 1, 64)), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := compile.Build(mp, []string{ap}, compile.Options{Verify: true})
	if err == nil || !strings.Contains(err.Error(), `a.yaml:4:36: hook attn.k cannot be fired on model "small-qwen2" (family qwen2) in this version of xmixc (the q/k/v biases are added after this hook`) {
		t.Fatalf("got %v, want a refusal of attn.k", err)
	}
	// Qwen3 has no biases: the same hook compiles.
	Compile(t, SmallQwen3, captureAt("attn.k", 1, 64))
}

// TestMixtralRefusesMlpAct: a MoE layer's activations are k rows per token, so mlp.act is
// refused there; router_logits compiles.
func TestMixtralRefusesMlpAct(t *testing.T) {
	dir := t.TempDir()
	mp, ap := filepath.Join(dir, "m.yaml"), filepath.Join(dir, "a.yaml")
	if err := os.WriteFile(mp, []byte(SmallMixtral), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(ap, []byte(captureAt("mlp.act", 1, 96)), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := compile.Build(mp, []string{ap}, compile.Options{Verify: true})
	if err == nil || !strings.Contains(err.Error(), `a.yaml:4:36: hook mlp.act cannot be fired on model "small-mixtral" (family mixtral) in this version of xmixc (a mixture-of-experts layer's activations are top-k rows per token`) {
		t.Fatalf("got %v, want a refusal of mlp.act", err)
	}
	Compile(t, SmallMixtral, captureAt("router_logits", 0, 4))
}

// TestMixtralDenseExperts: by default (--moe dense), buckets from 8 rows run every expert as GEMMs
// at its offset in the stacked weights and then one combine per layer; smaller buckets keep
// the grouped kernels. A batch of 8 generates the same tokens, and steers the router the
// same way, as with the grouped kernels.
func TestMixtralDenseExperts(t *testing.T) {
	spec := strings.Replace(SmallMixtral, "decode_buckets: [1, 2], prefill_chunks: [16], max_seq_len: 64, max_seqs: 2",
		"decode_buckets: [1, 8], prefill_chunks: [16], max_seq_len: 64, max_seqs: 8", 1)
	dense := Compile(t, spec, smallSteerMoE)
	grouped := CompileWith(t, compile.Options{MoE: "grouped"}, spec, smallSteerMoE)
	for _, tp := range dense.Templates {
		combines, experts := 0, 0
		for _, n := range tp.Nodes {
			combines += bool2int(strings.HasSuffix(n.Label, ".experts_combine"))
			experts += bool2int(strings.HasSuffix(n.Label, ".experts_down"))
		}
		if dense := tp.Tokens >= 8; (dense && (combines != 2 || experts != 0)) || (!dense && (combines != 0 || experts != 2)) {
			t.Fatalf("%s (%d rows): %d combines, %d grouped expert kernels", tp.Name, tp.Tokens, combines, experts)
		}
	}
	var reqs []loader.Request
	for i := range 8 {
		r := loader.Request{Prompt: []int{72 + i, 101, 108, 108 + i, 111}, MaxTokens: 6}
		if i%2 == 1 {
			r.Apps = []string{"steermoe"}
		}
		reqs = append(reqs, r)
	}
	a, b := Generate(t, NewCPU, dense, reqs), Generate(t, NewCPU, grouped, reqs)
	for i := range reqs {
		if !slices.Equal(a[i].Tokens, b[i].Tokens) {
			t.Fatalf("request %d: dense experts %v, grouped %v", i, a[i].Tokens, b[i].Tokens)
		}
	}
}

func bool2int(b bool) int {
	if b {
		return 1
	}
	return 0
}
