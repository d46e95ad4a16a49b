package main

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"xmix/bundle"
	"xmix/compile"
	"xmix/testsuite"
	"xmix/tokenizer"
)

// xmix runs the CLI in-process.
func xmix(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := rootCmd()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(args)
	err := cmd.Execute()
	return out.String(), err
}

func TestRunDefaultShowsTheThreeDemos(t *testing.T) {
	out, err := xmix(t, "run", "-q", "-n", "24")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"── no apps ──", "── tiny-steer ──", "── tiny-probe ──", "tiny-probe.happy per token"} {
		if !strings.Contains(out, want) {
			t.Fatalf("output lacks %q:\n%s", want, out)
		}
	}
	parts := strings.Split(out, "── ")
	if len(parts) < 4 || strings.SplitN(parts[1], "\n", 2)[1] == strings.SplitN(parts[2], "\n", 2)[1] {
		t.Fatalf("the steered text equals the plain one:\n%s", out)
	}
}

func TestRunJSONAndPerPromptApps(t *testing.T) {
	out, err := xmix(t, "run", "-q", "-n", "6", "--json", "-p", "One day", "-p", "One day", "--apps", "tiny-probe@1")
	if err != nil {
		t.Fatal(err)
	}
	var res struct {
		Results []struct {
			Apps   []string `json:"apps"`
			Tokens []int    `json:"tokens"`
			Rows   []struct {
				Exports map[string][]float32 `json:"Exports"`
			} `json:"rows"`
		} `json:"results"`
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if len(res.Results) != 2 || len(res.Results[0].Apps) != 0 || res.Results[1].Apps[0] != "tiny-probe" {
		t.Fatalf("results %+v", res.Results)
	}
	if len(res.Results[1].Rows) == 0 || len(res.Results[1].Rows[0].Exports["tiny-probe.happy"]) != 1 {
		t.Fatalf("probe scores missing: %+v", res.Results[1].Rows)
	}
}

func TestRunRejectsBadInput(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.xmb")
	os.WriteFile(bad, []byte("XMIXBNDL garbage"), 0o644)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"run", "-q", bad, "-p", "x"}, "bad.xmb"},
		{[]string{"run", "-q", "--apps", "nope"}, `app "nope" is not deployed`},
		{[]string{"run", "-q", "--backend", "tpu"}, `unknown backend "tpu"`},
		{[]string{"run", "-q", "--backend", "cpu", "--gemm", "cublas"}, `unknown --gemm "cublas": use auto, ptx or cublaslt`},
		{[]string{"run", "-q", "-n", "600"}, "max_seq_len"},
		{[]string{"run", "-q", "--backend", "cpu", "--load-readers", "-1"}, "--load-readers -1: give 1-256 reader goroutines, or 0 for the default"},
	} {
		if _, err := xmix(t, c.args...); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("xmix %v: %v, want %q", c.args, err, c.want)
		}
	}
}

