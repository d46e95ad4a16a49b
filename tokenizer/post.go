package tokenizer

import (
	"encoding/json"
	"fmt"
)

// The post-processor is what Hugging Face's tokenizer(text) adds around the ids of a single
// sequence when add_special_tokens is on (its default): Llama 3's TemplateProcessing puts
// <|begin_of_text|> before them, Qwen's ByteLevel adds nothing. Encode never applies it;
// Special reports it, so that the engine can prepend the same token (and chat templates,
// which write their own, can leave it out).

// postJSON is the part of a post-processor read here.
type postJSON struct {
	Type       string            `json:"type"`
	Processors []json.RawMessage `json:"processors"`
	Single     []struct {
		SpecialToken *struct {
			ID string `json:"id"`
		} `json:"SpecialToken"`
		Sequence *struct {
			ID string `json:"id"`
		} `json:"Sequence"`
	} `json:"single"`
	SpecialTokens map[string]struct {
		IDs []int `json:"ids"`
	} `json:"special_tokens"`
}

// parsePost reads the post-processor's special tokens before and after a single sequence.
func parsePost(raw json.RawMessage) (prefix, suffix []int, err error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil, nil
	}
	var p postJSON
	if err := json.Unmarshal(raw, &p); err != nil {
		return nil, nil, err
	}
	switch p.Type {
	case "ByteLevel":
		return nil, nil, nil // offsets only
	case "Sequence":
		for i, sub := range p.Processors {
			pre, suf, err := parsePost(sub)
			if err != nil {
				return nil, nil, fmt.Errorf("processor %d: %w", i, err)
			}
			if len(prefix) > 0 && len(pre) > 0 || len(suffix) > 0 && len(suf) > 0 {
				return nil, nil, fmt.Errorf("processor %d adds special tokens after another one did: not supported", i)
			}
			prefix, suffix = append(prefix, pre...), append(suffix, suf...)
		}
		return prefix, suffix, nil
	case "TemplateProcessing":
		seen := false
		for i, piece := range p.Single {
			switch {
			case piece.Sequence != nil:
				if seen {
					return nil, nil, fmt.Errorf("single: piece %d is a second sequence", i)
				}
				seen = true
			case piece.SpecialToken != nil:
				st, ok := p.SpecialTokens[piece.SpecialToken.ID]
				if !ok {
					return nil, nil, fmt.Errorf("single: special token %q is not in special_tokens", piece.SpecialToken.ID)
				}
				if seen {
					suffix = append(suffix, st.IDs...)
				} else {
					prefix = append(prefix, st.IDs...)
				}
			default:
				return nil, nil, fmt.Errorf("single: piece %d is neither a sequence nor a special token", i)
			}
		}
		if !seen {
			return nil, nil, fmt.Errorf("single: no sequence")
		}
		return prefix, suffix, nil
	default:
		return nil, nil, fmt.Errorf("type %s is not supported; supported: ByteLevel, TemplateProcessing, Sequence of them", p.Type)
	}
}

// Special returns the ids Hugging Face's post-processor puts before (prefix) and after
// (suffix) the ids of a single sequence: tokenizer(text) is prefix + Encode(text) + suffix.
func (t *Tokenizer) Special() (prefix, suffix []int) {
	return append([]int(nil), t.prefix...), append([]int(nil), t.suffix...)
}
