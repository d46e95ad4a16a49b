package testsuite

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"

	"xmix/bundle"
	"xmix/loader"
	"xmix/ops"
	"xmix/specs"
)

// SmallGemma2 is a random Gemma 2: head dim 256 apart from hidden/heads, GQA groups of 2,
// query_pre_attn_scalar that is not the head dim, caps that bend its scores and logits, and
// a window of 5 on layers 0 and 2 that prompts of the checks outgrow (in prefill and in
// decode).
const SmallGemma2 = `model: small-gemma2
family: gemma2
dims: {hidden: 96, intermediate: 160, layers: 3, heads: 4, kv_heads: 2, head_dim: 256, vocab: 300,
       rope_theta: 10000, rms_eps: 1.0e-6, query_pre_attn_scalar: 192, attn_logit_softcapping: 2.0,
       final_logit_softcapping: 3.0, sliding_window: 5}
weights: {synthetic: {seed: 10, std: 0.08}}
tokenizer: bytes
bos: 256
eos: [257]
serving: {decode_buckets: [1, 2], prefill_chunks: [16], max_seq_len: 64, max_seqs: 2, kv_block_size: 16}
`

// CaptureAllApp captures resid_post at every one of layers layers of width hidden: one
// export "cap.x" of layers*hidden values per row, layer by layer.
func CaptureAllApp(layers, hidden int) string {
	return fmt.Sprintf(`app: cap
buffers:
  x: {shape: [%d], dtype: f32, export: true}
ops:
  - read: {at: {layers: all, hook: resid_post}, kernel: capture, into: x}
`, layers*hidden)
}

// CompileGemma2 compiles a Gemma 2 spec with apps (Compile).
func CompileGemma2(t testing.TB, model string, apps ...string) *bundle.Bundle {
	t.Helper()
	return Compile(t, model, apps...)
}

// StackedRows splits a weight buffer's first dimension among the Hugging Face tensors it
// stacks: q/k/v projections (or their biases), gate/up, or one tensor.
func StackedRows(buf bundle.Buffer, mc bundle.ModelConfig) ([]int, error) {
	switch len(buf.Tensors) {
	case 1:
		return []int{buf.Shape[0]}, nil
	case 2:
		return []int{mc.Intermediate, mc.Intermediate}, nil
	case 3:
		return []int{mc.Heads * mc.HeadDim, mc.KVHeads * mc.HeadDim, mc.KVHeads * mc.HeadDim}, nil
	}
	return nil, fmt.Errorf("buffer %s stacks %d tensors", buf.Name, len(buf.Tensors))
}

// HFTensors returns every weight of a bundle by Hugging Face tensor name, widened to
// float64 from the bytes buffer(name) gives (a backend's weight buffers).
func HFTensors(b *bundle.Bundle, buffer func(name string) []byte) (map[string][]float64, error) {
	out := map[string][]float64{}
	for _, buf := range b.Manifest.Buffers {
		if buf.Kind != bundle.KindWeight {
			continue
		}
		raw := buffer(buf.Name)
		var v []float64
		switch buf.Dtype {
		case "bf16":
			for _, h := range (ops.Arg{Mem: raw}).U16() {
				v = append(v, float64(ops.BF16ToF32(h)))
			}
		case "f32":
			for _, f := range (ops.Arg{Mem: raw}).F32() {
				v = append(v, float64(f))
			}
		default:
			return nil, fmt.Errorf("buffer %s: dtype %s", buf.Name, buf.Dtype)
		}
		rows, err := StackedRows(buf, b.Manifest.Model)
		if err != nil {
			return nil, err
		}
		width := 1
		for _, d := range buf.Shape[1:] {
			width *= d
		}
		if want := buf.Shape[0] * width; len(v) < want {
			return nil, fmt.Errorf("buffer %s holds %d values, shape %v needs %d", buf.Name, len(v), buf.Shape, want)
		}
		off := 0
		for i, name := range buf.Tensors {
			out[name] = v[off*width : (off+rows[i])*width]
			off += rows[i]
		}
	}
	return out, nil
}

