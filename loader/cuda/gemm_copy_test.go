package cuda

import (
	"testing"

	"xmix/bundle"
)

// TestGatedCopyFor: a gated pair takes the kernel of the fewest rows that takes its own, and
// none of twice its rows or more, unless that kernel is in the wide form.
func TestGatedCopyFor(t *testing.T) {
	kernels := []bundle.GemmCopy{{Kernel: "r32", Attrs: bundle.GemmCopyAttrs{Rows: 32}}, {Kernel: "r64", Attrs: bundle.GemmCopyAttrs{Rows: 64}}}
	wide := []bundle.GemmCopy{{Kernel: "w64", Attrs: bundle.GemmCopyAttrs{Rows: 64, Wide: 112}}, {Kernel: "w128", Attrs: bundle.GemmCopyAttrs{Rows: 128, Wide: 112}}}
	for _, c := range []struct {
		kernels []bundle.GemmCopy
		rows    int
		want    string
	}{{kernels, 8, ""}, {kernels, 16, ""}, {kernels, 17, "r32"}, {kernels, 32, "r32"}, {kernels, 33, "r64"}, {kernels, 64, "r64"}, {kernels, 65, ""},
		{wide, 8, "w64"}, {wide, 32, "w64"}, {wide, 65, "w128"}, {wide, 129, ""}} {
		got, ok := gatedCopyFor(c.kernels, c.rows)
		if ok != (c.want != "") || ok && got.Kernel != c.want {
			t.Errorf("%d rows: %q %v, want %q", c.rows, got.Kernel, ok, c.want)
		}
	}
}
