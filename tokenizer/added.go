package tokenizer

import (
	"unicode"
	"unicode/utf8"
)

// addedToken is a token matched in the text before pre-tokenization.
type addedToken struct {
	content string
	id      int
	// singleWord: match only where no word char (\w) touches either end.
	// lstrip, rstrip: the match takes in the whitespace before, after it.
	singleWord, lstrip, rstrip bool
}

// addedSplitter finds added tokens in text, leftmost first and longest among those starting
// at the same place, like the Aho-Corasick LeftmostLongest matcher HF uses.
type addedSplitter struct {
	nodes  []trieNode // nodes[0] is the root; empty when there are no tokens
	tokens []addedToken
	first  [256]bool // the bytes some token starts with, to skip the rest of the text fast
}

type trieNode struct {
	next  map[byte]int32
	token int // index in tokens of the token ending here, or -1
}

func newAddedSplitter(tokens []addedToken) addedSplitter {
	if len(tokens) == 0 {
		return addedSplitter{}
	}
	s := addedSplitter{nodes: []trieNode{{token: -1}}, tokens: tokens}
	for ti, tok := range tokens {
		n := int32(0)
		for i := 0; i < len(tok.content); i++ {
			c := tok.content[i]
			next, ok := s.nodes[n].next[c]
			if !ok {
				if s.nodes[n].next == nil {
					s.nodes[n].next = make(map[byte]int32)
				}
				next = int32(len(s.nodes))
				s.nodes[n].next[c] = next
				s.nodes = append(s.nodes, trieNode{token: -1})
			}
			n = next
		}
		// A repeated content keeps its last token, as HF's map from content to id does.
		s.nodes[n].token = ti
		s.first[tok.content[0]] = true
	}
	return s
}

// split calls f for each piece of text in order: an added token with its id, or the text
// between tokens with id -1. Empty text between adjacent tokens is not reported. It follows
// HF's AddedVocabulary::find_matches, including where a stripped token's span overlaps.
func (s *addedSplitter) split(text string, f func(piece string, id int)) {
	if len(s.nodes) == 0 {
		if text != "" {
			f(text, -1)
		}
		return
	}
	done := 0 // the end of the last piece reported
	for i := 0; i < len(text); i++ {
		if !s.first[text[i]] {
			continue
		}
		end, ti := s.longestAt(text, i)
		if ti < 0 {
			continue
		}
		// The search goes on after the match as found, whatever stripping does to its span.
		next := end
		tok := &s.tokens[ti]
		start := i
		if tok.singleWord && (endsWithWord(text[:start]) || startsWithWord(text[end:])) {
			i = next - 1
			continue
		}
		if tok.lstrip {
			start = max(trailingSpace(text[:start]), done)
		}
		if tok.rstrip {
			end += leadingSpace(text[end:])
		}
		if done < start {
			f(text[done:start], -1)
		}
		f(text[start:end], tok.id)
		done = end
		i = next - 1
	}
	if done < len(text) {
		f(text[done:], -1)
	}
}

// longestAt returns the end and index of the longest token starting at text[i], or index -1.
func (s *addedSplitter) longestAt(text string, i int) (end, token int) {
	end, token = -1, -1
	n := int32(0)
	for j := i; j < len(text); j++ {
		next, ok := s.nodes[n].next[text[j]]
		if !ok {
			break
		}
		n = next
		if s.nodes[n].token >= 0 {
			end, token = j+1, s.nodes[n].token
		}
	}
	return end, token
}

// isWordChar is Rust regex's Unicode \w: Alphabetic, marks, decimal digits, connector
// punctuation and joiners.
func isWordChar(r rune) bool {
	return unicode.IsLetter(r) || unicode.IsMark(r) || unicode.Is(unicode.Nd, r) || unicode.Is(unicode.Nl, r) ||
		unicode.Is(unicode.Pc, r) || unicode.Is(unicode.Other_Alphabetic, r) || unicode.Is(unicode.Join_Control, r)
}

func endsWithWord(s string) bool {
	r, n := utf8.DecodeLastRuneInString(s)
	return n > 0 && isWordChar(r)
}

func startsWithWord(s string) bool {
	r, n := utf8.DecodeRuneInString(s)
	return n > 0 && isWordChar(r)
}

// trailingSpace returns where the whitespace at the end of s begins.
func trailingSpace(s string) int {
	for len(s) > 0 {
		r, n := utf8.DecodeLastRuneInString(s)
		if !unicode.IsSpace(r) {
			break
		}
		s = s[:len(s)-n]
	}
	return len(s)
}

// leadingSpace returns the length of the whitespace at the start of s.
func leadingSpace(s string) int {
	i := 0
	for i < len(s) {
		r, n := utf8.DecodeRuneInString(s[i:])
		if !unicode.IsSpace(r) {
			break
		}
		i += n
	}
	return i
}
