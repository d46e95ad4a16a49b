package tokenizer

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
)

// miniFile returns a small valid tokenizer.json as a mutable tree: the 256 byte tokens, then
// "ab" and "Ġab" from two merges, and one added token.
func miniFile() map[string]any {
	vocab := map[string]any{}
	for b := 0; b < 256; b++ {
		vocab[string(byteChars[b])] = b
	}
	vocab["ab"] = 256
	vocab["Ġab"] = 257
	split := map[string]any{"type": "Split", "pattern": map[string]any{"Regex": patternQwen2}, "behavior": "Isolated", "invert": false}
	byteLevel := map[string]any{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false}
	return map[string]any{
		"version":       "1.0",
		"truncation":    nil,
		"padding":       nil,
		"added_tokens":  []any{map[string]any{"id": 258, "content": "<|end|>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}},
		"normalizer":    nil,
		"pre_tokenizer": map[string]any{"type": "Sequence", "pretokenizers": []any{split, byteLevel}},
		"decoder":       map[string]any{"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
		"model": map[string]any{
			"type": "BPE", "dropout": nil, "unk_token": nil, "continuing_subword_prefix": nil, "end_of_word_suffix": nil,
			"fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
			"vocab": vocab, "merges": []any{"a b", []any{"Ġ", "ab"}},
		},
	}
}

func parseTree(t *testing.T, f map[string]any) (*Tokenizer, error) {
	t.Helper()
	data, err := json.Marshal(f)
	if err != nil {
		t.Fatal(err)
	}
	return Parse(data)
}

func TestMiniFile(t *testing.T) {
	tok, err := parseTree(t, miniFile())
	if err != nil {
		t.Fatal(err)
	}
	if got, want := tok.Encode("ab ab<|end|>abc"), []int{256, 257, 258, 256, 'c'}; !slices.Equal(got, want) {
		t.Errorf("Encode = %v, want %v", got, want)
	}
	if got := tok.VocabSize(); got != 259 {
		t.Errorf("VocabSize = %d, want 259", got)
	}
}

// TestNormalizedAddedToken: an added token marked normalized is matched after NFC, so a
// decomposed spelling in the text finds it; one not marked is matched in the raw text.
func TestNormalizedAddedToken(t *testing.T) {
	f := miniFile()
	f["normalizer"] = map[string]any{"type": "NFC"}
	f["added_tokens"] = append(f["added_tokens"].([]any),
		map[string]any{"id": 300, "content": "<\u00e9>", "normalized": true},
		map[string]any{"id": 301, "content": "[e\u0301]", "normalized": false})
	tok, err := parseTree(t, f)
	if err != nil {
		t.Fatal(err)
	}
	got := tok.Encode("<e\u0301>[e\u0301]<|end|>[\u00e9]")
	want := []int{300, 301, 258, '[', 0xC3, 0xA9, ']'}
	if !slices.Equal(got, want) {
		t.Errorf("Encode = %v, want %v", got, want)
	}
	// As in HF's ByteLevel decoder, an added token made of byte-level chars is read as bytes
	// (é is the char of byte 0xE9, a lone invalid byte) and any other as its UTF-8.
	if got := tok.Decode([]int{300, 301}); got != "<\uFFFD>[e\u0301]" {
		t.Errorf("Decode = %+q", got)
	}
}

func TestParseErrors(t *testing.T) {
	preTok := func(f map[string]any) map[string]any {
		return f["pre_tokenizer"].(map[string]any)
	}
	sub := func(f map[string]any, i int) map[string]any {
		return preTok(f)["pretokenizers"].([]any)[i].(map[string]any)
	}
	model := func(f map[string]any) map[string]any { return f["model"].(map[string]any) }
	for _, c := range []struct {
		name   string
		change func(f map[string]any)
		want   string
	}{
		{"model type", func(f map[string]any) { model(f)["type"] = "Unigram" }, `model: type "Unigram" is not supported; supported: BPE`},
		{"dropout", func(f map[string]any) { model(f)["dropout"] = 0.1 }, "dropout 0.1 is not supported"},
		{"byte fallback", func(f map[string]any) { model(f)["byte_fallback"] = true }, "byte_fallback is not supported"},
		{"prefix", func(f map[string]any) { model(f)["continuing_subword_prefix"] = "##" }, `continuing_subword_prefix "##" is not supported`},
		{"missing byte", func(f map[string]any) { delete(model(f)["vocab"].(map[string]any), "Ġ") }, "no token for byte 0x20"},
		{"merge unknown", func(f map[string]any) { model(f)["merges"] = []any{"a zz"} }, `merges[0] "a" "zz": token not in vocab`},
		{"merge malformed", func(f map[string]any) { model(f)["merges"] = []any{"a b c"} }, `merge "a b c" is not two tokens`},
		{"normalizer", func(f map[string]any) { f["normalizer"] = map[string]any{"type": "NFKC"} }, "normalizer: type NFKC is not supported; supported: null, NFC"},
		{"metaspace", func(f map[string]any) { f["pre_tokenizer"] = map[string]any{"type": "Metaspace"} }, "pre_tokenizer: type Metaspace is not supported; supported: Sequence[Split"},
		{"no pre-tokenizer", func(f map[string]any) { f["pre_tokenizer"] = nil }, "pre_tokenizer: null is not supported"},
		{"other regex", func(f map[string]any) { sub(f, 0)["pattern"] = map[string]any{"Regex": `\w+`} }, `regex "\\w+" is not supported`},
		{"string pattern", func(f map[string]any) { sub(f, 0)["pattern"] = map[string]any{"String": " "} }, "only a Regex pattern is supported"},
		{"behavior", func(f map[string]any) { sub(f, 0)["behavior"] = "Removed" }, "behavior Removed (invert false) is not supported"},
		{"prefix space", func(f map[string]any) { sub(f, 1)["add_prefix_space"] = true }, "add_prefix_space true is not supported"},
		{"use regex", func(f map[string]any) { sub(f, 1)["use_regex"] = true }, "use_regex true after a Split is not supported"},
		{"decoder", func(f map[string]any) { f["decoder"] = map[string]any{"type": "Metaspace"} }, "decoder: type Metaspace is not supported; supported: ByteLevel"},
		{"no decoder", func(f map[string]any) { f["decoder"] = nil }, "decoder: type null is not supported"},
		{"truncation", func(f map[string]any) { f["truncation"] = map[string]any{"max_length": 8} }, "truncation is not supported"},
		{"added id", func(f map[string]any) { f["added_tokens"].([]any)[0].(map[string]any)["id"] = 1 << 40 }, `added_tokens: 0 ("<|end|>"): id 1099511627776 out of range`},
		{"vocab id", func(f map[string]any) { model(f)["vocab"].(map[string]any)["ab"] = -3 }, `vocab: token "ab" has id -3 out of range`},
	} {
		f := miniFile()
		c.change(f)
		_, err := parseTree(t, f)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want it to contain %q", c.name, err, c.want)
		}
	}
	if _, err := Parse([]byte("{not json")); err == nil || !strings.Contains(err.Error(), "tokenizer.json") {
		t.Errorf("invalid JSON: error %v", err)
	}
}

// TestAddedTokenOptions follows HF's AddedVocabulary::find_matches for single_word, lstrip
// and rstrip.
func TestAddedTokenOptions(t *testing.T) {
	sp := newAddedSplitter([]addedToken{
		{content: "[L]", id: 1, lstrip: true},
		{content: "[R]", id: 2, rstrip: true},
		{content: "sw", id: 3, singleWord: true},
		{content: "<x>", id: 4},
	})
	type piece struct {
		text string
		id   int
	}
	for _, c := range []struct {
		in   string
		want []piece
	}{
		{"a  [L]b", []piece{{"a", -1}, {"  [L]", 1}, {"b", -1}}},
		{"x[R]  \n y", []piece{{"x", -1}, {"[R]  \n ", 2}, {"y", -1}}},
		{"[R]  [L]", []piece{{"[R]  ", 2}, {"[L]", 1}}},
		{"<x> [L]", []piece{{"<x>", 4}, {" [L]", 1}}},
		{"sw swim sw. _sw", []piece{{"sw", 3}, {" swim ", -1}, {"sw", 3}, {". _sw", -1}}},
		{"éswé sw\u0301 sw", []piece{{"éswé sw\u0301 ", -1}, {"sw", 3}}},
		{"", nil},
	} {
		var got []piece
		sp.split(c.in, func(text string, id int) { got = append(got, piece{text, id}) })
		if !slices.Equal(got, c.want) {
			t.Errorf("split(%q) = %+v, want %+v", c.in, got, c.want)
		}
	}
}
