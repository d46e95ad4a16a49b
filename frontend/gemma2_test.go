package frontend

import (
	"math"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// gemma2Config is Gemma-2-2B's public config.json (no tie_word_embeddings: Gemma2Config's
// default, true).
const gemma2Config = `{
  "architectures": ["Gemma2ForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "attn_logit_softcapping": 50.0,
  "bos_token_id": 2,
  "cache_implementation": "hybrid",
  "eos_token_id": 1,
  "final_logit_softcapping": 30.0,
  "head_dim": 256,
  "hidden_act": "gelu_pytorch_tanh",
  "hidden_activation": "gelu_pytorch_tanh",
  "hidden_size": 2304,
  "initializer_range": 0.02,
  "intermediate_size": 9216,
  "max_position_embeddings": 8192,
  "model_type": "gemma2",
  "num_attention_heads": 8,
  "num_hidden_layers": 26,
  "num_key_value_heads": 4,
  "pad_token_id": 0,
  "query_pre_attn_scalar": 256,
  "rms_norm_eps": 1e-06,
  "rope_theta": 10000.0,
  "sliding_window": 4096,
  "torch_dtype": "float32",
  "use_cache": true,
  "vocab_size": 256000
}`

// gemma2Fields are the parts of a Model Gemma 2 sets, for comparisons.
func gemma2Fields(m *Model) []any {
	return []any{m.Family, m.Activation, m.NormOffset, m.PostNorms, m.QueryPreAttnScalar, m.AttnSoftcap, m.FinalSoftcap,
		m.SlidingWindow, m.SlidingLayers, m.TieEmbeddings, m.RMSEps}
}

func alternating(n int) []bool {
	s := make([]bool, n)
	for i := range s {
		s[i] = i%2 == 0
	}
	return s
}

func TestParseModelGemma2HF(t *testing.T) {
	dir := t.TempDir()
	writeCheckpoint(t, dir, "gemma-2-2b", map[string]string{"config.json": gemma2Config, "tokenizer.json": "{}"})
	m, err := ParseModel(filepath.Join(dir, "m.yaml"), []byte("hf: gemma-2-2b\n"))
	if err != nil {
		t.Fatal(err)
	}
	want := []any{"gemma2", ActGeluTanh, 1.0, true, 256.0, 50.0, 30.0, 4096, alternating(26), true, 1e-6}
	if got := gemma2Fields(m); !reflect.DeepEqual(got, want) {
		t.Errorf("gemma-2-2b\n got %v\nwant %v", got, want)
	}
	if m.Hidden != 2304 || m.HeadDim != 256 || m.Heads != 8 || m.KVHeads != 4 || m.BOS != 2 || !reflect.DeepEqual(m.EOS, []int{1}) {
		t.Errorf("dims %d %d %d %d bos %d eos %v", m.Hidden, m.HeadDim, m.Heads, m.KVHeads, m.BOS, m.EOS)
	}
	if m.AttnScale() != 1.0/16 || m.EmbedScale() != 48 || m.AttnWindow(0) != 4096 || m.AttnWindow(1) != 0 || m.AttnWindow(25) != 0 {
		t.Errorf("scale %v, embed scale %v, windows %d %d %d", m.AttnScale(), m.EmbedScale(), m.AttnWindow(0), m.AttnWindow(1), m.AttnWindow(25))
	}

	// transformers v5 configs list the layers' kinds; null caps and windows turn them off;
	// Gemma-2-27B's scalar is hidden / heads.
	v5 := strings.NewReplacer(`"sliding_window": 4096`, `"sliding_window": 512,
  "layer_types": ["full_attention", "sliding_attention", "sliding_attention", "full_attention"]`,
		`"num_hidden_layers": 26`, `"num_hidden_layers": 4`, `"final_logit_softcapping": 30.0`, `"final_logit_softcapping": null`,
		`"query_pre_attn_scalar": 256`, `"query_pre_attn_scalar": 144`, `"hidden_activation": "gelu_pytorch_tanh"`,
		`"hidden_activation": "gelu_new", "tie_word_embeddings": false`).Replace(gemma2Config)
	writeCheckpoint(t, dir, "v5", map[string]string{"config.json": v5, "tokenizer.json": "{}"})
	if m, err = ParseModel(filepath.Join(dir, "m.yaml"), []byte("hf: v5\n")); err != nil {
		t.Fatal(err)
	}
	want = []any{"gemma2", ActGeluTanh, 1.0, true, 144.0, 50.0, 0.0, 512, []bool{false, true, true, false}, false, 1e-6}
	if got := gemma2Fields(m); !reflect.DeepEqual(got, want) {
		t.Errorf("v5 config\n got %v\nwant %v", got, want)
	}
	if math.Abs(m.AttnScale()-1.0/12) > 1e-15 {
		t.Errorf("scale %v, want 1/12", m.AttnScale())
	}
	noWindow := strings.Replace(gemma2Config, `"sliding_window": 4096`, `"sliding_window": null`, 1)
	writeCheckpoint(t, dir, "nowindow", map[string]string{"config.json": noWindow, "tokenizer.json": "{}"})
	if m, err = ParseModel(filepath.Join(dir, "m.yaml"), []byte("hf: nowindow\ndims: {attn_logit_softcapping: null}\n")); err != nil {
		t.Fatal(err)
	}
	if m.SlidingWindow != 0 || m.SlidingLayers != nil || m.AttnWindow(0) != 0 || m.AttnSoftcap != 0 {
		t.Errorf("null window and cap: %d %v %v", m.SlidingWindow, m.SlidingLayers, m.AttnSoftcap)
	}
}

// TestParseModelGemma2Shipped: the shipped specs give Gemma2Config's values; 9B's embedding
// scale is sqrt(3584) rounded to bf16, as transformers rounds it for a bf16 model.
func TestParseModelGemma2Shipped(t *testing.T) {
	for _, c := range []struct {
		file           string
		hidden, layers int
		embed          float32
	}{{"gemma-2-2b.yaml", 2304, 26, 48}, {"gemma-2-9b.yaml", 3584, 42, 59.75}} {
		m, err := LoadModel(filepath.Join("..", "specs", "models", c.file))
		if err != nil {
			t.Fatal(err)
		}
		want := []any{"gemma2", ActGeluTanh, 1.0, true, 256.0, 50.0, 30.0, 4096, alternating(c.layers), true, 1e-6}
		if got := gemma2Fields(m); !reflect.DeepEqual(got, want) || m.Hidden != c.hidden || m.HeadDim != 256 || m.EmbedScale() != c.embed {
			t.Errorf("%s: %v hidden %d head dim %d embed scale %v", c.file, got, m.Hidden, m.HeadDim, m.EmbedScale())
		}
	}
}

func TestParseModelGemma2Defaults(t *testing.T) {
	m, err := ParseModel(filepath.Join(t.TempDir(), "m.yaml"), []byte(`model: g
family: gemma2
dims: {hidden: 64, intermediate: 128, layers: 3, heads: 2, head_dim: 32, vocab: 300}
weights: {synthetic: {seed: 1}}
dtype: f32
tokenizer: bytes
`))
	if err != nil {
		t.Fatal(err)
	}
	want := []any{"gemma2", ActGeluTanh, 1.0, true, 256.0, 50.0, 30.0, 4096, alternating(3), true, 1e-6}
	if got := gemma2Fields(m); !reflect.DeepEqual(got, want) {
		t.Errorf("defaults\n got %v\nwant %v", got, want)
	}
	if m.EmbedScale() != 8 { // f32: sqrt(64) as it is
		t.Errorf("embed scale %v", m.EmbedScale())
	}
	// Other families keep the Llama forward.
	llama, err := ParseModel(filepath.Join(t.TempDir(), "t.yaml"), []byte(tinyModel))
	if err != nil {
		t.Fatal(err)
	}
	if llama.EmbedScale() != 0 || llama.AttnWindow(0) != 0 || llama.AttnScale() != 1/math.Sqrt(32) || llama.Activation != "" {
		t.Errorf("llama: %v %v %v %q", llama.EmbedScale(), llama.AttnWindow(0), llama.AttnScale(), llama.Activation)
	}
}

func TestParseModelGemma2Errors(t *testing.T) {
	dir := t.TempDir()
	bad := map[string]string{
		"exactgelu": strings.Replace(gemma2Config, `"hidden_activation": "gelu_pytorch_tanh"`, `"hidden_activation": "gelu"`, 1),
		"bidir":     strings.Replace(gemma2Config, `"use_cache": true`, `"use_bidirectional_attention": true`, 1),
		"types":     strings.Replace(gemma2Config, `"sliding_window": 4096`, `"sliding_window": 4096, "layer_types": ["full_attention"]`, 1),
		"kind": strings.Replace(strings.Replace(gemma2Config, `"num_hidden_layers": 26`, `"num_hidden_layers": 2`, 1),
			`"sliding_window": 4096`, `"sliding_window": 4096, "layer_types": ["full_attention", "chunked_attention"]`, 1),
		"capword": strings.Replace(gemma2Config, `"attn_logit_softcapping": 50.0`, `"attn_logit_softcapping": "fifty"`, 1),
		"capneg":  strings.Replace(gemma2Config, `"final_logit_softcapping": 30.0`, `"final_logit_softcapping": -30.0`, 1),
		"scalar":  strings.Replace(gemma2Config, `"query_pre_attn_scalar": 256`, `"query_pre_attn_scalar": 0`, 1),
		"window":  strings.Replace(gemma2Config, `"sliding_window": 4096`, `"sliding_window": 0`, 1),
		"bias":    strings.Replace(gemma2Config, `"attention_bias": false`, `"attention_bias": true`, 1),
	}
	for name, cfg := range bad {
		writeCheckpoint(t, dir, name, map[string]string{"config.json": cfg, "tokenizer.json": "{}"})
	}
	for _, c := range []struct{ name, spec, want string }{
		{"exact gelu", "hf: exactgelu\n", `s.yaml:1:1: config.json hidden_activation "gelu" is not supported for family gemma2 (Gemma 2's MLP is GeGLU with GELU's tanh approximation`},
		{"bidirectional", "hf: bidir\n", "s.yaml:1:1: config.json use_bidirectional_attention: bidirectional attention is not supported"},
		{"layer types length", "hf: types\n", "s.yaml:1:1: config.json layer_types has 1 entries for 26 layers (one entry per layer)"},
		{"layer kind", "hf: kind\n", `s.yaml:1:1: config.json layer_types[1] "chunked_attention" is not supported for family gemma2 (use sliding_attention or full_attention)`},
		{"cap not a number", "hf: capword\n", `config.json:5:3: "fifty" is not a number or null (give a number, or null for no capping)`},
		{"negative cap", "hf: capneg\n", "s.yaml:1:1: config.json final_logit_softcapping: -30 is not a cap"},
		{"zero scalar", "hf: scalar\n", "s.yaml:1:1: config.json query_pre_attn_scalar: must be positive, got 0"},
		{"zero window", "hf: window\n", "s.yaml:1:1: config.json sliding_window: 0 (null (no window) or a positive number of positions)"},
		{"o_proj bias", "hf: bias\n", "s.yaml:1:1: config.json attention_bias: projection biases (o_proj included) are not supported for family gemma2"},
		{"gemma key on llama", strings.Replace(tinyModel, "  vocab: 258\n", "  vocab: 258\n  sliding_window: 64\n", 1),
			"s.yaml:10:19: dims.sliding_window: family llama has no sliding_window (only family gemma2 takes it)"},
		{"yaml cap zero", "hf: gemma-2-2b\ndims: {final_logit_softcapping: 0}\n", "s.yaml:2:33: dims.final_logit_softcapping: must be positive, got 0 (null for no capping)"},
		{"yaml scalar", "hf: gemma-2-2b\ndims: {query_pre_attn_scalar: -1}\n", "s.yaml:2:31: dims.query_pre_attn_scalar: must be positive, got -1"},
		{"yaml window", "hf: gemma-2-2b\ndims: {sliding_window: 0}\n", "s.yaml:2:24: dims.sliding_window: must be a positive integer"},
	} {
		t.Run(c.name, func(t *testing.T) {
			writeCheckpoint(t, dir, "gemma-2-2b", map[string]string{"config.json": gemma2Config, "tokenizer.json": "{}"})
			got := specError(t, func(_ string, data []byte) error {
				_, err := ParseModel(filepath.Join(dir, "s.yaml"), data)
				return err
			}, c.spec)
			if !strings.Contains(got, c.want) {
				t.Errorf("error\n%s\nlacks %q", got, c.want)
			}
		})
	}
}
