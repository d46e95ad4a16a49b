package serve

import (
	"bufio"
	"context"
	"net"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"xmix/loader"
)

// TestCumulativeDecoderHoldsPartialCharacters feeds the byte tokenizer a character at a
// time split into its bytes: every piece is valid UTF-8 and the pieces add up to the text.
func TestCumulativeDecoderHoldsPartialCharacters(t *testing.T) {
	tok := loader.ByteTokenizer{}
	const text = "a→é世😀b"
	d := newStreamDecoder(tok)
	var got strings.Builder
	for i, id := range tok.Encode(text) {
		piece := d.Add(id)
		if !utf8.ValidString(piece) {
			t.Fatalf("byte %d: invalid piece %q", i, piece)
		}
		if piece != "" && !utf8.RuneStart(text[i]) && i+1 < len(text) && !utf8.RuneStart(text[i+1]) {
			t.Fatalf("byte %d: emitted %q mid-character", i, piece)
		}
		got.WriteString(piece)
	}
	got.WriteString(d.Flush())
	if got.String() != text {
		t.Fatalf("pieces add up to %q, want %q", got.String(), text)
	}
	// A byte that no continuation can make valid is not held back; a dangling lead byte
	// comes out of Flush.
	d = newStreamDecoder(tok)
	if p := d.Add(0xFF) + d.Add('x'); p != "\uFFFDx" {
		t.Fatalf("invalid byte: %q", p)
	}
	if p := d.Add(0xE2); p != "" {
		t.Fatalf("lead byte emitted early: %q", p)
	}
	if p := d.Flush(); p != "\uFFFD" {
		t.Fatalf("flush: %q", p)
	}
}

// Shutting the server down while a streamed request runs lets the request finish; then
// Serve returns cleanly and the port is closed.
func TestShutdownFinishesInFlightRequests(t *testing.T) {
	sv := newTinyServer(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- sv.Serve(ctx, ln, 30*time.Second) }()
	url := "http://" + ln.Addr().String()
	resp, err := client.Post(url+"/v1/completions", "application/json",
		strings.NewReader(`{"prompt": "Once", "max_tokens": 120, "temperature": 0, "ignore_eos": false, "stream": true, "stream_options": {"include_usage": true}}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	if _, err := br.ReadString('\n'); err != nil {
		t.Fatalf("no first chunk: %v", err)
	}
	cancel()
	s := readStream(t, br)
	if !s.done || s.usage == nil || s.finish == "" || s.usage.CompletionTokens != s.chunks+1 {
		t.Fatalf("after shutdown began: %+v", s)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("serve: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("serve did not return")
	}
	if _, err := client.Get(url + "/health"); err == nil {
		t.Fatal("the server still answers after shutdown")
	}
}