// TestChatWithRealTokenizer builds a small random model around the real Llama-3.1 tokenizer
// and chat template, and checks that --chat feeds exactly the rendered template's ids.
func TestChatWithRealTokenizer(t *testing.T) {
	dir := t.TempDir()
	tokPath := testsuite.CheckpointTokenizer(t, "llama3_1")
	spec := filepath.Join(dir, "m.yaml")
	os.WriteFile(spec, []byte(`model: llama-like
family: llama
dims: {hidden: 64, intermediate: 96, layers: 1, heads: 2, kv_heads: 1, head_dim: 32, vocab: 128256}
weights: {synthetic: {seed: 1, std: 0.02}}
tokenizer: {hf: `+tokPath+`}
bos: 128000
eos: [128001, 128009]
serving: {decode_buckets: [1], prefill_chunks: [32], max_seq_len: 128}
`), 0o644)
	b, err := compile.Build(spec, nil, compile.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if b.Manifest.Model.ChatTemplate == "" {
		t.Fatal("the chat template beside tokenizer.json was not bundled")
	}
	data, err := bundle.Marshal(b)
	if err != nil {
		t.Fatal(err)
	}
	bp := filepath.Join(dir, "m.xmb")
	os.WriteFile(bp, data, 0o644)
	out, err := xmix(t, "tokenize", bp, "Hello, world")
	if err != nil || strings.TrimSpace(out) != "[9906,11,1917]" {
		t.Fatalf("tokenize: %v %q", err, out)
	}
	// --decode, from the bundle and from tokenizer.json; an id outside the vocabulary is an
	// error naming it, as /detokenize answers.
	for _, src := range []string{bp, tokPath} {
		out, err := xmix(t, "tokenize", src, "--decode", "[9906, 11, 1917]")
		if err != nil || strings.TrimSpace(out) != `"Hello, world"` {
			t.Fatalf("tokenize --decode from %s: %v %q", src, err, out)
		}
		for _, ids := range []string{"[9906, -1]", "[9906, 128256]"} {
			if out, err := xmix(t, "tokenize", src, "--decode", ids); err == nil || !strings.Contains(out, "ids[1] = ") || !strings.Contains(out, "is outside the vocabulary (0-128255)") {
				t.Errorf("tokenize %s --decode %s: %v %q", src, ids, err, out)
			}
		}
	}
	tok, _ := tokenizer.Load(tokPath)
	ids, err := chatPrompt(b.Manifest.Model, tok, "Hi")
	if err != nil {
		t.Fatal(err)
	}
	// The whole input: the template writes the BOS (the engine adds none to a chat prompt).
	want := tok.Encode("<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n")
	if !slices.Equal(ids, want) {
		t.Fatalf("chat prompt ids %v, want %v (%q)", ids, want, tok.Decode(ids))
	}
	if _, err := xmix(t, "run", "-q", bp, "--chat", "-p", "Hi", "-n", "2", "--backend", "cpu"); err != nil {
		t.Fatal(err)
	}
}

// TestLogitsMatchTheReference: `xmix logits` at the last prompt position of a reference case
// predicts transformers' first greedy token, and writes every position's logits.
func TestLogitsMatchTheReference(t *testing.T) {
	data, err := os.ReadFile("../../specs/models/tiny/reference.json")
	if err != nil {
		t.Fatal(err)
	}
	var ref struct {
		Cases []struct {
			IDs    []int `json:"ids"`
			Greedy []int `json:"greedy"`
		} `json:"cases"`
	}
	if err := json.Unmarshal(data, &ref); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	bp := tinyBundleFile(t, filepath.Join(dir, "tiny.xmb"))
	c := ref.Cases[0]
	ids, _ := json.Marshal(c.IDs)
	lf := filepath.Join(dir, "l.f32")
	out, err := xmix(t, "logits", bp, "-q", "--backend", "cpu", "--ids", string(ids), "--out", lf)
	if err != nil {
		t.Fatal(err)
	}
	var res struct {
		Positions int   `json:"positions"`
		Argmax    []int `json:"argmax"`
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if res.Positions != len(c.IDs) || res.Argmax[len(c.IDs)-1] != c.Greedy[0] {
		t.Fatalf("positions %d (want %d), last argmax %d (transformers' next token %d)", res.Positions, len(c.IDs), res.Argmax[len(c.IDs)-1], c.Greedy[0])
	}
	if st, err := os.Stat(lf); err != nil || st.Size() != int64(4*258*len(c.IDs)) {
		t.Fatalf("logits file: %v %v", st, err)
	}
}

func TestVersion(t *testing.T) {
	out, err := xmix(t, "--version")
	if err != nil || !strings.HasPrefix(out, "xmix version 0.1") || !strings.Contains(out, "go1.") {
		t.Fatalf("%v: %q", err, out)
	}
}

// TestLogitsPromptAndExports: `xmix logits --prompt-len N` prefills N ids and reports the
// positions from N-1 on, the same as feeding every id alone; --exports writes an enabled
// app's reads at every position, prompt rows included.
func TestLogitsPromptAndExports(t *testing.T) {
	dir := t.TempDir()
	app := filepath.Join(dir, "cap.yaml")
	if err := os.WriteFile(app, []byte(`app: cap
buffers:
  x: {shape: [256], dtype: f32, export: true}
ops:
  - read: {at: {layers: [2], hook: resid_post}, kernel: capture, into: x}
`), 0o644); err != nil {
		t.Fatal(err)
	}
	b, err := compile.Build("../../specs/models/tiny.yaml", []string{app}, compile.Options{EmbedWeights: true})
	if err != nil {
		t.Fatal(err)
	}
	bp := filepath.Join(dir, "tiny.xmb")
	raw, _ := bundle.Marshal(b)
	if err := os.WriteFile(bp, raw, 0o644); err != nil {
		t.Fatal(err)
	}
	ids := `[256, 72, 101, 108, 108, 111, 32, 119]`
	type result struct {
		Positions, First int
		Argmax           []int
		Exports          map[string]int
	}
	run := func(args ...string) (result, []float32) {
		t.Helper()
		ex := filepath.Join(t.TempDir(), "ex")
		out, err := xmix(t, append([]string{"logits", bp, "-q", "--backend", "cpu", "--ids", ids, "--apps", "cap", "--exports", ex}, args...)...)
		if err != nil {
			t.Fatal(err)
		}
		var r result
		if err := json.Unmarshal([]byte(out), &r); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		data, err := os.ReadFile(filepath.Join(ex, "cap.x.f32"))
		if err != nil {
			t.Fatal(err)
		}
		v := make([]float32, len(data)/4)
		for i := range v {
			v[i] = math.Float32frombits(binary.LittleEndian.Uint32(data[4*i:]))
		}
		return r, v
	}
	one, oneX := run()
	five, fiveX := run("--prompt-len", "5")
	if one.Positions != 8 || one.First != 0 || five.Positions != 4 || five.First != 4 || five.Exports["cap.x"] != 256 {
		t.Fatalf("prompt-len 1: %+v; 5: %+v", one, five)
	}
	if !slices.Equal(five.Argmax, one.Argmax[4:]) {
		t.Errorf("argmax from a 5-id prefill %v, one id at a time %v", five.Argmax, one.Argmax[4:])
	}
	if len(oneX) != 8*256 || len(fiveX) != 8*256 || testsuite.RelL2(fiveX, oneX) > 1e-5 {
		t.Errorf("captures: %d and %d values, relative difference %g", len(oneX), len(fiveX), testsuite.RelL2(fiveX, oneX))
	}
	for _, bad := range [][]string{{"--prompt-len", "0"}, {"--prompt-len", "9"}} {
		if _, err := xmix(t, append([]string{"logits", bp, "-q", "--backend", "cpu", "--ids", ids}, bad...)...); err == nil || !strings.Contains(err.Error(), "--prompt-len") {
			t.Errorf("%v: %v", bad, err)
		}
	}
	if _, err := xmix(t, "logits", bp, "-q", "--backend", "cpu", "--ids", ids, "--exports", dir); err == nil || !strings.Contains(err.Error(), "--apps") {
		t.Errorf("--exports without --apps: %v", err)
	}
	// Where the results go is refused before the model runs.
	file := filepath.Join(t.TempDir(), "a-file")
	os.WriteFile(file, nil, 0o644)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--out", dir}, "--out " + dir + ": a folder: give a file path"},
		{[]string{"--out", filepath.Join(file, "x.f32")}, "--out " + filepath.Join(file, "x.f32") + ": " + file + ", where its folder should be, is a file"},
		{[]string{"--out", filepath.Join(dir, "none", "x.f32")}, "its folder " + filepath.Join(dir, "none") + " does not exist"},
		{[]string{"--apps", "cap", "--exports", file}, "--exports " + file + ": mkdir " + file + ": not a directory"},
	} {
		if _, err := xmix(t, append([]string{"logits", bp, "-q", "--backend", "cpu", "--ids", ids}, c.args...)...); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want %q", c.args, err, c.want)
		}
	}
	for _, c := range []struct{ ids, want string }{
		{"[]", "--ids []: no token ids; give at least one"},
		{"[1, 2", "--ids takes a non-empty JSON array of token ids: unexpected end of JSON input"},
	} {
		if _, err := xmix(t, "logits", bp, "-q", "--backend", "cpu", "--ids", c.ids); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("--ids %s: %v, want %q", c.ids, err, c.want)
		}
	}
}

