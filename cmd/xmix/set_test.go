package main

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
)

// TestRunSetOverridesScalars: --set reaches every prompt's request. tiny-steer at alpha 0
// adds exactly nothing, so its text equals the plain prompt's; at the default alpha it
// differs.
func TestRunSetOverridesScalars(t *testing.T) {
	tokens := func(args ...string) [][]int {
		t.Helper()
		out, err := xmix(t, append([]string{"run", "-q", "-n", "12", "--json", "-p", "One day", "-p", "One day",
			"--apps", "tiny-steer@1"}, args...)...)
		if err != nil {
			t.Fatal(err)
		}
		var res struct {
			Results []struct {
				Tokens []int `json:"tokens"`
			} `json:"results"`
		}
		if err := json.Unmarshal([]byte(out), &res); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		return [][]int{res.Results[0].Tokens, res.Results[1].Tokens}
	}
	if r := tokens(); slices.Equal(r[0], r[1]) {
		t.Fatalf("tiny-steer at its default alpha changed nothing: %v", r[0])
	}
	if r := tokens("--set", "tiny-steer.op0.alpha=0"); !slices.Equal(r[0], r[1]) {
		t.Fatalf("tiny-steer at alpha 0: %v, plain %v", r[1], r[0])
	}
	for _, c := range []struct{ set, want string }{
		{"tiny-steer.alpha=3", "valid: tiny-steer.op0.alpha"},
		{"tiny-steer.op0.alpha", "want app.scalar=value"},
		{"tiny-steer.op0.alpha=big", "not a number"},
	} {
		if _, err := xmix(t, "run", "-q", "-n", "2", "-p", "x", "--set", c.set); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("--set %s: %v, want %q", c.set, err, c.want)
		}
	}
}
