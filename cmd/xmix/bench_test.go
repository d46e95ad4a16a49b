package main

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"xmix/bundle"
	"xmix/compile"
	"xmix/loader"
	"xmix/loader/cuda"
)

// An app-vs-no-app comparison is only fair on one workload: enabling apps must not change
// the prompts or arrival times the benchmark draws.
func TestBenchAppsKeepTheWorkload(t *testing.T) {
	bp := tinyBundleFile(t, filepath.Join(t.TempDir(), "tiny.xmb"), "../../specs/apps/tiny-steer.yaml")
	promptTokens := func(extra ...string) int {
		args := append([]string{"bench", bp, "-q", "--backend", "cpu", "--online", "--requests", "6",
			"--output-len", "2", "--warmup", "0", "--runs", "1", "--json"}, extra...)
		if !slices.Contains(extra, "--rate") {
			args = append(args, "--rate", "1000")
		}
		out, err := xmix(t, args...)
		if err != nil {
			t.Fatalf("%v: %v\n%s", args, err, out)
		}
		var res struct {
			Online struct {
				Mean struct {
					PromptTokens int `json:"prompt_tokens"`
				} `json:"mean"`
			} `json:"online"`
		}
		if err := json.Unmarshal([]byte(out), &res); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		return res.Online.Mean.PromptTokens
	}
	plain, steered, half := promptTokens(), promptTokens("--apps", "tiny-steer"), promptTokens("--apps", "tiny-steer", "--app-fraction", "0.5")
	if plain == 0 || plain != steered || plain != half {
		t.Fatalf("prompt tokens: no apps %d, apps on all %d, on half %d", plain, steered, half)
	}
	// All at once (vLLM's request rate inf): the same prompts, whichever way it is spelt.
	if burst, inf := promptTokens("--rate", "0"), promptTokens("--rate", "inf"); burst != plain || inf != plain {
		t.Fatalf("prompt tokens: at 1000/s %d, --rate 0 %d, --rate inf %d", plain, burst, inf)
	}
	for _, bad := range []string{"-1", "NaN"} {
		out, err := xmix(t, "bench", bp, "-q", "--backend", "cpu", "--online", "--rate", bad)
		if err == nil || !strings.Contains(out, "--rate") || !strings.Contains(out, "0 (inf) for every request at once") {
			t.Fatalf("--rate %s: err %v, output %q", bad, err, out)
		}
	}
}

// Greedy tokens of the CPU-backend online bench do not depend on the schedule where the
// math is the same (every template of 8 rows or more, so every GEMM runs the tensor-core
// kernel's math): one 64-row prefill chunk, as before chunk buckets, gives the digest that
// chunks of 8 to 64 rows give under any token budget, all at once or with Poisson arrivals.
func TestOnlineBenchTokensUnchangedBySchedule(t *testing.T) {
	spec, err := os.ReadFile("../../specs/models/tiny.yaml")
	if err != nil {
		t.Fatal(err)
	}
	weights, err := filepath.Abs("../../specs/models/tiny/model.safetensors")
	if err != nil {
		t.Fatal(err)
	}
	chatTemplate, err := filepath.Abs("../../specs/models/tiny/chat_template.jinja")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	bundleWith := func(name, serving string) string {
		lines := strings.Split(string(spec), "\n")
		for i, l := range lines {
			switch {
			case strings.HasPrefix(l, "weights:"):
				lines[i] = "weights: " + weights
			case strings.HasPrefix(l, "chat_template:"):
				lines[i] = "chat_template: " + chatTemplate
			case strings.HasPrefix(l, "serving:"):
				lines[i] = "serving: " + serving
			}
		}
		sp := filepath.Join(dir, name+".yaml")
		if err := os.WriteFile(sp, []byte(strings.Join(lines, "\n")), 0o644); err != nil {
			t.Fatal(err)
		}
		b, err := compile.Build(sp, nil, compile.Options{EmbedWeights: true})
		if err != nil {
			t.Fatal(err)
		}
		bp := filepath.Join(dir, name+".xmb")
		raw, _ := bundle.Marshal(b)
		if err := os.WriteFile(bp, raw, 0o644); err != nil {
			t.Fatal(err)
		}
		return bp
	}
	one := bundleWith("one", "{decode_buckets: [8], prefill_chunks: [64], max_seq_len: 512, max_seqs: 8}")
	buckets := bundleWith("buckets", "{decode_buckets: [8], prefill_chunks: [8, 16, 32, 64], max_seq_len: 512, max_seqs: 8}")
	type run struct {
		Steps        int    `json:"steps"`
		PrefillSteps int    `json:"prefill_steps"`
		PaddedRows   int    `json:"padded_rows"`
		Digest       string `json:"tokens_sha256"`
	}
	bench := func(bp string, extra ...string) run {
		args := append([]string{"bench", bp, "-q", "--backend", "cpu", "--online", "--requests", "6",
			"--output-len", "6", "--warmup", "0", "--runs", "1", "--json"}, extra...)
		out, err := xmix(t, args...)
		if err != nil {
			t.Fatalf("%v: %v\n%s", args, err, out)
		}
		var res struct {
			Online struct {
				MaxBatchedTokens int `json:"max_batched_tokens"`
				Mean             run `json:"mean"`
			} `json:"online"`
		}
		if err := json.Unmarshal([]byte(out), &res); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		if len(res.Online.Mean.Digest) != 64 {
			t.Fatalf("%v: no tokens digest\n%s", args, out)
		}
		return res.Online.Mean
	}
	ref := bench(one, "--rate", "0")
	for _, c := range [][]string{
		{buckets, "--rate", "0"},
		{buckets, "--rate", "0", "--max-batched-tokens", "8"},
		{buckets, "--rate", "40", "--max-batched-tokens", "16"},
	} {
		got := bench(c[0], c[1:]...)
		if got.Digest != ref.Digest {
			t.Errorf("%v: tokens digest %s, one 64-row chunk gave %s", c[1:], got.Digest, ref.Digest)
		}
		if got.PrefillSteps == ref.PrefillSteps && got.PaddedRows == ref.PaddedRows {
			t.Errorf("%v: %d prefill steps and %d padding rows, as with one 64-row chunk: the schedule did not change", c[1:], got.PrefillSteps, got.PaddedRows)
		}
	}
	if out, err := xmix(t, "bench", buckets, "-q", "--backend", "cpu", "--online", "--max-batched-tokens", "128"); err == nil ||
		!strings.Contains(out, "--max-batched-tokens: max_batched_tokens 128 is more than the largest prefill chunk 64") {
		t.Fatalf("budget above the largest chunk: err %v, output %q", err, out)
	}
}

