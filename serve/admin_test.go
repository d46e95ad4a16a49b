package serve

import (
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"strings"
	"testing"

	"xmix/loader"
)

func TestAppsListing(t *testing.T) {
	ts := startServer(t, nil, nil)
	code, _, data := do(t, "GET", ts.url+"/v1/apps", "")
	var out struct {
		Model string    `json:"model"`
		Apps  []appInfo `json:"apps"`
	}
	if err := json.Unmarshal(data, &out); err != nil || code != 200 || len(out.Apps) != 2 {
		t.Fatalf("%d %s", code, data)
	}
	steer, probe := out.Apps[0], out.Apps[1]
	if steer.Name != "tiny-steer" || steer.Scalars["tiny-steer.op0.alpha"] != 12 || len(steer.Vectors) != 1 ||
		steer.Vectors[0] != (vectorInfo{Name: "tiny-steer.happy", Width: 256}) || steer.OnByDefault {
		t.Errorf("tiny-steer: %+v", steer)
	}
	if len(steer.Ops) != 1 || steer.Ops[0].Kernel != "steer_add" || steer.Ops[0].Hook != "resid_post" || fmt.Sprint(steer.Ops[0].Layers) != "[3]" || !steer.Ops[0].Fused {
		t.Errorf("tiny-steer ops: %+v", steer.Ops)
	}
	if len(probe.Exports) != 1 || probe.Exports[0] != (exportInfo{Name: "tiny-probe.happy", Width: 1}) {
		t.Errorf("tiny-probe exports: %+v", probe.Exports)
	}
	if code, _, data := do(t, "GET", ts.url+"/v1/apps/tiny-probe", ""); code != 200 || !strings.Contains(string(data), `"probe_linear"`) {
		t.Errorf("one app: %d %s", code, data)
	}
	if code, _, data := do(t, "GET", ts.url+"/v1/apps/nope", ""); code != 404 || !strings.Contains(string(data), `app \"nope\" is not deployed`) {
		t.Errorf("unknown app: %d %s", code, data)
	}
	// Without an admin token the control plane does not write.
	if code, _, data := do(t, "PATCH", ts.url+"/v1/apps/tiny-steer", `{"on_by_default": true}`); code != 403 || !strings.Contains(string(data), "--admin-token") {
		t.Errorf("PATCH without a token configured: %d %s", code, data)
	}
}

func f32base64(v []float32) string {
	b := make([]byte, 4*len(v))
	for i, f := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(f))
	}
	return base64.StdEncoding.EncodeToString(b)
}

