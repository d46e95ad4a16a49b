package testsuite

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"xmix/bundle"
	"xmix/compile"
	"xmix/frontend"
	"xmix/loader"
)

// buildSeeds are apps on SmallModel (3 layers, hidden 128, 4 heads, vocab 300) that cover
// every built-in kernel, hook kind and condition, for FuzzBuild to mutate.
var buildSeeds = []string{
	"app: a\nparams: {v: {random: 1}}\nops:\n  - write: {at: {layers: [1], hook: resid_post}, kernel: steer_add, args: {vector: v, alpha: 2.0}, when: {positions: generated}}\n",
	"app: a\nparams: {d: {random: 2}}\nops:\n  - write: {at: {layers: all, hook: resid_pre}, kernel: project_out, args: {direction: d}}\n",
	"app: a\nparams: {d: {random: 3}}\nops:\n  - write: {at: {layers: \"0-2\", hook: resid_mid}, kernel: steer_set, args: {direction: d, value: 0.75}, when: {steps: {from: 1, to: 3}}}\n",
	"app: a\nparams: {d: {random: 4}}\nops:\n  - write: {at: {layers: [2], hook: resid_post}, kernel: clamp_projection, args: {direction: d, min: -1, max: 1}, when: {token_in: [65, 66]}}\n",
	"app: a\nops:\n  - write: {at: {layers: [0], hook: attn.z}, kernel: head_ablate, args: {head: 1}}\n  - write: {at: {layers: [1], hook: mlp_out}, kernel: scale, args: {alpha: 0.5}, when: {after_token: [46]}}\n",
	"app: a\nparams: {w: {random: 5}}\nbuffers:\n  p: {shape: [1], dtype: f32, export: true}\nops:\n  - read: {at: {layers: [1], hook: resid_post}, kernel: probe_linear, args: {w: w, bias: -0.3, activation: sigmoid}, into: p}\n  - write: {at: {layers: [2], hook: resid_post}, kernel: scale, args: {alpha: 0.9}, when: {activation: {buffer: p, op: \">\", value: 0.5}}}\n",
	"app: a\nbuffers:\n  h: {shape: [1, 128], dtype: f32, export: true}\nops:\n  - read: {at: {layers: [2], hook: attn_out}, kernel: capture, into: h}\n",
	"app: a\nbuffers:\n  h: {shape: [32], dtype: f32, export: true}\nops:\n  - read: {at: {layers: [1], hook: resid_post}, kernel: logit_lens, args: {k: 16}, into: h}\n",
	"app: a\nparams: {s: {random: 6}}\nops:\n  - write: {at: {hook: embed}, kernel: patch, args: {vector: s}, when: {positions: prompt}}\n",
	"app: a\nops:\n  - write: {at: {hook: sampled}, kernel: token_override, args: {token: 42}, when: {steps: {from: 2}}}\n",
	"app: a\nops:\n  - write: {at: {hook: logits}, kernel: scale, args: {alpha: 2}}\n  - write: {at: {layers: [0], hook: attn.q}, kernel: scale, args: {alpha: 1.5}}\n",
	"app: a\nbuffers:\n  k: {shape: [1, 64], dtype: f32, export: true}\n  v: {shape: [1, 64], dtype: f32, export: true}\nops:\n  - read: {at: {layers: [0], hook: attn.k}, kernel: capture, into: k}\n  - read: {at: {layers: [1], hook: attn.v}, kernel: capture, into: v}\n  - write: {at: {layers: [2], hook: mlp.act}, kernel: scale, args: {alpha: 0.5}}\n  - write: {at: {hook: final_norm}, kernel: scale, args: {alpha: 1.1}}\n",
}

// FuzzBuild runs an app spec through the whole pipeline on SmallModel: the frontend, every
// pass with its verifier, codegen, the bundle's check and its .xmb round trip, then two
// requests on the CPU backend with the app on. Any spec must end in a bundle that runs (or
// whose run reports an error), or in an error that says something; never a panic.
func FuzzBuild(f *testing.F) {
	for _, s := range buildSeeds {
		f.Add(s)
	}
	dir := f.TempDir()
	modelPath := filepath.Join(dir, "model.yaml")
	if err := os.WriteFile(modelPath, []byte(SmallModel), 0o644); err != nil {
		f.Fatal(err)
	}
	appPath := filepath.Join(dir, "app.yaml")
	f.Fuzz(func(t *testing.T, app string) {
		if err := os.WriteFile(appPath, []byte(app), 0o644); err != nil {
			t.Fatal(err)
		}
		runSpecs(t, modelPath, appPath, app)
	})
}

