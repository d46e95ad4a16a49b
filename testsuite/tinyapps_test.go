package testsuite

import (
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"xmix/bundle"
	"xmix/compile"
	"xmix/loader"
	"xmix/safetensors"
)

// Prompts of the tiny apps' demos (specs/apps/tiny/README.md).
const (
	promptTom   = "Tom opened the box and looked inside."
	promptBear  = "There was once an old bear who lived near the river."
	promptLily  = "One day, a girl named Lily went to the park."
	promptFox   = "Once upon a time, a little fox"
	promptCat   = "One morning, a sleepy cat woke up early."
	promptHappy = "On a golden day, Sara hugged everyone in the field, feeling joyful."
	tinyTokens  = 64
)

// buildTiny compiles the embedded model with the given app files (and a capture of layer 5's
// resid_post, so rows can be compared bit for bit) through the .xmb format.
func buildTiny(t *testing.T, apps ...string) *bundle.Bundle {
	t.Helper()
	capPath := filepath.Join(t.TempDir(), "cap.yaml")
	if err := os.WriteFile(capPath, []byte(captureApp(5, 256)), 0o644); err != nil {
		t.Fatal(err)
	}
	b, err := compile.Build("../specs/models/tiny.yaml", append(apps, capPath), compile.Options{Verify: true})
	if err != nil {
		t.Fatal(err)
	}
	return roundTrip(t, b)
}

func tinyApps(t *testing.T) []string {
	t.Helper()
	apps, err := filepath.Glob("../specs/apps/tiny/tiny-app*.yaml")
	if err != nil || len(apps) != 6 {
		t.Fatalf("tiny apps: %v %v", apps, err)
	}
	return apps
}

func tinyReq(prompt string, apps ...string) loader.Request {
	return loader.Request{Prompt: loader.ByteTokenizer{}.Encode(prompt), Apps: append(apps, "cap"), MaxTokens: tinyTokens}
}

// TestTinyApps: each of the six tiny apps changes the embedded model's greedy text on its demo
// prompt the way it should (the sad words go, the happy ones come, the pronoun turns), the
// read-only probe changes nothing and names the animal, requests without an app are bit-identical
// to a bundle without the apps, and a batch with one app per row equals each row run alone.
func TestTinyApps(t *testing.T) {
	withApps := buildTiny(t, tinyApps(t)...)
	bare := buildTiny(t)
	type demo struct {
		app, prompt string
		gone, comes string // a phrase of the bare text that the app removes, one it brings
	}
	demos := []demo{
		{"tiny-app1-mood-ablation", promptTom, "sad and lonely", "He felt loved"},
		{"tiny-app1-mood-ablation", promptLily, "The sky was dark", "The sky was bright"},
		{"tiny-app2-cheer-after-period", promptTom, "sad and lonely", "He felt loved"},
		{"tiny-app3-cheer-when-sad", promptTom, "sad and lonely", "He felt loved"},
		{"tiny-app5-she", promptBear, "He waited", "She waited"},
		{"tiny-app5-she", promptCat, "He sang", "She sang"},
		{"tiny-app6-clamped-cheer", promptBear, "The sky was dark", "The sun was shining"},
		{"tiny-app6-clamped-cheer", promptLily, "The sky was dark", "The sky was bright"},
	}
	var reqs, bareReqs []loader.Request
	for _, d := range demos {
		reqs = append(reqs, tinyReq(d.prompt, d.app))
		bareReqs = append(bareReqs, tinyReq(d.prompt))
	}
	got := Generate(t, NewCPU, withApps, reqs)
	want := Generate(t, NewCPU, bare, bareReqs)
	off := Generate(t, NewCPU, withApps, bareReqs)
	for i, d := range demos {
		g, w := ByteText(got[i].Tokens), ByteText(want[i].Tokens)
		t.Logf("%s\n  bare: %s%s\n  app:  %s%s", d.app, d.prompt, w, d.prompt, g)
		if !strings.Contains(w, d.gone) || strings.Contains(g, d.gone) || !strings.Contains(g, d.comes) {
			t.Errorf("%s on %q: want %q gone and %q in\n  %q\n(bare %q)", d.app, d.prompt, d.gone, d.comes, g, w)
		}
		if !slices.Equal(off[i].Tokens, want[i].Tokens) || !sameRows(off[i], want[i]) {
			t.Errorf("%q without apps differs from the bundle without them", d.prompt)
		}
	}

	// App 2 steers only from the first '.': a prompt without one is untouched up to and
	// including the first '.' the model writes.
	res := Generate(t, NewCPU, withApps, []loader.Request{tinyReq(promptFox, "tiny-app2-cheer-after-period"), tinyReq(promptFox)})
	g, w := ByteText(res[0].Tokens), ByteText(res[1].Tokens)
	dot := strings.IndexByte(w, '.')
	if dot < 0 || g[:dot+1] != w[:dot+1] {
		t.Errorf("app 2 changed the text before the first '.': %q, bare %q", g, w)
	}
	// App 3's probe stays low on a happy story, so nothing is steered.
	res = Generate(t, NewCPU, withApps, []loader.Request{tinyReq(promptHappy, "tiny-app3-cheer-when-sad"), tinyReq(promptHappy)})
	if !slices.Equal(res[0].Tokens, res[1].Tokens) {
		t.Errorf("app 3 steered a happy story: %q, bare %q", ByteText(res[0].Tokens), ByteText(res[1].Tokens))
	}
}