// Gemma2RefFromBundle is the float64 reference over a Gemma 2 bundle's weights as buffer
// gives them.
func Gemma2RefFromBundle(b *bundle.Bundle, buffer func(name string) []byte) (*Gemma2Ref, error) {
	mc := b.Manifest.Model
	if mc.Family != "gemma2" {
		return nil, fmt.Errorf("family %s is not gemma2", mc.Family)
	}
	w, err := HFTensors(b, buffer)
	if err != nil {
		return nil, err
	}
	c := Gemma2Dims{Hidden: mc.Hidden, Intermediate: mc.Intermediate, Layers: mc.Layers, Heads: mc.Heads, KVHeads: mc.KVHeads,
		HeadDim: mc.HeadDim, Vocab: mc.Vocab, RopeTheta: mc.RopeTheta, RMSEps: mc.RMSEps, QueryPreAttnScalar: mc.QueryPreAttnScalar,
		AttnSoftcap: mc.AttnSoftcap, FinalSoftcap: mc.FinalSoftcap, EmbedScale: float64(mc.EmbedScale),
		SlidingWindow: mc.SlidingWindow, Sliding: mc.SlidingLayers, Tied: mc.TieEmbeddings}
	if c.Sliding == nil {
		c.Sliding = make([]bool, c.Layers)
	}
	for _, name := range c.Gemma2TensorNames() {
		if _, ok := w[name]; !ok {
			return nil, fmt.Errorf("the bundle has no buffer for tensor %s", name)
		}
	}
	return &Gemma2Ref{C: c, W: w}, nil
}

// CheckGemma2Reference runs a bundle of SmallGemma2 with CaptureAllApp on a backend and
// compares, at every step, the logits with the float64 reference's and, at every row
// (prompt and generated), each layer's resid_post with the reference's layer output: both
// within tol (relative L2), and the greedy tokens equal to the reference's argmax. buffer
// gives the backend's weight buffers, which the reference reads after the run.
func CheckGemma2Reference(t *testing.T, b *bundle.Bundle, be loader.Backend, buffer func(string) []byte, tol float64) {
	t.Helper()
	rec := &LogitRecorder{Backend: be, Vocab: b.Manifest.Model.Vocab}
	eng, err := loader.NewEngine(b, rec)
	if err != nil {
		t.Fatal(err)
	}
	// 11 prompt tokens (the window of 5 binds in prefill), then 8 decode steps past it.
	prompt := []int{72, 101, 108, 108, 111, 32, 119, 111, 114, 108, 100}
	res, err := eng.Generate([]loader.Request{{Prompt: prompt, MaxTokens: 9, Apps: []string{"cap"}}})
	if err != nil {
		t.Fatal(err)
	}
	ref, err := Gemma2RefFromBundle(b, buffer)
	if err != nil {
		t.Fatal(err)
	}
	seq := append([]int{b.Manifest.Model.BOS}, prompt...)
	seq = append(seq, res[0].Tokens...)
	logits, layers := ref.Forward(seq[:len(seq)-1])
	if len(rec.Steps) != len(res[0].Tokens) {
		t.Fatalf("%d steps recorded for %d tokens", len(rec.Steps), len(res[0].Tokens))
	}
	for s, got := range rec.Steps {
		p := len(prompt) + s // the position whose logits step s samples from
		if e := relL2To64(got, logits[p]); !(e <= tol) {
			t.Errorf("step %d (position %d): logits relative error %.3g > %.3g", s, p, e, tol)
		}
		if best := argmax(logits[p]); res[0].Tokens[s] != best {
			t.Errorf("step %d: greedy token %d, reference argmax %d", s, res[0].Tokens[s], best)
		}
	}
	H := b.Manifest.Model.Hidden
	rows := res[0].Rows
	if len(rows) != len(seq)-1 {
		t.Fatalf("%d rows exported for %d positions", len(rows), len(seq)-1)
	}
	for _, row := range rows {
		i := slices.IndexFunc(row.Exports, func(e loader.Export) bool { return e.Name == "cap.x" })
		if i < 0 {
			t.Fatalf("position %d: no cap.x export", row.Pos)
		}
		x := row.Exports[i].Values
		for l, ly := range layers {
			if e := relL2To64(x[l*H:(l+1)*H], ly.Out[row.Pos]); !(e <= tol) {
				t.Errorf("position %d layer %d: resid_post relative error %.3g > %.3g", row.Pos, l, e, tol)
			}
		}
	}
}

func relL2To64(got []float32, want []float64) float64 {
	var num, den float64
	for i, w := range want {
		d := float64(got[i]) - w
		num += d * d
		den += w * w
	}
	return math.Sqrt(num / den)
}

func argmax(v []float64) int {
	best := 0
	for i, x := range v {
		if x > v[best] {
			best = i
		}
	}
	return best
}

// gemma2HooksApp captures one hook of each kind of SmallGemma2, at the layers named in its
// buffers: what gemma2Hooks says each must equal.
const gemma2HooksApp = `app: hooks
buffers:
  embed: {shape: [96], dtype: f32, export: true}
  pre1: {shape: [96], dtype: f32, export: true}
  attn1: {shape: [96], dtype: f32, export: true}
  mid1: {shape: [96], dtype: f32, export: true}
  act2: {shape: [160], dtype: f32, export: true}
  mlp0: {shape: [96], dtype: f32, export: true}
  post2: {shape: [96], dtype: f32, export: true}
ops:
  - read: {at: {hook: embed}, kernel: capture, into: embed}
  - read: {at: {layers: [1], hook: resid_pre}, kernel: capture, into: pre1}
  - read: {at: {layers: [1], hook: attn_out}, kernel: capture, into: attn1}
  - read: {at: {layers: [1], hook: resid_mid}, kernel: capture, into: mid1}
  - read: {at: {layers: [2], hook: mlp.act}, kernel: capture, into: act2}
  - read: {at: {layers: [0], hook: mlp_out}, kernel: capture, into: mlp0}
  - read: {at: {layers: [2], hook: resid_post}, kernel: capture, into: post2}
`

