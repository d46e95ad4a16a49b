package testsuite

import (
	"fmt"
	"reflect"
	"strings"
	"testing"

	"xmix/bundle"
	"xmix/codegen"
	"xmix/compile"
	"xmix/loader"
)

// TestNormClusterByTemplate: built with --norm-cluster, the add+norm kernels without MI ops of
// templates of at most --norm-cluster-rows rows spread each row over a cluster (grid rows x
// CTAs, each a slice of the one-CTA block), every other row kernel (an app's add+norm, the
// final norm, the embedding) and every larger template keep one CTA a row, and the build
// records both settings. The engine on the CPU gives the clustered bundle's requests what it
// gives the plain one's, token for token and logprob for logprob (the emulator checks the
// kernels' bits: codegen's TestRowNormCluster, TestEmulatedBundleMatchesReferenceOps).
func TestNormClusterByTemplate(t *testing.T) {
	app := steerAt("steer", randVec(7, 128), 2, "")
	reqs := []loader.Request{{Prompt: []int{3, 1, 4, 1, 5, 9, 2, 6}, MaxTokens: 5, Apps: []string{"steer"}, TopLogprobs: 2},
		{Prompt: []int{2, 7, 1}, MaxTokens: 6, TopLogprobs: 2}, {Prompt: []int{8, 2, 8}, MaxTokens: 4, TopLogprobs: 2}}
	plain := CompileWith(t, compile.Options{}, SmallModel, app)
	want := generateCPU(t, plain, reqs)
	for _, c := range []struct{ ctas, optRows, rows int }{{2, 0, codegen.DefaultNormClusterRows}, {4, 2, 2}} {
		b := CompileWith(t, compile.Options{NormCluster: c.ctas, NormClusterRows: c.optRows}, SmallModel, app)
		if bi := b.Manifest.Build; bi.NormCluster != c.ctas || bi.NormClusterRows != c.rows {
			t.Fatalf("build info norm_cluster %d norm_cluster_rows %d, want %d and %d", bi.NormCluster, bi.NormClusterRows, c.ctas, c.rows)
		}
		kernels := map[string]bundle.Kernel{}
		for _, k := range b.Kernels {
			kernels[k.Name] = k
		}
		clustered := 0
		for _, tpl := range b.Templates {
			for _, list := range tpl.NodeLists() {
				for _, n := range list {
					k := kernels[n.Kernel]
					if k.Op != bundle.OpRowNorm {
						continue
					}
					plainAdd := strings.HasPrefix(k.Name, "add_norm_h128") && !strings.Contains(k.Name, "_mi_")
					spread := strings.Contains(k.PTX, ".reqnctapercluster")
					switch {
					case plainAdd && tpl.Tokens <= c.rows:
						suffix := fmt.Sprintf("_c%d", c.ctas)
						if !spread || !strings.HasSuffix(k.Name, suffix) || n.Grid[0] != c.ctas*tpl.Tokens || n.Block[0] != 128/c.ctas {
							t.Fatalf("%s %s: kernel %s grid %v block %v, want %s over clusters of %d", tpl.Name, n.Label, k.Name, n.Grid, n.Block, suffix, c.ctas)
						}
						clustered++
					case spread || n.Grid[0] != tpl.Tokens && n.Grid[0] != tpl.Samples:
						t.Fatalf("%s %s: kernel %s grid %v spreads its rows; only plain add+norms of up to %d rows may", tpl.Name, n.Label, k.Name, n.Grid, c.rows)
					}
				}
			}
		}
		if clustered == 0 {
			t.Fatalf("clusters of %d: no add+norm spread its rows", c.ctas)
		}
		if got := generateCPU(t, b, reqs); !reflect.DeepEqual(got, want) {
			t.Fatalf("clusters of %d: the CPU's results differ from the plain bundle's:\n%+v\n%+v", c.ctas, got, want)
		}
	}
}

// generateCPU runs reqs on b's CPU backend and returns each request's tokens and logprobs.
func generateCPU(t *testing.T, b *bundle.Bundle, reqs []loader.Request) []any {
	t.Helper()
	eng, err := loader.NewEngine(b, NewCPU(t, b))
	if err != nil {
		t.Fatal(err)
	}
	res, err := eng.Generate(reqs)
	if err != nil {
		t.Fatal(err)
	}
	var out []any
	for _, r := range res {
		out = append(out, r.Tokens, r.Logprobs)
	}
	return out
}
