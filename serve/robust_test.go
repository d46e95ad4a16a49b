package serve

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"xmix/loader"
)

// hostileBodies are requests a client may send that the server must answer with a 4xx
// naming the problem, allocating nothing from them, and then serve on.
var hostileBodies = []struct {
	name, body string
	code       int
	want       string
}{
	{"max_tokens 2^63-1", `{"prompt": "hi", "max_tokens": 9223372036854775807}`, 400, "max_tokens (9223372036854775807) = 9223372036854775810 exceeds the bundle's max_seq_len 512"},
	{"max_tokens 1e10", `{"prompt": "hi", "max_tokens": 10000000000}`, 400, "max_tokens (10000000000)"},
	{"max_tokens 3e8", `{"prompt": "hi", "max_tokens": 300000000}`, 400, "max_tokens (300000000)"},
	{"max_tokens 2^64", `{"prompt": "hi", "max_tokens": 18446744073709551616}`, 400, "max_tokens 18446744073709551616: want an integer"},
	{"max_tokens 0", `{"prompt": "hi", "max_tokens": 0}`, 400, "max_tokens 0: must be at least 1"},
	{"temperature -1", `{"prompt": "hi", "temperature": -1}`, 400, "temperature -1: want a finite number >= 0"},
	{"top_p 2", `{"prompt": "hi", "top_p": 2}`, 400, "top_p 2: want a number in [0, 1]"},
	{"null", `null`, 400, "the request body is null"},
	{"list", `[]`, 400, "the request body is a JSON array"},
	{"string", `"hi"`, 400, "the request body is a JSON string"},
	{"number", `  7`, 400, "the request body is a JSON number"},
	{"empty", ``, 400, "the request body is not valid JSON: EOF"},
	{"alpha 3e38", `{"prompt": "hi", "xmix": {"apps": ["tiny-steer"], "set": {"tiny-steer.op0.alpha": 3e38}}}`, 400, `override "tiny-steer.op0.alpha": 3e+38 times the app's param happy overflows float32`},
	{"alpha 1e39", `{"prompt": "hi", "xmix": {"apps": ["tiny-steer"], "set": {"tiny-steer.op0.alpha": 1e39}}}`, 400, "xmix.set {\"tiny-steer.op0.alpha\":1e39}: want an object of numbers"},
	{"alpha NaN", `{"prompt": "hi", "xmix": {"set": {"tiny-steer.op0.alpha": NaN}}}`, 400, "not valid JSON: invalid character 'N'"},
	{"alpha string", `{"prompt": "hi", "xmix": {"set": {"tiny-steer.op0.alpha": "NaN"}}}`, 400, "want an object of numbers"},
	{"unknown app", `{"prompt": "hi", "xmix": {"apps": ["nope"]}}`, 400, `app "nope" is not deployed`},
	{"long prompt", fmt.Sprintf(`{"prompt": %q}`, strings.Repeat("a", 600)), 400, "leaves no room to generate"},
	{"9 MB body", fmt.Sprintf(`{"prompt": %q}`, strings.Repeat("a", 9<<20)), 413, "the request body is larger than 8388608 bytes"},
	{"deep JSON", strings.Repeat("[", 100000) + strings.Repeat("]", 100000), 400, "exceeded max depth"},
	{"deep object", `{"prompt": ` + strings.Repeat(`{"a":`, 20000) + `1` + strings.Repeat(`}`, 20000) + `}`, 400, "exceeded max depth"},
}

// rss is this process's resident set in bytes (VmRSS), 0 where /proc is missing.
func rss(t *testing.T) int64 {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	m := regexp.MustCompile(`VmRSS:\s+(\d+) kB`).FindSubmatch(data)
	if m == nil {
		t.Fatalf("no VmRSS in /proc/self/status")
	}
	kb, _ := strconv.ParseInt(string(m[1]), 10, 64)
	return kb << 10
}

// errorMessage is an error body's message ("" when it is not one).
func errorMessage(data []byte) string {
	var e errorBody
	json.Unmarshal(data, &e)
	return e.Error.Message
}

