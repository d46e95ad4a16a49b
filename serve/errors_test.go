package serve

import (
	"encoding/json"
	"fmt"
	"net/http"
	"reflect"
	"strings"
	"testing"
)

// Every bad request gets its status and an OpenAI error object naming the field at fault;
// fields that do not change results, and unimplemented ones at their defaults, are
// accepted; the server keeps serving after each.
func TestBadRequestsGetOpenAIErrors(t *testing.T) {
	ts := startServer(t, nil, nil)
	const cmpl, chat = "/v1/completions", "/v1/chat/completions"
	long := strings.Repeat("a", 600)
	for _, c := range []struct {
		path, body string
		code       int
		param      string
		want       string
	}{
		{cmpl, `{"prompt": "x"`, 400, "", "not valid JSON"},
		{cmpl, `{"prompt": "x"} {}`, 400, "", "data after"},
		{cmpl, `null`, 400, "", "is null"},
		{cmpl, `[1, 2]`, 400, "", "JSON array; it must be an object"},
		{cmpl, `"x"`, 400, "", "JSON string; it must be an object"},
		{cmpl, ``, 400, "", "not valid JSON"},
		{cmpl, `{"prompt": "x", "bogus": 1}`, 400, "bogus", `unknown field "bogus"`},
		{cmpl, `{}`, 400, "prompt", "prompt: required"},
		{cmpl, `{"prompt": 7}`, 400, "prompt", "want a string or a list of token ids"},
		{cmpl, `{"prompt": []}`, 400, "prompt", "at least one token id"},
		{cmpl, `{"prompt": ["a", "b"]}`, 400, "prompt", "one prompt per request"},
		{cmpl, `{"prompt": [1, 999]}`, 400, "prompt", "prompt token 1: id 999 is outside the vocabulary (0-257)"},
		{cmpl, `{"prompt": "x", "max_tokens": "3"}`, 400, "max_tokens", "max_tokens \"3\": want an integer"},
		{cmpl, `{"prompt": "x", "max_tokens": 0}`, 400, "max_tokens", "max_tokens 0: must be at least 1"},
		{cmpl, `{"prompt": "x", "max_tokens": 9223372036854775807}`, 400, "max_tokens", "max_tokens (9223372036854775807) = 9223372036854775809 exceeds"},
		{cmpl, `{"prompt": "x", "max_tokens": 18446744073709551616}`, 400, "max_tokens", "want an integer"},
		{cmpl, `{"prompt": "x", "max_tokens": -3}`, 400, "max_tokens", "max_tokens -3"},
		{cmpl, `{"prompt": "x", "max_tokens": 600}`, 400, "max_tokens", "exceeds the bundle's max_seq_len 512"},
		// Too long by its bytes alone (tiny's tokenizer: a token a byte), refused before it is
		// encoded; one byte short of that, refused once encoded, BOS and all.
		{cmpl, fmt.Sprintf(`{"prompt": %q}`, long), 400, "prompt", "the prompt is at least 600 tokens (600 bytes of text); the model's context is 512, which leaves no room to generate"},
		{cmpl, fmt.Sprintf(`{"prompt": %q}`, long[:511]), 400, "prompt", "the prompt is 512 tokens (BOS included); the model's context is 512, which leaves no room to generate"},
		{cmpl, `{"prompt": "x", "temperature": -1}`, 400, "temperature", "temperature -1: want a finite number >= 0 (0: greedy)"},
		{cmpl, `{"prompt": "x", "top_p": 1.5}`, 400, "top_p", "top_p 1.5: want a number in [0, 1]"},
		{cmpl, `{"prompt": "x", "n": 2}`, 400, "n", "n 2: only one choice"},
		{cmpl, `{"prompt": "x", "stop": ""}`, 400, "stop", "empty string"},
		{cmpl, fmt.Sprintf(`{"prompt": "x", "stop": [%q, %q]}`, strings.Repeat("a", 1<<19), strings.Repeat("b", 1<<19+1)), 400, "stop", "stop: 1048577 bytes of stop strings; at most 1048576"},
		{cmpl, fmt.Sprintf(`{"prompt": "x", "stop_token_ids": [%s0]}`, strings.Repeat("1, ", 1024)), 400, "stop_token_ids", "stop_token_ids: 1025 ids; at most 1024"},
		{cmpl, `{"prompt": "x", "stop": 3}`, 400, "stop", "want a string or a list of strings"},
		{cmpl, `{"prompt": "x", "frequency_penalty": 0.5}`, 400, "frequency_penalty", "frequency_penalty 0.5: not implemented"},
		{cmpl, `{"prompt": "x", "logit_bias": {"12": 3}}`, 400, "logit_bias", "not implemented"},
		{cmpl, `{"prompt": "x", "echo": true}`, 400, "echo", "not implemented"},
		{cmpl, `{"prompt": "x", "best_of": 3}`, 400, "best_of", "not implemented"},
		{cmpl, `{"prompt": "x", "suffix": "end"}`, 400, "suffix", "not implemented"},
		{cmpl, `{"prompt": "x", "stream_options": {"bogus": true}}`, 400, "stream_options.bogus", "unknown field stream_options.bogus"},
		{cmpl, `{"prompt": "x", "stream_options": 3}`, 400, "stream_options", "want an object"},
		{cmpl, `{"prompt": "x", "xmix": 3}`, 400, "xmix", "want an object"},
		{cmpl, `{"prompt": "x", "xmix": {"app": ["tiny-steer"]}}`, 400, "xmix.app", "unknown field xmix.app"},
		{cmpl, `{"prompt": "x", "xmix": {"apps": ["nope"]}}`, 400, "xmix.apps", `app "nope" is not deployed in this bundle (deployed: tiny-steer, tiny-probe)`},
		{cmpl, `{"prompt": "x", "xmix": {"apps": "tiny-steer"}}`, 400, "xmix.apps", "want a list of strings"},
		{cmpl, `{"prompt": "x", "xmix": {"apps": ["tiny-steer"], "set": {"tiny-steer.op0.nope": 1}}}`, 400, "xmix.set", `override "tiny-steer.op0.nope"`},
		{cmpl, `{"prompt": "x", "xmix": {"apps": ["tiny-steer"], "set": {"tiny-steer.op0.alpha": 3e38}}}`, 400, "xmix.set", `3e+38 times the app's param happy overflows float32`},
		{cmpl, `{"prompt": "x", "xmix": {"apps": ["tiny-steer"], "set": {"tiny-steer.op0.alpha": 1e39}}}`, 400, "xmix.set", "want an object of numbers"},
		{cmpl, `{"prompt": "x", "xmix": {"apps": ["tiny-steer"], "exports": ["tiny-probe.happy"]}}`, 400, "xmix.exports", `export "tiny-probe.happy" is not an export of the enabled apps (none)`},
		{cmpl, `{"prompt": "x", "xmix": {"stop_when": {"export": "tiny-probe.happy", "op": ">", "value": 0.9}}}`, 400, "xmix.stop_when", "the request enables no app with exports"},
		{cmpl, `{"prompt": "x", "stream": true, "xmix": {"apps": ["nope"]}}`, 400, "xmix.apps", `app "nope"`},
		{cmpl, `{"model": "gpt-4", "prompt": "x"}`, 404, "model", `the model "gpt-4" does not exist`},
		{cmpl, fmt.Sprintf(`{"prompt": %q}`, strings.Repeat("a", maxBodyBytes)), 413, "", "larger than"},
		{chat, `{"messages": "hi"}`, 400, "messages", "want a list"},
		{chat, `{"messages": []}`, 400, "messages", "the list is empty"},
		{chat, fmt.Sprintf(`{"messages": [{"role": "user", "content": %q}]}`, long), 400, "messages", "the conversation is at least"},
		{chat, `{"prompt": "x"}`, 400, "prompt", `unknown field "prompt"`},
		{chat, `{}`, 400, "messages", "messages: required"},
		{chat, `{"messages": [{"content": "hi"}]}`, 400, "messages[0].role", "want a role"},
		{chat, `{"messages": [{"role": "tool", "content": "hi"}]}`, 400, "messages[0].role", "tool turns are not implemented"},
		{chat, `{"messages": [{"role": "user"}]}`, 400, "messages[0].content", "needs content"},
		{chat, `{"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}`, 400, "messages[0].content[0]", "only text parts"},
		{chat, `{"messages": [{"role": "user", "content": "hi", "mood": "x"}]}`, 400, "messages[0].mood", "unknown field messages[0].mood"},
		{chat, `{"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function"}]}`, 400, "tools", "not implemented"},
		{chat, `{"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2}`, 400, "top_logprobs", `top_logprobs 2 needs "logprobs": true`},
		{chat, `{"messages": [{"role": "user", "content": "hi"}], "logprobs": true, "top_logprobs": 21}`, 400, "top_logprobs", "top_logprobs 21: want 0 to 20"},
		{cmpl, `{"prompt": "x", "logprobs": -1}`, 400, "logprobs", "logprobs -1"},
		{cmpl, `{"prompt": "x", "logprobs": true}`, 400, "logprobs", "want an integer"},
		{cmpl, `{"prompt": "x", "max_tokens": 4, "min_tokens": 5}`, 400, "min_tokens", "min_tokens 5: want 0 to max_tokens (4)"},
		{cmpl, `{"prompt": "x", "min_tokens": -1}`, 400, "min_tokens", "min_tokens -1"},
		{cmpl, `{"prompt": "x", "stream": true, "max_tokens": -1}`, 400, "max_tokens", "max_tokens -1: must be at least 1"},
		{cmpl, strings.Repeat("[", 100000) + strings.Repeat("]", 100000), 400, "", "exceeded max depth"},
		{cmpl, `{"prompt": ` + strings.Repeat(`{"a":`, 20000) + `1` + strings.Repeat(`}`, 20000) + `}`, 400, "", "exceeded max depth"},
		{cmpl, `  7`, 400, "", "JSON number; it must be an object"},
		{cmpl, `{"prompt": "x", "ignore_eos": 1}`, 400, "ignore_eos", "want true or false"},
		{chat, `{"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 0}`, 400, "max_tokens", "must be at least 1"},
	} {
		code, hdr, data := do(t, "POST", ts.url+c.path, c.body)
		var e errorBody
		if err := json.Unmarshal(data, &e); err != nil {
			t.Errorf("%s %.80s: not an error object: %s", c.path, c.body, data)
			continue
		}
		param := ""
		if e.Error.Param != nil {
			param = *e.Error.Param
		}
		if code != c.code || param != c.param || !strings.Contains(e.Error.Message, c.want) || e.Error.Type != errorType[c.code] {
			t.Errorf("%s %.80s: %d %s, want %d naming %q (param %q)", c.path, c.body, code, data, c.code, c.want, c.param)
		}
		if ct := hdr.Get("Content-Type"); ct != "application/json" {
			t.Errorf("%s %.80s: content type %q", c.path, c.body, ct)
		}
		if code, data := post(t, ts.url+cmpl, `{"prompt": "Once", "max_tokens": 3}`); code != http.StatusOK || decodeCompletion(t, data).Usage.CompletionTokens != 3 {
			t.Fatalf("after %s: a good request got %d %s", c.body, code, data)
		}
	}
	// Accepted: fields that do not change results, and unimplemented ones at their defaults.
	for _, c := range []struct{ path, body string }{
		{cmpl, `{"prompt": "x", "max_tokens": 2, "user": "u1", "frequency_penalty": 0, "presence_penalty": 0.0, "logit_bias": {}, "n": 1,
			"echo": false, "best_of": 1, "logprobs": null, "suffix": null, "seed": -5, "stream": false, "top_k": -1, "ignore_eos": false, "min_tokens": 0,
			"xmix": {"vectors": {}, "layers": {}, "stop_when": null, "apps": []}}`},
		{chat, `{"messages": [{"role": "developer", "content": "x"}, {"role": "user", "content": "y", "name": "bob"}, {"role": "assistant", "content": null, "tool_calls": []}],
			"max_tokens": 2, "metadata": {"a": "b"}, "store": false, "tools": [], "tool_choice": "none", "response_format": {"type": "text"},
			"logprobs": false, "top_logprobs": 0, "parallel_tool_calls": true, "stream_options": {"include_usage": false}}`},
	} {
		if code, data := post(t, ts.url+c.path, c.body); code != http.StatusOK {
			t.Errorf("%s %s: %d %s", c.path, c.body, code, data)
		}
	}
}

// TestJSONKind: a decoding error names the wanted type in English, nested ones too.
func TestJSONKind(t *testing.T) {
	for _, c := range []struct {
		v    any
		want string
	}{
		{[]int{}, "a list of integers"}, {[]string{}, "a list of strings"}, {map[string]float32{}, "an object of numbers"},
		{map[string][]int{}, "an object of lists of integers"}, {[][]bool{}, "a list of lists of true or false values"}, {new(int64), "an integer"},
	} {
		if got := jsonKind(reflect.TypeOf(c.v)); got != c.want {
			t.Errorf("%T: %q, want %q", c.v, got, c.want)
		}
	}
}
