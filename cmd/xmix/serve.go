package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/spf13/cobra"

	"xmix/loader"
	"xmix/tokenizer"
)

func serveCmd() *cobra.Command {
	var f runFlags
	var addr string
	var grace time.Duration
	c := &cobra.Command{
		Use:   "serve BUNDLE.xmb",
		Short: "Serve a bundle over HTTP: POST /v1/generate with per-request apps, GET /v1/apps",
		Example: `  xmix serve tiny.xmb --addr 127.0.0.1:8080
  curl -s 127.0.0.1:8080/v1/generate -d '{"prompt": "Once upon a time", "max_tokens": 32, "apps": ["tiny-steer"], "set": {"tiny-steer.op0.alpha": 20}}'
  curl -sN 127.0.0.1:8080/v1/generate -d '{"prompt": "Hello", "stream": true}'`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return serveBundle(ctx, args[0], addr, grace, f)
		},
	}
	c.Flags().StringVar(&addr, "addr", "127.0.0.1:8080", "address to listen on")
	f.addBackendFlags(c.Flags())
	c.Flags().DurationVar(&grace, "shutdown-timeout", 30*time.Second, "on SIGINT/SIGTERM, how long in-flight requests may take to finish")
	return c
}

func serveBundle(ctx context.Context, path, addr string, grace time.Duration, f runFlags) error {
	s, err := openFile(path, f)
	if err != nil {
		return err
	}
	defer s.be.Close()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	f.progress("serving %s on http://%s (apps: %s)", s.b.Manifest.Model.Name, ln.Addr(), strings.Join(s.eng.AppNames(), ", "))
	return serve(ctx, s, ln, grace)
}

// serve runs the engine loop and the HTTP server on ln until ctx ends (then it lets
// in-flight requests finish, for at most grace) or the engine fails.
func serve(ctx context.Context, s *session, ln net.Listener, grace time.Duration) error {
	sv := newServer(s)
	loopCtx, stopLoop := context.WithCancel(context.Background())
	defer stopLoop()
	loopDone := make(chan error, 1)
	go func() { loopDone <- sv.loop(loopCtx) }()
	hs := &http.Server{Handler: sv.handler(), ReadHeaderTimeout: 10 * time.Second}
	httpDone := make(chan error, 1)
	go func() { httpDone <- hs.Serve(ln) }()
	var loopErr error
	select {
	case <-ctx.Done():
	case loopErr = <-loopDone:
	case err := <-httpDone:
		stopLoop()
		<-loopDone
		return err
	}
	sctx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	// Shutdown waits for the handlers, which wait for the engine loop: it keeps stepping
	// until they have their results.
	shutErr := hs.Shutdown(sctx)
	stopLoop()
	if loopErr == nil {
		loopErr = <-loopDone
	}
	if loopErr != nil {
		return fmt.Errorf("engine: %w", loopErr)
	}
	if shutErr != nil {
		return fmt.Errorf("shutdown: %w (in-flight requests cut off after %v)", shutErr, grace)
	}
	return nil
}

// server hands HTTP requests to the goroutine that owns the engine.
type server struct {
	s    *session
	jobs chan *job
	// stopped is closed when the engine loop ends; err says why when it failed.
	stopped chan struct{}
	err     error
}

// job is one request in flight. The engine loop fills the fields under mu and pokes wake;
// the handler reads them.
type job struct {
	req      loader.Request
	accepted chan error // Submit's verdict: nil, or why the request is invalid
	wake     chan struct{}
	h        *loader.Handle // engine side only

	mu       sync.Mutex
	tokens   []int
	rows     []loader.Row
	reason   string
	finished bool
}

func newServer(s *session) *server {
	return &server{s: s, jobs: make(chan *job), stopped: make(chan struct{})}
}

