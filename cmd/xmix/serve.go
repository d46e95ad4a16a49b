package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"xmix/serve"
)

type serveFlags struct {
	runFlags
	addr           string
	grace          time.Duration
	modelName      string
	adminToken     string
	maxQueue       int
	maxExport      int
	requestTimeout time.Duration
	logRequests    bool
}

func serveCmd() *cobra.Command {
	var f serveFlags
	c := &cobra.Command{
		Use:   "serve [BUNDLE.xmb]",
		Short: "Serve a bundle over an OpenAI-compatible HTTP API, with MI apps on every request",
		Long: `Serves a bundle (no bundle: the embedded default model with its demo apps) with continuous
batching. Endpoints:

  ` + strings.Join(serve.Endpoints, "\n  ") + `

MI rides on OpenAI requests in the "xmix" extension object (OpenAI SDKs pass it through as
an extra body field): {"apps": [...], "set": {"app.op0.alpha": 20}, "vectors":
{"app.param": [floats] or base64 f32}, "layers": {"app.op0": [3]}, "exports": [...],
"stop_when": {"export": "app.buffer", "op": ">", "value": 0.9}, "prompt_exports": true,
"default_apps": false}. Responses carry "xmix": {"apps", "exports": one value or row per
generated token, "fired": sites per op}, every SSE chunk the exports of its token.

A client that disconnects has its request cancelled at the next step; past --max-queue
waiting requests new ones get 429 with Retry-After. SIGINT/SIGTERM stops taking connections
and lets in-flight requests finish (--shutdown-timeout).`,
		Example: `  xmix serve tiny.xmb --addr 127.0.0.1:8080
  curl -s 127.0.0.1:8080/v1/completions -d '{"prompt": "Once upon a time", "max_tokens": 32, "xmix": {"apps": ["tiny-steer"], "set": {"tiny-steer.op0.alpha": 20}}}'
  curl -sN 127.0.0.1:8080/v1/completions -d '{"prompt": "Hello", "max_tokens": 16, "stream": true, "xmix": {"apps": ["tiny-probe"]}}'
  XMIX_ADMIN_TOKEN=secret xmix serve tiny.xmb
  curl -s -X PATCH 127.0.0.1:8080/v1/apps/tiny-steer -H 'Authorization: Bearer secret' -d '{"set": {"op0.alpha": 4}, "on_by_default": true}'`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if f.grace < 0 {
				return fmt.Errorf("--shutdown-timeout %s: want 0 (stop at once) or more", f.grace)
			}
			for _, c := range []struct {
				flag string
				v    int
			}{{"--max-queue", f.maxQueue}, {"--max-export-values", f.maxExport}} {
				if c.v < 0 {
					return fmt.Errorf("%s %d: want 0 (unbounded) or more", c.flag, c.v)
				}
			}
			if f.adminToken == "" {
				f.adminToken = os.Getenv("XMIX_ADMIN_TOKEN")
			}
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			var s *session
			var err error
			if len(args) == 0 {
				var cleanup func()
				s, cleanup, err = openDefault(f.runFlags)
				if cleanup != nil {
					defer cleanup()
				}
			} else {
				s, err = openFile(args[0], f.runFlags)
			}
			if err != nil {
				return err
			}
			defer s.be.Close()
			ln, err := net.Listen("tcp", f.addr)
			if err != nil {
				return err
			}
			return serveSession(ctx, s, ln, f, os.Stderr)
		},
	}
	fl := c.Flags()
	fl.StringVar(&f.addr, "addr", "127.0.0.1:8080", "address to listen on (port 0: any free port, printed at start)")
	fl.StringVar(&f.modelName, "served-model-name", "", "the model's id in /v1/models and in requests' \"model\" (default: the spec's model name)")
	fl.StringVar(&f.adminToken, "admin-token", "", "bearer token that turns on the control plane's writes (PATCH /v1/apps/{app}); default $XMIX_ADMIN_TOKEN; none: off")
	fl.IntVar(&f.maxQueue, "max-queue", 1024, "requests that may wait for a sequence slot; past it new ones get 429 with Retry-After (0: unbounded)")
	fl.IntVar(&f.maxExport, "max-export-values", 1<<24, "the values a request's reads (its apps' exports, per generated token, and per prompt token with prompt_exports) may hold; past it the request gets 400 before it runs (0: unbounded; capturing every layer of Llama-3.1-8B is 131072 a token)")
	fl.DurationVar(&f.requestTimeout, "request-timeout", 0, "end a generation that runs longer, with what it generated (finish_reason \"timeout\"); 0: none")
	fl.BoolVar(&f.logRequests, "log-requests", false, "write one line per request to stderr")
	fl.DurationVar(&f.grace, "shutdown-timeout", 30*time.Second, "on SIGINT/SIGTERM, how long in-flight requests may take to finish")
	f.addBackendFlags(fl)
	return c
}

// serveSession serves s on ln until ctx ends; notices and the request log go to logw.
func serveSession(ctx context.Context, s *session, ln net.Listener, f serveFlags, logw io.Writer) error {
	cfg := serve.Config{Bundle: s.b, Engine: s.eng, Tokenizer: s.tok, ModelName: f.modelName, AdminToken: f.adminToken,
		MaxQueue: f.maxQueue, MaxExportValues: f.maxExport, RequestTimeout: f.requestTimeout,
		Logf: func(format string, a ...any) { fmt.Fprintf(logw, format+"\n", a...) }}
	if f.logRequests {
		cfg.RequestLog = logw
	}
	sv, err := serve.New(cfg)
	if err != nil {
		return err
	}
	plane := "off (no --admin-token)"
	if f.adminToken != "" {
		plane = "on"
	}
	f.progress("serving %s on http://%s (apps: %s; control plane %s)", s.b.Manifest.Model.Name, ln.Addr(),
		orNone(s.eng.AppNames()), plane)
	return sv.Serve(ctx, ln, f.grace)
}

func orNone(xs []string) string {
	if len(xs) == 0 {
		return "none"
	}
	return strings.Join(xs, ", ")
}