// The control plane changes a running server's apps: a replaced vector, a new scalar
// default and an app on for every request change the next request's output exactly as the
// engine's SetVector and SetDefault do, with no restart; every change is checked first
// and logged.
func TestControlPlaneChangesTheNextRequest(t *testing.T) {
	b := tinyBundle(t)
	const token = "s3cret"
	ts := startServer(t, b, func(c *Config) { c.AdminToken = token })
	auth := []string{"Authorization", "Bearer " + token}
	patch := func(app, body string, hdr ...string) (int, http.Header, []byte) {
		return do(t, "PATCH", ts.url+"/v1/apps/"+app, body, hdr...)
	}
	for _, c := range []struct {
		app, body string
		hdr       []string
		code      int
		want      string
	}{
		{"tiny-steer", `{"on_by_default": true}`, nil, 401, "Bearer"},
		{"tiny-steer", `{"on_by_default": true}`, []string{"Authorization", "Bearer wrong"}, 401, "--admin-token"},
		{"nope", `{"on_by_default": true}`, auth, 404, `app \"nope\" is not deployed`},
		{"tiny-steer", `{}`, auth, 400, "nothing to change"},
		{"tiny-steer", `{"enabled": true}`, auth, 400, `unknown field \"enabled\"`},
		{"tiny-steer", `{"set": {"op0.beta": 1}}`, auth, 400, `app tiny-steer has no scalar \"op0.beta\" (scalars: op0.alpha)`},
		{"tiny-steer", `{"vectors": {"sad": [1]}}`, auth, 400, `no replaceable vector \"sad\" (vectors: happy)`},
		{"tiny-steer", `{"vectors": {"happy": [1, 2]}}`, auth, 400, "2 values; the param has 256"},
		{"tiny-steer", `{"vectors": {"happy": "!!"}}`, auth, 400, "not base64"},
		{"tiny-steer", fmt.Sprintf(`{"vectors": {"happy": %q}}`, f32base64(make([]float32, 3))), auth, 400, "12 bytes of base64 f32"},
		{"tiny-steer", fmt.Sprintf(`{"vectors": {"happy": %q}}`, f32base64(append(make([]float32, 255), float32(math.NaN())))), auth, 400, "happy[255] is NaN: every value must be finite"},
		{"tiny-steer", `{"on_by_default": "yes"}`, auth, 400, "want true or false"},
		{"tiny-steer", `{"set": {"op0.alpha": 5}, "vectors": {"happy": [1]}}`, auth, 400, "1 values"},
		// A value the engine refuses (its product with the vector overflows) is the client's
		// error, naming the field, and takes the rest of the change down with it.
		{"tiny-steer", `{"set": {"op0.alpha": 3e38}, "on_by_default": true}`, auth, 400,
			`app tiny-steer scalar op0.alpha: 3e+38 times the app's param happy overflows float32 (at most 3.89e+18 in magnitude)","type":"invalid_request_error","param":"set"`},
	} {
		code, hdr, data := patch(c.app, c.body, c.hdr...)
		if code != c.code || !strings.Contains(string(data), c.want) {
			t.Errorf("PATCH %s %s: %d %s, want %d naming %q", c.app, c.body, code, data, c.code, c.want)
		}
		if code == 401 && hdr.Get("WWW-Authenticate") == "" {
			t.Errorf("401 without WWW-Authenticate")
		}
	}
	// Nothing of a refused change applied: the scalar default is still the compiled one.
	if _, _, data := do(t, "GET", ts.url+"/v1/apps/tiny-steer", ""); !strings.Contains(string(data), `"tiny-steer.op0.alpha":12`) || !strings.Contains(string(data), `"on_by_default":false`) {
		t.Fatalf("after refused changes: %s", data)
	}

	prompt := ts.tok.Encode("Once upon a time")
	steered := `{"prompt": "Once upon a time", "max_tokens": 24, "temperature": 0, "xmix": {"apps": ["tiny-steer"]}}`
	plain := `{"prompt": "Once upon a time", "max_tokens": 24, "temperature": 0}`
	text := func(body string) completion {
		t.Helper()
		code, data := post(t, ts.url+"/v1/completions", body)
		if code != 200 {
			t.Fatalf("%d %s", code, data)
		}
		return decodeCompletion(t, data)
	}
	before := text(steered).text()
	v := make([]float32, 256)
	for i := range v {
		v[i] = float32(math.Sin(float64(i))) // some other direction
	}
	vals, _ := json.Marshal(v)
	code, _, data := patch("tiny-steer", fmt.Sprintf(`{"vectors": {"happy": %s}}`, vals), auth...)
	if code != 200 || !strings.Contains(string(data), `"replaced":true`) {
		t.Fatalf("replace the vector: %d %s", code, data)
	}
	after := text(steered).text()
	eng, tok := engineFor(t, b)
	if err := eng.SetVector("tiny-steer", "happy", v); err != nil {
		t.Fatal(err)
	}
	res, err := eng.Generate([]loader.Request{{Prompt: prompt, MaxTokens: 24, TopP: 1, Apps: []string{"tiny-steer"}}})
	if err != nil {
		t.Fatal(err)
	}
	if after == before || after != tok.Decode(res[0].Tokens) {
		t.Fatalf("after replacing the vector: %q; before %q; the engine with it %q", after, before, tok.Decode(res[0].Tokens))
	}
	// The same vector as base64 f32 is the same change.
	if code, _, data := patch("tiny-steer", fmt.Sprintf(`{"vectors": {"tiny-steer.happy": %q}}`, f32base64(v)), auth...); code != 200 {
		t.Fatalf("base64: %d %s", code, data)
	}
	if again := text(steered).text(); again != after {
		t.Fatalf("the base64 vector gave %q, the list %q", again, after)
	}
	// A new scalar default.
	if code, _, data := patch("tiny-steer", `{"set": {"tiny-steer.op0.alpha": 20}}`, auth...); code != 200 || !strings.Contains(string(data), `"tiny-steer.op0.alpha":20`) {
		t.Fatalf("set: %d %s", code, data)
	}
	if err := eng.SetDefault("tiny-steer", "op0.alpha", 20); err != nil {
		t.Fatal(err)
	}
	res, err = eng.Generate([]loader.Request{{Prompt: prompt, MaxTokens: 24, TopP: 1, Apps: []string{"tiny-steer"}}})
	if err != nil {
		t.Fatal(err)
	}
	alpha20 := text(steered).text()
	if alpha20 != tok.Decode(res[0].Tokens) || alpha20 == after {
		t.Fatalf("alpha 20: served %q, engine %q, alpha 12 %q", alpha20, tok.Decode(res[0].Tokens), after)
	}
	// On for every request, with a per-request opt-out.
	plainText := text(plain).text()
	if code, _, data := patch("tiny-steer", `{"on_by_default": true}`, auth...); code != 200 || !strings.Contains(string(data), `"on_by_default":true`) {
		t.Fatalf("on by default: %d %s", code, data)
	}
	if g := text(plain); g.text() != alpha20 || fmt.Sprint(g.Xmix.Apps) != "[tiny-steer]" {
		t.Fatalf("a plain request with tiny-steer on by default: %q apps %v, want %q", g.text(), g.Xmix.Apps, alpha20)
	}
	if g := text(withField(plain, "xmix", `{"default_apps": false}`)); g.text() != plainText || len(g.Xmix.Apps) != 0 {
		t.Fatalf("opted out: %q apps %v, want %q", g.text(), g.Xmix.Apps, plainText)
	}
	if code, _, _ := patch("tiny-steer", `{"on_by_default": false}`, auth...); code != 200 || text(plain).text() != plainText {
		t.Fatal("turning it off again did not restore plain requests")
	}
	log := ts.log.String()
	for _, want := range []string{"control plane: app tiny-steer: vector happy replaced (256 values, norm ",
		"control plane: app tiny-steer: op0.alpha default 12 -> 20", "control plane: app tiny-steer: on by default false -> true"} {
		if !strings.Contains(log, want) {
			t.Errorf("the log lacks %q:\n%s", want, log)
		}
	}
}