// TestTinyKindProbe: app 4 is read-only (tokens and residuals bit-identical to the same
// batch without it) and, at the last byte of an animal's name, scores that animal highest.
func TestTinyKindProbe(t *testing.T) {
	withApps := buildTiny(t, tinyApps(t)...)
	kinds := []string{"fox", "bear", "cat", "dog", "owl"}
	var with, without []loader.Request
	for _, k := range kinds {
		// A frame the probe was not fitted on (specs/models/tiny/derive's kindFrames).
		p := "Mia saw a happy " + k + " near the lake."
		with = append(with, tinyReq(p, "tiny-app4-kind-probe"))
		without = append(without, tinyReq(p))
	}
	res := Generate(t, NewCPU, withApps, with)
	ref := Generate(t, NewCPU, withApps, without)
	for i, k := range kinds {
		if !slices.Equal(res[i].Tokens, ref[i].Tokens) || !sameRows(res[i], ref[i]) {
			t.Errorf("%s: the probe changed the output", k)
		}
		// Row 0 is BOS, row 1+j fed byte j.
		row := len("Mia saw a happy ") + len(k)
		last := res[i].Rows[row].Exports.Get("tiny-app4-kind-probe.kind")
		if len(last) != len(kinds) {
			t.Fatalf("%s: kind export %v", k, last)
		}
		best := 0
		for j := range last {
			if last[j] > last[best] {
				best = j
			}
		}
		t.Logf("%s: scores %v", k, last)
		if kinds[best] != k {
			t.Errorf("%s: probe says %s (scores %v)", k, kinds[best], last)
		}
	}
}

// TestTinyAppsMixed: one batch of seven rows (no app, then apps 1 to 6, one per row) gives
// each row what it gets alone; app 6's clamp holds the mood component at layer 5 within its
// bounds.
func TestTinyAppsMixed(t *testing.T) {
	b := buildTiny(t, tinyApps(t)...)
	names := []string{"", "tiny-app1-mood-ablation", "tiny-app2-cheer-after-period", "tiny-app3-cheer-when-sad",
		"tiny-app4-kind-probe", "tiny-app5-she", "tiny-app6-clamped-cheer"}
	prompts := []string{promptTom, promptLily, promptBear, promptTom, promptFox, promptBear, promptLily}
	var reqs []loader.Request
	for i, n := range names {
		r := tinyReq(prompts[i])
		if n != "" {
			r = tinyReq(prompts[i], n)
		}
		r.MaxTokens = 16
		reqs = append(reqs, r)
	}
	batch := Generate(t, NewCPU, b, reqs)
	for i, req := range reqs {
		solo := Generate(t, NewCPU, b, []loader.Request{req})[0]
		if !slices.Equal(solo.Tokens, batch[i].Tokens) {
			t.Fatalf("row %d (%v): batched %q, alone %q", i, req.Apps, ByteText(batch[i].Tokens), ByteText(solo.Tokens))
		}
		// Rows round differently at another place in the batch; app 3's sigmoid far in its
		// tail (1e-6) magnifies that relative to the value, so the error has an absolute floor.
		for r, row := range batch[i].Rows {
			for _, x := range row.Exports {
				k, v := x.Name, x.Values
				s := solo.Rows[r].Exports.Get(k)
				var diff, ref float64
				for j := range v {
					diff += float64(v[j]-s[j]) * float64(v[j]-s[j])
					ref += float64(s[j]) * float64(s[j])
				}
				if math.Sqrt(diff) > 1e-5*(math.Sqrt(ref)+1) {
					t.Fatalf("row %d position %d export %s: batched %v, alone %v", i, r, k, v, s)
				}
			}
		}
	}

	f, closer, err := safetensors.Open("../specs/models/tiny/apps.safetensors")
	if err != nil {
		t.Fatal(err)
	}
	defer closer.Close()
	mood, err := f.Tensors["mood_l3"].Float32s()
	if err != nil {
		t.Fatal(err)
	}
	d := unit64(mood)
	res := Generate(t, NewCPU, b, []loader.Request{reqs[6]})
	for r, x := range captured(res[0]) {
		if c := dotU(x, d); c < -1e-2 || c > 10+1e-2 {
			t.Errorf("app 6: row %d has mood component %.3f, outside the clamp [0, 10]", r, c)
		}
	}
}

// sameRows reports whether two results' captured residuals are bit-identical.
func sameRows(a, b loader.Result) bool {
	ca, cb := captured(a), captured(b)
	if len(ca) != len(cb) {
		return false
	}
	for i := range ca {
		for j := range ca[i] {
			if math.Float32bits(ca[i][j]) != math.Float32bits(cb[i][j]) {
				return false
			}
		}
	}
	return true
}
