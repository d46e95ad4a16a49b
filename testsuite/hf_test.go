package testsuite

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"xmix/bundle"
	"xmix/checkpoint"
	"xmix/compile"
	"xmix/loader"
	"xmix/loader/cpu"
	"xmix/ops"
	"xmix/safetensors"
)

// hfArchitectures is the config.json "architectures" entry of each family.
var hfArchitectures = map[string]string{
	"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
	"gemma2": "Gemma2ForCausalLM",
}

// hfOptions break a written checkpoint on purpose.
type hfOptions struct {
	drop   string         // a tensor left out of the shards and the index
	config map[string]any // config.json keys overridden
}

// writeHFCheckpoint writes a random checkpoint of b's model into dir in Hugging Face layout:
// config.json, generation_config.json, two shards and model.safetensors.index.json. Tensor
// dtypes cycle through BF16, F32 and F16, with values exact in all three, so that each
// loads to the same bits. It returns every weight buffer's bytes as the bundle stores them.
func writeHFCheckpoint(t *testing.T, b *bundle.Bundle, dir string, opt hfOptions) map[string][]byte {
	t.Helper()
	mc := b.Manifest.Model
	if mc.WeightDtype != "bf16" {
		t.Fatalf("weight dtype %s: the helper writes bf16 buffers", mc.WeightDtype)
	}
	r := rand.New(rand.NewPCG(11, 12))
	bufs := map[string][]byte{}
	var tensors []safetensors.Tensor
	for _, buf := range b.Manifest.Buffers {
		if buf.Kind != bundle.KindWeight {
			continue
		}
		rows := tensorRows(t, buf, mc)
		width := 1
		for _, d := range buf.Shape[1:] {
			width *= d
		}
		vals := make([]float32, buf.Shape[0]*width)
		for i := range vals {
			switch {
			case len(buf.Shape) > 1:
				vals[i] = float32(0.08 * r.NormFloat64())
			case strings.HasSuffix(buf.Name, "norm"): // norm weights sit around 1
				vals[i] = float32(1 + 0.3*(2*r.Float64()-1))
			default: // biases
				vals[i] = float32(0.3 * (2*r.Float64() - 1))
			}
			vals[i] = exactInAll(vals[i])
		}
		raw := make([]byte, 2*len(vals))
		for i, v := range vals {
			binary.LittleEndian.PutUint16(raw[2*i:], ops.F32ToBF16(v))
		}
		bufs[buf.Name] = raw
		off := 0
		for j, name := range buf.Tensors {
			shape := append([]int{rows[j]}, buf.Shape[1:]...)
			part := vals[off*width : (off+rows[j])*width]
			off += rows[j]
			if name != opt.drop {
				tensors = append(tensors, encodeTensor(name, shape, part, []string{"BF16", "F32", "F16"}[len(tensors)%3]))
			}
		}
	}
	// Shards split the sorted names in two, as transformers' save_pretrained fills them.
	slices.SortFunc(tensors, func(a, b safetensors.Tensor) int { return strings.Compare(a.Name, b.Name) })
	weightMap := map[string]string{}
	half := len(tensors) / 2
	for i, part := range [][]safetensors.Tensor{tensors[:half], tensors[half:]} {
		shard := fmt.Sprintf("model-%05d-of-00002.safetensors", i+1)
		if err := safetensors.WriteFile(filepath.Join(dir, shard), part, map[string]string{"format": "pt"}); err != nil {
			t.Fatal(err)
		}
		for _, ts := range part {
			weightMap[ts.Name] = shard
		}
	}
	cfg := map[string]any{
		"architectures":       []string{hfArchitectures[mc.Family]},
		"model_type":          mc.Family,
		"hidden_size":         mc.Hidden,
		"intermediate_size":   mc.Intermediate,
		"num_hidden_layers":   mc.Layers,
		"num_attention_heads": mc.Heads,
		"num_key_value_heads": mc.KVHeads,
		"head_dim":            mc.HeadDim,
		"vocab_size":          mc.Vocab,
		"rope_theta":          mc.RopeTheta,
		"rms_norm_eps":        mc.RMSEps,
		"tie_word_embeddings": mc.TieEmbeddings,
		"bos_token_id":        mc.BOS,
		// generation_config.json's eos wins over this one.
		"eos_token_id":       mc.Vocab - 1,
		"torch_dtype":        "bfloat16",
		"attention_bias":     false,
		"use_sliding_window": false,
	}
	if mc.Family == "gemma2" { // Gemma2Config's own keys, as save_pretrained writes them
		types := make([]string, mc.Layers)
		for l, s := range mc.SlidingLayers {
			types[l] = map[bool]string{true: "sliding_attention", false: "full_attention"}[s]
		}
		cfg["query_pre_attn_scalar"], cfg["attn_logit_softcapping"], cfg["final_logit_softcapping"] = mc.QueryPreAttnScalar, mc.AttnSoftcap, mc.FinalSoftcap
		cfg["sliding_window"], cfg["layer_types"], cfg["hidden_activation"] = mc.SlidingWindow, types, "gelu_pytorch_tanh"
		cfg["hidden_act"], cfg["cache_implementation"], cfg["use_bidirectional_attention"] = "gelu_pytorch_tanh", "hybrid", nil
		delete(cfg, "use_sliding_window")
	}
	if rs := mc.RopeScaling; rs != nil {
		cfg["rope_scaling"] = map[string]any{"rope_type": rs.Type, "factor": rs.Factor, "low_freq_factor": rs.LowFreqFactor,
			"high_freq_factor": rs.HighFreqFactor, "original_max_position_embeddings": rs.OriginalMaxPos}
	}
	for k, v := range opt.config {
		cfg[k] = v
	}
	writeJSON(t, filepath.Join(dir, "config.json"), cfg)
	writeJSON(t, filepath.Join(dir, "generation_config.json"), map[string]any{"bos_token_id": mc.BOS, "eos_token_id": mc.EOS})
	writeJSON(t, filepath.Join(dir, checkpoint.IndexFile), map[string]any{"metadata": map[string]any{"total_size": 0}, "weight_map": weightMap})
	return bufs
}

