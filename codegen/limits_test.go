package codegen

import (
	"testing"

	"xmix/frontend"
	"xmix/ptx"
)

// TestFrontendLimitsAreTheKernels holds the frontend's size limits, which refuse a spec at
// the value's position, to the bounds of the kernels they stand for: each limit compiles,
// one more does not.
func TestFrontendLimitsAreTheKernels(t *testing.T) {
	for _, c := range []struct {
		name  string
		limit int
		gen   func(n int) error
	}{
		{"hidden: a register-resident row", frontend.MaxRowWidth, func(n int) error { _, err := newRowEmitter("row", n); return err }},
		{"vocab: the sampler", frontend.MaxVocab, func(n int) error { _, err := Sample("sample", SampleConfig{Vocab: n}); return err }},
		{"head_dim: attention", frontend.MaxHeadDim, func(n int) error {
			_, err := Attention("attn", AttnConfig{Heads: 2, KVHeads: 1, HeadDim: n, BlockSize: 16, MaxBlocksPerSeq: 4, KVDtype: ptx.F32, Scale: 0.1})
			return err
		}},
	} {
		if err := c.gen(c.limit); err != nil {
			t.Errorf("%s: the limit %d does not compile: %v", c.name, c.limit, err)
		}
		// head_dim must also be a multiple of HeadDimStep: the next one past the limit.
		next := c.limit + 1
		if c.limit == frontend.MaxHeadDim {
			next = c.limit + frontend.HeadDimStep
		}
		if err := c.gen(next); err == nil {
			t.Errorf("%s: %d past the limit %d compiles; the frontend refuses what the kernels can do", c.name, next, c.limit)
		}
	}
}
