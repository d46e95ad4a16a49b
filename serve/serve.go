// Package serve is xmix's HTTP server: an OpenAI-compatible API (/v1/models,
// /v1/completions, /v1/chat/completions with SSE streaming, /tokenize, /detokenize, /health)
// over one engine, with MI on every request through the "xmix" extension object, a live
// control plane for the deployed apps (/v1/apps), Prometheus metrics (/metrics),
// cancellation of requests whose client left, and a bounded queue.
//
// One goroutine owns the engine (loop.go); HTTP handlers parse, validate and format, and
// talk to it through messages that it applies between steps.
package serve

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"xmix/bundle"
	"xmix/loader"
)

// Config is what a Server serves and how.
type Config struct {
	Bundle    *bundle.Bundle
	Engine    *loader.Engine
	Tokenizer loader.Tokenizer
	// ModelName is the model's id in /v1/models and the "model" requests must name; empty:
	// the spec's model name.
	ModelName string
	// AdminToken turns the control plane's writes (PATCH /v1/apps/{app}) on, behind
	// "Authorization: Bearer <token>"; empty: they are refused.
	AdminToken string
	// MaxQueue bounds the requests waiting for a sequence slot; past it a request gets 429
	// with Retry-After. 0: unbounded.
	MaxQueue int
	// RequestTimeout ends a generation that runs longer (finish_reason "timeout", with what
	// it generated); 0: none.
	RequestTimeout time.Duration
	// MaxExportValues bounds the values a request's reads may hold: every export of the
	// apps it enables, at each row the engine keeps them for (a generated token's, and with
	// prompt_exports a prompt token's). Past it the request gets 400 before it runs, instead
	// of holding them until it ends and writing them all into one response (capturing every
	// layer of Llama-3.1-8B is 131,072 values a token). 0: unbounded.
	MaxExportValues int
	// RequestLog, when set, gets one line per request.
	RequestLog io.Writer
	// Logf reports control-plane changes and notices; nil: discarded.
	Logf func(format string, a ...any)
	// Registry, when set, is where the metrics are registered (and /metrics serves it);
	// nil: a registry of the server's own.
	Registry *prometheus.Registry
}

// Server serves one engine over HTTP.
type Server struct {
	cfg   Config
	b     *bundle.Bundle
	eng   *loader.Engine
	tok   loader.Tokenizer
	model string
	// silent are the ids a response's text leaves out, as vLLM's default
	// skip_special_tokens: BOS, EOS and the tokenizer's special added tokens.
	silent map[int]bool
	// chat renders conversations; chatErr says why chat requests are refused (a model
	// without a chat template).
	chat    *loader.Chat
	chatErr error
	// perRequest are the per_request vector params requests may bring, by "app.param".
	perRequest map[string]bundle.Vector

	inbox chan message
	// stopped is closed when the loop ends; failing holds the last step's error.
	stopped chan struct{}
	failing atomic.Pointer[stepError]
	// pending counts requests sent to the loop that it has not yet submitted; queued is
	// the engine's queue after the last step. Their sum is what --max-queue bounds.
	pending atomic.Int64
	queued  atomic.Int64

	ctl     *controlState
	metrics *metrics
	created int64 // the model's creation time in /v1/models: when the server started
	logMu   sync.Mutex
}

// New prepares a server; Serve runs it.
func New(cfg Config) (*Server, error) {
	var sv *Server
	if cfg.Bundle == nil || cfg.Engine == nil || cfg.Tokenizer == nil {
		return nil, errors.New("serve: a bundle, an engine and a tokenizer are needed")
	}
	if cfg.MaxQueue < 0 {
		return nil, fmt.Errorf("max queue %d: want 0 (unbounded) or more", cfg.MaxQueue)
	}
	if cfg.MaxExportValues < 0 {
		return nil, fmt.Errorf("max export values %d: want 0 (unbounded) or more", cfg.MaxExportValues)
	}
	if cfg.RequestTimeout < 0 {
		return nil, fmt.Errorf("request timeout %v: want 0 (none) or more", cfg.RequestTimeout)
	}
	if logf := cfg.Logf; logf == nil {
		cfg.Logf = func(string, ...any) {}
	} else {
		// Notices come from the loop and the handlers, the request log from the handlers;
		// one lock keeps their lines whole when they share a writer.
		cfg.Logf = func(format string, a ...any) {
			sv.logMu.Lock()
			defer sv.logMu.Unlock()
			logf(format, a...)
		}
	}
	m := cfg.Bundle.Manifest.Model
	sv = &Server{cfg: cfg, b: cfg.Bundle, eng: cfg.Engine, tok: cfg.Tokenizer, model: cfg.ModelName,
		silent: map[int]bool{m.BOS: true}, inbox: make(chan message, 256), stopped: make(chan struct{}),
		ctl: newControlState(cfg.Bundle), created: time.Now().Unix()}
	if sv.model == "" {
		sv.model = m.Name
	}
	sv.chat, sv.chatErr = loader.NewChat(m, cfg.Tokenizer)
	sv.perRequest = map[string]bundle.Vector{}
	for _, a := range cfg.Bundle.Manifest.Apps {
		for _, v := range a.Vectors {
			if v.Slots != "" {
				sv.perRequest[a.Name+"."+v.Param] = v
			}
		}
	}
	for _, e := range m.EOS {
		sv.silent[e] = true
	}
	if t, ok := cfg.Tokenizer.(interface{ Specials() []int }); ok {
		for _, id := range t.Specials() {
			sv.silent[id] = true
		}
	}
	reg := cfg.Registry
	if reg == nil {
		reg = prometheus.NewRegistry()
		sv.cfg.Registry = reg
	}
	var err error
	if sv.metrics, err = newMetrics(reg, cfg.Bundle, func() float64 {
		return float64(sv.queued.Load() + sv.pending.Load())
	}); err != nil {
		return nil, err
	}
	return sv, nil
}

