package tokenizer

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"unicode/utf8"
)

// The parity data is made by testdata/gen/gen.mjs with @lenml/tokenizers; see there to rerun.
var testNames = []string{"llama3_1", "qwen3"}

var loaded sync.Map // name -> func() (*Tokenizer, error), each parsed once per test binary

func testTokenizer(tb testing.TB, name string) *Tokenizer {
	tb.Helper()
	f, _ := loaded.LoadOrStore(name, sync.OnceValues(func() (*Tokenizer, error) {
		data, err := gunzipFile(filepath.Join("testdata", name+".tokenizer.json.gz"))
		if err != nil {
			return nil, err
		}
		return Parse(data)
	}))
	t, err := f.(func() (*Tokenizer, error))()
	if err != nil {
		tb.Fatalf("%s: %v", name, err)
	}
	return t
}

func gunzipFile(path string) ([]byte, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	zr, err := gzip.NewReader(bytes.NewReader(raw))
	if err != nil {
		return nil, err
	}
	return io.ReadAll(zr)
}

func readJSON(tb testing.TB, path string, v any) {
	tb.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		tb.Fatal(err)
	}
	if err := json.Unmarshal(data, v); err != nil {
		tb.Fatalf("%s: %v", path, err)
	}
}

func corpus(tb testing.TB) []string {
	var lines []string
	readJSON(tb, "testdata/corpus.json", &lines)
	return lines
}

func TestParity(t *testing.T) {
	lines := corpus(t)
	var want map[string][][]int
	readJSON(t, "testdata/expected.json", &want)
	for _, name := range testNames {
		t.Run(name, func(t *testing.T) {
			tok := testTokenizer(t, name)
			if len(want[name]) != len(lines) {
				t.Fatalf("expected.json has %d lines for %s, corpus.json %d", len(want[name]), name, len(lines))
			}
			bad := 0
			for i, line := range lines {
				got := tok.Encode(line)
				if !slices.Equal(got, want[name][i]) {
					if bad++; bad <= 5 {
						t.Errorf("line %d %q:\n got %v\nwant %v\n got %q\nwant %q", i, line, got, want[name][i],
							tokenTexts(tok, got), tokenTexts(tok, want[name][i]))
					}
				}
			}
			if bad > 0 {
				t.Errorf("%d of %d lines differ", bad, len(lines))
			}
		})
	}
}

func tokenTexts(tok *Tokenizer, ids []int) []string {
	out := make([]string, len(ids))
	for i, id := range ids {
		out[i] = string(tok.bytesOf(id))
	}
	return out
}

func TestRoundTrip(t *testing.T) {
	lines := corpus(t)
	for _, name := range testNames {
		tok := testTokenizer(t, name)
		for i, line := range lines {
			want := line
			if tok.nfc {
				want = nfc(line)
			}
			if got := tok.Decode(tok.Encode(line)); got != want {
				t.Errorf("%s line %d: Decode(Encode(%q)) = %q", name, i, line, got)
			}
		}
	}
}

func TestStreamingDecode(t *testing.T) {
	lines := corpus(t)
	for _, name := range testNames {
		tok := testTokenizer(t, name)
		for i, line := range lines {
			ids := tok.Encode(line)
			checkStream(t, tok, ids, name, i)
		}
	}
}

// checkStream decodes ids one at a time and compares with decoding them all at once.
func checkStream(t *testing.T, tok *Tokenizer, ids []int, name string, line int) {
	t.Helper()
	d := tok.NewDecoder()
	var got strings.Builder
	for _, id := range ids {
		s := d.Add(id)
		if !utf8.ValidString(s) {
			t.Fatalf("%s line %d: Add(%d) returned invalid UTF-8 %q", name, line, id, s)
		}
		got.WriteString(s)
	}
	got.WriteString(d.Flush())
	if want := tok.Decode(ids); got.String() != want {
		t.Errorf("%s line %d: streamed %q, Decode %q", name, line, got.String(), want)
	}
}

// TestStreamingInvalid streams the single-byte tokens of ill-formed UTF-8.
func TestStreamingInvalid(t *testing.T) {
	tok := testTokenizer(t, "llama3_1")
	inputs := [][]byte{
		{0x61, 0xF1, 0x80, 0x80, 0xE1, 0x80, 0xC2, 0x62, 0x80, 0x63, 0x80, 0xBF, 0x64},
		{0xE2, 0x82},
		{0xF0, 0x9F, 0x98},
		{0xED, 0xA0, 0x80},
		{0xC0, 0xAF, 0xFF, 0xFE},
		[]byte("héllo 😀")[:9],
	}
	for i, in := range inputs {
		var ids []int
		for _, c := range in {
			ids = append(ids, int(tok.model.byteID[c]))
		}
		checkStream(t, tok, ids, "invalid", i)
	}
}

