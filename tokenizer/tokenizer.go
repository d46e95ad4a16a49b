// Package tokenizer reads Hugging Face tokenizer.json files of the byte-level BPE kind used by
// Llama 3.x and Qwen2.5/Qwen3 and encodes and decodes text exactly as the HF tokenizers
// library does. Anything in a file that would change the ids and is not implemented here is
// reported as an error when the file is parsed, never silently ignored.
//
// What is implemented: normalizer null or NFC; pre-tokenizer Sequence[Split(regex), ByteLevel]
// with the Llama 3 or Qwen2 regex (hand-coded, see pretok.go); BPE with or without
// ignore_merges; added tokens with their normalized, single_word, lstrip and rstrip options;
// the ByteLevel decoder. The post-processor is not applied (Encode adds no BOS); Special says what
// it would add.
//
// Decoding is that of the tokenizers library; transformers' clean_up_tokenization_spaces (a
// Python-side option, true in Llama 3's tokenizer_config.json) is not applied.
//
// The tests hold parity data generated with @lenml/tokenizers (testdata/gen). Where that JS
// port and HF differ (JS \s has U+FEFF and lacks U+0085; Rust's (?i)s matches U+017F; the
// JS port ignores single_word) this package follows HF, and pretok_test.go pins the cases.
package tokenizer

import (
	"encoding/json"
	"fmt"
	"strings"
	"unicode/utf8"

	"xmix/input"
)

// Tokenizer is safe for concurrent use.
type Tokenizer struct {
	model     bpe
	nfc       bool // the normalizer is NFC (Qwen)
	split     splitter
	raw       addedSplitter // added tokens matched in the text as given
	norm      addedSplitter // added tokens matched after normalization
	idBytes   [][]byte      // the bytes each id decodes to
	tokens    map[string]int
	vocabSize int
	// longest is the most bytes of text one id covers (MinTokens); strips: an added token
	// takes the whitespace around it too, which no id bounds.
	longest int
	strips  bool
	// prefix and suffix are the post-processor's special tokens around a single sequence.
	prefix, suffix []int
	// specials are the added tokens marked special, in added_tokens order (Specials).
	specials []int
}

// Specials are the ids of the added tokens tokenizer.json marks special ("special": true):
// the ones Hugging Face's decode(skip_special_tokens=True), and so vLLM's generated text by
// default, leaves out (Llama 3's header tokens, Qwen's <|im_end|>; not Qwen3's <think>, an
// added token that is not special).
func (t *Tokenizer) Specials() []int { return t.specials }

// Load reads a tokenizer.json file.
func Load(path string) (*Tokenizer, error) {
	data, err := input.Read(path, input.Tokenizer)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	t, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return t, nil
}

// file is the part of tokenizer.json that is read; fields that only matter for offsets or
// batch padding are not. The post-processor is read for Special (Encode adds no special
// tokens).
type file struct {
	Truncation    json.RawMessage `json:"truncation"`
	PostProcessor json.RawMessage `json:"post_processor"`
	AddedTokens   []addedJSON     `json:"added_tokens"`
	Normalizer    json.RawMessage `json:"normalizer"`
	PreTokenizer  json.RawMessage `json:"pre_tokenizer"`
	Decoder       json.RawMessage `json:"decoder"`
	Model         modelJSON       `json:"model"`
}

type addedJSON struct {
	ID         int    `json:"id"`
	Content    string `json:"content"`
	SingleWord bool   `json:"single_word"`
	LStrip     bool   `json:"lstrip"`
	RStrip     bool   `json:"rstrip"`
	Normalized bool   `json:"normalized"`
	Special    bool   `json:"special"`
}

type modelJSON struct {
	Type                    string         `json:"type"`
	Dropout                 *float64       `json:"dropout"`
	ContinuingSubwordPrefix *string        `json:"continuing_subword_prefix"`
	EndOfWordSuffix         *string        `json:"end_of_word_suffix"`
	ByteFallback            bool           `json:"byte_fallback"`
	IgnoreMerges            bool           `json:"ignore_merges"`
	Vocab                   map[string]int `json:"vocab"`
	Merges                  []mergeJSON    `json:"merges"`
}

// mergeJSON is one merge, written either as "a b" (older files, Llama 3) or ["a", "b"] (Qwen).
type mergeJSON [2]string

