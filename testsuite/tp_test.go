package testsuite

import (
	"bytes"
	"fmt"
	"slices"
	"strings"
	"testing"

	"xmix/bundle"
	"xmix/compile"
	"xmix/loader"
)

// SmallTP4 is a random Llama whose heads, KV heads, MLP columns and vocabulary all split
// into 4 equal parts.
const SmallTP4 = `model: small-tp4
family: llama
dims: {hidden: 128, intermediate: 192, layers: 2, heads: 8, kv_heads: 4, head_dim: 32, vocab: 300,
       rope_theta: 10000, rms_eps: 1.0e-5, tie_embeddings: false}
weights: {synthetic: {seed: 11, std: 0.08}}
tokenizer: bytes
bos: 256
eos: [257]
serving: {decode_buckets: [1, 2], prefill_chunks: [16], max_seq_len: 64, max_seqs: 2, kv_block_size: 16}
`

// MixtralTP4 is a random Mixtral (4 experts of 96 columns, 2 per token) that splits into 4.
const MixtralTP4 = `model: mixtral-tp4
family: mixtral
dims: {hidden: 64, intermediate: 96, layers: 2, heads: 4, kv_heads: 4, head_dim: 32, vocab: 300,
       rope_theta: 1000000, rms_eps: 1.0e-5, tie_embeddings: true, experts: 4, experts_per_token: 2}
weights: {synthetic: {seed: 12, std: 0.08}}
tokenizer: bytes
bos: 256
eos: [257]
serving: {decode_buckets: [1, 2], prefill_chunks: [16], max_seq_len: 64, max_seqs: 2, kv_block_size: 16}
`

// tpApps are apps at every kind of site tensor parallelism treats differently: a write and
// a read on the residual stream (after an all-reduce), head_ablate of the first head and
// of the last (on the first and the last rank), and a read of the whole logits (after the
// all-gather).
func tpApps(hidden, heads, vocab int) []string {
	return []string{
		`app: steer
params: {v: {values: ` + yamlList(randVec(21, hidden)) + `}}
ops:
  - write: {at: {layers: [1], hook: resid_post}, kernel: steer_add, args: {vector: v, alpha: 2}}
`, `app: probe
params: {w: {values: ` + yamlList(randVec(22, hidden)) + `}}
buffers: {score: {shape: [1], export: true}}
ops:
  - read: {at: {layers: [0], hook: resid_post}, kernel: probe_linear, args: {w: w, bias: -0.1, activation: sigmoid}, into: score}
`, fmt.Sprintf(`app: ablate
ops:
  - write: {at: {layers: [0], hook: attn.z}, kernel: head_ablate, args: {head: %d}}
  - write: {at: {layers: [1], hook: attn.z}, kernel: head_ablate, args: {head: 0}}
`, heads-1), fmt.Sprintf(`app: lg
buffers: {x: {shape: [%d], export: true}}
ops:
  - read: {at: {hook: logits}, kernel: capture, into: x}
`, vocab)}
}

// tpRun is what a bundle produced for the test's requests: tokens, the first sample's
// logits at every step, and every export row.
type tpRun struct {
	tokens  [][]int
	logits  [][]float32
	exports map[string][]float32 // "request/row/export" -> values
}

func runTP(t *testing.T, b *bundle.Bundle) tpRun {
	t.Helper()
	be := NewCPU(t, b)
	rec := &LogitRecorder{Backend: be, Vocab: b.Manifest.Model.Vocab}
	eng, err := loader.NewEngine(b, rec)
	if err != nil {
		t.Fatal(err)
	}
	res, err := eng.Generate([]loader.Request{
		{Prompt: []int{72, 101, 108, 108, 111}, Apps: []string{"steer", "probe", "ablate", "lg"}, MaxTokens: 6},
		{Prompt: []int{84, 104, 101}, Apps: []string{"probe"}, MaxTokens: 6},
	})
	if err != nil {
		t.Fatal(err)
	}
	out := tpRun{logits: rec.Steps, exports: map[string][]float32{}}
	for i, r := range res {
		out.tokens = append(out.tokens, r.Tokens)
		for j, row := range r.Rows {
			for _, x := range row.Exports {
				out.exports[fmt.Sprintf("request %d/row %d/%s", i, j, x.Name)] = x.Values
			}
		}
	}
	return out
}

func buildTP(t *testing.T, model string, apps []string, tp int) *bundle.Bundle {
	t.Helper()
	b, err := compile.Build(model, apps, compile.Options{Verify: true, TP: tp})
	if err != nil {
		t.Fatal(err)
	}
	if got := b.Manifest.TP; (tp > 1) != (got == tp) {
		t.Fatalf("--tp %d built a bundle of tp %d", tp, got)
	}
	return roundTrip(t, b)
}

