package serve

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"xmix/bundle"
	"xmix/compile"
	"xmix/loader"
	"xmix/loader/cpu"
	"xmix/specs"
)

// built is a bundle compiled once per test binary.
type built struct {
	once sync.Once
	data []byte // the marshalled bundle: each test reads its own copy
	err  error
}

var tiny, tinyPR, tinyBlowup built

// blowupApp scales the logits by 1e60 from the third generated token on: they overflow, so
// no token can be sampled there.
const blowupApp = `app: blowup
ops:
  - write: {at: {hook: logits}, kernel: scale, args: {alpha: 1e30}, when: {steps: {from: 2}}}
  - write: {at: {hook: logits}, kernel: scale, args: {alpha: 1e30}, when: {steps: {from: 2}}}
`

// tinyBlowupBundle is tiny with its demo apps and blowup.
func tinyBlowupBundle(t testing.TB) *bundle.Bundle {
	return tinyBlowup.get(t, map[string]string{"apps/blowup.yaml": blowupApp})
}

// tinyBundle is the embedded default model with its two demo apps (tiny-steer, tiny-probe),
// built once per test binary; every call returns a fresh copy to change freely.
func tinyBundle(t testing.TB) *bundle.Bundle { return tiny.get(t, nil) }

// tinyPRApp steers like tiny-steer, but its vector is per_request (a request may bring its
// own) and it sits at layers 2 and 3, of which a request may keep fewer.
const tinyPRApp = `app: tiny-pr
params:
  happy: {file: ../models/tiny/vectors.safetensors, tensor: happy_dir, per_request: true}
ops:
  - write: {at: {layers: [2, 3], hook: resid_post, per_request: true}, kernel: steer_add, args: {vector: happy, alpha: 8.0}}
`

// tinyPRBundle is tiny with its demo apps and tiny-pr.
func tinyPRBundle(t testing.TB) *bundle.Bundle {
	return tinyPR.get(t, map[string]string{"apps/tiny-pr.yaml": tinyPRApp})
}

// get builds the embedded model with its demo apps and the extra app specs (path under
// the extracted tree -> text) once, and returns a fresh copy.
func (c *built) get(t testing.TB, extra map[string]string) *bundle.Bundle {
	t.Helper()
	c.once.Do(func() {
		dir, err := os.MkdirTemp("", "xmix-serve-test-")
		if err != nil {
			c.err = err
			return
		}
		defer os.RemoveAll(dir)
		if c.err = specs.Extract(dir); c.err != nil {
			return
		}
		apps := []string{filepath.Join(dir, specs.Default.Steer), filepath.Join(dir, specs.Default.Probe)}
		for _, name := range sortedKeys(extra) {
			p := filepath.Join(dir, name)
			if c.err = os.WriteFile(p, []byte(extra[name]), 0o644); c.err != nil {
				return
			}
			apps = append(apps, p)
		}
		b, err := compile.Build(filepath.Join(dir, specs.Default.Model), apps, compile.Options{EmbedWeights: true})
		if err != nil {
			c.err = err
			return
		}
		c.data, c.err = bundle.Marshal(b)
	})
	if c.err != nil {
		t.Fatal(c.err)
	}
	b, err := bundle.Unmarshal(c.data)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// backendFor loads b on the CPU backend.
func backendFor(t testing.TB, b *bundle.Bundle) loader.Backend {
	t.Helper()
	w, err := loader.OpenWeights(b, "")
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	be, err := cpu.New(b, w, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { be.Close() })
	return be
}

// newTinyServer is a Server on the tiny bundle's CPU engine, not yet serving.
func newTinyServer(t testing.TB) *Server {
	t.Helper()
	b := tinyBundle(t)
	eng, tok := engineFor(t, b)
	sv, err := New(Config{Bundle: b, Engine: eng, Tokenizer: tok})
	if err != nil {
		t.Fatal(err)
	}
	return sv
}

// engineFor loads b on the CPU backend.
func engineFor(t testing.TB, b *bundle.Bundle) (*loader.Engine, loader.Tokenizer) {
	t.Helper()
	return engineOn(t, b, backendFor(t, b))
}

// engineOn runs b's engine on be.
func engineOn(t testing.TB, b *bundle.Bundle, be loader.Backend) (*loader.Engine, loader.Tokenizer) {
	t.Helper()
	eng, err := loader.NewEngine(b, be)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := loader.NewTokenizer(b)
	if err != nil {
		t.Fatal(err)
	}
	return eng, tok
}

// testServer is a Server on a loopback port with an engine of its own.
type testServer struct {
	*Server
	url string
	log *syncBuffer
}

// startServer serves b (nil: tiny) on a loopback port; edit adjusts the config. The cleanup
// shuts it down gracefully and checks that it stopped cleanly.
func startServer(t testing.TB, b *bundle.Bundle, edit func(*Config)) *testServer {
	t.Helper()
	if b == nil {
		b = tinyBundle(t)
	}
	eng, tok := engineFor(t, b)
	log := &syncBuffer{}
	cfg := Config{Bundle: b, Engine: eng, Tokenizer: tok, RequestLog: log,
		Logf: func(format string, a ...any) { log.printf(format+"\n", a...) }}
	if edit != nil {
		edit(&cfg)
	}
	sv, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sv.Serve(ctx, ln, 10*time.Second) }()
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
	return &testServer{Server: sv, url: "http://" + ln.Addr().String(), log: log}
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) printf(format string, a ...any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	fmt.Fprintf(&s.b, format, a...)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

var client = &http.Client{Timeout: 60 * time.Second}

// do sends a request and returns its status and body.
func do(t testing.TB, method, url, body string, header ...string) (int, http.Header, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Error(err)
		return 0, nil, nil
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Error(err)
	}
	return resp.StatusCode, resp.Header, data
}

