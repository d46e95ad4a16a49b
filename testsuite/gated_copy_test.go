package testsuite

import (
	"slices"
	"strings"
	"testing"

	"xmix/bundle"
	"xmix/compile"
)

// TestMLPActOpsLeaveTensorCoreActivations: in a decode bucket whose gate/up runs on tensor
// cores the backend may serve that GEMM and its activation as one copy-engine launch
// (xmixc build --gated-copy-rows) or have cuBLASLt write gu in bf16 for the activation
// (bundle.GatedGuBF16), both of which only the plain activation kernel allows; a bucket of
// GEMVs (or of up to --gated-tc-rows rows) runs gate/up and the activation as one kernel: so
// an app's op at mlp.act runs in an MI kernel of its own after the activation in every bucket,
// whatever --gated-copy-rows says, and the layer keeps the kernels of the bundle without the
// app (passes' foldGateAct). On the CPU backend the app changes the logits of the requests that
// enable it and leaves the others the bare bundle's bit for bit, 32 at once in a 32-row
// bucket. (The MI kernel gives act the bits the activation kernel with the op would: codegen's
// TestActivationThenMIKeepsBits.)
func TestMLPActOpsLeaveTensorCoreActivations(t *testing.T) {
	model := strings.Replace(SmallModel, "decode_buckets: [1, 2, 4], prefill_chunks: [16], max_seq_len: 128, max_seqs: 4",
		"decode_buckets: [1, 32], prefill_chunks: [16], max_seq_len: 128, max_seqs: 32", 1)
	app := `app: act-scale
params: {s: {random: 23}}
ops:
  - write: {at: {layers: [1], hook: mlp.act}, kernel: scale, args: {vector: s}}
`
	labels := func(b *bundle.Bundle, template string) []string {
		var out []string
		for _, tm := range b.Templates {
			if tm.Name == template {
				for _, n := range tm.Nodes {
					out = append(out, n.Label)
				}
			}
		}
		return out
	}
	bare := CompileWith(t, compile.Options{}, model)
	for _, rows := range []int{32, -1} {
		b := CompileWith(t, compile.Options{GatedCopyRows: rows}, model, app)
		for tm, after := range map[string]string{"decode_b32": "L1.silu_mul", "decode_b1": "L1.gate_up"} {
			l := labels(b, tm)
			if i := slices.Index(l, "L1.mlp.act"); i < 1 || l[i-1] != after {
				t.Fatalf("--gated-copy-rows %d: %s has no MI kernel right after %s: %v", rows, tm, after, l)
			}
			if want := labels(bare, tm); !slices.Equal(slices.DeleteFunc(l, func(s string) bool { return s == "L1.mlp.act" }), want) {
				t.Fatalf("--gated-copy-rows %d: %s's nodes but the MI kernel %v, the bare bundle's %v", rows, tm, l, want)
			}
		}
	}
	var prompts [][]int
	for i := range 32 {
		prompts = append(prompts, []int{10 + i, 20, 30 + 2*i})
	}
	AppRowsKeepBits(t, NewCPU, CompileWith(t, compile.Options{}, model, app), bare, "act-scale", prompts, 4)
}
