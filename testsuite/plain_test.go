package testsuite

import (
	"reflect"
	"strings"
	"testing"
)

// A bundle with apps carries, per template, the nodes of the same bucket compiled without
// them (Template.Plain), which backends run for steps in which no row enables an app. They
// must be exactly the app-free bundle's nodes, kernel for kernel and argument for argument.
func TestPlainNodesAreTheAppFreeBundle(t *testing.T) {
	bare := Compile(t, SmallModel)
	apps := Compile(t, SmallModel, smallSevenApps...)
	if len(apps.Templates) != len(bare.Templates) {
		t.Fatalf("%d templates with apps, %d without", len(apps.Templates), len(bare.Templates))
	}
	kernels := map[string]string{}
	for _, k := range apps.Kernels {
		kernels[k.Name] = k.PTX
	}
	for i, tb := range bare.Templates {
		ta := apps.Templates[i]
		if len(tb.Plain) != 0 {
			t.Fatalf("%s: the app-free bundle has plain nodes", tb.Name)
		}
		if !reflect.DeepEqual(ta.Plain, tb.Nodes) {
			t.Fatalf("%s: plain nodes differ from the app-free bundle's", ta.Name)
		}
		if reflect.DeepEqual(ta.Nodes, tb.Nodes) {
			t.Fatalf("%s: the apps changed no node; the test would prove nothing", ta.Name)
		}
	}
	for _, k := range bare.Kernels {
		if kernels[k.Name] != k.PTX {
			t.Fatalf("kernel %s: the bundle with apps lacks it or holds other PTX", k.Name)
		}
	}
}

// Sites whose MI ops are alike (same templates, gates and app bits; only their buffers differ)
// share one kernel: a bundle holds no two kernels that differ only in name, and the six-app
// bundle's add+norm kernels, one per site, come down to a few.
func TestAlikeKernelsAreKeptOnce(t *testing.T) {
	b := Compile(t, SmallModel, smallSevenApps...)
	seen := map[string]string{}
	for _, k := range b.Kernels {
		body := k.Op + "\x00" + string(k.Attrs) + "\x00" + strings.ReplaceAll(k.PTX, k.Name, "")
		if other, ok := seen[body]; ok {
			t.Fatalf("kernels %s and %s differ only in name", other, k.Name)
		}
		seen[body] = k.Name
	}
	// One op at every layer: every add+norm site but the final norm is alike.
	b = Compile(t, SmallModel, `app: ablate
params: {d: {random: 9}}
ops:
  - write: {at: {layers: all, hook: resid_post}, kernel: project_out, args: {direction: d}}
`)
	sites, kernels := map[string]bool{}, map[string]bool{}
	for _, n := range b.Templates[0].Nodes {
		if strings.HasPrefix(n.Kernel, "add_norm") && strings.Contains(n.Kernel, "_mi_") {
			sites[n.Label] = true
			kernels[n.Kernel] = true
		}
	}
	if len(sites) < 2 || len(kernels) != 1 {
		t.Fatalf("%d add+norm sites with MI ops run %d distinct kernels; alike sites should share", len(sites), len(kernels))
	}
	t.Logf("%d add+norm sites with MI ops, %d kernels", len(sites), len(kernels))
}
