// Package testsuite holds the end-to-end checks: specs compiled by the real pipeline,
// bundles round-tripped through the .xmb format, run by a backend. The same checks run
// against every backend: the CPU one in `go test`, the CUDA one on the GPU machine
// (testsuite/gpu).
package testsuite

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"xmix/bundle"
	"xmix/compile"
	"xmix/loader"
	"xmix/loader/cpu"
	"xmix/ops"
	"xmix/specs"
)

// SmallModel is a random Llama small enough for exhaustive CPU checks. It uses GQA (4
// heads, 2 kv heads), llama3 rope scaling, and untied embeddings.
const SmallModel = `model: small
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

// SmallQwen2 is a random Qwen2 (q/k/v biases): GQA, head_dim 32 apart from hidden/heads.
const SmallQwen2 = `model: small-qwen2
family: qwen2
dims: {hidden: 96, intermediate: 160, layers: 2, heads: 4, kv_heads: 2, head_dim: 32, vocab: 300,
       rope_theta: 1000000, rms_eps: 1.0e-6, tie_embeddings: true}
weights: {synthetic: {seed: 5, std: 0.08}}
tokenizer: bytes
bos: 256
eos: [257]
serving: {decode_buckets: [1, 2], prefill_chunks: [16], max_seq_len: 64, max_seqs: 2, kv_block_size: 16}
`

// SmallQwen3 is a random Qwen3 (per-head QK-norm, rms eps 1e-6, untied embeddings).
const SmallQwen3 = `model: small-qwen3
family: qwen3
dims: {hidden: 128, intermediate: 192, layers: 2, heads: 4, kv_heads: 1, head_dim: 64, vocab: 300,
       rope_theta: 1000000, rms_eps: 1.0e-6, tie_embeddings: false}
weights: {synthetic: {seed: 6, std: 0.08}}
tokenizer: bytes
bos: 256
eos: [257]
serving: {decode_buckets: [1, 2], prefill_chunks: [16], max_seq_len: 64, max_seqs: 2, kv_block_size: 16}
`

// SmallMixtral is a random Mixtral: 4 experts of 96 columns, 2 per token, GQA.
const SmallMixtral = `model: small-mixtral
family: mixtral
dims: {hidden: 64, intermediate: 96, layers: 2, heads: 4, kv_heads: 2, head_dim: 32, vocab: 300,
       rope_theta: 1000000, rms_eps: 1.0e-5, tie_embeddings: false, experts: 4, experts_per_token: 2}
weights: {synthetic: {seed: 8, std: 0.08}}
tokenizer: bytes
bos: 256
eos: [257]
serving: {decode_buckets: [1, 2], prefill_chunks: [16], max_seq_len: 64, max_seqs: 2, kv_block_size: 16}
`

// NewBackend loads a bundle on the backend under test.
type NewBackend func(t testing.TB, b *bundle.Bundle) loader.Backend

// NewCPU loads a bundle on the CPU backend.
func NewCPU(t testing.TB, b *bundle.Bundle) loader.Backend {
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

// RepoRoot is the folder of the go.mod above the working directory (a test's package folder).
func RepoRoot(t testing.TB) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		up := filepath.Dir(dir)
		if up == dir {
			t.Fatal("no go.mod above the working directory")
		}
		dir = up
	}
}

// SpecCut is the shipped spec of model (specs/models/MODEL.yaml) cut to 2 layers, with
// serving as its serving section. Any package's tests may call it.
func SpecCut(t testing.TB, model, serving string) string {
	t.Helper()
	spec, err := os.ReadFile(filepath.Join(RepoRoot(t), "specs", "models", model+".yaml"))
	if err != nil {
		t.Fatal(err)
	}
	cut := regexp.MustCompile(`layers: \d+`).ReplaceAllString(string(spec), "layers: 2")
	return regexp.MustCompile(`(?s)serving:.*`).ReplaceAllString(cut, serving)
}

// CutServing is a serving section for SpecCut: decode buckets of rows rows each (as many
// sequences as the last), 64-row prefill chunks, 256 positions, KV blocks of 16.
func CutServing(rows ...int) string {
	list := make([]string, len(rows))
	for i, r := range rows {
		list[i] = strconv.Itoa(r)
	}
	return fmt.Sprintf("serving: {decode_buckets: [%s], prefill_chunks: [64], max_seq_len: 256, max_seqs: %d, kv_block_size: 16}\n", strings.Join(list, ", "), rows[len(rows)-1])
}

// CheckpointTokenizer writes the tokenizer.json and tokenizer_config.json of tokenizer
// testdata name (tokenizer/testdata: llama3_1, qwen3) into a fresh directory, as they sit
// beside a checkpoint, and returns the tokenizer.json's path. Any package's tests may call it.
func CheckpointTokenizer(t testing.TB, name string) string {
	t.Helper()
	dir := RepoRoot(t)
	testdata := filepath.Join(dir, "tokenizer", "testdata")
	gz, err := os.ReadFile(filepath.Join(testdata, name+".tokenizer.json.gz"))
	if err != nil {
		t.Fatal(err)
	}
	zr, err := gzip.NewReader(bytes.NewReader(gz))
	if err != nil {
		t.Fatal(err)
	}
	tok, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := os.ReadFile(filepath.Join(testdata, name+".tokenizer_config.json"))
	if err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	path := filepath.Join(out, "tokenizer.json")
	if err := os.WriteFile(path, tok, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(out, "tokenizer_config.json"), cfg, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// Compile builds a bundle from spec texts through the real pipeline and the .xmb format.
func Compile(t testing.TB, model string, apps ...string) *bundle.Bundle {
	t.Helper()
	return CompileWith(t, compile.Options{}, model, apps...)
}

// Fuse, when set, names the fusions (compile.Options.Fuse) of every bundle Compile and
// CompileWith build whose options name none (nil; an empty list builds without fusions):
// the suite runs again on fused bundles (TestCPUFused; the GPU suite takes it from
// XMIX_FUSE).
var Fuse []string

// SerialLaunch, when set, builds every bundle of Compile and CompileWith without programmatic
// dependent launch (compile.Options.SerialLaunch; the GPU suite takes it from XMIX_SERIAL=1).
var SerialLaunch bool

// Prefetch, when not 0, is compile.Options.Prefetch of every bundle of Compile and CompileWith
// whose options leave it 0 (the GPU suite takes it from XMIX_PREFETCH).
var Prefetch int

// AttnPrefetch, when not 0, is compile.Options.AttnPrefetch of every bundle of Compile and
// CompileWith whose options leave it 0 (the GPU suite takes it from XMIX_ATTN_PREFETCH).
var AttnPrefetch int

// CompileWith is Compile with build options (Verify is always on).
func CompileWith(t testing.TB, opt compile.Options, model string, apps ...string) *bundle.Bundle {
	t.Helper()
	mp, aps := WriteSpecs(t, model, apps...)
	opt.Verify = true
	if opt.Fuse == nil {
		opt.Fuse = Fuse
	}
	opt.SerialLaunch = opt.SerialLaunch || SerialLaunch
	if opt.Prefetch == 0 {
		opt.Prefetch = Prefetch
	}
	if opt.AttnPrefetch == 0 {
		opt.AttnPrefetch = AttnPrefetch
	}
	b, err := compile.Build(mp, aps, opt)
	if err != nil {
		t.Fatal(err)
	}
	return roundTrip(t, b)
}

// WriteSpecs writes spec texts to a temporary directory as model.yaml and app0.yaml,
// app1.yaml, ... and returns their paths.
func WriteSpecs(t testing.TB, model string, apps ...string) (modelPath string, appPaths []string) {
	t.Helper()
	dir := t.TempDir()
	modelPath = filepath.Join(dir, "model.yaml")
	if err := os.WriteFile(modelPath, []byte(model), 0o644); err != nil {
		t.Fatal(err)
	}
	for i, a := range apps {
		p := filepath.Join(dir, "app"+strconv.Itoa(i)+".yaml")
		if err := os.WriteFile(p, []byte(a), 0o644); err != nil {
			t.Fatal(err)
		}
		appPaths = append(appPaths, p)
	}
	return modelPath, appPaths
}

func roundTrip(t testing.TB, b *bundle.Bundle) *bundle.Bundle {
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

// Generate runs requests on a fresh backend for b.
func Generate(t testing.TB, nb NewBackend, b *bundle.Bundle, reqs []loader.Request) []loader.Result {
	t.Helper()
	be := nb(t, b)
	defer be.Close()
	eng, err := loader.NewEngine(b, be)
	if err != nil {
		t.Fatal(err)
	}
	res, err := eng.Generate(reqs)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func randVec(seed uint64, n int) []float32 {
	r := rand.New(rand.NewPCG(seed, 7))
	v := make([]float32, n)
	for i := range v {
		v[i] = r.Float32()*2 - 1
	}
	return v
}

func yamlList(v []float32) string {
	parts := make([]string, len(v))
	for i, x := range v {
		parts[i] = strconv.FormatFloat(float64(x), 'g', -1, 32)
	}
	return "[" + strings.Join(parts, ", ") + "]"
}

// captureApp reads the residual at resid_post of layer into buffer "x".
func captureApp(layer, hidden int) string { return captureAt("resid_post", layer, hidden) }

// captureAt reads hook of layer, width values per row, into buffer "x" of app "cap".
func captureAt(hook string, layer, width int) string {
	return fmt.Sprintf(`app: cap