// --gemm-picks is read, and refused with the file's problem, before any weight is loaded;
// tune-gemm checks its flags before it looks for a GPU.
func TestGemmPicksFlags(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "picks.json")
	os.WriteFile(bad, []byte(`[{"device": "x", "cublaslt": 1, "m": 8, "n": 8, "k": 8, "split": 0}]`), 0o644)
	if _, err := xmix(t, "run", "-q", "--backend", "cpu", "--gemm-picks", bad); err == nil ||
		!strings.Contains(err.Error(), "--gemm-picks: "+bad+": pick 0: split 0: must be 1 to 64") {
		t.Errorf("bad picks: %v", err)
	}
	if out, err := xmix(t, "run", "-q", "-n", "4", "--backend", "cpu", "--gemm-picks", "none"); err != nil || !strings.Contains(out, "tiny-steer") {
		t.Errorf("--gemm-picks none: %v\n%s", err, out)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"tune-gemm", "x.xmb"}, "no output: add -o PICKS.json"},
		{[]string{"tune-gemm", "x.xmb", "-o", "p.json", "--max-rows", "0"}, "--max-rows 0: give 1 to 65536"},
		{[]string{"tune-gemm", filepath.Join(dir, "absent.xmb"), "-o", "p.json"}, "absent.xmb"},
		{[]string{"tune-gemm", "x.xmb", "-o", dir}, "-o " + dir + ": a folder: give a file path"},
		{[]string{"tune-gemm", "x.xmb", "-o", filepath.Join(bad, "p.json")}, bad + ", where its folder should be, is a file"},
	} {
		if _, err := xmix(t, c.args...); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("xmix %v: %v, want %q", c.args, err, c.want)
		}
	}
}

// appsFor: --apps gives apps to every prompt, or with @N to prompt N; an index must be the
// whole of what follows @ and name a prompt.
func TestAppsFor(t *testing.T) {
	got, err := appsFor(" steer, probe@1,steer@0", 2)
	if want := [][]string{{"steer", "steer"}, {"steer", "probe"}}; err != nil || !slices.EqualFunc(got, want, slices.Equal) {
		t.Errorf("appsFor: %v %v", got, err)
	}
	for _, spec := range []string{"steer@2", "steer@-1", "steer@x", "steer@0@1", "steer@1x", "steer@"} {
		if _, err := appsFor(spec, 2); err == nil || !strings.Contains(err.Error(), "is not in 0-1") {
			t.Errorf("appsFor(%q): %v", spec, err)
		}
	}
}
