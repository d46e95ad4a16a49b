package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"xmix/bundle"
	"xmix/compile"
	"xmix/loader"
	"xmix/specs"
)

// tinySession builds the embedded tiny model with its two demo apps (and the app specs
// extra, if any), writes the bundle and opens it on the CPU, as `xmix serve` would.
func tinySession(t *testing.T, extra ...string) *session {
	t.Helper()
	dir := t.TempDir()
	if err := specs.Extract(dir); err != nil {
		t.Fatal(err)
	}
	apps := []string{filepath.Join(dir, specs.Default.Steer), filepath.Join(dir, specs.Default.Probe)}
	for i, a := range extra {
		p := filepath.Join(dir, fmt.Sprintf("extra%d.yaml", i))
		if err := os.WriteFile(p, []byte(a), 0o644); err != nil {
			t.Fatal(err)
		}
		apps = append(apps, p)
	}
	b, err := compile.Build(filepath.Join(dir, specs.Default.Model), apps, compile.Options{EmbedWeights: true})
	if err != nil {
		t.Fatal(err)
	}
	raw, err := bundle.Marshal(b)
	if err != nil {
		t.Fatal(err)
	}
	bp := filepath.Join(dir, "tiny.xmb")
	if err := os.WriteFile(bp, raw, 0o644); err != nil {
		t.Fatal(err)
	}
	b, err = bundle.ReadFile(bp)
	if err != nil {
		t.Fatal(err)
	}
	s, err := open(b, dir, runFlags{backend: "cpu", quiet: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.be.Close() })
	return s
}

// startServer runs serve on a loopback port; the cleanup shuts it down gracefully and
// checks that it stopped cleanly.
func startServer(t *testing.T, s *session) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- serve(ctx, s, ln, 10*time.Second) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("serve: %v", err)
			}
		case <-time.After(20 * time.Second):
			t.Error("serve did not return after its context ended")
		}
	})
	return "http://" + ln.Addr().String()
}

var client = &http.Client{Timeout: 60 * time.Second}

func post(t *testing.T, url, body string) (int, []byte) {
	t.Helper()
	resp, err := client.Post(url+"/v1/generate", "application/json", strings.NewReader(body))
	if err != nil {
		t.Error(err)
		return 0, nil
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Error(err)
	}
	return resp.StatusCode, data
}

type servedCase struct {
	body string
	req  loader.Request
}

func servedCases(s *session) []servedCase {
	enc := s.tok.Encode
	return []servedCase{
		{`{"prompt": "Once upon a time", "max_tokens": 12}`,
			loader.Request{Prompt: enc("Once upon a time"), MaxTokens: 12, TopP: 1}},
		{`{"prompt": "Once upon a time", "max_tokens": 12, "apps": ["tiny-steer"], "set": {"tiny-steer.op0.alpha": 20}}`,
			loader.Request{Prompt: enc("Once upon a time"), MaxTokens: 12, TopP: 1, Apps: []string{"tiny-steer"},
				Overrides: map[string]float32{"tiny-steer.op0.alpha": 20}}},
		{`{"prompt": "The old man", "max_tokens": 10, "apps": ["tiny-probe"], "temperature": 0.8, "top_p": 0.9, "seed": 7}`,
			loader.Request{Prompt: enc("The old man"), MaxTokens: 10, Apps: []string{"tiny-probe"}, Temperature: 0.8, TopP: 0.9, Seed: 7}},
		{`{"prompt": "Tom was sad.", "max_tokens": 8, "apps": ["tiny-steer", "tiny-probe"]}`,
			loader.Request{Prompt: enc("Tom was sad."), MaxTokens: 8, TopP: 1, Apps: []string{"tiny-steer", "tiny-probe"}}},
	}
}

// alone runs each case through the engine by itself, before the server owns the engine.
func alone(t *testing.T, s *session, cases []servedCase) []loader.Result {
	t.Helper()
	want := make([]loader.Result, len(cases))
	for i, c := range cases {
		res, err := s.eng.Generate([]loader.Request{c.req})
		if err != nil {
			t.Fatal(err)
		}
		want[i] = res[0]
	}
	return want
}

