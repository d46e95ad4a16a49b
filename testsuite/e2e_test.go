// Package testsuite holds end-to-end tests: specs compiled by the real pipeline, bundles
// round-tripped through the .xmb format, and run by the CPU backend.
package testsuite

import (
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"xmix/bundle"
	"xmix/cmd/driver"
	"xmix/loader"
	"xmix/loader/cpu"
	"xmix/ops"
)

// smallModel is a random Llama small enough for exhaustive CPU checks. It uses GQA (4 heads,
// 2 kv heads), llama3 rope scaling, and untied embeddings.
const smallModel = `model: small
family: llama
dims: {hidden: 128, intermediate: 192, layers: 3, heads: 4, kv_heads: 2, head_dim: 32, vocab: 300,
       rope_theta: 500000, rms_eps: 1.0e-5, tie_embeddings: false,
       rope_scaling: {type: llama3, factor: 8, low_freq_factor: 1, high_freq_factor: 4, original_max_position_embeddings: 64}}
weights: {synthetic: {seed: 3, std: 0.08}}
tokenizer: bytes
bos: 256
eos: [257]
serving: {decode_buckets: [1, 2, 4], prefill_chunks: [16], max_seq_len: 128, max_seqs: 4, kv_block_size: 16}
`

// compile builds a bundle from spec texts through the real pipeline and the .xmb format.
func compile(t testing.TB, model string, apps ...string) *bundle.Bundle {
	t.Helper()
	dir := t.TempDir()
	mp := filepath.Join(dir, "model.yaml")
	if err := os.WriteFile(mp, []byte(model), 0o644); err != nil {
		t.Fatal(err)
	}
	var aps []string
	for i, a := range apps {
		p := filepath.Join(dir, "app"+string(rune('a'+i))+".yaml")
		if err := os.WriteFile(p, []byte(a), 0o644); err != nil {
			t.Fatal(err)
		}
		aps = append(aps, p)
	}
	b, err := driver.Build(mp, aps, driver.Options{Verify: true})
	if err != nil {
		t.Fatal(err)
	}
	data, err := bundle.Marshal(b)
	if err != nil {
		t.Fatal(err)
	}
	back, err := bundle.Unmarshal(data)
	if err != nil {
		t.Fatal(err)
	}
	return back
}

func newCPU(t testing.TB, b *bundle.Bundle) *cpu.Backend {
	t.Helper()
	w, err := loader.OpenWeights(b, "")
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	be, err := cpu.New(b, w, nil)
	if err != nil {
		t.Fatal(err)
	}
	return be
}

// partial runs each step only up to the node whose label starts with until, so a test can
// read the activations there.
type partial struct {
	*cpu.Backend
	until string
}

func (p partial) Step(t int) error { return p.StepUntil(t, p.until) }

func f32s(b []byte) []float32 { return ops.Arg{Mem: b}.F32() }

func randVec(r *rand.Rand, n int) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = r.Float32()*2 - 1
	}
	return v
}

func yamlList(v []float32) string {
	parts := make([]string, len(v))
	for i, x := range v {
		parts[i] = formatFloat(x)
	}
	return "[" + strings.Join(parts, ", ") + "]"
}

func formatFloat(x float32) string { return strconv.FormatFloat(float64(x), 'g', -1, 32) }

// residAfter runs prompts (row i with apps[i]) through bundle b up to node `until` of the
// prefill step and returns act.resid and the backend.
func residAfter(t *testing.T, b *bundle.Bundle, until string, prompts [][]int, apps [][]string) ([]float32, *cpu.Backend) {
	t.Helper()
	be := newCPU(t, b)
	eng, err := loader.NewEngine(b, partial{be, until})
	if err != nil {
		t.Fatal(err)
	}
	var reqs []loader.Request
	for i, p := range prompts {
		reqs = append(reqs, loader.Request{Prompt: p, Apps: apps[i], MaxTokens: 1})
	}
	if _, err := eng.Generate(reqs); err != nil {
		t.Fatal(err)
	}
	return append([]float32(nil), f32s(be.Buffer("act.resid"))...), be
}

func TestSteerAddIsExactAndOtherRowsUntouched(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	v := randVec(r, 128)
	app := `app: steer
params: {v: {values: ` + yamlList(v) + `}}
ops:
  - write: {at: {layers: [1], hook: resid_post}, kernel: steer_add, args: {vector: v, alpha: 2.5}}
`
	withApp := compile(t, smallModel, app)
	bare := compile(t, smallModel)
	prompts := [][]int{{10, 20, 30}, {10, 20, 30}}
	// slot 3 = the add+norm that ends layer 1's MLP (it holds resid_post of layer 1).
	got, _ := residAfter(t, withApp, "slot3.add_norm", prompts, [][]string{{"steer"}, nil})
	want, _ := residAfter(t, bare, "slot3.add_norm", prompts, [][]string{nil, nil})
	const H = 128
	rows := 2 * 4 // two requests of BOS + 3 tokens, packed in one prefill step
	for row := range rows {
		for i := range H {
			g, w := got[row*H+i], want[row*H+i]
			if row < 4 {
				if exp := w + float32(2.5*v[i]); g != exp {
					t.Fatalf("row %d elem %d: steered %v, want exactly %v + 2.5*%v = %v", row, i, g, w, v[i], exp)
				}
			} else if math.Float32bits(g) != math.Float32bits(w) {
				t.Fatalf("row %d elem %d (app off): %v differs from the bare bundle's %v", row, i, g, w)
			}
		}
	}
}