// loop owns the engine: it submits arriving requests between steps, so they join the
// running batch, and publishes each step's tokens to their jobs. It returns when ctx ends
// or a step fails.
func (sv *server) loop(ctx context.Context) error {
	defer close(sv.stopped)
	eng := sv.s.eng
	var live []*job
	submit := func(j *job) {
		h, err := eng.Submit(j.req)
		if err == nil {
			j.h = h
			live = append(live, j)
		}
		j.accepted <- err
	}
	for {
		if !eng.Busy() {
			select {
			case j := <-sv.jobs:
				submit(j)
			case <-ctx.Done():
				return nil
			}
		}
	drain:
		for {
			select {
			case j := <-sv.jobs:
				submit(j)
			default:
				break drain
			}
		}
		// Shutdown cancels ctx once the handlers are done or its time is up; requests still
		// running then belong to clients that left or ran out of time.
		if ctx.Err() != nil {
			return nil
		}
		if eng.Busy() {
			if _, err := eng.Step(); err != nil {
				sv.err = err
				return err
			}
		}
		kept := live[:0]
		for _, j := range live {
			if !j.publish() {
				kept = append(kept, j)
			}
		}
		clear(live[len(kept):])
		live = kept
	}
}

// publish copies what the engine produced for j since the last call; it reports whether j
// has finished.
func (j *job) publish() bool {
	r := &j.h.Result
	j.mu.Lock()
	j.tokens = append(j.tokens, r.Tokens[len(j.tokens):]...)
	j.rows = append(j.rows, r.Rows[len(j.rows):]...)
	if j.h.Done {
		j.finished, j.reason = true, r.Reason
	}
	done := j.finished
	j.mu.Unlock()
	select {
	case j.wake <- struct{}{}:
	default:
	}
	return done
}

func (sv *server) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-sv.stopped:
			writeJSON(w, http.StatusServiceUnavailable, errBody(sv.stoppedErr()))
		default:
			writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
		}
	})
	mux.HandleFunc("GET /v1/apps", sv.apps)
	mux.HandleFunc("POST /v1/generate", sv.generate)
	return mux
}

func (sv *server) stoppedErr() error {
	if sv.err != nil {
		return fmt.Errorf("the engine failed: %w", sv.err)
	}
	return errors.New("the server is shutting down")
}

type appInfo struct {
	Name string `json:"name"`
	// Scalars by the name a request's "set" uses, with their defaults.
	Scalars map[string]float32 `json:"scalars"`
	Exports []exportInfo       `json:"exports"`
}

type exportInfo struct {
	Name    string `json:"name"` // the key under a row's "exports"
	Width   int    `json:"width"`
	Samples bool   `json:"sampled_rows_only"`
}

func (sv *server) apps(w http.ResponseWriter, r *http.Request) {
	out := []appInfo{}
	for _, a := range sv.s.b.Manifest.Apps {
		ai := appInfo{Name: a.Name, Scalars: map[string]float32{}, Exports: []exportInfo{}}
		for _, sc := range a.Scalars {
			ai.Scalars[a.Name+"."+sc.Name] = sc.Value
		}
		for _, x := range a.Exports {
			ai.Exports = append(ai.Exports, exportInfo{Name: a.Name + "." + x.Name, Width: x.Width, Samples: x.Samples})
		}
		out = append(out, ai)
	}
	writeJSON(w, http.StatusOK, map[string]any{"model": sv.s.b.Manifest.Model.Name, "apps": out})
}

// generateRequest is the body of POST /v1/generate.
type generateRequest struct {
	Prompt      string             `json:"prompt"`
	MaxTokens   *int               `json:"max_tokens"`
	Temperature float32            `json:"temperature"`
	TopP        *float32           `json:"top_p"`
	Seed        uint64             `json:"seed"`
	Apps        []string           `json:"apps"`
	Set         map[string]float32 `json:"set"`
	Chat        bool               `json:"chat"`
	Stream      bool               `json:"stream"`
}

const (
	defaultMaxTokens = 64
	maxBodyBytes     = 1 << 20
)

type rowJSON struct {
	Pos     int            `json:"pos"`
	Token   int            `json:"token"`
	Exports loader.Exports `json:"exports,omitempty"`
}