buffers: {x: {shape: [%d], export: true}}
ops:
  - read: {at: {layers: [%d], hook: %s}, kernel: capture, into: x}
`, width, layer, hook)
}

// captured returns the rows of export "cap.x" of a result.
func captured(r loader.Result) [][]float32 {
	var out [][]float32
	for _, row := range r.Rows {
		out = append(out, row.Exports.Get("cap.x"))
	}
	return out
}

// CheckSteerExact: with steer_add at resid_post of layer 1 enabled for one request, that
// request's residual there changes by exactly alpha*v; a request without the app is
// bit-identical to the same request in a bundle compiled without the app.
func CheckSteerExact(t *testing.T, nb NewBackend) {
	v := randVec(1, 128)
	steer := `app: steer
params: {v: {values: ` + yamlList(v) + `}}
ops:
  - write: {at: {layers: [1], hook: resid_post}, kernel: steer_add, args: {vector: v, alpha: 2.5}}
`
	withApp := Compile(t, SmallModel, steer, captureApp(1, 128))
	bare := Compile(t, SmallModel, captureApp(1, 128))
	prompt := []int{10, 20, 30}
	a := Generate(t, nb, withApp, []loader.Request{
		{Prompt: prompt, Apps: []string{"steer", "cap"}, MaxTokens: 4},
		{Prompt: prompt, Apps: []string{"cap"}, MaxTokens: 4},
	})
	b := Generate(t, nb, bare, []loader.Request{{Prompt: prompt, Apps: []string{"cap"}, MaxTokens: 4}})
	steered, other, ref := captured(a[0]), captured(a[1]), captured(b[0])
	if len(ref) != 7 || len(steered) != 7 || len(other) != 7 {
		t.Fatalf("captured %d/%d/%d rows, want 7 (BOS + 3 prompt + 3 decode)", len(steered), len(other), len(ref))
	}
	// Prompt rows see identical inputs; after that the steered request generates its own
	// tokens, so only its prompt rows are compared with the reference.
	for row := range 4 {
		for i, w := range ref[row] {
			if exp := w + float32(2.5*v[i]); steered[row][i] != exp {
				t.Fatalf("row %d elem %d: steered %v, want exactly %v + 2.5*%v = %v", row, i, steered[row][i], w, v[i], exp)
			}
		}
	}
	for row := range ref {
		for i, w := range ref[row] {
			if math.Float32bits(other[row][i]) != math.Float32bits(w) {
				t.Fatalf("row %d elem %d (app off): %v differs from the bare bundle's %v", row, i, other[row][i], w)
			}
		}
	}
	if !slices.Equal(a[1].Tokens, b[0].Tokens) {
		t.Fatalf("request without the app: tokens %v, bare bundle %v", a[1].Tokens, b[0].Tokens)
	}
}

// CheckProjectOut: directional ablation leaves no component along the direction.
func CheckProjectOut(t *testing.T, nb NewBackend) {
	d := randVec(2, 128)
	ablate := `app: ablate
params: {d: {values: ` + yamlList(d) + `}}
ops:
  - write: {at: {layers: [1], hook: resid_post}, kernel: project_out, args: {direction: d}}
`
	b := Compile(t, SmallModel, ablate, captureApp(1, 128))
	res := Generate(t, nb, b, []loader.Request{
		{Prompt: []int{5, 6, 7}, Apps: []string{"ablate", "cap"}, MaxTokens: 3},
		{Prompt: []int{5, 6, 7}, Apps: []string{"cap"}, MaxTokens: 3},
	})
	for k, r := range res {
		for row, x := range captured(r) {
			comp := component(x, d)
			if k == 0 && comp > 1e-5 {
				t.Fatalf("row %d (ablated): component along d is %.3g of |x|", row, comp)
			}
			if k == 1 && comp < 1e-3 {
				t.Fatalf("row %d (app off): component %.3g: the ablation leaked into a request without the app", row, comp)
			}
		}
	}
}

func component(x, d []float32) float64 {
	var dot, xn, dn float64
	for i := range x {
		dot += float64(x[i]) * float64(d[i])
		xn += float64(x[i]) * float64(x[i])
		dn += float64(d[i]) * float64(d[i])
	}
	return math.Abs(dot) / math.Sqrt(xn*dn)
}

// writeRun compiles app (named name) followed by capture, and capture alone, and runs prompt
// for MaxTokens 4 with and without the app on the first bundle and without it on the second.
// It checks that the request without the app is bit-identical to the bare bundle, rows and
// tokens, and returns the captured rows with the app and on the bare bundle (BOS + prompt
// rows first; later rows follow each request's own tokens).
func writeRun(t *testing.T, nb NewBackend, name, app, capture string) (with, ref [][]float32) {
	t.Helper()
	withApp := Compile(t, SmallModel, app, capture)
	bare := Compile(t, SmallModel, capture)
	prompt := []int{10, 20, 30}
	a := Generate(t, nb, withApp, []loader.Request{
		{Prompt: prompt, Apps: []string{name, "cap"}, MaxTokens: 4},
		{Prompt: prompt, Apps: []string{"cap"}, MaxTokens: 4},
	})
	b := Generate(t, nb, bare, []loader.Request{{Prompt: prompt, Apps: []string{"cap"}, MaxTokens: 4}})
	with, other, ref := captured(a[0]), captured(a[1]), captured(b[0])
	if len(ref) != 7 || len(with) != 7 || len(other) != 7 {
		t.Fatalf("captured %d/%d/%d rows, want 7 (BOS + 3 prompt + 3 decode)", len(with), len(other), len(ref))
	}
	for row := range ref {
		for i, w := range ref[row] {
			if math.Float32bits(other[row][i]) != math.Float32bits(w) {
				t.Fatalf("%s: row %d elem %d (app off): %v differs from the bare bundle's %v", name, row, i, other[row][i], w)
			}
		}
	}
	if !slices.Equal(a[1].Tokens, b[0].Tokens) {
		t.Fatalf("%s: request without the app: tokens %v, bare bundle %v", name, a[1].Tokens, b[0].Tokens)
	}
	return with, ref
}

// promptRows is how many leading captured rows writeRun's requests share: BOS + 3 prompt.
const promptRows = 4

func unit64(v []float32) []float64 {
	var n float64
	for _, x := range v {
		n += float64(x) * float64(x)
	}
	u := make([]float64, len(v))
	for i, x := range v {
		u[i] = float64(x) / math.Sqrt(n)
	}
	return u
}

func dotU(x []float32, d []float64) float64 {
	var s float64
	for i := range x {
		s += float64(x[i]) * d[i]
	}
	return s
}

// checkMovedAlong checks that a row got from ref by moving it along the unit d to projection
// target: within 1e-5 of ref + (target - ref·d) d in relative L2, and projection within 1e-5.
func checkMovedAlong(t *testing.T, what string, row int, got, ref []float32, d []float64, target float64) {
	t.Helper()
	p := dotU(ref, d)
	want := make([]float32, len(ref))
	for i := range ref {
		want[i] = float32(float64(ref[i]) + (target-p)*d[i])
	}
	if e := RelL2(got, want); e > 1e-5 {
		t.Fatalf("%s: row %d moved off the direction: relative L2 %.3g from ref + (%.4g - %.4g) d", what, row, e, target, p)
	}
	if q := dotU(got, d); math.Abs(q-target) > 1e-5*math.Max(1, math.Abs(target)) {
		t.Fatalf("%s: row %d projection %v, want %v", what, row, q, target)
	}
}

// CheckSteerSet: steer_set leaves the residual's projection on d at value, moving it along
// d only.
func CheckSteerSet(t *testing.T, nb NewBackend) {
	v := randVec(5, 128)
	app := `app: set
params: {d: {values: ` + yamlList(v) + `}}
ops:
  - write: {at: {layers: [1], hook: resid_post}, kernel: steer_set, args: {direction: d, value: 0.75}}
`
	with, ref := writeRun(t, nb, "set", app, captureApp(1, 128))
	d := unit64(v)
	for row := range with {
		if q := dotU(with[row], d); math.Abs(q-0.75) > 1e-5 {
			t.Fatalf("row %d: projection %v after steer_set, want 0.75", row, q)
		}
	}
	for row := range promptRows {
		checkMovedAlong(t, "steer_set", row, with[row], ref[row], d, 0.75)
	}
}

// CheckClampProjection: clamp_projection clamps the projection on d into [min, max] and
// leaves rows inside unchanged.
func CheckClampProjection(t *testing.T, nb NewBackend) {
	v := randVec(6, 128)
	// The prompt rows' projections on d are about 0.18, 0.54, 1.49 and 2.44.
	const lo, hi = 0.4, 2
	app := fmt.Sprintf(`app: clamp
