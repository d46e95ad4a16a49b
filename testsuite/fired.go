package testsuite

import (
	"fmt"
	"math"
	"strings"
	"testing"

	"xmix/loader"
	"xmix/specs"
)

// firedApps is app "fire", whose ops fire at sites a test can count from a request's rows
// (op: where), and app "cust", a custom kernel (counted by the host: every row).
var firedApps = []string{`app: fire
params: {v: {random: 1}, d: {random: 2}}
buffers: {x: {shape: [128], export: true}, top: {shape: [2], export: true}}
ops:
  - write: {at: {layers: all, hook: resid_post}, kernel: steer_add, args: {vector: v, alpha: 0.5}, when: {token_in: [65, 66]}}
  - read: {at: {layers: [1], hook: resid_post}, kernel: capture, into: x}
  - write: {at: {layers: [2], hook: resid_post}, kernel: clamp_projection, args: {direction: d, min: -1000000, max: 1000000}}
  - write: {at: {layers: [0, 2], hook: resid_mid}, kernel: clamp_projection, args: {direction: d, min: 0, max: 0}}
  - read: {at: {layers: [1], hook: resid_post}, kernel: logit_lens, args: {k: 1}, into: top}
  - write: {at: {hook: logits}, kernel: scale, args: {alpha: 1}}
  - write: {at: {hook: sampled}, kernel: token_override, args: {token: 65}, when: {steps: {from: 1, to: 3}}}
  - write: {at: {layers: [1], hook: attn.z}, kernel: head_ablate, args: {head: 1, alpha: 0.5}, when: {positions: generated}}
  - write: {at: {hook: final_norm}, kernel: steer_add, args: {vector: v, alpha: 0.1}}
`, "app: cust\nkernels:\n  scale2:\n    entry: scale2\n" +
	"    signature: [x u64, stride u32, offset u32, width u32, ctl_mask u64, bit u32]\n" +
	"    ptx: |\n      " + strings.ReplaceAll(specs.ScaleTwoPTX, "\n", "\n      ") + "\n" +
	"ops:\n  - write: {at: {layers: [2], hook: resid_post}, kernel: custom:scale2}\n"}

// wantFired is what a request's rows say each op of firedApps fired at.
func wantFired(r loader.Result) loader.Fired {
	rows, samples, prompt := len(r.Rows), len(r.Tokens), r.PromptTokens
	trigger, window := 0, 0
	for _, row := range r.Rows {
		if row.Token == 65 || row.Token == 66 {
			trigger++
		}
		if g := row.Pos - prompt; g >= 1 && g < 3 {
			window++ // a sampled row of generation steps 1 and 2
		}
	}
	return loader.Fired{{Name: "fire.op0", Sites: 3 * trigger}, {Name: "fire.op1", Sites: rows}, {Name: "fire.op2", Sites: 0},
		{Name: "fire.op3", Sites: 2 * rows}, {Name: "fire.op4", Sites: rows}, {Name: "fire.op5", Sites: samples},
		{Name: "fire.op6", Sites: window}, {Name: "fire.op7", Sites: rows - prompt}, {Name: "fire.op8", Sites: samples},
		{Name: "cust.op0", Sites: rows}}
}

// CheckFired: Result.Fired counts, for every op of every enabled app, the sites where it
// changed or read a row: gated ops only where their conditions held, a clamp only where it
// moved the projection, ops over the logits, the sampled token and the final norm on sampled
// rows only; the same alone and in a batch with a request without the apps, which has none.
func CheckFired(t *testing.T, nb NewBackend) {
	b := Compile(t, SmallModel, firedApps...)
	reqs := []loader.Request{
		{Prompt: []int{65, 10, 66, 66, 20}, Apps: []string{"fire", "cust"}, MaxTokens: 6},
		{Prompt: []int{30, 31}, MaxTokens: 4},
	}
	mixed := Generate(t, nb, b, reqs)
	alone := Generate(t, nb, b, reqs[:1])
	got, want := mixed[0].Fired, wantFired(mixed[0])
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("fired\n got %v\nwant %v", got, want)
	}
	if want[0].Sites == 0 || want[6].Sites == 0 {
		t.Fatalf("the conditions never held: the check covers less than it should (%v)", want)
	}
	if fmt.Sprint(alone[0].Fired) != fmt.Sprint(got) {
		t.Fatalf("fired alone %v, in a batch %v", alone[0].Fired, got)
	}
	if mixed[1].Fired != nil {
		t.Fatalf("a request without apps has fired counts %v", mixed[1].Fired)
	}
	if got.Get("fire.op6") != want[6].Sites || got.Get("nope.op0") != -1 {
		t.Fatalf("Get: %d %d", got.Get("fire.op6"), got.Get("nope.op0"))
	}
}

