package testsuite

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"xmix/chat"
	"xmix/compile"
	"xmix/frontend"
	"xmix/loader"
)

// promptIDs is testdata/prompt_ids.json (testdata/gen/prompts.mjs): what Hugging Face's
// tokenizers give for plain prompts, tokenizer(text), and chat prompts,
// apply_chat_template(messages, tokenize=True).
type promptIDs struct {
	Tokenizers map[string]promptCases `json:"tokenizers"`
}

type promptCases struct {
	Plain []struct {
		Text string `json:"text"`
		IDs  []int  `json:"ids"`
	} `json:"plain"`
	Chat []struct {
		Case                string         `json:"case"`
		Messages            []chat.Message `json:"messages"`
		AddGenerationPrompt bool           `json:"add_generation_prompt"`
		IDs                 []int          `json:"ids"`
	} `json:"chat"`
}

// TestPromptsMatchHuggingFace: for every family, a bundle built with a real checkpoint
// tokenizer starts prompts exactly as Hugging Face does: plain prompts as tokenizer(text)
// (Llama 3.1's post-processor adds <|begin_of_text|>, Qwen's tokenizer adds nothing), chat
// prompts as apply_chat_template (the template writes the BOS, which is never doubled). The
// SentencePiece tokenizers of Mistral and Mixtral checkpoints are not supported by xmix's
// tokenizer, so those families are checked with the Llama 3.1 one: the BOS rule is the
// tokenizer's, not the family's.
func TestPromptsMatchHuggingFace(t *testing.T) {
	data, err := os.ReadFile("testdata/prompt_ids.json")
	if err != nil {
		t.Fatal(err)
	}
	var ref promptIDs
	if err := json.Unmarshal(data, &ref); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		family, tokenizer, extra string
		vocab, bos               int
	}{
		{"llama", "llama3_1", "", 128256, 128000},
		{"mistral", "llama3_1", "", 128256, 128000},
		{"mixtral", "llama3_1", ", experts: 2, experts_per_token: 1", 128256, 128000},
		{"qwen2", "qwen3", "", 151936, -1},
		{"qwen3", "qwen3", "", 151936, -1},
	} {
		t.Run(c.family, func(t *testing.T) {
			spec := fmt.Sprintf(`model: m
family: %s
dims: {hidden: 64, intermediate: 32, layers: 1, heads: 2, kv_heads: 1, head_dim: 32, vocab: %d, tie_embeddings: true%s}
weights: {synthetic: {seed: 1, std: 0.02}}
tokenizer: {hf: %s}
eos: [0]
serving: {decode_buckets: [1], prefill_chunks: [16], max_seq_len: 128, max_seqs: 1, kv_block_size: 16}
`, c.family, c.vocab, c.extra, CheckpointTokenizer(t, c.tokenizer))
			mp, _ := WriteSpecs(t, spec)
			b, err := compile.Build(mp, nil, compile.Options{})
			if err != nil {
				t.Fatal(err)
			}
			m := b.Manifest.Model
			if m.BOS != c.bos {
				t.Fatalf("bundle BOS %d, want %d", m.BOS, c.bos)
			}
			tok, err := loader.NewTokenizer(b)
			if err != nil {
				t.Fatal(err)
			}
			cases := ref.Tokenizers[c.tokenizer]
			if len(cases.Plain) == 0 || len(cases.Chat) == 0 {
				t.Fatalf("no reference prompts for %s", c.tokenizer)
			}
			for _, p := range cases.Plain {
				if got := loader.InputIDs(m, loader.Request{Prompt: tok.Encode(p.Text)}); !slices.Equal(got, p.IDs) {
					t.Errorf("plain %q: %v, Hugging Face %v", p.Text, got, p.IDs)
				}
			}
			ch, err := loader.NewChat(m, tok)
			if err != nil {
				t.Fatal(err)
			}
			for _, p := range cases.Chat {
				got, err := ch.Prompt(p.Messages, p.AddGenerationPrompt)
				if err != nil {
					t.Fatalf("%s: %v", p.Case, err)
				}
				if !slices.Equal(got, p.IDs) {
					t.Errorf("chat %s: %v, Hugging Face %v", p.Case, got, p.IDs)
				}
				if m.BOS >= 0 && (got[0] != m.BOS || got[1] == m.BOS) {
					t.Errorf("chat %s starts %v: want one BOS %d", p.Case, got[:2], m.BOS)
				}
			}
		})
	}
}