// xmix bench --url drives xmix serve with the in-process bench's workload: the same
// requests (prompt tokens), and on the CPU backend the same generated tokens, greedy, with
// every request served and its stream's chunks counted as the usage says.
func TestBenchURLDrivesTheServer(t *testing.T) {
	s := tinySession(t)
	b, err := bundle.Marshal(s.b)
	if err != nil {
		t.Fatal(err)
	}
	bp := filepath.Join(t.TempDir(), "tiny.xmb")
	if err := os.WriteFile(bp, b, 0o644); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- serveSession(ctx, s, ln, serveFlags{runFlags: runFlags{quiet: true}, grace: 5 * time.Second}, io.Discard)
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	workload := []string{"-q", "--rate", "0", "--output-len", "6", "--warmup", "0", "--runs", "1", "--seed", "3"}
	type mean struct {
		PromptTokens     int     `json:"prompt_tokens"`
		OutputTokens     int     `json:"output_tokens"`
		CompletionTokens int     `json:"completion_tokens"`
		Failed           int     `json:"failed"`
		Requests         int     `json:"requests"`
		MeanTTFTms       float64 `json:"mean_ttft_ms"`
		P50ITLms         float64 `json:"p50_itl_ms"`
		TokPerS          float64 `json:"total_tok_per_s"`
	}
	run := func(requests string, args ...string) mean {
		out, err := xmix(t, append(append([]string{"bench", "--requests", requests}, args...), workload...)...)
		if err != nil {
			t.Fatalf("%v: %v\n%s", args, err, out)
		}
		var res struct {
			Online struct {
				Mean mean `json:"mean"`
			} `json:"online"`
		}
		if err := json.Unmarshal([]byte(out), &res); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		return res.Online.Mean
	}
	served := run("4", "--url", "http://"+ln.Addr().String(), "--vocab", "258")
	inproc := run("4", bp, "--backend", "cpu", "--online")
	if served.Requests != 4 || served.Failed != 0 || served.PromptTokens != inproc.PromptTokens || served.OutputTokens != inproc.OutputTokens ||
		served.CompletionTokens != served.OutputTokens || served.MeanTTFTms <= 0 || served.P50ITLms <= 0 || served.TokPerS <= 0 {
		t.Fatalf("served %+v, in-process %+v", served, inproc)
	}
	full := run("4", "--url", "http://"+ln.Addr().String(), "--vocab", "258", "--ignore-eos")
	fullIn := run("4", bp, "--backend", "cpu", "--online", "--ignore-eos")
	if full.OutputTokens != 4*6 || full.CompletionTokens != 4*6 || fullIn.OutputTokens != 4*6 {
		t.Fatalf("--ignore-eos: served %+v, in-process %+v; want %d tokens", full, fullIn, 4*6)
	}
	steered := run("2", "--url", "http://"+ln.Addr().String(), "--vocab", "258", "--xmix-apps", "tiny-steer")
	if steered.Failed != 0 || steered.Requests != 2 {
		t.Fatalf("with --xmix-apps: %+v", steered)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"bench", "--url", "http://" + ln.Addr().String(), "--vocab", "258", "--xmix-apps", "nope", "-q", "--requests", "2", "--warmup", "0", "--runs", "1"}, `every request failed; the first: request 0: 400 Bad Request: {"error":{"message":"app \"nope\" is not deployed`},
		{[]string{"bench", "--url", "ftp://x"}, "want http://HOST:PORT"},
		{[]string{"bench", bp, "--url", "http://x"}, "give it or a bundle, not both"},
		{[]string{"bench"}, "no bundle"},
		{[]string{"bench", bp, "--online", "--xmix-apps", "tiny-steer"}, "--xmix-apps goes with --url"},
		{[]string{"bench", "--url", "http://" + ln.Addr().String(), "--model", "other"}, `--model "other": the server serves tiny`},
	} {
		out, err := xmix(t, c.args...)
		if err == nil || !strings.Contains(out, c.want) {
			t.Errorf("%v: err %v, output %q, want %q", c.args, err, out, c.want)
		}
	}
}