func (m *mergeJSON) UnmarshalJSON(data []byte) error {
	if len(data) > 0 && data[0] == '"' {
		var s string
		if err := json.Unmarshal(data, &s); err != nil {
			return err
		}
		a, b, ok := strings.Cut(s, " ")
		if !ok || strings.Contains(b, " ") {
			return fmt.Errorf("merge %q is not two tokens separated by a space", s)
		}
		*m = mergeJSON{a, b}
		return nil
	}
	var pair []string
	if err := json.Unmarshal(data, &pair); err != nil {
		return fmt.Errorf("merge %s: %w", data, err)
	}
	if len(pair) != 2 {
		return fmt.Errorf("merge %s is not a pair", data)
	}
	*m = mergeJSON{pair[0], pair[1]}
	return nil
}

// component is a normalizer, pre-tokenizer or decoder; only the fields read here are listed.
type component struct {
	Type          string            `json:"type"`
	Pretokenizers []json.RawMessage `json:"pretokenizers"`
	Pattern       struct {
		Regex *string `json:"Regex"`
	} `json:"pattern"`
	Behavior       string `json:"behavior"`
	Invert         bool   `json:"invert"`
	AddPrefixSpace bool   `json:"add_prefix_space"`
	UseRegex       *bool  `json:"use_regex"`
}

func parseComponent(raw json.RawMessage) (*component, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var c component
	if err := json.Unmarshal(raw, &c); err != nil {
		return nil, err
	}
	return &c, nil
}

// maxTokenID bounds ids so that a corrupt file cannot make Parse allocate without limit;
// real vocabularies are well under a million.
const maxTokenID = 1 << 24

const supportedPreTokenizer = "Sequence[Split(Llama 3 or Qwen2 regex, Isolated), ByteLevel(add_prefix_space false, use_regex false)]"

// Parse reads the contents of a tokenizer.json file.
func Parse(data []byte) (*Tokenizer, error) {
	var f file
	if err := json.Unmarshal(data, &f); err != nil {
		return nil, fmt.Errorf("tokenizer.json: %w", err)
	}
	t := &Tokenizer{}
	if err := t.parseModel(&f.Model); err != nil {
		return nil, fmt.Errorf("model: %w", err)
	}
	if err := t.parseNormalizer(f.Normalizer); err != nil {
		return nil, fmt.Errorf("normalizer: %w", err)
	}
	if err := t.parsePreTokenizer(f.PreTokenizer); err != nil {
		return nil, fmt.Errorf("pre_tokenizer: %w", err)
	}
	if err := parseDecoder(f.Decoder); err != nil {
		return nil, fmt.Errorf("decoder: %w", err)
	}
	if len(f.Truncation) > 0 && string(f.Truncation) != "null" {
		return nil, fmt.Errorf("truncation is not supported; it must be null")
	}
	if err := t.parseAdded(f.AddedTokens); err != nil {
		return nil, fmt.Errorf("added_tokens: %w", err)
	}
	var err error
	if t.prefix, t.suffix, err = parsePost(f.PostProcessor); err != nil {
		return nil, fmt.Errorf("post_processor: %w", err)
	}
	return t, nil
}

