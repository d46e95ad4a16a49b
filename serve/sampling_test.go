package serve

import (
	"fmt"
	"math"
	"net/http"
	"strings"
	"testing"

	"xmix/loader"
)

// ignore_eos, min_tokens and logprobs reach the sampler: each response is what the engine
// gives the same Request alone, logprobs in the completions' and chat's shapes, whole and
// one entry per streamed chunk; stop strings do not end a request before its min_tokens.
func TestSamplerFields(t *testing.T) {
	b := tinyBundle(t)
	ts := startServer(t, b, nil)
	sad := ts.tok.Encode("Tom was sad.")
	free := alone(t, b, loader.Request{Prompt: sad, MaxTokens: 300, TopP: 1})[0]
	if free.Reason != loader.ReasonStop || len(free.Tokens) > 100 {
		t.Fatalf("the prompt should end at EOS within 100 tokens: %s after %d", free.Reason, len(free.Tokens))
	}
	eos := len(free.Tokens)
	want := alone(t, b,
		loader.Request{Prompt: sad, MaxTokens: eos + 20, TopP: 1, IgnoreEOS: true},
		loader.Request{Prompt: sad, MaxTokens: eos + 30, TopP: 1, MinTokens: eos + 10},
		loader.Request{Prompt: sad, MaxTokens: 12, TopP: 1, Logprobs: true, TopLogprobs: 3},
	)
	if len(want[0].Tokens) != eos+20 || want[1].Reason != loader.ReasonStop && len(want[1].Tokens) < eos+10 || len(want[2].Logprobs) != 12 {
		t.Fatalf("the engine: %d tokens with ignore_eos, %d (%s) with min_tokens, %d logprobs", len(want[0].Tokens), len(want[1].Tokens), want[1].Reason, len(want[2].Logprobs))
	}
	base := `{"prompt": "Tom was sad.", "temperature": 0, %s}`
	for i, c := range []string{
		fmt.Sprintf(`"max_tokens": %d, "ignore_eos": true`, eos+20),
		fmt.Sprintf(`"max_tokens": %d, "min_tokens": %d`, eos+30, eos+10),
	} {
		code, data := post(t, ts.url+"/v1/completions", fmt.Sprintf(base, c))
		if code != http.StatusOK {
			t.Fatalf("%d %s", code, data)
		}
		g := decodeCompletion(t, data)
		checkAgainst(t, c, ts.tok, want[i], g.text(), g.Choices[0].FinishReason, g.Usage.CompletionTokens, nil, nil)
	}

	// logprobs N in completions: four lists, one entry per token, the engine's values.
	body := fmt.Sprintf(base, `"max_tokens": 12, "logprobs": 3`)
	code, data := post(t, ts.url+"/v1/completions", body)
	var whole struct {
		Choices []struct {
			Text     string             `json:"text"`
			Logprobs completionLogprobs `json:"logprobs"`
		} `json:"choices"`
	}
	if code != 200 || decodeJSON(data, &whole) != nil {
		t.Fatalf("%d %s", code, data)
	}
	lp := whole.Choices[0].Logprobs
	if len(lp.Tokens) != 12 || len(lp.TokenLogprobs) != 12 || len(lp.TopLogprobs) != 12 || len(lp.TextOffset) != 12 || strings.Join(lp.Tokens, "") != whole.Choices[0].Text {
		t.Fatalf("logprobs %+v for %q", lp, whole.Choices[0].Text)
	}
	for k, w := range want[2].Logprobs {
		if math.Abs(float64(lp.TokenLogprobs[k]-w.Logprob)) > 1e-6 || len(lp.TopLogprobs[k]) != len(w.Top) || lp.TextOffset[k] != k {
			t.Errorf("token %d: %v %v offset %d, the engine %+v", k, lp.TokenLogprobs[k], lp.TopLogprobs[k], lp.TextOffset[k], w)
		}
		for _, top := range w.Top {
			if v, ok := lp.TopLogprobs[k][ts.tok.Decode([]int{top.Token})]; !ok || math.Abs(float64(v-top.Logprob)) > 1e-6 {
				t.Errorf("token %d: top %v lacks %+v", k, lp.TopLogprobs[k], top)
			}
		}
	}
	resp, err := client.Post(ts.url+"/v1/completions", "application/json", strings.NewReader(withField(body, "stream", "true")))
	if err != nil {
		t.Fatal(err)
	}
	var streamed []float32
	for _, ch := range sseData(t, resp) {
		var c struct {
			Choices []struct {
				Logprobs *completionLogprobs `json:"logprobs"`
			} `json:"choices"`
		}
		if decodeJSON([]byte(ch), &c) != nil || len(c.Choices) != 1 || c.Choices[0].Logprobs == nil || len(c.Choices[0].Logprobs.TokenLogprobs) != 1 {
			t.Fatalf("a chunk without its token's logprob: %s", ch)
		}
		streamed = append(streamed, c.Choices[0].Logprobs.TokenLogprobs[0])
	}
	if fmt.Sprint(streamed) != fmt.Sprint(lp.TokenLogprobs) {
		t.Errorf("streamed logprobs %v, whole %v", streamed, lp.TokenLogprobs)
	}

	// Chat: logprobs true with top_logprobs, content entries with bytes.
	code, data = post(t, ts.url+"/v1/chat/completions", `{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 5, "temperature": 0, "logprobs": true, "top_logprobs": 2}`)
	var chat struct {
		Choices []struct {
			Message  struct{ Content string } `json:"message"`
			Logprobs chatLogprobs             `json:"logprobs"`
		} `json:"choices"`
	}
	if code != 200 || decodeJSON(data, &chat) != nil || len(chat.Choices[0].Logprobs.Content) != 5 {
		t.Fatalf("chat logprobs: %d %s", code, data)
	}
	for _, e := range chat.Choices[0].Logprobs.Content {
		if len(e.TopLogprobs) != 2 || e.Logprob > 0 || string(intsToBytes(e.Bytes)) != e.Token {
			t.Errorf("chat entry %+v", e)
		}
	}

	// A stop string does not end a request before its min_tokens.
	text := ts.tok.Decode(free.Tokens)
	first := strings.Index(text, "o")
	later := first + 1 + strings.Index(text[first+1:], "o")
	if first < 0 || later <= first {
		t.Fatalf("no two o's in %q", text)
	}
	code, data = post(t, ts.url+"/v1/completions", fmt.Sprintf(base, fmt.Sprintf(`"max_tokens": 60, "stop": "o", "min_tokens": %d`, first+2)))
	if g := decodeCompletion(t, data); code != 200 || g.text() != text[:later] || g.Choices[0].FinishReason != "stop" {
		t.Errorf("stop \"o\" with min_tokens %d: %q (%s), want %q", first+2, g.text(), g.Choices[0].FinishReason, text[:later])
	}
}

func intsToBytes(xs []int) []byte {
	b := make([]byte, len(xs))
	for i, x := range xs {
		b[i] = byte(x)
	}
	return b
}