// CheckStopWhen: a request with StopWhen ends at the first sampling row whose export
// crosses the threshold, with that row's token last and reason stop_when; until then it is
// the request without StopWhen. A threshold on a missing, wide or disabled export, or an
// unknown comparison, is refused by name.
func CheckStopWhen(t *testing.T, nb NewBackend) {
	probe := `app: probe
params: {w: {random: 9}}
buffers: {s: {shape: [1], export: true}, x: {shape: [128], export: true}}
ops:
  - read: {at: {layers: [1], hook: resid_post}, kernel: probe_linear, args: {w: w}, into: s}
  - read: {at: {layers: [1], hook: resid_post}, kernel: capture, into: x}
`
	b := Compile(t, SmallModel, probe)
	base := loader.Request{Prompt: []int{12, 13, 14}, Apps: []string{"probe"}, MaxTokens: 8}
	full := Generate(t, nb, b, []loader.Request{base})[0]
	const k = 3 // stop after the fourth token
	p := full.PromptTokens
	v := full.Rows[p-1+k].Exports.Get("probe.s")[0]
	for j := range k {
		if full.Rows[p-1+j].Exports.Get("probe.s")[0] == v {
			t.Fatalf("probe score %v repeats at token %d: pick another", v, j)
		}
	}
	stop := base
	stop.StopWhen = &loader.StopWhen{Export: "probe.s", Op: "==", Value: v}
	got := Generate(t, nb, b, []loader.Request{stop})[0]
	if got.Reason != "stop_when" || fmt.Sprint(got.Tokens) != fmt.Sprint(full.Tokens[:k+1]) {
		t.Fatalf("stopped: tokens %v reason %s; unstopped %v", got.Tokens, got.Reason, full.Tokens)
	}
	never := base
	never.StopWhen = &loader.StopWhen{Export: "probe.s", Op: ">", Value: float32(math.Inf(1))}
	if r := Generate(t, nb, b, []loader.Request{never})[0]; r.Reason != full.Reason || len(r.Tokens) != len(full.Tokens) {
		t.Fatalf("a threshold never crossed: %d tokens, %s; want %d, %s", len(r.Tokens), r.Reason, len(full.Tokens), full.Reason)
	}
	be := nb(t, b)
	defer be.Close()
	eng, err := loader.NewEngine(b, be)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		w    loader.StopWhen
		apps []string
		want string
	}{
		{loader.StopWhen{Export: "probe.x", Op: ">"}, nil, "stop_when: export probe.x has 128 values per token; it needs one"},
		{loader.StopWhen{Export: "probe.t", Op: ">"}, nil, "stop_when: export probe.t is not an export of the apps the request enables (exports: probe.s, probe.x)"},
		{loader.StopWhen{Export: "probe.s", Op: "=>"}, nil, `stop_when: op "=>" is not one of >, >=, <, <=, ==, !=`},
		{loader.StopWhen{Export: "probe.s", Op: ">"}, []string{}, "stop_when: export probe.s: the request enables no app with exports"},
	} {
		r := base
		r.StopWhen = &c.w
		if c.apps != nil {
			r.Apps = c.apps
		}
		if _, err := eng.Submit(r); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want %q", c.w, err, c.want)
		}
	}
}
