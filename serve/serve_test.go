package serve

import (
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"xmix/bundle"
	"xmix/chat"
	"xmix/compile"
	"xmix/loader"
	"xmix/testsuite"
)

// servedCase is a request body with the engine request it must run as.
type servedCase struct {
	path string
	body string
	req  loader.Request
}

func tinyCases(tok loader.Tokenizer) []servedCase {
	enc := tok.Encode
	return []servedCase{
		{"/v1/completions", `{"prompt": "Once upon a time", "max_tokens": 12, "temperature": 0}`,
			loader.Request{Prompt: enc("Once upon a time"), MaxTokens: 12, TopP: 1}},
		{"/v1/completions", `{"prompt": "Once upon a time", "max_tokens": 12, "temperature": 0, "xmix": {"apps": ["tiny-steer"], "set": {"tiny-steer.op0.alpha": 20}}}`,
			loader.Request{Prompt: enc("Once upon a time"), MaxTokens: 12, TopP: 1, Apps: []string{"tiny-steer"},
				Overrides: map[string]float32{"tiny-steer.op0.alpha": 20}}},
		{"/v1/completions", `{"prompt": "The old man", "max_tokens": 10, "temperature": 0.8, "top_p": 0.9, "seed": 7, "xmix": {"apps": ["tiny-probe"]}}`,
			loader.Request{Prompt: enc("The old man"), MaxTokens: 10, Apps: []string{"tiny-probe"}, Temperature: 0.8, TopP: 0.9, Seed: 7}},
		{"/v1/completions", `{"prompt": [84, 111, 109], "max_tokens": 8, "temperature": 0, "xmix": {"apps": ["tiny-steer", "tiny-probe"]}}`,
			loader.Request{Prompt: []int{84, 111, 109}, MaxTokens: 8, TopP: 1, Apps: []string{"tiny-steer", "tiny-probe"}}},
		{"/v1/completions", `{"prompt": "Tom was sad.", "max_tokens": 300, "temperature": 0}`,
			loader.Request{Prompt: enc("Tom was sad."), MaxTokens: 300, TopP: 1}},
		{"/v1/completions", `{"prompt": [256, 84, 111, 109], "add_special_tokens": false, "max_tokens": 6, "temperature": 0}`,
			loader.Request{Prompt: []int{256, 84, 111, 109}, Verbatim: true, MaxTokens: 6, TopP: 1}},
	}
}

// alone runs each request by itself on an engine of its own.
func alone(t *testing.T, b *bundle.Bundle, reqs ...loader.Request) []loader.Result {
	t.Helper()
	eng, _ := engineFor(t, b)
	out := make([]loader.Result, len(reqs))
	for i, r := range reqs {
		res, err := eng.Generate([]loader.Request{r})
		if err != nil {
			t.Fatal(err)
		}
		out[i] = res[0]
	}
	return out
}

// checkAgainst compares a response (whole or streamed, put together) with the engine's
// result for the same request alone: text, finish reason, token count and every export
// per generated token.
func checkAgainst(t *testing.T, what string, tok loader.Tokenizer, want loader.Result, text, finish string, completionTokens int, exports map[string][]json.RawMessage, apps []string) {
	t.Helper()
	if wantText := tok.Decode(want.Tokens); text != wantText || finish != want.Reason || completionTokens != len(want.Tokens) {
		t.Errorf("%s: %q (%s, %d tokens), alone %q (%s, %d tokens)", what, text, finish, completionTokens, wantText, want.Reason, len(want.Tokens))
		return
	}
	if !slices.Contains(apps, "tiny-probe") {
		if len(exports) != 0 {
			t.Errorf("%s: exports without an app that has one: %v", what, exports)
		}
		return
	}
	got := exports["tiny-probe.happy"]
	if len(got) != len(want.Tokens) {
		t.Fatalf("%s: %d probe values for %d tokens", what, len(got), len(want.Tokens))
	}
	for k := range want.Tokens {
		w := want.Rows[want.PromptTokens-1+k].Exports.Get("tiny-probe.happy")
		var g float64
		if err := json.Unmarshal(got[k], &g); err != nil || len(w) != 1 || math.Abs(g-float64(w[0])) > 1e-4 {
			t.Errorf("%s: token %d probe %s, alone %v", what, k, got[k], w)
		}
	}
}

