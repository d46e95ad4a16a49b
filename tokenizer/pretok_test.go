package tokenizer

import (
	"slices"
	"strings"
	"testing"
)

func pieces(sp splitter, s string) []string {
	var out []string
	sp.split(s, func(p string) { out = append(out, p) })
	return out
}

func TestSplit(t *testing.T) {
	llama, qwen := splitter{maxDigits: 3}, splitter{maxDigits: 1}
	for _, c := range []struct {
		sp   splitter
		in   string
		want []string
	}{
		{llama, "", nil},
		{llama, "Hello world", []string{"Hello", " world"}},
		{llama, "a   b", []string{"a", "  ", " b"}},
		{llama, "a   ", []string{"a", "   "}},
		{llama, "a \t!", []string{"a", " ", "\t", "!"}},
		{llama, "  \n\n  x", []string{"  \n\n", " ", " x"}},
		{llama, "x \r\n \n y", []string{"x", " \r\n \n", " y"}},
		{llama, "\tword", []string{"\tword"}},
		{llama, "\nword", []string{"\n", "word"}},
		{llama, "1234567", []string{"123", "456", "7"}},
		{qwen, "1234", []string{"1", "2", "3", "4"}},
		{llama, "x½Ⅻ٣", []string{"x", "½Ⅻ٣"}},
		{llama, "I'm JOHN'S 'RE 'sun", []string{"I", "'m", " JOHN", "'S", " '", "RE", " '", "sun"}},
		{llama, "'s'T're've'M'll'D", []string{"'s", "'T", "'re", "'ve", "'M", "'ll", "'D"}},
		{llama, "'sun", []string{"'s", "un"}},
		{llama, " ?!\n\nx", []string{" ?!\n\n", "x"}},
		{llama, "?! x", []string{"?!", " x"}},
		{llama, "e\u0301t\u00e9", []string{"e", "\u0301t\u00e9"}},
		{llama, "😀👍 a", []string{"😀👍", " a"}},
		{llama, "\xffabc", []string{"\xffabc"}},

		// Where JS RegExp (and so the @lenml reference) differs from Rust's regex crate, which
		// HF uses: U+0085 is \s in Rust but not in JS; U+FEFF is \s in JS but not in Rust;
		// (?i)s matches U+017F (long s) in Rust, and @lenml spells (?i:'s) as '[sS].
		{llama, "a\u0085\u0085b", []string{"a", "\u0085", "\u0085b"}},
		{llama, "a\ufeff\ufeffb", []string{"a", "\ufeff\ufeff", "b"}},
		{llama, "'\u017fa '\u212a", []string{"'\u017f", "a", " '", "\u212a"}},
	} {
		if got := pieces(c.sp, c.in); !slices.Equal(got, c.want) {
			t.Errorf("split(%+q) = %+q, want %+q", c.in, got, c.want)
		}
	}
}

// TestSplitCovers checks on every corpus line that the pieces are non-empty and tile the text.
func TestSplitCovers(t *testing.T) {
	for _, line := range corpus(t) {
		for _, sp := range []splitter{{maxDigits: 3}, {maxDigits: 1}} {
			ps := pieces(sp, line)
			if strings.Join(ps, "") != line || slices.Contains(ps, "") {
				t.Fatalf("split(%q) = %q", line, ps)
			}
		}
	}
}