// --graph-context with --apps: the first --app-fraction of the full batch's rows enable the
// apps (their bits in ctl.mask, and in ctl.any_mask), so the graph timed is the apps' own; an
// app the bundle lacks is refused by name.
func TestBenchFullBatchApps(t *testing.T) {
	s := tinyCPUSession(t, "../../specs/apps/tiny-probe.yaml", "../../specs/apps/tiny-steer.yaml")
	b := s.b
	bit := map[string]uint32{}
	for _, a := range b.Manifest.Apps {
		bit[a.Name] = 1 << a.Bit
	}
	words := func(buf string, k int) []uint32 { return bufferWords(t, s.be, buf, k) }
	i := slices.IndexFunc(b.Templates, func(t bundle.Template) bool { return t.Kind == "decode" && t.Tokens == 4 })
	if i < 0 {
		t.Fatal("no decode bucket of 4 rows")
	}
	for _, c := range []struct {
		apps string
		frac float64
		want []uint32
	}{
		{"tiny-steer", 0.5, []uint32{bit["tiny-steer"], bit["tiny-steer"], 0, 0}},
		{"tiny-probe,tiny-steer", 1, slices.Repeat([]uint32{bit["tiny-probe"] | bit["tiny-steer"]}, 4)},
		{"", 1, []uint32{0, 0, 0, 0}},
	} {
		if err := fullBatch(s, i, benchFlags{graphCtx: 20, appFraction: c.frac, runFlags: runFlags{apps: c.apps}}); err != nil {
			t.Fatalf("--apps %q: %v", c.apps, err)
		}
		if got := words(bundle.CtlMask, 4); !slices.Equal(got, c.want) {
			t.Errorf("--apps %q --app-fraction %v: masks %v, want %v", c.apps, c.frac, got, c.want)
		}
		if got, want := words(bundle.CtlAnyMask, 1)[0], c.want[0]; got != want {
			t.Errorf("--apps %q: any_mask %#x, want %#x", c.apps, got, want)
		}
	}
	if err := fullBatch(s, i, benchFlags{graphCtx: 20, appFraction: 1, runFlags: runFlags{apps: "tiny-probe,nope"}}); err == nil || !strings.Contains(err.Error(), `no app "nope" (it has: tiny-probe, tiny-steer)`) {
		t.Errorf("an app the bundle lacks: %v", err)
	}
}

// tinyCPUSession is the embedded tiny model built with apps (spec paths), weights embedded,
// open on the CPU backend until the test ends.
func tinyCPUSession(t *testing.T, apps ...string) *session {
	t.Helper()
	b, err := compile.Build("../../specs/models/tiny.yaml", apps, compile.Options{EmbedWeights: true})
	if err != nil {
		t.Fatal(err)
	}
	s, err := open(b, "../../specs/models", runFlags{backend: "cpu", quiet: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.be.Close() })
	return s
}

// bufferWords reads the first k u32 words of buffer buf from be.
func bufferWords(t *testing.T, be loader.Backend, buf string, k int) []uint32 {
	t.Helper()
	raw := make([]byte, 4*k)
	if err := be.Read(buf, raw); err != nil {
		t.Fatal(err)
	}
	out := make([]uint32, k)
	for j := range out {
		out[j] = binary.LittleEndian.Uint32(raw[4*j:])
	}
	return out
}

// An --app-fraction outside 0..1 is refused before anything runs, in-process and over HTTP.
func TestBenchAppFractionBounds(t *testing.T) {
	bp := tinyBundleFile(t, filepath.Join(t.TempDir(), "tiny.xmb"), "../../specs/apps/tiny-steer.yaml")
	for _, args := range [][]string{{bp, "--app-fraction", "1.5"}, {bp, "--app-fraction", "-0.1"}, {bp, "--app-fraction", "NaN"}, {"--url", "http://127.0.0.1:1", "--app-fraction", "2"}} {
		if out, err := xmix(t, append([]string{"bench", "-q", "--backend", "cpu"}, args...)...); err == nil || !strings.Contains(out, "want the share of requests that enable the apps, from 0 to 1") {
			t.Fatalf("%v: err %v, output %q", args, err, out)
		}
	}
}