func TestLossyUTF8(t *testing.T) {
	// Table 3-8 of the Unicode Standard: one U+FFFD per maximal subpart.
	for _, c := range []struct{ in, want string }{
		{"a\xF1\x80\x80\xE1\x80\xC2b\x80c\x80\xBFd", "a\uFFFD\uFFFD\uFFFDb\uFFFDc\uFFFD\uFFFDd"},
		{"\xE2\x82", "\uFFFD"},
		{"\xE2\x82x", "\uFFFDx"},
		{"\xF0\x80\x80", "\uFFFD\uFFFD\uFFFD"}, // F0 80 is never valid
		{"\xED\xA0\x80", "\uFFFD\uFFFD\uFFFD"}, // surrogates
		{"\xF4\x90\x80\x80", "\uFFFD\uFFFD\uFFFD\uFFFD"},
		{"ok \xE2\x82\xAC", "ok €"},
	} {
		if got, n := lossyUTF8([]byte(c.in), true); got != c.want || n != len(c.in) {
			t.Errorf("lossyUTF8(%q) = %q, %d; want %q", c.in, got, n, c.want)
		}
	}
	if got, n := lossyUTF8([]byte("ab\xF0\x9F\x98"), false); got != "ab" || n != 2 {
		t.Errorf("lossyUTF8 not final = %q, %d; want \"ab\", 2", got, n)
	}
}

func TestTokenID(t *testing.T) {
	for _, c := range []struct {
		name, token string
		id          int
	}{
		{"llama3_1", "<|begin_of_text|>", 128000},
		{"llama3_1", "<|eot_id|>", 128009},
		{"llama3_1", "Hello", 9906},
		{"llama3_1", "Ġworld", 1917},
		{"qwen3", "<|im_start|>", 151644},
		{"qwen3", "<|im_end|>", 151645},
		{"qwen3", "<think>", 151667},
	} {
		tok := testTokenizer(t, c.name)
		if id, ok := tok.TokenID(c.token); !ok || id != c.id {
			t.Errorf("%s TokenID(%q) = %d, %v; want %d", c.name, c.token, id, ok, c.id)
		}
	}
	if _, ok := testTokenizer(t, "llama3_1").TokenID("<|im_start|>"); ok {
		t.Error("llama3_1 has no <|im_start|>")
	}
	if got := testTokenizer(t, "llama3_1").VocabSize(); got != 128256 {
		t.Errorf("llama3_1 VocabSize = %d, want 128256", got)
	}
	if got := testTokenizer(t, "qwen3").VocabSize(); got != 151669 {
		t.Errorf("qwen3 VocabSize = %d, want 151669", got)
	}
}

func TestDecodeSkipsUnknownIDs(t *testing.T) {
	tok := testTokenizer(t, "llama3_1")
	if got := tok.Decode([]int{9906, -1, 1 << 40, 128256, 1917}); got != "Hello world" {
		t.Errorf("Decode = %q", got)
	}
	if got := tok.Decode([]int{128000, 9906, 128009}); got != "<|begin_of_text|>Hello<|eot_id|>" {
		t.Errorf("Decode with special tokens = %q", got)
	}
}

func TestLoad(t *testing.T) {
	data, err := gunzipFile("testdata/qwen3.tokenizer.json.gz")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "tokenizer.json")
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	tok, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if got := tok.Encode("<|im_start|>user"); !slices.Equal(got, []int{151644, 872}) {
		t.Errorf("Encode = %v", got)
	}
	if _, err := Load(filepath.Join(t.TempDir(), "missing.json")); err == nil {
		t.Error("Load of a missing file succeeded")
	}
}

// TestConcurrentEncode shares one Tokenizer (and its word cache) among goroutines.
func TestConcurrentEncode(t *testing.T) {
	lines := corpus(t)
	tok := testTokenizer(t, "qwen3")
	want := make([][]int, len(lines))
	for i, line := range lines {
		want[i] = tok.Encode(line)
	}
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range lines {
				i := (i + g*97) % len(lines)
				if got := tok.Encode(lines[i]); !slices.Equal(got, want[i]) {
					t.Errorf("goroutine %d line %d: %v, want %v", g, i, got, want[i])
				}
			}
		}()
	}
	wg.Wait()
}

// BenchmarkEncode runs on the whole corpus (many pathological lines: long words, random mixes)
// and on its ordinary English and code lines.
func BenchmarkEncode(b *testing.B) {
	lines := corpus(b)
	texts := map[string]string{
		"corpus": strings.Join(lines, "\n"),
		"prose":  strings.Repeat(strings.Join(lines[2:25], "\n"), 20),
	}
	for _, name := range testNames {
		for _, kind := range []string{"corpus", "prose"} {
			b.Run(name+"/"+kind, func(b *testing.B) {
				tok := testTokenizer(b, name)
				text := texts[kind]
				b.SetBytes(int64(len(text)))
				for b.Loop() {
					tok.Encode(text)
				}
			})
		}
	}
}

func BenchmarkParse(b *testing.B) {
	data, err := gunzipFile("testdata/llama3_1.tokenizer.json.gz")
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if _, err := Parse(data); err != nil {
			b.Fatal(err)
		}
	}
}

