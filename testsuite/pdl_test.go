package testsuite

import (
	"strings"
	"testing"

	"xmix/bundle"
	"xmix/compile"
	"xmix/ptx"
	"xmix/specs"
)

// TestPDLBundle (xmixc build --pdl): every generated kernel begins by releasing the next grid
// and then waiting for the one ahead, and is marked for early launch; an app's own PTX and the
// weight synthesiser (outside the graphs) are left as written. The emulated run of such a
// bundle is in TestEmulatedBundleMatchesReferenceOps.
func TestPDLBundle(t *testing.T) {
	custom := "app: cust\nkernels:\n  scale2:\n    entry: scale2\n" +
		"    signature: [x u64, stride u32, offset u32, width u32, ctl_mask u64, bit u32]\n" +
		"    ptx: |\n      " + strings.ReplaceAll(specs.ScaleTwoPTX, "\n", "\n      ") + "\n" +
		"ops:\n  - write: {at: {layers: [1], hook: resid_post}, kernel: custom:scale2}\n"
	plain := Compile(t, SmallModel, custom)
	b := CompileWith(t, compile.Options{PDL: true}, SmallModel, custom)
	if !b.Manifest.Build.PDL || plain.Manifest.Build.PDL {
		t.Fatalf("build info pdl: %v with --pdl, %v without", b.Manifest.Build.PDL, plain.Manifest.Build.PDL)
	}
	if len(b.Kernels) != len(plain.Kernels) {
		t.Fatalf("%d kernels with --pdl, %d without", len(b.Kernels), len(plain.Kernels))
	}
	early, kept := 0, 0
	for i, k := range b.Kernels {
		if plain.Kernels[i].EarlyLaunch {
			t.Errorf("kernel %s is marked for early launch in a build without --pdl", k.Name)
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
			early++
		}
	}
	if early < 10 || kept != 2 {
		t.Fatalf("%d kernels rewritten, %d kept (want the custom kernel and the synthesiser)", early, kept)
	}
}