// --graph-context: every row of the timed bucket becomes its own sequence at the context, over
// its own pages, and the bucket then runs (here on the CPU backend, which has no graphs to
// time, so the words are checked directly after the step it runs); a context past
// max_seq_len or a bucket with more rows than sequence slots are refused.
func TestBenchFullBatch(t *testing.T) {
	s := tinyCPUSession(t)
	b := s.b
	m := b.Manifest.Model
	for i, tmpl := range b.Templates {
		if tmpl.Kind != "decode" || tmpl.Tokens != 4 {
			continue
		}
		const n = 100
		// Stale words from another step: every row's norm into out row 0, no sample reading a
		// row, prompt rows.
		for _, buf := range []string{bundle.CtlOutRow, bundle.CtlSRow, bundle.CtlGen} {
			if err := s.be.Write(buf, 0, slices.Repeat([]byte{0xff}, 16)); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.be.Write(bundle.CtlOutRow, 0, make([]byte, 16)); err != nil {
			t.Fatal(err)
		}
		if err := fullBatch(s, i, benchFlags{graphCtx: n, promptLen: 16, runFlags: runFlags{temperature: 0.7, topP: 0.9}}); err != nil {
			t.Fatal(err)
		}
		// Row r is sample r both ways, generating its token n-1-17 after a 16-token prompt
		// and its BOS.
		for _, w := range []struct {
			buf  string
			want []uint32
		}{{bundle.CtlOutRow, []uint32{0, 1, 2, 3}}, {bundle.CtlSRow, []uint32{0, 1, 2, 3}}, {bundle.CtlGen, slices.Repeat([]uint32{n - 1 - 17}, 4)}} {
			if got := bufferWords(t, s.be, w.buf, 4); !slices.Equal(got, w.want) {
				t.Errorf("%s: %v, want %v", w.buf, got, w.want)
			}
		}
		words := func(buf string, k int) []uint32 { return bufferWords(t, s.be, buf, k) }
		perSeq := (m.MaxSeqLen + m.KVBlockSize - 1) / m.KVBlockSize
		pages := (n + m.KVBlockSize - 1) / m.KVBlockSize
		pos, seq, table := words(bundle.CtlPos, 4), words(bundle.CtlSeq, 4), words(bundle.KVBlockTable, 4*perSeq)
		for r := range 4 {
			if pos[r] != n-1 || seq[r] != uint32(r) {
				t.Fatalf("row %d: pos %d seq %d", r, pos[r], seq[r])
			}
			for j := range pages {
				if table[r*perSeq+j] != uint32(r*pages+j) {
					t.Fatalf("row %d page %d: %d", r, j, table[r*perSeq+j])
				}
			}
		}
		// Every row samples with the bench's --temperature and --top-p.
		for _, w := range []struct {
			buf  string
			want float32
		}{{bundle.CtlTemperature, 0.7}, {bundle.CtlTopP, 0.9}} {
			for r, v := range words(w.buf, 4) {
				if math.Float32frombits(v) != w.want {
					t.Errorf("%s row %d: %v, want %v", w.buf, r, math.Float32frombits(v), w.want)
				}
			}
		}
		for _, bad := range []struct {
			n    int
			want string
		}{{m.MaxSeqLen + 1, "want 1..512"}, {-3, "want 1..512"}} {
			if err := fullBatch(s, i, benchFlags{graphCtx: bad.n}); err == nil || !strings.Contains(err.Error(), bad.want) {
				t.Errorf("context %d: %v", bad.n, err)
			}
		}
		// --attn-splits: the chunk word cuts the context in that many splits of whole passes.
		a := tmpl.AttnSplit
		if a == nil || a.MaxSplits < 2 || a.Step <= 0 {
			t.Fatalf("bucket %s: split plan %+v", tmpl.Name, a)
		}
		for _, c := range []struct{ splits, chunk int }{
			{0, a.Chunk(n, 4)}, {1, (n + a.Step - 1) / a.Step * a.Step}, {2, (n/2 + a.Step - 1) / a.Step * a.Step},
		} {
			if err := fullBatch(s, i, benchFlags{graphCtx: n, attnSplits: c.splits}); err != nil {
				t.Fatal(err)
			}
			if got := words(a.Buffer, 1)[0]; got != uint32(c.chunk) {
				t.Errorf("--attn-splits %d: chunk %d, want %d", c.splits, got, c.chunk)
			}
		}
		for _, bad := range []struct {
			n, splits int
			want      string
		}{
			{n, a.MaxSplits + 1, fmt.Sprintf("takes 1..%d splits", a.MaxSplits)}, {n, -1, "--attn-splits -1"},
			{0, 2, "give --graph-context too"},
		} {
			if err := fullBatch(s, i, benchFlags{graphCtx: bad.n, attnSplits: bad.splits}); err == nil || !strings.Contains(err.Error(), bad.want) {
				t.Errorf("context %d, %d splits: %v", bad.n, bad.splits, err)
			}
		}
		s.b.Templates[i].Tokens = m.MaxSeqs + 1
		if err := fullBatch(s, i, benchFlags{graphCtx: 10}); err == nil || !strings.Contains(err.Error(), "sequence slots") {
			t.Errorf("%d rows: %v", m.MaxSeqs+1, err)
		}
		return
	}
	t.Fatal("no decode bucket of 4 rows")
}

// bench --vectors gives each request that enables an app its own value of the app's
// per_request params: the rows read those slots, so the greedy tokens differ from the run
// on the compiled values; without --apps there is nothing to give them to.
func TestBenchVectorsReachTheRows(t *testing.T) {
	dir := t.TempDir()
	app := filepath.Join(dir, "pr.yaml")
	if err := os.WriteFile(app, []byte(`app: pr
params:
  v: {random: 21, per_request: true}
ops:
  - write: {at: {layers: [3], hook: resid_post}, kernel: steer_add, args: {vector: v, alpha: 8.0}}
`), 0o644); err != nil {
		t.Fatal(err)
	}
	bp := tinyBundleFile(t, filepath.Join(dir, "pr.xmb"), app)
	digest := func(extra ...string) string {
		args := append([]string{"bench", bp, "-q", "--backend", "cpu", "--online", "--requests", "4", "--rate", "0",
			"--output-len", "6", "--warmup", "0", "--runs", "1", "--json", "--apps", "pr"}, extra...)
		out, err := xmix(t, args...)
		if err != nil {
			t.Fatalf("%v: %v\n%s", args, err, out)
		}
		var res struct {
			Online struct {
				Mean struct {
					Digest string `json:"tokens_sha256"`
				} `json:"mean"`
			} `json:"online"`
		}
		if err := json.Unmarshal([]byte(out), &res); err != nil || len(res.Online.Mean.Digest) != 64 {
			t.Fatalf("%v: %v\n%s", args, err, out)
		}
		return res.Online.Mean.Digest
	}
	if compiled, own := digest(), digest("--vectors"); compiled == own {
		t.Fatalf("--vectors: the same tokens as the compiled vector (%s): the requests' values did not reach the rows", own)
	}
	if out, err := xmix(t, "bench", bp, "-q", "--backend", "cpu", "--vectors"); err == nil || !strings.Contains(out, "--vectors gives per-request values to the apps of --apps") {
		t.Fatalf("--vectors without --apps: err %v, output %q", err, out)
	}
}

// TestSummarizePrefill: a prefill step's profile counts every tensor-core GEMM of the
// template at 2*M*N*K over the template's rows (M, N, K as the model's dimensions give them),
// sums node times by role, and states the GEMMs' rate against the measured bf16 peak.
func TestSummarizePrefill(t *testing.T) {
	b, err := compile.Build("../../specs/models/tiny.yaml", nil, compile.Options{EmbedWeights: true})
	if err != nil {
		t.Fatal(err)
	}
	ti := slices.IndexFunc(b.Templates, func(t bundle.Template) bool { return t.Name == "prefill_t8" })
	if ti < 0 {
		t.Fatal("no prefill_t8 template")
	}
	var nodes []cuda.NodeTime
	for _, n := range b.Templates[ti].Nodes {
		nodes = append(nodes, cuda.NodeTime{Label: n.Label, Kernel: n.Kernel, Ms: 0.5})
	}
	p, err := summarizePrefill(b, ti, nodes)
	if err != nil {
		t.Fatal(err)
	}
	m := b.Manifest.Model
	T, h, qkv := 8.0, float64(m.Hidden), float64((m.Heads+2*m.KVHeads)*m.HeadDim)
	perLayer := 2 * T * (h*qkv + float64(m.Heads*m.HeadDim)*h + h*2*float64(m.Intermediate) + float64(m.Intermediate)*h)
	want := float64(m.Layers) * perLayer // the tied LM head runs the sampled rows' own kernel
	if math.Abs(p.GemmTFLOPs*1e12-want) > 1 {
		t.Fatalf("GEMM FLOPs %v, want %v", p.GemmTFLOPs*1e12, want)
	}
	gemms := 4 * m.Layers
	if p.GemmMs != 0.5*float64(gemms) || p.StepMs != 0.5*float64(len(nodes)) || p.Roles["qkv"] != 0.5*float64(m.Layers) || p.Tokens != 8 {
		t.Fatalf("profile %+v: want %d GEMMs of 0.5 ms among %d nodes, qkv %v ms", p, gemms, len(nodes), 0.5*float64(m.Layers))
	}
	rate := want / (p.GemmMs / 1000) / 1e12
	if math.Abs(p.GemmTFLOPS-rate) > 1e-9 || math.Abs(p.GemmPctPeak-100*rate*1e12/MeasuredBF16Peak) > 1e-9 {
		t.Fatalf("rate %v TFLOP/s (%v%%), want %v", p.GemmTFLOPS, p.GemmPctPeak, rate)
	}
}

// fakeGraph times a template as the sum of its kept nodes' costs: roleCostsOf must give each
// role the sum of its own nodes, whatever the others cost.
type fakeGraph struct{ cost map[string]float64 }

func (g fakeGraph) sum(leave func(string) bool) float64 {
	var ms float64
	for label, c := range g.cost {
		if !leave(label) {
			ms += c
		}
	}
	return ms
}

func (g fakeGraph) Time(int, int) (float64, error) {
	return g.sum(func(string) bool { return false }), nil
}

func (g fakeGraph) TimeWithout(_, _ int, leave func(string) bool) (float64, error) {
	return g.sum(leave), nil
}

// TestTraceFlagErrors: --trace follows the offline bench's graphs on cuda; the CPU backend
// and --online are refused before anything runs, and no file is written.
func TestTraceFlagErrors(t *testing.T) {
	dir := t.TempDir()
	bp := tinyBundleFile(t, filepath.Join(dir, "tiny.xmb"))
	file := filepath.Join(dir, "trace.json")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--backend", "cpu"}, "--trace: the cpu backend cannot trace graphs (use --backend cuda)"},
		{[]string{"--backend", "cpu", "--online"}, "--trace follows the offline bench's decode graphs: leave out --online"},
	} {
		out, err := xmix(t, append([]string{"bench", bp, "-q", "--trace", file}, c.args...)...)
		if err == nil || !strings.Contains(out, c.want) {
			t.Fatalf("%v: err %v, output %q", c.args, err, out)
		}
		if _, err := os.Stat(file); !os.IsNotExist(err) {
			t.Fatalf("%v: %s written (%v)", c.args, file, err)
		}
	}
}

