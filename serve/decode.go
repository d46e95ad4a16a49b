package serve

import (
	"strings"
	"unicode/utf8"

	"xmix/loader"
	"xmix/tokenizer"
)

// streamDecoder turns generated ids into text piece by piece without splitting a UTF-8
// character across pieces.
type streamDecoder interface {
	Add(id int) string
	Flush() string
}

func newStreamDecoder(tok loader.Tokenizer) streamDecoder {
	if t, ok := tok.(*tokenizer.Tokenizer); ok {
		return t.NewDecoder()
	}
	return &cumulativeDecoder{tok: tok}
}

// cumulativeDecoder serves tokenizers without a streaming decoder (the byte tokenizer,
// whose ids may each be one byte of a character): it decodes all ids so far and emits the
// new suffix up to a trailing incomplete character, each invalid byte as U+FFFD.
type cumulativeDecoder struct {
	tok     loader.Tokenizer
	ids     []int
	emitted int // bytes of the decoded text already emitted
}

func (d *cumulativeDecoder) Add(id int) string {
	d.ids = append(d.ids, id)
	full := d.tok.Decode(d.ids)
	if len(full) < d.emitted {
		return ""
	}
	rest := full[d.emitted:]
	var out strings.Builder
	i := 0
	for i < len(rest) {
		r, n := utf8.DecodeRuneInString(rest[i:])
		if r == utf8.RuneError && n <= 1 {
			if !utf8.FullRuneInString(rest[i:]) {
				break // the next ids may complete it
			}
			out.WriteRune(utf8.RuneError)
		} else {
			out.WriteString(rest[i : i+n])
		}
		i += n
	}
	d.emitted += i
	return out.String()
}

func (d *cumulativeDecoder) Flush() string {
	full := d.tok.Decode(d.ids)
	d.ids = d.ids[:0]
	if len(full) <= d.emitted {
		d.emitted = 0
		return ""
	}
	rest := full[d.emitted:]
	d.emitted = 0
	return strings.ToValidUTF8(rest, "\uFFFD")
}
