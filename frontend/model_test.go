package frontend

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

const tinyModel = `model: tiny
family: llama
dims:
  hidden: 256
  intermediate: 768
  layers: 6
  heads: 8
  kv_heads: 2
  vocab: 258
  tie_embeddings: true
weights: tiny/model.safetensors
tokenizer: bytes
bos: 256
eos: [257]
serving:
  decode_buckets: [1, 2, 4, 8]
  max_seq_len: 512
  max_seqs: 8
`

func TestParseModelValid(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "tiny.yaml")
	m, err := ParseModel(path, []byte(tinyModel))
	if err != nil {
		t.Fatal(err)
	}
	want := &Model{
		Pos: Pos{File: path, Line: 1, Col: 1}, Path: path, Dir: dir,
		Name: "tiny", Family: "llama", Hidden: 256, Intermediate: 768, Layers: 6, Heads: 8, KVHeads: 2,
		HeadDim: 32, Vocab: 258, RopeTheta: 10000, RMSEps: 1e-5, TieEmbeddings: true,
		Dtype: "bf16", KVDtype: "f32",
		Weights:   Weights{Pos: Pos{File: path, Line: 11, Col: 10}, Path: filepath.Join(dir, "tiny/model.safetensors")},
		Tokenizer: Tokenizer{Pos: Pos{File: path, Line: 12, Col: 12}, Kind: "bytes"},
		BOS:       256, BOSGiven: true,
		EOS:           []int{257},
		DecodeBuckets: []int{1, 2, 4, 8}, PrefillChunks: []int{64}, MaxBatchedTokens: 64,
		MaxSeqLen: 512, MaxSeqs: 8, KVBlockSize: 16, KVCacheTokens: 4096, VectorSlots: 8, MaxLogprobs: 20,
		LayersPos:  Pos{File: path, Line: 6, Col: 11},
		HeadDimPos: Pos{File: path, Line: 7, Col: 10}, // heads: head_dim is hidden/heads
	}
	if !reflect.DeepEqual(m, want) {
		t.Errorf("got  %+v\nwant %+v", m, want)
	}
}

// TestParseModelBOS: a spec without bos: has no BOS of its own (the bytes tokenizer then
// starts prompts with none); config.json's bos_token_id names one without making it given;
// chat_template: resolves against the spec's directory.
func TestParseModelBOS(t *testing.T) {
	dir := t.TempDir()
	spec := strings.Replace(tinyModel, "bos: 256\n", "chat_template: tiny/chat.jinja\n", 1)
	m, err := ParseModel(filepath.Join(dir, "s.yaml"), []byte(spec))
	if err != nil {
		t.Fatal(err)
	}
	if m.BOS != -1 || m.BOSGiven || m.ChatTemplate != filepath.Join(dir, "tiny/chat.jinja") {
		t.Errorf("bos %d given %v chat template %q", m.BOS, m.BOSGiven, m.ChatTemplate)
	}
}

