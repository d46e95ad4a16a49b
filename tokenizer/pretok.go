package tokenizer

import (
	"fmt"
	"unicode"
	"unicode/utf8"
)

// The Split pre-tokenizers of Llama 3 and Qwen2/3 use a regex with a lookahead, which Go's
// regexp (RE2) cannot express. Rather than a general backtracking engine, splitter hand-codes
// the two known patterns, reproducing what a backtracking engine (fancy-regex, as HF uses)
// finds: at each position the first alternative that matches, each with its greedy choice
// after backtracking. Every char is matched by some alternative, so the pieces cover the text.

const (
	// patternLlama3 groups digits by up to three.
	patternLlama3 = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	// patternQwen2 takes digits one at a time.
	patternQwen2 = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
)

// splitter cuts text into the pieces of one of the known patterns.
type splitter struct {
	maxDigits int // the bound of the \p{N} alternative: 3 for Llama 3, 1 for Qwen
}

// splitterFor recognises a Split regex.
func splitterFor(pattern string) (splitter, error) {
	switch pattern {
	case patternLlama3:
		return splitter{maxDigits: 3}, nil
	case patternQwen2:
		return splitter{maxDigits: 1}, nil
	}
	return splitter{}, fmt.Errorf("regex %q is not supported; supported: the Llama 3 and Qwen2 patterns", pattern)
}

// Character classes of the patterns. \s is Unicode White_Space, \p{L} is General_Category L,
// \p{N} is General_Category N, as in Rust's regex crate.
const (
	clsOther  uint8 = iota // none of the below: [^\s\p{L}\p{N}]
	clsLetter              // \p{L}
	clsNumber              // \p{N}
	clsSpace               // \s other than \r and \n
	clsCRLF                // \r or \n
)

var asciiClass = func() (t [utf8.RuneSelf]uint8) {
	for c := rune(0); c < utf8.RuneSelf; c++ {
		t[c] = classOfSlow(c)
	}
	return t
}()

func classOfSlow(r rune) uint8 {
	switch {
	case r == '\r' || r == '\n':
		return clsCRLF
	case unicode.IsSpace(r): // exactly White_Space
		return clsSpace
	case unicode.IsLetter(r):
		return clsLetter
	case unicode.IsNumber(r):
		return clsNumber
	}
	return clsOther
}

// classAt returns the class of the rune starting at s[i] and its width in bytes. Invalid
// UTF-8 counts as one byte of class other (what U+FFFD would be).
func classAt(s string, i int) (uint8, int) {
	if c := s[i]; c < utf8.RuneSelf {
		return asciiClass[c], 1
	}
	r, n := utf8.DecodeRuneInString(s[i:])
	return classOfSlow(r), n
}

// split calls piece for each consecutive piece of s.
func (sp splitter) split(s string, piece func(string)) {
	for i := 0; i < len(s); {
		end := sp.match(s, i)
		piece(s[i:end])
		i = end
	}
}

// match returns the end of the match starting at s[i] (i < len(s)); it is always past i.
func (sp splitter) match(s string, i int) int {
	if end, ok := contraction(s, i); ok {
		return end
	}
	c, n := classAt(s, i)
	switch c {
	case clsLetter:
		// [^\r\n\p{L}\p{N}]?\p{L}+ with the optional part empty.
		return runEnd(s, i+n, clsLetter, -1)
	case clsNumber:
		return runEnd(s, i+n, clsNumber, sp.maxDigits-1)
	case clsOther, clsSpace:
		// [^\r\n\p{L}\p{N}]?\p{L}+ with the optional part taken.
		if i+n < len(s) {
			if c2, n2 := classAt(s, i+n); c2 == clsLetter {
				return runEnd(s, i+n+n2, clsLetter, -1)
			}
		}
	}
	if c == clsOther {
		// ?[^\s\p{L}\p{N}]+[\r\n]* without the space.
		return crlfRunEnd(s, runEnd(s, i+n, clsOther, -1))
	}
	if s[i] == ' ' && i+1 < len(s) {
		// ?[^\s\p{L}\p{N}]+[\r\n]* with the space.
		if c2, n2 := classAt(s, i+1); c2 == clsOther {
			end := runEnd(s, i+1+n2, clsOther, -1)
			return crlfRunEnd(s, end)
		}
	}
	// c is \s. Find the end of the whitespace run, its last \r or \n and its last char.
	lastCRLF, last, end := -1, i, i
	for end < len(s) {
		c, n := classAt(s, end)
		if c != clsSpace && c != clsCRLF {
			break
		}
		if c == clsCRLF {
			lastCRLF = end
		}
		last = end
		end += n
	}
	switch {
	case lastCRLF >= 0:
		// \s*[\r\n]+: \s* backs off to the last \r or \n, which then ends the match.
		return lastCRLF + 1
	case end == len(s):
		// \s+(?!\S) at the end of the text.
		return end
	case last > i:
		// \s+(?!\S) backs off one char so that whitespace, not \S, follows.
		return last
	}
	// \s+ of a single char followed by \S.
	return end
}

// runEnd returns the end of the run of chars of class cls starting at s[i], taking at most
// limit chars when limit >= 0.
func runEnd(s string, i int, cls uint8, limit int) int {
	for limit != 0 && i < len(s) {
		c, n := classAt(s, i)
		if c != cls {
			break
		}
		i += n
		limit--
	}
	return i
}

// crlfRunEnd returns the end of the run of \r and \n starting at s[i].
func crlfRunEnd(s string, i int) int {
	for i < len(s) && (s[i] == '\r' || s[i] == '\n') {
		i++
	}
	return i
}

// contraction matches (?i:'s|'t|'re|'ve|'m|'ll|'d) at s[i]. Case folding is Unicode simple
// folding as in Rust's regex crate, so 's also matches U+017F (long s).
func contraction(s string, i int) (int, bool) {
	if s[i] != '\'' {
		return 0, false
	}
	j := i + 1
	r1, n1 := nextRune(s, j)
	switch {
	case foldEq(r1, 's'), foldEq(r1, 't'), foldEq(r1, 'm'), foldEq(r1, 'd'):
		return j + n1, true
	}
	r2, n2 := nextRune(s, j+n1)
	switch {
	case foldEq(r1, 'r') && foldEq(r2, 'e'), foldEq(r1, 'v') && foldEq(r2, 'e'), foldEq(r1, 'l') && foldEq(r2, 'l'):
		return j + n1 + n2, true
	}
	return 0, false
}

// nextRune decodes the rune at s[i]; past the end it returns -1.
func nextRune(s string, i int) (rune, int) {
	if i >= len(s) {
		return -1, 0
	}
	return utf8.DecodeRuneInString(s[i:])
}

// foldEq reports whether r equals the ASCII lower-case letter c under simple case folding.
func foldEq(r, c rune) bool {
	if r < 0 {
		return false
	}
	for f := c; ; {
		if r == f {
			return true
		}
		if f = unicode.SimpleFold(f); f == c {
			return false
		}
	}
}
