package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"xmix/compile"
	"xmix/specs"
)

// tinySession builds the embedded tiny model with its two demo apps (and the app specs
// extra, if any) and opens it on the CPU, as `xmix serve` with no bundle does.
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
	s, err := open(b, dir, runFlags{backend: "cpu", quiet: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.be.Close() })
	return s
}

// startServe serves s through the serve command's wiring on a loopback port until the test
// ends; it returns the base URL.
func startServe(t *testing.T, s *session, f serveFlags, log io.Writer) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- serveSession(ctx, s, ln, f, log) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	return "http://" + ln.Addr().String()
}

// The serve command's flags reach the server: the served model name, the admin token, the
// request log.
func TestServeSessionWiresFlags(t *testing.T) {
	s := tinySession(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	var log strings.Builder
	f := serveFlags{runFlags: runFlags{quiet: true}, modelName: "demo", adminToken: "tok", logRequests: true, grace: 5 * time.Second}
	go func() { done <- serveSession(ctx, s, ln, f, &log) }()
	url := "http://" + ln.Addr().String()
	get := func(method, path, body string, hdr ...string) (int, string) {
		req, _ := http.NewRequest(method, url+path, strings.NewReader(body))
		if len(hdr) == 2 {
			req.Header.Set(hdr[0], hdr[1])
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		data, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(data)
	}
	if code, body := get("GET", "/v1/models", ""); code != 200 || !strings.Contains(body, `"id":"demo"`) {
		t.Errorf("models: %d %s", code, body)
	}
	if code, body := get("POST", "/v1/completions", `{"model": "demo", "prompt": "Hi", "max_tokens": 2}`); code != 200 {
		t.Errorf("completion: %d %s", code, body)
	}
	if code, body := get("PATCH", "/v1/apps/tiny-steer", `{"on_by_default": true}`, "Authorization", "Bearer tok"); code != 200 {
		t.Errorf("patch: %d %s", code, body)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(log.String(), "POST /v1/completions 200") || !strings.Contains(log.String(), "control plane: app tiny-steer") {
		t.Errorf("log: %s", log.String())
	}
}

// A negative --shutdown-timeout, --max-queue or --max-export-values is refused before the
// bundle is opened or a port taken.
func TestServeShutdownTimeoutNegative(t *testing.T) {
	for _, c := range [][2]string{
		{"--shutdown-timeout=-5s", "--shutdown-timeout -5s: want 0 (stop at once) or more"},
		{"--max-queue=-1", "--max-queue -1: want 0 (unbounded) or more"},
		{"--max-export-values=-2", "--max-export-values -2: want 0 (unbounded) or more"},
	} {
		out, err := xmix(t, "serve", "--backend", "cpu", "--addr", "127.0.0.1:0", c[0]) // no -q: a load would say so
		if err == nil || !strings.Contains(out, c[1]) || strings.Contains(out, "loaded") {
			t.Errorf("%s: err %v, output %q", c[0], err, out)
		}
	}
}
