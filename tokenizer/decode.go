package tokenizer

import (
	"strings"
	"unicode/utf8"
)

// byteChars is GPT-2's byte-level alphabet: every byte is spelled as one printable char, the
// printable Latin-1 bytes as themselves and the rest as U+0100 onwards, in byte order.
var byteChars, charBytes = func() (bc [256]rune, cb map[rune]byte) {
	cb = make(map[rune]byte, 256)
	n := rune(0)
	for b := 0; b < 256; b++ {
		printable := (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF)
		if printable {
			bc[b] = rune(b)
		} else {
			bc[b] = 256 + n
			n++
		}
		cb[bc[b]] = byte(b)
	}
	return bc, cb
}()

// unspell returns the bytes a byte-level token stands for; ok is false when the token holds a
// char outside the alphabet, in which case HF's ByteLevel decoder uses the token's UTF-8 as is.
func unspell(tok string) ([]byte, bool) {
	out := make([]byte, 0, len(tok))
	for _, r := range tok {
		b, ok := charBytes[r]
		if !ok {
			return []byte(tok), false
		}
		out = append(out, b)
	}
	return out, true
}

// Decode returns the text of ids. Bytes that are not valid UTF-8 become U+FFFD, one per
// maximal invalid subsequence (as Rust's String::from_utf8_lossy); unknown ids are skipped.
func (t *Tokenizer) Decode(ids []int) string {
	var b []byte
	for _, id := range ids {
		b = append(b, t.bytesOf(id)...)
	}
	s, _ := lossyUTF8(b, true)
	return s
}

func (t *Tokenizer) bytesOf(id int) []byte {
	if id < 0 || id >= len(t.idBytes) {
		return nil
	}
	return t.idBytes[id]
}

// Decoder decodes a stream of ids, such as a model's output, one id at a time.
type Decoder struct {
	t       *Tokenizer
	pending []byte // the start of a UTF-8 sequence the next ids may complete
}

// NewDecoder returns a streaming decoder. Its outputs, followed by Flush, concatenate to
// Decode of all the ids it was given.
func (t *Tokenizer) NewDecoder() *Decoder { return &Decoder{t: t} }

// Add decodes one more id and returns the text it completes: complete UTF-8 only, holding
// back the bytes of a char that the next ids may finish.
func (d *Decoder) Add(id int) string {
	d.pending = append(d.pending, d.t.bytesOf(id)...)
	s, n := lossyUTF8(d.pending, false)
	d.pending = append(d.pending[:0], d.pending[n:]...)
	return s
}

// Flush returns the held-back bytes (an unfinished char, as U+FFFD) and empties the decoder.
func (d *Decoder) Flush() string {
	s, _ := lossyUTF8(d.pending, true)
	d.pending = d.pending[:0]
	return s
}

// lossyUTF8 converts b to a string, replacing each maximal subpart of an ill-formed sequence
// with U+FFFD (Unicode's recommended practice, used by Rust and by WHATWG decoders). Unless
// final, it stops before an incomplete sequence at the end of b; n is the bytes consumed.
func lossyUTF8(b []byte, final bool) (s string, n int) {
	if utf8.Valid(b) {
		return string(b), len(b)
	}
	var out strings.Builder
	out.Grow(len(b) + 8)
	i := 0
	for i < len(b) {
		c := b[i]
		if c < utf8.RuneSelf {
			out.WriteByte(c)
			i++
			continue
		}
		need, lo, hi := 0, byte(0x80), byte(0xBF)
		switch {
		case c >= 0xC2 && c <= 0xDF:
			need = 1
		case c == 0xE0:
			need, lo = 2, 0xA0
		case c == 0xED:
			need, hi = 2, 0x9F
		case c >= 0xE1 && c <= 0xEF:
			need = 2
		case c == 0xF0:
			need, lo = 3, 0x90
		case c == 0xF4:
			need, hi = 3, 0x8F
		case c >= 0xF1 && c <= 0xF3:
			need = 3
		default:
			out.WriteRune(utf8.RuneError)
			i++
			continue
		}
		j := i + 1
		for k := 0; k < need; k++ {
			if j == len(b) {
				if !final {
					return out.String(), i
				}
				break
			}
			if b[j] < lo || b[j] > hi {
				break
			}
			lo, hi = 0x80, 0xBF
			j++
		}
		if j-i == need+1 {
			out.Write(b[i:j])
		} else {
			out.WriteRune(utf8.RuneError)
		}
		i = j
	}
	return out.String(), i
}