// runSpecs builds the specs at modelPath and appPath, round-trips the bundle and runs two
// requests with every app on, on the CPU backend. A build or a run may fail, with an error
// that says something; nothing may panic or hang. spec is the fuzzed text, for the report.
func runSpecs(t *testing.T, modelPath, appPath, spec string) {
	b, err := compile.Build(modelPath, []string{appPath}, compile.Options{Verify: true})
	if err != nil {
		var list frontend.ErrorList
		if errors.As(err, &list) && len(list) == 0 || strings.TrimSpace(err.Error()) == "" {
			t.Fatalf("an empty error for\n%s", spec)
		}
		return
	}
	data, err := bundle.Marshal(b)
	if err != nil {
		t.Fatalf("marshal: %v\n%s", err, spec)
	}
	if b, err = bundle.Unmarshal(data); err != nil {
		t.Fatalf("the bundle does not read back: %v\n%s", err, spec)
	}
	be := NewCPU(t, b)
	defer be.Close()
	eng, err := loader.NewEngine(b, be)
	if err != nil {
		t.Fatalf("engine: %v\n%s", err, spec)
	}
	var apps []string
	for _, a := range b.Manifest.Apps {
		apps = append(apps, a.Name)
	}
	reqs := []loader.Request{
		{Prompt: []int{65, 66, 46}, MaxTokens: 4, Apps: apps},
		{Prompt: []int{10, 11, 12, 40, 66}, MaxTokens: 3, Apps: apps, Temperature: 1, TopP: 0.9, Seed: 7},
	}
	// A run may fail (an app may make the logits overflow, which the engine reports), but
	// it must return.
	if res, err := eng.Generate(reqs); err == nil && len(res) != len(reqs) {
		t.Fatalf("%d results for %d requests\n%s", len(res), len(reqs), spec)
	}
}

// FuzzBuildModel is FuzzBuild's pipeline for model specs, each with an app that reads and
// writes several hooks: the frontend, the passes, codegen, the bundle's check and round
// trip, two requests on the CPU backend. Specs the frontend takes whose forward would be too
// large for a fuzzing step (its limits are tested on their own) are skipped.
func FuzzBuildModel(f *testing.F) {
	for _, s := range []string{SmallModel, SmallQwen2, SmallQwen3, SmallMixtral, SmallGemma2, SmallTP4} {
		f.Add(s)
	}
	dir := f.TempDir()
	modelPath, appPath := filepath.Join(dir, "model.yaml"), filepath.Join(dir, "app.yaml")
	app := "app: a\nparams: {w: {random: 1}}\nbuffers:\n  p: {shape: [1], dtype: f32, export: true}\nops:\n" +
		"  - read: {at: {layers: [0], hook: attn_out}, kernel: probe_linear, args: {w: w, bias: 0, activation: sigmoid}, into: p}\n" +
		"  - write: {at: {layers: all, hook: resid_post}, kernel: scale, args: {alpha: 0.9}}\n" +
		"  - write: {at: {hook: logits}, kernel: scale, args: {alpha: 1.5}}\n"
	if err := os.WriteFile(appPath, []byte(app), 0o644); err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, model string) {
		m, err := frontend.ParseModel(modelPath, []byte(model))
		if err != nil {
			return
		}
		rows := max(m.MaxSeqLen, slices.Max(append(m.PrefillChunks, 1)))
		if m.Layers*m.Hidden*max(m.Intermediate, m.Hidden) > 1<<22 || m.Vocab*m.Hidden > 1<<22 || rows > 1024 || m.Weights.Path != "" {
			return
		}
		if err := os.WriteFile(modelPath, []byte(model), 0o644); err != nil {
			t.Fatal(err)
		}
		runSpecs(t, modelPath, appPath, model)
	})
}