func TestServeConcurrentRequestsMatchGenerateAlone(t *testing.T) {
	s := tinySession(t)
	cases := servedCases(s)
	want := alone(t, s, cases)
	if slices.Equal(want[0].Tokens, want[1].Tokens) {
		t.Fatal("the steered request generates what the plain one does; the test would prove nothing")
	}
	url := startServer(t, s)
	got := make([]generateResponse, len(cases))
	var wg sync.WaitGroup
	for i, c := range cases {
		wg.Add(1)
		go func() {
			defer wg.Done()
			code, body := post(t, url, c.body)
			if code != http.StatusOK {
				t.Errorf("case %d: status %d: %s", i, code, body)
				return
			}
			if err := json.Unmarshal(body, &got[i]); err != nil {
				t.Errorf("case %d: %v: %s", i, err, body)
			}
		}()
	}
	wg.Wait()
	for i, w := range want {
		g := got[i]
		if !slices.Equal(g.Tokens, w.Tokens) || g.Reason != w.Reason || g.Text != s.tok.Decode(w.Tokens) {
			t.Errorf("case %d: served %v %q (%s), alone %v (%s)", i, g.Tokens, g.Text, g.Reason, w.Tokens, w.Reason)
			continue
		}
		if len(g.Rows) != len(w.Rows) {
			t.Errorf("case %d: %d rows served, %d alone", i, len(g.Rows), len(w.Rows))
			continue
		}
		for k, r := range w.Rows {
			gr := g.Rows[k]
			if gr.Pos != r.Pos || gr.Token != r.Token || len(gr.Exports) != len(r.Exports) {
				t.Errorf("case %d row %d: served %+v, alone %+v", i, k, gr, r)
				break
			}
			for _, x := range r.Exports {
				name, v := x.Name, x.Values
				if !closeTo(gr.Exports.Get(name), v) {
					t.Errorf("case %d row %d export %s: served %v, alone %v", i, k, name, gr.Exports.Get(name), v)
				}
			}
		}
	}
	if len(got[2].Rows) == 0 || len(got[2].Rows[0].Exports.Get("tiny-probe.happy")) != 1 {
		t.Errorf("the probe request has no probe scores: %+v", got[2].Rows)
	}
}

// closeTo: reads agree up to the rounding that a different batch composition (another
// decode bucket, other rows beside) may bring; the tokens themselves must be identical.
func closeTo(a, b []float32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if d := math.Abs(float64(a[i] - b[i])); d > 1e-4*max(1, math.Abs(float64(b[i]))) {
			return false
		}
	}
	return true
}

func TestServeStreamYieldsTheSameTokens(t *testing.T) {
	s := tinySession(t)
	cases := servedCases(s)
	want := alone(t, s, cases)
	url := startServer(t, s)
	for i, c := range cases {
		body := strings.TrimSuffix(c.body, "}") + `, "stream": true}`
		code, data := post(t, url, body)
		if code != http.StatusOK {
			t.Fatalf("case %d: status %d: %s", i, code, data)
		}
		var toks []int
		var text strings.Builder
		var end *streamEnd
		sc := bufio.NewScanner(bytes.NewReader(data))
		for sc.Scan() {
			if end != nil {
				t.Fatalf("case %d: a line after the end: %s", i, sc.Text())
			}
			if strings.Contains(sc.Text(), `"done"`) {
				end = &streamEnd{}
				if err := json.Unmarshal(sc.Bytes(), end); err != nil {
					t.Fatal(err)
				}
				continue
			}
			var st streamToken
			if err := json.Unmarshal(sc.Bytes(), &st); err != nil {
				t.Fatalf("case %d: %v: %s", i, err, sc.Text())
			}
			// Token k is sampled at the row of position len(prompt)+k (BOS at 0).
			if wantPos := len(c.req.Prompt) + len(toks); st.Pos != wantPos {
				t.Errorf("case %d token %d: pos %d, want %d", i, len(toks), st.Pos, wantPos)
			}
			if slices.Contains(c.req.Apps, "tiny-probe") && len(st.Exports.Get("tiny-probe.happy")) != 1 {
				t.Errorf("case %d token %d: no probe score: %s", i, len(toks), sc.Text())
			}
			toks = append(toks, st.Token)
			text.WriteString(st.Text)
		}
		if end == nil || !end.Done {
			t.Fatalf("case %d: the stream has no end line:\n%s", i, data)
		}
		if !slices.Equal(toks, want[i].Tokens) || !slices.Equal(end.Tokens, want[i].Tokens) || end.Reason != want[i].Reason {
			t.Errorf("case %d: streamed %v, end %v (%s); alone %v (%s)", i, toks, end.Tokens, end.Reason, want[i].Tokens, want[i].Reason)
		}
		if wantText := strings.ToValidUTF8(s.tok.Decode(want[i].Tokens), "\uFFFD"); text.String() != wantText {
			t.Errorf("case %d: streamed text %q, want %q", i, text.String(), wantText)
		}
	}
}