func TestParseModelOptions(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "m.yaml")
	m, err := ParseModel(path, []byte(`model: x
family: llama
dims: {hidden: 64, intermediate: 128, layers: 2, heads: 4, head_dim: 32, vocab: 300,
       rope_theta: 500000, rms_eps: 1.0e-6,
       rope_scaling: {type: llama3, factor: 32, low_freq_factor: 1, high_freq_factor: 4,
                      original_max_position_embeddings: 8192}}
weights: {synthetic: {seed: 7}}
dtype: f32
kv_dtype: bf16
tokenizer: {hf: tok/tokenizer.json}
eos: 2
serving: {decode_buckets: [1, 16], prefill_chunks: [32, 128], kv_block_size: 32}
`))
	if err != nil {
		t.Fatal(err)
	}
	checks := []struct {
		name      string
		got, want any
	}{
		{"KVHeads", m.KVHeads, 4},
		{"HeadDim", m.HeadDim, 32},
		{"RopeTheta", m.RopeTheta, 500000.0},
		{"RMSEps", m.RMSEps, 1e-6},
		{"RopeScaling", *m.RopeScaling, RopeScaling{Type: "llama3", Factor: 32, LowFreqFactor: 1, HighFreqFactor: 4, OriginalMaxPos: 8192}},
		{"Weights", [3]any{m.Weights.Synthetic, m.Weights.Seed, m.Weights.Std}, [3]any{true, uint64(7), 0.02}},
		{"Dtype", m.Dtype, "f32"},
		{"KVDtype", m.KVDtype, "bf16"},
		{"Tokenizer", [2]string{m.Tokenizer.Kind, m.Tokenizer.Path}, [2]string{"hf", filepath.Join(dir, "tok/tokenizer.json")}},
		{"BOS", m.BOS, -1},
		{"EOS", m.EOS, []int{2}},
		{"DecodeBuckets", m.DecodeBuckets, []int{1, 16}},
		{"PrefillChunks", m.PrefillChunks, []int{32, 128}},
		{"MaxBatchedTokens", m.MaxBatchedTokens, 128}, // the largest chunk by default
		{"MaxSeqLen", m.MaxSeqLen, 2048},
		{"MaxSeqs", m.MaxSeqs, 16},
		{"KVBlockSize", m.KVBlockSize, 32},
		{"KVCacheTokens", m.KVCacheTokens, 16 * 2048}, // every resident sequence at max_seq_len by default
	}
	for _, c := range checks {
		if !reflect.DeepEqual(c.got, c.want) {
			t.Errorf("%s = %v, want %v", c.name, c.got, c.want)
		}
	}
}

const hfConfigJSONText = `{
  "architectures": ["LlamaForCausalLM"],
  "hidden_size": 2048,
  "intermediate_size": 8192,
  "num_hidden_layers": 16,
  "num_attention_heads": 32,
  "num_key_value_heads": 8,
  "head_dim": 64,
  "vocab_size": 128256,
  "rope_theta": 500000.0,
  "rms_norm_eps": 1e-05,
  "tie_word_embeddings": true,
  "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "bos_token_id": 128000,
  "eos_token_id": [128001, 128008, 128009]
}`

func TestParseModelConfigImport(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "hf"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "hf", "config.json"), []byte(hfConfigJSONText), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, cfgPath := range []string{"hf/config.json", "hf"} {
		t.Run(cfgPath, func(t *testing.T) {
			m, err := ParseModel(filepath.Join(dir, "llama.yaml"), []byte(`model: llama-3.2-1b
family: llama
config: `+cfgPath+`
dims: {layers: 4}
weights: hf
tokenizer: {hf: hf/tokenizer.json}
`))
			if err != nil {
				t.Fatal(err)
			}
			got := []any{m.Hidden, m.Intermediate, m.Layers, m.Heads, m.KVHeads, m.HeadDim, m.Vocab,
				m.RopeTheta, m.RMSEps, m.TieEmbeddings, m.RopeScaling.Factor, m.BOS, m.EOS}
			want := []any{2048, 8192, 4, 32, 8, 64, 128256, 500000.0, 1e-5, true, 32.0, 128000, []int{128001, 128008, 128009}}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("got %v, want %v", got, want)
			}
			if m.LayersPos.Line != 4 {
				t.Errorf("LayersPos = %v, want the dims override on line 4", m.LayersPos)
			}
		})
	}
}