func TestCompletionsMatchTheEngineAlone(t *testing.T) {
	b := tinyBundle(t)
	ts := startServer(t, b, nil)
	cases := tinyCases(ts.tok)
	var reqs []loader.Request
	for _, c := range cases {
		reqs = append(reqs, c.req)
	}
	want := alone(t, b, reqs...)
	if slices.Equal(want[0].Tokens, want[1].Tokens) {
		t.Fatal("the steered request generates what the plain one does; the test would prove nothing")
	}
	if want[4].Reason != loader.ReasonStop {
		t.Fatalf("case 4 should end at EOS, ended %s", want[4].Reason)
	}
	got := make([]completion, len(cases))
	var wg sync.WaitGroup
	for i, c := range cases {
		wg.Add(1)
		go func() {
			defer wg.Done()
			code, body := post(t, ts.url+c.path, c.body)
			if code != http.StatusOK {
				t.Errorf("case %d: status %d: %s", i, code, body)
				return
			}
			got[i] = decodeCompletion(t, body)
		}()
	}
	wg.Wait()
	for i, w := range want {
		g := got[i]
		if t.Failed() {
			return
		}
		checkAgainst(t, fmt.Sprint("case ", i), ts.tok, w, g.text(), g.Choices[0].FinishReason, g.Usage.CompletionTokens, g.Xmix.Exports, cases[i].req.Apps)
		if g.Usage.PromptTokens != w.PromptTokens || g.Usage.TotalTokens != w.PromptTokens+len(w.Tokens) {
			t.Errorf("case %d: usage %+v, prompt of %d", i, g.Usage, w.PromptTokens)
		}
		if g.Object != "text_completion" || !strings.HasPrefix(g.ID, "cmpl-") || g.Model != "tiny" {
			t.Errorf("case %d: object %q id %q model %q", i, g.Object, g.ID, g.Model)
		}
		if !slices.Equal(g.Xmix.Apps, cases[i].req.Apps) {
			t.Errorf("case %d: xmix.apps %v, want %v", i, g.Xmix.Apps, cases[i].req.Apps)
		}
	}
}