// TestRoleCosts: a role's cost is the whole graph's time less the time without the role's
// nodes, every layer's at once; a CPU-backend bench refuses --role-costs before it runs.
func TestRoleCosts(t *testing.T) {
	g := fakeGraph{map[string]float64{"L0.qkv": 0.5, "L1.qkv": 0.25, "L0.attention": 1, "L1.attention": 2, "lm_head": 0.125}}
	got, err := roleCostsOf(g, 0, 10, []string{"qkv", "attention", "lm_head"})
	if err != nil {
		t.Fatal(err)
	}
	if want := map[string]float64{"qkv": 0.75, "attention": 3, "lm_head": 0.125}; !maps.Equal(got, want) {
		t.Fatalf("role costs %v, want %v", got, want)
	}
	if text := costsText(got); text != "attention 3.000, qkv 0.750, lm_head 0.125" {
		t.Fatalf("costs text %q", text)
	}
	bp := tinyBundleFile(t, filepath.Join(t.TempDir(), "tiny.xmb"))
	if out, err := xmix(t, "bench", bp, "-q", "--backend", "cpu", "--role-costs"); err == nil || !strings.Contains(out, "--role-costs: the cpu backend cannot time graphs (use --backend cuda)") {
		t.Fatalf("cpu --role-costs: err %v, output %q", err, out)
	}
	if out, err := xmix(t, "bench", bp, "-q", "--backend", "cpu", "--role-costs", "--online"); err == nil || !strings.Contains(out, "leave out --online") {
		t.Fatalf("--online --role-costs: err %v, output %q", err, out)
	}
	// Where the trace goes is refused before the bench runs (the cpu backend's own refusal
	// of --trace comes after the bundle is open).
	dir := t.TempDir()
	if out, err := xmix(t, "bench", bp, "-q", "--backend", "cpu", "--trace", dir); err == nil || !strings.Contains(out, "--trace "+dir+": a folder: give a file path") {
		t.Fatalf("--trace into a folder: err %v, output %q", err, out)
	}
	for _, args := range [][]string{{"--attn-splits", "2"}, {"--attn-splits", "-1", "--graph-context", "40"}} {
		if out, err := xmix(t, append([]string{"bench", bp, "-q", "--backend", "cpu"}, args...)...); err == nil || !strings.Contains(out, "give a count of at least 1, and --graph-context N") {
			t.Fatalf("%v: err %v, output %q", args, err, out)
		}
	}
}

