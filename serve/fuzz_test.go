package serve

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// Any body on either generation endpoint gets a response: a completion, or a 4xx whose body
// is a JSON error. Never a 5xx (a handler's panic becomes one) nor a connection the server
// drops. One server serves every input, so a request that leaves it broken fails the ones
// after it too.
func FuzzServeRequest(f *testing.F) {
	ts := startServer(f, nil, nil)
	for _, s := range []string{
		`{"prompt": "Once upon a time", "max_tokens": 4, "temperature": 0, "xmix": {"apps": ["tiny-steer"], "set": {"tiny-steer.op0.alpha": 20}}}`,
		`{"prompt": [84, 111, 109], "max_tokens": 3, "logprobs": 2, "xmix": {"apps": ["tiny-steer", "tiny-probe"], "exports": ["tiny-probe.happy"]}}`,
		`{"prompt": "The old man", "max_tokens": 5, "stop": ["a", "b"], "stream": true, "stream_options": {"include_usage": true}, "xmix": {"apps": ["tiny-probe"], "stop_when": {"export": "tiny-probe.happy", "op": ">", "value": 0.5}}}`,
		`{"messages": [{"role": "system", "content": "hi"}, {"role": "user", "content": [{"type": "text", "text": "x"}]}], "max_tokens": 3, "logprobs": true, "top_logprobs": 3}`,
		`{"messages": [{"role": "user", "content": "hello"}], "max_completion_tokens": 2, "xmix": {"vectors": {"tiny-steer.happy": [1]}, "layers": {"tiny-steer": [0]}}}`,
		`{"prompt": "x", "max_tokens": 2, "min_tokens": 1, "ignore_eos": true, "seed": 3, "top_p": 0.5, "temperature": 1.5, "include_stop_str_in_output": true}`,
	} {
		f.Add(s, false)
		f.Add(s, true)
	}
	c := &http.Client{Timeout: 30 * time.Second}
	f.Fuzz(func(t *testing.T, body string, chat bool) {
		path := "/v1/completions"
		if chat {
			path = "/v1/chat/completions"
		}
		resp, err := c.Post(ts.url+path, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatalf("%s: %v", body, err)
		}
		data, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatalf("%s: reading the response: %v", body, err)
		}
		if resp.StatusCode >= 500 {
			t.Fatalf("%s -> %d %s\nserver log:\n%s", body, resp.StatusCode, data, ts.log.String())
		}
		if resp.StatusCode >= 400 && errorMessage(data) == "" {
			t.Fatalf("%s -> %d without a JSON error message: %s", body, resp.StatusCode, data)
		}
		if resp.StatusCode == 200 && !strings.Contains(body, `"stream"`) && !json.Valid(data) {
			t.Fatalf("%s -> 200 with a body that is not JSON: %s", body, data)
		}
	})
}
