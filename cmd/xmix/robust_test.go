package main

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
	"slices"
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
	{"max_tokens 2^64", `{"prompt": "hi", "max_tokens": 18446744073709551616}`, 400, "request body: json: cannot unmarshal number 18446744073709551616"},
	{"max_tokens 0", `{"prompt": "hi", "max_tokens": 0}`, 400, "max_tokens 0: must be at least 1"},
	{"max_tokens -1", `{"prompt": "hi", "max_tokens": -1}`, 400, "max_tokens -1: must be at least 1"},
	{"temperature -1", `{"prompt": "hi", "temperature": -1}`, 400, "temperature -1: want a finite number >= 0"},
	{"top_p 2", `{"prompt": "hi", "top_p": 2}`, 400, "top_p 2: want a number in [0, 1]"},
	{"top_p -0.1", `{"prompt": "hi", "top_p": -0.1}`, 400, "top_p -0.1"},
	{"null", `null`, 400, "request body: want a JSON object"},
	{"list", `[]`, 400, "request body: want a JSON object"},
	{"string", `"hi"`, 400, "request body: want a JSON object"},
	{"number", `  7`, 400, "request body: want a JSON object"},
	{"empty", ``, 400, "request body: EOF"},
	{"alpha 3e38", `{"prompt": "hi", "apps": ["tiny-steer"], "set": {"tiny-steer.op0.alpha": 3e38}}`, 400, `override "tiny-steer.op0.alpha": 3e+38 times the app's param happy overflows float32`},
	{"alpha 1e39", `{"prompt": "hi", "apps": ["tiny-steer"], "set": {"tiny-steer.op0.alpha": 1e39}}`, 400, "request body: json: cannot unmarshal number 1e39"},
	{"alpha NaN", `{"prompt": "hi", "set": {"tiny-steer.op0.alpha": NaN}}`, 400, "request body: invalid character 'N'"},
	{"alpha string", `{"prompt": "hi", "set": {"tiny-steer.op0.alpha": "NaN"}}`, 400, "request body: json: cannot unmarshal string"},
	{"unknown app", `{"prompt": "hi", "apps": ["nope"]}`, 400, `app "nope" is not deployed`},
	{"long prompt", fmt.Sprintf(`{"prompt": %q}`, strings.Repeat("a", 600)), 400, "exceeds the bundle's max_seq_len 512"},
	{"2 MB body", fmt.Sprintf(`{"prompt": %q}`, strings.Repeat("a", 2<<20)), 413, "request body: http: request body too large"},
	{"deep JSON", strings.Repeat("[", 100000) + strings.Repeat("]", 100000), 400, "request body: want a JSON object"},
	{"deep object", `{"prompt": ` + strings.Repeat(`{"a":`, 20000) + `1` + strings.Repeat(`}`, 20000) + `}`, 400, "request body:"},
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

// TestServeSurvivesHostileRequests sends the hostile set, several at once and beside
// requests that are being served, to an in-process server on the CPU backend: each gets its
// 4xx, the served ones finish as they would alone, and afterwards the server still serves
// with its memory bounded (ten max_tokens of 3e8 used to leave it at 7 GB).
func TestServeSurvivesHostileRequests(t *testing.T) {
	s := tinySession(t)
	cases := servedCases(s)
	want := alone(t, s, cases)
	url := startServer(t, s)
	if code, _ := post(t, url, `{"prompt": "warm", "max_tokens": 4}`); code != 200 {
		t.Fatalf("warm-up: %d", code)
	}
	runtime.GC()
	before := rss(t)
	var wg sync.WaitGroup
	for round := range 3 {
		for _, c := range hostileBodies {
			wg.Add(1)
			go func() {
				defer wg.Done()
				code, data := post(t, url, c.body)
				var e struct{ Error string }
				json.Unmarshal(data, &e)
				if code != c.code || !strings.Contains(e.Error, c.want) {
					t.Errorf("round %d, %s: %d %s, want %d naming %q", round, c.name, code, data, c.code, c.want)
				}
			}()
		}
		for i, c := range cases {
			wg.Add(1)
			go func() {
				defer wg.Done()
				code, data := post(t, url, c.body)
				var r generateResponse
				if code != 200 || json.Unmarshal(data, &r) != nil || !slices.Equal(r.Tokens, want[i].Tokens) {
					t.Errorf("round %d, served case %d beside the hostile set: %d %s, want tokens %v", round, i, code, data, want[i].Tokens)
				}
			}()
		}
		wg.Wait()
	}
	runtime.GC()
	after := rss(t)
	t.Logf("RSS after warm-up %.1f MB, after %d hostile requests %.1f MB", float64(before)/1e6, 3*len(hostileBodies), float64(after)/1e6)
	if after > before+256<<20 {
		t.Errorf("RSS grew from %.1f MB to %.1f MB over the hostile set", float64(before)/1e6, float64(after)/1e6)
	}
	code, data := post(t, url, cases[1].body)
	var r generateResponse
	if code != 200 || json.Unmarshal(data, &r) != nil || !slices.Equal(r.Tokens, want[1].Tokens) {
		t.Fatalf("a normal request afterwards: %d %s", code, data)
	}
}