// gemma2Hooks is what each export of gemma2HooksApp holds at a position, in the
// reference's terms (transformers' modules: the scaled embedding, the decoder layer's
// input, post_attention_layernorm's output, the residual after it, act_fn(gate) * up,
// post_feedforward_layernorm's output, the layer's output).
var gemma2Hooks = map[string]func(ls []Gemma2Layer, p int) []float64{
	"hooks.embed": func(ls []Gemma2Layer, p int) []float64 { return ls[0].In[p] },
	"hooks.pre1":  func(ls []Gemma2Layer, p int) []float64 { return ls[1].In[p] },
	"hooks.attn1": func(ls []Gemma2Layer, p int) []float64 { return ls[1].AttnOut[p] },
	"hooks.mid1":  func(ls []Gemma2Layer, p int) []float64 { return ls[1].Mid[p] },
	"hooks.act2":  func(ls []Gemma2Layer, p int) []float64 { return ls[2].Act[p] },
	"hooks.mlp0":  func(ls []Gemma2Layer, p int) []float64 { return ls[0].MLPOut[p] },
	"hooks.post2": func(ls []Gemma2Layer, p int) []float64 { return ls[2].Out[p] },
}

// referenceTol is how close a backend's Gemma 2 comes to the float64 reference: the CPU's
// f32 reference ops within 1e-4; a GPU's bf16 tensor-core GEMMs (cuBLASLt rounds x to
// bf16) within the 2e-2 the GPU checks hold every model to.
func referenceTol(be loader.Backend) float64 {
	if _, ok := be.(interface{ Buffer(string) []byte }); ok {
		return 1e-4
	}
	return 2e-2
}

// CheckGemma2Forward: SmallGemma2's logits and every layer's resid_post, at every row of a
// prefill and the decode steps after it, match the float64 reference over the bundle's
// weights (read from the CPU backend's synthetic fill, bit-identical on every backend).
// With a bf16 cache the prompt runs the tensor-core prefill attention on a GPU (head dim
// 256); K and V rounded to bf16 put every backend within 2e-2 then.
func CheckGemma2Forward(t *testing.T, nb NewBackend) {
	for _, kv := range []string{"f32", "bf16"} {
		t.Run("kv_"+kv, func(t *testing.T) {
			spec := strings.Replace(SmallGemma2, "tokenizer: bytes", "kv_dtype: "+kv+"\ntokenizer: bytes", 1)
			b := CompileGemma2(t, spec, CaptureAllApp(3, 96))
			w := NewCPU(t, b).(interface {
				loader.Backend
				Buffer(string) []byte
			})
			defer w.Close()
			be := nb(t, b)
			defer be.Close()
			tol := referenceTol(be)
			if kv == "bf16" {
				tol = 2e-2
			}
			CheckGemma2Reference(t, b, be, w.Buffer, tol)
		})
	}
}

// CheckGemma2Hooks: each hook of Gemma 2 reads what transformers' module of that name
// computes (gemma2Hooks), at every row.
func CheckGemma2Hooks(t *testing.T, nb NewBackend) {
	b := CompileGemma2(t, SmallGemma2, gemma2HooksApp)
	w := NewCPU(t, b).(interface {
		loader.Backend
		Buffer(string) []byte
	})
	defer w.Close()
	be := nb(t, b)
	defer be.Close()
	tol := referenceTol(be)
	prompt := []int{72, 101, 108, 108, 111, 32, 119, 111, 114, 108, 100}
	eng, err := loader.NewEngine(b, be)
	if err != nil {
		t.Fatal(err)
	}
	out, err := eng.Generate([]loader.Request{{Prompt: prompt, MaxTokens: 4, Apps: []string{"hooks"}}})
	if err != nil {
		t.Fatal(err)
	}
	res := out[0]
	ref, err := Gemma2RefFromBundle(b, w.Buffer)
	if err != nil {
		t.Fatal(err)
	}
	seq := append(append([]int{b.Manifest.Model.BOS}, prompt...), res.Tokens...)
	_, layers := ref.Forward(seq[:len(seq)-1])
	seen := 0
	for _, row := range res.Rows {
		for _, e := range row.Exports {
			want, ok := gemma2Hooks[e.Name]
			if !ok {
				t.Fatalf("export %s", e.Name)
			}
			seen++
			if err := relL2To64(e.Values, want(layers, row.Pos)); !(err <= tol) {
				t.Errorf("position %d %s: relative error %.3g > %.3g", row.Pos, e.Name, err, tol)
			}
		}
	}
	if want := len(gemma2Hooks) * (len(seq) - 1); seen != want {
		t.Fatalf("%d exports compared, want %d", seen, want)
	}
}

