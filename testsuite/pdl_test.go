package testsuite

import (
	"strings"
	"testing"

	"xmix/bundle"
	"xmix/compile"
	"xmix/ptx"
)

// TestPDLBundle (xmixc build --pdl, the default): every generated kernel begins by releasing
// the next grid and then waiting for the one ahead (a decode attention kernel waits once it
// has read the control block), and is marked for early launch; an app's
// own PTX and the weight synthesiser (outside the graphs) are left as written; --pdl=false
// marks none. Every emulated run of TestEmulatedBundleMatchesReferenceOps but one is of such
// bundles.
func TestPDLBundle(t *testing.T) {
	custom := customScaleApp("1")
	// Without prefetching GEMVs (TestPrefetchBundle), early launch is the two instructions.
	plain := CompileWith(t, compile.Options{SerialLaunch: true}, SmallModel, custom)
	b := CompileWith(t, compile.Options{Prefetch: -1}, SmallModel, custom)
	if !b.Manifest.Build.PDL || plain.Manifest.Build.PDL {
		t.Fatalf("build info pdl: %v by default, %v with --pdl=false", b.Manifest.Build.PDL, plain.Manifest.Build.PDL)
	}
	if len(b.Kernels) != len(plain.Kernels) {
		t.Fatalf("%d kernels by default, %d with --pdl=false", len(b.Kernels), len(plain.Kernels))
	}
	early, kept, waitsItself := 0, 0, 0
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
		// A decode attention kernel waits itself, after reading the control block.
		waitsLater := k.Op == "attention" && len(body) > 2 && body[0].Op == bundle.PriorGridLaunch &&
			strings.Count(k.PTX, bundle.PriorGridWait+";") == 1
		switch k.Op {
		case "custom_ptx", "synth":
			if k.EarlyLaunch || starts || k.PTX != plain.Kernels[i].PTX {
				t.Errorf("kernel %s (%s) was rewritten for early launch", k.Name, k.Op)
			}
			kept++
		default:
			if !k.EarlyLaunch || !starts && !waitsLater {
				t.Errorf("kernel %s (%s): early launch %v, body starts %v", k.Name, k.Op, k.EarlyLaunch, body[:2])
			}
			if waitsLater && !starts {
				waitsItself++
			}
			// The two instructions are the whole difference.
			stripped := strings.Replace(k.PTX, "\t"+bundle.PriorGridLaunch+";\n", "", 1)
			stripped = strings.Replace(stripped, "\t"+bundle.PriorGridWait+";\n", "", 1)
			if stripped != plain.Kernels[i].PTX {
				t.Errorf("kernel %s: the PTX differs from --pdl=false's beyond the two instructions", k.Name)
			}
			early++
		}
	}
	if early < 10 || kept != 2 || waitsItself == 0 {
		t.Fatalf("%d kernels rewritten, %d kept (want the custom kernel and the synthesiser), %d waiting later (want the decode attention)", early, kept, waitsItself)
	}
}

// TestPrefetchBundle (xmixc build --prefetch): with early launch, every CUDA-core GEMV (the
// fused ones too) and every tensor-core GEMM reads weights before it waits for the grid ahead
// (the GEMVs as L2 prefetches; the tensor-core GEMMs their first step into registers,
// ld.global.nc, and L2 prefetches for the rest of the bytes asked for, none at this small
// model's rows), the build info says how much, and every other kernel is the one of a build
// without it; without early launch nothing prefetches, whatever was asked.
func TestPrefetchBundle(t *testing.T) {
	const bytes = 2048
	none := CompileWith(t, compile.Options{Prefetch: -1, Fuse: []string{"all"}}, SmallModel)
	b := CompileWith(t, compile.Options{Prefetch: bytes, Fuse: []string{"all"}}, SmallModel)
	serial := CompileWith(t, compile.Options{Prefetch: bytes, SerialLaunch: true}, SmallModel)
	if b.Manifest.Build.Prefetch != bytes || none.Manifest.Build.Prefetch != 0 || serial.Manifest.Build.Prefetch != 0 {
		t.Fatalf("build info prefetch: %d, %d without, %d with --pdl=false", b.Manifest.Build.Prefetch, none.Manifest.Build.Prefetch, serial.Manifest.Build.Prefetch)
	}
	if len(b.Kernels) != len(none.Kernels) {
		t.Fatalf("%d kernels, %d without prefetch", len(b.Kernels), len(none.Kernels))
	}
	gemvs := map[string]int{}
	for i, k := range b.Kernels {
		prefetches := strings.Contains(k.PTX, "prefetch.global.L2") || readsBeforeWait(t, k.PTX, "ld.global.nc.")
		// The CUDA-core GEMVs and the tensor-core GEMMs both read weights early.
		gemv := strings.HasPrefix(k.Name, "gemm_k") || k.Op == bundle.OpGemmTC
		switch {
		case gemv && !prefetches:
			t.Errorf("GEMV %s (%s) reads no weights before the wait", k.Name, k.Op)
		case !gemv && k.PTX != none.Kernels[i].PTX:
			t.Errorf("kernel %s (%s) differs from a build without prefetch", k.Name, k.Op)
		case gemv:
			m, err := ptx.Parse(k.PTX)
			if err != nil {
				t.Fatalf("kernel %s: %v", k.Name, err)
			}
			body := m.Kernels[0].Body
			if body[0].Op != bundle.PriorGridLaunch || strings.Count(k.PTX, bundle.PriorGridWait+";") != 1 {
				t.Errorf("GEMV %s: starts %s, %d waits", k.Name, body[0].Op, strings.Count(k.PTX, bundle.PriorGridWait+";"))
			}
			gemvs[k.Op]++
		}
	}
	for _, op := range []string{"gemm", "gemm_rope_kv", "gemm_gated", bundle.OpGemmTC} {
		if gemvs[op] == 0 {
			t.Errorf("no %s GEMV in the bundle (%v)", op, gemvs)
		}
	}
	for _, k := range serial.Kernels {
		if strings.Contains(k.PTX, "prefetch.global.L2") || strings.Contains(k.PTX, bundle.PriorGridWait) {
			t.Errorf("kernel %s of a --pdl=false build prefetches or waits", k.Name)
		}
	}
}

// readsBeforeWait says whether the kernel's PTX has an instruction whose op starts with op
// before it waits for the grid ahead.
func readsBeforeWait(t *testing.T, src, op string) bool {
	t.Helper()
	m, err := ptx.Parse(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, in := range m.Kernels[0].Body {
		switch {
		case in.Op == bundle.PriorGridWait:
			return false
		case strings.HasPrefix(in.Op, op):
			return true
		}
	}
	return false
}
