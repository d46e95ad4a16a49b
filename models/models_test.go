package models

import (
	"path/filepath"
	"strings"
	"testing"

	"xmix/frontend"
	"xmix/ir"
)

func build(t *testing.T, family, extra string) *ir.Graph {
	t.Helper()
	spec := `model: m
family: ` + family + `
dims: {hidden: 8, intermediate: 16, layers: 2, heads: 2, kv_heads: 1, head_dim: 4, vocab: 300` + extra + `}
weights: {synthetic: {seed: 1, std: 0.02}}
tokenizer: bytes
`
	m, err := frontend.ParseModel(filepath.Join(t.TempDir(), "m.yaml"), []byte(spec))
	if err != nil {
		t.Fatal(err)
	}
	g, err := Build(m)
	if err != nil {
		t.Fatal(err)
	}
	if err := ir.Verify(g); err != nil {
		t.Fatalf("%s: %v", family, err)
	}
	return g
}

// Each family's builder names the hook surface transformers' hidden states give it; what it
// cannot fire yet it refuses with the reason, and its checkpoint tensors are Hugging Face's.
func TestFamiliesHooksAndTensors(t *testing.T) {
	const dense = "embed resid_pre attn.q attn.k attn.v attn.z attn_out resid_mid mlp.act mlp_out resid_post final_norm logits sampled"
	for _, c := range []struct {
		family, extra, hooks, refused, tensor string
	}{
		{"llama", "", dense, "", "model.layers.1.mlp.down_proj.weight"},
		{"mistral", "", dense, "", "model.layers.1.self_attn.o_proj.weight"},
		{"qwen2", "", dense, "attn.k attn.q attn.v", "model.layers.0.self_attn.k_proj.bias"},
		{"qwen3", "", dense, "", "model.layers.1.self_attn.q_norm.weight"},
		{"mixtral", ", experts: 4, experts_per_token: 2",
			"embed resid_pre attn.q attn.k attn.v attn.z attn_out resid_mid router_logits mlp_out resid_post final_norm logits sampled",
			"mlp.act", "model.layers.1.block_sparse_moe.experts.3.w3.weight"},
		{"gemma2", ", query_pre_attn_scalar: 8, sliding_window: 4", dense, "", "model.layers.1.post_feedforward_layernorm.weight"},
	} {
		g := build(t, c.family, c.extra)
		if names, _ := g.HookNames(); strings.Join(names, " ") != c.hooks {
			got := strings.Join(names, " ")
			t.Errorf("%s hooks:\n got %s\nwant %s", c.family, got, c.hooks)
		}
		var refused []string
		for _, h := range []string{"attn.k", "attn.q", "attn.v", "mlp.act"} {
			if g.Refused[h] != "" {
				refused = append(refused, h)
			}
		}
		if got := strings.Join(refused, " "); got != c.refused {
			t.Errorf("%s refuses %q, want %q", c.family, got, c.refused)
		}
		found := false
		for _, w := range g.Weights() {
			for _, name := range w.Tensors {
				found = found || name == c.tensor
			}
		}
		if !found {
			t.Errorf("%s reads no tensor %s", c.family, c.tensor)
		}
	}
}

func TestBuildRefusesAnUnknownFamily(t *testing.T) {
	m := &frontend.Model{Name: "m", Family: "gpt2"}
	if _, err := Build(m); err == nil || !strings.Contains(err.Error(), "model m: family gpt2 has no graph builder (families: gemma2, llama, mistral, mixtral, qwen2, qwen3)") {
		t.Fatalf("got %v", err)
	}
}