// TestEmptyPromptWithoutBOS: a model whose prompts start with no BOS refuses an empty
// prompt (nothing to sample from) with a message that says why; with a BOS it is the BOS.
func TestEmptyPromptWithoutBOS(t *testing.T) {
	noBOS := strings.Replace(SmallModel, "bos: 256\n", "", 1)
	for _, c := range []struct {
		spec, err string
	}{{SmallModel, ""}, {noBOS, "empty prompt: model small starts prompts with no BOS"}} {
		b := Compile(t, c.spec)
		be := NewCPU(t, b)
		eng, err := loader.NewEngine(b, be)
		if err != nil {
			t.Fatal(err)
		}
		_, err = eng.Submit(loader.Request{MaxTokens: 2})
		if c.err == "" && err != nil || c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)) {
			t.Errorf("bos %d: %v, want %q", b.Manifest.Model.BOS, err, c.err)
		}
		if _, err := eng.Submit(loader.Request{Prompt: []int{65}, Verbatim: true, MaxTokens: 2}); err != nil {
			t.Errorf("bos %d: verbatim prompt: %v", b.Manifest.Model.BOS, err)
		}
		be.Close()
	}
}

// TestShippedSpecsBOS: the shipped specs start prompts as their checkpoints' tokenizers do:
// Llama 3.x with <|begin_of_text|>, Mixtral with <s> (add_bos_token), Qwen3 with none.
func TestShippedSpecsBOS(t *testing.T) {
	for spec, want := range map[string]int{"llama-3.1-8b": 128000, "llama-3.2-1b": 128000, "mixtral-8x7b": 1, "qwen3-8b": -1, "tiny": 256} {
		m, err := frontend.LoadModel(filepath.Join("..", "specs", "models", spec+".yaml"))
		if err != nil {
			t.Fatal(err)
		}
		if got, err := compile.PromptBOS(m, nil, nil); err != nil || got != want {
			t.Errorf("%s: BOS %d (%v), want %d", spec, got, err, want)
		}
	}
}

// TestTinyChat: the embedded model ships a chat template, so multi-turn chat works out of
// the box: turns become "Role: text" lines after the BOS (the bytes tokenizer has no text for
// it, so the template cannot write it), and the prompt generates. A bundle without a
// template says how to give it one.
func TestTinyChat(t *testing.T) {
	b, err := compile.Build("../specs/models/tiny.yaml", nil, compile.Options{})
	if err != nil {
		t.Fatal(err)
	}
	tok, err := loader.NewTokenizer(b)
	if err != nil {
		t.Fatal(err)
	}
	ch, err := loader.NewChat(b.Manifest.Model, tok)
	if err != nil {
		t.Fatal(err)
	}
	msgs := []chat.Message{{Role: "system", Content: "Tell stories."}, {Role: "user", Content: " A fox "},
		{Role: "assistant", Content: "ran home."}, {Role: "user", Content: "Then?"}}
	ids, err := ch.Prompt(msgs, true)
	if err != nil {
		t.Fatal(err)
	}
	want := append([]int{256}, tok.Encode("System: Tell stories.\nUser: A fox\nAssistant: ran home.\nUser: Then?\nAssistant:")...)
	if !slices.Equal(ids, want) {
		t.Fatalf("chat prompt %q, want %q", ByteText(ids), ByteText(want))
	}
	be := NewCPU(t, b)
	defer be.Close()
	eng, err := loader.NewEngine(b, be)
	if err != nil {
		t.Fatal(err)
	}
	res, err := eng.Generate([]loader.Request{{Prompt: ids, Verbatim: true, MaxTokens: 8}})
	if err != nil {
		t.Fatal(err)
	}
	if len(res[0].Tokens) == 0 || res[0].PromptTokens != len(ids) || len(res[0].Rows) != len(ids)+len(res[0].Tokens)-1 {
		t.Fatalf("%d tokens, %d prompt rows of %d rows (prompt %d ids)", len(res[0].Tokens), res[0].PromptTokens, len(res[0].Rows), len(ids))
	}
	if _, err := ch.Prompt(nil, true); err == nil {
		t.Error("no messages: no error")
	}
	bare := Compile(t, SmallModel)
	if _, err := loader.NewChat(bare.Manifest.Model, loader.ByteTokenizer{}); err == nil || !strings.Contains(err.Error(), "give one with chat_template: in the model spec") {
		t.Errorf("no template: %v", err)
	}
}