// A streamed response equals the whole one: text, finish reason, usage, and the exports its
// chunks carry, one per generated token.
func TestStreamEqualsWhole(t *testing.T) {
	b := tinyBundle(t)
	ts := startServer(t, b, nil)
	cases := tinyCases(ts.tok)
	for i, c := range cases {
		code, body := post(t, ts.url+c.path, c.body)
		if code != http.StatusOK {
			t.Fatalf("case %d: %d %s", i, code, body)
		}
		whole := decodeCompletion(t, body)
		resp, err := client.Post(ts.url+c.path, "application/json",
			strings.NewReader(withField(withField(c.body, "stream", "true"), "stream_options", `{"include_usage": true}`)))
		if err != nil {
			t.Fatal(err)
		}
		if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
			t.Errorf("content type %q", ct)
		}
		s := readStream(t, resp.Body)
		resp.Body.Close()
		if !s.done || s.text != whole.text() || s.finish != whole.Choices[0].FinishReason || s.usage == nil || *s.usage != whole.Usage {
			t.Errorf("case %d: streamed %q %s %+v (done %v), whole %q %s %+v", i, s.text, s.finish, s.usage, s.done, whole.text(), whole.Choices[0].FinishReason, whole.Usage)
		}
		if s.chunks != whole.Usage.CompletionTokens {
			t.Errorf("case %d: %d chunks for %d tokens", i, s.chunks, whole.Usage.CompletionTokens)
		}
		for name, v := range whole.Xmix.Exports {
			if fmt.Sprint(s.exports[name]) != fmt.Sprint(v) {
				t.Errorf("case %d: streamed %s %s, whole %s", i, name, s.exports[name], v)
			}
		}
		if len(s.exports) != len(whole.Xmix.Exports) {
			t.Errorf("case %d: streamed exports %v, whole %v", i, s.exports, whole.Xmix.Exports)
		}
	}
	// prompt_exports: streamed, the prompt's reads come in the last chunk, as the whole
	// response has them.
	probed := `{"prompt": "The old man", "max_tokens": 4, "temperature": 0, "xmix": {"apps": ["tiny-probe"], "prompt_exports": true}}`
	code, body := post(t, ts.url+"/v1/completions", probed)
	whole := decodeCompletion(t, body)
	stream, err := client.Post(ts.url+"/v1/completions", "application/json", strings.NewReader(withField(probed, "stream", "true")))
	if err != nil {
		t.Fatal(err)
	}
	s := readStream(t, stream.Body)
	stream.Body.Close()
	if want := whole.Xmix.PromptExports["tiny-probe.happy"]; code != http.StatusOK || len(want) != whole.Usage.PromptTokens ||
		fmt.Sprint(s.prompt["tiny-probe.happy"]) != fmt.Sprint(want) {
		t.Errorf("prompt_exports: streamed %s, whole %s (%d %s)", s.prompt, want, code, body)
	}
	// Without include_usage no chunk carries usage.
	resp, err := client.Post(ts.url+"/v1/completions", "application/json", strings.NewReader(`{"prompt": "Hi", "max_tokens": 3, "stream": true}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if s := readStream(t, resp.Body); s.usage != nil || s.chunks != 3 || !s.done || s.finish != "length" {
		t.Errorf("without include_usage: %+v", s)
	}
}

// Chat: messages through the chat template, multi-turn, streaming with a role chunk first.
func TestChatCompletions(t *testing.T) {
	b := tinyBundle(t)
	ts := startServer(t, b, nil)
	// The embedded model's template: a "Role: text" line per turn, then "Assistant:".
	prompt := loader.InputIDs(b.Manifest.Model, loader.Request{Prompt: ts.tok.Encode(
		"System: Be kind.\nUser: Tell a story.\nAssistant: Once upon a time.\nUser: Another.\nAssistant:")})
	want := alone(t, b,
		loader.Request{Prompt: prompt, Verbatim: true, MaxTokens: 20, TopP: 1},
		loader.Request{Prompt: prompt, Verbatim: true, MaxTokens: 20, TopP: 1, Apps: []string{"tiny-probe"}})
	body := `{"model": "tiny", "messages": [{"role": "system", "content": "Be kind."}, {"role": "user", "content": "Tell a story."},
		{"role": "assistant", "content": "Once upon a time."}, {"role": "user", "content": [{"type": "text", "text": "Ano"}, {"type": "text", "text": "ther."}]}],
		"max_completion_tokens": 20, "temperature": 0}`
	for i, b := range []string{body, withField(body, "xmix", `{"apps": ["tiny-probe"]}`)} {
		code, data := post(t, ts.url+"/v1/chat/completions", b)
		if code != http.StatusOK {
			t.Fatalf("%d %s", code, data)
		}
		whole := decodeCompletion(t, data)
		if whole.Object != "chat.completion" || whole.Choices[0].Message.Role != "assistant" || !strings.HasPrefix(whole.ID, "chatcmpl-") {
			t.Errorf("response %s", data)
		}
		checkAgainst(t, "chat", ts.tok, want[i], whole.text(), whole.Choices[0].FinishReason, whole.Usage.CompletionTokens, whole.Xmix.Exports, whole.Xmix.Apps)
		resp, err := client.Post(ts.url+"/v1/chat/completions", "application/json", strings.NewReader(withField(b, "stream", "true")))
		if err != nil {
			t.Fatal(err)
		}
		s := readStream(t, resp.Body)
		resp.Body.Close()
		if s.role != "assistant" || s.text != whole.text() || s.finish != whole.Choices[0].FinishReason || !s.done {
			t.Errorf("streamed chat %+v, whole %q", s, whole.text())
		}
		checkAgainst(t, "streamed chat", ts.tok, want[i], s.text, s.finish, s.chunks, s.exports, whole.Xmix.Apps)
	}
	// max_tokens is the older name of max_completion_tokens; without either, the rest of the context.
	code, data := post(t, ts.url+"/v1/chat/completions", `{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}`)
	if code != http.StatusOK || decodeCompletion(t, data).Usage.CompletionTokens != 2 {
		t.Errorf("max_tokens: %d %s", code, data)
	}
	// A model without a chat template says so.
	none := tinyBundle(t)
	none.Manifest.Model.ChatTemplate = ""
	plain := startServer(t, none, nil)
	code, data = post(t, plain.url+"/v1/chat/completions", `{"messages": [{"role": "user", "content": "Hi"}]}`)
	if code != http.StatusBadRequest || !strings.Contains(string(data), "no chat template") {
		t.Errorf("no template: %d %s", code, data)
	}
	// A template that doubles a string in a loop (the checkpoint's file, not the request, is
	// at fault) fails the request with the construct's place, and the server serves on.
	runaway := tinyBundle(t)
	runaway.Manifest.Model.ChatTemplate = "{% set ns = namespace(s='x') %}{% for i in range(80) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}"
	bad := startServer(t, runaway, nil)
	code, data = post(t, bad.url+"/v1/chat/completions", `{"messages": [{"role": "user", "content": "Hi"}]}`)
	if code != http.StatusBadRequest || !strings.Contains(string(data), "chat template: template 1:75: string longer than") {
		t.Errorf("runaway template: %d %s", code, data)
	}
	if code, data = post(t, bad.url+"/v1/completions", `{"prompt": "Once", "max_tokens": 2}`); code != http.StatusOK {
		t.Errorf("after the runaway template: %d %s", code, data)
	}
}

// Stop strings end the text where they start, across token boundaries and while streaming,
// with finish_reason "stop" and the string as stop_reason; usage counts the tokens up to the
// one that completed it.
func TestStopStrings(t *testing.T) {
	b := tinyBundle(t)
	ts := startServer(t, b, nil)
	full := alone(t, b, loader.Request{Prompt: ts.tok.Encode("Once upon a time"), MaxTokens: 40, TopP: 1})[0]
	text := ts.tok.Decode(full.Tokens)
	if len(text) < 30 {
		t.Fatalf("too short to test: %q", text)
	}
	stop := text[10:14] // four byte tokens: a match across token boundaries
	first := strings.Index(text, stop)
	base := `{"prompt": "Once upon a time", "max_tokens": 40, "temperature": 0`
	for _, c := range []struct {
		stops, extra string
		text         string
		finish       string
		tokens       int
		stopReason   string
	}{
		{fmt.Sprintf("%q", stop), "", text[:first], "stop", first + len(stop), stop},
		{fmt.Sprintf("[%q, %q]", "zzzz", stop), `, "include_stop_str_in_output": true`, text[:first+len(stop)], "stop", first + len(stop), stop},
		// A prefix held back that never completes is released at the end.
		{fmt.Sprintf("%q", text[len(text)-2:]+"\u00e9"), "", text, "length", 40, ""},
	} {
		body := base + `, "stop": ` + c.stops + c.extra + "}"
		code, data := post(t, ts.url+"/v1/completions", body)
		if code != http.StatusOK {
			t.Fatalf("%s: %d %s", body, code, data)
		}
		g := decodeCompletion(t, data)
		sr, _ := g.Choices[0].StopReason.(string)
		if g.text() != c.text || g.Choices[0].FinishReason != c.finish || g.Usage.CompletionTokens != c.tokens || sr != c.stopReason {
			t.Errorf("stop %s: %q %s %d tokens (stop_reason %q), want %q %s %d (%q)", c.stops, g.text(), g.Choices[0].FinishReason,
				g.Usage.CompletionTokens, sr, c.text, c.finish, c.tokens, c.stopReason)
		}
		resp, err := client.Post(ts.url+"/v1/completions", "application/json", strings.NewReader(withField(withField(body, "stream", "true"), "stream_options", `{"include_usage": true}`)))
		if err != nil {
			t.Fatal(err)
		}
		s := readStream(t, resp.Body)
		resp.Body.Close()
		ssr, _ := s.stop.(string)
		if s.text != c.text || s.finish != c.finish || s.usage == nil || s.usage.CompletionTokens != c.tokens || ssr != c.stopReason || s.chunks != c.tokens {
			t.Errorf("streamed stop %s: %q %s %+v %d chunks (stop_reason %q), want %q %s %d", c.stops, s.text, s.finish, s.usage, s.chunks, ssr, c.text, c.finish, c.tokens)
		}
	}
}

func TestStopMatcher(t *testing.T) {
	for _, c := range []struct {
		stops  []string
		pieces []string
		want   []string // released per piece
		match  string
	}{
		{[]string{"abc"}, []string{"xa", "b", "c", "d"}, []string{"x", "", "", "d"}, "abc"},
		{[]string{"abc"}, []string{"xa", "b", "x"}, []string{"x", "", "abx"}, ""},
		{[]string{"bc", "abcd"}, []string{"a", "bc"}, []string{"", "a"}, "bc"},
		{[]string{"é!"}, []string{"a", "é", "?"}, []string{"a", "", "é?"}, ""},
		{nil, []string{"a", "b"}, []string{"a", "b"}, ""},
	} {
		m := newStopMatcher(c.stops, false)
		var got []string
		for _, p := range c.pieces {
			if m.matched != "" {
				got = append(got, p) // past the match the caller stops feeding; feed passes text through
				continue
			}
			got = append(got, m.feed(p))
		}
		if !slices.Equal(got, c.want) || m.matched != c.match {
			t.Errorf("%v %v: released %q, matched %q; want %q, %q", c.stops, c.pieces, got, m.matched, c.want, c.match)
		}
	}
}

// TestStopMatcherMatchesTheDefinition: on random stop strings and pieces over a small
// alphabet, with min_tokens arming it part way, the matcher releases what the definition
// says after each piece: once armed, of the stop strings that end in the piece, the one
// that starts first (the longer on a tie) ends the text; otherwise everything but the
// longest end of the text that begins a stop string.
func TestStopMatcherMatchesTheDefinition(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	word := func(n int) string {
		b := make([]byte, n)
		for i := range b {
			b[i] = "abc"[r.IntN(3)]
		}
		return string(b)
	}
	for range 20000 {
		stops := make([]string, 1+r.IntN(3))
		for i := range stops {
			stops[i] = word(1 + r.IntN(5))
		}
		include, armedFrom := r.IntN(2) == 0, r.IntN(4)
		m := newStopMatcher(stops, include)
		text, released := "", 0
		for k := range 10 {
			piece := word(r.IntN(4))
			m.unarmed = k < armedFrom
			got := m.feed(piece)
			text += piece
			want, match := "", ""
			at := -1
			if k >= armedFrom {
				for _, st := range stops {
					for start := max(0, len(text)-len(piece)-len(st)+1); start+len(st) <= len(text); start++ {
						if text[start:start+len(st)] == st && start+len(st) > len(text)-len(piece) &&
							(at < 0 || start < at || start == at && len(st) > len(match)) {
							at, match = start, st
						}
					}
				}
			}
			if at >= 0 {
				want = text[released:at]
				if include {
					want += match
				}
			} else {
				keep := 0
				for _, st := range stops {
					for l := 1; l < len(st) && l <= len(text); l++ {
						if strings.HasSuffix(text, st[:l]) {
							keep = max(keep, l)
						}
					}
				}
				want = text[released : len(text)-keep]
				released = len(text) - keep
			}
			if got != want || m.matched != match {
				t.Fatalf("stops %q, include %v, armed from piece %d, text %q after piece %d %q: released %q, matched %q; want %q, %q",
					stops, include, armedFrom, text, k, piece, got, m.matched, want, match)
			}
			if at >= 0 {
				break
			}
		}
	}
}

// stop_token_ids (vLLM's): the first generated id among them ends the text, its own text
// left out unless include_stop_str_in_output, with finish_reason "stop" and the id as
// stop_reason, whole and streamed; ids out of the vocabulary, and a non-EOS id with
// min_tokens (whose ban covers EOS ids alone), are refused.
func TestStopTokenIDs(t *testing.T) {
	b := tinyBundle(t)
	ts := startServer(t, b, nil)
	full := alone(t, b, loader.Request{Prompt: ts.tok.Encode("Once upon a time"), MaxTokens: 40, TopP: 1})[0].Tokens
	k := 3 // the first place from 3 on whose token came no earlier
	for slices.Contains(full[:k], full[k]) {
		k++
	}
	stop := full[k]
	base := fmt.Sprintf(`{"prompt": "Once upon a time", "max_tokens": 40, "temperature": 0, "stop_token_ids": [%d]`, stop)
	for _, c := range []struct {
		extra string
		text  string
	}{
		{"", ts.tok.Decode(full[:k])},
		{`, "include_stop_str_in_output": true`, ts.tok.Decode(full[:k+1])},
	} {
		body := base + c.extra + "}"
		whole := postOK(t, ts.url+"/v1/completions", body)
		got := whole.Choices[0]
		if got.Text != c.text || got.FinishReason != "stop" || got.StopReason != float64(stop) || whole.Usage.CompletionTokens != k+1 {
			t.Errorf("%s: %q %s %v, %d tokens; want %q stop %d, %d tokens", body, got.Text, got.FinishReason, got.StopReason, whole.Usage.CompletionTokens, c.text, stop, k+1)
		}
		resp, err := client.Post(ts.url+"/v1/completions", "application/json", strings.NewReader(withField(withField(body, "stream", "true"), "stream_options", `{"include_usage": true}`)))
		if err != nil {
			t.Fatal(err)
		}
		s := readStream(t, resp.Body)
		resp.Body.Close()
		if s.text != c.text || s.finish != "stop" || s.stop != float64(stop) || s.usage == nil || s.usage.CompletionTokens != k+1 {
			t.Errorf("streamed %s: %q %s %v %+v", body, s.text, s.finish, s.stop, s.usage)
		}
	}
	for _, c := range []struct{ body, want string }{
		{`{"prompt": "x", "stop_token_ids": [258]}`, "stop_token_ids: 258 is not a token id of this model (0 to 257)"},
		{`{"prompt": "x", "stop_token_ids": [-1]}`, "stop_token_ids: -1 is not a token id"},
		{`{"prompt": "x", "stop_token_ids": "257"}`, "stop_token_ids \"257\": want a list of integers"},
		{`{"prompt": "x", "stop_token_ids": [65], "min_tokens": 2}`, "stop_token_ids 65 with min_tokens 2: not implemented (before min_tokens the sampler bans only the model's EOS ids [257])"},
	} {
		if code, data := post(t, ts.url+"/v1/completions", c.body); code != http.StatusBadRequest || !strings.Contains(errorMessage(data), c.want) {
			t.Errorf("%s: %d %s, want 400 %q", c.body, code, data, c.want)
		}
	}
	// An EOS id ends the request by itself (stop_reason null), and with ignore_eos as a stop
	// id: the same text either way, since EOS has none.
	eos := postOK(t, ts.url+"/v1/completions", `{"prompt": "Tom was sad.", "max_tokens": 300, "temperature": 0, "stop_token_ids": [257]}`)
	ignored := postOK(t, ts.url+"/v1/completions", `{"prompt": "Tom was sad.", "max_tokens": 300, "temperature": 0, "stop_token_ids": [257], "ignore_eos": true, "include_stop_str_in_output": true}`)
	if e, i := eos.Choices[0], ignored.Choices[0]; e.FinishReason != "stop" || e.StopReason != nil || i.FinishReason != "stop" || i.StopReason != float64(257) ||
		i.Text != e.Text || ignored.Usage != eos.Usage {
		t.Errorf("EOS as a stop id: %+v %+v; with ignore_eos %+v %+v", e, eos.Usage, i, ignored.Usage)
	}
	// EOS ids with min_tokens: the sampler's ban covers them.
	if code, data := post(t, ts.url+"/v1/completions", `{"prompt": "x", "max_tokens": 3, "stop_token_ids": [257], "min_tokens": 2}`); code != http.StatusOK {
		t.Errorf("an EOS id with min_tokens: %d %s", code, data)
	}
}

// Special tokens have no text in a response, as with vLLM's default skip_special_tokens:
// a random model with Llama 3's tokenizer, made to generate <|start_header_id|> (an added
// token marked special) by token_override, answers text without it, while its logprobs name
// the token at its place; with skip_special_tokens false the text keeps it.
func TestSpecialTokensHaveNoText(t *testing.T) {
	dir := t.TempDir()
	for name, data := range map[string][]byte{
		"model.yaml": []byte(`model: m
family: llama
dims: {hidden: 64, intermediate: 32, layers: 1, heads: 2, kv_heads: 1, head_dim: 32, vocab: 128256, tie_embeddings: true}
weights: {synthetic: {seed: 1, std: 0.02}}
tokenizer: {hf: ` + testsuite.CheckpointTokenizer(t, "llama3_1") + `}
eos: [128009]
serving: {decode_buckets: [1], prefill_chunks: [16], max_seq_len: 64, max_seqs: 1, kv_block_size: 16}
`),
		"header.yaml": []byte(`app: header
ops:
  - write: {at: {hook: sampled}, kernel: token_override, args: {token: 128006}, when: {steps: {from: 1, to: 2}}}
`),
		"eot.yaml": []byte(`app: eot
ops:
  - write: {at: {hook: sampled}, kernel: token_override, args: {token: 128009}, when: {steps: {from: 2, to: 3}}}
`),
	} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	b, err := compile.Build(filepath.Join(dir, "model.yaml"), []string{filepath.Join(dir, "header.yaml"), filepath.Join(dir, "eot.yaml")}, compile.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ts := startServer(t, b, nil)
	for _, keep := range []bool{false, true} {
		body := fmt.Sprintf(`{"prompt": "Hello", "max_tokens": 4, "temperature": 0, "logprobs": 0, "skip_special_tokens": %v, "xmix": {"apps": ["header"]}}`, !keep)
		code, data := post(t, ts.url+"/v1/completions", body)
		if code != http.StatusOK {
			t.Fatalf("%d %s", code, data)
		}
		var resp struct {
			Choices []struct {
				Text         string             `json:"text"`
				FinishReason string             `json:"finish_reason"`
				Logprobs     completionLogprobs `json:"logprobs"`
			} `json:"choices"`
		}
		if err := json.Unmarshal(data, &resp); err != nil {
			t.Fatal(err)
		}
		c := resp.Choices[0]
		want := slices.Clone(c.Logprobs.Tokens)
		if !keep {
			want = slices.DeleteFunc(want, func(s string) bool { return s == "<|start_header_id|>" })
		}
		// skip_special_tokens false (vLLM's): the special token's text is kept.
		if !slices.Contains(c.Logprobs.Tokens, "<|start_header_id|>") || c.FinishReason != "length" || c.Text != strings.Join(want, "") {
			t.Errorf("%s: text %q (%s), tokens %q", body, c.Text, c.FinishReason, c.Logprobs.Tokens)
		}
	}
	// The EOS that ends the request has no text, even kept, unless include_stop_str_in_output
	// asks for the stopping token too.
	for _, include := range []bool{false, true} {
		body := fmt.Sprintf(`{"prompt": "Hello", "max_tokens": 6, "temperature": 0, "skip_special_tokens": false, "include_stop_str_in_output": %v, "xmix": {"apps": ["header", "eot"]}}`, include)
		g := postOK(t, ts.url+"/v1/completions", body)
		if c := g.Choices[0]; c.FinishReason != "stop" || g.Usage.CompletionTokens != 4 || !strings.Contains(c.Text, "<|start_header_id|>") ||
			strings.HasSuffix(c.Text, "<|eot_id|>") != include {
			t.Errorf("%s: text %q (%s, %d tokens)", body, c.Text, c.FinishReason, g.Usage.CompletionTokens)
		}
	}
}

func TestModelsHealthAndRouting(t *testing.T) {
	ts := startServer(t, nil, func(c *Config) { c.ModelName = "my-tiny" })
	code, _, data := do(t, "GET", ts.url+"/v1/models", "")
	var list struct {
		Object string      `json:"object"`
		Data   []modelCard `json:"data"`
	}
	if err := json.Unmarshal(data, &list); err != nil || code != 200 || list.Object != "list" || len(list.Data) != 1 ||
		list.Data[0].ID != "my-tiny" || list.Data[0].Object != "model" || list.Data[0].MaxModelLen != 512 {
		t.Errorf("models: %d %s", code, data)
	}
	if code, _, data := do(t, "GET", ts.url+"/v1/models/my-tiny", ""); code != 200 || !strings.Contains(string(data), `"id":"my-tiny"`) {
		t.Errorf("model by id: %d %s", code, data)
	}
	for _, c := range []struct {
		method, path, body string
		code               int
		want               string
	}{
		{"GET", "/v1/models/tiny", "", 404, `"model_not_found"`},
		{"POST", "/v1/completions", `{"model": "tiny", "prompt": "x"}`, 404, `the model \"tiny\" does not exist`},
		{"GET", "/health", "", 200, `"ok"`},
		{"GET", "/healthz", "", 200, `"ok"`},
		{"GET", "/v1/nothing", "", 404, `no endpoint GET /v1/nothing`},
		{"GET", "/v1/completions", "", 405, `takes [POST]`},
		{"POST", "/v1/models", "", 405, `takes [GET]`},
		{"PUT", "/v1/apps/tiny-steer", "", 405, `takes [GET PATCH]`},
		{"POST", "/v1/completions", `{"model": "my-tiny", "prompt": "x", "max_tokens": 2}`, 200, `"model":"my-tiny"`},
	} {
		code, hdr, data := do(t, c.method, ts.url+c.path, c.body)
		if code != c.code || !strings.Contains(string(data), c.want) {
			t.Errorf("%s %s: %d %s, want %d with %s", c.method, c.path, code, data, c.code, c.want)
		}
		if ct := hdr.Get("Content-Type"); ct != "application/json" {
			t.Errorf("%s %s: content type %q", c.method, c.path, ct)
		}
		// A 405 says what the endpoint takes (RFC 9110), in a fixed order.
		if allow, want := hdr.Get("Allow"), strings.ReplaceAll(strings.TrimSuffix(strings.TrimPrefix(c.want, "takes ["), "]"), " ", ", "); code == 405 && allow != want {
			t.Errorf("%s %s: Allow %q, want %q", c.method, c.path, allow, want)
		}
	}
}

func TestTokenizeDetokenize(t *testing.T) {
	ts := startServer(t, nil, nil)
	chatIDs, err := ts.chat.Prompt([]chat.Message{{Role: "user", Content: "Hi"}}, false)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		path, body string
		code       int
		want       string
	}{
		{"/tokenize", `{"prompt": "Hi!"}`, 200, `{"count":4,"max_model_len":512,"tokens":[256,72,105,33],"token_strs":null}`},
		{"/tokenize", `{"model": "tiny", "prompt": "Hi", "add_special_tokens": false}`, 200, `"tokens":[72,105]`},
		{"/tokenize", `{"messages": [{"role": "user", "content": "Hi"}], "add_generation_prompt": false}`, 200,
			fmt.Sprintf(`"tokens":%s`, mustJSON(chatIDs))},
		// Longer than the context: counted all the same (a completion would be refused).
		{"/tokenize", fmt.Sprintf(`{"prompt": %q}`, strings.Repeat("a", 600)), 200, `"count":601,`},
		{"/tokenize", fmt.Sprintf(`{"messages": [{"role": "user", "content": %q}]}`, strings.Repeat("a", 600)), 200, `"max_model_len":512,`},
		{"/tokenize", `{"prompt": "a", "messages": []}`, 400, "messages"},
		{"/tokenize", `{"prompt": 3}`, 400, `"param":"prompt"`},
		{"/tokenize", `{"text": "a"}`, 400, `unknown field \"text\"`},
		{"/tokenize", `{}`, 400, "required"},
		{"/tokenize", `{"model": "other", "prompt": "a"}`, 404, "does not exist"},
		{"/detokenize", `{"tokens": [256, 72, 105, 257]}`, 200, `{"prompt":"Hi"}`},
		{"/detokenize", `{"tokens": [72, 999]}`, 400, `tokens[1] = 999 is outside the vocabulary`},
		{"/detokenize", `{}`, 400, "tokens: required"},
		{"/detokenize", `[1]`, 400, "must be an object"},
	} {
		code, data := post(t, ts.url+c.path, c.body)
		if code != c.code || !strings.Contains(string(data), c.want) {
			t.Errorf("%s %s: %d %s, want %d with %s", c.path, c.body, code, data, c.code, c.want)
		}
	}
}

func mustJSON(v any) string {
	data, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return string(data)
}

// --max-export-values: a request whose apps' reads would hold more values than the bound gets
// 400 before it runs, counting a value a generated token for tiny-probe (one read a row) and
// the prompt's other rows with prompt_exports; the message says how many tokens would fit.
func TestMaxExportValues(t *testing.T) {
	ts := startServer(t, nil, func(c *Config) { c.MaxExportValues = 10 })
	probe := `"xmix": {"apps": ["tiny-probe"]`
	for _, c := range []struct {
		body string
		code int
		want string
	}{
		{`{"prompt": "Once", "max_tokens": 10, ` + probe + `}}`, 200, ""},
		{`{"prompt": "Once", "max_tokens": 11}`, 200, ""}, // no app, no reads
		{`{"prompt": "Once", "max_tokens": 11, ` + probe + `}}`, 400, "the enabled apps' reads would hold 11 values (1 a row for 11 rows); this server holds at most 10 for a request (--max-export-values): ask for at most 10 tokens, or for fewer apps"},
		// "Once" is 5 rows with the BOS: 4 more hold reads with prompt_exports.
		{`{"prompt": "Once", "max_tokens": 8, ` + probe + `, "prompt_exports": true}}`, 400, "would hold 12 values (1 a row for 12 rows); this server holds at most 10 for a request (--max-export-values): ask for at most 6 tokens"},
		{`{"prompt": "Once", "max_tokens": 6, ` + probe + `, "prompt_exports": true}}`, 200, ""},
		{`{"prompt": "Once upon a time", "max_tokens": 1, ` + probe + `, "prompt_exports": true}}`, 400, "ask without prompt_exports, or for fewer apps"},
	} {
		code, data := post(t, ts.url+"/v1/completions", c.body)
		if code != c.code || !strings.Contains(string(data), c.want) {
			t.Errorf("%s: %d %s, want %d %q", c.body, code, data, c.code, c.want)
		}
	}
}
