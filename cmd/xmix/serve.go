package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
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
	hs := newHTTPServer(sv.handler())
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

// timeouts are the server's. A client has Read for its whole request (headers within
// ReadHeader; a body is at most maxBodyBytes) and Idle between requests on a kept-alive
// connection. There is no http.Server.WriteTimeout, which would cut a long stream: each
// write of a response gets Write instead (http.ResponseController), so a client that stops
// reading is cut off while one that reads a stream for an hour is not.
var timeouts = struct{ ReadHeader, Read, Idle, Write time.Duration }{
	ReadHeader: 10 * time.Second, Read: 60 * time.Second, Idle: 120 * time.Second, Write: 60 * time.Second,
}

func newHTTPServer(h http.Handler) *http.Server {
	return &http.Server{Handler: h, ReadHeaderTimeout: timeouts.ReadHeader, ReadTimeout: timeouts.Read, IdleTimeout: timeouts.Idle}
}

// server hands HTTP requests to the goroutine that owns the engine.
type server struct {
	s    *session
	jobs chan *job
	// stopped is closed when the engine loop ends.
	stopped chan struct{}
	// failing is the error of the engine's last step when it failed (healthz reports it),
	// nil once a step succeeds again.
	mu      sync.Mutex
	failing error
	nextID  atomic.Int64
}

// job is one request in flight. The engine loop fills the fields under mu and pokes wake;
// the handler reads them.
type job struct {
	id       int64 // names the request in errors
	req      loader.Request
	accepted chan error // Submit's verdict: nil, or why the request is invalid or failed
	wake     chan struct{}
	h        *loader.Handle // engine side only

	mu       sync.Mutex
	tokens   []int
	rows     []loader.Row
	reason   string
	err      string // why it ended early (loader.Result.Error)
	finished bool
}

func newServer(s *session) *server {
	return &server{s: s, jobs: make(chan *job), stopped: make(chan struct{})}
}

// loop owns the engine: it submits arriving requests between steps, so they join the
// running batch, and publishes each step's tokens to their jobs. It returns when ctx ends.
// A step that fails has ended its requests (they answer 500); the loop goes on.
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
			_, err := eng.Step()
			sv.mu.Lock()
			sv.failing = err
			sv.mu.Unlock()
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
		j.finished, j.reason, j.err = true, r.Reason, r.Error
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
		sv.mu.Lock()
		failing := sv.failing
		sv.mu.Unlock()
		select {
		case <-sv.stopped:
			writeJSON(w, http.StatusServiceUnavailable, errBody(errStopped))
		default:
			if failing != nil {
				writeJSON(w, http.StatusServiceUnavailable, errBody(fmt.Errorf("the engine's last step failed: %w", failing)))
				return
			}
			writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
		}
	})
	mux.HandleFunc("GET /v1/apps", sv.apps)
	mux.HandleFunc("POST /v1/generate", sv.generate)
	return recoverPanics(mux)
}

var errStopped = errors.New("the server is shutting down")

// recoverPanics answers 500 for a handler that panics, naming the request, instead of the
// bare connection reset net/http leaves; the server goes on.
func recoverPanics(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			if p := recover(); p != nil {
				if p == http.ErrAbortHandler {
					panic(p)
				}
				fmt.Fprintf(os.Stderr, "xmix serve: %s %s: panic: %v\n%s", r.Method, r.URL.Path, p, debug.Stack())
				writeJSON(w, http.StatusInternalServerError, errBody(fmt.Errorf("%s %s: internal error: %v; please report it", r.Method, r.URL.Path, p)))
			}
		}()
		h.ServeHTTP(w, r)
	})
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

// errBodyNotObject is the answer to a body that is valid JSON but not an object.
var errBodyNotObject = errors.New("request body: want a JSON object, e.g. {\"prompt\": \"Hello\"}")

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
	Error  string    `json:"error,omitempty"` // finish_reason nonfinite: why no token could be sampled
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
	Error  string `json:"error,omitempty"` // finish_reason nonfinite or error: what happened
}

