package frontend

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const mixtralSpec = `model: m
family: mixtral
dims: {hidden: 64, intermediate: 96, layers: 2, heads: 4, vocab: 300%s}
weights: {synthetic: {seed: 1}}
tokenizer: bytes
bos: 256
`

func TestMixtralExperts(t *testing.T) {
	for _, c := range []struct {
		name, dims  string
		experts, k  int
		errContains string
	}{
		{"given", ", experts: 8, experts_per_token: 3", 8, 3, ""},
		{"top-2 by default", ", experts: 4", 4, 2, ""},
		{"missing", "", 0, 0, "family mixtral: the number of experts is missing"},
		{"too many", ", experts: 65", 0, 0, "experts: 65 is not supported"},
		{"top-k above experts", ", experts: 2, experts_per_token: 3", 0, 0, "experts_per_token: 3 is not supported"},
		{"not an integer", ", experts: two", 0, 0, "dims.experts: expected an integer"},
	} {
		t.Run(c.name, func(t *testing.T) {
			m, err := ParseModel("m.yaml", []byte(strings.Replace(mixtralSpec, "%s", c.dims, 1)))
			if c.errContains != "" {
				if err == nil || !strings.Contains(err.Error(), c.errContains) {
					t.Fatalf("got %v, want an error containing %q", err, c.errContains)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if m.Experts != c.experts || m.TopK != c.k {
				t.Fatalf("experts %d top-k %d, want %d %d", m.Experts, m.TopK, c.experts, c.k)
			}
		})
	}
}

func TestExpertsOnlyForMixtral(t *testing.T) {
	spec := strings.Replace(strings.Replace(mixtralSpec, "%s", ", experts: 8", 1), "family: mixtral", "family: llama", 1)
	_, err := ParseModel("m.yaml", []byte(spec))
	if err == nil || !strings.Contains(err.Error(), "m.yaml:3:") || !strings.Contains(err.Error(), "dims: family llama has no experts") {
		t.Fatalf("got %v, want a refusal of dims.experts at line 3", err)
	}
}

func TestMixtralExpertsFromConfig(t *testing.T) {
	dir := t.TempDir()
	cfg := `{"model_type": "mixtral", "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
 "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 300, "num_local_experts": 6, "num_experts_per_tok": 3}`
	if err := os.WriteFile(filepath.Join(dir, "config.json"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	spec := "model: m\nconfig: config.json\nweights: {synthetic: {seed: 1}}\ntokenizer: bytes\nbos: 256\n"
	m, err := ParseModel(filepath.Join(dir, "m.yaml"), []byte(spec))
	if err != nil {
		t.Fatal(err)
	}
	if m.Family != "mixtral" || m.Experts != 6 || m.TopK != 3 {
		t.Fatalf("family %s, experts %d, top-k %d; want mixtral 6 3", m.Family, m.Experts, m.TopK)
	}
	// dims: overrides config.json.
	m, err = ParseModel(filepath.Join(dir, "m.yaml"), []byte(spec+"dims: {experts: 4, experts_per_token: 1}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if m.Experts != 4 || m.TopK != 1 {
		t.Fatalf("experts %d, top-k %d; want 4 1", m.Experts, m.TopK)
	}
}