func TestReadHFConfigErrors(t *testing.T) {
	dir := t.TempDir()
	cases := []struct {
		name, text, want string
	}{
		{"syntax", "{\n  \"hidden_size\": 4,\n  oops\n}", "config.json:3:"},
		{"type", "{\n  \"hidden_size\": \"big\"\n}", "config.json:2:"},
		{"rope", "{\n  \"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4}\n}", `config.json:2:3: rope_scaling type "yarn" is not supported`},
		{"eos", "{\n  \"eos_token_id\": \"x\"\n}", "config.json:2:3: eos_token_id is neither"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(dir, c.name, "config.json")
			if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, []byte(c.text), 0o644); err != nil {
				t.Fatal(err)
			}
			_, err := ReadHFConfig(path)
			var e *Error
			if !errors.As(err, &e) {
				t.Fatalf("got %v, want an *Error", err)
			}
			if !strings.Contains(e.Error(), c.want) {
				t.Errorf("got %q, want it to contain %q", e.Error(), c.want)
			}
		})
	}
	if _, err := ReadHFConfig("/dev/null"); err == nil || !strings.Contains(err.Error(), "not a regular file") {
		t.Errorf("reading /dev/null: got %v, want a refusal", err)
	}
}

// specError parses text as file "s.yaml" and returns the error text.
func specError(t *testing.T, parse func(path string, data []byte) error, text string) string {
	t.Helper()
	err := parse("s.yaml", []byte(text))
	if err == nil {
		t.Fatalf("parsed without error:\n%s", text)
	}
	var list ErrorList
	if !errors.As(err, &list) {
		t.Fatalf("got %T %v, want an ErrorList", err, err)
	}
	return err.Error()
}