// Every count flag outside its bounds is refused before the bundle is opened or a request
// drawn (a count of 0 ran nothing and reported zeros or 0/0 ms, a negative --prompts or
// --prompt-len panicked, a huge one allocated without end), in-process and over HTTP; the
// counts the bundle bounds are refused once it is open, before any request is drawn.
func TestBenchCountBounds(t *testing.T) {
	bp := tinyBundleFile(t, filepath.Join(t.TempDir(), "tiny.xmb"))
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{bp, "--prompts", "0"}, "--prompts 0: want 1 to 100000 prompts"},
		{[]string{bp, "--prompts", "-1"}, "--prompts -1: want 1 to 100000 prompts"},
		{[]string{bp, "--prompts", "2000000000"}, "--prompts 2000000000: want 1 to 100000"},
		{[]string{bp, "--prompt-len", "-5"}, "--prompt-len -5: want 1 to 1048576 tokens a prompt"},
		{[]string{bp, "--prompt-len", "100000000"}, "--prompt-len 100000000: want 1 to 1048576"},
		{[]string{bp, "--new-tokens", "0"}, "--new-tokens 0: want 1 to 1048576 tokens a prompt generates"},
		{[]string{bp, "--online", "--requests", "0"}, "--requests 0: want 1 to 100000 requests"},
		{[]string{bp, "--online", "--output-len", "-3"}, "--output-len -3: want 1 to 1048576"},
		{[]string{bp, "--online", "--runs", "0"}, "--runs 0: want 1 to 100 runs measured"},
		{[]string{bp, "--online", "--warmup", "-1"}, "--warmup -1: want 0 to 100 runs discarded"},
		{[]string{bp, "--graph-iters", "0"}, "--graph-iters 0: want 1 to 1000000 replays a timing"},
		{[]string{bp, "--graph-iters", "1000001"}, "--graph-iters 1000001: want 1 to 1000000"},
		{[]string{bp, "--graph-rounds", "0"}, "--graph-rounds 0: want 1 to 100 rounds"},
		{[]string{bp, "--graph-rounds", "101"}, "--graph-rounds 101: want 1 to 100 rounds"},
		{[]string{bp, "--graph-context", "-1"}, "--graph-context -1: want 0 to 1048576 positions"},
		{[]string{"--url", "http://127.0.0.1:1", "--requests", "0"}, "--requests 0: want 1 to 100000 requests"},
		{[]string{"--url", "http://127.0.0.1:1", "--max-model-len", "-4"}, "--max-model-len -4: want 0 to 1048576"},
		// Bounded by the bundle (tiny: max_seq_len 512, decode buckets 1, 2, 4, 8).
		{[]string{bp, "--prompt-len", "510", "--new-tokens", "2"}, "--prompt-len 510 + BOS + --new-tokens 2 = 513 tokens: the bundle's max_seq_len is 512"},
		{[]string{bp, "--graph-buckets", "3"}, "--graph-buckets 3: not a decode bucket of the bundle (it has [1 2 4 8])"},
	} {
		if out, err := xmix(t, append([]string{"bench", "-q", "--backend", "cpu"}, c.args...)...); err == nil || !strings.Contains(out, c.want) {
			t.Errorf("%v: err %v, output %q", c.args, err, out)
		}
	}
	if out, err := xmix(t, "bench", bp, "-q", "--backend", "cpu", "--prompts", "1", "--prompt-len", "509", "--new-tokens", "2",
		"--graph-buckets", "1,8", "--graph-iters", "1", "--graph-rounds", "100"); err != nil {
		t.Errorf("every count at its bound: %v, output %q", err, out)
	}
}

