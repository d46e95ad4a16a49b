package main

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestRunAndServeRefuseAlike: xmix run and xmix serve check a request's fields through the
// one loader.Engine.Check, so the same value is refused with the same message by both (the
// CLI adds the flag that set it).
func TestRunAndServeRefuseAlike(t *testing.T) {
	s := tinySession(t)
	url := startServe(t, s, serveFlags{runFlags: runFlags{quiet: true}, grace: 5 * time.Second}, io.Discard)
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
		{[]string{"--apps", "tiny-steer", "--set", "tiny-steer.op0.alpha=3e38"}, `{"prompt": "x", "xmix": {"apps": ["tiny-steer"], "set": {"tiny-steer.op0.alpha": 3e38}}}`,
			"--set", `override "tiny-steer.op0.alpha": 3e+38 times the app's param happy overflows float32 (at most 3.89e+18 in magnitude)`},
		{[]string{"--apps", "nope"}, `{"prompt": "x", "xmix": {"apps": ["nope"]}}`, "--apps", `app "nope" is not deployed in this bundle (deployed: tiny-steer, tiny-probe)`},
	} {
		_, cliErr := xmix(t, append([]string{"run", "-q", "-p", "x"}, c.args...)...)
		resp, err := http.Post(url+"/v1/completions", "application/json", strings.NewReader(c.body))
		if err != nil {
			t.Fatal(err)
		}
		data, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		code := resp.StatusCode
		var e struct{ Error struct{ Message string } }
		json.Unmarshal(data, &e)
		if cliErr == nil || !strings.HasPrefix(cliErr.Error(), c.flag) || !strings.HasSuffix(cliErr.Error(), c.want) {
			t.Errorf("xmix run %v: %v, want %s ... %q", c.args, cliErr, c.flag, c.want)
		}
		if code != 400 || e.Error.Message != c.want {
			t.Errorf("serve %s: %d %q, want 400 %q", c.body, code, e.Error.Message, c.want)
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
