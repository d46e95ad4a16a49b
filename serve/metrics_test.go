package serve

import (
	"regexp"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// GET /metrics reports, in Prometheus' text format, what the issue lists: requests by
// outcome, tokens, TTFT/ITL/end-to-end histograms, running and waiting requests, KV-cache
// use, step time by bucket, per-app enabled requests; --log-requests writes one line per
// request.
func TestMetricsAndRequestLog(t *testing.T) {
	ts := startServer(t, nil, nil)
	post(t, ts.url+"/v1/completions", `{"prompt": "Hi", "max_tokens": 3, "xmix": {"apps": ["tiny-probe"]}}`)
	post(t, ts.url+"/v1/completions", `{"prompt": "Hi", "max_tokens": 2, "stream": true}`)
	post(t, ts.url+"/v1/completions", `{"prompt": "Hi", "max_tokens": 0}`)
	code, hdr, data := do(t, "GET", ts.url+"/metrics", "")
	if code != 200 || !strings.HasPrefix(hdr.Get("Content-Type"), "text/plain") {
		t.Fatalf("%d %v", code, hdr)
	}
	text := string(data)
	for _, want := range []string{
		`xmix_requests_total{code="200",endpoint="/v1/completions",outcome="length"} 2`,
		`xmix_requests_total{code="400",endpoint="/v1/completions",outcome="error"} 1`,
		`xmix_prompt_tokens_total 6`,
		`xmix_generation_tokens_total 5`,
		`xmix_time_to_first_token_seconds_count 2`,
		`xmix_inter_token_latency_seconds_count 3`,
		`xmix_e2e_request_latency_seconds_count 2`,
		`xmix_requests_running 0`,
		`xmix_requests_waiting 0`,
		`xmix_kv_cache_usage_ratio 0`,
		`xmix_app_enabled_requests_total{app="tiny-probe"} 1`,
		`xmix_app_enabled_requests_total{app="tiny-steer"} 0`,
		`xmix_requests_aborted_total 0`,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
	for _, re := range []string{`xmix_step_duration_seconds_count\{bucket="decode_b1"\} [1-9]`, `xmix_step_duration_seconds_count\{bucket="prefill_t\d+"\} [1-9]`} {
		if !regexp.MustCompile(re).MatchString(text) {
			t.Errorf("metrics lack %s:\n%s", re, grep(text, "step_duration_seconds_count"))
		}
	}
	lines := strings.Split(strings.TrimSpace(ts.log.String()), "\n")
	if len(lines) != 3 {
		t.Fatalf("%d log lines, want 3:\n%s", len(lines), ts.log.String())
	}
	for i, re := range []string{
		`^\S+ POST /v1/completions 200 id=cmpl-\w+ outcome=length prompt_tokens=3 completion_tokens=3 stream=false apps=tiny-probe ttft_ms=[\d.]+ ms=[\d.]+ remote=127\.0\.0\.1:\d+$`,
		`^\S+ POST /v1/completions 200 id=cmpl-\w+ outcome=length prompt_tokens=3 completion_tokens=2 stream=true ttft_ms=[\d.]+ ms=[\d.]+ remote=`,
		`^\S+ POST /v1/completions 400 outcome=error ms=`,
	} {
		if !regexp.MustCompile(re).MatchString(lines[i]) {
			t.Errorf("log line %d: %q, want %s", i, lines[i], re)
		}
	}
}

func grep(text, s string) string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		if strings.Contains(l, s) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// A request the engine refuses is counted out and answered by the loop before the loop next
// publishes its load; a scrape after that answer must not show it waiting (CI's race run
// once read the figure from before the refusal).
func TestWaitingIsReadWhenScraped(t *testing.T) {
	sv := newTinyServer(t)
	sv.pending.Add(1) // a request on its way to the loop
	sv.observeLoad(sv.eng.Load())
	for _, c := range []struct {
		add  int64
		want float64
	}{{-1, 0}, {3, 3}} {
		sv.pending.Add(c.add)
		if got := testutil.ToFloat64(sv.metrics.waiting); got != c.want {
			t.Errorf("after pending %+d: xmix_requests_waiting %g, want %g", c.add, got, c.want)
		}
	}
}
