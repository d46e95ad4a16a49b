package loader

import (
	"fmt"

	"xmix/bundle"
	"xmix/tokenizer"
)

// Tokenizer maps text to token ids and back.
type Tokenizer interface {
	Encode(text string) []int
	Decode(ids []int) string
	// MinTokens is a lower bound on len(Encode(text)) from its length alone (0: none), for
	// refusing a text too long for the model before encoding it.
	MinTokens(text string) int
}

// NewTokenizer returns the bundle's tokenizer.
func NewTokenizer(b *bundle.Bundle) (Tokenizer, error) {
	switch b.Manifest.Model.Tokenizer {
	case "bytes":
		return ByteTokenizer{}, nil
	case "hf":
		t, err := tokenizer.Parse(b.Tokenizer)
		if err != nil {
			return nil, fmt.Errorf("the bundle's tokenizer: %w", err)
		}
		return t, nil
	default:
		return nil, fmt.Errorf("tokenizer %q is not supported by this xmix (supported: bytes, hf)", b.Manifest.Model.Tokenizer)
	}
}

// ByteTokenizer is the embedded model's tokenizer: ids 0-255 are the bytes of UTF-8 text;
// higher ids (BOS, EOS) decode to nothing.
type ByteTokenizer struct{}

// Encode implements Tokenizer.
func (ByteTokenizer) Encode(text string) []int {
	ids := make([]int, len(text))
	for i := 0; i < len(text); i++ {
		ids[i] = int(text[i])
	}
	return ids
}

// MinTokens implements Tokenizer: a token a byte.
func (ByteTokenizer) MinTokens(text string) int { return len(text) }

// Decode implements Tokenizer.
func (ByteTokenizer) Decode(ids []int) string {
	b := make([]byte, 0, len(ids))
	for _, id := range ids {
		if id >= 0 && id < 256 {
			b = append(b, byte(id))
		}
	}
	return string(b)
}
