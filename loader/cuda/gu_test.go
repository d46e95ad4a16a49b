package cuda

import (
	"testing"

	"xmix/bundle"
)

// TestGuBF16At: cuBLASLt's gate/up GEMM may write gu in bf16 where the plain gated
// activation of its y comes right after it and no other node reads gu; not with another
// reader of gu, an activation of other rows, a skipping activation, without cuBLASLt, or on
// a backend told to keep gu in f32. withGuBF16 points the activation's gu_bf16 at the GEMM's
// y and leaves the bundle's node as it was.
func TestGuBF16At(t *testing.T) {
	kernels := feedKernels()
	kernels["gate_up"] = bundle.Kernel{Name: "gate_up", Op: bundle.OpGemmTC, Attrs: []byte(`{"k":64,"n":256}`), Params: kernels["down"].Params}
	gateUp := bundle.Node{Label: "gate_up", Kernel: "gate_up", Args: []bundle.Slot{{Buffer: "x"}, {Buffer: "w"}, {Buffer: "gu"}, {Const: 8}}}
	newBackend := func() *Backend { return &Backend{kernels: kernels, lt: &cublasLt{}} }
	be := newBackend()
	act, down := feedAct(8), feedDown(8)
	if !be.guBF16At([]bundle.Node{gateUp, act, down}, 0) {
		t.Fatal("gate/up then its activation: want gu in bf16")
	}
	if be.guBF16At([]bundle.Node{gateUp, act, down}, 1) {
		t.Error("the activation itself: want no bf16 y")
	}
	reader := bundle.Node{Label: "mi", Kernel: "mi", Args: []bundle.Slot{{Buffer: "gu", Offset: 64}}}
	skipping := feedAct(8)
	skipping.SkipUnless = 1
	noLt, f32 := newBackend(), newBackend()
	noLt.lt = nil
	f32.guF32 = true
	for _, c := range []struct {
		name  string
		be    *Backend
		nodes []bundle.Node
	}{
		{"another reader of gu", be, []bundle.Node{gateUp, act, down, reader}},
		{"other rows", be, []bundle.Node{gateUp, feedAct(16), down}},
		{"a skipping activation", be, []bundle.Node{gateUp, skipping, down}},
		{"no cuBLASLt", noLt, []bundle.Node{gateUp, act, down}},
		{"gu kept in f32", f32, []bundle.Node{gateUp, act, down}},
	} {
		if c.be.guBF16At(c.nodes, 0) {
			t.Errorf("%s: want gu in f32", c.name)
		}
	}
	n := withGuBF16(act, 0x1000_0000)
	if n.Args[bundle.GatedGuBF16Arg] != (bundle.Slot{Const: 0x1000_0000}) || act.Args[bundle.GatedGuBF16Arg] != (bundle.Slot{}) || n.Args[0] != act.Args[0] {
		t.Errorf("withGuBF16: %+v (the bundle's node %+v)", n.Args, act.Args)
	}
}