func TestProjectOutLeavesNoComponent(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	d := randVec(r, 128)
	app := `app: ablate
params: {d: {values: ` + yamlList(d) + `}}
ops:
  - write: {at: {layers: [0], hook: resid_mid}, kernel: project_out, args: {direction: d}}
`
	b := compile(t, smallModel, app)
	prompts := [][]int{{5, 6, 7}, {5, 6, 7}}
	// slot 0 = the add+norm after layer 0's attention (resid_mid of layer 0).
	got, _ := residAfter(t, b, "slot0.add_norm", prompts, [][]string{{"ablate"}, nil})
	var dn float64
	for _, x := range d {
		dn += float64(x) * float64(x)
	}
	for row := range 8 {
		var dot, xn float64
		for i := range 128 {
			x := float64(got[row*128+i])
			dot += x * float64(d[i])
			xn += x * x
		}
		comp := math.Abs(dot) / math.Sqrt(dn*xn)
		if row < 4 && comp > 1e-5 {
			t.Fatalf("row %d (ablated): component along d is %.3g of |x|", row, comp)
		}
		if row >= 4 && comp < 1e-3 {
			t.Fatalf("row %d (app off): component %.3g: the ablation leaked into a row without the app", row, comp)
		}
	}
}

func TestProbeLinearEqualsDotProduct(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	w := randVec(r, 128)
	app := `app: probe
params: {w: {values: ` + yamlList(w) + `}}
buffers: {score: {shape: [1], export: true}}
ops:
  - read: {at: {layers: [2], hook: resid_post}, kernel: probe_linear, args: {w: w, bias: -0.25, activation: sigmoid}, into: score}
`
	b := compile(t, smallModel, app)
	prompts := [][]int{{9, 8, 7, 6}, {1, 2}}
	got, be := residAfter(t, b, "slot5.add_norm", prompts, [][]string{{"probe"}, nil})
	scores := f32s(be.Buffer("app.probe.score"))
	for row := range 5 {
		var s float64
		for i := range 128 {
			s += float64(got[row*128+i]) * float64(w[i])
		}
		want := 1 / (1 + math.Exp(-(s - 0.25)))
		if math.Abs(float64(scores[row])-want) > 1e-5*math.Max(1, want) {
			t.Fatalf("row %d: probe %v, reference sigmoid(x·w - 0.25) = %v", row, scores[row], want)
		}
	}
}

func TestProbeScoresExportedPerToken(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	app := `app: probe
params: {w: {values: ` + yamlList(randVec(r, 128)) + `}}
buffers: {score: {shape: [1], export: true}}
ops:
  - read: {at: {layers: [1], hook: resid_post}, kernel: probe_linear, args: {w: w}, into: score}
`
	b := compile(t, smallModel, app)
	eng, err := loader.NewEngine(b, newCPU(t, b))
	if err != nil {
		t.Fatal(err)
	}
	res, err := eng.Generate([]loader.Request{
		{Prompt: []int{1, 2, 3}, Apps: []string{"probe"}, MaxTokens: 5},
		{Prompt: []int{4, 5}, MaxTokens: 5},
	})
	if err != nil {
		t.Fatal(err)
	}
	// BOS + 3 prompt rows + 4 decode rows (the 5th token is sampled but never fed back).
	if n := len(res[0].Rows); n != 8 {
		t.Fatalf("request 0 has %d rows, want 8", n)
	}
	for i, row := range res[0].Rows {
		if row.Pos != i || len(row.Exports["probe.score"]) != 1 {
			t.Fatalf("row %d: pos %d exports %v", i, row.Pos, row.Exports)
		}
	}
	for _, row := range res[1].Rows {
		if len(row.Exports) != 0 {
			t.Fatalf("request without the app got exports %v", row.Exports)
		}
	}
}

func TestBatchedRowsMatchSoloRuns(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 10))
	app := `app: steer
params: {v: {values: ` + yamlList(randVec(r, 128)) + `}}
ops:
  - write: {at: {layers: "0-2", hook: resid_post}, kernel: steer_add, args: {vector: v, alpha: 3}}
`
	b := compile(t, smallModel, app)
	reqs := []loader.Request{
		{Prompt: []int{10, 11, 12}, Apps: []string{"steer"}, MaxTokens: 8},
		{Prompt: []int{10, 11, 12}, MaxTokens: 8},
		{Prompt: []int{40, 41}, Apps: []string{"steer"}, MaxTokens: 6, Temperature: 0.9, TopP: 0.9, Seed: 4},
	}
	eng, err := loader.NewEngine(b, newCPU(t, b))
	if err != nil {
		t.Fatal(err)
	}
	batch, err := eng.Generate(reqs)
	if err != nil {
		t.Fatal(err)
	}
	if equalInts(batch[0].Tokens, batch[1].Tokens) {
		t.Fatalf("steering changed nothing: %v", batch[0].Tokens)
	}
	for i, req := range reqs {
		solo, err := eng.Generate([]loader.Request{req})
		if err != nil {
			t.Fatal(err)
		}
		if !equalInts(solo[0].Tokens, batch[i].Tokens) {
			t.Fatalf("request %d: batched %v, alone %v", i, batch[i].Tokens, solo[0].Tokens)
		}
	}
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