func TestParseModelErrors(t *testing.T) {
	parse := func(path string, data []byte) error { _, err := ParseModel(path, data); return err }
	// A valid spec with one line replaced, so that positions are easy to read off.
	with := func(old, new string) string {
		if !strings.Contains(tinyModel, old) {
			t.Fatalf("tinyModel lacks %q", old)
		}
		return strings.Replace(tinyModel, old, new, 1)
	}
	cases := []struct {
		name, text string
		want       []string // substrings of the error text
	}{
		{"malformed", with("  heads: 8\n", "  heads: [8\n"), []string{"s.yaml:7:1: malformed YAML: did not find expected ',' or ']'"}},
		{"malformed key", "model: x\ndims:\n  a: 1\n b: 2\n", []string{"s.yaml:4:1: malformed YAML: did not find expected key"}},
		{"bad indent", "model: x\n  family: llama\n", []string{"s.yaml:2:1: malformed YAML"}},
		{"empty", "", []string{"s.yaml:1:1: empty spec"}},
		{"not a mapping", "- a\n- b\n", []string{"s.yaml:1:1: expected a mapping, got a list"}},
		{"two documents", tinyModel + "---\nmodel: y\n", []string{"a second YAML document"}},
		{"unknown key", with("  hidden: 256", "  hiden: 256"),
			[]string{`s.yaml:4:3: dims: unknown key "hiden" (did you mean "hidden"?`, `s.yaml:3:1: dims: missing key "hidden"`}},
		{"unknown top key", with("tokenizer:", "tokeniser:"), []string{`s.yaml:12:1: model spec: unknown key "tokeniser" (did you mean "tokenizer"?`}},
		{"duplicate key", with("  layers: 6\n", "  layers: 6\n  layers: 7\n"), []string{`s.yaml:7:3: dims: duplicate key "layers" (first given at line 6)`}},
		{"wrong type", with("  layers: 6", "  layers: [6]"), []string{"s.yaml:6:11: dims.layers: expected an integer, got a list"}},
		{"string for int", with("  layers: 6", "  layers: six"), []string{`s.yaml:6:11: dims.layers: expected an integer, got "six"`}},
		{"float for int", with("  layers: 6", "  layers: 6.5"), []string{"expected an integer, got the number 6.5"}},
		{"negative", with("  layers: 6", "  layers: -1"), []string{"s.yaml:6:11: dims.layers: must be a positive integer, got -1"}},
		{"huge", with("  layers: 6", "  layers: 99999999999999999999"), []string{"s.yaml:6:11: dims.layers:"}},
		{"missing name", with("model: tiny\n", ""), []string{`s.yaml:1:1: model spec: missing key "model"`}},
		{"missing dims", "model: a\nfamily: llama\nweights: w\ntokenizer: bytes\nbos: 1\n", []string{`missing key "dims" (give dims:`}},
		{"family", with("family: llama", "family: lama"), []string{`s.yaml:2:9: family: unknown value "lama" (did you mean "llama"? choose from: llama, mistral, qwen2, qwen3, mixtral, gemma2)`}},
		{"no family", with("family: llama\n", ""), []string{`s.yaml:1:1: model spec: missing key "family"`}},
		{"kv heads", with("kv_heads: 2", "kv_heads: 3"), []string{"s.yaml:8:13: dims.kv_heads 3 does not divide dims.heads 8"}},
		{"head dim default", with("hidden: 256", "hidden: 250"), []string{"s.yaml:7:10: dims.heads 8 does not divide dims.hidden 250", "set dims.head_dim"}},
		{"dtype", with("tokenizer: bytes\n", "tokenizer: bytes\ndtype: fp8\n"), []string{`s.yaml:13:8: dtype: unknown value "fp8"`}},
		{"tokenizer", with("tokenizer: bytes", "tokenizer: byte"), []string{`s.yaml:12:12: tokenizer: unknown tokenizer "byte"`}},
		{"small vocab", with("vocab: 258", "vocab: 200"), []string{"s.yaml:12:12: tokenizer: vocab 200 is smaller than 256", "s.yaml:13:6: bos 256 is not a token id"}},
		{"bos range", with("bos: 256", "bos: 258"), []string{"s.yaml:13:6: bos 258 is not a token id of the model (vocab is 258)"}},
		{"eos type", with("eos: [257]", "eos: {a: 1}"), []string{"s.yaml:14:6: eos: expected a list, got a mapping"}},
		{"chat template empty", with("eos: [257]\n", "eos: [257]\nchat_template: ''\n"), []string{"s.yaml:15:16: chat_template: path must not be empty"}},
		{"chat template type", with("eos: [257]\n", "eos: [257]\nchat_template: [a]\n"), []string{"s.yaml:15:16: chat_template:"}},
		{"buckets order", with("[1, 2, 4, 8]", "[1, 4, 2]"), []string{"s.yaml:16:19: serving.decode_buckets: 2 after 4 is not ascending"}},
		{"max seqs", with("max_seqs: 8", "max_seqs: 4"), []string{"s.yaml:18:13: serving.max_seqs 4 is smaller than the largest decode bucket 8"}},
		{"kv block", with("max_seq_len: 512", "max_seq_len: 500"), []string{"serving.kv_block_size 16 does not divide max_seq_len 500"}},
		{"vector slots", with("max_seqs: 8", "max_seqs: 8\n  vector_slots: 9"), []string{"s.yaml:19:17: serving.vector_slots 9 is more than max_seqs 8 (at most max_seqs (8)"}},
		{"vector slots zero", with("max_seqs: 8", "max_seqs: 8\n  vector_slots: 0"), []string{"serving.vector_slots: must be a positive integer"}},
		{"kv cache above the sequences", with("max_seqs: 8", "max_seqs: 8\n  kv_cache_tokens: 4112"),
			[]string{"s.yaml:19:20: serving.kv_cache_tokens 4112 is more than every resident sequence can hold (at most max_seqs x max_seq_len = 4096"}},
		{"kv cache below a sequence", with("max_seqs: 8", "max_seqs: 8\n  kv_cache_tokens: 496"),
			[]string{"serving.kv_cache_tokens 496 is less than max_seq_len (at least max_seq_len (512)"}},
		{"kv cache partial page", with("max_seqs: 8", "max_seqs: 8\n  kv_cache_tokens: 1000"),
			[]string{"serving.kv_cache_tokens 1000 is not a whole number of 16-token pages (a multiple of kv_block_size: 1008"}},
		{"kv cache zero", with("max_seqs: 8", "max_seqs: 8\n  kv_cache_tokens: 0"),
			[]string{"serving.kv_cache_tokens: must be a positive integer"}},
		{"max logprobs", with("max_seqs: 8", "max_seqs: 8\n  max_logprobs: 65"), []string{"s.yaml:19:17: serving.max_logprobs 65 is more than 64 (at most 64"}},
		{"budget above chunks", with("max_seqs: 8", "max_seqs: 8\n  prefill_chunks: [16, 64]\n  max_batched_tokens: 128"),
			[]string{"s.yaml:20:23: serving.max_batched_tokens 128 is more than the largest prefill chunk 64", "add a chunk of 128 to prefill_chunks"}},
		{"budget below max_seqs", with("max_seqs: 8", "max_seqs: 8\n  max_batched_tokens: 4"),
			[]string{"s.yaml:19:23: serving.max_batched_tokens 4 is below max_seqs 8", "raise it to at least 8"}},
		{"budget not positive", with("max_seqs: 8", "max_seqs: 8\n  max_batched_tokens: 0"),
			[]string{"s.yaml:19:23: serving.max_batched_tokens: must be a positive integer, got 0"}},
		{"synthetic key", with("weights: tiny/model.safetensors", "weights: {synthetic: {sed: 1}}"),
			[]string{`s.yaml:11:23: weights.synthetic: unknown key "sed" (did you mean "seed"?`}},
		{"rope scaling", with("  tie_embeddings: true", "  rope_scaling: {type: llama3, factor: 8, low_freq_factor: 4, high_freq_factor: 1, original_max_position_embeddings: 8192}"),
			[]string{"high_freq_factor 1 must be larger than low_freq_factor 4"}},
		{"missing config", "model: a\nfamily: llama\nconfig: nowhere/config.json\nweights: w\ntokenizer: {hf: t}\n",
			[]string{"s.yaml:3:9: config:", "no such file"}},
		{"merge key", with("dims:\n", "dims:\n  <<: {hidden: 1}\n"), []string{"merge keys (<<) are not supported"}},
		{"several", strings.Replace(with("  layers: 6", "  layers: x"), "family: llama", "family: gpt", 1),
			[]string{"s.yaml:2:9: family", "s.yaml:6:11: dims.layers"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := specError(t, parse, c.text)
			for _, w := range c.want {
				if !strings.Contains(got, w) {
					t.Errorf("error\n%s\nlacks %q", got, w)
				}
			}
		})
	}
}