func post(t testing.TB, url, body string) (int, []byte) {
	t.Helper()
	code, _, data := do(t, "POST", url, body)
	return code, data
}

// completion is a non-streamed response of either endpoint, as a client reads it.
type completion struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Model   string `json:"model"`
	Choices []struct {
		Text    string `json:"text"`
		Message struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"message"`
		FinishReason string          `json:"finish_reason"`
		StopReason   any             `json:"stop_reason"` // a stop string, a token id (float64) or nil
		Logprobs     json.RawMessage `json:"logprobs"`
	} `json:"choices"`
	Usage usage `json:"usage"`
	Xmix  struct {
		Apps          []string                     `json:"apps"`
		Exports       map[string][]json.RawMessage `json:"exports"`
		PromptExports map[string][]json.RawMessage `json:"prompt_exports"`
		Fired         map[string]int               `json:"fired"`
	} `json:"xmix"`
}

func (c completion) text() string {
	if c.Object == "chat.completion" {
		return c.Choices[0].Message.Content
	}
	return c.Choices[0].Text
}

// postOK posts body and decodes its 200 response.
func postOK(t testing.TB, url, body string) completion {
	t.Helper()
	code, data := post(t, url, body)
	if code != http.StatusOK {
		t.Fatalf("%s: %d %s", body, code, data)
	}
	return decodeCompletion(t, data)
}

func decodeCompletion(t testing.TB, data []byte) completion {
	t.Helper()
	var c completion
	if err := json.Unmarshal(data, &c); err != nil || len(c.Choices) != 1 {
		t.Fatalf("response %s: %v", data, err)
	}
	return c
}

// streamed is a streamed response put back together.
type streamed struct {
	text    string
	finish  string
	stop    any // stop_reason: a stop string, a token id (float64) or nil
	chunks  int // chunks with a choice
	exports map[string][]json.RawMessage
	fired   map[string]int               // from the last chunk
	prompt  map[string][]json.RawMessage // prompt_exports, from the last chunk
	usage   *usage
	// logprobs are the chunks' logprobs objects, in order (chunks without them left out).
	logprobs []json.RawMessage
	role     string
	done     bool // ended with data: [DONE]
	errors   []string
}

func readStream(t testing.TB, body io.Reader) streamed {
	t.Helper()
	s := streamed{exports: map[string][]json.RawMessage{}}
	sc := bufio.NewScanner(body)
	sc.Buffer(nil, 1<<24)
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			continue
		}
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			t.Fatalf("not an SSE data line: %q", line)
		}
		if s.done {
			t.Fatalf("data after [DONE]: %q", line)
		}
		if data == "[DONE]" {
			s.done = true
			continue
		}
		var ch struct {
			Choices []struct {
				Text  *string `json:"text"`
				Delta *struct {
					Role    string  `json:"role"`
					Content *string `json:"content"`
				} `json:"delta"`
				FinishReason *string         `json:"finish_reason"`
				StopReason   any             `json:"stop_reason"`
				Logprobs     json.RawMessage `json:"logprobs"`
			} `json:"choices"`
			Usage *usage `json:"usage"`
			Xmix  *struct {
				Exports       map[string][]json.RawMessage `json:"exports"`
				Fired         map[string]int               `json:"fired"`
				PromptExports map[string][]json.RawMessage `json:"prompt_exports"`
			} `json:"xmix"`
			Error *errorObject `json:"error"`
		}
		if err := json.Unmarshal([]byte(data), &ch); err != nil {
			t.Fatalf("chunk %q: %v", data, err)
		}
		if ch.Error != nil {
			s.errors = append(s.errors, ch.Error.Message)
			continue
		}
		if ch.Usage != nil {
			if len(ch.Choices) != 0 || s.usage != nil {
				t.Fatalf("usage in a chunk with choices, or twice: %q", data)
			}
			s.usage = ch.Usage
		}
		if ch.Xmix != nil && ch.Xmix.Fired != nil {
			if s.fired != nil {
				t.Fatalf("fired counts in two chunks: %q", data)
			}
			s.fired = ch.Xmix.Fired
		}
		if ch.Xmix != nil && ch.Xmix.PromptExports != nil {
			if s.prompt != nil || ch.Xmix.Fired == nil {
				t.Fatalf("prompt exports twice, or not in the last chunk: %q", data)
			}
			s.prompt = ch.Xmix.PromptExports
		}
		if ch.Xmix != nil {
			for k, v := range ch.Xmix.Exports {
				if len(v) != 1 {
					t.Fatalf("a chunk with %d values of %s: %q", len(v), k, data)
				}
				s.exports[k] = append(s.exports[k], v...)
			}
		}
		for _, c := range ch.Choices {
			if s.finish != "" {
				t.Fatalf("a chunk after the finish reason: %q", data)
			}
			if c.Delta != nil && c.Delta.Role != "" {
				s.role = c.Delta.Role
			} else {
				s.chunks++
			}
			if c.Text != nil {
				s.text += *c.Text
			}
			if c.Delta != nil && c.Delta.Content != nil {
				s.text += *c.Delta.Content
			}
			if c.FinishReason != nil {
				s.finish, s.stop = *c.FinishReason, c.StopReason
			}
			if len(c.Logprobs) > 0 && string(c.Logprobs) != "null" {
				s.logprobs = append(s.logprobs, c.Logprobs)
			}
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return s
}

// withField adds "key": value to a JSON object's text.
func withField(body, key, value string) string {
	return strings.TrimSuffix(strings.TrimSpace(body), "}") + `, "` + key + `": ` + value + "}"
}

func decodeJSON(data []byte, v any) error { return json.Unmarshal(data, v) }

// sseData reads a stream's data lines up to [DONE], without the usage chunk.
func sseData(t testing.TB, resp *http.Response) []string {
	t.Helper()
	defer resp.Body.Close()
	var out []string
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<24)
	for sc.Scan() {
		d, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok || d == "[DONE]" {
			continue
		}
		out = append(out, d)
	}
	return out
}
