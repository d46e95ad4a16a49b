package serve

import (
	"bufio"
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"xmix/bundle"
)

// endless is tiny with no end-of-sequence token: every request runs to max_tokens, so
// requests stay in flight as long as a test needs them to.
func endless(t *testing.T) *bundle.Bundle {
	b := tinyBundle(t)
	b.Manifest.Model.EOS = nil
	return b
}

// waitIdle waits until the engine holds nothing: no request running or waiting, every KV
// page and vector slot free.
func (ts *testServer) waitIdle(t *testing.T) {
	t.Helper()
	m := ts.metrics
	waitFor(t, "the engine to be idle", func() bool {
		return testutil.ToFloat64(m.running) == 0 && testutil.ToFloat64(m.waiting) == 0 && testutil.ToFloat64(m.kvUsage) == 0 &&
			testutil.ToFloat64(m.vectorSlots) == 0
	})
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// openStream starts a streamed request and reads its first chunk.
func openStream(t *testing.T, ctx context.Context, url, body string) (*http.Response, *bufio.Reader) {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, "POST", url+"/v1/completions", strings.NewReader(body))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	br := bufio.NewReader(resp.Body)
	if line, err := br.ReadString('\n'); err != nil || !strings.HasPrefix(line, "data: {") {
		t.Fatalf("first chunk %q: %v", line, err)
	}
	return resp, br
}

// Clients that leave, streaming or not, have their requests dropped at the next step: the
// slots and KV pages come back, and the next request is served.
func TestDisconnectCancels(t *testing.T) {
	ts := startServer(t, endless(t), nil)
	slots := ts.b.Manifest.Model.MaxSeqs
	long := `{"prompt": "Once upon a time", "max_tokens": 480, "temperature": 0, "stream": true}`
	var cancels []context.CancelFunc
	for range slots {
		ctx, cancel := context.WithCancel(context.Background())
		cancels = append(cancels, cancel)
		openStream(t, ctx, ts.url, long)
	}
	if got := testutil.ToFloat64(ts.metrics.running); got != float64(slots) {
		t.Fatalf("%v running, want %d", got, slots)
	}
	for _, c := range cancels {
		c()
	}
	ts.waitIdle(t)
	if got := testutil.ToFloat64(ts.metrics.aborted); got != float64(slots) {
		t.Fatalf("%v requests aborted, want %d", got, slots)
	}
	if code, data := post(t, ts.url+"/v1/completions", `{"prompt": "Hi", "max_tokens": 4}`); code != 200 {
		t.Fatalf("after the aborted streams: %d %s", code, data)
	}
	// A client of a whole response that gives up.
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "POST", ts.url+"/v1/completions", strings.NewReader(strings.Replace(long, `"stream": true`, `"stream": false`, 1)))
	if resp, err := http.DefaultClient.Do(req); err == nil {
		resp.Body.Close()
		t.Fatal("the request finished within 50 ms; the test needs it to run longer")
	}
	waitFor(t, "the abandoned request's abort", func() bool { return testutil.ToFloat64(ts.metrics.aborted) == float64(slots+1) })
	ts.waitIdle(t)
	if got := testutil.ToFloat64(ts.metrics.requests.WithLabelValues("/v1/completions", "cancelled", "200")); got != float64(slots+1) {
		t.Fatalf("%v requests counted cancelled, want %d", got, slots+1)
	}
}

// Past --max-queue waiting requests, a new one gets 429 with Retry-After.
func TestMaxQueueAnswers429(t *testing.T) {
	ts := startServer(t, endless(t), func(c *Config) { c.MaxQueue = 1 })
	slots := ts.b.Manifest.Model.MaxSeqs
	long := `{"prompt": "Once upon a time", "max_tokens": 480, "stream": true}`
	ctx, cancel := context.WithCancel(context.Background())
	for range slots {
		openStream(t, ctx, ts.url, long)
	}
	queued := make(chan int, 1)
	go func() {
		req, _ := http.NewRequestWithContext(ctx, "POST", ts.url+"/v1/completions", strings.NewReader(long))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			queued <- 0
			return
		}
		resp.Body.Close()
		queued <- resp.StatusCode
	}()
	waitFor(t, "the request past the slots to wait", func() bool { return testutil.ToFloat64(ts.metrics.waiting) == 1 })
	code, hdr, data := do(t, "POST", ts.url+"/v1/completions", `{"prompt": "x", "max_tokens": 2}`)
	if code != 429 || hdr.Get("Retry-After") != "1" || !strings.Contains(string(data), `"type":"rate_limit_error"`) || !strings.Contains(string(data), "--max-queue 1") {
		t.Fatalf("past the queue: %d %v %s", code, hdr, data)
	}
	cancel()
	if c := <-queued; c != 0 && c != 200 {
		t.Fatalf("the queued request: %d", c)
	}
	ts.waitIdle(t)
	if code, data := post(t, ts.url+"/v1/completions", `{"prompt": "x", "max_tokens": 2}`); code != 200 {
		t.Fatalf("once the queue emptied: %d %s", code, data)
	}
}

// --request-timeout ends a generation with what it generated, finish_reason "timeout".
func TestRequestTimeout(t *testing.T) {
	ts := startServer(t, endless(t), func(c *Config) { c.RequestTimeout = 100 * time.Millisecond })
	long := `{"prompt": "Once upon a time", "max_tokens": 480}`
	code, data := post(t, ts.url+"/v1/completions", long)
	g := decodeCompletion(t, data)
	if code != 200 || g.Choices[0].FinishReason != "timeout" || g.Usage.CompletionTokens >= 480 || len(g.text()) > g.Usage.CompletionTokens {
		t.Fatalf("%d %s", code, data)
	}
	resp, err := client.Post(ts.url+"/v1/completions", "application/json", strings.NewReader(withField(long, "stream", "true")))
	if err != nil {
		t.Fatal(err)
	}
	s := readStream(t, resp.Body)
	resp.Body.Close()
	if s.finish != "timeout" || !s.done || s.chunks >= 480 {
		t.Fatalf("streamed: %+v", s)
	}
	ts.waitIdle(t)
}
