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
// (bundle.GatedGuBF16), both of which only the plain activation kernel allows: an app's op at
// mlp.act leaves the activation for an MI kernel of its own after it, whatever
// --gated-copy-rows says, while a bucket of GEMVs keeps it in the activation kernel. On the CPU
// backend the app changes the logits of the requests that enable it and leaves the others the
// bare bundle's bit for bit, 32 at once in a 32-row bucket. (The two forms give act the same
// bits: codegen's TestActivationThenMIKeepsBits.)
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
	for _, rows := range []int{32, -1} {
		b := CompileWith(t, compile.Options{GatedCopyRows: rows}, model, app)
		if l := labels(b, "decode_b32"); !slices.Contains(l, "L1.silu_mul.mi") {
			t.Fatalf("--gated-copy-rows %d: decode_b32 has no MI kernel after layer 1's activation: %v", rows, l)
		}
		if l := labels(b, "decode_b1"); slices.ContainsFunc(l, func(s string) bool { return strings.HasSuffix(s, ".mi") }) {
			t.Fatalf("--gated-copy-rows %d: decode_b1 (GEMVs) has an MI kernel: %v", rows, l)
		}
	}
	var prompts [][]int
	for i := range 32 {
		prompts = append(prompts, []int{10 + i, 20, 30 + 2*i})
	}
	AppRowsKeepBits(t, NewCPU, CompileWith(t, compile.Options{}, model, app), CompileWith(t, compile.Options{}, model), "act-scale", prompts, 4)
}
