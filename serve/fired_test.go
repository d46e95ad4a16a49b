package serve

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"xmix/loader"
)

// xmix.fired says, per op of each enabled app, at how many (token, layer) sites it fired,
// as the engine counts them ({} without apps), in the whole response and in the stream's
// last chunk; xmix.stop_when ends a request where the engine does, with finish_reason
// "stop_when" and the test as stop_reason.
func TestFiredAndStopWhen(t *testing.T) {
	b := tinyBundle(t)
	ts := startServer(t, b, nil)
	prompt := ts.tok.Encode("Once upon a time")
	stop := &loader.StopWhen{Export: "tiny-probe.happy", Op: ">", Value: 0.995}
	want := alone(t, b,
		loader.Request{Prompt: prompt, MaxTokens: 24, TopP: 1, Apps: []string{"tiny-steer", "tiny-probe"}},
		loader.Request{Prompt: prompt, MaxTokens: 40, TopP: 1, Apps: []string{"tiny-probe"}, StopWhen: stop})
	if want[0].Fired.Get("tiny-steer.op0") <= 0 || want[1].Reason != loader.ReasonStopWhen || len(want[1].Tokens) >= 40 {
		t.Fatalf("the engine's counts %v and stop %s after %d tokens would prove nothing", want[0].Fired, want[1].Reason, len(want[1].Tokens))
	}
	base := `{"prompt": "Once upon a time", "temperature": 0, %s}`
	for i, c := range []struct {
		body string
		want loader.Result
	}{
		{`"max_tokens": 24, "xmix": {"apps": ["tiny-steer", "tiny-probe"]}`, want[0]},
		{`"max_tokens": 40, "xmix": {"apps": ["tiny-probe"], "stop_when": {"export": "tiny-probe.happy", "op": ">", "value": 0.995}}`, want[1]},
	} {
		body := fmt.Sprintf(base, c.body)
		code, data := post(t, ts.url+"/v1/completions", body)
		if code != http.StatusOK {
			t.Fatalf("%d %s", code, data)
		}
		g := decodeCompletion(t, data)
		if fmt.Sprint(g.Xmix.Fired) != fmt.Sprint(firedMap(c.want.Fired)) || g.text() != ts.tok.Decode(c.want.Tokens) || g.Choices[0].FinishReason != c.want.Reason {
			t.Errorf("case %d: fired %v %q %s, the engine %v %q %s", i, g.Xmix.Fired, g.text(), g.Choices[0].FinishReason,
				c.want.Fired, ts.tok.Decode(c.want.Tokens), c.want.Reason)
		}
		resp, err := client.Post(ts.url+"/v1/completions", "application/json", strings.NewReader(withField(body, "stream", "true")))
		if err != nil {
			t.Fatal(err)
		}
		s := readStream(t, resp.Body)
		resp.Body.Close()
		if fmt.Sprint(s.fired) != fmt.Sprint(g.Xmix.Fired) || s.text != g.text() || s.finish != g.Choices[0].FinishReason {
			t.Errorf("case %d: streamed fired %v %q %s, whole %v %q", i, s.fired, s.text, s.finish, g.Xmix.Fired, g.text())
		}
		if i == 1 && (g.Choices[0].StopReason != "tiny-probe.happy > 0.995" || s.stop != g.Choices[0].StopReason) {
			t.Errorf("stop_when's stop_reason: %v, streamed %v", g.Choices[0].StopReason, s.stop)
		}
	}
	code, data := post(t, ts.url+"/v1/completions", `{"prompt": "x", "max_tokens": 2}`)
	if g := decodeCompletion(t, data); code != 200 || g.Xmix.Fired == nil || len(g.Xmix.Fired) != 0 || !strings.Contains(string(data), `"fired":{}`) {
		t.Errorf("without apps: %d %s", code, data)
	}
	for _, c := range []struct{ x, param, want string }{
		{`{"apps": ["tiny-probe"], "stop_when": {"export": "tiny-probe.nope", "op": ">", "value": 1}}`, "", "is not an export of the apps the request enables"},
		{`{"apps": ["tiny-probe"], "stop_when": {"export": "tiny-probe.happy", "op": "~", "value": 1}}`, "", `op \"~\" is not one of >, >=`},
		{`{"apps": ["tiny-probe"], "stop_when": {"export": "tiny-probe.happy", "value": 1}}`, "xmix.stop_when.op", "required"},
		{`{"apps": ["tiny-probe"], "stop_when": {"export": "tiny-probe.happy", "op": ">", "value": "high"}}`, "xmix.stop_when.value", "want a number"},
		{`{"apps": ["tiny-probe"], "stop_when": {"export": "tiny-probe.happy", "op": ">", "value": 1, "when": 2}}`, "xmix.stop_when.when", "unknown field"},
		{`{"stop_when": [1]}`, "xmix.stop_when", "want {"},
	} {
		code, data := post(t, ts.url+"/v1/completions", `{"prompt": "x", "xmix": `+c.x+`}`)
		if code != 400 || !strings.Contains(string(data), c.want) || c.param != "" && !strings.Contains(string(data), `"param":"`+c.param+`"`) {
			t.Errorf("%s: %d %s, want 400 naming %q", c.x, code, data, c.want)
		}
	}
	if _, _, data := do(t, "GET", ts.url+"/metrics", ""); !strings.Contains(string(data), fmt.Sprintf(`xmix_app_fired_sites_total{op="tiny-steer.op0"} %d`, 2*want[0].Fired.Get("tiny-steer.op0"))) {
		t.Errorf("metrics lack the fired sites:\n%s", grep(string(data), "fired"))
	}
}

func firedMap(f loader.Fired) map[string]int {
	m := map[string]int{}
	for _, c := range f {
		m[c.Name] = c.Sites
	}
	return m
}
