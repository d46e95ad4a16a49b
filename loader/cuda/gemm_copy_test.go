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

// TestPlainCopyFor: a plain GEMM takes the kernel of the fewest rows that takes its own, but a
// q/k/v projection whose kernels with rope_kv take its rows takes the plain kernel of that
// one's rows (its twin), as a layer whose rope_kv an app's op parts from the GEMM must.
func TestPlainCopyFor(t *testing.T) {
	plain := []bundle.GemmCopy{{Kernel: "r8", Attrs: bundle.GemmCopyAttrs{Rows: 8}}, {Kernel: "r16", Attrs: bundle.GemmCopyAttrs{Rows: 16}},
		{Kernel: "r32", Attrs: bundle.GemmCopyAttrs{Rows: 32}}, {Kernel: "r64", Attrs: bundle.GemmCopyAttrs{Rows: 64}}}
	rope := []bundle.GemmCopy{{Kernel: "r32_rope_kv", Attrs: bundle.GemmCopyAttrs{Rows: 32}}}
	for _, c := range []struct {
		rope []bundle.GemmCopy
		rows int
		want string
	}{{nil, 8, "r8"}, {nil, 9, "r16"}, {nil, 32, "r32"}, {nil, 64, "r64"}, {nil, 65, ""},
		{rope, 1, "r32"}, {rope, 8, "r32"}, {rope, 16, "r32"}, {rope, 32, "r32"}, {rope, 33, "r64"}, {rope, 65, ""}} {
		got, ok := plainCopyFor(plain, c.rope, c.rows)
		if ok != (c.want != "") || ok && got.Kernel != c.want {
			t.Errorf("rope kernels %d, %d rows: %q %v, want %q", len(c.rope), c.rows, got.Kernel, ok, c.want)
		}
	}
}