// The hostile set, several at once and beside requests being served: each gets its 4xx,
// the served ones finish as they would alone, and afterwards the server still serves with
// its memory bounded (ten max_tokens of 3e8 used to leave it at 7 GB).
func TestServeSurvivesHostileRequests(t *testing.T) {
	b := tinyBundle(t)
	ts := startServer(t, b, nil)
	cases := tinyCases(ts.tok)[:4]
	var reqs []loader.Request
	for _, c := range cases {
		reqs = append(reqs, c.req)
	}
	want := alone(t, b, reqs...)
	runtime.GC()
	before := rss(t)
	var wg sync.WaitGroup
	for round := range 3 {
		for _, c := range hostileBodies {
			wg.Add(1)
			go func() {
				defer wg.Done()
				code, data := post(t, ts.url+"/v1/completions", c.body)
				if code != c.code || !strings.Contains(errorMessage(data), c.want) {
					t.Errorf("round %d, %s: %d %.300s, want %d naming %q", round, c.name, code, data, c.code, c.want)
				}
			}()
		}
		for i, c := range cases {
			wg.Add(1)
			go func() {
				defer wg.Done()
				code, data := post(t, ts.url+c.path, c.body)
				if code != 200 || decodeCompletion(t, data).text() != ts.tok.Decode(want[i].Tokens) {
					t.Errorf("round %d, served case %d beside the hostile set: %d %s", round, i, code, data)
				}
			}()
		}
		wg.Wait()
	}
	runtime.GC()
	after := rss(t)
	t.Logf("RSS before %.1f MB, after %d hostile requests %.1f MB", float64(before)/1e6, 3*len(hostileBodies), float64(after)/1e6)
	if after > before+256<<20 {
		t.Errorf("RSS grew from %.1f MB to %.1f MB over the hostile set", float64(before)/1e6, float64(after)/1e6)
	}
	ts.waitIdle(t)
}

// slowBackend takes at least delay per step, so that a generation outlasts a timeout.
type slowBackend struct {
	loader.Backend
	delay time.Duration
}

func (b slowBackend) Step(t int) error {
	time.Sleep(b.delay)
	return b.Backend.Step(t)
}

