package codegen

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"xmix/ptx"
)

// The -update flag may be declared by another golden test of this package too; whoever runs
// first declares it, and everyone reads it through the flag set.
func init() {
	if flag.Lookup("update") == nil {
		flag.Bool("update", false, "rewrite the golden files under codegen/testdata")
	}
}

func updateGolden() bool {
	f := flag.Lookup("update")
	return f != nil && f.Value.String() == "true"
}

// checkGolden compares text with testdata/<name>.ptx, or rewrites the file under -update.
func checkGolden(t *testing.T, name, text string) {
	t.Helper()
	path := filepath.Join("testdata", name+".ptx")
	if updateGolden() {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test ./codegen -run Golden -update to create it)", err)
	}
	gl, wl := strings.Split(text, "\n"), strings.Split(string(want), "\n")
	for i := range max(len(gl), len(wl)) {
		var g, w string
		if i < len(gl) {
			g = gl[i]
		}
		if i < len(wl) {
			w = wl[i]
		}
		if g != w {
			t.Fatalf("%s line %d differs:\n got: %s\nwant: %s\n(if the change is intended, rerun with -update)", path, i+1, g, w)
		}
	}
}

// TestRowGolden pins the PTX of three row kernels: a residual add + norm with a gated
// steer and a probe, SiLU*up with a tail and a capture, and a standalone projection.
func TestRowGolden(t *testing.T) {
	sets := testOps(300)
	rn, err := RowNorm("golden_add_norm", RowConfig{Hidden: 300, Eps: 1e-5, WDtype: ptx.BF16, Load: "add",
		ResidOps: sets["steer"], NormOps: sets["probe"], Gather: true})
	if err != nil {
		t.Fatal(err)
	}
	checkGolden(t, "row_norm_add_bf16", rn.PTX)
	sm, err := SiluMul("golden_silu", SiluConfig{Inter: 300, Ops: sets["capture"]})
	if err != nil {
		t.Fatal(err)
	}
	checkGolden(t, "silu_mul_capture", sm.PTX)
	mk, err := MIKernel("golden_mi", MIKernelConfig{Width: 300, Stride: 1200, Offset: 600, Ops: sets["project"]})
	if err != nil {
		t.Fatal(err)
	}
	checkGolden(t, "mi_project_out", mk.PTX)
}