// TestTensorParallelMatchesOneDevice: at tp 2 and 4 (each rank a goroutine of the CPU
// backend, exchanging through the in-process all-reduce and all-gather) the embedded
// model, a Llama, a Mixtral, a Qwen2 and a Gemma 2 give the tokens, logits and app exports of tp 1, to float
// rounding (the row-parallel sums are added in another order).
func TestTensorParallelMatchesOneDevice(t *testing.T) {
	small, smallApps := WriteSpecs(t, SmallTP4, tpApps(128, 8, 300)...)
	mixtral, mixtralApps := WriteSpecs(t, MixtralTP4, tpApps(64, 4, 300)...)
	_, tinyApps := WriteSpecs(t, "", tpApps(256, 8, 258)...)
	qwen2, qwen2Apps := WriteSpecs(t, SmallQwen2, tpApps(96, 4, 300)...)
	gemma2, gemma2Apps := WriteSpecs(t, SmallGemma2, tpApps(96, 4, 300)...)
	for _, c := range []struct {
		name  string
		model string
		apps  []string
		tps   []int
	}{
		{"tiny", "../specs/models/tiny.yaml", tinyApps, []int{2}}, // kv_heads 2, vocab 258: 2 at most
		{"llama", small, smallApps, []int{2, 4}},
		{"mixtral", mixtral, mixtralApps, []int{2, 4}},
		{"qwen2", qwen2, qwen2Apps, []int{2}}, // q/k/v biases cut with the heads; synthetic tied LM head
		// Post-norms replicated, the logits' soft-cap after the all-gather, head dim 256.
		{"gemma2", gemma2, gemma2Apps, []int{2}},
	} {
		t.Run(c.name, func(t *testing.T) {
			ref := runTP(t, buildTP(t, c.model, c.apps, 1))
			if len(ref.exports) == 0 || len(ref.logits) == 0 {
				t.Fatal("the reference run recorded nothing")
			}
			for _, tp := range c.tps {
				got := runTP(t, buildTP(t, c.model, c.apps, tp))
				for i := range ref.tokens {
					if !slices.Equal(got.tokens[i], ref.tokens[i]) {
						t.Errorf("tp %d request %d: tokens %v, tp 1 %v", tp, i, got.tokens[i], ref.tokens[i])
					}
				}
				if len(got.logits) != len(ref.logits) {
					t.Fatalf("tp %d: %d steps, tp 1 %d", tp, len(got.logits), len(ref.logits))
				}
				for s := range ref.logits {
					if e := RelL2(got.logits[s], ref.logits[s]); e > 1e-4 {
						t.Errorf("tp %d step %d: logits rel L2 %.2g from tp 1", tp, s, e)
					}
				}
				if len(got.exports) != len(ref.exports) {
					t.Errorf("tp %d: %d export rows, tp 1 %d", tp, len(got.exports), len(ref.exports))
				}
				for k, want := range ref.exports {
					if e := RelL2(got.exports[k], want); len(got.exports[k]) != len(want) || e > 1e-4 {
						t.Errorf("tp %d %s: %v, tp 1 %v", tp, k, got.exports[k], want)
					}
				}
			}
		})
	}
}

// TestTensorParallelRefuses: dimensions that do not split, and hooks whose activation the
// ranks hold in parts, fail the build with the spec position and the reason.
func TestTensorParallelRefuses(t *testing.T) {
	for _, c := range []struct {
		name string
		tp   int
		app  string
		want []string
	}{
		{"kv heads", 4, "", []string{"model.yaml:1:1: tensor parallelism 4: kv_heads 2 is not divisible by 4", "build with --tp 1 or 2"}},
		{"query heads read", 2, captureAt("attn.q", 0, 128),
			[]string{"app0.yaml:4:5: capture at hook attn.q is not supported at tensor parallelism 2: each rank holds heads/tp of the query heads"}},
		{"mlp.act write", 2, `app: s
ops:
  - write: {at: {layers: [0], hook: mlp.act}, kernel: scale, args: {alpha: 2}}
`, []string{"app0.yaml:3:5: scale at hook mlp.act is not supported", "intermediate/tp of the MLP columns"}},
		{"attn.z read", 2, captureAt("attn.z", 1, 128), []string{"capture at hook attn.z is not supported"}},
		{"logit lens", 2, `app: lens
buffers: {top: {shape: [4], export: true}}
ops:
  - read: {at: {layers: [0], hook: resid_post}, kernel: logit_lens, args: {k: 2}, into: top}
`, []string{"logit_lens at hook resid_post is not supported", "cuts by vocabulary rows"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			var apps []string
			if c.app != "" {
				apps = []string{c.app}
			}
			mp, aps := WriteSpecs(t, SmallModel, apps...)
			_, err := compile.Build(mp, aps, compile.Options{TP: c.tp})
			if err == nil {
				t.Fatal("built")
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
		})
	}
}

// TestTP1IsTheOneDeviceBundle: --tp 1 changes no byte of a bundle.
func TestTP1IsTheOneDeviceBundle(t *testing.T) {
	mp, aps := WriteSpecs(t, SmallModel, tpApps(128, 4, 300)...)
	var out [][]byte
	for _, tp := range []int{0, 1} {
		b, err := compile.Build(mp, aps, compile.Options{TP: tp})
		if err != nil {
			t.Fatal(err)
		}
		data, err := bundle.Marshal(b)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, data)
	}
	if !bytes.Equal(out[0], out[1]) {
		t.Fatal("--tp 1 wrote a different bundle than no --tp")
	}
}
