package tokenizer

// addedToken is a token matched in the text before pre-tokenization.
type addedToken struct {
	content string
	id      int
}

// addedSplitter finds added tokens in text, leftmost first and longest among those starting
// at the same place, like the Aho-Corasick LeftmostLongest matcher HF uses.
type addedSplitter struct {
	nodes []trieNode // nodes[0] is the root; empty when there are no tokens
	first [256]bool  // the bytes some token starts with, to skip the rest of the text fast
}

type trieNode struct {
	next map[byte]int32
	id   int // the token ending here, or -1
}

func newAddedSplitter(tokens []addedToken) addedSplitter {
	if len(tokens) == 0 {
		return addedSplitter{}
	}
	s := addedSplitter{nodes: []trieNode{{id: -1}}}
	for _, tok := range tokens {
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
				s.nodes = append(s.nodes, trieNode{id: -1})
			}
			n = next
		}
		// A repeated content keeps its last id, as HF's map from content to id does.
		s.nodes[n].id = tok.id
		if tok.content != "" {
			s.first[tok.content[0]] = true
		}
	}
	return s
}

// split calls f for each piece of text in order: an added token with its id, or the text
// between tokens with id -1. Empty text between adjacent tokens is not reported.
func (s *addedSplitter) split(text string, f func(piece string, id int)) {
	if len(s.nodes) == 0 {
		if text != "" {
			f(text, -1)
		}
		return
	}
	start := 0
	for i := 0; i < len(text); i++ {
		if !s.first[text[i]] {
			continue
		}
		end, id := s.longestAt(text, i)
		if end < 0 {
			continue
		}
		if i > start {
			f(text[start:i], -1)
		}
		f(text[i:end], id)
		start = end
		i = end - 1
	}
	if start < len(text) {
		f(text[start:], -1)
	}
}

// longestAt returns the end and id of the longest token starting at text[i], or end -1.
func (s *addedSplitter) longestAt(text string, i int) (end, id int) {
	end, n := -1, int32(0)
	for j := i; j < len(text); j++ {
		next, ok := s.nodes[n].next[text[j]]
		if !ok {
			break
		}
		n = next
		if s.nodes[n].id >= 0 {
			end, id = j+1, s.nodes[n].id
		}
	}
	return end, id
}
