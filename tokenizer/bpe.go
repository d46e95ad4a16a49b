package tokenizer

import (
	"strings"
	"sync"
)

// bpe is a byte-level BPE model. Tokens are keyed by the bytes they stand for rather than by
// their byte-level spelling, so a piece of text is looked up without re-spelling it.
type bpe struct {
	vocab        map[string]int32 // bytes -> id, for every token spelled wholly in byte-level chars
	byteID       [256]int32       // the token of each single byte
	merges       map[uint64]merge // (left id, right id) -> merge
	ignoreMerges bool             // a piece that is a whole token is that token (Llama 3)
	cache        wordCache
}

// wordCache remembers the ids of short words, since text repeats words and merging is the
// cost of encoding. Like HF's cache it stops taking words once full.
type wordCache struct {
	mu    sync.RWMutex
	words map[string][]int32
}

const (
	cacheWords   = 10000
	cacheWordLen = 256 // bytes; longer words are rare and would crowd out common ones
)

func (c *wordCache) get(word string) ([]int32, bool) {
	c.mu.RLock()
	ids, ok := c.words[word]
	c.mu.RUnlock()
	return ids, ok
}

func (c *wordCache) put(word string, ids []int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.words == nil {
		c.words = make(map[string][]int32)
	}
	if len(c.words) >= cacheWords {
		return
	}
	ids32 := make([]int32, len(ids))
	for i, id := range ids {
		ids32[i] = int32(id)
	}
	// The word is a slice of the caller's text; a copy lets that text be freed.
	c.words[strings.Clone(word)] = ids32
}

type merge struct {
	rank int32 // position in the merges list; lower merges first
	id   int32 // the merged token
}

func pairKey(a, b int32) uint64 { return uint64(uint32(a))<<32 | uint64(uint32(b)) }

// symbol is one token of a word being merged, in a doubly linked list over the word's bytes.
type symbol struct {
	id         int32
	prev, next int32 // neighbours' indices, -1 at the ends
	gone       bool  // merged into the symbol on its left
}

// candidate is a merge that may apply at pos; the queue may hold stale candidates.
type candidate struct {
	rank, pos, id int32
}

// bpeScratch holds the buffers of one word's merge, reused across words of one Encode.
type bpeScratch struct {
	syms  []symbol
	queue []candidate
}

// encode appends the ids of word (non-empty) to out. It applies merges one at a time, lowest
// rank first and leftmost among equals, exactly as HF tokenizers' Word::merge_all.
func (m *bpe) encode(word string, out []int, sc *bpeScratch) []int {
	if len(word) == 1 {
		return append(out, int(m.byteID[word[0]]))
	}
	if m.ignoreMerges {
		if id, ok := m.vocab[word]; ok {
			return append(out, int(id))
		}
	}
	if len(word) > cacheWordLen {
		return m.merge(word, out, sc)
	}
	if ids, ok := m.cache.get(word); ok {
		for _, id := range ids {
			out = append(out, int(id))
		}
		return out
	}
	n := len(out)
	out = m.merge(word, out, sc)
	m.cache.put(word, out[n:])
	return out
}

// merge is encode without the shortcuts.
func (m *bpe) merge(word string, out []int, sc *bpeScratch) []int {
	syms := sc.syms[:0]
	for i := 0; i < len(word); i++ {
		syms = append(syms, symbol{id: m.byteID[word[i]], prev: int32(i - 1), next: int32(i + 1)})
	}
	syms[len(syms)-1].next = -1
	q := sc.queue[:0]
	for i := 0; i+1 < len(syms); i++ {
		if mg, ok := m.merges[pairKey(syms[i].id, syms[i+1].id)]; ok {
			q = pushCandidate(q, candidate{mg.rank, int32(i), mg.id})
		}
	}
	for len(q) > 0 {
		var top candidate
		top, q = popCandidate(q)
		s := &syms[top.pos]
		if s.gone || s.next < 0 {
			continue
		}
		right := &syms[s.next]
		if mg, ok := m.merges[pairKey(s.id, right.id)]; !ok || mg.id != top.id {
			continue
		}
		s.id = top.id
		right.gone = true
		s.next = right.next
		if s.next >= 0 {
			syms[s.next].prev = top.pos
		}
		if s.prev >= 0 {
			if mg, ok := m.merges[pairKey(syms[s.prev].id, s.id)]; ok {
				q = pushCandidate(q, candidate{mg.rank, s.prev, mg.id})
			}
		}
		if s.next >= 0 {
			if mg, ok := m.merges[pairKey(s.id, syms[s.next].id)]; ok {
				q = pushCandidate(q, candidate{mg.rank, top.pos, mg.id})
			}
		}
	}
	for i := int32(0); i >= 0; i = syms[i].next {
		out = append(out, int(syms[i].id))
	}
	sc.syms, sc.queue = syms, q
	return out
}

func less(a, b candidate) bool {
	return a.rank < b.rank || (a.rank == b.rank && a.pos < b.pos)
}

// pushCandidate and popCandidate keep q a binary min-heap under less.
func pushCandidate(q []candidate, c candidate) []candidate {
	q = append(q, c)
	for i := len(q) - 1; i > 0; {
		p := (i - 1) / 2
		if !less(q[i], q[p]) {
			break
		}
		q[i], q[p] = q[p], q[i]
		i = p
	}
	return q
}

func popCandidate(q []candidate) (candidate, []candidate) {
	top := q[0]
	n := len(q) - 1
	q[0] = q[n]
	q = q[:n]
	for i := 0; ; {
		l, r, min := 2*i+1, 2*i+2, i
		if l < n && less(q[l], q[min]) {
			min = l
		}
		if r < n && less(q[r], q[min]) {
			min = r
		}
		if min == i {
			break
		}
		q[i], q[min] = q[min], q[i]
		i = min
	}
	return top, q
}