type generateResponse struct {
	Text   string    `json:"text"`
	Tokens []int     `json:"tokens"`
	Reason string    `json:"finish_reason"`
	Rows   []rowJSON `json:"rows"`
}

// streamToken is one line of a streamed response: a generated token, the text it completes
// and the exports of the row that sampled it.
type streamToken struct {
	Token   int            `json:"token"`
	Text    string         `json:"text"`
	Pos     int            `json:"pos"`
	Exports loader.Exports `json:"exports,omitempty"`
}

// streamEnd is the last line of a streamed response.
type streamEnd struct {
	Done   bool   `json:"done"`
	Text   string `json:"text"`
	Tokens []int  `json:"tokens"`
	Reason string `json:"finish_reason"`
}

// parseGenerate decodes and checks a request body into an engine request.
func (sv *server) parseGenerate(body io.Reader) (loader.Request, bool, error) {
	var g generateRequest
	dec := json.NewDecoder(body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&g); err != nil {
		return loader.Request{}, false, fmt.Errorf("request body: %w", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return loader.Request{}, false, errors.New("request body: data after the JSON object")
	}
	n := defaultMaxTokens
	if g.MaxTokens != nil {
		n = *g.MaxTokens
	}
	if n <= 0 {
		return loader.Request{}, false, fmt.Errorf("max_tokens %d: must be at least 1", n)
	}
	topP := float32(1)
	if g.TopP != nil {
		topP = *g.TopP
	}
	if g.Temperature < 0 || topP < 0 || topP > 1 {
		return loader.Request{}, false, fmt.Errorf("temperature %g, top_p %g: want temperature >= 0 and top_p in [0, 1]", g.Temperature, topP)
	}
	ids := sv.s.tok.Encode(g.Prompt)
	if g.Chat {
		var err error
		if ids, err = chatPrompt(sv.s.b.Manifest.Model, sv.s.tok, g.Prompt); err != nil {
			return loader.Request{}, false, err
		}
	}
	return loader.Request{Prompt: ids, Verbatim: g.Chat, Apps: g.Apps, MaxTokens: n, Temperature: g.Temperature,
		TopP: topP, Seed: g.Seed, Overrides: g.Set}, g.Stream, nil
}

func (sv *server) generate(w http.ResponseWriter, r *http.Request) {
	req, stream, err := sv.parseGenerate(http.MaxBytesReader(w, r.Body, maxBodyBytes))
	if err != nil {
		writeJSON(w, http.StatusBadRequest, errBody(err))
		return
	}
	j := &job{req: req, accepted: make(chan error, 1), wake: make(chan struct{}, 1)}
	select {
	case sv.jobs <- j:
	case <-sv.stopped:
		writeJSON(w, http.StatusServiceUnavailable, errBody(sv.stoppedErr()))
		return
	case <-r.Context().Done():
		return
	}
	// Once sent, the loop answers before it looks at another job or stops.
	if err := <-j.accepted; err != nil {
		writeJSON(w, http.StatusBadRequest, errBody(err))
		return
	}
	if stream {
		sv.stream(w, r, j)
		return
	}
	for {
		j.mu.Lock()
		done := j.finished
		j.mu.Unlock()
		if done {
			break
		}
		// A request the client has abandoned keeps running to max_tokens: the engine
		// cannot cancel one.
		if !sv.wait(r, j) {
			if r.Context().Err() == nil {
				writeJSON(w, http.StatusInternalServerError, errBody(sv.stoppedErr()))
			}
			return
		}
	}
	resp := generateResponse{Text: sv.s.tok.Decode(j.tokens), Tokens: j.tokens, Reason: j.reason, Rows: make([]rowJSON, len(j.rows))}
	for i, row := range j.rows {
		resp.Rows[i] = rowJSON{Pos: row.Pos, Token: row.Token, Exports: row.Exports}
	}
	writeJSON(w, http.StatusOK, resp)
}

// wait blocks until the engine publishes more for j; false when it never will, or the
// client left.
func (sv *server) wait(r *http.Request, j *job) bool {
	select {
	case <-j.wake:
		return true
	default:
	}
	select {
	case <-j.wake:
		return true
	case <-sv.stopped:
		// The loop may have published the last tokens just before stopping.
		select {
		case <-j.wake:
			return true
		default:
			return false
		}
	case <-r.Context().Done():
		return false
	}
}

// stream writes newline-delimited JSON: one streamToken per generated token as the engine
// produces it, then a streamEnd.
func (sv *server) stream(w http.ResponseWriter, r *http.Request, j *job) {
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	fl, _ := w.(http.Flusher)
	enc := json.NewEncoder(w)
	dec := newStreamDecoder(sv.s.tok)
	promptN := len(loader.InputIDs(sv.s.b.Manifest.Model, j.req)) // rows count the BOS the engine adds
	sent := 0
	for {
		j.mu.Lock()
		toks, rows, done, reason := j.tokens[sent:], j.rows, j.finished, j.reason
		j.mu.Unlock()
		for i, t := range toks {
			// Token k was sampled at the row of position promptN-1+k; that row is
			// collected in the same step as the token.
			st := streamToken{Token: t, Text: dec.Add(t), Pos: promptN - 1 + sent + i}
			if st.Pos < len(rows) && rows[st.Pos].Pos == st.Pos {
				st.Exports = rows[st.Pos].Exports
			}
			if i == len(toks)-1 && done {
				st.Text += dec.Flush()
			}
			if enc.Encode(st) != nil {
				return
			}
		}
		sent += len(toks)
		if done {
			j.mu.Lock()
			all := j.tokens
			j.mu.Unlock()
			enc.Encode(streamEnd{Done: true, Text: sv.s.tok.Decode(all), Tokens: all, Reason: reason})
			return
		}
		if fl != nil {
			fl.Flush()
		}
		if !sv.wait(r, j) {
			if r.Context().Err() == nil {
				enc.Encode(errBody(sv.stoppedErr()))
			}
			return
		}
	}
}

// streamDecoder turns generated ids into text piece by piece without splitting a UTF-8
// character across pieces.
type streamDecoder interface {
	Add(id int) string
	Flush() string
}

func newStreamDecoder(tok loader.Tokenizer) streamDecoder {
	if t, ok := tok.(*tokenizer.Tokenizer); ok {
		return t.NewDecoder()
	}
	return &cumulativeDecoder{tok: tok}
}

// cumulativeDecoder serves tokenizers without a streaming decoder (the byte tokenizer,
// whose ids may each be one byte of a character): it decodes all ids so far and emits the
// new suffix up to a trailing incomplete character, each invalid byte as U+FFFD.
type cumulativeDecoder struct {
	tok     loader.Tokenizer
	ids     []int
	emitted int // bytes of the decoded text already emitted
}

func (d *cumulativeDecoder) Add(id int) string {
	d.ids = append(d.ids, id)
	full := d.tok.Decode(d.ids)
	if len(full) < d.emitted {
		return ""
	}
	rest := full[d.emitted:]
	var out strings.Builder
	i := 0
	for i < len(rest) {
		r, n := utf8.DecodeRuneInString(rest[i:])
		if r == utf8.RuneError && n <= 1 {
			if !utf8.FullRuneInString(rest[i:]) {
				break // the next ids may complete it
			}
			out.WriteRune(utf8.RuneError)
		} else {
			out.WriteString(rest[i : i+n])
		}
		i += n
	}
	d.emitted += i
	return out.String()
}

func (d *cumulativeDecoder) Flush() string {
	full := d.tok.Decode(d.ids)
	d.ids = d.ids[:0]
	if len(full) <= d.emitted {
		d.emitted = 0
		return ""
	}
	rest := full[d.emitted:]
	d.emitted = 0
	return strings.ToValidUTF8(rest, "\uFFFD")
}

func errBody(err error) map[string]string { return map[string]string{"error": err.Error()} }

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(v)
}