// parseGenerate decodes a request body into an engine request; the engine checks its fields
// (loader.Engine.Check, the check `xmix run` makes too) when the request is submitted.
func (sv *server) parseGenerate(body io.Reader) (loader.Request, bool, error) {
	data, err := io.ReadAll(body)
	if err != nil {
		return loader.Request{}, false, fmt.Errorf("request body: %w", err)
	}
	// null (or a list, a number) would decode into an empty request without an error.
	if t := bytes.TrimLeft(data, " \t\r\n"); len(t) > 0 && t[0] != '{' {
		return loader.Request{}, false, errBodyNotObject
	}
	var g generateRequest
	dec := json.NewDecoder(bytes.NewReader(data))
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
	topP := float32(1)
	if g.TopP != nil {
		topP = *g.TopP
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
	id := sv.nextID.Add(1)
	req, stream, err := sv.parseGenerate(http.MaxBytesReader(w, r.Body, maxBodyBytes))
	if err != nil {
		code := http.StatusBadRequest
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			code = http.StatusRequestEntityTooLarge
		}
		writeJSON(w, code, errBody(err))
		return
	}
	j := &job{id: id, req: req, accepted: make(chan error, 1), wake: make(chan struct{}, 1)}
	select {
	case sv.jobs <- j:
	case <-sv.stopped:
		writeJSON(w, http.StatusServiceUnavailable, errBody(errStopped))
		return
	case <-r.Context().Done():
		return
	}
	// Once sent, the loop answers before it looks at another job or stops.
	if err := <-j.accepted; err != nil {
		var bad *loader.RequestError
		if errors.As(err, &bad) {
			writeJSON(w, http.StatusBadRequest, errBody(err))
		} else {
			writeJSON(w, http.StatusInternalServerError, errBody(fmt.Errorf("request %d: %w", id, err)))
		}
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
				writeJSON(w, http.StatusServiceUnavailable, errBody(fmt.Errorf("request %d: %w", j.id, errStopped)))
			}
			return
		}
	}
	if j.reason == loader.ReasonError {
		writeJSON(w, http.StatusInternalServerError, errBody(fmt.Errorf("request %d: %s", j.id, j.err)))
		return
	}
	resp := generateResponse{Text: sv.s.tok.Decode(j.tokens), Tokens: j.tokens, Reason: j.reason, Error: j.err, Rows: make([]rowJSON, len(j.rows))}
	for i, row := range j.rows {
		resp.Rows[i] = rowJSON{Pos: row.Pos, Token: row.Token, Exports: row.Exports}
	}
	http.NewResponseController(w).SetWriteDeadline(time.Now().Add(timeouts.Write))
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
//
// Every write has timeouts.Write to complete: a client that stops reading is cut off there, one
// that keeps reading streams as long as the generation lasts.
func (sv *server) stream(w http.ResponseWriter, r *http.Request, j *job) {
	rc := http.NewResponseController(w)
	w.Header().Set("Content-Type", "application/x-ndjson")
	rc.SetWriteDeadline(time.Now().Add(timeouts.Write))
	w.WriteHeader(http.StatusOK)
	enc := json.NewEncoder(deadlineWriter{w, rc})
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
			end := streamEnd{Done: true, Text: sv.s.tok.Decode(all), Tokens: all, Reason: reason, Error: j.err}
			if reason == loader.ReasonError {
				end.Error = fmt.Sprintf("request %d: %s", j.id, j.err)
			}
			enc.Encode(end)
			return
		}
		rc.Flush()
		if !sv.wait(r, j) {
			if r.Context().Err() == nil {
				enc.Encode(errBody(fmt.Errorf("request %d: %w", j.id, errStopped)))
			}
			return
		}
	}
}

// deadlineWriter gives each write of a response timeouts.Write from its start.
type deadlineWriter struct {
	w  io.Writer
	rc *http.ResponseController
}

func (d deadlineWriter) Write(p []byte) (int, error) {
	d.rc.SetWriteDeadline(time.Now().Add(timeouts.Write))
	return d.w.Write(p)
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
