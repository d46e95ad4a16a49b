// Package chat renders a checkpoint's chat template: the Jinja string under
// "chat_template" in tokenizer_config.json. It implements the subset of
// Jinja2 that chat templates use, with the settings transformers'
// apply_chat_template renders them with (trim_blocks, lstrip_blocks, no
// autoescape, tojson as json.dumps without HTML escaping, raise_exception
// and strftime_now), so that its output matches transformers byte for byte.
package chat

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// Message is one turn of a conversation.
type Message struct{ Role, Content string }

// Template is a parsed chat template.
type Template struct {
	body []node
	// Now is the clock strftime_now reads; nil means time.Now. Set it (or
	// pass vars["date_string"], which Llama templates check first) to make
	// dated templates render deterministically.
	Now func() time.Time
}

// Parse parses a Jinja chat template. Errors name the line:col of the
// offending construct in src.
func Parse(src string) (*Template, error) {
	body, err := parse(src)
	if err != nil {
		return nil, err
	}
	return &Template{body: body}, nil
}

// Render applies the template to msgs. As transformers does, it defines
// messages, add_generation_prompt, and tools and documents as none; vars
// adds or overrides variables (bos_token, eos_token, enable_thinking,
// tools, ...); vars["messages"] replaces msgs, for turns that carry more
// than a role and text (tool_calls). Go maps in vars are seen with sorted
// keys; a json.RawMessage value keeps its object key order.
func (t *Template) Render(msgs []Message, addGenerationPrompt bool, vars map[string]any) (string, error) {
	root := &scope{vars: t.globals()}
	top := &scope{vars: map[string]value{}, parent: root}
	ms := make(list, len(msgs))
	for i, m := range msgs {
		ms[i] = messageDict(m)
	}
	top.vars["messages"] = ms
	top.vars["add_generation_prompt"] = addGenerationPrompt
	top.vars["tools"] = nil
	top.vars["documents"] = nil
	for k, v := range vars {
		tv, err := fromGo(v)
		if err != nil {
			return "", fmt.Errorf("chat template variable %q: %w", k, err)
		}
		top.vars[k] = tv
	}
	r := &renderer{budget: &budget{}}
	if err := r.nodes(top, t.body); err != nil {
		var sig loopSignal
		if errors.As(err, &sig) {
			return "", fmt.Errorf("chat template: {%% break %%} or {%% continue %%} outside a loop")
		}
		return "", err
	}
	return r.out.String(), nil
}

// FromTokenizerConfig reads the chat template and special tokens of a
// tokenizer_config.json. chat_template may be a string or a list of
// {"name", "template"} entries, of which the one named "default" is used.
// bos_token and eos_token may be strings, null, or AddedToken objects
// ({"content": ...}); missing ones are "".
func FromTokenizerConfig(data []byte) (tmpl *Template, bos, eos string, err error) {
	src, bos, eos, err := ConfigSource(data)
	if err != nil {
		return nil, "", "", err
	}
	if tmpl, err = Parse(src); err != nil {
		return nil, "", "", fmt.Errorf("tokenizer_config.json: chat_template: %w", err)
	}
	return tmpl, bos, eos, nil
}

// Config is what a tokenizer_config.json says about prompts: the chat template's source
// ("" when it has none), the bos and eos token texts the template refers to ("" when null or
// missing), and add_bos_token (nil when the file does not say; the tokenizer.json
// post-processor decides then).
type Config struct {
	Template string
	BOS, EOS string
	AddBOS   *bool
}

// ReadConfig reads a tokenizer_config.json without parsing the template (bundles store the
// source). A missing chat_template is no error: base models have none.
func ReadConfig(data []byte) (Config, error) {
	var raw struct {
		ChatTemplate json.RawMessage `json:"chat_template"`
		BOS          json.RawMessage `json:"bos_token"`
		EOS          json.RawMessage `json:"eos_token"`
		AddBOS       *bool           `json:"add_bos_token"`
	}
	var c Config
	if err := json.Unmarshal(data, &raw); err != nil {
		return c, fmt.Errorf("tokenizer_config.json: %w", err)
	}
	var err error
	if c.BOS, err = specialToken(raw.BOS); err != nil {
		return c, fmt.Errorf("tokenizer_config.json: bos_token: %w", err)
	}
	if c.EOS, err = specialToken(raw.EOS); err != nil {
		return c, fmt.Errorf("tokenizer_config.json: eos_token: %w", err)
	}
	c.AddBOS = raw.AddBOS
	if len(raw.ChatTemplate) > 0 && string(raw.ChatTemplate) != "null" {
		if c.Template, err = templateSource(raw.ChatTemplate); err != nil {
			return c, fmt.Errorf("tokenizer_config.json: chat_template: %w", err)
		}
	}
	return c, nil
}

// ConfigSource reads the chat template's source text and the bos and eos tokens from a
// tokenizer_config.json without parsing the template; a missing template is an error.
func ConfigSource(data []byte) (src, bos, eos string, err error) {
	c, err := ReadConfig(data)
	if err != nil {
		return "", "", "", err
	}
	if c.Template == "" {
		return "", "", "", errors.New("tokenizer_config.json: chat_template: missing")
	}
	return c.Template, c.BOS, c.EOS, nil
}

func templateSource(raw json.RawMessage) (string, error) {
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil
	}
	var named []struct {
		Name     string `json:"name"`
		Template string `json:"template"`
	}
	if err := json.Unmarshal(raw, &named); err != nil {
		return "", errors.New("neither a string nor a list of named templates")
	}
	for _, n := range named {
		if n.Name == "default" {
			return n.Template, nil
		}
	}
	return "", fmt.Errorf("no template named \"default\" among %d", len(named))
}

func specialToken(raw json.RawMessage) (string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil
	}
	var obj struct {
		Content string `json:"content"`
	}
	if err := json.Unmarshal(raw, &obj); err != nil {
		return "", errors.New("neither a string nor an object with content")
	}
	return obj.Content, nil
}