// A graph's floor at --graph-context is its weights once and every row's K and V at that
// context over MeasuredBandwidth: on the tiny model (6 layers, 2 KV heads of 32, an f32
// cache) 3072 bytes a position, and none without --graph-context.
func TestGraphFloors(t *testing.T) {
	s := tinyCPUSession(t)
	if fl := graphFloors(s, benchFlags{}); fl != nil {
		t.Fatalf("without --graph-context: %v", fl)
	}
	fl := graphFloors(s, benchFlags{graphCtx: 100, decodeOnly: []int{4, 8}})
	w := weightBytes(s.b)
	for name, rows := range map[string]int64{"decode_b4": 4, "decode_b8": 8} {
		want := float64(w+rows*100*6*2*2*32*4) / MeasuredBandwidth * 1000
		if got, ok := fl[name]; !ok || math.Abs(got-want) > 1e-12 {
			t.Errorf("%s: floor %v ms, want %v (floors %v)", name, got, want, fl)
		}
	}
	if len(fl) != 2 {
		t.Errorf("floors of %d buckets, want the 2 timed: %v", len(fl), fl)
	}
}

// tinyBundleFile builds the embedded tiny model with apps (spec paths), weights embedded, and
// writes the bundle to path, which it returns.
func tinyBundleFile(t *testing.T, path string, apps ...string) string {
	t.Helper()
	b, err := compile.Build("../../specs/models/tiny.yaml", apps, compile.Options{EmbedWeights: true})
	if err != nil {
		t.Fatal(err)
	}
	raw, err := bundle.Marshal(b)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, raw, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestBenchSampling: --temperature and --top-p are checked before a bundle or a server is
// reached, the in-process bench runs sampled requests and reports what it sampled with, and
// over HTTP every completion asks for them.
func TestBenchSampling(t *testing.T) {
	bp := tinyBundleFile(t, filepath.Join(t.TempDir(), "tiny.xmb"))
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{bp, "--temperature", "-1"}, "--temperature: temperature -1: want a finite number >= 0 (0: greedy)"},
		{[]string{bp, "--temperature", "NaN"}, "--temperature: temperature NaN: want a finite number >= 0"},
		{[]string{bp, "--top-p", "1.5"}, "--top-p: top_p 1.5: want a number in [0, 1] (0 or 1: no nucleus cut)"},
		{[]string{"--url", "http://127.0.0.1:1", "--temperature", "+Inf"}, "--temperature: temperature +Inf: want a finite number >= 0"},
	} {
		if out, err := xmix(t, append([]string{"bench", "-q", "--backend", "cpu"}, c.args...)...); err == nil || !strings.Contains(out, c.want) {
			t.Errorf("%v: err %v, output %q", c.args, err, out)
		}
	}
	out, err := xmix(t, "bench", bp, "-q", "--backend", "cpu", "--prompts", "2", "--prompt-len", "4", "--new-tokens", "3",
		"--temperature", "0.8", "--top-p", "0.9", "--json")
	if err != nil {
		t.Fatalf("sampled bench: %v\n%s", err, out)
	}
	var res struct {
		Temperature float32 `json:"temperature"`
		TopP        float32 `json:"top_p"`
		Offline     struct {
			DecodeSteps int `json:"decode_steps"`
		}
	}
	if err := json.Unmarshal([]byte(out[strings.Index(out, "{"):]), &res); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if res.Temperature != 0.8 || res.TopP != 0.9 || res.Offline.DecodeSteps == 0 {
		t.Fatalf("sampled bench reported %+v:\n%s", res, out)
	}
	body, err := completionBody("m", arrival{req: loader.Request{Prompt: []int{1, 2}, MaxTokens: 4}}, benchFlags{runFlags: runFlags{temperature: 0.8, topP: 0.9}})
	if err != nil {
		t.Fatal(err)
	}
	var sent map[string]any
	if err := json.Unmarshal(body, &sent); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(sent["temperature"], sent["top_p"]) != "0.8 0.9" {
		t.Fatalf("completion body %s", body)
	}
}

