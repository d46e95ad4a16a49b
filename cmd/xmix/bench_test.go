package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"xmix/bundle"
	"xmix/cmd/driver"
)

// An app-vs-no-app comparison is only fair on one workload: enabling apps must not change
// the prompts or arrival times the benchmark draws.
func TestBenchAppsKeepTheWorkload(t *testing.T) {
	b, err := driver.Build("../../specs/models/tiny.yaml", []string{"../../specs/apps/tiny-steer.yaml"}, driver.Options{EmbedWeights: true})
	if err != nil {
		t.Fatal(err)
	}
	bp := filepath.Join(t.TempDir(), "tiny.xmb")
	raw, _ := bundle.Marshal(b)
	if err := os.WriteFile(bp, raw, 0o644); err != nil {
		t.Fatal(err)
	}
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
		b, err := driver.Build(sp, nil, driver.Options{EmbedWeights: true})
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
