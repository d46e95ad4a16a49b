package testsuite

import (
	"reflect"
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
