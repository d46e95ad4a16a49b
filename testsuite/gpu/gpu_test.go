// Package gpu runs the end-to-end checks against the CUDA backend. Without a GPU (CI) every
// test skips. On the GPU machine testsuite/gpu/run.sh runs the compiled test binary and
// collects what it records (XMIX_GPU_RESULTS names the JSON file to write). XMIX_FUSE (a
// comma-separated --fuse list) builds every bundle of the checks with those fusions
// (testsuite/gpu/fuse_ab.sh), XMIX_SERIAL=1 builds them without programmatic dependent launch
// (--pdl=false), XMIX_PREFETCH=N with GEMVs that prefetch N bytes of each weight row
// (--prefetch; -1: none), XMIX_ATTN_PREFETCH=N with decode attention that asks L2 for N passes of
// K and V before its wait (--attn-prefetch; -1: none), and TestCUDABuildKeepsBits compares the bundle so built with a plain one
// (no fusions, --pdl=false) on the GPU.
package gpu

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"xmix/bundle"
	"xmix/codegen"
	"xmix/compile"
	"xmix/loader"
	"xmix/loader/cuda"
	"xmix/specs"
	"xmix/testsuite"
)

var (
	mu      sync.Mutex
	results = map[string]any{}
	device  cuda.Device
	noGPU   error
)

func record(key string, v any) {
	mu.Lock()
	defer mu.Unlock()
	results[key] = v
}

// envInt sets *into from the environment variable name when it is set, and exits the test
// binary naming the variable and what it wants when it is not an integer.
func envInt(name, want string, into *int) {
	v := os.Getenv(name)
	if v == "" {
		return
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s=%s: want %s\n", name, v, want)
		os.Exit(2)
	}
	*into = n
}

func TestMain(m *testing.M) {
	device, noGPU = cuda.Probe()
	if f := os.Getenv("XMIX_FUSE"); f != "" {
		testsuite.Fuse = strings.Split(f, ",")
	}
	testsuite.SerialLaunch = os.Getenv("XMIX_SERIAL") == "1"
	envInt("XMIX_PREFETCH", "a byte count (compile.Options.Prefetch)", &testsuite.Prefetch)
	envInt("XMIX_ATTN_PREFETCH", "a count of passes (compile.Options.AttnPrefetch)", &testsuite.AttnPrefetch)
	code := m.Run()
	if path := os.Getenv("XMIX_GPU_RESULTS"); path != "" && noGPU == nil {
		results["device"] = device.String()
		results["fuse"], results["serial_launch"], results["prefetch"], results["attn_prefetch"] = testsuite.Fuse, testsuite.SerialLaunch, testsuite.Prefetch, testsuite.AttnPrefetch
		data, err := json.MarshalIndent(results, "", "  ")
		if err == nil {
			err = os.WriteFile(path, data, 0o644)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			code = 1
		}
	}
	os.Exit(code)
}

func needGPU(t *testing.T) {
	if noGPU != nil {
		t.Skipf("no GPU: %v", noGPU)
	}
}

// gemmServers: every check runs with the bundle's PTX GEMMs and again with cuBLASLt serving
// the tensor-core GEMM nodes; results of the second carry the suffix "@cublaslt".
var gemmServers = []struct{ mode, suffix string }{{cuda.GemmPTX, ""}, {cuda.GemmCublasLt, "@cublaslt"}}

func newCUDA(gemm string) testsuite.NewBackend { return newCUDAWith(cuda.Options{Gemm: gemm}) }

// newCUDAWith is newCUDA with the backend's options whole.
func newCUDAWith(opt cuda.Options) testsuite.NewBackend {
	return func(t testing.TB, b *bundle.Bundle) loader.Backend {
		t.Helper()
		w, err := loader.OpenWeights(b, "")
		if err != nil {
			t.Fatal(err)
		}
		defer w.Close()
		be, err := cuda.New(b, w, opt)
		if err != nil {
			t.Fatal(err)
		}
		return be
	}
}

// TestCUDA runs the shared end-to-end suite on the GPU and records each check's outcome.
func TestCUDA(t *testing.T) {
	needGPU(t)
	for _, g := range gemmServers {
		for _, c := range testsuite.Checks {
			t.Run(g.mode+"/"+c.Name, func(t *testing.T) {
				defer func() { record("mi."+c.Name+g.suffix, map[string]bool{"pass": !t.Failed()}) }()
				c.Run(t, newCUDA(g.mode))
			})
		}
	}
}

// agreement generates greedily on the CPU, then makes the GPU score the same tokens
// (teacher forcing) and compares the logits of every step.
func agreement(t *testing.T, key string, b *bundle.Bundle, prompt []int, n int, sameTokens bool) {
	for _, g := range gemmServers {
		agreementWith(t, g.mode, key+g.suffix, b, prompt, n, sameTokens)
	}
}

func agreementWith(t *testing.T, gemm, key string, b *bundle.Bundle, prompt []int, n int, sameTokens bool) {
	agreementOn(t, newCUDA(gemm), gemm != cuda.GemmPTX, key, b, prompt, n, sameTokens)
}

// The bounds on the logits' relative error against the CPU's. The bundle's GEMMs carry x as
// a bf16 hi+lo pair (16 bits of mantissa); cuBLASLt (and the copy-engine GEMMs) take bf16(x),
// one rounding of every GEMM input as in PyTorch's bf16 path, and land 2-3x farther from the
// CPU's f32 (session 7 call 1: 0.0202 on Gemma 2's 150-token prompt with a window of 64,
// 0.0092 on Llama's; the PTX GEMMs 0.0092 and 0.0037 there).
const (
	ptxBound     = 2e-2
	libraryBound = 3e-2
)

// agreementOn is agreementWith on the backends nb makes; library says that GEMM inputs are
// rounded to bf16 there (cuBLASLt, the copy-engine GEMMs), which widens the bound.
func agreementOn(t *testing.T, nb testsuite.NewBackend, library bool, key string, b *bundle.Bundle, prompt []int, n int, sameTokens bool) {
	vocab := b.Manifest.Model.Vocab
	run := func(nb testsuite.NewBackend, force []int) ([]int, [][]float32) {
		rec := &testsuite.LogitRecorder{Backend: nb(t, b), Vocab: vocab}
		defer rec.Close()
		eng, err := loader.NewEngine(b, rec)
		if err != nil {
			t.Fatal(err)
		}
		res, err := eng.Generate([]loader.Request{{Prompt: prompt, MaxTokens: n, Force: force}})
		if err != nil {
			t.Fatal(err)
		}
		return res[0].Tokens, rec.Steps
	}
	cpuTok, cpuLogits := run(testsuite.NewCPU, nil)
	gpuTok, gpuLogits := run(nb, cpuTok)
	worst := 0.0
	for i := range cpuLogits {
		worst = max(worst, testsuite.RelL2(gpuLogits[i], cpuLogits[i]))
	}
	same := 0
	for i := range cpuTok {
		if i < len(gpuTok) && gpuTok[i] == cpuTok[i] {
			same++
		}
	}
	record("agreement."+key, map[string]any{"steps": len(cpuLogits), "max_logits_rel_err": worst,
		"greedy_tokens_equal": same, "greedy_tokens": len(cpuTok)})
	bound := ptxBound
	if library {
		bound = libraryBound
	}
	if !(worst <= bound) { // NaN fails too
		t.Errorf("%s: logits relative error %.3g > %.0e", key, worst, bound)
	}
	if sameTokens && same != len(cpuTok) {
		t.Errorf("%s: %d of %d greedy tokens agree", key, same, len(cpuTok))
	}
}

func TestCUDAMatchesCPUOnEmbeddedModel(t *testing.T) {
	needGPU(t)
	agreement(t, "tiny", embeddedModel(t), foxPrompt, 64, true)
}

