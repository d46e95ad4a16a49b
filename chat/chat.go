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

	"xmix/input"
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
	r := &renderer{}
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

// ReadConfig reads the tokenizer_config.json at path (a regular file of at most
// input.Settings.Max bytes) and returns what ConfigSource does, once the template is known
// to parse. Errors name the file.
func ReadConfig(path string) (src, bos, eos string, err error) {
	data, err := input.Read(path, input.Settings)
	if err != nil {
		return "", "", "", err
	}
	if _, _, _, err := FromTokenizerConfig(data); err != nil {
		return "", "", "", fmt.Errorf("%s: %w", path, err)
	}
	return ConfigSource(data)
}

// ConfigSource reads the chat template's source text and the bos and eos tokens from a
// tokenizer_config.json without parsing the template (bundles store the source).
func ConfigSource(data []byte) (src, bos, eos string, err error) {
	var cfg struct {
		ChatTemplate json.RawMessage `json:"chat_template"`
		BOS          json.RawMessage `json:"bos_token"`
		EOS          json.RawMessage `json:"eos_token"`
	}
	if err := json.Unmarshal(data, &cfg); err != nil {
		return "", "", "", fmt.Errorf("tokenizer_config.json: %w", err)
	}
	if bos, err = specialToken(cfg.BOS); err != nil {
		return "", "", "", fmt.Errorf("tokenizer_config.json: bos_token: %w", err)
	}
	if eos, err = specialToken(cfg.EOS); err != nil {
		return "", "", "", fmt.Errorf("tokenizer_config.json: eos_token: %w", err)
	}
	if src, err = templateSource(cfg.ChatTemplate); err != nil {
		return "", "", "", fmt.Errorf("tokenizer_config.json: chat_template: %w", err)
	}
	return src, bos, eos, nil
}

func templateSource(raw json.RawMessage) (string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", errors.New("missing")
	}
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
