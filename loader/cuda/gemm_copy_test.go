package cuda

import (
	"testing"

	"xmix/bundle"
)

// TestGatedCopyFor: a gated pair takes the kernel of the fewest rows that takes its own, and
// none of twice its rows or more.
func TestGatedCopyFor(t *testing.T) {
	kernels := []bundle.GemmCopy{{Kernel: "r32", Attrs: bundle.GemmCopyAttrs{Rows: 32}}, {Kernel: "r64", Attrs: bundle.GemmCopyAttrs{Rows: 64}}}
	for _, c := range []struct {
		rows int
		want string
	}{{8, ""}, {16, ""}, {17, "r32"}, {32, "r32"}, {33, "r64"}, {64, "r64"}, {65, ""}} {
		got, ok := gatedCopyFor(kernels, c.rows)
		if ok != (c.want != "") || ok && got.Kernel != c.want {
			t.Errorf("%d rows: %q %v, want %q", c.rows, got.Kernel, ok, c.want)
		}
	}
}
