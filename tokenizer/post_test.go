package tokenizer

import (
	"slices"
	"strings"
	"testing"
)

// TestSpecialOfShippedFiles: Llama 3.1's post-processor puts <|begin_of_text|> before a
// sequence; Qwen3's adds nothing.
func TestSpecialOfShippedFiles(t *testing.T) {
	for name, want := range map[string][]int{"llama3_1": {128000}, "qwen3": nil} {
		pre, suf := testTokenizer(t, name).Special()
		if !slices.Equal(pre, want) || len(suf) != 0 {
			t.Errorf("%s: prefix %v suffix %v, want prefix %v and no suffix", name, pre, suf, want)
		}
	}
}

func TestSpecialPostProcessors(t *testing.T) {
	bos := map[string]any{"SpecialToken": map[string]any{"id": "<s>", "type_id": 0}}
	eos := map[string]any{"SpecialToken": map[string]any{"id": "</s>", "type_id": 0}}
	seq := map[string]any{"Sequence": map[string]any{"id": "A", "type_id": 0}}
	specials := map[string]any{"<s>": map[string]any{"id": "<s>", "ids": []any{1}}, "</s>": map[string]any{"id": "</s>", "ids": []any{2}}}
	tmpl := func(single ...any) map[string]any {
		return map[string]any{"type": "TemplateProcessing", "single": single, "special_tokens": specials}
	}
	byteLevel := map[string]any{"type": "ByteLevel"}
	for _, c := range []struct {
		name     string
		post     any
		pre, suf []int
		err      string
	}{
		{"null", nil, nil, nil, ""},
		{"byte level", byteLevel, nil, nil, ""},
		{"bos", tmpl(bos, seq), []int{1}, nil, ""},
		{"bos and eos", tmpl(bos, seq, eos), []int{1}, []int{2}, ""},
		{"sequence", map[string]any{"type": "Sequence", "processors": []any{byteLevel, tmpl(bos, seq)}}, []int{1}, nil, ""},
		{"unknown token", tmpl(map[string]any{"SpecialToken": map[string]any{"id": "<x>"}}, seq), nil, nil, `special token "<x>" is not in special_tokens`},
		{"no sequence", tmpl(bos), nil, nil, "no sequence"},
		{"bert", map[string]any{"type": "BertProcessing"}, nil, nil, "type BertProcessing is not supported"},
		{"two prefixes", map[string]any{"type": "Sequence", "processors": []any{tmpl(bos, seq), tmpl(bos, seq)}}, nil, nil, "processor 1 adds special tokens after another"},
	} {
		f := miniFile()
		f["post_processor"] = c.post
		tok, err := parseTree(t, f)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), "post_processor: ") || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%s: %v, want an error with %q", c.name, err, c.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		pre, suf := tok.Special()
		if !slices.Equal(pre, c.pre) || !slices.Equal(suf, c.suf) {
			t.Errorf("%s: prefix %v suffix %v, want %v %v", c.name, pre, suf, c.pre, c.suf)
		}
	}
}