// TestServeTimeouts: a client that sends half a body is cut off after the read timeout, and a
// stream longer than the write timeout is not (each write gets its own deadline).
func TestServeTimeouts(t *testing.T) {
	saved := timeouts
	t.Cleanup(func() { timeouts = saved })
	timeouts.Read, timeouts.Write = time.Second, 500*time.Millisecond
	s := tinySession(t)
	s.eng, s.be = slowEngine(t, s, 5*time.Millisecond)
	url := startServer(t, s)

	conn, err := net.Dial("tcp", strings.TrimPrefix(url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "POST /v1/generate HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"prompt\": ")
	start := time.Now()
	conn.SetReadDeadline(time.Now().Add(20 * time.Second))
	reply, _ := io.ReadAll(conn) // the server answers (or not) and closes
	if el := time.Since(start); el > 10*time.Second {
		t.Fatalf("half a body held the connection for %s", el)
	}
	if len(reply) > 0 && !bytes.HasPrefix(reply, []byte("HTTP/1.1 4")) {
		t.Errorf("half a body answered %q", reply)
	}

	resp, err := client.Post(url+"/v1/generate", "application/json", strings.NewReader(`{"prompt": "Once", "max_tokens": 300, "stream": true}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	begin := time.Now()
	var last string
	sc := bufio.NewScanner(resp.Body)
	lines := 0
	for sc.Scan() {
		last = sc.Text()
		lines++
	}
	var end streamEnd
	if err := json.Unmarshal([]byte(last), &end); err != nil || !end.Done || len(end.Tokens) != lines-1 {
		t.Fatalf("the stream ended after %s with %d lines, last %q (%v)", time.Since(begin), lines, last, err)
	}
	if el := time.Since(begin); el < 3*timeouts.Write {
		t.Logf("the stream took %s only; the test wants it longer than the write timeout %s", el, timeouts.Write)
	}
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

func slowEngine(t *testing.T, s *session, delay time.Duration) (*loader.Engine, loader.Backend) {
	be := slowBackend{s.be, delay}
	eng, err := loader.NewEngine(s.b, be)
	if err != nil {
		t.Fatal(err)
	}
	return eng, be
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

// TestServeOneRequestFailsAlone: a request whose own work panics in the engine answers 500
// naming it while the requests beside it are served; a step that fails answers 500 for its
// requests, healthz says so, and the next requests are served again.
func TestServeOneRequestFailsAlone(t *testing.T) {
	s := tinySession(t)
	cases := servedCases(s)
	want := alone(t, s, cases)
	pb := &poisonBackend{Backend: s.be, poison: 1234}
	eng, err := loader.NewEngine(s.b, pb)
	if err != nil {
		t.Fatal(err)
	}
	s.eng = eng
	url := startServer(t, s)
	var wg sync.WaitGroup
	for i, c := range cases {
		wg.Add(1)
		go func() {
			defer wg.Done()
			code, data := post(t, url, c.body)
			var r generateResponse
			if code != 200 || json.Unmarshal(data, &r) != nil || !slices.Equal(r.Tokens, want[i].Tokens) {
				t.Errorf("case %d beside the poisoned request: %d %s", i, code, data)
			}
		}()
	}
	code, data := post(t, url, `{"prompt": "Once", "max_tokens": 8, "apps": ["tiny-steer"], "set": {"tiny-steer.op0.alpha": 1234}}`)
	wg.Wait()
	if code != 500 || !regexp.MustCompile(`^\{"error":"request \d+: internal error in request: poisoned scalar row \(at robust_test.go:\d+\); please report it"\}`).Match(data) {
		t.Errorf("the poisoned request: %d %s", code, data)
	}

	pb.mu.Lock()
	pb.fail = 1
	pb.mu.Unlock()
	code, data = post(t, url, `{"prompt": "Once", "max_tokens": 4}`)
	if code != 500 || !strings.Contains(string(data), "the device fell over") {
		t.Errorf("the request of the failed step: %d %s", code, data)
	}
	resp, err := client.Get(url + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	health, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 503 || !strings.Contains(string(health), "the engine's last step failed") {
		t.Errorf("healthz after a failed step: %d %s", resp.StatusCode, health)
	}
	if code, data := post(t, url, cases[0].body); code != 200 {
		t.Errorf("after the failed step: %d %s", code, data)
	}
	if resp, err := client.Get(url + "/healthz"); err != nil || resp.StatusCode != 200 {
		t.Errorf("healthz after a good step: %v %v", resp, err)
	}
}

// TestServeNonFinite: a request whose logits overflow ends with finish_reason nonfinite and
// an error naming the step, streamed or not; the request beside it is served as ever.
func TestServeNonFinite(t *testing.T) {
	s := tinySession(t, `app: blowup
ops:
  - write: {at: {hook: logits}, kernel: scale, args: {alpha: 1e30}, when: {steps: {from: 2}}}
  - write: {at: {hook: logits}, kernel: scale, args: {alpha: 1e30}, when: {steps: {from: 2}}}
`)
	url := startServer(t, s)
	code, data := post(t, url, `{"prompt": "Once", "max_tokens": 8, "apps": ["blowup"]}`)
	var r generateResponse
	if code != 200 || json.Unmarshal(data, &r) != nil || r.Reason != "nonfinite" || len(r.Tokens) != 3 ||
		!strings.Contains(r.Error, "generation step 3: the logits at position 7 are not finite") {
		t.Errorf("not streamed: %d %s", code, data)
	}
	code, data = post(t, url, `{"prompt": "Once", "max_tokens": 8, "apps": ["blowup"], "stream": true}`)
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	var end streamEnd
	if code != 200 || len(lines) != 4 || json.Unmarshal([]byte(lines[3]), &end) != nil || end.Reason != "nonfinite" ||
		!slices.Equal(end.Tokens, r.Tokens) || !strings.Contains(end.Error, "generation step 3") {
		t.Errorf("streamed: %d %s", code, data)
	}
	if code, data := post(t, url, `{"prompt": "Once", "max_tokens": 8}`); code != 200 || !strings.Contains(string(data), `"finish_reason":"max_tokens"`) {
		t.Errorf("without the app: %d %s", code, data)
	}
}

// TestRunAndServeRefuseAlike: xmix run and xmix serve check a request's fields through the
// one loader.Engine.Check, so the same value is refused with the same message by both (the
// CLI adds the flag that set it).
func TestRunAndServeRefuseAlike(t *testing.T) {
	s := tinySession(t)
	url := startServer(t, s)
	for _, c := range []struct {
		args []string
		body string
		flag string
		want string
	}{
		{[]string{"-n", "-1"}, `{"prompt": "x", "max_tokens": -1}`, "--max-tokens", "max_tokens -1: must be at least 1"},
		{[]string{"-n", "9223372036854775807"}, `{"prompt": "x", "max_tokens": 9223372036854775807}`, "--max-tokens",
			"prompt (2 tokens, BOS included) + max_tokens (9223372036854775807) = 9223372036854775809 exceeds the bundle's max_seq_len 512"},
		{[]string{"-n", "10000000000"}, `{"prompt": "x", "max_tokens": 10000000000}`, "--max-tokens", "prompt (2 tokens, BOS included) + max_tokens (10000000000) = 10000000002 exceeds the bundle's max_seq_len 512"},
		{[]string{"--temperature", "-1"}, `{"prompt": "x", "temperature": -1}`, "--temperature", "temperature -1: want a finite number >= 0 (0: greedy)"},
		{[]string{"--top-p", "2"}, `{"prompt": "x", "top_p": 2}`, "--top-p", "top_p 2: want a number in [0, 1] (0 or 1: no nucleus cut)"},
		{[]string{"--apps", "tiny-steer", "--set", "tiny-steer.op0.alpha=3e38"}, `{"prompt": "x", "apps": ["tiny-steer"], "set": {"tiny-steer.op0.alpha": 3e38}}`,
			"--set", `override "tiny-steer.op0.alpha": 3e+38 times the app's param happy overflows float32 (at most 3.89e+18 in magnitude)`},
		{[]string{"--apps", "nope"}, `{"prompt": "x", "apps": ["nope"]}`, "--apps", `app "nope" is not deployed in this bundle (deployed: tiny-steer, tiny-probe)`},
	} {
		_, cliErr := xmix(t, append([]string{"run", "-q", "-p", "x"}, c.args...)...)
		code, data := post(t, url, c.body)
		var e struct{ Error string }
		json.Unmarshal(data, &e)
		if cliErr == nil || !strings.HasPrefix(cliErr.Error(), c.flag) || !strings.HasSuffix(cliErr.Error(), c.want) {
			t.Errorf("xmix run %v: %v, want %s ... %q", c.args, cliErr, c.flag, c.want)
		}
		if code != 400 || e.Error != c.want {
			t.Errorf("serve %s: %d %q, want 400 %q", c.body, code, e.Error, c.want)
		}
	}
	// Values only a flag can spell: the CLI refuses them through the same check.
	for _, c := range []struct{ args []string }{
		{[]string{"--temperature", "NaN"}}, {[]string{"--top-p", "NaN"}}, {[]string{"--temperature", "+Inf"}},
		{[]string{"--apps", "tiny-steer", "--set", "tiny-steer.op0.alpha=NaN"}},
		{[]string{"--apps", "tiny-steer", "--set", "tiny-steer.op0.alpha=-Inf"}},
	} {
		_, err := xmix(t, append([]string{"run", "-q", "-p", "x"}, c.args...)...)
		if err == nil || !regexp.MustCompile(`(NaN|Inf)(: want| is not a finite number)`).MatchString(err.Error()) {
			t.Errorf("xmix run %v: %v", c.args, err)
		}
	}
	if _, err := xmix(t, "run", "-q", "-p", "x", "--set", "tiny-steer.op0.alpha=1e39"); err == nil ||
		!strings.Contains(err.Error(), `--set "tiny-steer.op0.alpha=1e39": 1e39 is out of float32 range`) {
		t.Errorf("--set 1e39: %v", err)
	}
}

// TestRunReportsNonFinite: xmix run prints what a request generated before its logits
// stopped being finite, says why it ended, and exits with an error naming the prompt.
func TestRunReportsNonFinite(t *testing.T) {
	s := tinySession(t, `app: blowup
ops:
  - write: {at: {hook: logits}, kernel: scale, args: {alpha: 1e30}, when: {steps: {from: 2}}}
  - write: {at: {hook: logits}, kernel: scale, args: {alpha: 1e30}, when: {steps: {from: 2}}}
`)
	var out bytes.Buffer
	err := s.generate(&out, runFlags{quiet: true, maxTokens: 8, topP: 1}, []string{"Once", "Once"}, [][]string{{"blowup"}, nil})
	if err == nil || !strings.Contains(err.Error(), "request 0: generation step 3: the logits at position 7 are not finite") || strings.Contains(err.Error(), "request 1") {
		t.Fatalf("generate: %v", err)
	}
	if !strings.Contains(out.String(), "── blowup ──\nOnce") || !strings.Contains(out.String(), "  [nonfinite: generation step 3") || !strings.Contains(out.String(), "── no apps ──") {
		t.Fatalf("output:\n%s", out.String())
	}
}