params: {d: {values: %s}}
ops:
  - write: {at: {layers: [1], hook: resid_post}, kernel: clamp_projection, args: {direction: d, min: %v, max: %v}}
`, yamlList(v), lo, hi)
	with, ref := writeRun(t, nb, "clamp", app, captureApp(1, 128))
	d := unit64(v)
	var below, above, inside int
	for row := range promptRows {
		p := dotU(ref[row], d)
		switch {
		case p < lo:
			below++
		case p > hi:
			above++
		default:
			inside++
		}
		checkMovedAlong(t, "clamp_projection", row, with[row], ref[row], d, math.Min(math.Max(p, lo), hi))
	}
	for row := range with {
		if q := dotU(with[row], d); q < lo-1e-5 || q > hi+1e-5 {
			t.Fatalf("row %d: projection %v outside [%v, %v]", row, q, lo, hi)
		}
	}
	if below == 0 || above == 0 || inside == 0 {
		t.Fatalf("prompt rows %d below, %d above, %d inside the bounds: the check does not cover every case", below, above, inside)
	}
}

// CheckScale: scale by alpha, then by a vector, is exact: fl(fl(x*alpha)*f[i]).
func CheckScale(t *testing.T, nb NewBackend) {
	f := randVec(7, 128)
	app := `app: scale
params: {f: {values: ` + yamlList(f) + `}}
ops:
  - write: {at: {layers: [1], hook: resid_post}, kernel: scale, args: {alpha: 0.5}}
  - write: {at: {layers: [1], hook: resid_post}, kernel: scale, args: {vector: f}}
`
	with, ref := writeRun(t, nb, "scale", app, captureApp(1, 128))
	for row := range promptRows {
		for i, x := range ref[row] {
			if want := x * 0.5 * f[i]; math.Float32bits(with[row][i]) != math.Float32bits(want) {
				t.Fatalf("row %d elem %d: scaled %v, want exactly %v * 0.5 * %v = %v", row, i, with[row][i], x, f[i], want)
			}
		}
	}
}

// CheckHeadAblate: head_ablate at attn.z (served by the standalone MI kernel over act.z)
// zeroes one head's slice and leaves the other heads bit-identical.
func CheckHeadAblate(t *testing.T, nb NewBackend) {
	const head, headDim = 2, 32
	app := fmt.Sprintf(`app: ablate
ops:
  - write: {at: {layers: [1], hook: attn.z}, kernel: head_ablate, args: {head: %d}}
`, head)
	with, ref := writeRun(t, nb, "ablate", app, captureAt("attn.z", 1, 4*headDim))
	for row := range with {
		for i := head * headDim; i < (head+1)*headDim; i++ {
			if with[row][i] != 0 {
				t.Fatalf("row %d: ablated head %d has %v at %d", row, head, with[row][i], i)
			}
		}
	}
	nonzero := false
	for row := range promptRows {
		for i, x := range ref[row] {
			inHead := i >= head*headDim && i < (head+1)*headDim
			if !inHead && math.Float32bits(with[row][i]) != math.Float32bits(x) {
				t.Fatalf("row %d elem %d outside head %d: %v, bare %v", row, i, head, with[row][i], x)
			}
			nonzero = nonzero || (inHead && x != 0)
		}
	}
	if !nonzero {
		t.Fatal("head's slice is zero in the bare bundle too: the check shows nothing")
	}
}

// CheckPatch: patch under `when: positions: generated` writes the saved vector into every
// generated row and leaves prompt rows bit-identical.
func CheckPatch(t *testing.T, nb NewBackend) {
	saved := randVec(8, 128)
	app := `app: patch
params: {s: {values: ` + yamlList(saved) + `}}
ops:
  - write: {at: {layers: [1], hook: resid_post}, kernel: patch, args: {vector: s}, when: {positions: generated}}
`
	with, ref := writeRun(t, nb, "patch", app, captureApp(1, 128))
	for row := range with {
		for i := range saved {
			want := saved[i]
			if row < promptRows {
				want = ref[row][i]
			}
			if math.Float32bits(with[row][i]) != math.Float32bits(want) {
				t.Fatalf("row %d elem %d: %v, want exactly %v (generated row: %v)", row, i, with[row][i], want, row >= promptRows)
			}
		}
	}
}

// CheckProbe: probe_linear equals the reference dot product of the residual it reads.
func CheckProbe(t *testing.T, nb NewBackend) {
	w := randVec(3, 128)
	probe := `app: probe
params: {w: {values: ` + yamlList(w) + `}}
buffers: {score: {shape: [1], export: true}}
ops:
  - read: {at: {layers: [1], hook: resid_post}, kernel: probe_linear, args: {w: w, bias: -0.25, activation: sigmoid}, into: score}
`
	b := Compile(t, SmallModel, captureApp(1, 128), probe)
	res := Generate(t, nb, b, []loader.Request{{Prompt: []int{9, 8, 7, 6}, Apps: []string{"cap", "probe"}, MaxTokens: 4}})
	for i, row := range res[0].Rows {
		x := row.Exports.Get("cap.x")
		var s float64
		for j := range x {
			s += float64(x[j]) * float64(w[j])
		}
		want := 1 / (1 + math.Exp(-(s - 0.25)))
		got := float64(row.Exports.Get("probe.score")[0])
		if math.Abs(got-want) > 1e-5*math.Max(1, want) {
			t.Fatalf("row %d: probe %v, reference sigmoid(x·w - 0.25) = %v", i, got, want)
		}
	}
	if len(res[0].Rows) != 8 {
		t.Fatalf("%d rows exported, want 8 (BOS + 4 prompt + 3 decode)", len(res[0].Rows))
	}
}

// CheckBatchMatchesSolo: each request of a batch mixing apps and sampling settings gets
// exactly what it gets alone.
func CheckBatchMatchesSolo(t *testing.T, nb NewBackend) {
	steer := `app: steer
params: {v: {values: ` + yamlList(randVec(4, 128)) + `}}
ops:
  - write: {at: {layers: "0-2", hook: resid_post}, kernel: steer_add, args: {vector: v, alpha: 3}}