// A client that sends half a body is cut off after the read timeout; a stream longer than
// the write timeout is not (each write gets its own deadline).
func TestServeTimeouts(t *testing.T) {
	saved := timeouts
	t.Cleanup(func() { timeouts = saved })
	timeouts.Read, timeouts.Write = time.Second, 500*time.Millisecond
	b := tinyBundle(t)
	ts := startServer(t, b, func(c *Config) {
		c.Engine, _ = engineOn(t, b, slowBackend{backendFor(t, b), 5 * time.Millisecond})
	})
	conn, err := net.Dial("tcp", strings.TrimPrefix(ts.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"prompt\": ")
	start := time.Now()
	conn.SetReadDeadline(time.Now().Add(20 * time.Second))
	reply, _ := io.ReadAll(conn) // the server answers (or not) and closes
	if el := time.Since(start); el > 10*time.Second {
		t.Fatalf("half a body held the connection for %s", el)
	}
	if len(reply) > 0 && !bytes.HasPrefix(reply, []byte("HTTP/1.1 4")) {
		t.Errorf("half a body answered %q", reply)
	}
	begin := time.Now()
	resp, err := client.Post(ts.url+"/v1/completions", "application/json",
		strings.NewReader(`{"prompt": "Once", "max_tokens": 300, "ignore_eos": true, "stream": true, "stream_options": {"include_usage": true}}`))
	if err != nil {
		t.Fatal(err)
	}
	s := readStream(t, resp.Body)
	resp.Body.Close()
	if !s.done || s.usage == nil || s.usage.CompletionTokens != 300 || s.chunks != 300 {
		t.Fatalf("the stream ended after %s: %+v", time.Since(begin), s)
	}
	if el := time.Since(begin); el < 3*timeouts.Write {
		t.Errorf("the stream took %s only; the test wants it longer than the write timeout %s", el, timeouts.Write)
	}
}

// poisonBackend panics while a scalar table row holding poison is written (one request's
// admission), and fails the steps it is told to.
type poisonBackend struct {
	loader.Backend
	poison float32
	mu     sync.Mutex
	fail   int // steps left to fail
}

func (b *poisonBackend) Write(buf string, off int64, data []byte) error {
	if strings.HasSuffix(buf, ".scalars") {
		for i := 0; i+4 <= len(data); i += 4 {
			if math.Float32frombits(uint32(data[i])|uint32(data[i+1])<<8|uint32(data[i+2])<<16|uint32(data[i+3])<<24) == b.poison {
				panic("poisoned scalar row")
			}
		}
	}
	return b.Backend.Write(buf, off, data)
}

func (b *poisonBackend) Step(t int) error {
	b.mu.Lock()
	fail := b.fail > 0
	if fail {
		b.fail--
	}
	b.mu.Unlock()
	if fail {
		return errors.New("the device fell over")
	}
	return b.Backend.Step(t)
}

// A request whose own work panics in the engine answers 500 naming it while the requests
// beside it are served; a step that fails answers 500 for its requests, health says so, and
// the next requests are served again.
func TestServeOneRequestFailsAlone(t *testing.T) {
	b := tinyBundle(t)
	pb := &poisonBackend{Backend: backendFor(t, b), poison: 1234}
	ts := startServer(t, b, func(c *Config) { c.Engine, _ = engineOn(t, b, pb) })
	cases := tinyCases(ts.tok)[:4]
	var reqs []loader.Request
	for _, c := range cases {
		reqs = append(reqs, c.req)
	}
	want := alone(t, b, reqs...)
	var wg sync.WaitGroup
	for i, c := range cases {
		wg.Add(1)
		go func() {
			defer wg.Done()
			code, data := post(t, ts.url+c.path, c.body)
			if code != 200 || decodeCompletion(t, data).text() != ts.tok.Decode(want[i].Tokens) {
				t.Errorf("case %d beside the poisoned request: %d %s", i, code, data)
			}
		}()
	}
	code, data := post(t, ts.url+"/v1/completions", `{"prompt": "Once", "max_tokens": 8, "xmix": {"apps": ["tiny-steer"], "set": {"tiny-steer.op0.alpha": 1234}}}`)
	wg.Wait()
	if code != 500 || !regexp.MustCompile(`^request cmpl-\w+: internal error in request: poisoned scalar row \(at robust_test.go:\d+\); please report it$`).MatchString(errorMessage(data)) {
		t.Errorf("the poisoned request: %d %s", code, data)
	}
	pb.mu.Lock()
	pb.fail = 1
	pb.mu.Unlock()
	code, data = post(t, ts.url+"/v1/completions", `{"prompt": "Once", "max_tokens": 4}`)
	if code != 500 || !strings.Contains(errorMessage(data), "the device fell over") {
		t.Errorf("the request of the failed step: %d %s", code, data)
	}
	code, _, health := do(t, "GET", ts.url+"/health", "")
	if code != 503 || !strings.Contains(errorMessage(health), "the engine's last step failed") {
		t.Errorf("health after a failed step: %d %s", code, health)
	}
	if code, data := post(t, ts.url+cases[0].path, cases[0].body); code != 200 {
		t.Errorf("after the failed step: %d %s", code, data)
	}
	if code, _, data := do(t, "GET", ts.url+"/health", ""); code != 200 {
		t.Errorf("health after a good step: %d %s", code, data)
	}
	// A stream whose step fails ends with an error event.
	pb.mu.Lock()
	pb.fail = 1
	pb.mu.Unlock()
	resp, err := client.Post(ts.url+"/v1/completions", "application/json", strings.NewReader(`{"prompt": "Once", "max_tokens": 4, "stream": true}`))
	if err != nil {
		t.Fatal(err)
	}
	s := readStream(t, resp.Body)
	resp.Body.Close()
	if len(s.errors) != 1 || !strings.Contains(s.errors[0], "the device fell over") || !s.done {
		t.Errorf("a stream whose step failed: %+v", s)
	}
	ts.waitIdle(t)
}

// A request whose logits overflow ends with finish_reason nonfinite and xmix.error naming
// the step, streamed or not, keeping the tokens before; the request beside it is served.
func TestServeNonFinite(t *testing.T) {
	ts := startServer(t, tinyBlowupBundle(t), nil)
	body := `{"prompt": "Once", "max_tokens": 8, "temperature": 0, "xmix": {"apps": ["blowup"]}}`
	code, data := post(t, ts.url+"/v1/completions", body)
	var r struct {
		Choices []struct {
			Text         string `json:"text"`
			FinishReason string `json:"finish_reason"`
		} `json:"choices"`
		Usage usage `json:"usage"`
		Xmix  struct {
			Error string `json:"error"`
		} `json:"xmix"`
	}
	if code != 200 || json.Unmarshal(data, &r) != nil || r.Choices[0].FinishReason != "nonfinite" || r.Usage.CompletionTokens != 3 ||
		!strings.Contains(r.Xmix.Error, "generation step 3: the logits at position 7 are not finite") {
		t.Errorf("not streamed: %d %s", code, data)
	}
	resp, err := client.Post(ts.url+"/v1/completions", "application/json", strings.NewReader(withField(body, "stream", "true")))
	if err != nil {
		t.Fatal(err)
	}
	var last string
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if l := sc.Text(); strings.HasPrefix(l, "data: {") {
			last = l
		}
	}
	resp.Body.Close()
	if !strings.Contains(last, `"finish_reason":"nonfinite"`) || !strings.Contains(last, "generation step 3") {
		t.Errorf("streamed, the last chunk: %s", last)
	}
	if code, data := post(t, ts.url+"/v1/completions", `{"prompt": "Once", "max_tokens": 8}`); code != 200 || !strings.Contains(string(data), `"finish_reason":"length"`) {
		t.Errorf("without the app: %d %s", code, data)
	}
}