// CheckGemma2LensAndCustom: on Gemma 2 the logit lens at layer 1 gives the top 5 of
// softcap(head . norm(resid_post)) with the final norm's (1 + w), as the reference computes
// them; and a custom kernel doubling resid_post at layer 1 (then its renorm by (1 + w))
// gives the bits of the built-in scale there.
func CheckGemma2LensAndCustom(t *testing.T, nb NewBackend) {
	const k = 5
	lens := "app: lens\nbuffers: {top: {shape: [10], export: true}}\nops:\n" +
		"  - read: {at: {layers: [1], hook: resid_post}, kernel: logit_lens, args: {k: 5}, into: top}\n"
	custom := "app: cust\nkernels:\n  scale2:\n    entry: scale2\n" +
		"    signature: [x u64, stride u32, offset u32, width u32, ctl_mask u64, bit u32]\n" +
		"    ptx: |\n      " + strings.ReplaceAll(specs.ScaleTwoPTX, "\n", "\n      ") + "\n" +
		"ops:\n  - write: {at: {layers: [1], hook: resid_post}, kernel: custom:scale2}\n"
	builtin := "app: ref\nops:\n  - write: {at: {layers: [1], hook: resid_post}, kernel: scale, args: {alpha: 2}}\n"
	b := CompileGemma2(t, SmallGemma2, lens, custom, builtin, captureAt("resid_mid", 2, 96))
	w := NewCPU(t, b).(interface {
		loader.Backend
		Buffer(string) []byte
	})
	defer w.Close()
	probe := nb(t, b)
	tol := referenceTol(probe)
	probe.Close()
	prompt := []int{10, 20, 30, 40, 50, 60, 70}
	res := Generate(t, nb, b, []loader.Request{
		{Prompt: prompt, Apps: []string{"lens"}, MaxTokens: 4},
		{Prompt: prompt, Apps: []string{"cust", "cap"}, MaxTokens: 4},
		{Prompt: prompt, Apps: []string{"ref", "cap"}, MaxTokens: 4},
	})
	ref, err := Gemma2RefFromBundle(b, w.Buffer)
	if err != nil {
		t.Fatal(err)
	}
	seq := append(append([]int{b.Manifest.Model.BOS}, prompt...), res[0].Tokens...)
	_, layers := ref.Forward(seq[:len(seq)-1])
	head := ref.W["model.embed_tokens.weight"]
	if len(res[0].Rows) != len(seq)-1 {
		t.Fatalf("lens rows %d, want %d", len(res[0].Rows), len(seq)-1)
	}
	for _, row := range res[0].Rows {
		top := row.Exports.Get("lens.top")
		logits := linear(head, Gemma2Norm(layers[1].Out[row.Pos], ref.W["model.norm.weight"], ref.C.RMSEps))
		for i := range logits {
			logits[i] = softcap64(logits[i], ref.C.FinalSoftcap)
		}
		order := make([]int, len(logits))
		for i := range order {
			order[i] = i
		}
		slices.SortStableFunc(order, func(a, b int) int { return cmpDesc(logits[a], logits[b]) })
		for j := range k {
			want := logits[order[j]]
			if got := float64(top[k+j]); math.Abs(got-want) > tol*math.Abs(want)+1e-6 {
				t.Errorf("position %d lens pick %d: logit %v, reference %v", row.Pos, j, got, want)
			}
			// An id may differ only where the reference's own logits tie within the tolerance.
			if id := int(top[j]); id != order[j] && math.Abs(logits[id]-want) > tol*math.Abs(want)+1e-6 {
				t.Errorf("position %d lens pick %d: id %d, reference %d", row.Pos, j, id, order[j])
			}
		}
	}
	if !slices.Equal(res[1].Tokens, res[2].Tokens) {
		t.Fatalf("tokens %v with the custom kernel, %v with scale", res[1].Tokens, res[2].Tokens)
	}
	g, o := captured(res[1]), captured(res[2])
	for r := range o {
		if !slices.Equal(g[r], o[r]) {
			t.Fatalf("resid_mid(2) row %d: the custom kernel and scale differ", r)
		}
	}
}

func cmpDesc(a, b float64) int {
	switch {
	case a > b:
		return -1
	case a < b:
		return 1
	}
	return 0
}