// checkCPUProfile fails t unless file holds a Go CPU profile: gzipped protobuf whose string
// table names its sample type.
func checkCPUProfile(t *testing.T, file string) {
	t.Helper()
	raw, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	zr, err := gzip.NewReader(bytes.NewReader(raw))
	if err != nil {
		t.Fatalf("%s: not gzipped: %v", file, err)
	}
	pb, err := io.ReadAll(zr)
	if err != nil || !bytes.Contains(pb, []byte("nanoseconds")) {
		t.Fatalf("%s: %d bytes unpacked (%v), no CPU sample type in them", file, len(pb), err)
	}
}

// TestLoadProfile: --load-profile writes a Go CPU profile of the load for xmix run, on a
// bundle and on the embedded default, and the run still prints its text; it is refused into a
// folder, and for a bench over --url, which loads nothing, before anything runs.
func TestLoadProfile(t *testing.T) {
	dir := t.TempDir()
	bp := tinyBundleFile(t, filepath.Join(dir, "tiny.xmb"))
	for i, args := range [][]string{{bp, "-p", "Once"}, {}} {
		file := filepath.Join(dir, fmt.Sprintf("load%d.pprof", i))
		out, err := xmix(t, append([]string{"run", "-q", "--backend", "cpu", "-n", "2", "--load-profile", file}, args...)...)
		if err != nil || strings.TrimSpace(out) == "" {
			t.Fatalf("%v: err %v, output %q", args, err, out)
		}
		checkCPUProfile(t, file)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"run", bp, "-q", "-p", "Hi", "--backend", "cpu", "--load-profile", dir}, "--load-profile " + dir + ": a folder: give a file path"},
		{[]string{"run", bp, "-q", "-p", "Hi", "--backend", "cpu", "--load-profile", filepath.Join(dir, "no", "a.pprof")}, "its folder " + filepath.Join(dir, "no") + " does not exist"},
		{[]string{"bench", "-q", "--url", "http://127.0.0.1:1", "--load-profile", filepath.Join(dir, "b.pprof")}, "--load-profile profiles this process's load of a bundle, and --url loads none"},
	} {
		out, err := xmix(t, c.args...)
		if err == nil || !strings.Contains(out, c.want) {
			t.Fatalf("%v: err %v, output %q", c.args, err, out)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "b.pprof")); !os.IsNotExist(err) {
		t.Fatalf("b.pprof written (%v)", err)
	}
}

// TestCPUProfile: an online bench with --cpu-profile writes a Go CPU profile (gzipped
// protobuf whose string table names its sample type) and still prints its results; the flag
// is refused before anything runs without --online, over --url and into a folder.
func TestCPUProfile(t *testing.T) {
	dir := t.TempDir()
	bp := tinyBundleFile(t, filepath.Join(dir, "tiny.xmb"))
	file := filepath.Join(dir, "cpu.pprof")
	out, err := xmix(t, "bench", bp, "-q", "--backend", "cpu", "--online", "--requests", "3", "--output-len", "2",
		"--warmup", "0", "--runs", "1", "--rate", "0", "--json", "--cpu-profile", file)
	if err != nil || !strings.Contains(out, `"online"`) {
		t.Fatalf("err %v, output %q", err, out)
	}
	checkCPUProfile(t, file)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{bp, "--backend", "cpu", "--cpu-profile", filepath.Join(dir, "a.pprof")}, "--cpu-profile profiles the host during the online runs: add --online"},
		{[]string{bp, "--backend", "cpu", "--online", "--cpu-profile", dir}, "--cpu-profile " + dir + ": a folder: give a file path"},
		{[]string{"--url", "http://127.0.0.1:1", "--cpu-profile", filepath.Join(dir, "b.pprof")}, "--cpu-profile profiles this process's host work, not a server's"},
	} {
		out, err := xmix(t, append([]string{"bench", "-q"}, c.args...)...)
		if err == nil || !strings.Contains(out, c.want) {
			t.Fatalf("%v: err %v, output %q", c.args, err, out)
		}
	}
	for _, f := range []string{"a.pprof", "b.pprof"} {
		if _, err := os.Stat(filepath.Join(dir, f)); !os.IsNotExist(err) {
			t.Fatalf("%s written (%v)", f, err)
		}
	}
}
