package loader

import (
	"fmt"

	"xmix/bundle"
	"xmix/chat"
)

// Chat turns conversations into prompts with the bundle's chat template, token-exact with
// transformers' apply_chat_template(messages, tokenize=True, add_generation_prompt=True) and
// vLLM's chat completions: the template is rendered with the checkpoint's bos and eos token
// texts, and the rendering is tokenized without adding special tokens (a template writes its
// own BOS, so it is never doubled). A template that cannot write the BOS, because the
// checkpoint gives it no text (the bytes tokenizer), gets the bundle's BOS before it.
// Safe for concurrent use.
type Chat struct {
	tmpl     *chat.Template
	tok      Tokenizer
	model    bundle.ModelConfig
	bos, eos string
}

// NewChat parses the bundle's chat template; it is an error when the bundle has none.
func NewChat(m bundle.ModelConfig, tok Tokenizer) (*Chat, error) {
	if m.ChatTemplate == "" {
		return nil, fmt.Errorf("model %s has no chat template (its checkpoint's tokenizer_config.json has no chat_template; give one with chat_template: in the model spec)", m.Name)
	}
	t, err := chat.Parse(m.ChatTemplate)
	if err != nil {
		return nil, fmt.Errorf("model %s: chat template: %w", m.Name, err)
	}
	return &Chat{tmpl: t, tok: tok, model: m, bos: m.ChatBOS, eos: m.ChatEOS}, nil
}

// Render is the template's text for msgs (system, user and assistant turns, in order);
// addGenerationPrompt ends it with the opening of the assistant's turn. Which roles and
// orders a template accepts is the template's business: its raise_exception comes back as
// the error.
func (c *Chat) Render(msgs []chat.Message, addGenerationPrompt bool) (string, error) {
	if len(msgs) == 0 {
		return "", fmt.Errorf("chat: no messages")
	}
	s, err := c.tmpl.Render(msgs, addGenerationPrompt, map[string]any{"bos_token": c.bos, "eos_token": c.eos})
	if err != nil {
		return "", fmt.Errorf("chat template: %w", err)
	}
	return s, nil
}

// Prompt is the model's whole input for msgs, for a Request with Verbatim set.
func (c *Chat) Prompt(msgs []chat.Message, addGenerationPrompt bool) ([]int, error) {
	return c.prompt(msgs, addGenerationPrompt, false)
}

// GenerationPrompt is Prompt for a request that is to generate: a conversation whose
// rendering leaves the model's context no room to generate by its bytes alone
// (Tokenizer.MinTokens) is refused before it is encoded.
func (c *Chat) GenerationPrompt(msgs []chat.Message, addGenerationPrompt bool) ([]int, error) {
	return c.prompt(msgs, addGenerationPrompt, true)
}

func (c *Chat) prompt(msgs []chat.Message, addGenerationPrompt, generate bool) ([]int, error) {
	s, err := c.Render(msgs, addGenerationPrompt)
	if err != nil {
		return nil, err
	}
	if n := c.tok.MinTokens(s); generate && n >= c.model.MaxSeqLen {
		return nil, fmt.Errorf("the conversation is at least %d tokens (%d bytes as the chat template writes it); the model's context is %d, which leaves no room to generate",
			n, len(s), c.model.MaxSeqLen)
	}
	ids := c.tok.Encode(s)
	if c.bos == "" && c.model.BOS >= 0 && (len(ids) == 0 || ids[0] != c.model.BOS) {
		ids = append([]int{c.model.BOS}, ids...)
	}
	return ids, nil
}