func (t *Tokenizer) parseModel(m *modelJSON) error {
	switch {
	case m.Type != "BPE":
		return fmt.Errorf("type %q is not supported; supported: BPE", m.Type)
	case m.Dropout != nil && *m.Dropout != 0:
		return fmt.Errorf("dropout %g is not supported; it must be null", *m.Dropout)
	case m.ContinuingSubwordPrefix != nil && *m.ContinuingSubwordPrefix != "":
		return fmt.Errorf("continuing_subword_prefix %q is not supported", *m.ContinuingSubwordPrefix)
	case m.EndOfWordSuffix != nil && *m.EndOfWordSuffix != "":
		return fmt.Errorf("end_of_word_suffix %q is not supported", *m.EndOfWordSuffix)
	case m.ByteFallback:
		return fmt.Errorf("byte_fallback is not supported (it belongs to SentencePiece-style BPE, not byte-level)")
	}
	b := &t.model
	b.ignoreMerges = m.IgnoreMerges
	b.vocab = make(map[string]int32, len(m.Vocab))
	t.tokens = make(map[string]int, len(m.Vocab))
	maxID := -1
	for tok, id := range m.Vocab {
		if id < 0 || id > maxTokenID {
			return fmt.Errorf("vocab: token %q has id %d out of range", tok, id)
		}
		maxID = max(maxID, id)
	}
	t.idBytes = make([][]byte, maxID+1)
	for tok, id := range m.Vocab {
		if t.idBytes[id] != nil {
			return fmt.Errorf("vocab: id %d is given to two tokens", id)
		}
		bytes, ok := unspell(tok)
		t.idBytes[id] = bytes
		t.longest = max(t.longest, len(bytes))
		t.tokens[tok] = id
		// A token with a char outside the byte-level alphabet can never come out of merging
		// bytes; it is only decoded.
		if ok {
			b.vocab[string(bytes)] = int32(id)
		}
	}
	for c := 0; c < 256; c++ {
		id, ok := b.vocab[string([]byte{byte(c)})]
		if !ok {
			return fmt.Errorf("vocab: no token for byte 0x%02x (%q); a byte-level vocab has all 256", c, byteChars[c])
		}
		b.byteID[c] = id
	}
	b.merges = make(map[uint64]merge, len(m.Merges))
	for rank, mg := range m.Merges {
		a, okA := m.Vocab[mg[0]]
		c, okC := m.Vocab[mg[1]]
		id, okID := m.Vocab[mg[0]+mg[1]]
		if !okA || !okC || !okID {
			return fmt.Errorf("merges[%d] %q %q: token not in vocab", rank, mg[0], mg[1])
		}
		// A repeated pair keeps its last rank, as in HF's map built from the list.
		b.merges[pairKey(int32(a), int32(c))] = merge{rank: int32(rank), id: int32(id)}
	}
	t.vocabSize = len(t.idBytes)
	return nil
}

func (t *Tokenizer) parseNormalizer(raw json.RawMessage) error {
	c, err := parseComponent(raw)
	if err != nil || c == nil {
		return err
	}
	if c.Type != "NFC" {
		return fmt.Errorf("type %s is not supported; supported: null, NFC", c.Type)
	}
	t.nfc = true
	return nil
}

func (t *Tokenizer) parsePreTokenizer(raw json.RawMessage) error {
	c, err := parseComponent(raw)
	if err != nil {
		return err
	}
	if c == nil {
		return fmt.Errorf("null is not supported; supported: %s", supportedPreTokenizer)
	}
	if c.Type != "Sequence" {
		return fmt.Errorf("type %s is not supported; supported: %s", c.Type, supportedPreTokenizer)
	}
	if len(c.Pretokenizers) != 2 {
		return fmt.Errorf("a Sequence of %d pre-tokenizers is not supported; supported: %s", len(c.Pretokenizers), supportedPreTokenizer)
	}
	split, err := parseComponent(c.Pretokenizers[0])
	if err != nil {
		return fmt.Errorf("pretokenizers[0]: %w", err)
	}
	switch {
	case split == nil || split.Type != "Split":
		return fmt.Errorf("pretokenizers[0] must be Split; supported: %s", supportedPreTokenizer)
	case split.Pattern.Regex == nil:
		return fmt.Errorf("pre_tokenizer Split: only a Regex pattern is supported")
	case split.Behavior != "Isolated" || split.Invert:
		return fmt.Errorf("pre_tokenizer Split: behavior %s (invert %v) is not supported; supported: Isolated, invert false", split.Behavior, split.Invert)
	}
	if t.split, err = splitterFor(*split.Pattern.Regex); err != nil {
		return fmt.Errorf("pre_tokenizer Split: %w", err)
	}
	bl, err := parseComponent(c.Pretokenizers[1])
	if err != nil {
		return fmt.Errorf("pretokenizers[1]: %w", err)
	}
	switch {
	case bl == nil || bl.Type != "ByteLevel":
		return fmt.Errorf("pretokenizers[1] must be ByteLevel; supported: %s", supportedPreTokenizer)
	case bl.AddPrefixSpace:
		return fmt.Errorf("ByteLevel: add_prefix_space true is not supported")
	case bl.UseRegex == nil || *bl.UseRegex:
		return fmt.Errorf("ByteLevel: use_regex true after a Split is not supported")
	}
	return nil
}

