package serve

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
)

// fuzzStops are stop strings for FuzzStopsAndStreams to pick from: single bytes, words of
// the tiny model's stories, multi-byte characters (which the byte tokenizer splits over
// tokens) and strings that share prefixes, so that a held prefix is often a near miss.
var fuzzStops = []string{"e", " ", ".", "the", "he", "she", "and", "a b", "é", "✓", "\n", "ha", "hat", "Tom", "o", "oo", "sad", "happy"}

// FuzzStopsAndStreams: a request made of the fuzzer's values (prompt, max_tokens, sampling,
// min_tokens, stop strings and stop_token_ids with or without include_stop_str_in_output, an
// app, logprobs, either endpoint) gets the same text, finish, stop_reason, usage and logprobs
// streamed as whole; its text is
// where the same request without stops would have written it up to, and holds a stop string
// only at its end, with include_stop_str_in_output.
func FuzzStopsAndStreams(f *testing.F) {
	f.Add(uint8(0), uint8(23), "Once upon a time", []byte{0, 1, 2}, uint8(0))
	f.Add(uint8(5), uint8(15), "The old man", []byte{3, 4}, uint8(7))
	f.Add(uint8(10), uint8(23), "Tom was sad", []byte{11, 12, 13}, uint8(5))
	f.Add(uint8(17), uint8(20), "Once upon a time", []byte{0, 1}, uint8(0))
	f.Add(uint8(33), uint8(23), "Once upon a time", []byte{'e', ' ', 'a'}, uint8(0))
	f.Add(uint8(64), uint8(12), "The old man", []byte{2, 9}, uint8(0))
	f.Add(uint8(70), uint8(12), "Tom was sad", []byte{3}, uint8(9))
	f.Add(uint8(3), uint8(8), "hi", []byte{8}, uint8(0))
	ts := startServer(f, tinyBundle(f), nil)
	// flags: include_stop_str_in_output, chat, sampling (with seed), the steering app,
	// min_tokens, the stop picks as stop_token_ids too, logprobs with 2 top tokens.
	f.Fuzz(func(t *testing.T, flags, maxTokens uint8, prompt string, stopPicks []byte, seed uint8) {
		if prompt = strings.ToValidUTF8(prompt, "?"); prompt == "" || len(prompt) > 64 || len(stopPicks) > 4 {
			return
		}
		var stops []string
		for _, p := range stopPicks {
			stops = append(stops, fuzzStops[int(p)%len(fuzzStops)])
		}
		includeStop := flags&1 != 0
		chat := flags&2 != 0
		n := 1 + int(maxTokens)%24
		body := map[string]any{"max_tokens": n, "temperature": 0}
		if flags&4 != 0 {
			body["temperature"], body["seed"] = 0.9, seed
		}
		if flags&8 != 0 {
			body["xmix"] = map[string]any{"apps": []string{"tiny-steer"}}
		}
		if flags&64 != 0 {
			body["logprobs"] = 2
			if chat {
				body["logprobs"], body["top_logprobs"] = true, 2
			}
		}
		minTokens := 0
		var ids []int // stop_token_ids: the picks as ids too (the tiny model's are bytes)
		if flags&32 != 0 {
			for _, p := range stopPicks {
				ids = append(ids, int(p))
			}
		} else if flags&16 != 0 { // min_tokens would refuse non-EOS stop ids
			minTokens = n / 2
			body["min_tokens"] = minTokens
		}
		path := "/v1/completions"
		if chat {
			path = "/v1/chat/completions"
			body["messages"] = []map[string]string{{"role": "user", "content": prompt}}
		} else {
			body["prompt"] = prompt
		}
		free := postOK(t, ts.url+path, mustJSON(body))
		if len(stops) > 0 {
			body["stop"] = stops
		}
		if ids != nil {
			body["stop_token_ids"] = ids
		}
		body["include_stop_str_in_output"] = includeStop
		whole := postOK(t, ts.url+path, mustJSON(body))
		body["stream"], body["stream_options"] = true, map[string]bool{"include_usage": true}
		resp, err := client.Post(ts.url+path, "application/json", strings.NewReader(mustJSON(body)))
		if err != nil {
			t.Fatal(err)
		}
		s := readStream(t, resp.Body)
		resp.Body.Close()

		w, full := whole.text(), free.text()
		stop, _ := whole.Choices[0].StopReason.(string)
		what := fmt.Sprintf("%s %s (stops %q)", path, mustJSON(body), stops)
		switch {
		case !s.done || s.text != w || s.finish != whole.Choices[0].FinishReason || s.stop != whole.Choices[0].StopReason || s.usage == nil || *s.usage != whole.Usage:
			t.Fatalf("%s: streamed %q %s %v %+v, whole %q %s %v %+v", what, s.text, s.finish, s.stop, s.usage, w, whole.Choices[0].FinishReason, whole.Choices[0].StopReason, whole.Usage)
		case !strings.HasPrefix(full, w):
			t.Fatalf("%s: %q is not where %q (no stops) went", what, w, full)
		case stop != "" && !slices.Contains(stops, stop):
			t.Fatalf("%s: stop_reason %q is none of the stops", what, stop)
		case stop != "" && includeStop && !strings.HasSuffix(w, stop):
			t.Fatalf("%s: %q does not end with its stop %q", what, w, stop)
		case whole.Usage.CompletionTokens > n || whole.Choices[0].FinishReason == "length" && whole.Usage.CompletionTokens != n:
			t.Fatalf("%s: %d tokens, finish %s", what, whole.Usage.CompletionTokens, whole.Choices[0].FinishReason)
		}
		if got, want := joinLogprobs(t, s.logprobs), joinLogprobs(t, []json.RawMessage{whole.Choices[0].Logprobs}); flags&64 != 0 && (got != want || want == "") {
			t.Fatalf("%s: streamed logprobs %s, whole %s", what, got, want)
		}
		before := w
		switch id, byToken := whole.Choices[0].StopReason.(float64); {
		case byToken && !slices.Contains(ids, int(id)):
			t.Fatalf("%s: stop_reason %v is none of the stop ids", what, id)
		case byToken && includeStop:
			before = strings.TrimSuffix(w, ts.tok.Decode([]int{int(id)}))
		case stop != "" && includeStop:
			before = strings.TrimSuffix(w, stop)
		}
		for _, st := range stops {
			// Before min_tokens no stop ends the text, so one may stand in it.
			if minTokens == 0 && strings.Contains(before, st) {
				t.Fatalf("%s: %q holds the stop %q before its end", what, w, st)
			}
		}
	})
}

// joinLogprobs puts logprobs objects (a stream's chunks, or a whole response's one) into one
// text: each list of the endpoint's shape (the completions' four, chat's content) joined in
// order, by key; "" for none.
func joinLogprobs(t *testing.T, objects []json.RawMessage) string {
	joined := map[string][]json.RawMessage{}
	for _, c := range objects {
		if len(c) == 0 || string(c) == "null" {
			continue
		}
		var o map[string][]json.RawMessage
		if err := json.Unmarshal(c, &o); err != nil {
			t.Fatalf("logprobs %s: %v", c, err)
		}
		for k, v := range o {
			joined[k] = append(joined[k], v...)
		}
	}
	var b strings.Builder
	for _, k := range slices.Sorted(maps.Keys(joined)) {
		fmt.Fprintf(&b, "%s: %s\n", k, joined[k])
	}
	return b.String()
}
