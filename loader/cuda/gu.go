package cuda

import (
	"slices"

	"xmix/bundle"
)

// A gate/up GEMM that cuBLASLt serves writes gu, [rows, 2*Inter], which only the gated
// activation right after it reads (bundle.GatedPairAt). In f32 that is 4 bytes a value
// written and read again; at 128 rows of Llama-3.1-8B, 14.7 MB a layer each way, more than
// the activation's own output. So cuBLASLt writes gu in bf16 into the same buffer (its
// epilogue rounds the f32 sums to nearest even once) and the activation reads it there
// (bundle.GatedGuBF16): half the bytes both ways. The values are those of PyTorch's bf16
// matmul; the activation's arithmetic on them is unchanged. The bundle keeps an app's op at
// mlp.act out of the activation wherever its gate/up runs on tensor cores (codegen's
// activationThenMI), so the activation is the same plain kernel in every graph of a
// template, and a row without the app gets the bits of a bundle without it. A tuned pick
// (gemm_picks.go, timed with f32 y by xmix tune-gemm) serves the bf16 form too wherever
// cuBLASLt offers its configuration for the bf16 layout (on the H200 every one did: session 60).

// guBF16At says whether nodes[i], where cuBLASLt serves it, may write its y in bf16 for
// nodes[i+1]: a GEMM and the gated activation of its y, whose gu no other node reads
// (bundle.GatedPairAt), on a backend not told to keep gu in f32 (Options.GuF32).
func (be *Backend) guBF16At(nodes []bundle.Node, i int) bool {
	if be.lt == nil || be.guF32 {
		return false
	}
	_, _, ok, err := be.gatedPairs(nodes).At(i)
	return ok && err == nil
}

// withGuBF16 is activation node n reading its gu as bf16 at guB, where the GEMM ahead wrote
// it.
func withGuBF16(n bundle.Node, guB uintptr) bundle.Node {
	n.Args = slices.Clone(n.Args)
	n.Args[bundle.GatedGuBF16Arg] = bundle.Slot{Const: uint64(guB)}
	return n
}

// GuBF16Gemms is how many of the GEMM launches prepared write gu in bf16 for the gated
// activation after them.
func (be *Backend) GuBF16Gemms() int { return be.guBF16 }
