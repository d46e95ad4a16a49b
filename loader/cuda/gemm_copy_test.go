package cuda

import (
	"testing"

	"xmix/bundle"
)

// TestReadAfter: the f32 activation a copy-engine GEMM reads as bf16 is dead unless a node
// after that GEMM names its buffer before the next gated activation writes it again.
func TestReadAfter(t *testing.T) {
	be := &Backend{kernels: map[string]bundle.Kernel{
		"act":  {Name: "act", Op: "silu_mul", Attrs: []byte(`{"inter":128,"chunked":true}`), Params: []bundle.Param{{Name: "gu", Type: "u64"}, {Name: "act", Type: "u64"}}},
		"down": {Name: "down", Op: bundle.OpGemmTC, Attrs: []byte(`{"k":128,"n":64}`)},
		"mi":   {Name: "mi", Op: "mi"},
	}}
	act := bundle.Node{Label: "act", Kernel: "act", Grid: [3]int{1, 8, 1}, Args: []bundle.Slot{{Buffer: "gu"}, {Buffer: "a"}}}
	down := bundle.Node{Label: "down", Kernel: "down", Args: []bundle.Slot{{Buffer: "a"}, {Buffer: "w"}, {Buffer: "d"}}}
	other := bundle.Node{Label: "norm", Kernel: "mi", Args: []bundle.Slot{{Buffer: "d"}}}
	reader := bundle.Node{Label: "mi", Kernel: "mi", Args: []bundle.Slot{{Buffer: "a", Offset: 64}}}
	s := bundle.Slot{Buffer: "a"}
	for _, c := range []struct {
		name  string
		nodes []bundle.Node
		want  bool
	}{
		{"the last layer's", []bundle.Node{act, down, other}, false},
		{"written again by the next layer's activation", []bundle.Node{act, down, other, act, reader, down}, false},
		{"read before the next activation", []bundle.Node{act, down, other, reader, act, down}, true},
		{"read by a second GEMM", []bundle.Node{act, down, down}, true},
	} {
		if got := be.readAfter(c.nodes, 1, s); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}

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