// FuzzRoundTrip: for any valid UTF-8 text, decoding the ids gives back the (normalized) text,
// streaming gives the same, and MinTokens is no more than the ids. Run with go test -fuzz
// FuzzRoundTrip.
func FuzzRoundTrip(f *testing.F) {
	for _, s := range []string{"", "Hello, world!", "  \n\t x", "e\u0301\u0323", "<|eot_id|><|im_end|>", "'S'LL 123456 漢字 👍🏽"} {
		f.Add(s)
	}
	// Loaded before fuzzing starts: with coverage instrumentation, loading the two tokenizers
	// inside the first input took over 10 s here, and go test -fuzz reported the worker hung.
	for _, name := range testNames {
		testTokenizer(f, name)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if !utf8.ValidString(s) {
			t.Skip()
		}
		for _, name := range testNames {
			tok := testTokenizer(t, name)
			want := s
			if tok.nfc {
				want = nfc(s)
				if again := nfc(want); again != want {
					t.Fatalf("nfc not idempotent on %+q: %+q then %+q", s, want, again)
				}
			}
			ids := tok.Encode(s)
			if got := tok.Decode(ids); got != want {
				t.Fatalf("%s: Decode(Encode(%+q)) = %+q", name, s, got)
			}
			if lo := tok.MinTokens(s); lo > len(ids) {
				t.Fatalf("%s: MinTokens(%+q) = %d, above the %d ids Encode gives", name, s, lo, len(ids))
			}
			checkStream(t, tok, ids, name, 0)
		}
	})
}

func TestEncodeInvalidUTF8(t *testing.T) {
	for _, name := range testNames {
		tok := testTokenizer(t, name)
		if got, want := tok.Encode("a\xff\xfeb\xc3"), tok.Encode("a\uFFFDb\uFFFD"); !slices.Equal(got, want) {
			t.Errorf("%s: Encode of invalid UTF-8 = %v, want %v", name, got, want)
		}
	}
}

// TestMinTokens: the bound from length alone never exceeds what Encode gives, over the parity
// corpus and texts built to break it (a run of invalid bytes that becomes one U+FFFD, Hangul
// jamo that NFC composes three to one, the longest tokens back to back, added tokens); it is
// the text's bytes over the longest token's; an added token that strips whitespace leaves no
// bound.
func TestMinTokens(t *testing.T) {
	for _, name := range testNames {
		tok := testTokenizer(t, name)
		var longest string
		for id, b := range tok.idBytes {
			if len(b) == tok.longest && id < len(tok.idBytes) {
				longest = string(b)
			}
		}
		texts := append(corpus(t), "\xff\xfe\xfd"+strings.Repeat("\x80", 1000), strings.Repeat("\u1100\u1161\u11a8", 2000),
			strings.Repeat(longest, 50), strings.Repeat("<|endoftext|><|im_start|><|eot_id|>", 100), "é\u0301 漢字", "")
		for _, s := range texts {
			if lo, n := tok.MinTokens(s), len(tok.Encode(s)); lo > n {
				t.Fatalf("%s: MinTokens(%.40q) = %d, but Encode gives %d ids", name, s, lo, n)
			}
		}
		per := tok.longest
		if tok.nfc {
			per *= nfcShrink
		}
		if got, want := tok.MinTokens(strings.Repeat("a", 8<<20)), (8<<20+per-1)/per; got != want || got <= 4096 {
			t.Errorf("%s: MinTokens of 8 MiB = %d, want %d (longest token %d bytes), past a context of 4096", name, got, want, tok.longest)
		}
	}
	f := miniFile()
	f["added_tokens"] = []any{map[string]any{"id": 258, "content": "<|end|>", "single_word": false, "lstrip": true, "rstrip": false, "normalized": false, "special": true}}
	data, err := json.Marshal(f)
	if err != nil {
		t.Fatal(err)
	}
	strip, err := Parse(data)
	if err != nil {
		t.Fatal(err)
	}
	if got := strip.MinTokens(strings.Repeat(" ", 1000) + "<|end|>"); got != 0 {
		t.Errorf("an added token that strips: MinTokens = %d, want 0 (%d ids)", got, len(strip.Encode(strings.Repeat(" ", 1000)+"<|end|>")))
	}
}

// TestSpecials: the added tokens marked special, and only those.
func TestSpecials(t *testing.T) {
	for _, c := range []struct {
		name     string
		special  []int // <|begin_of_text|>, <|start_header_id|>, <|eot_id|>; <|endoftext|>, <|im_end|>
		ordinary []int // 'a' (a vocabulary token); <think>, <tool_call> (added, not special)
	}{
		{"llama3_1", []int{128000, 128006, 128009}, []int{64}},
		{"qwen3", []int{151643, 151645}, []int{64, 151667, 151657}},
	} {
		sp := testTokenizer(t, c.name).Specials()
		for _, id := range c.special {
			if !slices.Contains(sp, id) {
				t.Errorf("%s: %d is not among the %d specials", c.name, id, len(sp))
			}
		}
		for _, id := range c.ordinary {
			if slices.Contains(sp, id) {
				t.Errorf("%s: %d is among the specials", c.name, id)
			}
		}
	}
}
