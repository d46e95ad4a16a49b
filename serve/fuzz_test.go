package serve

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// fuzzEndpoints are the endpoints that read a body, FuzzServeRequest's second argument
// modulo their count: the control plane's PATCH with its token, so that a change it takes
// stays for the requests after it.
var fuzzEndpoints = []struct{ method, path string }{
	{"POST", "/v1/completions"}, {"POST", "/v1/chat/completions"}, {"POST", "/tokenize"},
	{"POST", "/detokenize"}, {"PATCH", "/v1/apps/tiny-steer"},
}

// Any body on any endpoint that reads one gets a response: a 200, or a 4xx whose body is a
// JSON error. Never a 5xx (a handler's panic becomes one) nor a connection the server drops.
// One server serves every input, so a request that leaves it broken (a control-plane change
// whose values make every step fail, say) fails the ones after it too.
func FuzzServeRequest(f *testing.F) {
	const token = "fuzz-token"
	ts := startServer(f, nil, func(c *Config) { c.AdminToken = token })
	for _, s := range []string{
		`{"prompt": "Once upon a time", "max_tokens": 4, "temperature": 0, "xmix": {"apps": ["tiny-steer"], "set": {"tiny-steer.op0.alpha": 20}}}`,
		`{"prompt": [84, 111, 109], "max_tokens": 3, "logprobs": 2, "xmix": {"apps": ["tiny-steer", "tiny-probe"], "exports": ["tiny-probe.happy"]}}`,
		`{"prompt": "The old man", "max_tokens": 5, "stop": ["a", "b"], "stream": true, "stream_options": {"include_usage": true}, "xmix": {"apps": ["tiny-probe"], "stop_when": {"export": "tiny-probe.happy", "op": ">", "value": 0.5}}}`,
		`{"messages": [{"role": "system", "content": "hi"}, {"role": "user", "content": [{"type": "text", "text": "x"}]}], "max_tokens": 3, "logprobs": true, "top_logprobs": 3}`,
		`{"messages": [{"role": "user", "content": "hello"}], "max_completion_tokens": 2, "xmix": {"vectors": {"tiny-steer.happy": [1]}, "layers": {"tiny-steer": [0]}}}`,
		`{"prompt": "x", "max_tokens": 2, "min_tokens": 1, "ignore_eos": true, "seed": 3, "top_p": 0.5, "temperature": 1.5, "include_stop_str_in_output": true}`,
		`{"prompt": "Hello", "add_special_tokens": false}`,
		`{"tokens": [72, 101, 108]}`,
		`{"set": {"op0.alpha": 3}, "on_by_default": true}`,
		`{"set": {"op0.alpha": 3e38}, "vectors": {"happy": "AACAPw=="}}`,
	} {
		for e := range fuzzEndpoints {
			f.Add(s, uint8(e))
		}
	}
	// Go's fuzzing ends a worker process whose input runs for 10 s, and a valid request may
	// generate for that long on a loaded machine (chat without max_tokens fills the context:
	// 500 tokens of the tiny model). So a request has 5 s; one that runs out of them passes
	// where the server then answers its health check at once, as a hung server would not.
	c := &http.Client{Timeout: 5 * time.Second}
	health := &http.Client{Timeout: 2 * time.Second}
	f.Fuzz(func(t *testing.T, body string, endpoint uint8) {
		e := fuzzEndpoints[int(endpoint)%len(fuzzEndpoints)]
		req, err := http.NewRequest(e.method, ts.url+e.path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+token)
		// ranOut fails the input unless err is its request running out of time while the
		// server still answers.
		ranOut := func(err error) {
			var te interface{ Timeout() bool } // *url.Error, and the body's read error
			if !errors.As(err, &te) || !te.Timeout() {
				t.Fatalf("%s %s %s: %v", e.method, e.path, body, err)
			}
			h, herr := health.Get(ts.url + "/health")
			if herr != nil {
				t.Fatalf("%s %s %s: %v; then GET /health: %v", e.method, e.path, body, err, herr)
			}
			h.Body.Close()
		}
		resp, err := c.Do(req)
		if err != nil {
			ranOut(err)
			return
		}
		data, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			ranOut(err)
			return
		}
		if resp.StatusCode >= 500 {
			t.Fatalf("%s %s %s -> %d %s\nserver log:\n%s", e.method, e.path, body, resp.StatusCode, data, ts.log.String())
		}
		if resp.StatusCode >= 400 && errorMessage(data) == "" {
			t.Fatalf("%s %s %s -> %d without a JSON error message: %s", e.method, e.path, body, resp.StatusCode, data)
		}
		if resp.StatusCode == 200 && !strings.Contains(body, `"stream"`) && !json.Valid(data) {
			t.Fatalf("%s %s %s -> 200 with a body that is not JSON: %s", e.method, e.path, body, data)
		}
	})
}
