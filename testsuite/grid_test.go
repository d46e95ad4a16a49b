package testsuite

import (
	"fmt"
	"path/filepath"
	"slices"
	"testing"

	"xmix/bundle"
	"xmix/compile"
)

// gridRow is what one specs/apps/grid/ spec must deploy on Llama-3.1-8B: its MI sites
// (template at hook on layers, fused into a model kernel or run as a node of its own) and the
// width of its export per token (0: none).
type gridRow struct {
	app    string
	what   string
	hook   string
	layers []int // nil: the whole-model hook (layer -1)
	fused  bool
	export int
}

func layerRange(from, to int) []int {
	var ls []int
	for l := from; l <= to; l++ {
		ls = append(ls, l)
	}
	return ls
}

// gridRows are the nnsight comparison grid's rows (FACTS.md) that testsuite/gpu/apps.sh
// times; a spec that stops building or deploys something else fails here, not on the GPU.
var gridRows = map[string]gridRow{
	"capture-l16.yaml":    {"grid-capture-l16", "capture", "resid_post", []int{16}, true, 4096},
	"capture-all.yaml":    {"grid-capture-all", "capture", "resid_post", layerRange(0, 31), true, 32 * 4096},
	"steer-l16.yaml":      {"grid-steer-l16", "steer_add", "resid_post", []int{16}, true, 0},
	"lens-l16.yaml":       {"grid-lens-l16", "logit_lens", "resid_post", []int{16}, false, 10},
	"lens-all.yaml":       {"grid-lens-all", "logit_lens", "resid_post", layerRange(0, 31), false, 32 * 10},
	"probe-l16.yaml":      {"grid-probe-l16", "probe_linear", "resid_post", []int{16}, true, 1},
	"head-ablate.yaml":    {"grid-head-ablate", "head_ablate", "attn.z", []int{16}, false, 0},
	"token-override.yaml": {"grid-token-override", "token_override", "sampled", nil, true, 0},
}

// TestGridSpecs: every grid spec builds alone on Llama-3.1-8B and deploys exactly its row's
// sites and export; all of them build together, as apps.sh deploys them.
func TestGridSpecs(t *testing.T) {
	const model = "../specs/models/llama-3.1-8b.yaml"
	files, err := filepath.Glob("../specs/apps/grid/*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, f := range files {
		names = append(names, filepath.Base(f))
	}
	var want []string
	for n := range gridRows {
		want = append(want, n)
	}
	slices.Sort(want)
	if !slices.Equal(names, want) {
		t.Fatalf("specs/apps/grid holds %v, want %v (add the row to gridRows and to apps_assemble.py)", names, want)
	}
	total := 0
	for _, f := range files {
		row := gridRows[filepath.Base(f)]
		t.Run(row.app, func(t *testing.T) {
			b, err := compile.Build(model, []string{f}, compile.Options{Verify: true})
			if err != nil {
				t.Fatal(err)
			}
			checkGridRow(t, b, row)
		})
		if row.layers == nil {
			total++
		} else {
			total += len(row.layers)
		}
	}
	b, err := compile.Build(model, files, compile.Options{Verify: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(b.Manifest.Apps) != len(files) || len(b.Manifest.Sites) != total {
		t.Fatalf("all grid apps together: %d apps, %d sites; want %d and %d", len(b.Manifest.Apps), len(b.Manifest.Sites), len(files), total)
	}
}

func checkGridRow(t *testing.T, b *bundle.Bundle, row gridRow) {
	t.Helper()
	if len(b.Manifest.Apps) != 1 || b.Manifest.Apps[0].Name != row.app {
		t.Fatalf("apps %+v, want only %s", b.Manifest.Apps, row.app)
	}
	want := row.layers
	if want == nil {
		want = []int{-1}
	}
	var got []int
	for _, s := range b.Manifest.Sites {
		if s.App != row.app || s.What != row.what || s.Hook != row.hook || s.Fused != row.fused {
			t.Errorf("site %+v, want %s at %s (fused %v)", s, row.what, row.hook, row.fused)
		}
		got = append(got, s.Layer)
	}
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Errorf("sites at layers %v, want %v", got, want)
	}
	var exports []string
	for _, e := range b.Manifest.Apps[0].Exports {
		exports = append(exports, fmt.Sprintf("%s:%d", e.Name, e.Width))
	}
	switch {
	case row.export == 0 && len(exports) != 0:
		t.Errorf("exports %v, want none", exports)
	case row.export != 0 && (len(exports) != 1 || b.Manifest.Apps[0].Exports[0].Width != row.export):
		t.Errorf("exports %v, want one of width %d", exports, row.export)
	}
	// The kernel each site names must be in the bundle.
	kernels := map[string]bool{}
	for _, k := range b.Kernels {
		kernels[k.Name] = true
	}
	for _, s := range b.Manifest.Sites {
		if !kernels[s.Kernel] {
			t.Errorf("site %+v names kernel %s, which the bundle lacks", s, s.Kernel)
		}
	}
}
