package testsuite

import (
	"strings"
	"testing"

	"xmix/bundle"
	"xmix/compile"
	"xmix/ptx"
)

// TestPDLBundle (xmixc build --pdl, the default): every generated kernel begins by releasing
// the next grid and then waiting for the one ahead, and is marked for early launch; an app's
// own PTX and the weight synthesiser (outside the graphs) are left as written; --pdl=false
// marks none. Every emulated run of TestEmulatedBundleMatchesReferenceOps but one is of such
// bundles.
func TestPDLBundle(t *testing.T) {
	custom := customScaleApp("1")
	plain := CompileWith(t, compile.Options{SerialLaunch: true}, SmallModel, custom)
	b := Compile(t, SmallModel, custom)
	if !b.Manifest.Build.PDL || plain.Manifest.Build.PDL {
		t.Fatalf("build info pdl: %v by default, %v with --pdl=false", b.Manifest.Build.PDL, plain.Manifest.Build.PDL)
	}
	if len(b.Kernels) != len(plain.Kernels) {
		t.Fatalf("%d kernels by default, %d with --pdl=false", len(b.Kernels), len(plain.Kernels))
	}
	early, kept := 0, 0
	for i, k := range b.Kernels {
		if plain.Kernels[i].EarlyLaunch {
			t.Errorf("kernel %s is marked for early launch in a build with --pdl=false", k.Name)
		}
		m, err := ptx.Parse(k.PTX)
		if err != nil {
			t.Fatalf("kernel %s: %v", k.Name, err)
		}
		body := m.Kernels[0].Body
		starts := len(body) > 2 && body[0].Op == bundle.PriorGridLaunch && body[1].Op == bundle.PriorGridWait
		switch k.Op {
		case "custom_ptx", "synth":
			if k.EarlyLaunch || starts || k.PTX != plain.Kernels[i].PTX {
				t.Errorf("kernel %s (%s) was rewritten for early launch", k.Name, k.Op)
			}
			kept++
		default:
			if !k.EarlyLaunch || !starts {
				t.Errorf("kernel %s (%s): early launch %v, body starts %v", k.Name, k.Op, k.EarlyLaunch, body[:2])
			}
			// The two instructions are the whole difference.
			head := "\t" + bundle.PriorGridLaunch + ";\n\t" + bundle.PriorGridWait + ";\n"
			if strings.Replace(k.PTX, head, "", 1) != plain.Kernels[i].PTX {
				t.Errorf("kernel %s: the PTX differs from --pdl=false's beyond the two instructions", k.Name)
			}
			early++
		}
	}
	if early < 10 || kept != 2 {
		t.Fatalf("%d kernels rewritten, %d kept (want the custom kernel and the synthesiser)", early, kept)
	}
}
