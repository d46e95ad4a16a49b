package testsuite

import (
	"path/filepath"
	"testing"

	"xmix/compile"
)

// TestShippedAppsCompile: the paper's seven apps (specs/apps/app*.yaml) deploy together on
// their real-size models: apps 1-6 in one Llama-3.1-8B bundle, app 7 on Mixtral-8x7B; the
// per-request example on Llama-3.1-8B.
func TestShippedAppsCompile(t *testing.T) {
	apps, err := filepath.Glob("../specs/apps/app[1-6]-*.yaml")
	if err != nil || len(apps) != 6 {
		t.Fatalf("apps 1-6: %v %v", apps, err)
	}
	for _, c := range []struct {
		model string
		apps  []string
		sites int
	}{
		{"../specs/models/llama-3.1-8b.yaml", apps, 32 + 32 + 1 + 11 + 1 + 1 + 16 + 16},
		{"../specs/models/mixtral-8x7b.yaml", []string{"../specs/apps/app7-steermoe.yaml"}, 64},
		{"../specs/models/llama-3.1-8b.yaml", []string{"../specs/apps/per-request.yaml"}, 17 + 3},
	} {
		b, err := compile.Build(c.model, c.apps, compile.Options{Verify: true})
		if err != nil {
			t.Fatal(err)
		}
		if got := len(b.Manifest.Sites); got != c.sites {
			t.Errorf("%s: %d MI sites, want %d", c.model, got, c.sites)
		}
	}
}