func TestServeRejectsBadRequestsAndKeepsServing(t *testing.T) {
	s := tinySession(t)
	url := startServer(t, s)
	good := `{"prompt": "Once", "max_tokens": 3}`
	for _, c := range []struct{ body, want string }{
		{`{"prompt": "x"`, "request body"},
		{`{"prompt": "x"} {}`, "data after"},
		{`{"prompt": "x", "bogus": 1}`, `unknown field "bogus"`},
		{`{"prompt": 7}`, "request body"},
		{`{"prompt": "x", "apps": ["nope"]}`, `app "nope" is not deployed`},
		{fmt.Sprintf(`{"prompt": %q}`, strings.Repeat("a", 600)), "max_seq_len"},
		{`{"prompt": "x", "max_tokens": 0}`, "max_tokens 0"},
		{`{"prompt": "x", "max_tokens": -3}`, "max_tokens -3"},
		{`{"prompt": "x", "top_p": 1.5}`, "top_p"},
		{`{"prompt": "x", "apps": ["tiny-steer"], "set": {"tiny-steer.op0.nope": 1}}`, `override "tiny-steer.op0.nope"`},
		{`{"prompt": "x", "stream": true, "apps": ["nope"]}`, `app "nope"`},
	} {
		code, data := post(t, url, c.body)
		var e struct{ Error string }
		json.Unmarshal(data, &e)
		if code != http.StatusBadRequest || !strings.Contains(e.Error, c.want) {
			t.Errorf("%s: status %d %s, want 400 naming %q", c.body, code, data, c.want)
		}
		code, data = post(t, url, good)
		var r generateResponse
		if code != http.StatusOK || json.Unmarshal(data, &r) != nil || len(r.Tokens) != 3 {
			t.Fatalf("after %s: good request got %d %s", c.body, code, data)
		}
	}
}

func TestServeAppsAndHealth(t *testing.T) {
	s := tinySession(t)
	url := startServer(t, s)
	resp, err := client.Get(url + "/v1/apps")
	if err != nil {
		t.Fatal(err)
	}
	var apps struct {
		Apps []appInfo `json:"apps"`
	}
	err = json.NewDecoder(resp.Body).Decode(&apps)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]appInfo{}
	for _, a := range apps.Apps {
		byName[a.Name] = a
	}
	if _, ok := byName["tiny-steer"].Scalars["tiny-steer.op0.alpha"]; !ok {
		t.Errorf("tiny-steer lacks its alpha: %+v", apps)
	}
	if ex := byName["tiny-probe"].Exports; len(ex) != 1 || ex[0].Name != "tiny-probe.happy" || ex[0].Width != 1 {
		t.Errorf("tiny-probe exports %+v", ex)
	}
	resp, err = client.Get(url + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("healthz: %d", resp.StatusCode)
	}
	resp, err = client.Get(url + "/v1/generate")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("GET /v1/generate: %d", resp.StatusCode)
	}
}

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

// TestServeShutdownFinishesInFlightRequests cancels the server while a streamed request is
// running: the request still completes, and serve returns cleanly.
func TestServeShutdownFinishesInFlightRequests(t *testing.T) {
	s := tinySession(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- serve(ctx, s, ln, 30*time.Second) }()
	url := "http://" + ln.Addr().String()
	resp, err := client.Post(url+"/v1/generate", "application/json",
		strings.NewReader(`{"prompt": "Once", "max_tokens": 120, "stream": true}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	if !sc.Scan() {
		t.Fatalf("no first token: %v", sc.Err())
	}
	cancel()
	lines := 1
	var last string
	for sc.Scan() {
		lines++
		last = sc.Text()
	}
	var end streamEnd
	if err := json.Unmarshal([]byte(last), &end); err != nil || !end.Done || len(end.Tokens) != lines-1 {
		t.Fatalf("after shutdown began: %d lines, last %q (%v)", lines, last, err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("serve: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("serve did not return")
	}
	if _, err := client.Get(url + "/healthz"); err == nil {
		t.Fatal("the server still answers after shutdown")
	}
}