// parseDecoder checks for the ByteLevel decoder, whose options change nothing when decoding.
func parseDecoder(raw json.RawMessage) error {
	c, err := parseComponent(raw)
	if err != nil {
		return err
	}
	if c == nil || c.Type != "ByteLevel" {
		typ := "null"
		if c != nil {
			typ = c.Type
		}
		return fmt.Errorf("type %s is not supported; supported: ByteLevel", typ)
	}
	return nil
}

func (t *Tokenizer) parseAdded(tokens []addedJSON) error {
	var raw, norm []addedToken
	for i, a := range tokens {
		switch {
		case a.ID < 0 || a.ID > maxTokenID:
			return fmt.Errorf("%d (%q): id %d out of range", i, a.Content, a.ID)
		case a.Content == "":
			continue // HF ignores empty added tokens
		}
		t.tokens[a.Content] = a.ID
		if a.Special {
			t.specials = append(t.specials, a.ID)
		}
		t.longest = max(t.longest, len(a.Content))
		t.strips = t.strips || a.LStrip || a.RStrip
		if a.ID >= len(t.idBytes) {
			t.idBytes = append(t.idBytes, make([][]byte, a.ID+1-len(t.idBytes))...)
		}
		// The ByteLevel decoder treats an added token like any other token.
		t.idBytes[a.ID], _ = unspell(a.Content)
		if a.Normalized {
			content := a.Content
			if t.nfc {
				content = nfc(content)
			}
			norm = append(norm, addedToken{content, a.ID, a.SingleWord, a.LStrip, a.RStrip})
		} else {
			raw = append(raw, addedToken{a.Content, a.ID, a.SingleWord, a.LStrip, a.RStrip})
		}
	}
	t.raw = newAddedSplitter(raw)
	t.norm = newAddedSplitter(norm)
	t.vocabSize = len(t.idBytes)
	return nil
}

// nfcShrink bounds how many times shorter NFC makes a text: a canonical composition replaces
// at most 4 code points (of at most 4 bytes each) by one of at least 2 bytes.
const nfcShrink = 8

// MinTokens is a lower bound on len(Encode(text)) from text's length alone, so that a prompt
// too long for a model is refused before its encoding is paid for (seconds for a few MB):
// every id covers at most the longest token's bytes of the text, once invalid UTF-8 is
// replaced as Encode does (a run of bad bytes by one U+FFFD) and NFC (where the tokenizer
// normalizes) has shortened it at most nfcShrink times. 0, no bound, where an added token
// takes the whitespace around it, which no id then covers.
func (t *Tokenizer) MinTokens(text string) int {
	if t.strips || t.longest == 0 {
		return 0
	}
	if !utf8.ValidString(text) {
		text = strings.ToValidUTF8(text, "\uFFFD")
	}
	per := t.longest
	if t.nfc {
		per *= nfcShrink
	}
	return (len(text) + per - 1) / per
}

// VocabSize is one more than the largest id, counting the added tokens: every id Encode
// returns is below it. (A checkpoint's embedding table is often larger, padded.)
func (t *Tokenizer) VocabSize() int { return t.vocabSize }

// TokenID returns the id of a token as tokenizer.json spells it: an added token's content
// ("<|eot_id|>") or a vocab entry in byte-level spelling ("Ġthe").
func (t *Tokenizer) TokenID(s string) (int, bool) {
	id, ok := t.tokens[s]
	return id, ok
}

// Encode returns the ids of text without adding any special token. Added tokens written in
// the text (such as "<|eot_id|>") are matched as themselves. Invalid UTF-8, which HF cannot
// be given, is first replaced by U+FFFD, one per run of bad bytes.
func (t *Tokenizer) Encode(text string) []int {
	if !utf8.ValidString(text) {
		text = strings.ToValidUTF8(text, "\uFFFD")
	}
	var ids []int
	var sc bpeScratch
	t.raw.split(text, func(piece string, id int) {
		if id >= 0 {
			ids = append(ids, id)
			return
		}
		if t.nfc {
			piece = nfc(piece)
		}
		t.norm.split(piece, func(piece string, id int) {
			if id >= 0 {
				ids = append(ids, id)
				return
			}
			t.split.split(piece, func(word string) {
				ids = t.model.encode(word, ids, &sc)
			})
		})
	})
	return ids
}