// Serve runs the engine loop and the HTTP server on ln until ctx ends (then it lets
// in-flight requests finish, for at most grace) or the engine fails.
func (sv *Server) Serve(ctx context.Context, ln net.Listener, grace time.Duration) error {
	loopCtx, stopLoop := context.WithCancel(context.Background())
	defer stopLoop()
	loopDone := make(chan struct{})
	go func() { sv.loop(loopCtx); close(loopDone) }()
	hs := &http.Server{Handler: sv.Handler(), ReadHeaderTimeout: timeouts.ReadHeader, ReadTimeout: timeouts.Read, IdleTimeout: timeouts.Idle}
	httpDone := make(chan error, 1)
	go func() { httpDone <- hs.Serve(ln) }()
	select {
	case <-ctx.Done():
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
	<-loopDone
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

// Endpoints lists what the server answers, for --help and the 404 message.
var Endpoints = []string{
	"GET  /health, /healthz            200 while the engine serves, 503 after a failed step or once shutting down",
	"GET  /v1/models[/{model}]         the served model (--served-model-name)",
	"POST /v1/completions              OpenAI completions, \"stream\": true for SSE",
	"POST /v1/chat/completions         OpenAI chat completions through the model's chat template",
	"POST /tokenize, /detokenize       vLLM's shapes: {\"prompt\"} or {\"messages\"} -> {\"tokens\"}; {\"tokens\"} -> {\"prompt\"}",
	"GET  /v1/apps                     the deployed apps: ops, scalars and defaults, vectors, exports",
	"PATCH /v1/apps/{app}              change defaults and vectors live (bearer --admin-token)",
	"GET  /metrics                     Prometheus metrics",
}

// Handler is the server's HTTP surface.
func (sv *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	route := func(path string, methods map[string]http.HandlerFunc) {
		mux.HandleFunc(path, func(w http.ResponseWriter, r *http.Request) {
			h, ok := methods[r.Method]
			if !ok && r.Method == http.MethodHead {
				h, ok = methods[http.MethodGet]
			}
			if !ok {
				allowed := slices.Sorted(maps.Keys(methods))
				w.Header().Set("Allow", strings.Join(allowed, ", "))
				writeError(w, &apiError{status: http.StatusMethodNotAllowed,
					message: fmt.Sprintf("%s %s: this endpoint takes %v", r.Method, path, allowed)})
				return
			}
			h(w, r)
		})
	}
	health := func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-sv.stopped:
			writeError(w, sv.stoppedErr())
			return
		default:
		}
		if f := sv.failing.Load(); f != nil && f.err != nil {
			writeError(w, &apiError{status: http.StatusServiceUnavailable, code: "step_failed",
				message: fmt.Sprintf("the engine's last step failed: %v", f.err)})
			return
		}
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	}
	route("/health", map[string]http.HandlerFunc{"GET": health})
	route("/healthz", map[string]http.HandlerFunc{"GET": health})
	route("/v1/models", map[string]http.HandlerFunc{"GET": sv.models})
	route("/v1/models/{model...}", map[string]http.HandlerFunc{"GET": sv.modelByID})
	route("/v1/completions", map[string]http.HandlerFunc{"POST": func(w http.ResponseWriter, r *http.Request) { sv.generate(w, r, false) }})
	route("/v1/chat/completions", map[string]http.HandlerFunc{"POST": func(w http.ResponseWriter, r *http.Request) { sv.generate(w, r, true) }})
	route("/tokenize", map[string]http.HandlerFunc{"POST": sv.tokenize})
	route("/detokenize", map[string]http.HandlerFunc{"POST": sv.detokenize})
	route("/v1/apps", map[string]http.HandlerFunc{"GET": sv.listApps})
	route("/v1/apps/{app}", map[string]http.HandlerFunc{"GET": sv.getApp, "PATCH": sv.patchApp})
	route("/metrics", map[string]http.HandlerFunc{"GET": sv.metrics.handler(sv.cfg.Registry).ServeHTTP})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, &apiError{status: http.StatusNotFound, code: "not_found",
			message: fmt.Sprintf("no endpoint %s %s (GET /v1/models, POST /v1/completions, POST /v1/chat/completions, GET /v1/apps, ...)", r.Method, r.URL.Path)})
	})
	return recoverPanics(mux, sv.cfg.Logf)
}

// recoverPanics answers a request whose handler panicked with a 500 (when nothing was
// written yet) and keeps the server running; the panic is logged with its stack.
func recoverPanics(h http.Handler, logf func(string, ...any)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			if p := recover(); p != nil {
				if p == http.ErrAbortHandler {
					panic(p)
				}
				logf("panic serving %s %s: %v\n%s", r.Method, r.URL.Path, p, debug.Stack())
				writeError(w, &apiError{status: http.StatusInternalServerError, message: fmt.Sprintf("internal error: %v", p)})
			}
		}()
		h.ServeHTTP(w, r)
	})
}

func (sv *Server) stoppedErr() *apiError {
	return &apiError{status: http.StatusServiceUnavailable, code: "shutting_down", message: "the server is shutting down"}
}

// newID is a random request id with the given prefix.
func newID(prefix string) string {
	var b [12]byte
	rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}