`
	b := Compile(t, SmallModel, steer)
	reqs := []loader.Request{
		{Prompt: []int{10, 11, 12}, Apps: []string{"steer"}, MaxTokens: 8},
		{Prompt: []int{10, 11, 12}, MaxTokens: 8},
		{Prompt: []int{40, 41}, Apps: []string{"steer"}, MaxTokens: 6, Temperature: 0.9, TopP: 0.9, Seed: 4},
	}
	batch := Generate(t, nb, b, reqs)
	if slices.Equal(batch[0].Tokens, batch[1].Tokens) {
		t.Fatalf("steering changed nothing: %v", batch[0].Tokens)
	}
	for i, req := range reqs {
		solo := Generate(t, nb, b, []loader.Request{req})
		if !slices.Equal(solo[0].Tokens, batch[i].Tokens) {
			t.Fatalf("request %d: batched %v, alone %v", i, batch[i].Tokens, solo[0].Tokens)
		}
	}
}

// AppRowsKeepBits runs one request per prompt for steps tokens on with (a bundle with the app
// named app) and on bare (the same without it), every other request enabling the app: the
// requests without it must get the bare bundle's tokens and logprobs bit for bit, and the app
// must change some request's (else the check could not see a lost op). Each request's tokens
// and their logprobs are compared, not step rows: the decode rows' order is the engine's.
func AppRowsKeepBits(t testing.TB, nb NewBackend, with, bare *bundle.Bundle, app string, prompts [][]int, steps int) {
	t.Helper()
	run := func(b *bundle.Bundle, apps []string) []loader.Result {
		var reqs []loader.Request
		for i, p := range prompts {
			r := loader.Request{Prompt: p, MaxTokens: steps, Logprobs: true}
			if i%2 == 0 {
				r.Apps = apps
			}
			reqs = append(reqs, r)
		}
		return Generate(t, nb, b, reqs)
	}
	got, want := run(with, []string{app}), run(bare, nil)
	changed := false
	for i := range prompts {
		same := slices.Equal(got[i].Tokens, want[i].Tokens) && reflect.DeepEqual(got[i].Logprobs, want[i].Logprobs)
		if i%2 == 1 && !same {
			t.Fatalf("request %d, without the app: tokens %v, logprobs %v; the bare bundle's %v, %v", i, got[i].Tokens, got[i].Logprobs, want[i].Tokens, want[i].Logprobs)
		}
		changed = changed || i%2 == 0 && !same
	}
	if !changed {
		t.Fatal("the app changed no request's tokens or logprobs")
	}
}

// LogitRecorder wraps a backend and keeps the first sample's logits after every step.
type LogitRecorder struct {
	loader.Backend
	Vocab int
	Steps [][]float32
}

// Step implements loader.Backend.
func (r *LogitRecorder) Step(t int) error {
	if err := r.Backend.Step(t); err != nil {
		return err
	}
	raw := make([]byte, 4*r.Vocab)
	if err := r.Backend.Read(bundle.ActLogits, raw); err != nil {
		return err
	}
	r.Steps = append(r.Steps, append([]float32(nil), ops.Arg{Mem: raw}.F32()...))
	return nil
}

// RelL2 is |a-b|/|b|.
func RelL2(a, b []float32) float64 {
	var num, den float64
	for i := range b {
		d := float64(a[i]) - float64(b[i])
		num += d * d
		den += float64(b[i]) * float64(b[i])
	}
	if den == 0 {
		// b is all zeros (the logits of a prefill step that samples no row): the absolute
		// error, 0 when a is zero too.
		return math.Sqrt(num)
	}
	return math.Sqrt(num / den)
}

// CheckContinuousBatching: more requests than sequence slots, of different lengths, join and
// leave the running batch at step boundaries; each gets what it gets alone.
func CheckContinuousBatching(t *testing.T, nb NewBackend) {
	b := Compile(t, SmallModel)
	var reqs []loader.Request
	for i := range 7 {
		prompt := make([]int, 3+5*i) // 3..33 tokens: some prompts span two prefill chunks
		for j := range prompt {
			prompt[j] = (i*31 + j*7) % 256
		}
		reqs = append(reqs, loader.Request{Prompt: prompt, MaxTokens: 4 + 3*(i%3)})
	}
	be := nb(t, b)
	defer be.Close()
	eng, err := loader.NewEngine(b, be)
	if err != nil {
		t.Fatal(err)
	}
	batch, err := eng.Generate(reqs)
	if err != nil {
		t.Fatal(err)
	}
	if eng.Stats.DecodeSteps == 0 || eng.Stats.PrefillSteps < 2 {
		t.Fatalf("stats %+v: expected several prefill and decode steps", eng.Stats)
	}
	for i, req := range reqs {
		solo, err := eng.Generate([]loader.Request{req})
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(solo[0].Tokens, batch[i].Tokens) || len(batch[i].Tokens) != req.MaxTokens {
			t.Fatalf("request %d: batched %v, alone %v (want %d tokens)", i, batch[i].Tokens, solo[0].Tokens, req.MaxTokens)
		}
	}
}

// Checks is the end-to-end suite every backend runs (TestCPU here, testsuite/gpu on the GPU).
var Checks = []struct {
	Name string
	Run  func(*testing.T, NewBackend)
}{
	{"steer_add_exact", CheckSteerExact},
	{"project_out_zero", CheckProjectOut},
	{"probe_linear_dot", CheckProbe},
	{"steer_set", CheckSteerSet},
	{"clamp_projection", CheckClampProjection},
	{"scale_exact", CheckScale},
	{"head_ablate", CheckHeadAblate},
	{"patch", CheckPatch},
	{"batch_equals_solo", CheckBatchMatchesSolo},
	{"continuous_batching", CheckContinuousBatching},
	{"seven_apps_mixed", CheckSevenAppsMixed},
	{"solo_graphs_exact", CheckSoloGraphsExact},
	{"per_request_scalars", CheckPerRequestScalars},
	{"threshold_override", CheckThresholdOverride},
	{"after_token", CheckAfterToken},
	{"set_vector", CheckSetVector},
	{"per_request_vectors", CheckPerRequestVectors},
	{"per_request_layers", CheckPerRequestLayers},
	{"fired", CheckFired},
	{"stop_when", CheckStopWhen},
	{"sampler_features", CheckSamplerFeatures},
	{"router_bias", CheckRouterBias},
	{"router_mask", CheckRouterMask},
	{"logits_steer", CheckLogitsSteer},
	{"token_override", CheckTokenOverride},
	{"logit_lens", CheckLogitLens},
	{"custom_kernel", CheckCustomKernel},
	{"nonfinite_logits", CheckNonFinite},
	{"gemma2_forward", CheckGemma2Forward},
	{"gemma2_hooks", CheckGemma2Hooks},
	{"gemma2_lens_custom", CheckGemma2LensAndCustom},
}

// CheckNonFinite: a request whose logits stop being finite ends there with ReasonNonFinite
// and an error naming the step, keeping the tokens before it, greedy or sampled and whatever
// token_override says; the request beside it in the batch runs on, bit-identical to a bare
// bundle's.
func CheckNonFinite(t *testing.T, nb NewBackend) {
	// Two scales of 1e30 from the row of gen 2 on (position 6, where token 3 is sampled):
	// every logit that is not 0 overflows.
	blowup := `app: blowup
ops:
  - write: {at: {hook: logits}, kernel: scale, args: {alpha: 1e30}, when: {steps: {from: 2}}}
  - write: {at: {hook: logits}, kernel: scale, args: {alpha: 1e30}, when: {steps: {from: 2}}}
`
	force := `app: force
ops:
  - write: {at: {hook: sampled}, kernel: token_override, args: {token: 65}}
`
	withApp := Compile(t, SmallModel, blowup, force)
	bare := Compile(t, SmallModel)
	prompt := []int{10, 20, 30}
	be := nb(t, withApp)
	defer be.Close()
	eng, err := loader.NewEngine(withApp, be)
	if err != nil {
		t.Fatal(err)
	}
	res, err := eng.Generate([]loader.Request{
		{Prompt: prompt, Apps: []string{"blowup"}, MaxTokens: 6},
		{Prompt: prompt, MaxTokens: 6},
		{Prompt: prompt, Apps: []string{"blowup", "force"}, MaxTokens: 6, Temperature: 0.8, Seed: 5},
	})
	if err == nil || !strings.Contains(err.Error(), "request 0: generation step 3: the logits at position 6 are not finite") ||
		!strings.Contains(err.Error(), "request 2: generation step 3:") || strings.Contains(err.Error(), "request 1") {
		t.Fatalf("Generate: %v, want requests 0 and 2 named at generation step 3", err)
	}
	ref := Generate(t, nb, bare, []loader.Request{{Prompt: prompt, MaxTokens: 6}})[0]
	for i, want := range []struct {
		reason string
		tokens []int
	}{{loader.ReasonNonFinite, ref.Tokens[:3]}, {loader.ReasonLength, ref.Tokens}, {loader.ReasonNonFinite, []int{65, 65, 65}}} {
		r := res[i]
		if r.Reason != want.reason || !slices.Equal(r.Tokens, want.tokens) || (r.Error != "") != (want.reason == loader.ReasonNonFinite) {
			t.Errorf("request %d: %s %v (%q), want %s %v", i, r.Reason, r.Tokens, r.Error, want.reason, want.tokens)
		}
	}
}

// routerApp is app "router": kernel (router_bias or router_mask) with its vector argument
// arg = v at router_logits of layer 1 of SmallMixtral.
func routerApp(kernel, arg string, v []float32) string {
	return fmt.Sprintf(`app: router
params: {v: {values: %s}}
ops:
  - write: {at: {layers: [1], hook: router_logits}, kernel: %s, args: {%s: v}}
`, yamlList(v), kernel, arg)
}

// checkRouter runs SmallMixtral with app (bit 0, so the capture of layer 1's router logits
// sees its effect) for one request and without it for another, against a bundle compiled
// without it. The request without the app must be bit-identical to the bare bundle's; want
// checks each prompt row of the request with it: the bare logits, the captured ones, and the
// experts the router picks from them.
func checkRouter(t *testing.T, nb NewBackend, app string, want func(row int, bare, got []float32, picked []uint32)) {
	t.Helper()
	const experts = 4
	withApp := Compile(t, SmallMixtral, app, captureAt("router_logits", 1, experts))
	bare := Compile(t, SmallMixtral, captureAt("router_logits", 1, experts))
	prompt := []int{10, 20, 30, 40}
	a := Generate(t, nb, withApp, []loader.Request{
		{Prompt: prompt, Apps: []string{"router", "cap"}, MaxTokens: 4},
		{Prompt: prompt, Apps: []string{"cap"}, MaxTokens: 4},
	})
	b := Generate(t, nb, bare, []loader.Request{{Prompt: prompt, Apps: []string{"cap"}, MaxTokens: 4}})
	on, off, ref := captured(a[0]), captured(a[1]), captured(b[0])
	if len(ref) != 8 || len(on) != 8 || len(off) != 8 {
		t.Fatalf("captured %d/%d/%d rows, want 8 (BOS + 4 prompt + 3 decode)", len(on), len(off), len(ref))
	}
	for row := range 5 {
		idx, wts := make([]uint32, 2), make([]float32, 2)
		ops.Route(on[row], 2, idx, wts)
		want(row, ref[row], on[row], idx)
	}
	for row := range ref {
		for e, w := range ref[row] {
			if math.Float32bits(off[row][e]) != math.Float32bits(w) {
				t.Fatalf("row %d expert %d (app off): logit %v differs from the bare bundle's %v", row, e, off[row][e], w)
			}
		}
	}
	if !slices.Equal(a[1].Tokens, b[0].Tokens) {
		t.Fatalf("request without the app: tokens %v, bare bundle %v", a[1].Tokens, b[0].Tokens)
	}
}

// CheckRouterBias: router_bias adds exactly its bias to the router logits of the rows that
// enable it, so a large bias on one expert makes the router pick it for every such row.
func CheckRouterBias(t *testing.T, nb NewBackend) {
	bias := []float32{0.25, 0, -0.5, 30}
	checkRouter(t, nb, routerApp("router_bias", "bias", bias), func(row int, bare, got []float32, picked []uint32) {
		for e := range bias {
			if exp := bare[e] + bias[e]; got[e] != exp {
				t.Fatalf("row %d expert %d: logit %v, want exactly %v + %v", row, e, got[e], bare[e], bias[e])
			}
		}
		if picked[0] != 3 {
			t.Fatalf("row %d: the router picks %v, want expert 3 first", row, picked)
		}
	})
}

// CheckRouterMask: router_mask sets the masked experts' logits to -inf, so the router picks
// only the others.
func CheckRouterMask(t *testing.T, nb NewBackend) {
	mask := []float32{1, 0, 1, 0}
	checkRouter(t, nb, routerApp("router_mask", "mask", mask), func(row int, bare, got []float32, picked []uint32) {
		for e := range mask {
			exp := bare[e]
			if mask[e] != 0 {
				exp = float32(math.Inf(-1))
			}
			if got[e] != exp {
				t.Fatalf("row %d expert %d: logit %v, want %v", row, e, got[e], exp)
			}
		}
		if slices.Sort(picked); !slices.Equal(picked, []uint32{1, 3}) {
			t.Fatalf("row %d: the router picks %v, want experts 1 and 3", row, picked)
		}
	})
}

// steerAt is app name: steer_add of v times alpha at resid_post of layer 1, under when ("" for
// none). Listed before captureApp's app, its bit comes first, so the capture sees the steer.
func steerAt(name string, v []float32, alpha float32, when string) string {
	app := fmt.Sprintf(`app: %s