// tensorRows is StackedRows, failing t on a buffer it cannot split.
func tensorRows(t *testing.T, buf bundle.Buffer, mc bundle.ModelConfig) []int {
	rows, err := StackedRows(buf, mc)
	if err != nil {
		t.Fatal(err)
	}
	return rows
}

// exactInAll rounds v to bf16, then to zero where F16 could not hold it exactly (below its
// normal range), so that BF16, F16 and F32 copies all widen to the same float32.
func exactInAll(v float32) float32 {
	v = ops.BF16ToF32(ops.F32ToBF16(v))
	if a := math.Abs(float64(v)); a < 1.0/(1<<14) || a > 65504 {
		return 0
	}
	return v
}

func encodeTensor(name string, shape []int, vals []float32, dtype string) safetensors.Tensor {
	var data []byte
	for _, v := range vals {
		switch dtype {
		case "F32":
			data = binary.LittleEndian.AppendUint32(data, math.Float32bits(v))
		case "BF16":
			data = binary.LittleEndian.AppendUint16(data, ops.F32ToBF16(v))
		case "F16":
			data = binary.LittleEndian.AppendUint16(data, exactF16(v))
		}
	}
	return safetensors.Tensor{Name: name, Dtype: dtype, Shape: shape, Data: data}
}

// exactF16 encodes a float32 that half precision holds exactly (zero, or normal with at most
// 10 mantissa bits, as every exactInAll value is).
func exactF16(v float32) uint16 {
	b := math.Float32bits(v)
	sign := uint16(b>>16) & 0x8000
	if b&0x7fffffff == 0 {
		return sign
	}
	exp := int(b>>23&0xff) - 127 + 15
	return sign | uint16(exp)<<10 | uint16(b>>13&0x3ff)
}

func writeJSON(t *testing.T, path string, v any) {
	t.Helper()
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
}

// hfSpec is a model spec for the checkpoint in dir with spec's serving settings: the bytes
// tokenizer (the checkpoint has no tokenizer.json) and nothing else beside hf:.
func hfSpec(t *testing.T, spec, dir string) string {
	for _, line := range strings.Split(spec, "\n") {
		if strings.HasPrefix(line, "serving:") {
			return fmt.Sprintf("hf: %s\ntokenizer: bytes\n%s\n", dir, line)
		}
	}
	t.Fatal("spec has no one-line serving:")
	return ""
}

// TestHFCheckpointMatchesBitForBit: a sharded checkpoint of mixed dtypes given as `hf: dir`
// compiles to the model of the synthetic spec and its CPU logits, step by step, are the bits
// of the synthetic bundle's with the same weights written into its buffers.
func TestHFCheckpointMatchesBitForBit(t *testing.T) {
	for _, c := range []struct{ name, spec string }{{"llama", SmallModel}, {"qwen3", SmallQwen3}, {"gemma2", SmallGemma2}} {
		t.Run(c.name, func(t *testing.T) {
			syn := Compile(t, c.spec)
			dir := t.TempDir()
			bufs := writeHFCheckpoint(t, syn, dir, hfOptions{})
			hf := Compile(t, hfSpec(t, c.spec, dir))

			want, got := syn.Manifest.Model, hf.Manifest.Model
			want.Name = got.Name
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("hf: model config\n%+v\nsynthetic\n%+v", got, want)
			}
			if hf.Manifest.Weights.Path != dir || hf.Manifest.Weights.SHA256 == "" {
				t.Fatalf("weights reference %+v, want the checkpoint directory and its digest", hf.Manifest.Weights)
			}

			synBE := NewCPU(t, syn).(*cpu.Backend)
			for name, data := range bufs {
				copy(synBE.Buffer(name), data)
			}
			reqs := []loader.Request{{Prompt: []int{72, 101, 108, 108, 111}, MaxTokens: 5}, {Prompt: []int{3, 1, 4}, MaxTokens: 5}}
			wantTok, wantLogits := recordRun(t, syn, synBE, reqs)
			gotTok, gotLogits := recordRun(t, hf, NewCPU(t, hf), reqs)
			if !reflect.DeepEqual(gotTok, wantTok) {
				t.Fatalf("tokens %v, synthetic bundle %v", gotTok, wantTok)
			}
			if len(gotLogits) != len(wantLogits) || len(gotLogits) < 5 {
				t.Fatalf("%d steps recorded, synthetic bundle %d", len(gotLogits), len(wantLogits))
			}
			for s := range wantLogits {
				for i, w := range wantLogits[s] {
					if g := gotLogits[s][i]; math.Float32bits(g) != math.Float32bits(w) {
						t.Fatalf("step %d logit %d: %v, synthetic bundle %v", s, i, g, w)
					}
				}
			}
		})
	}
}

