package serve

import (
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"strings"
	"testing"

	"xmix/loader"
)

// A request brings its own vector for a per_request param (a list or base64 f32) and keeps
// fewer of an op's layers: it generates what the engine does with the same Request.Vectors
// and Layers, other rows keep the compiled vector, and bad values are 400s naming them.
func TestPerRequestVectorsAndLayers(t *testing.T) {
	b := tinyPRBundle(t)
	ts := startServer(t, b, nil)
	v := make([]float32, 256)
	for i := range v {
		v[i] = float32(math.Cos(float64(3 * i)))
	}
	list, _ := json.Marshal(v)
	prompt := ts.tok.Encode("Once upon a time")
	req := func(vecs map[string][]float32, layers map[string][]int) loader.Request {
		return loader.Request{Prompt: prompt, MaxTokens: 20, TopP: 1, Apps: []string{"tiny-pr"}, Vectors: vecs, Layers: layers}
	}
	want := alone(t, b,
		req(nil, nil),
		req(map[string][]float32{"tiny-pr.happy": v}, nil),
		req(nil, map[string][]int{"tiny-pr.op0": {3}}),
		req(map[string][]float32{"tiny-pr.happy": v}, map[string][]int{"tiny-pr.op0": {}}))
	base := `{"prompt": "Once upon a time", "max_tokens": 20, "temperature": 0, "xmix": {"apps": ["tiny-pr"]%s}}`
	for i, x := range []string{
		"",
		`, "vectors": {"tiny-pr.happy": ` + string(list) + `}`,
		`, "layers": {"tiny-pr.op0": [3]}`,
		fmt.Sprintf(`, "vectors": {"tiny-pr.happy": %q}, "layers": {"tiny-pr.op0": []}`, f32base64(v)),
	} {
		code, data := post(t, ts.url+"/v1/completions", fmt.Sprintf(base, x))
		if code != http.StatusOK {
			t.Fatalf("case %d: %d %s", i, code, data)
		}
		g := decodeCompletion(t, data)
		if g.text() != ts.tok.Decode(want[i].Tokens) {
			t.Errorf("case %d: %q, the engine %q", i, g.text(), ts.tok.Decode(want[i].Tokens))
		}
	}
	if fmt.Sprint(want[0].Tokens) == fmt.Sprint(want[1].Tokens) || fmt.Sprint(want[0].Tokens) == fmt.Sprint(want[2].Tokens) {
		t.Fatal("the request's vector or layers changed nothing; the test would prove nothing")
	}
	for _, c := range []struct{ x, param, want string }{
		{`, "vectors": {"tiny-steer.happy": [1]}`, "xmix.vectors", `"tiny-steer.happy": not a per_request vector param of a deployed app (per_request params: tiny-pr.happy)`},
		{`, "vectors": {"tiny-pr.happy": [1, 2]}`, "xmix.vectors.tiny-pr.happy", "2 values; the param has 256"},
		{`, "vectors": {"tiny-pr.happy": "AAAA"}`, "xmix.vectors.tiny-pr.happy", "3 bytes of base64 f32"},
		{`, "vectors": ["x"]`, "xmix.vectors", "want an object"},
		{`, "layers": {"tiny-pr.op0": [1]}`, "xmix.layers", "layer 1 is not one the op was compiled at"},
		{`, "layers": {"tiny-steer.op0": [3]}`, "xmix.layers", "not an op with per-request layers"},
	} {
		code, _, data := do(t, "POST", ts.url+"/v1/completions", fmt.Sprintf(base, c.x))
		var e errorBody
		json.Unmarshal(data, &e)
		param := ""
		if e.Error.Param != nil {
			param = *e.Error.Param
		}
		if code != 400 || param != c.param || !strings.Contains(e.Error.Message, c.want) {
			t.Errorf("%s: %d %s, want 400 naming %q (param %q)", c.x, code, data, c.want, c.param)
		}
	}
	// A vector for an app the request does not enable.
	if code, data := post(t, ts.url+"/v1/completions", `{"prompt": "x", "xmix": {"vectors": {"tiny-pr.happy": `+string(list)+`}}}`); code != 400 || !strings.Contains(string(data), "tiny-pr") {
		t.Errorf("a vector without its app: %d %s", code, data)
	}
	if code, _, data := do(t, "GET", ts.url+"/v1/apps/tiny-pr", ""); code != 200 || !strings.Contains(string(data), `"per_request":true`) || !strings.Contains(string(data), `"per_request_layers":true`) {
		t.Errorf("GET /v1/apps/tiny-pr: %d %s", code, data)
	}
	ts.waitIdle(t)
}