// qwen3Config is Qwen3-0.6B's config.json (head_dim 128 is not hidden/heads there).
const qwen3Config = `{
  "architectures": ["Qwen3ForCausalLM"],
  "attention_bias": false,
  "bos_token_id": 151643,
  "eos_token_id": 151645,
  "head_dim": 128,
  "hidden_size": 1024,
  "intermediate_size": 3072,
  "max_window_layers": 28,
  "model_type": "qwen3",
  "num_attention_heads": 16,
  "num_hidden_layers": 28,
  "num_key_value_heads": 8,
  "rms_norm_eps": 1e-06,
  "rope_scaling": null,
  "rope_theta": 1000000,
  "sliding_window": null,
  "tie_word_embeddings": true,
  "use_sliding_window": false,
  "vocab_size": 151936
}`

func TestParseModelFamilies(t *testing.T) {
	dir := t.TempDir()
	// config writes a config.json with the edits applied and returns a spec importing it.
	config := func(name, family string, edits ...string) string {
		text := qwen3Config
		for i := 0; i+1 < len(edits); i += 2 {
			if !strings.Contains(text, edits[i]) {
				t.Fatalf("qwen3Config lacks %q", edits[i])
			}
			text = strings.Replace(text, edits[i], edits[i+1], 1)
		}
		if err := os.WriteFile(filepath.Join(dir, name+".json"), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		return "model: m\n" + family + "config: " + name + ".json\nweights: w\ntokenizer: {hf: t}\n"
	}
	for _, c := range []struct {
		name, spec     string
		family         string
		bias, norm     bool
		headDim        int
		eps, ropeTheta float64
	}{
		{"qwen3", config("qwen3", ""), "qwen3", false, true, 128, 1e-6, 1e6},
		{"qwen3 named", config("qwen3n", "family: qwen3\n"), "qwen3", false, true, 128, 1e-6, 1e6},
		{"qwen2", config("qwen2", "", `"model_type": "qwen3"`, `"model_type": "qwen2"`), "qwen2", true, false, 128, 1e-6, 1e6},
		// Qwen2 ignores attention_bias: its q/k/v biases are always there.
		{"qwen2 bias key", config("qwen2b", "", `"model_type": "qwen3"`, `"model_type": "qwen2"`, `"attention_bias": false`, `"attention_bias": true`),
			"qwen2", true, false, 128, 1e-6, 1e6},
		// Mistral-7B-v0.1's window of 4096 covers the default max_seq_len of 2048.
		{"mistral", config("mistral", "", `"model_type": "qwen3"`, `"model_type": "mistral"`, `"sliding_window": null`, `"sliding_window": 4096`),
			"mistral", false, false, 128, 1e-6, 1e6},
		{"no model_type", config("plain", "family: llama\n", `"model_type": "qwen3",`, ""), "llama", false, false, 128, 1e-6, 1e6},
	} {
		t.Run(c.name, func(t *testing.T) {
			m, err := ParseModel(filepath.Join(dir, "m.yaml"), []byte(c.spec))
			if err != nil {
				t.Fatal(err)
			}
			got := []any{m.Family, m.QKVBias, m.QKNorm, m.HeadDim, m.Hidden, m.Heads, m.KVHeads, m.RMSEps, m.RopeTheta, m.BOS, m.EOS}
			want := []any{c.family, c.bias, c.norm, c.headDim, 1024, 16, 8, c.eps, c.ropeTheta, 151643, []int{151645}}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("got %v, want %v", got, want)
			}
		})
	}
	parse := func(path string, data []byte) error { _, err := ParseModel(path, data); return err }
	for _, c := range []struct {
		name, spec string
		want       []string
	}{
		{"mismatch", config("mis", "family: llama\n"), []string{"s.yaml:2:9: family llama, but config.json model_type is qwen3"}},
		{"unknown type", config("gpt2", "", `"model_type": "qwen3"`, `"model_type": "gpt2"`),
			[]string{`s.yaml:2:1: config.json model_type "gpt2" is not a supported family (supported: llama, mistral, qwen2, qwen3, mixtral, gemma2)`}},
		{"no family anywhere", config("none", "", `"model_type": "qwen3",`, ""),
			[]string{`model spec: missing key "family" (config.json has no model_type either)`}},
		{"o_proj bias", config("obias", "", `"attention_bias": false`, `"attention_bias": true`),
			[]string{"config.json attention_bias: projection biases (o_proj included) are not supported for family qwen3"}},
		{"window", config("win", "", `"model_type": "qwen3"`, `"model_type": "mistral"`, `"sliding_window": null`, `"sliding_window": 1024`),
			[]string{"config.json sliding_window 1024 is shorter than serving.max_seq_len 2048", "set serving.max_seq_len to at most 1024"}},
		{"qwen window", config("qwin", "", `"sliding_window": null`, `"sliding_window": 512`, `"use_sliding_window": false`, `"use_sliding_window": true`),
			[]string{"config.json sliding_window 512 is shorter than serving.max_seq_len 2048"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := specError(t, func(_ string, data []byte) error { return parse(filepath.Join(dir, "s.yaml"), data) }, c.spec)
			for _, w := range c.want {
				if !strings.Contains(got, w) {
					t.Errorf("error\n%s\nlacks %q", got, w)
				}
			}
		})
	}
}
