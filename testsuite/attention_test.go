package testsuite

import (
	"slices"
	"strings"
	"testing"

	"xmix/cmd/driver"
	"xmix/loader"
)

// The split (flash-decoding) attention is wired like the standard one: its bundle verifies,
// binds the shared workspace, gives every bucket a split count, and generates what the
// standard bundle generates (both kernels implement op "attention"; the PTX itself is
// checked against that op in codegen's emulator tests and on the GPU by testsuite/gpu).
func TestSplitAttentionBundle(t *testing.T) {
	mp, _ := WriteSpecs(t, SmallModel)
	build := func(kind string) []loader.Result {
		b, err := driver.Build(mp, nil, driver.Options{Verify: true, Attention: kind})
		if err != nil {
			t.Fatal(err)
		}
		b = roundTrip(t, b)
		splitNodes := 0
		for _, tmpl := range b.Templates {
			for _, n := range tmpl.Nodes {
				if n.Args != nil && len(n.Args) == 8 && n.Args[7].Buffer == "act.attn_ws" {
					splitNodes++
				}
			}
		}
		if want := map[string]int{"standard": 0, "split": len(b.Templates) * b.Manifest.Model.Layers}[kind]; splitNodes != want {
			t.Fatalf("%s: %d attention nodes bind act.attn_ws, want %d", kind, splitNodes, want)
		}
		return Generate(t, NewCPU, b, []loader.Request{{Prompt: []int{3, 14, 15, 92, 65}, MaxTokens: 12}, {Prompt: []int{27, 18}, MaxTokens: 9}})
	}
	std, split := build("standard"), build("split")
	for i := range std {
		if !slices.Equal(std[i].Tokens, split[i].Tokens) {
			t.Fatalf("request %d: standard %v, split %v", i, std[i].Tokens, split[i].Tokens)
		}
	}
	if _, err := driver.Build(mp, nil, driver.Options{Attention: "paged"}); err == nil || !strings.Contains(err.Error(), `attention kind "paged": use standard or split`) {
		t.Fatalf("unknown attention kind: %v", err)
	}
}
