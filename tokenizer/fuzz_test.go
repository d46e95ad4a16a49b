package tokenizer

import (
	"encoding/json"
	"testing"
)

// FuzzParse: any bytes given as a tokenizer.json either parse into a tokenizer that encodes
// and decodes without panicking, every id it emits inside its vocabulary, or are an error;
// never a panic, a hang or an allocation the file does not pay for.
func FuzzParse(f *testing.F) {
	mini, err := json.Marshal(miniFile())
	if err != nil {
		f.Fatal(err)
	}
	f.Add(mini)
	nfcFile := miniFile()
	nfcFile["normalizer"] = map[string]any{"type": "NFC"}
	nfcJSON, _ := json.Marshal(nfcFile)
	f.Add(nfcJSON)
	for _, s := range []string{"", "{}", "null", `{"model": {"type": "BPE", "vocab": {"a": 16777216}}}`,
		`{"added_tokens": [{"id": -1, "content": ""}]}`, `{"model": {"type": "WordPiece"}}`, `[1, 2]`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		tok, err := Parse(data)
		if err != nil {
			return
		}
		for _, text := range []string{"Hello, world! ab ab<|end|>", "\xff\xfe", "é\u0301 漢字"} {
			ids := tok.Encode(text)
			for _, id := range ids {
				if id < 0 || id >= tok.VocabSize() {
					t.Fatalf("Encode(%q) gave id %d outside the vocabulary of %d", text, id, tok.VocabSize())
				}
			}
			tok.Decode(ids)
		}
		tok.Decode([]int{-1, 0, tok.VocabSize(), 1 << 40})
	})
}
