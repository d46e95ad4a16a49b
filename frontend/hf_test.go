package frontend

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// writeCheckpoint makes a checkpoint directory dir/name holding files (name -> contents).
func writeCheckpoint(t *testing.T, dir, name string, files map[string]string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Join(dir, name), 0o755); err != nil {
		t.Fatal(err)
	}
	for f, text := range files {
		if err := os.WriteFile(filepath.Join(dir, name, f), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func TestParseModelHF(t *testing.T) {
	dir := t.TempDir()
	writeCheckpoint(t, dir, "qwen3-0.6b", map[string]string{
		"config.json":            qwen3Config,
		"tokenizer.json":         "{}",
		"generation_config.json": `{"bos_token_id": 151643, "eos_token_id": [151645, 151643], "do_sample": true}`,
	})
	ckpt := filepath.Join(dir, "qwen3-0.6b")
	m, err := ParseModel(filepath.Join(dir, "m.yaml"), []byte("hf: qwen3-0.6b\n"))
	if err != nil {
		t.Fatal(err)
	}
	got := []any{m.Name, m.Family, m.QKNorm, m.Hidden, m.Layers, m.HeadDim, m.Vocab, m.TieEmbeddings, m.BOS, m.EOS,
		m.Weights.Path, m.Tokenizer.Kind, m.Tokenizer.Path, m.Weights.Pos.Line, m.Weights.Pos.Col}
	want := []any{"qwen3-0.6b", "qwen3", true, 1024, 28, 128, 151936, true, 151643, []int{151645, 151643},
		ckpt, "hf", filepath.Join(ckpt, "tokenizer.json"), 1, 5}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("hf: alone\n got %v\nwant %v", got, want)
	}

	// Every explicit key overrides what the directory gives.
	writeCheckpoint(t, dir, "other", map[string]string{"config.json": strings.Replace(qwen3Config, `"num_hidden_layers": 28`, `"num_hidden_layers": 3`, 1)})
	m, err = ParseModel(filepath.Join(dir, "m.yaml"), []byte(`model: mine
hf: qwen3-0.6b
config: other/config.json
dims: {hidden: 512, head_dim: 32}
weights: w.safetensors
tokenizer: bytes
bos: 256
eos: [257]
`))
	if err != nil {
		t.Fatal(err)
	}
	got = []any{m.Name, m.Hidden, m.HeadDim, m.Layers, m.Weights.Path, m.Tokenizer.Kind, m.BOS, m.EOS}
	want = []any{"mine", 512, 32, 3, filepath.Join(dir, "w.safetensors"), "bytes", 256, []int{257}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("overrides\n got %v\nwant %v", got, want)
	}

	// Without generation_config.json, config.json's eos stands.
	writeCheckpoint(t, dir, "plain", map[string]string{"config.json": qwen3Config, "tokenizer.json": "{}"})
	if m, err = ParseModel(filepath.Join(dir, "m.yaml"), []byte("hf: plain\n")); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(m.EOS, []int{151645}) {
		t.Errorf("eos %v, want config.json's [151645]", m.EOS)
	}
}

func TestParseModelHFErrors(t *testing.T) {
	dir := t.TempDir()
	writeCheckpoint(t, dir, "good", map[string]string{"config.json": qwen3Config, "tokenizer.json": "{}"})
	writeCheckpoint(t, dir, "notok", map[string]string{"config.json": qwen3Config})
	writeCheckpoint(t, dir, "nocfg", map[string]string{"tokenizer.json": "{}"})
	writeCheckpoint(t, dir, "badgen", map[string]string{"config.json": qwen3Config, "tokenizer.json": "{}",
		"generation_config.json": "{\n  \"eos_token_id\": \"</s>\"\n}"})
	writeCheckpoint(t, dir, "gpt2", map[string]string{"tokenizer.json": "{}",
		"config.json": strings.Replace(qwen3Config, `"model_type": "qwen3"`, `"model_type": "gpt2"`, 1)})
	writeCheckpoint(t, dir, "cls", map[string]string{"tokenizer.json": "{}",
		"config.json": strings.Replace(qwen3Config, `"Qwen3ForCausalLM"`, `"Qwen3ForSequenceClassification"`, 1)})
	writeCheckpoint(t, dir, "badjson", map[string]string{"tokenizer.json": "{}", "config.json": "{\n  \"hidden_size\": \"wide\"\n}"})
	if err := os.WriteFile(filepath.Join(dir, "file"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, spec string
		want       []string
	}{
		{"missing dir", "hf: nowhere\n", []string{"s.yaml:1:5: hf: stat ", "no such file", "relative to the spec's directory"}},
		{"a file", "hf: file\n", []string{"s.yaml:1:5: hf: file is not a directory (give the directory that holds config.json"}},
		{"empty", "hf: ''\n", []string{"s.yaml:1:5: hf: path must not be empty"}},
		{"not a string", "hf: [a]\n", []string{"s.yaml:1:5: hf:"}},
		{"no tokenizer", "model: m\nhf: notok\n", []string{`s.yaml:2:1: model spec: missing key "tokenizer", and `, "notok has no tokenizer.json (give tokenizer:"}},
		{"no config.json", "hf: nocfg\n", []string{"s.yaml:1:5: hf: stat ", "nocfg/config.json: no such file", "holds config.json beside its weights"}},
		{"bad config.json", "hf: badjson\n", []string{"config.json:2:", "s.yaml:1:5: hf: ", "badjson/config.json is not a usable config.json"}},
		{"bad generation_config.json", "hf: badgen\n", []string{"generation_config.json:2:3: eos_token_id is neither an integer nor a list of integers",
			"s.yaml:1:5: hf: ", "generation_config.json is not usable"}},
		{"unsupported model_type", "model: m\nhf: gpt2\n", []string{`s.yaml:2:1: config.json model_type "gpt2" is not a supported family (supported: llama, mistral, qwen2, qwen3`}},
		{"unsupported architecture", "hf: cls\n", []string{"s.yaml:1:1: config.json architecture Qwen3ForSequenceClassification is not supported (supported: LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, MixtralForCausalLM, Gemma2ForCausalLM)"}},
		{"no hf and no keys", "dtype: bf16\n", []string{`missing key "model"`, `missing key "weights"`, `missing key "tokenizer"`, "hf: path/to/checkpoint"}},
		{"family clash", "family: llama\nhf: good\n", []string{"s.yaml:1:9: family llama, but config.json model_type is qwen3"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := specError(t, func(_ string, data []byte) error {
				_, err := ParseModel(filepath.Join(dir, "s.yaml"), data)
				return err
			}, c.spec)
			for _, w := range c.want {
				if !strings.Contains(got, w) {
					t.Errorf("error\n%s\nlacks %q", got, w)
				}
			}
			// A bad hf: is one error, not a cascade of keys it would have supplied.
			if strings.HasPrefix(c.spec, "hf: ") && strings.Contains(got, "missing key") {
				t.Errorf("error\n%s\nreports keys hf: stands for", got)
			}
		})
	}
}

// TestRopeParametersV5: transformers v5 writes rope_theta and the scaling in rope_parameters.
func TestRopeParametersV5(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "config.json")
	if err := os.WriteFile(cfg, []byte(`{"hidden_size": 64, "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0,
  "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	c, err := ReadHFConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if c.RopeTheta == nil || *c.RopeTheta != 500000 || c.RopeScaling == nil || c.RopeScaling.Factor != 8 {
		t.Fatalf("rope from rope_parameters: theta %v scaling %+v", c.RopeTheta, c.RopeScaling)
	}
	if err := os.WriteFile(cfg, []byte(`{"rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if c, err = ReadHFConfig(cfg); err != nil || *c.RopeTheta != 1e6 || c.RopeScaling != nil {
		t.Fatalf("default rope_parameters: %v %+v", err, c)
	}
}