func recordRun(t *testing.T, b *bundle.Bundle, be loader.Backend, reqs []loader.Request) ([][]int, [][]float32) {
	t.Helper()
	rec := &LogitRecorder{Backend: be, Vocab: b.Manifest.Model.Vocab}
	res := Generate(t, func(testing.TB, *bundle.Bundle) loader.Backend { return rec }, b, reqs)
	var toks [][]int
	for _, r := range res {
		toks = append(toks, r.Tokens)
	}
	return toks, rec.Steps
}

// TestHFCheckpointErrors: a checkpoint that does not fit its config.json fails to build or to
// load with an error naming the tensor, the shard or the key at fault.
func TestHFCheckpointErrors(t *testing.T) {
	syn := Compile(t, SmallModel)
	for _, c := range []struct {
		name string
		opt  hfOptions
		edit func(t *testing.T, dir string)
		want []string
	}{
		{"untied without lm_head", hfOptions{drop: "lm_head.weight"}, nil,
			[]string{"weight tensor lm_head.weight (for buffer lm_head) is missing from", checkpoint.IndexFile, "embeddings are not tied"}},
		{"missing layer tensor", hfOptions{drop: "model.layers.2.mlp.down_proj.weight"}, nil,
			[]string{"weight tensor model.layers.2.mlp.down_proj.weight (for buffer L2.wdown) is missing"}},
		{"kv heads disagree", hfOptions{config: map[string]any{"num_key_value_heads": 4}}, nil,
			[]string{"buffer L0.wqkv of shape [384 128] stacks model.layers.0.self_attn.q_proj.weight [128 128], model.layers.0.self_attn.k_proj.weight [64 128], model.layers.0.self_attn.v_proj.weight [64 128]: 256 rows, expected 384"}},
		{"intermediate disagrees", hfOptions{config: map[string]any{"intermediate_size": 256}}, nil,
			[]string{"weight tensor model.layers.0.mlp.down_proj.weight has shape [128 192], expected [128 256] (buffer L0.wdown)"}},
		{"shard missing", hfOptions{}, func(t *testing.T, dir string) {
			if err := os.Remove(filepath.Join(dir, "model-00002-of-00002.safetensors")); err != nil {
				t.Fatal(err)
			}
		}, []string{checkpoint.IndexFile + " names shard model-00002-of-00002.safetensors (for tensor ", "does not exist"}},
		{"truncated shard", hfOptions{}, func(t *testing.T, dir string) {
			p := filepath.Join(dir, "model-00001-of-00002.safetensors")
			st, err := os.Stat(p)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.Truncate(p, st.Size()/2); err != nil {
				t.Fatal(err)
			}
		}, []string{"model-00001-of-00002.safetensors: tensor ", "the file is truncated or its header lies"}},
		{"unsupported architecture", hfOptions{config: map[string]any{"architectures": []string{"LlamaForTokenClassification"}}}, nil,
			[]string{"config.json architecture LlamaForTokenClassification is not supported (supported: LlamaForCausalLM"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			writeHFCheckpoint(t, syn, dir, c.opt)
			if c.edit != nil {
				c.edit(t, dir)
			}
			spec := filepath.Join(t.TempDir(), "m.yaml")
			if err := os.WriteFile(spec, []byte(hfSpec(t, SmallModel, dir)), 0o644); err != nil {
				t.Fatal(err)
			}
			// Every problem fails the build: the driver checks the checkpoint's headers
			// against every weight buffer.
			_, err := compile.Build(spec, nil, compile.Options{})
			if err == nil {
				t.Fatal("built from a broken checkpoint")
			}
			for _, want := range c.want {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q lacks %q", err, want)
				}
			}
		})
	}
}
