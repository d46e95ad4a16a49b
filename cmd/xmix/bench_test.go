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
