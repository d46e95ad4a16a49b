package testsuite

import (
	"slices"
	"strings"
	"testing"

	"xmix/bundle"
	"xmix/compile"
	"xmix/loader"
)

// TestGatedCopyMovesMLPActOps: in a decode bucket where the backend may serve the gate/up GEMM
// and its activation as one copy-engine launch (xmixc build --gated-copy-rows), an app's op at
// mlp.act leaves the activation kernel for an MI kernel of its own after it, and every row's
// logits are those of the bundle that keeps the op in the activation kernel, bit for bit, on
// the CPU backend: requests with and without the app, 32 at once in a 32-row bucket (where
// the app changes the logits).
func TestGatedCopyMovesMLPActOps(t *testing.T) {
	model := strings.Replace(SmallModel, "decode_buckets: [1, 2, 4], prefill_chunks: [16], max_seq_len: 128, max_seqs: 4",
		"decode_buckets: [1, 32], prefill_chunks: [16], max_seq_len: 128, max_seqs: 32", 1)
	app := `app: act-scale
params: {s: {random: 23}}
ops:
  - write: {at: {layers: [1], hook: mlp.act}, kernel: scale, args: {vector: s}}
`
	split := CompileWith(t, compile.Options{GatedCopyRows: 32}, model, app)
	fused := CompileWith(t, compile.Options{GatedCopyRows: -1}, model, app)
	labels := func(b *bundle.Bundle) []string {
		var out []string
		for _, tm := range b.Templates {
			if tm.Name == "decode_b32" {
				for _, n := range tm.Nodes {
					out = append(out, n.Label)
				}
			}
		}
		return out
	}
	if l := labels(split); !slices.Contains(l, "L1.silu_mul.mi") {
		t.Fatalf("--gated-copy-rows 32: decode_b32 has no MI kernel after layer 1's activation: %v", l)
	}
	if l := labels(fused); slices.ContainsFunc(l, func(s string) bool { return strings.HasSuffix(s, ".mi") }) {
		t.Fatalf("--gated-copy-rows 0: decode_b32 has an MI kernel: %v", l)
	}
	var reqs []loader.Request
	for i := range 32 {
		r := loader.Request{Prompt: []int{10 + i, 20, 30 + 2*i}, MaxTokens: 4}
		if i%2 == 0 {
			r.Apps = []string{"act-scale"}
		}
		reqs = append(reqs, r)
	}
	run := func(b *bundle.Bundle) [][]float32 {
		var rec *LogitRecorder
		Generate(t, func(t testing.TB, b *bundle.Bundle) loader.Backend {
			rec = &LogitRecorder{Backend: NewCPU(t, b), Vocab: 32 * 300}
			return rec
		}, b, reqs)
		return rec.Steps
	}
	want, got := run(fused), run(split)
	if len(got) != len(want) || len(got) < 4 {
		t.Fatalf("%d steps, want %d (at least 4)", len(got), len(want))
	}
	for i := range reqs {
		reqs[i].Apps = nil
	}
	if bare := run(fused); slices.Equal(bare[len(bare)-1], want[len(want)-1]) {
		t.Fatal("the app changed no logits: the check would not see a lost op")
	}
	for s := range got {
		if !slices.Equal(got[s], want[s]) {
			t.Fatalf("step %d: logits differ from the bundle with the op in the activation kernel", s)
		}
	}
}
