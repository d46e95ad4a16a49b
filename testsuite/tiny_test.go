package testsuite

import (
	"encoding/json"
	"os"
	"slices"
	"testing"

	"xmix/compile"
	"xmix/loader"
)

// tinyReference is what specs/models/tiny/train.py recorded with Hugging Face transformers
// (float32 math on the bf16-rounded weights) for the embedded model.
type tinyReference struct {
	SteerAlpha float64 `json:"steer_alpha"`
	Cases      []struct {
		Prompt     string    `json:"prompt"`
		IDs        []int     `json:"ids"`
		Greedy     []int     `json:"greedy"`
		LastLogits []float32 `json:"last_logits"`
		Steered    []int     `json:"steered"`
		Probe      []float64 `json:"probe"`
	} `json:"cases"`
}

// TestTinyMatchesTransformers: the embedded model on the CPU backend reproduces Hugging
// Face's greedy continuations and last-position logits, and its demo probe's scores.
func TestTinyMatchesTransformers(t *testing.T) {
	data, err := os.ReadFile("../specs/models/tiny/reference.json")
	if err != nil {
		t.Fatal(err)
	}
	var ref tinyReference
	if err := json.Unmarshal(data, &ref); err != nil {
		t.Fatal(err)
	}
	b, err := compile.Build("../specs/models/tiny.yaml", []string{"../specs/apps/tiny-probe.yaml"}, compile.Options{})
	if err != nil {
		t.Fatal(err)
	}
	be := NewCPU(t, b)
	rec := &LogitRecorder{Backend: be, Vocab: b.Manifest.Model.Vocab}
	eng, err := loader.NewEngine(b, rec)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range ref.Cases {
		prompt := c.IDs[1:] // the reference ids start with BOS; the engine adds it
		rec.Steps = nil
		res, err := eng.Generate([]loader.Request{{Prompt: prompt, Apps: []string{"tiny-probe"}, MaxTokens: len(c.Greedy)}})
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(res[0].Tokens, c.Greedy) {
			t.Errorf("%q: greedy %q, transformers %q", c.Prompt, ByteText(res[0].Tokens), ByteText(c.Greedy))
		}
		// A prompt may take several steps; the last of them samples the first token, and
		// every later token is one decode step.
		if e := RelL2(rec.Steps[len(rec.Steps)-len(res[0].Tokens)], c.LastLogits); e > 1e-3 {
			t.Errorf("%q: last-position logits relative error %.3g", c.Prompt, e)
		}
		for i, want := range c.Probe {
			if i >= len(res[0].Rows) {
				break
			}
			if got := res[0].Rows[i].Exports.Get("tiny-probe.happy")[0]; abs(float64(got)-want) > 2e-3 {
				t.Errorf("%q: probe at position %d = %.4f, transformers %.4f", c.Prompt, i, got, want)
				break
			}
		}
	}
}

func abs(x float64) float64 {
	if x < 0 {
		return -x
	}
	return x
}

// ByteText renders byte-tokenizer ids as text.
func ByteText(ids []int) string { return loader.ByteTokenizer{}.Decode(ids) }