params: {v: {values: %s}}
ops:
  - write: {at: {layers: [1], hook: resid_post}, kernel: steer_add, args: {vector: v, alpha: %v}`, name, yamlList(v), alpha)
	if when != "" {
		app += ", when: " + when
	}
	return app + "}\n"
}

// capOnly is reqs with only the capture app enabled and no overrides: the same batch, step
// by step, for the bare bundle (kernels may round differently in different buckets).
func capOnly(reqs []loader.Request) []loader.Request {
	out := make([]loader.Request, len(reqs))
	for i, r := range reqs {
		r.Apps, r.Overrides = []string{"cap"}, nil
		out[i] = r
	}
	return out
}

// checkSteered checks rows [from, to) of got against ref: exactly ref + fl(alpha*v) from row
// steerFrom on, bit-identical before it.
func checkSteered(t *testing.T, what string, got, ref [][]float32, v []float32, alpha float32, steerFrom, to int) {
	t.Helper()
	if len(got) < to || len(ref) < to {
		t.Fatalf("%s: %d and %d rows captured, want at least %d", what, len(got), len(ref), to)
	}
	for row := range to {
		for i, w := range ref[row] {
			want := w
			if row >= steerFrom {
				want = w + float32(alpha*v[i])
			}
			if math.Float32bits(got[row][i]) != math.Float32bits(want) {
				t.Fatalf("%s: row %d elem %d: %v, want exactly %v (steered: %v)", what, row, i, got[row][i], want, row >= steerFrom)
			}
		}
	}
}

// CheckPerRequestScalars: requests of one batch with different overrides of the app's alpha
// each get exactly x + alpha_i*v; a request without the app is bit-identical to the bare
// bundle; an unknown override name is refused with the valid ones listed.
func CheckPerRequestScalars(t *testing.T, nb NewBackend) {
	v := randVec(11, 128)
	withApp := Compile(t, SmallModel, steerAt("steer", v, 2.5, ""), captureApp(1, 128))
	bare := Compile(t, SmallModel, captureApp(1, 128))
	prompt := []int{10, 20, 30}
	alphas := []float32{1.5, -4, 2.5}
	var reqs []loader.Request
	for i, a := range alphas {
		r := loader.Request{Prompt: prompt, Apps: []string{"steer", "cap"}, MaxTokens: 3}
		if i < 2 { // the last one runs on the default
			r.Overrides = map[string]float32{"steer.op0.alpha": a}
		}
		reqs = append(reqs, r)
	}
	reqs = append(reqs, loader.Request{Prompt: prompt, Apps: []string{"cap"}, MaxTokens: 3,
		Overrides: map[string]float32{"steer.op0.alpha": 9}})
	res := Generate(t, nb, withApp, reqs)
	ref := Generate(t, nb, bare, capOnly(reqs))
	want := captured(ref[0])
	for i, a := range alphas {
		checkSteered(t, fmt.Sprintf("request %d (alpha %v)", i, a), captured(res[i]), want, v, a, 0, promptRows)
	}
	want = captured(ref[3])
	checkSteered(t, "request without the app", captured(res[3]), want, v, 0, len(want), len(want))
	if !slices.Equal(res[3].Tokens, ref[3].Tokens) {
		t.Fatalf("request without the app: tokens %v, bare bundle %v", res[3].Tokens, ref[3].Tokens)
	}
	be := nb(t, withApp)
	defer be.Close()
	eng, err := loader.NewEngine(withApp, be)
	if err != nil {
		t.Fatal(err)
	}
	_, err = eng.Submit(loader.Request{Prompt: prompt, Apps: []string{"steer"}, MaxTokens: 1,
		Overrides: map[string]float32{"steer.alpha": 1}})
	if err == nil || !strings.Contains(err.Error(), "valid: steer.op0.alpha") {
		t.Fatalf("unknown override: %v, want the valid names listed", err)
	}
}

// CheckThresholdOverride: an activation gate's threshold is the scalar op<i>.threshold; a
// request that lowers it below every probe value gets the steer on every row, one that keeps
// the default (above every sigmoid) is bit-identical to the bare bundle.
func CheckThresholdOverride(t *testing.T, nb NewBackend) {
	v, w := randVec(12, 128), randVec(13, 128)
	cast := `app: cast
params: {v: {values: ` + yamlList(v) + `}, w: {values: ` + yamlList(w) + `}}
buffers: {h: {shape: [1]}}
ops:
  - read: {at: {layers: [0], hook: resid_post}, kernel: probe_linear, args: {w: w, activation: sigmoid}, into: h}
  - write: {at: {layers: [1], hook: resid_post}, kernel: steer_add, args: {vector: v, alpha: 3},
            when: {activation: {buffer: h, op: ">", value: 2}}}
`
	withApp := Compile(t, SmallModel, cast, captureApp(1, 128))
	bare := Compile(t, SmallModel, captureApp(1, 128))
	prompt := []int{7, 8, 9}
	reqs := []loader.Request{
		{Prompt: prompt, Apps: []string{"cast", "cap"}, MaxTokens: 3, Overrides: map[string]float32{"cast.op1.threshold": -1}},
		{Prompt: prompt, Apps: []string{"cast", "cap"}, MaxTokens: 3},
	}
	res := Generate(t, nb, withApp, reqs)
	ref := Generate(t, nb, bare, capOnly(reqs))
	checkSteered(t, "threshold -1", captured(res[0]), captured(ref[0]), v, 3, 0, promptRows)
	want := captured(ref[1])
	checkSteered(t, "default threshold 2", captured(res[1]), want, v, 0, len(want), len(want))
}

// CheckAfterToken: an op under after_token applies exactly from the row whose token is in the
// set, whether that token is in the prompt or generated, and leaves earlier rows (and
// requests without the app) bit-identical. Generations are teacher-forced so that every row
// has a reference.
func CheckAfterToken(t *testing.T, nb NewBackend) {
	const trigger = 77
	v := randVec(14, 128)
	withApp := Compile(t, SmallModel, steerAt("seal", v, 2, fmt.Sprintf("{after_token: [%d, 250]}", trigger)), captureApp(1, 128))
	bare := Compile(t, SmallModel, captureApp(1, 128))
	cases := []struct {
		what      string
		prompt    []int
		force     []int
		steerFrom int // BOS is row 0
	}{
		{"in the prompt", []int{10, 20, trigger, 30, 40}, []int{50, 51, 52, 53}, 3},
		{"generated", []int{10, 20, 30}, []int{50, trigger, 51, 52, 53}, 5},
	}
	var reqs []loader.Request
	for _, c := range cases {
		reqs = append(reqs, loader.Request{Prompt: c.prompt, Force: c.force, MaxTokens: len(c.force), Apps: []string{"seal", "cap"}})
	}
	reqs = append(reqs, capOnly(reqs)...) // the same requests without the app, in the same batch
	res := Generate(t, nb, withApp, reqs)
	ref := Generate(t, nb, bare, capOnly(reqs))
	for i, c := range cases {
		want := captured(ref[i])
		if n := len(c.prompt) + len(c.force); len(want) != n {
			t.Fatalf("%s: %d rows, want %d", c.what, len(want), n)
		}
		checkSteered(t, "trigger "+c.what, captured(res[i]), want, v, 2, c.steerFrom, len(want))
		off := captured(ref[len(cases)+i]) // rows may round differently at another place in the batch
		checkSteered(t, "trigger "+c.what+", app off", captured(res[len(cases)+i]), off, v, 0, len(off), len(off))
	}
}

// CheckSetVector: Engine.SetVector replaces a vector on the device, so the next request sees
// it (a direction normalised as the compiler does), and Engine.SetDefault changes the alpha
// of requests admitted later; the engine and its bundle stay as they are.
func CheckSetVector(t *testing.T, nb NewBackend) {
	v1, v2, d := randVec(15, 128), randVec(16, 128), randVec(17, 128)
	ablate := `app: ablate
params: {d: {values: ` + yamlList(randVec(18, 128)) + `}}
ops:
  - write: {at: {layers: [1], hook: resid_post}, kernel: project_out, args: {direction: d}}
`
	b := Compile(t, SmallModel, steerAt("steer", v1, 2.5, ""), ablate, captureApp(1, 128))
	before, err := bundle.Marshal(b)
	if err != nil {
		t.Fatal(err)
	}
	bare := Compile(t, SmallModel, captureApp(1, 128))
	prompt := []int{3, 1, 4}
	want := captured(Generate(t, nb, bare, []loader.Request{{Prompt: prompt, Apps: []string{"cap"}, MaxTokens: 2}})[0])
	be := nb(t, b)
	defer be.Close()
	eng, err := loader.NewEngine(b, be)
	if err != nil {
		t.Fatal(err)
	}
	run := func(apps ...string) [][]float32 {
		t.Helper()
		res, err := eng.Generate([]loader.Request{{Prompt: prompt, Apps: append(apps, "cap"), MaxTokens: 2}})
		if err != nil {
			t.Fatal(err)
		}
		return captured(res[0])
	}
	checkSteered(t, "compiled vector", run("steer"), want, v1, 2.5, 0, promptRows)
	if err := eng.SetVector("steer", "v", v2); err != nil {
		t.Fatal(err)
	}
	checkSteered(t, "replaced vector", run("steer"), want, v2, 2.5, 0, promptRows)
	if err := eng.SetDefault("steer", "op0.alpha", -0.5); err != nil {
		t.Fatal(err)
	}
	checkSteered(t, "replaced vector and default alpha", run("steer"), want, v2, -0.5, 0, promptRows)
	scaled := make([]float32, len(d))
	for i, x := range d {
		scaled[i] = 3 * x // not unit: SetVector normalises it
	}
	if err := eng.SetVector("ablate", "d", scaled); err != nil {
		t.Fatal(err)
	}
	for row, x := range run("ablate") {
		if c := component(x, d); c > 1e-5 {
			t.Fatalf("row %d: component %.3g along the replaced direction", row, c)
		}
	}
	for _, bad := range []struct {
		app, param string
		v          []float32
		want       string
	}{
		{"steer", "v", v1[:5], "5 values, the app's kernels need 128"},
		{"steer", "w", v1, "params: v"},
		{"ablate", "d", make([]float32, 128), "non-zero norm"},
		{"nope", "v", v1, "not deployed"},
	} {
		if err := eng.SetVector(bad.app, bad.param, bad.v); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("SetVector(%s, %s): %v, want %q", bad.app, bad.param, err, bad.want)
		}
	}
	if err := eng.SetDefault("steer", "alpha", 1); err == nil || !strings.Contains(err.Error(), "scalars: op0.alpha") {
		t.Errorf("SetDefault of an unknown scalar: %v", err)
	}
	after, err := bundle.Marshal(b)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(before, after) {
		t.Fatal("run-time replacement changed the bundle")
	}
}

// smallSevenApps are the paper's seven apps (specs/apps/app*.yaml) resized for SmallModel
// (3 layers) and SmallMixtral (2 layers, 4 experts).
var smallSevenApps = []string{
	`app: refusal-ablation
params: {d: {random: 1}}
ops:
  - write: {at: {layers: all, hook: resid_post}, kernel: project_out, args: {direction: d}}
`, `app: seal
params: {v: {random: 2}}
ops:
  - write: {at: {layers: all, hook: resid_post}, kernel: steer_add, args: {vector: v, alpha: -4},
            when: {token_in: [11, 12, 40]}}
`, `app: conditional-refusal
params: {harm: {random: 3}, refuse: {random: 4}}
buffers: {harm: {shape: [1], export: true}}
ops:
  - read: {at: {layers: [0], hook: resid_post}, kernel: probe_linear, args: {w: harm, bias: -0.1, activation: sigmoid}, into: harm}
  - write: {at: {layers: "1-2", hook: resid_post}, kernel: steer_add, args: {vector: refuse, alpha: 4},
            when: {activation: {buffer: harm, op: ">", value: 0.5}}}
`, `app: hallucination-probe
params: {w: {random: 5}}
buffers: {h: {shape: [1], export: true}}
ops:
  - read: {at: {layers: [1], hook: resid_post}, kernel: probe_linear, args: {w: w, activation: sigmoid}, into: h}
`, `app: sake
params: {e: {random: 6}}
ops:
  - write: {at: {layers: [1], hook: resid_post}, kernel: steer_add, args: {vector: e, alpha: 2}}
`, `app: side-effect-free
params: {s: {random: 7}}
ops:
  - write: {at: {layers: "0-2", hook: resid_post}, kernel: steer_add, args: {vector: s, alpha: 1}}
  - write: {at: {layers: "0-2", hook: resid_post}, kernel: clamp_projection, args: {direction: s, min: -0.5, max: 0.5}}
`}

const smallSteerMoE = `app: steermoe
params: {favour: {values: [0, 0, 0, 1]}, off: {values: [0, 1, 0, 0]}}
ops:
  - write: {at: {layers: all, hook: router_logits}, kernel: router_bias, args: {bias: favour, alpha: 4}}
  - write: {at: {layers: all, hook: router_logits}, kernel: router_mask, args: {mask: off}}
`

// CheckSevenAppsMixed: one batch mixing the seven apps across rows (each row a different
// subset) gives, row by row, what each row gets alone with its subset: the same tokens and
// the same exported reads.
func CheckSevenAppsMixed(t *testing.T, nb NewBackend) {
	names := []string{"refusal-ablation", "seal", "conditional-refusal", "hallucination-probe", "sake", "side-effect-free"}
	subsets := [][]string{{}, {names[0]}, {names[1], names[2]}, {names[3]}, {names[4], names[5], names[3]}, names}
	b := Compile(t, SmallModel, smallSevenApps...)
	var reqs []loader.Request
	for i, s := range subsets {
		reqs = append(reqs, loader.Request{Prompt: []int{10 + i, 11, 12, 40 - i}, Apps: s, MaxTokens: 6})
	}
	mixedRun(t, nb, b, reqs)
	all := reqs[len(reqs)-1]
	plain := all
	plain.Apps = nil
	if slices.Equal(Generate(t, nb, b, []loader.Request{all})[0].Tokens, Generate(t, nb, b, []loader.Request{plain})[0].Tokens) {
		t.Fatal("the six apps together changed nothing: the check would prove nothing")
	}
	// App 7 needs a MoE model: mixed with rows that do not enable it.
	mb := Compile(t, SmallMixtral, smallSteerMoE)
	mixedRun(t, nb, mb, []loader.Request{
		{Prompt: []int{5, 6, 7}, Apps: []string{"steermoe"}, MaxTokens: 6},
		{Prompt: []int{5, 6, 7}, MaxTokens: 6},
		{Prompt: []int{9, 8}, Apps: []string{"steermoe"}, MaxTokens: 6},
	})
}

// CheckSoloGraphsExact: in a bundle of the six Llama apps, a step whose rows enable one app
// runs that app's Solo nodes (bundle.Template.Solo), kernels compiled with its ops alone;
// they give each row exactly what the template's Nodes, which carry all six apps' ops, give
// it: the same tokens, logprobs and exported reads bit for bit, prefill and decode, for each
// app. The Solo lists must differ from Nodes somewhere, or the check would prove nothing.
func CheckSoloGraphsExact(t *testing.T, nb NewBackend) {
	b := Compile(t, SmallModel, smallSevenApps...)
	full := *b
	full.Templates = slices.Clone(b.Templates)
	differ := false
	for i := range full.Templates {
		tm := &full.Templates[i]
		if len(tm.Solo) != len(b.Manifest.Apps) {
			t.Fatalf("template %s: %d solo lists for %d apps", tm.Name, len(tm.Solo), len(b.Manifest.Apps))
		}
		for _, s := range tm.Solo {
			differ = differ || !reflect.DeepEqual(s.Nodes, tm.Nodes)
		}
		tm.Solo = nil
	}
	if !differ {
		t.Fatal("every solo list is the template's nodes: the check would prove nothing")
	}
	// A bundle whose solo lists are the app-free nodes: a backend that runs them drops the
	// app's ops, so some app's tokens change; one that ignores Solo changes nothing.
	plain := *b
	plain.Templates = slices.Clone(b.Templates)
	for i := range plain.Templates {
		tm := &plain.Templates[i]
		tm.Solo = slices.Clone(tm.Solo)
		for j := range tm.Solo {
			tm.Solo[j].Nodes = tm.Plain
		}
	}
	ran := false
	for _, a := range b.Manifest.Apps {
		var reqs []loader.Request
		for i := range 3 {
			reqs = append(reqs, loader.Request{Prompt: []int{10 + i, 11, 12, 40 - i}, Apps: []string{a.Name}, MaxTokens: 5, Logprobs: true})
		}
		got, want := Generate(t, nb, b, reqs), Generate(t, nb, &full, reqs)
		for i, r := range Generate(t, nb, &plain, reqs) {
			ran = ran || !slices.Equal(r.Tokens, want[i].Tokens)
		}
		for i := range reqs {
			if !slices.Equal(got[i].Tokens, want[i].Tokens) || !reflect.DeepEqual(got[i].Logprobs, want[i].Logprobs) ||
				!reflect.DeepEqual(got[i].Rows, want[i].Rows) {
				t.Fatalf("app %s, request %d: its own graph gave tokens %v, logprobs %v; every app's %v, %v (or their rows' reads differ)",
					a.Name, i, got[i].Tokens, got[i].Logprobs, want[i].Tokens, want[i].Logprobs)
			}
		}
	}
	if !ran {
		t.Fatal("with the solo lists swapped for the app-free nodes no app's tokens changed: the backend does not run the solo lists")
	}
}

// mixedTolerance bounds the relative difference of a read between a batched row and the same
// request alone. They run in different decode buckets, whose GEMMs may round x differently:
// the CPU and the PTX kernels keep 16 bits of its mantissa (ops/gemm_tc.go), cuBLASLt takes
// bf16(x) like every bf16 serving stack (loader/cuda/cublaslt.go), a difference near 2^-9,
// and writes the gate/up projection in bf16 for the activation (loader/cuda/gu.go), another
// rounding near 2^-9 on the MLP's path: two of them. (The one-rounding bound, 2e-3, was
// exceeded once the second came: 2.8e-3 on a probe of the hallucination app, H200, session
// 60.) Tokens must agree exactly; bit-identity within one bucket is what the exactness
// checks test.
const mixedTolerance = 4e-3

func mixedRun(t *testing.T, nb NewBackend, b *bundle.Bundle, reqs []loader.Request) {
	t.Helper()
	batch := Generate(t, nb, b, reqs)
	for i, req := range reqs {
		solo := Generate(t, nb, b, []loader.Request{req})[0]
		if !slices.Equal(solo.Tokens, batch[i].Tokens) {
			t.Fatalf("request %d (apps %v): batched %v, alone %v", i, req.Apps, batch[i].Tokens, solo.Tokens)
		}
		for r, row := range batch[i].Rows {
			for _, x := range row.Exports {
				k, v := x.Name, x.Values
				s := solo.Rows[r].Exports.Get(k)
				if RelL2(v, s) > mixedTolerance {
					t.Fatalf("request %d row %d export %s: batched %v, alone %v", i, r, k, v, s)
				}
			}
		}
	}
}

// CheckLogitsSteer: steer_add at hook logits changes the logits of exactly the samples whose
// request enables it, by exactly alpha*v; a capture there exports sampled rows only; a
// request without the app is bit-identical (logits and tokens) to the bare bundle.
func CheckLogitsSteer(t *testing.T, nb NewBackend) {
	const vocab = 300
	v := randVec(21, vocab)
	steer := `app: lsteer
params: {v: {values: ` + yamlList(v) + `}}
ops:
  - write: {at: {hook: logits}, kernel: steer_add, args: {vector: v, alpha: 1.5}}
`
	capLogits := fmt.Sprintf(`app: cap
buffers: {x: {shape: [%d], export: true}}
ops:
  - read: {at: {hook: logits}, kernel: capture, into: x}
`, vocab)
	withApp := Compile(t, SmallModel, steer, capLogits)
	bare := Compile(t, SmallModel, capLogits)
	prompt := []int{10, 20, 30}
	a := Generate(t, nb, withApp, []loader.Request{
		{Prompt: prompt, Apps: []string{"lsteer", "cap"}, MaxTokens: 4},
		{Prompt: prompt, Apps: []string{"cap"}, MaxTokens: 4},
	})
	b := Generate(t, nb, bare, []loader.Request{{Prompt: prompt, Apps: []string{"cap"}, MaxTokens: 4}})
	for i, r := range [][]loader.Row{a[0].Rows, a[1].Rows, b[0].Rows} {
		for _, row := range r {
			if sampled := row.Pos >= len(prompt); sampled != (row.Exports.Get("cap.x") != nil) {
				t.Fatalf("run %d row %d: exported %v, want logits on sampled rows only", i, row.Pos, row.Exports.Get("cap.x") != nil)
			}
		}
	}
	steered, other, ref := captured(a[0])[len(prompt):], captured(a[1])[len(prompt):], captured(b[0])[len(prompt):]
	// The first sample comes from identical inputs; later ones follow the steered tokens.
	for i, w := range ref[0] {
		if exp := w + float32(1.5*v[i]); steered[0][i] != exp {
			t.Fatalf("logit %d: steered %v, want exactly %v + 1.5*%v = %v", i, steered[0][i], w, v[i], exp)
		}
	}
	for row := range ref {
		for i, w := range ref[row] {
			if math.Float32bits(other[row][i]) != math.Float32bits(w) {
				t.Fatalf("sample %d logit %d (app off): %v differs from the bare bundle's %v", row, i, other[row][i], w)
			}
		}
	}
	if !slices.Equal(a[1].Tokens, b[0].Tokens) {
		t.Fatalf("request without the app: tokens %v, bare bundle %v", a[1].Tokens, b[0].Tokens)
	}
}

// CheckTokenOverride: token_override under a steps window replaces exactly the tokens
// sampled from rows of generation steps 1 and 2 (output tokens 2 and 3: output token k comes
// from the row of step k-1, the last prompt row giving token 0) of the request that enables
// it, with the request's own override of the token; the other request is bit-identical to
// the bare bundle.
func CheckTokenOverride(t *testing.T, nb NewBackend) {
	force := `app: force
ops:
  - write: {at: {hook: sampled}, kernel: token_override, args: {token: 65}, when: {steps: {from: 1, to: 3}}}
`
	withApp := Compile(t, SmallModel, force)
	bare := Compile(t, SmallModel)
	reqs := []loader.Request{
		{Prompt: []int{10, 20, 30}, Apps: []string{"force"}, MaxTokens: 6},
		{Prompt: []int{40, 41}, MaxTokens: 6, Temperature: 0.8, Seed: 3},
		{Prompt: []int{10, 20, 30}, Apps: []string{"force"}, MaxTokens: 6, Overrides: map[string]float32{"force.op0.token": 66}},
	}
	a := Generate(t, nb, withApp, reqs)
	b := Generate(t, nb, bare, []loader.Request{{Prompt: []int{10, 20, 30}, MaxTokens: 6}, reqs[1]})
	for i, want := range []int{65, 66} {
		got := a[2*i].Tokens
		if len(got) != 6 || got[2] != want || got[3] != want {
			t.Fatalf("request %d: tokens %v, want %d at 2 and 3", 2*i, got, want)
		}
		if !slices.Equal(got[:2], b[0].Tokens[:2]) {
			t.Fatalf("request %d: tokens %v before the window differ from the bare bundle's %v", 2*i, got, b[0].Tokens)
		}
	}
	if slices.Equal(a[0].Tokens, b[0].Tokens) {
		t.Fatalf("override changed nothing: %v", a[0].Tokens)
	}
	if !slices.Equal(a[1].Tokens, b[1].Tokens) {
		t.Fatalf("request without the app: tokens %v, bare bundle %v", a[1].Tokens, b[1].Tokens)
	}
}

// readF32s reads a whole f32 buffer, or a bf16 one converted.
func readF32s(t *testing.T, be loader.Backend, b *bundle.Bundle, name string) []float32 {
	t.Helper()
	for _, buf := range b.Manifest.Buffers {
		if buf.Name != name {
			continue
		}
		n := 1
		for _, d := range buf.Shape {
			n *= d
		}
		size := 4
		if buf.Dtype == "bf16" {
			size = 2
		}
		raw := make([]byte, size*n)
		if err := be.Read(name, raw); err != nil {
			t.Fatal(err)
		}
		if size == 4 {
			return ops.Arg{Mem: raw}.F32()
		}
		out := make([]float32, n)
		for i, h := range (ops.Arg{Mem: raw}).U16() {
			out[i] = ops.BF16ToF32(h)
		}
		return out
	}
	t.Fatalf("bundle has no buffer %s", name)
	return nil
}

// CheckLogitLens: logit_lens at resid_post of layer 1 reports, for every row that enables
// it, the top 5 of the final norm + LM head run on that row's residual (captured at the
// same site); with no row enabling it, its nodes write nothing (poisoned buffers stay
// poisoned) and tokens are bit-identical to the bare bundle's.
func CheckLogitLens(t *testing.T, nb NewBackend) {
	const hidden, vocab, k = 128, 300, 5
	lens := `app: lens
buffers: {top: {shape: [10], export: true}}
ops:
  - read: {at: {layers: [1], hook: resid_post}, kernel: logit_lens, args: {k: 5}, into: top}
`
	b := Compile(t, SmallModel, lens, captureApp(1, hidden))
	for _, tmpl := range b.Templates {
		for _, n := range tmpl.Nodes {
			if heavy := strings.Contains(n.Label, ".lens_"); heavy != (n.SkipUnless == 1<<b.Manifest.Apps[0].Bit) {
				t.Fatalf("%s node %s: skip_unless %#x; only the lens nodes may be left out, for the lens app's bit", tmpl.Name, n.Label, n.SkipUnless)
			}
		}
	}
	be := nb(t, b)
	defer be.Close()
	eng, err := loader.NewEngine(b, be)
	if err != nil {
		t.Fatal(err)
	}
	poison := func(name string, n int) {
		nan := make([]float32, n)
		for i := range nan {
			nan[i] = float32(math.NaN())
		}
		raw := make([]byte, 4*n)
		for i, v := range nan {
			u := math.Float32bits(v)
			raw[4*i], raw[4*i+1], raw[4*i+2], raw[4*i+3] = byte(u), byte(u>>8), byte(u>>16), byte(u>>24)
		}
		if err := be.Write(name, 0, raw); err != nil {
			t.Fatal(err)
		}
	}
	maxT := len(readF32s(t, be, b, "act.lens")) / vocab
	poison("act.lens", maxT*vocab)
	poison("app.lens.buffer.top", maxT*2*k)
	idle := []loader.Request{{Prompt: []int{10, 20, 30}, Apps: []string{"cap"}, MaxTokens: 4}, {Prompt: []int{5}, MaxTokens: 3}}
	off, err := eng.Generate(idle)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"act.lens", "app.lens.buffer.top"} {
		for i, v := range readF32s(t, be, b, name) {
			if !math.IsNaN(float64(v)) {
				t.Fatalf("app disabled on every row: %s[%d] was written (%v)", name, i, v)
			}
		}
	}
	bare := Generate(t, nb, Compile(t, SmallModel, captureApp(1, hidden)), idle)
	for i := range idle {
		if !slices.Equal(off[i].Tokens, bare[i].Tokens) {
			t.Fatalf("request %d with the lens idle: tokens %v, bare bundle %v", i, off[i].Tokens, bare[i].Tokens)
		}
	}

	res, err := eng.Generate([]loader.Request{
		{Prompt: []int{10, 20, 30}, Apps: []string{"lens", "cap"}, MaxTokens: 4},
		{Prompt: []int{7, 8}, Apps: []string{"cap"}, MaxTokens: 3},
	})
	if err != nil {
		t.Fatal(err)
	}
	w, head := readF32s(t, be, b, "final_norm"), readF32s(t, be, b, "lm_head")
	for _, row := range res[1].Rows {
		if row.Exports.Get("lens.top") != nil {
			t.Fatalf("row %d of the request without the lens has lens exports", row.Pos)
		}
	}
	for _, row := range res[0].Rows {
		got, x := row.Exports.Get("lens.top"), row.Exports.Get("cap.x")
		if len(got) != 2*k || len(x) != hidden {
			t.Fatalf("row %d: %d lens values, %d captured", row.Pos, len(got), len(x))
		}
		var ss float64
		for _, v := range x {
			ss += float64(v) * float64(v)
		}
		rs := 1 / math.Sqrt(ss/hidden+1e-5)
		logits := make([]float32, vocab)
		var scale, mag float64
		for v := range vocab {
			var s, a float64
			for i, xi := range x {
				p := float64(xi) * rs * float64(w[i]) * float64(head[v*hidden+i])
				s += p
				a += math.Abs(p)
			}
			logits[v] = float32(s)
			scale, mag = max(scale, math.Abs(s)), max(mag, a)
		}
		_, want := ops.TopK(logits, k)
		// From 8 rows the lens's LM head is the model's own GEMM: under cuBLASLt it reads the
		// normalised row rounded to bf16 (relative error up to 2^-8 per element), as the
		// model's logits do.
		tol := 1e-4*scale + mag/256
		for j := range k {
			id := int(got[j])
			if float32(id) != got[j] || id < 0 || id >= vocab {
				t.Fatalf("row %d pick %d: id %v", row.Pos, j, got[j])
			}
			// Ids may swap only between logits closer than rounding: compare values.
			if math.Abs(float64(got[k+j]-want[j])) > tol || math.Abs(float64(logits[id]-got[k+j])) > tol {
				t.Fatalf("row %d pick %d: id %d logit %v; reference top logits %v (id's own %v)", row.Pos, j, id, got[k+j], want, logits[id])
			}
		}
	}
}

// customScaleApp is app "cust": the custom PTX kernel specs.ScaleTwoPTX doubling resid_post at
// the layers listed (YAML list items, e.g. "1, 2").
func customScaleApp(layers string) string {
	return "app: cust\nkernels:\n  scale2:\n    entry: scale2\n" +
		"    signature: [x u64, stride u32, offset u32, width u32, ctl_mask u64, bit u32]\n" +
		"    ptx: |\n      " + strings.ReplaceAll(specs.ScaleTwoPTX, "\n", "\n      ") + "\n" +
		"ops:\n  - write: {at: {layers: [" + layers + "], hook: resid_post}, kernel: custom:scale2}\n"
}

// CheckCustomKernel: a custom PTX kernel scaling resid_post by 2 at layers 1 and 2 (the last:
// its renorm is the final norm) gives the built-in scale template's bits: the residual the
// next layer sees, every step's logits and the tokens; in a batch, a row without the app is
// bit-identical to the same request alone.
func CheckCustomKernel(t *testing.T, nb NewBackend) {
	custom := customScaleApp("1, 2")
	builtin := `app: ref
ops:
  - write: {at: {layers: [1, 2], hook: resid_post}, kernel: scale, args: {alpha: 2}}
`
	b := Compile(t, SmallModel, custom, builtin, captureAt("resid_mid", 2, 128))
	run := func(reqs ...loader.Request) ([]loader.Result, [][]float32) {
		var rec *LogitRecorder
		res := Generate(t, func(t testing.TB, b *bundle.Bundle) loader.Backend {
			rec = &LogitRecorder{Backend: nb(t, b), Vocab: 300}
			return rec
		}, b, reqs)
		return res, rec.Steps
	}
	prompt := []int{10, 20, 30}
	req := func(apps ...string) loader.Request {
		return loader.Request{Prompt: prompt, Apps: append(apps, "cap"), MaxTokens: 5}
	}
	got, gotLogits := run(req("cust"))
	want, wantLogits := run(req("ref"))
	bare, _ := run(req())
	if !slices.Equal(got[0].Tokens, want[0].Tokens) {
		t.Fatalf("tokens %v with the custom kernel, %v with scale", got[0].Tokens, want[0].Tokens)
	}
	g, w, o := captured(got[0]), captured(want[0]), captured(bare[0])
	if len(g) != len(w) || len(g) == 0 {
		t.Fatalf("captured %d and %d rows", len(g), len(w))
	}
	changed := false
	for row := range w {
		for i := range w[row] {
			if math.Float32bits(g[row][i]) != math.Float32bits(w[row][i]) {
				t.Fatalf("resid_mid(2) row %d elem %d: %v with the custom kernel, %v with scale", row, i, g[row][i], w[row][i])
			}
			changed = changed || g[row][i] != o[row][i]
		}
	}
	if !changed {
		t.Fatal("the custom kernel changed nothing")
	}
	for s := range wantLogits {
		for i := range wantLogits[s] {
			if math.Float32bits(gotLogits[s][i]) != math.Float32bits(wantLogits[s][i]) {
				t.Fatalf("step %d logit %d: %v with the custom kernel, %v with scale", s, i, gotLogits[s][i], wantLogits[s][i])
			}
		}
	}
	mixed, _ := run(req("cust"), req())
	if !slices.Equal(mixed[0].Tokens, got[0].Tokens) || !slices.Equal(mixed[1].Tokens, bare[0].Tokens) {
		t.Fatalf("batched tokens %v / %v, alone %v / %v", mixed[0].Tokens, mixed[1].Tokens, got[0].Tokens, bare[0].Tokens)
	}
	for row, x := range captured(mixed[1]) {
		for i := range x {
			if math.Float32bits(x[i]) != math.Float32bits(o[row][i]) {
				t.Fatalf("row without the app, row %d elem %d: %v batched, %v alone", row, i, x[i], o[row][i])
			}
		}
	}
}