// embeddedModel is the bundle of the embedded default model, its weights inside.
func embeddedModel(t *testing.T) *bundle.Bundle {
	dir := t.TempDir()
	if err := specs.Extract(dir); err != nil {
		t.Fatal(err)
	}
	b, err := compile.Build(filepath.Join(dir, specs.Default.Model), nil, compile.Options{EmbedWeights: true, Fuse: testsuite.Fuse})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// foxPrompt is the embedded model's agreement prompt.
var foxPrompt = loader.ByteTokenizer{}.Encode("Once upon a time, a little fox")

// TestCUDAOwnThreadMatchesCPU (xmix --cuda-own-thread): with every driver call handed to the
// backend's own thread, as before the caller's thread became the default, the embedded
// model agrees with the CPU, and checks that write buffers between steps (a vector), mix apps
// per row and admit requests mid-run pass. Every other GPU test runs on the default.
func TestCUDAOwnThreadMatchesCPU(t *testing.T) {
	needGPU(t)
	nb := newCUDAWith(cuda.Options{OwnThread: true})
	agreementOn(t, nb, true, "tiny@own-thread", embeddedModel(t), foxPrompt, 64, true)
	t.Run("set_vector", func(t *testing.T) { testsuite.CheckSetVector(t, nb) })
	t.Run("seven_apps_mixed", func(t *testing.T) { testsuite.CheckSevenAppsMixed(t, nb) })
	t.Run("continuous_batching", func(t *testing.T) { testsuite.CheckContinuousBatching(t, nb) })
}

// TestCUDAStagedGEMMMatchesCPU (xmixc build --gemm tc-staged): the staged kernels, built per
// bucket with a ring of W stages, agree with the CPU on the 1B cut as the default kernels do.
// Prefill chunks of 32 and 64 rows run them (two and one stages in flight; the decode buckets
// of this cut are GEMVs); a 150-token prompt crosses chunks.
func TestCUDAStagedGEMMMatchesCPU(t *testing.T) {
	needGPU(t)
	spec := strings.Replace(llama1BCut(t), "prefill_chunks: [64]", "prefill_chunks: [32, 64]", 1)
	b := testsuite.CompileWith(t, compile.Options{GEMM: "tc-staged"}, spec)
	long := longPrompt(32000)
	agreementWith(t, cuda.GemmPTX, "llama-3.2-1b-2layers-long-staged", b, long, 32, false)
}

// TestCUDATimeWithout (xmix bench --role-costs): a decode graph captured without all its
// nodes but the first replays faster than the whole graph, leaving out nothing takes about
// the whole graph's time, and leaving out every node is refused.
func TestCUDATimeWithout(t *testing.T) {
	needGPU(t)
	dir := t.TempDir()
	if err := specs.Extract(dir); err != nil {
		t.Fatal(err)
	}
	b, err := compile.Build(filepath.Join(dir, specs.Default.Model), nil, compile.Options{EmbedWeights: true})
	if err != nil {
		t.Fatal(err)
	}
	be := newCUDA(cuda.GemmPTX)(t, b).(*cuda.Backend)
	defer be.Close()
	ti := slices.IndexFunc(b.Templates, func(t bundle.Template) bool { return t.Kind == bundle.Decode })
	first := b.Templates[ti].Nodes[0].Label
	whole, err := be.Time(ti, 200)
	if err != nil {
		t.Fatal(err)
	}
	same, err := be.TimeWithout(ti, 200, func(string) bool { return false })
	if err != nil {
		t.Fatal(err)
	}
	one, err := be.TimeWithout(ti, 200, func(label string) bool { return label != first })
	if err != nil {
		t.Fatal(err)
	}
	record("time_without.tiny", map[string]float64{"whole_ms": whole, "nothing_left_out_ms": same, "first_node_only_ms": one})
	if !(one < whole) || !(same > whole/2 && same < 2*whole) {
		t.Errorf("whole graph %.4f ms, leaving out nothing %.4f, all but %s %.4f", whole, same, first, one)
	}
	if _, err := be.TimeWithout(ti, 1, func(string) bool { return true }); err == nil || !strings.Contains(err.Error(), "every node left out") {
		t.Errorf("every node left out: %v", err)
	}
}

// longPrompt is a 150-token prompt of token ids below vocab: it crosses prefill chunks and KV
// blocks, and the decode after it splits its context.
func longPrompt(vocab int) []int { return spreadPrompt(150, vocab) }

// spreadPrompt is an n-token prompt of token ids below vocab, spread over them.
func spreadPrompt(n, vocab int) []int {
	p := make([]int, n)
	for i := range p {
		p[i] = (i*7919 + 13) % vocab
	}
	return p
}

// smallServing is the serving section of the cuts: small buckets, short contexts.
const smallServing = "serving: {decode_buckets: [1, 2, 4], prefill_chunks: [64], max_seq_len: 256, max_seqs: 4, kv_block_size: 16}\n"

// cut8B is the 2-layer cut of Llama-3.1-8B whose only decode bucket has rows rows (as many
// sequences), with 64-row prefill chunks, 256 positions and KV blocks of 16.
func cut8B(t *testing.T, rows int) string { return cutAt(t, "llama-3.1-8b", rows) }

// cutAt is cut8B's cut of model with decode buckets of rows rows each (as many sequences as
// the last).
func cutAt(t *testing.T, model string, rows ...int) string {
	return testsuite.SpecCut(t, model, testsuite.CutServing(rows...))
}

// llama1BCut is Llama-3.2-1B's spec cut to 2 layers and small buckets.
func llama1BCut(t *testing.T) string { return testsuite.SpecCut(t, "llama-3.2-1b", smallServing) }

func TestCUDAMatchesCPUOnLlama1BCut(t *testing.T) {
	needGPU(t)
	b := testsuite.Compile(t, llama1BCut(t))
	agreement(t, "llama-3.2-1b-2layers", b, []int{791, 4062, 14198, 39935, 35308, 927}, 64, false)

	// A 150-token prompt: three prefill chunks on the tensor-core attention, crossing KV
	// blocks, then decode at contexts 150-214 split over 3-4 blocks per kv head and combined.
	long := longPrompt(32000)
	agreement(t, "llama-3.2-1b-2layers-long", b, long, 64, false)
}

// TestCUDAAttentionWarpsMatchCPU: decode attention blocks of 2 warps, which a bucket gets where
// blocks of 4 would take more than one wave (more than 66 rows on these Llamas, a bucket the
// suite's small specs do not have), agree with the CPU on the 1B cut: --attn-warps 2 gives
// every bucket the same kernel, and the 150-token prompt's decode splits its context.
func TestCUDAAttentionWarpsMatchCPU(t *testing.T) {
	needGPU(t)
	b := testsuite.CompileWith(t, compile.Options{AttnWarps: 2}, llama1BCut(t))
	long := longPrompt(32000)
	agreement(t, "llama-3.2-1b-2layers-long-attn-warps-2", b, long, 64, false)
}

// TestCUDAAttentionClusterMatchesCPU: the decode attention whose splits merge in a
// thread-block cluster (xmixc build --attn-cluster, for measuring) agrees with the CPU on the
// 1B cut whose only decode bucket has 4 rows (clusters of 8): a lone request's 700-token
// prompt decodes at contexts 700-716, six splits of 128 positions, the cluster's last two
// blocks exiting at once.
func TestCUDAAttentionClusterMatchesCPU(t *testing.T) {
	needGPU(t)
	attnAt4Rows(t, compile.Options{AttnCluster: true}, "_cl8_split", "llama-3.2-1b-2layers-700-attn-cluster")
}

// attnAt4Rows builds the 1B cut whose only decode bucket has 4 rows with opt, checks that it
// holds a kernel whose name contains kernel (the option's), and runs a lone request's
// 700-token prompt on it against the CPU, decoding at contexts 700-716 (key: the records').
func attnAt4Rows(t *testing.T, opt compile.Options, kernel, key string) *bundle.Bundle {
	cut := testsuite.SpecCut(t, "llama-3.2-1b", "serving: {decode_buckets: [4], prefill_chunks: [64], max_seq_len: 1024, max_seqs: 4, kv_block_size: 16}\n")
	b := testsuite.CompileWith(t, opt, cut)
	if !slices.ContainsFunc(b.Kernels, func(k bundle.Kernel) bool { return strings.Contains(k.Name, kernel) }) {
		t.Fatalf("no kernel %s in the bundle", kernel)
	}
	agreement(t, key, b, spreadPrompt(700, 32000), 16, false)
	return b
}

// TestCUDAAttentionEarlyKVMatchesCPU: the split decode attention that loads each warp's first
// K/V tile before its wait (xmixc build --attn-early-kv, the default) agrees with the CPU on
// the 1B cut in its decode bucket of 4 rows: a lone request's 700-token prompt decodes at
// contexts 700-716 (its splits' first tiles before the wait, the newest position's after),
// and 4 requests of six tokens (contexts of 7-22, the newest position in a warp's first tile).
func TestCUDAAttentionEarlyKVMatchesCPU(t *testing.T) {
	needGPU(t)
	b := attnAt4Rows(t, compile.Options{}, "_split_ekv", "llama-3.2-1b-2layers-700-attn-early-kv")
	agreementRows(t, newCUDA(cuda.GemmAuto), "llama-3.2-1b-2layers-attn-early-kv-4", b, sixTokenPrompts(4), 16)
}

// TestCUDAMatchesCPUOnGemma2Cut: a 2-layer cut of Gemma-2-2B (head dim 256, GeGLU,
// post-norms, both soft-caps; layer 0 sliding) agrees with the CPU on a short prompt and on
// a 150-token one (three prefill chunks on the tensor-core attention at head dim 256), and
// again with a window of 64 that the long prompt outgrows in prefill and decode.
func TestCUDAMatchesCPUOnGemma2Cut(t *testing.T) {
	needGPU(t)
	cut := testsuite.SpecCut(t, "gemma-2-2b", smallServing)
	long := longPrompt(256000)
	for _, w := range []string{"4096", "64"} {
		b := testsuite.Compile(t, strings.Replace(cut, "sliding_window: 4096", "sliding_window: "+w, 1))
		agreement(t, "gemma-2-2b-2layers-w"+w, b, []int{2, 651, 6037, 8426, 603, 476}, 64, false)
		agreement(t, "gemma-2-2b-2layers-w"+w+"-long", b, long, 64, false)
	}
}

// TestCUDACopyGemmMatchesCPU: the bundle's copy-engine GEMMs (bundle.OpGemmCopy: W through
// the copy engine, K split over a cluster of 2 CTAs for o and down) serve o, q/k/v and down
// of a 2-layer cut of Llama-3.1-8B under --gemm auto, cuBLASLt the other GEMMs, and the
// logits agree with the CPU's as cuBLASLt's do. With an 8-row bucket alone, a lone request
// runs in it, the 150-token prompt's decode splits its context, and 8 requests at once fill
// every row, each row's logits compared. With a 16-row bucket alone, 13 requests at once
// fill its kernels' first row tile and part of the second, each live row's logits compared
// in every decode step. 2-layer cuts of Llama-3.2-1B, whose buckets of up to 32 rows get
// them, fill an 8-row bucket and part of a 16-row one too.
func TestCUDACopyGemmMatchesCPU(t *testing.T) {
	needGPU(t)
	served := 0
	nb := copyGemmBackend(&served)
	const wantServed = 6 // o, q/k/v and down of 2 layers
	copyCut := func(model string, bucket int) *bundle.Bundle {
		cut := testsuite.SpecCut(t, model, fmt.Sprintf("serving: {decode_buckets: [%d], prefill_chunks: [64], max_seq_len: 256, max_seqs: 16, kv_block_size: 16}\n", bucket))
		b := testsuite.Compile(t, cut)
		kernels, err := bundle.GemmCopyKernels(b.Kernels)
		if err != nil || len(kernels) != 3 {
			t.Fatalf("%s, bucket %d: copy-engine GEMMs %v (%v), want o, q/k/v and down's", model, bucket, kernels, err)
		}
		return b
	}
	b := copyCut("llama-3.1-8b", 8)
	for _, c := range []struct {
		key    string
		prompt []int
	}{{"llama-3.1-8b-2layers-copy-gemm", []int{791, 4062, 14198, 39935, 35308, 927}}, {"llama-3.1-8b-2layers-copy-gemm-long", longPrompt(128000)}} {
		agreementOn(t, nb, true, c.key, b, c.prompt, 16, false)
		if served != wantServed {
			t.Errorf("%s: %d GEMM nodes served by the copy-engine kernels, want %d", c.key, served, wantServed)
		}
	}
	for _, c := range []struct {
		model                   string
		bucket, requests, steps int
	}{{"llama-3.1-8b", 8, 8, 8}, {"llama-3.1-8b", 16, 13, 4}, {"llama-3.2-1b", 8, 8, 8}, {"llama-3.2-1b", 16, 13, 4}} {
		prompts := sixTokenPrompts(c.requests)
		bb := b
		if c.model != "llama-3.1-8b" || c.bucket != 8 {
			bb = copyCut(c.model, c.bucket)
		}
		agreementRows(t, nb, fmt.Sprintf("%s-2layers-copy-gemm-r%d", c.model, c.bucket), bb, prompts, c.steps)
		if served != wantServed {
			t.Errorf("%d requests in a %d-row bucket: %d GEMM nodes served by the copy-engine kernels, want %d", c.requests, c.bucket, served, wantServed)
		}
	}
}

// copyGemmBackend makes CUDA backends under --gemm auto and sets *served to how many GEMM
// nodes the bundle's copy-engine kernels serve in each (and adds to *kernels, where given,
// those kernels' names not in it yet).
func copyGemmBackend(served *int, kernels ...*[]string) testsuite.NewBackend {
	return func(t testing.TB, b *bundle.Bundle) loader.Backend {
		be := newCUDA(cuda.GemmAuto)(t, b)
		*served = be.(*cuda.Backend).CopyGemmNodes()
		for _, k := range kernels {
			for _, name := range be.(*cuda.Backend).CopyGemmKernels() {
				if !slices.Contains(*k, name) {
					*k = append(*k, name)
				}
			}
		}
		return be
	}
}

// fedGemms is how many GEMM launches of a 2-layer cut with a decode bucket of rows rows
// and 64-row prefill chunks read bf16(x) as the launch ahead wrote it: each layer's q/k/v,
// o, gate/up and down in the decode template, and but o (whose x the prefill attention
// kernels write between them) in the prefill chunk's, except in a 64-row bucket, whose
// launches the prefill chunk shares.
func fedGemms(rows int) int {
	if rows == 64 {
		return 8
	}
	return 14
}

// recordCount wraps nb so that each backend it makes appends count of it to *dst: how many of
// its GEMM launches read bf16(x) as the launch ahead wrote it, with no cast
// ((*cuda.Backend).FedGemms), or write gu in bf16 for the gated activation after them
// ((*cuda.Backend).GuBF16Gemms).
func recordCount(nb testsuite.NewBackend, dst *[]int, count func(*cuda.Backend) int) testsuite.NewBackend {
	return func(t testing.TB, b *bundle.Bundle) loader.Backend {
		be := nb(t, b)
		*dst = append(*dst, count(be.(*cuda.Backend)))
		return be
	}
}

// TestCUDAWarpgroupGemmMatchesCPU runs the copy-engine GEMMs' warpgroup form (wgmma over the
// library cast's bf16 x; xmixc build --copy-gemm-rows 32, 64 or 128) on a 2-layer cut of
// Llama-3.1-8B in buckets of 32, 64 and 128 rows, every request teacher-forced to the CPU's
// tokens, against the CPU backend: o, q/k/v and down of both layers served by it. Each
// layer's GEMMs read bf16 of their x as the launch ahead wrote it (fedGemms: q/k/v and gate/up
// the add+norm's, o the attention's, down the gated gate/up kernel's or the SiLU kernel's),
// whichever server runs them. A subtest per bucket and request count (-run
// 'TestCUDAWarpgroupGemmMatchesCPU/r64'); the -wide ones built with --copy-gemm-wide, whose
// kernels of 64 and 128 rows multiply a CTA's columns of W by every row, K split over a
// cluster of 4 whose ranks add each column slice's sums; the -wide-rope ones with
// --rope-copy-rows at the bucket too, q/k/v's kernel rotating and writing the KV cache in
// that form (its ranks each owning whole pairs).
func TestCUDAWarpgroupGemmMatchesCPU(t *testing.T) {
	needGPU(t)
	served := 0
	var kernels []string
	var fed []int
	nb := recordCount(copyGemmBackend(&served, &kernels), &fed, (*cuda.Backend).FedGemms)
	for _, c := range []struct {
		bucket, requests, steps int
		wide, rope              bool
	}{{32, 32, 4, false, false}, {32, 19, 3, false, false}, {64, 50, 2, false, false}, {128, 128, 3, false, false}, {128, 70, 2, false, false},
		{64, 50, 2, true, false}, {128, 128, 3, true, false}, {128, 70, 2, true, false}, {64, 50, 2, true, true}, {128, 70, 2, true, true}} {
		name := fmt.Sprintf("r%d-n%d", c.bucket, c.requests)
		// Gated kernels at 32 rows alone (the default before session 64), so that cuBLASLt's
		// gate/up and the SiLU kernel feed down at 64 and 128 rows, as the counts below say;
		// TestCUDAGatedCopyMatchesCPU runs the gated kernels of 64 and 128 rows.
		opt := compile.Options{CopyGemmRows: []int{c.bucket}, CopyGemmWide: c.wide, GatedCopyRows: 32}
		if c.wide {
			name += "-wide"
		}
		if c.rope {
			name += "-rope"
			opt.RopeCopyRows = c.bucket
		}
		t.Run(name, func(t *testing.T) {
			kernels, fed = nil, nil
			cut := cut8B(t, c.bucket)
			b := testsuite.CompileWith(t, opt, cut)
			ks, err := bundle.GemmCopyKernels(b.Kernels)
			if err != nil {
				t.Fatal(err)
			}
			for shape, list := range ks {
				for _, k := range list {
					// The wide form: a warpgroup per 64 rows and the producer warp (q/k/v's
					// with rope_kv too).
					if (shape.Act == "" || shape.Act == bundle.OpRopeKV) && (k.Attrs.Block == c.bucket/64*128+32) != c.wide {
						t.Fatalf("%s: %d threads, want the wide form %v", k.Kernel, k.Attrs.Block, c.wide)
					}
				}
			}
			prompts := sixTokenPrompts(c.requests)
			agreementRows(t, nb, fmt.Sprintf("llama-3.1-8b-2layers-wgmma-gemm-r%d-n%d", c.bucket, c.requests), b, prompts, c.steps)
			// o, q/k/v and down of 2 layers in the decode template (and in a 32-row bucket
			// gate/up with SiLU), and in a 128-row bucket the
			// 64-row prefill chunk's too. A 64-row bucket's nodes and the chunk's are the
			// same shapes and buffers, so one launch serves both, but for o: the decode
			// template's reads the attention's bf16 z, the chunk's casts (fedGemms).
			want := 6
			switch {
			case c.bucket <= 32, c.bucket == 64:
				want = 8
			case c.bucket > 64:
				want = 12
			}
			if served != want {
				t.Errorf("%d requests in a %d-row bucket: %d GEMM nodes served by the warpgroup kernels, want %d", c.requests, c.bucket, served, want)
			}
			if want := fedGemms(c.bucket); !slices.Equal(fed, []int{want}) {
				t.Errorf("%d-row bucket: %v GEMM launches fed, want %d", c.bucket, fed, want)
			}
			// In buckets of up to codegen.DefaultRopeCopyRows rows (or the build's) q/k/v's
			// kernel has the rope_kv after it in its epilogue.
			rope := slices.ContainsFunc(kernels, func(k string) bool { return strings.Contains(k, "_rope_kv_") })
			if rope != (c.bucket <= codegen.DefaultRopeCopyRows || c.rope) {
				t.Errorf("%d-row bucket: copy-engine kernels %v: q/k/v's with rope_kv %v, want %v", c.bucket, kernels, rope, !rope)
			}
		})
	}
}

// TestCUDAWideServesFewerRows: a build whose copy-engine kernels are the wide form's of 64 rows
// alone (xmixc build --copy-gemm-rows 64 --copy-gemm-wide --gated-copy-rows 64
// --rope-copy-rows 64) serves the 32-row bucket of a 2-layer cut of Llama-3.1-8B with them,
// x's rows past the bucket's zero-filled: o, down, gate/up with SiLU (a wide gated kernel
// serves half its rows, bundle.GemmCopyAttrs.Wide) and q/k/v with rope_kv, every request
// teacher-forced to the CPU's tokens.
func TestCUDAWideServesFewerRows(t *testing.T) {
	needGPU(t)
	served := 0
	var kernels []string
	nb := copyGemmBackend(&served, &kernels)
	cut := cut8B(t, 32)
	b := testsuite.CompileWith(t, compile.Options{CopyGemmRows: []int{64}, CopyGemmWide: true, GatedCopyRows: 64, RopeCopyRows: 64}, cut)
	agreementRows(t, nb, "llama-3.1-8b-2layers-wide64-r32-n19", b, sixTokenPrompts(19), 3)
	wantServed(t, kernels, "gemm_copy_k4096_n4096_r64", "gemm_copy_k14336_n4096_r64", "gemm_copy_k4096_n28672_r64_silu_mul", "gemm_copy_k4096_n6144_r64_rope_kv_h32_kv8_d128_bf16")
	if served < 8 {
		t.Errorf("%d GEMM nodes served by the wide kernels, want the decode template's 8 at least", served)
	}
}

// wantServed fails t unless every kernel of want is among the copy-engine kernels served.
func wantServed(t *testing.T, served []string, want ...string) {
	t.Helper()
	for _, k := range want {
		if !slices.Contains(served, k) {
			t.Errorf("copy-engine kernels served %v: want %s among them", served, k)
		}
	}
}

// TestCUDACopyGemmNextAtAskMatchesCPU: with xmixc build --copy-gemm-next asked the grid after
// a copy-engine GEMM launches while the GEMM still reads W, so only the kernel's own wait
// orders it; the 2-layer cut of Llama-3.1-8B in buckets of 8 and 32 rows (the 32-row one with
// the gated gate/up), every request teacher-forced to the CPU's tokens, against the CPU backend.
// The 8-row bucket's o, q/k/v and down of 2 layers are served; in the 32-row cut, those and
// gate/up with SiLU, which --gated-copy-wide auto gives the 64-row wide kernel (more CTAs than
// the 32-row one's on these shapes), and so the 64-row prefill chunk's gate/up with SiLU too.
func TestCUDACopyGemmNextAtAskMatchesCPU(t *testing.T) {
	needGPU(t)
	served := 0
	nb := copyGemmBackend(&served)
	for _, c := range []struct{ bucket, requests, want int }{{8, 8, 6}, {32, 27, 10}} {
		t.Run(fmt.Sprintf("r%d", c.bucket), func(t *testing.T) {
			cut := cut8B(t, c.bucket)
			b := testsuite.CompileWith(t, compile.Options{CopyGemmNextAtAsk: true}, cut)
			agreementRows(t, nb, fmt.Sprintf("llama-3.1-8b-2layers-copy-gemm-next-asked-r%d", c.bucket), b, sixTokenPrompts(c.requests), 4)
			if served != c.want {
				t.Errorf("%d-row bucket: %d GEMM nodes served by the copy-engine kernels, want %d", c.bucket, served, c.want)
			}
		})
	}
}

// gatedTCBuckets are TestCUDAGatedTCMatchesCPU's buckets, with the requests and steps each
// runs against the CPU.
var gatedTCBuckets = []struct{ bucket, requests, steps int }{{8, 8, 6}, {16, 13, 4}, {32, 27, 3}}

// gatedTCBundle is the 2-layer cut of Llama-3.1-8B with one decode bucket of rows rows built
// with --gated-tc-rows rows and no gated copy-engine kernels (where one serves a bucket, as
// the 32-row kernel does the 32-row bucket by default, codegen gives it no gated tensor-core
// kernel): both layers' decode gate/up run the tensor-core kernel with the activation, and
// no activation kernel is left in the bucket.
func gatedTCBundle(t *testing.T, rows int) *bundle.Bundle {
	b := testsuite.CompileWith(t, compile.Options{GatedTCRows: rows, GatedCopyRows: -1}, cut8B(t, rows))
	if gated, acts := gatedTCKernels(b); gated != 2 || acts != 0 {
		t.Fatalf("%d-row bucket: %d tensor-core gate/up kernels and %d activation kernels, want 2 and 0", rows, gated, acts)
	}
	return b
}

// gatedTCKernels counts the decode templates' gated tensor-core kernels and activation kernels.
func gatedTCKernels(b *bundle.Bundle) (gated, acts int) {
	for _, tm := range b.Templates {
		if tm.Kind != bundle.Decode {
			continue
		}
		for _, n := range tm.Nodes {
			switch name := n.Kernel; {
			case strings.HasPrefix(name, "gemm_tcg_"):
				gated++
			case strings.HasPrefix(name, "silu_mul"):
				acts++
			}
		}
	}
	return gated, acts
}

// TestGatedTCBuilds (no GPU): TestCUDAGatedTCMatchesCPU's bundles give each bucket the kernel
// it runs against the CPU, so a build rule that takes it away fails here and not first on a
// GPU (e38a6f1's did, session 91); and with the default gated copy-engine kernels the 32-row
// bucket's gate/up is theirs, the rule that makes gatedTCBundle turn them off.
func TestGatedTCBuilds(t *testing.T) {
	for _, c := range gatedTCBuckets {
		t.Run(fmt.Sprintf("r%d", c.bucket), func(t *testing.T) { gatedTCBundle(t, c.bucket) })
	}
	b := testsuite.CompileWith(t, compile.Options{GatedTCRows: 32}, cut8B(t, 32))
	if gated, acts := gatedTCKernels(b); gated != 0 || acts != 2 {
		t.Errorf("32-row bucket with gated copy-engine kernels: %d tensor-core gate/up kernels and %d activation kernels, want 0 and 2", gated, acts)
	}
}

// TestCUDAGatedTCMatchesCPU: the gate/up projection with its activation as one tensor-core
// kernel (xmixc build --gated-tc-rows) in buckets of 8, 16 and 32 rows of a 2-layer cut of
// Llama-3.1-8B under --gemm auto (the copy-engine kernels serve o, q/k/v and down), every
// request teacher-forced to the CPU's tokens (gatedTCBundle). A subtest per bucket (-run
// 'TestCUDAGatedTCMatchesCPU/r8'), and r8-app (below).
func TestCUDAGatedTCMatchesCPU(t *testing.T) {
	needGPU(t)
	served := 0
	nb := copyGemmBackend(&served)
	for _, c := range gatedTCBuckets {
		t.Run(fmt.Sprintf("r%d", c.bucket), func(t *testing.T) {
			b := gatedTCBundle(t, c.bucket)
			agreementRows(t, nb, fmt.Sprintf("llama-3.1-8b-2layers-gated-tc-r%d", c.bucket), b, sixTokenPrompts(c.requests), c.steps)
			if served != 6 {
				t.Errorf("%d-row bucket: %d GEMM nodes served by the copy-engine kernels, want o, q/k/v and down of 2 layers", c.bucket, served)
			}
		})
	}
	// An app's op at mlp.act of layer 1 runs in an MI kernel after that layer's gated kernel
	// (passes' foldGateAct), so the 8-row bucket's requests without the app get the bare
	// bundle's bits; with the layer's gate/up on cuBLASLt in the graphs that may run the op,
	// as before session 63, they did not.
	t.Run("r8-app", func(t *testing.T) {
		cut := cut8B(t, 8)
		with, bare := testsuite.Compile(t, cut, actScaleApp), testsuite.Compile(t, cut)
		testsuite.AppRowsKeepBits(t, nb, with, bare, "act-scale", sixTokenPrompts(8), 4)
	})
}

// TestCUDARopeInAttention: by default (--rope-in-attention) a 2-layer cut of Llama-3.1-8B's
// 128-row bucket runs no rope_kv kernel: its attention rotates q and writes the newest k and v
// itself. Its logits are those of the bundle with rope_kv apart (--rope-in-attention=false)
// bit for bit (the same tokens, teacher-forced) under both GEMM servers, and it agrees with
// the CPU.
func TestCUDARopeInAttention(t *testing.T) {
	needGPU(t)
	cut := cut8B(t, 128)
	plain := testsuite.CompileWith(t, compile.Options{RopeApart: true}, cut)
	b := testsuite.Compile(t, cut)
	for _, tm := range b.Templates {
		for _, n := range tm.Nodes {
			if tm.Name == "decode_b128" && strings.HasPrefix(n.Kernel, "rope_kv") || strings.HasPrefix(n.Kernel, "attention") && strings.HasSuffix(n.Kernel, "_rope") != (tm.Name == "decode_b128") {
				t.Fatalf("%s: node %s runs %s", tm.Name, n.Label, n.Kernel)
			}
		}
	}
	prompts := sixTokenPrompts(100)
	for _, g := range gemmServers {
		toks, want, _ := stepLogits(t, g.mode, plain, prompts, 3, nil)
		_, got, _ := stepLogits(t, g.mode, b, prompts, 3, toks)
		equal := sameLogits(got, want)
		record("build_bits.llama-3.1-8b-2layers-r128.rope_in_attention"+g.suffix, map[string]any{"steps": len(want), "equal": equal})
		if !equal {
			t.Errorf("%s: the logits with the rotation in the attention differ from the default bundle's", g.mode)
		}
	}
	agreementRows(t, newCUDA(cuda.GemmAuto), "llama-3.1-8b-2layers-rope-in-attention-r128", b, prompts, 2)
}

// TestCUDARopeOneWaveMatchesCPU: with rope_kv apart (--rope-in-attention=false), a 2-layer
// cut of Llama-3.1-8B's 128-row bucket runs its rope_kv over two blocks a row where three
// would take more than a wave (--rope-one-wave, the default; each thread rotating up to two
// heads), and agrees with the CPU under --gemm auto, every request teacher-forced to the
// CPU's tokens (the kernel's bits are the one-head-a-thread kernel's: codegen's
// TestRopeKVFewerGroups).
func TestCUDARopeOneWaveMatchesCPU(t *testing.T) {
	needGPU(t)
	b := testsuite.CompileWith(t, compile.Options{RopeApart: true}, cut8B(t, 128))
	grouped := 0
	for _, tm := range b.Templates {
		for _, n := range tm.Nodes {
			if strings.HasPrefix(n.Kernel, "rope_kv_") && strings.HasSuffix(n.Kernel, "_g2") && n.Grid == [3]int{128, 2, 1} {
				grouped++
			}
		}
	}
	if grouped != 2 {
		t.Fatalf("%d rope_kv launches over two blocks a row, want the 128-row bucket's 2", grouped)
	}
	agreementRows(t, newCUDA(cuda.GemmAuto), "llama-3.1-8b-2layers-rope-one-wave-r128", b, sixTokenPrompts(100), 2)
}

// TestCUDAGatedCopyMatchesCPU: the warpgroup copy-engine kernel with the activation in its
// epilogue (xmixc build --gated-copy-rows) serving each layer's gate/up GEMM and SiLU kernel
// as one launch, in buckets of 32 and 64 rows of a 2-layer cut of Llama-3.1-8B under --gemm
// auto, every request teacher-forced to the CPU's tokens: 8 launches of the copy-engine
// kernels (o, q/k/v and down of 2 layers, and the 2 pairs; a 64-row bucket's prefill chunk
// has the same shapes and buffers, so the same launches serve it). A subtest per bucket
// (-run 'TestCUDAGatedCopyMatchesCPU/r32'), and r32-app: an app's op at mlp.act leaves those
// rows without the app the bare bundle's bits (r128-app: in a default bundle's 128-row
// bucket), r32-wide: the 32-row bucket where the 64-row wide kernel is within
// --gated-copy-rows (--gated-copy-wide auto picks it for the 8B's shapes), r8-wide: the 8B's
// 8-row bucket, which that kernel serves in a default build with a 32-row bucket, 1b-r32: a cut of
// Llama-3.2-1B's default bundle at 32 rows, o, q/k/v and down on copy-engine kernels too,
// 1b-r128: its 128-row bucket, down on cuBLASLt. The down projections read the pair's bf16
// output, the pair and q/k/v the add+norm's (fedGemms).
func TestCUDAGatedCopyMatchesCPU(t *testing.T) {
	needGPU(t)
	served := 0
	var fed []int // each backend's GEMM launches fed bf16(x) by the launch ahead
	nb := recordCount(copyGemmBackend(&served), &fed, (*cuda.Backend).FedGemms)
	for _, c := range []struct{ bucket, requests, steps int }{{32, 27, 3}, {64, 50, 2}} {
		t.Run(fmt.Sprintf("r%d", c.bucket), func(t *testing.T) {
			fed = nil
			cut := cut8B(t, c.bucket)
			b := testsuite.CompileWith(t, compile.Options{GatedCopyRows: c.bucket}, cut)
			prompts := sixTokenPrompts(c.requests)
			agreementRows(t, nb, fmt.Sprintf("llama-3.1-8b-2layers-gated-copy-r%d", c.bucket), b, prompts, c.steps)
			// o, q/k/v, down and gate/up with SiLU of 2 layers; in a 64-row bucket, whose
			// launches the 64-row prefill chunk shares, o's twice: the decode template's fed
			// the attention's bf16 z, the chunk's behind its cast.
			if want := map[int]int{32: 8, 64: 10}[c.bucket]; served != want {
				t.Errorf("%d-row bucket: %d launches of the copy-engine kernels, want %d", c.bucket, served, want)
			}
			if want := fedGemms(c.bucket); !slices.Equal(fed, []int{want}) {
				t.Errorf("%d-row bucket: %v GEMM launches fed, want %d", c.bucket, fed, want)
			}
		})
	}
	// The wide form (--gated-copy-rows 128; 64 rows take it too, above): at 128 rows two
	// warpgroups multiply a CTA's 112 columns of gate and of up by every row, and the kernel
	// serves the bucket's gate/up and SiLU of both layers.
	t.Run("r128", func(t *testing.T) {
		var kernels []string
		cut := cut8B(t, 128)
		b := testsuite.CompileWith(t, compile.Options{GatedCopyRows: 128}, cut)
		agreementRows(t, copyGemmBackend(&served, &kernels), "llama-3.1-8b-2layers-gated-copy-r128", b, sixTokenPrompts(100), 2)
		wantServed(t, kernels, "gemm_copy_k4096_n28672_r128_silu_mul")
	})
	// With 64-row kernels in the build the 32-row bucket's gate/up and SiLU run the 64-row
	// wide kernel (128 CTAs against its own's 112) over x's 32 zero-filled rows past the
	// bucket's, which compute no activation.
	t.Run("r32-wide", func(t *testing.T) {
		var kernels []string
		cut := cut8B(t, 32)
		b := testsuite.CompileWith(t, compile.Options{GatedCopyRows: 64}, cut)
		agreementRows(t, copyGemmBackend(&served, &kernels), "llama-3.1-8b-2layers-gated-copy-r32-wide", b, sixTokenPrompts(27), 3)
		wantServed(t, kernels, "gemm_copy_k4096_n28672_r64_silu_mul")
	})
	// Llama-3.2-1B's default 32-row bucket (codegen's copyGemmShapes): o, q/k/v with rope_kv,
	// down and gate/up with SiLU of both layers on copy-engine kernels.
	t.Run("1b-r32", func(t *testing.T) {
		b := testsuite.Compile(t, cutAt(t, "llama-3.2-1b", 32))
		agreementRows(t, nb, "llama-3.2-1b-2layers-copy-r32", b, sixTokenPrompts(27), 3)
		if served != 8 {
			t.Errorf("%d launches of the copy-engine kernels, want 8", served)
		}
	})
	// The 8B's default 8-row bucket beside a 32-row one: the 32-row bucket's 64-row wide
	// kernel serves its gate/up and SiLU (codegen's gatedCopyServes gives it no gated
	// tensor-core kernel), over x's 56 zero-filled rows past the bucket's.
	t.Run("r8-wide", func(t *testing.T) {
		var kernels []string
		b := testsuite.Compile(t, cutAt(t, "llama-3.1-8b", 8, 32))
		for _, tm := range b.Templates {
			for _, n := range tm.Nodes {
				if strings.HasPrefix(n.Kernel, "gemm_tcg_") {
					t.Fatalf("%s: node %s runs %s, want the GEMM node and the SiLU kernel", tm.Name, n.Label, n.Kernel)
				}
			}
		}
		agreementRows(t, copyGemmBackend(&served, &kernels), "llama-3.1-8b-2layers-gated-copy-r8-wide", b, sixTokenPrompts(8), 4)
		wantServed(t, kernels, "gemm_copy_k4096_n28672_r64_silu_mul")
	})
	// Its default 128-row bucket: gate/up with SiLU on the wide gated kernel, down on
	// cuBLASLt, which reads the kernel's bf16 output where it wrote it, with no cast (so in
	// the 64-row prefill chunk's), every layer's GEMMs fed.
	t.Run("1b-r128", func(t *testing.T) {
		fed = nil
		var kernels []string
		b := testsuite.Compile(t, cutAt(t, "llama-3.2-1b", 128))
		listing := recordCount(copyGemmBackend(&served, &kernels), &fed, (*cuda.Backend).FedGemms)
		agreementRows(t, listing, "llama-3.2-1b-2layers-copy-r128", b, sixTokenPrompts(100), 2)
		wantServed(t, kernels, "gemm_copy_k2048_n16384_r128_silu_mul")
		if want := fedGemms(128); !slices.Equal(fed, []int{want}) {
			t.Errorf("%v GEMM launches fed, want %d", fed, want)
		}
	})
	// An app's op at mlp.act runs in an MI kernel of its own in such buckets, so that every
	// graph serves both layers' gate/up and SiLU as one launch: the requests without the app
	// get the bare bundle's tokens and logprobs bit for bit, the ones with it others. The op
	// sits between layer 1's activation and its down projection, so in the graphs that may run
	// it that down projection casts the op's output itself; the graph of steps without apps
	// (the template's plain list) feeds it the gated kernel's bf16 output, as layer 0's
	// everywhere, and so in the prefill chunk's (cuBLASLt's, fed by the SiLU kernel; there
	// the op is in the activation's MI form). With the app layer 1's gated pair is two
	// launches, each fed by the add+norm: the graphs that may run the op keep its f32 output,
	// the plain list's writes the bf16 alone. So one launch more is fed than in the bare
	// bundle.
	t.Run("r32-app", func(t *testing.T) {
		fed = nil
		cut := cut8B(t, 32)
		opt := compile.Options{GatedCopyRows: 32}
		with, bare := testsuite.CompileWith(t, opt, cut, actScaleApp), testsuite.CompileWith(t, opt, cut)
		appRowsKeepBits(t, nb, with, bare, "act-scale")
		if served != 8 {
			t.Errorf("%d launches of the copy-engine kernels, want 8", served)
		}
		if want := fedGemms(32); !slices.Equal(fed, []int{want + 1, want}) {
			t.Errorf("GEMM launches fed: %v, want %d with the app and %d without", fed, want+1, want)
		}
	})
	// The same in a default bundle's 128-row bucket, whose gate/up and SiLU the wide gated
	// kernel serves (the default since session 64).
	t.Run("r128-app", func(t *testing.T) {
		cut := cut8B(t, 128)
		with, bare := testsuite.CompileWith(t, compile.Options{}, cut, actScaleApp), testsuite.CompileWith(t, compile.Options{}, cut)
		appRowsKeepBits(t, nb, with, bare, "act-scale")
	})
}

// actScaleApp scales layer 1's mlp.act by a random vector: an op between the gate/up pair's
// activation and the down projection.
const actScaleApp = "app: act-scale\nparams: {s: {random: 23}}\nops:\n  - write: {at: {layers: [1], hook: mlp.act}, kernel: scale, args: {vector: s}}\n"

// appRowsKeepBits is testsuite.AppRowsKeepBits over 27 requests of six tokens for 3 steps
// (in the decode bucket that takes them).
func appRowsKeepBits(t *testing.T, nb testsuite.NewBackend, with, bare *bundle.Bundle, app string) {
	t.Helper()
	testsuite.AppRowsKeepBits(t, nb, with, bare, app, sixTokenPrompts(27), 3)
}

// TestCUDAFedGemmsMatchCPU: in a 128-row bucket of a bundle built with --gated-copy-rows 32
// (the default before session 64) cuBLASLt serves q/k/v and gate/up and the copy-engine
// kernels o and down, and q/k/v and gate/up read bf16 of the
// add+norm's output, o of the attention's and down of the SiLU kernel's as those kernels
// wrote it, with no cast, and gate/up writes gu in bf16 for the SiLU kernel (both layers, in
// the decode bucket and the 64-row prefill chunk): a 2-layer cut of Llama-3.1-8B, every
// request teacher-forced to the CPU's tokens, both layers' GEMMs fed (fedGemms). With an
// app's op at layer 1's mlp.act (in an MI kernel of its own after the plain activation) that
// layer's down projection casts, except in the graphs without apps, and every template's
// lists write gu in bf16; the rows without the app get the bare bundle's tokens and logprobs
// bit for bit. With --gu-f32 (Options.GuF32) no GEMM writes gu in bf16.
func TestCUDAFedGemmsMatchCPU(t *testing.T) {
	needGPU(t)
	var fed, gu []int
	nb := recordCount(recordCount(newCUDA(cuda.GemmAuto), &fed, (*cuda.Backend).FedGemms), &gu, (*cuda.Backend).GuBF16Gemms)
	cut := cut8B(t, 128)
	opt := compile.Options{GatedCopyRows: 32}
	bare := testsuite.CompileWith(t, opt, cut)
	agreementRows(t, nb, "llama-3.1-8b-2layers-act-feed-r128", bare, sixTokenPrompts(70), 2)
	if want := fedGemms(128); !slices.Equal(fed, []int{want}) {
		t.Errorf("%v GEMM launches fed, want %d", fed, want)
	}
	if !slices.Equal(gu, []int{4}) {
		t.Errorf("%v GEMM launches write gu in bf16, want 4", gu)
	}
	fed, gu = nil, nil
	appRowsKeepBits(t, nb, testsuite.CompileWith(t, opt, cut, actScaleApp), bare, "act-scale")
	// Layer 1's down projection in each template's plain list.
	if want := fedGemms(128); !slices.Equal(fed, []int{want, want}) {
		t.Errorf("GEMM launches fed: %v, want %d with the app and without", fed, want)
	}
	if !slices.Equal(gu, []int{8, 4}) {
		t.Errorf("GEMM launches writing gu in bf16: %v, want 8 with the app (its graphs and the plain lists) and 4 without", gu)
	}
	gu = nil
	f32 := recordCount(newCUDAWith(cuda.Options{Gemm: cuda.GemmAuto, GuF32: true}), &gu, (*cuda.Backend).GuBF16Gemms)
	agreementRows(t, f32, "llama-3.1-8b-2layers-act-feed-r128-gu-f32", bare, sixTokenPrompts(70), 2)
	if !slices.Equal(gu, []int{0}) {
		t.Errorf("--gu-f32: %v GEMM launches write gu in bf16, want 0", gu)
	}
}

// lens0App is a logit lens on the residual after layer 0: heavy nodes (a second LM head) between
// layer 1's add+norm and its q/k/v GEMM.
const lens0App = "app: lens0\nbuffers:\n  top: {shape: [10], dtype: f32, export: true}\nops:\n  - read: {at: {layers: [0], hook: resid_post}, kernel: logit_lens, args: {k: 5}, into: top}\n"

// TestCUDALensKeepsFeeds: with a logit lens at layer 0 of a 2-layer cut of Llama-3.1-8B, layer
// 1's q/k/v GEMM still reads bf16 of the add+norm's output as that kernel wrote it, past the
// lens's nodes (loader/cuda's fedAt), in buckets of 8 rows (copy-engine GEMMs) and 128
// (cuBLASLt's q/k/v): in every template the graph without the lens casts as often as the
// app-free list, and the graph with it once more (the lens's LM head on cuBLASLt, casting into
// a scratch of its own). Every request, half of them enabling the lens in the same steps, gets
// the bare bundle's tokens and logprobs bit for bit: the lens's cast overwrites no bf16 copy
// that a GEMM after it reads.
func TestCUDALensKeepsFeeds(t *testing.T) {
	needGPU(t)
	for _, c := range []struct{ rows, requests int }{{8, 8}, {128, 27}} {
		t.Run(fmt.Sprintf("r%d", c.rows), func(t *testing.T) {
			var casts [][][]int
			nb := func(t testing.TB, b *bundle.Bundle) loader.Backend {
				be := newCUDA(cuda.GemmAuto)(t, b)
				casts = append(casts, be.(*cuda.Backend).GraphCasts())
				return be
			}
			cut := cut8B(t, c.rows)
			run := func(b *bundle.Bundle, apps []string) []loader.Result {
				var reqs []loader.Request
				for i, p := range sixTokenPrompts(c.requests) {
					r := loader.Request{Prompt: p, MaxTokens: 3, Logprobs: true}
					if i%2 == 0 {
						r.Apps = apps
					}
					reqs = append(reqs, r)
				}
				return testsuite.Generate(t, nb, b, reqs)
			}
			got, want := run(testsuite.CompileWith(t, compile.Options{}, cut, lens0App), []string{"lens0"}), run(testsuite.Compile(t, cut), nil)
			for i := range got {
				if !slices.Equal(got[i].Tokens, want[i].Tokens) || !reflect.DeepEqual(got[i].Logprobs, want[i].Logprobs) {
					t.Fatalf("request %d (lens enabled: %v): tokens %v, logprobs %v; the bare bundle's %v, %v", i, i%2 == 0, got[i].Tokens, got[i].Logprobs, want[i].Tokens, want[i].Logprobs)
				}
			}
			with, bare := casts[0], casts[1]
			if len(with) != len(bare) {
				t.Fatalf("%d templates with the lens, %d without", len(with), len(bare))
			}
			for i, v := range with {
				// Variants: without the lens's nodes, with them, the plain list.
				if len(v) != 3 || len(bare[i]) != 1 || v[0] != bare[i][0] || v[2] != bare[i][0] || v[1] != v[0]+1 {
					t.Errorf("template %d: casts %v in the graphs without the lens, with it and the plain list; want %d, %d, %d (the app-free bundle's %v)", i, v, bare[i][0], bare[i][0]+1, bare[i][0], bare[i])
				}
			}
		})
	}
}

// TestCUDARopeCopyKeepsBits: an app's op at attn.q of layer 1 sits between that layer's q/k/v
// GEMM and its rope_kv, so the graphs of steps with the app run that layer's GEMM on the plain
// copy-engine kernel and rope_kv apart, while the graph of steps without apps runs the kernel
// with rope_kv in its epilogue: the requests without the app get the bare bundle's tokens and
// logprobs bit for bit (the build gives the plain kernel the fused one's form and K split, so
// a column gets the same sums), the ones with it others. r32: the 8B's 32-row bucket (the
// default); r16: its 16-row bucket beside a 32-row one, whose kernel with rope_kv serves the
// 16-row bucket's pairs, so the split layer takes the 32-row plain kernel (its twin) and not
// the 16-row one; r128-wide: its 128-row bucket with the wide kernel with rope_kv, whose plain
// twin takes the wide form with K split over 4 though the build does not ask for it; 1b-r32:
// the 1B's 32-row bucket, whose plain q/k/v kernel splits K over 2 in a build without rope_kv
// and over none beside it.
func TestCUDARopeCopyKeepsBits(t *testing.T) {
	needGPU(t)
	app := "app: q-scale\nparams: {s: {random: 29}}\nops:\n  - write: {at: {layers: [1], hook: attn.q}, kernel: scale, args: {vector: s}}\n"
	for _, c := range []struct {
		name, model string
		buckets     []int
		requests    int
		opt         compile.Options
		plain       string
	}{
		{"r32", "llama-3.1-8b", []int{32}, 27, compile.Options{}, "gemm_copy_k4096_n6144_r32"},
		{"r16", "llama-3.1-8b", []int{16, 32}, 13, compile.Options{}, "gemm_copy_k4096_n6144_r32"},
		{"r128-wide", "llama-3.1-8b", []int{128}, 27, compile.Options{RopeCopyRows: 128, CopyGemms: []string{"4096x4096", "4096x6144", "14336x4096"}}, "gemm_copy_k4096_n6144_r128"},
		{"1b-r32", "llama-3.2-1b", []int{32}, 27, compile.Options{CopyGemms: []string{"2048x3072"}}, "gemm_copy_k2048_n3072_r32"},
	} {
		t.Run(c.name, func(t *testing.T) {
			served := 0
			var kernels []string
			cut := cutAt(t, c.model, c.buckets...)
			with, bare := testsuite.CompileWith(t, c.opt, cut, app), testsuite.CompileWith(t, c.opt, cut)
			testsuite.AppRowsKeepBits(t, copyGemmBackend(&served, &kernels), with, bare, "q-scale", sixTokenPrompts(c.requests), 3)
			if !slices.ContainsFunc(kernels, func(k string) bool { return strings.Contains(k, "_rope_kv_") }) || !slices.Contains(kernels, c.plain) {
				t.Fatalf("copy-engine kernels %v: want q/k/v's with rope_kv and the plain one, %s (layer 1's with the app)", kernels, c.plain)
			}
		})
	}
}

// TestCUDATraceFollowsTheGraph: with Options.Trace, one replay of a 32-row decode graph of a
// 2-layer 8B cut (copy-engine GEMMs fed bf16 x by the launch ahead, the gated gate/up kernel,
// cuBLASLt's LM head behind its cast) gives every launch of a bundle kernel or a cast a
// record from each of its CTAs, cuBLASLt's none; no launch's wait returns before the traced
// launch ahead of it ended (the kernels' stamps and the driver's order agree); thread 0 ends
// no later than its CTA's last warp, and warp 0 with it; no launch's 64 working CTAs or more
// all ran on one SM (%smid recorded: an SM holds at most 32 CTAs at once). A backend loaded
// without Trace refuses.
func TestCUDATraceFollowsTheGraph(t *testing.T) {
	needGPU(t)
	cut := cut8B(t, 32)
	b := testsuite.Compile(t, cut)
	w, err := loader.OpenWeights(b, "")
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	be, err := cuda.New(b, w, cuda.Options{Gemm: cuda.GemmAuto, Trace: true})
	if err != nil {
		t.Fatal(err)
	}
	defer be.Close()
	eng, err := loader.NewEngine(b, be)
	if err != nil {
		t.Fatal(err)
	}
	var reqs []loader.Request
	for _, p := range sixTokenPrompts(32) {
		reqs = append(reqs, loader.Request{Prompt: p, MaxTokens: 2})
	}
	if _, err := eng.Generate(reqs); err != nil {
		t.Fatal(err)
	}
	ti := slices.IndexFunc(b.Templates, func(t bundle.Template) bool { return t.Name == "decode_b32" })
	spans, err := be.Trace(ti)
	if err != nil {
		t.Fatal(err)
	}
	casts, library := 0, 0
	var ahead *cuda.TraceSpan
	for i, sp := range spans {
		switch {
		case sp.Kernel == "cublasLt":
			library++
			if sp.Records != 0 {
				t.Errorf("launch %d (%s): cuBLASLt's kernel left %d records", i, sp.Label, sp.Records)
			}
			continue
		case sp.Records != sp.CTAs:
			t.Errorf("launch %d (%s, %s): %d records of %d CTAs", i, sp.Label, sp.Kernel, sp.Records, sp.CTAs)
		case sp.Ended < sp.Began || sp.FirstWaited != 0 && (sp.FirstWaited < sp.Began || sp.Waited < sp.FirstWaited):
			t.Errorf("launch %d (%s): began %.2f, waited %.2f-%.2f, ended %.2f µs", i, sp.Label, sp.Began, sp.FirstWaited, sp.Waited, sp.Ended)
		case sp.Thread0Ended < sp.Began || sp.Thread0Ended > sp.Ended || len(sp.WarpLags) == 0 || sp.WarpLags[0] < 0 || sp.WarpLags[0] > 1:
			// The last warp's end is at or after thread 0's, both after the CTA began, and
			// warp 0 (thread 0's) ends within a µs of thread 0.
			t.Errorf("launch %d (%s): began %.2f, thread 0 ended %.2f, the last warp %.2f µs, warps' lags %v", i, sp.Label, sp.Began, sp.Thread0Ended, sp.Ended, sp.WarpLags)
		case ahead != nil && sp.FirstWaited != 0 && sp.FirstWaited < ahead.Ended:
			t.Errorf("launch %d (%s): its wait returned at %.2f µs, before %s ended at %.2f", i, sp.Label, sp.FirstWaited, ahead.Label, ahead.Ended)
		case sp.Kernel != "xmix_cast_bf16" && (sp.Regs < 1 || sp.Regs > 255): // the cast is cuBLASLt's, loaded apart
			t.Errorf("launch %d (%s, %s): %d registers a thread as the driver compiled it", i, sp.Label, sp.Kernel, sp.Regs)
		case sp.SMs < 2 && sp.MostOnOneSM >= 64:
			// 64 working CTAs or more are spread over SMs: one SM would mean no %smid recorded.
			t.Errorf("launch %d (%s): %d CTAs on %d SMs, at most %d on one", i, sp.Label, sp.Records, sp.SMs, sp.MostOnOneSM)
		}
		if sp.Kernel == "xmix_cast_bf16" {
			casts++
		}
		ahead = &spans[i]
	}
	record("trace.llama-3.1-8b-2layers-r32", map[string]any{"launches": len(spans), "casts": casts, "cublaslt": library, "step_us": ahead.Ended})
	// Every layer's GEMM reads bf16 of its x as the launch ahead wrote it (fedGemms), so the
	// one cast is the LM head's, whose x the gathering final norm writes.
	if library != 1 || casts != 1 {
		t.Errorf("%d cuBLASLt launches and %d casts, want one each, the LM head's", library, casts)
	}
	plain := newCUDA(cuda.GemmAuto)(t, b).(*cuda.Backend)
	defer plain.Close()
	if _, err := plain.Trace(ti); err == nil || !strings.Contains(err.Error(), "without Options.Trace") {
		t.Errorf("trace of a backend loaded without it: %v", err)
	}
}

// sixTokenPrompts are n different prompts of six tokens each, for requests that stay live in
// every decode step together.
func sixTokenPrompts(n int) [][]int {
	var prompts [][]int
	for i := range n {
		prompts = append(prompts, []int{791 + 7*i, 4062, 14198 + i, 39935, 35308, 927 + 3*i})
	}
	return prompts
}

// decodeRows is a LogitRecorder of the first rows of every decode step: its Vocab is rows
// times the model's, and steps of other templates pass it by.
type decodeRows struct {
	testsuite.LogitRecorder
	b *bundle.Bundle
}

// Step implements loader.Backend.
func (r *decodeRows) Step(t int) error {
	if r.b.Templates[t].Kind != bundle.Decode {
		return r.Backend.Step(t)
	}
	return r.LogitRecorder.Step(t)
}

// agreementRows runs prompts (of one length, so that every request is live in every decode
// step) on the CPU, then teacher-forced to the CPU's tokens on nb's backend, and compares the
// logits of every request's row in every decode step, within the library GEMMs' bound.
func agreementRows(t *testing.T, nb testsuite.NewBackend, key string, b *bundle.Bundle, prompts [][]int, n int) {
	run := func(nb testsuite.NewBackend, force [][]int) ([][]int, [][]float32) {
		rec := &decodeRows{LogitRecorder: testsuite.LogitRecorder{Backend: nb(t, b), Vocab: len(prompts) * b.Manifest.Model.Vocab}, b: b}
		defer rec.Close()
		eng, err := loader.NewEngine(b, rec)
		if err != nil {
			t.Fatal(err)
		}
		res, err := eng.Generate(forcedRequests(prompts, n, force))
		if err != nil {
			t.Fatal(err)
		}
		var toks [][]int
		for _, r := range res {
			toks = append(toks, r.Tokens)
		}
		return toks, rec.Steps
	}
	cpuTok, cpuLogits := run(testsuite.NewCPU, nil)
	_, gpuLogits := run(nb, cpuTok)
	if len(cpuLogits) == 0 || len(gpuLogits) != len(cpuLogits) {
		t.Fatalf("%s: %d decode steps on the GPU, %d on the CPU", key, len(gpuLogits), len(cpuLogits))
	}
	vocab := b.Manifest.Model.Vocab
	worst := 0.0
	for i := range cpuLogits {
		for r := range prompts {
			worst = max(worst, testsuite.RelL2(gpuLogits[i][r*vocab:(r+1)*vocab], cpuLogits[i][r*vocab:(r+1)*vocab]))
		}
	}
	record("agreement."+key, map[string]any{"steps": len(cpuLogits), "rows": len(prompts), "max_logits_rel_err": worst})
	if !(worst <= libraryBound) { // NaN fails too
		t.Errorf("%s: logits relative error %.3g > %.0e over %d rows of %d decode steps", key, worst, libraryBound, len(prompts), len(cpuLogits))
	}
}

// TestCUDAMatchesCPUOnMixtralExperts: both expert paths on a small Mixtral. Dense (the
// default): its 16-row prefill chunk runs every expert as GEMMs at their offsets in the stacked
// weights (cuBLASLt or PTX) and the combine kernel. Grouped (--moe grouped): the expert
// kernels there too. The batch-1 decode runs the grouped kernels under both.
func TestCUDAMatchesCPUOnMixtralExperts(t *testing.T) {
	needGPU(t)
	for _, moe := range []string{"dense", "grouped"} {
		b := testsuite.CompileWith(t, compile.Options{MoE: moe}, testsuite.SmallMixtral)
		agreement(t, "small-mixtral-"+moe+"-experts", b, []int{72, 101, 108, 108, 111, 32, 119, 111, 114, 108, 100}, 32, false)
	}
}

// stepLogits runs prompts (MaxTokens n each, every request forced to force's tokens where
// given) on b under GEMM server mode and returns each request's tokens, every step's logits
// (the whole logits buffer: every sampled row) and how many f32 outputs the backend cut.
func stepLogits(t *testing.T, mode string, b *bundle.Bundle, prompts [][]int, n int, force [][]int) ([][]int, [][]float32, int) {
	reqs := forcedRequests(prompts, n, force)
	var rec *testsuite.LogitRecorder
	var cut int
	res := testsuite.Generate(t, func(t testing.TB, b *bundle.Bundle) loader.Backend {
		rec = &testsuite.LogitRecorder{Backend: newCUDA(mode)(t, b)}
		cut = rec.Backend.(*cuda.Backend).F32OutputsCut()
		for _, buf := range b.Manifest.Buffers {
			if buf.Name == bundle.ActLogits {
				n, _ := loader.BufferBytes(buf)
				rec.Vocab = int(n / 4)
			}
		}
		return rec
	}, b, reqs)
	var toks [][]int
	for _, r := range res {
		toks = append(toks, r.Tokens)
	}
	return toks, rec.Steps, cut
}

// forcedRequests are requests of prompts for n tokens each, forced to force's tokens where
// force is given.
func forcedRequests(prompts [][]int, n int, force [][]int) []loader.Request {
	var reqs []loader.Request
	for i, p := range prompts {
		r := loader.Request{Prompt: p, MaxTokens: n}
		if force != nil {
			r.Force = force[i]
		}
		reqs = append(reqs, r)
	}
	return reqs
}

// sameLogits says whether two runs' step logits are the same, bit for bit.
func sameLogits(got, want [][]float32) bool {
	equal := len(got) == len(want)
	for i := 0; equal && i < len(want); i++ {
		equal = slices.EqualFunc(got[i], want[i], func(a, b float32) bool { return math.Float32bits(a) == math.Float32bits(b) })
	}
	return equal
}

// TestCUDABuildKeepsBits: the fused kernels (XMIX_FUSE) compute the unfused pairs' bits, and
// kernels launched early (the default) wait for the grid ahead before reading, so on the GPU
// the suite's bundle's logits are those of a plain one (no fusions, --pdl=false) bit for bit,
// for the same tokens (teacher-forced) at decode batches 1 and 4 and through prefill, under
// both GEMM servers. So are those of the bundle built with --optional-f32-out=false: the
// suite's own bundle's add+norm and decode attention kernels write their bf16 copy alone
// where cuBLASLt's GEMM after them reads it and no node reads the f32
// (cuda.Backend.F32OutputsCut counts them, with the gated activations': more than in that
// one, under cuBLASLt).
func TestCUDABuildKeepsBits(t *testing.T) {
	needGPU(t)
	if testsuite.Fuse == nil && testsuite.SerialLaunch {
		t.Skip("the suite's bundles are plain (XMIX_SERIAL=1, no XMIX_FUSE)")
	}
	cut := llama1BCut(t)
	plain := testsuite.CompileWith(t, compile.Options{Fuse: []string{}, SerialLaunch: true, F32OutAlways: true}, cut)
	fused := testsuite.Compile(t, cut)
	always := testsuite.CompileWith(t, compile.Options{F32OutAlways: true}, cut)
	prompts := [][]int{{791, 4062, 14198, 39935, 35308, 927}, {128000, 9906}, {40, 1093, 311, 1373}, {2028}}
	for _, g := range gemmServers {
		run := func(b *bundle.Bundle, force [][]int) ([][]int, [][]float32, int) {
			return stepLogits(t, g.mode, b, prompts, 24, force)
		}
		toks, want, _ := run(plain, nil)
		cuts := map[*bundle.Bundle]int{}
		for _, c := range []struct {
			name string
			b    *bundle.Bundle
		}{{"", fused}, {".f32_out_always", always}} {
			_, got, cut := run(c.b, toks)
			equal := sameLogits(got, want)
			record("build_bits.llama-3.2-1b-2layers"+c.name+g.suffix, map[string]any{"steps": len(want), "equal": equal, "f32_outputs_cut": cut, "fuse": testsuite.Fuse, "serial_launch": testsuite.SerialLaunch})
			if !equal {
				t.Errorf("%s: the logits of the bundle built with --fuse %v --pdl=%v%s differ from the plain bundle's", g.mode, testsuite.Fuse, !testsuite.SerialLaunch, c.name)
			}
			cuts[c.b] = cut
		}
		// The gated activation leaves its f32 out either way; the default bundle's add+norm
		// and attention kernels do too.
		if g.mode == cuda.GemmCublasLt && cuts[fused] <= cuts[always] {
			t.Errorf("%s: %d kernels write their bf16 copy alone in the default bundle, %d with --optional-f32-out=false", g.mode, cuts[fused], cuts[always])
		}
	}
}
