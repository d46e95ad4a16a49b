package codegen

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"xmix/ptx"
)

// Gemma 2's attention: soft-capped scores, a sliding window on every other layer, head dim
// 256. Each kernel (decode, split decode, singles, tensor-core prefill) is emulated against
// op "attention" with the same Softcap and Window.

// gemmaAttnShapes: Gemma-2-2B's group of 2 at head dim 256 (bf16 and f32 caches), and
// smaller shapes for the window's edges. Caps of 2.5 bend scores of the tests' order (1-3);
// 50 is Gemma's.
var gemmaAttnShapes = []AttnConfig{
	{Heads: 4, KVHeads: 2, HeadDim: 256, BlockSize: 16, MaxBlocksPerSeq: 6, KVDtype: ptx.BF16, Softcap: 50, Window: 40},
	{Heads: 4, KVHeads: 2, HeadDim: 256, BlockSize: 16, MaxBlocksPerSeq: 6, KVDtype: ptx.F32, Softcap: 2.5},
	{Heads: 8, KVHeads: 2, HeadDim: 128, BlockSize: 16, MaxBlocksPerSeq: 19, KVDtype: ptx.BF16, Softcap: 2.5, Window: 17},
	{Heads: 2, KVHeads: 2, HeadDim: 64, BlockSize: 8, MaxBlocksPerSeq: 40, KVDtype: ptx.BF16, Window: 5},
	{Heads: 6, KVHeads: 2, HeadDim: 96, BlockSize: 4, MaxBlocksPerSeq: 75, KVDtype: ptx.F32, Softcap: 2.5, Window: 1},
}

func shapeName(c AttnConfig) string {
	return fmt.Sprintf("h%d_kv%d_d%d_%s_cap%g_w%d", c.Heads, c.KVHeads, c.HeadDim, c.KVDtype, c.Softcap, c.Window)
}

// windowContexts are positions around the window's edge: inside it, at it, one past, far past.
func windowContexts(c AttnConfig) []uint32 {
	maxPos := uint32(c.BlockSize * c.MaxBlocksPerSeq)
	w := uint32(max(c.Window, 1))
	var pos []uint32
	for _, p := range []uint32{0, w - 1, w, w + 1, 2*w + 3, maxPos / 2, maxPos - 1} {
		if p < maxPos {
			pos = append(pos, p)
		}
	}
	return pos
}

func TestGemmaAttentionDecode(t *testing.T) {
	r := rand.New(rand.NewPCG(71, 72))
	for _, c := range gemmaAttnShapes {
		c = scaled(c)
		t.Run(shapeName(c), func(t *testing.T) {
			k := must(t)(Attention("attn_gemma", c))
			pos := windowContexts(c)
			seq := make([]uint32, len(pos))
			for i := range seq {
				seq[i] = uint32(i % 3)
			}
			newAttnCall(t, r, k, c, c.Launch(len(pos), 1), pos, seq, 0, nil).check(t, 1e-5)
		})
	}
}

// TestGemmaAttentionDecodeSplit: the window's span is what the splits cut (a chunk word
// sized for the whole context leaves splits past the span idle; one too small is raised).
func TestGemmaAttentionDecodeSplit(t *testing.T) {
	r := rand.New(rand.NewPCG(73, 74))
	for _, c := range gemmaAttnShapes {
		c = scaled(c)
		c.Split = true
		for _, sc := range []struct{ splits, chunk int }{{3, 16}, {5, 2}, {8, 1}} {
			t.Run(fmt.Sprintf("%s_s%d_c%d", shapeName(c), sc.splits, sc.chunk), func(t *testing.T) {
				k := must(t)(Attention("attn_gemma_split", c))
				pos := windowContexts(c)
				seq := make([]uint32, len(pos))
				for i := range seq {
					seq[i] = uint32(i % 2)
				}
				newAttnCall(t, r, k, c, c.Launch(len(pos), sc.splits), pos, seq, uint32(sc.chunk), nil).check(t, 1e-5)
			})
		}
	}
}

func TestGemmaAttentionSingles(t *testing.T) {
	r := rand.New(rand.NewPCG(75, 76))
	for _, c := range gemmaAttnShapes[:3] {
		c = scaled(c)
		c.Singles = true
		t.Run(shapeName(c), func(t *testing.T) {
			k := must(t)(Attention("attn_gemma_singles", c))
			pos, seq := prefillRows(c)
			z0 := randF32(r, len(pos)*c.Heads*c.HeadDim, 1)
			newAttnCall(t, r, k, c, c.Launch(len(pos), 1), pos, seq, 0, z0).check(t, 1e-5)
		})
	}
}

// gemmaPrefillShapes: head dim 256 (two warps per row tile and head, each half of O) with
// and without the cap and the window; the window at other head dims and group sizes,
// windows shorter than a tile and crossing tiles.
var gemmaPrefillShapes = []AttnConfig{
	{Heads: 4, KVHeads: 2, HeadDim: 256, BlockSize: 16, MaxBlocksPerSeq: 6, KVDtype: ptx.BF16},
	{Heads: 4, KVHeads: 2, HeadDim: 256, BlockSize: 16, MaxBlocksPerSeq: 6, KVDtype: ptx.BF16, Softcap: 2.5, Window: 40},
	{Heads: 8, KVHeads: 1, HeadDim: 256, BlockSize: 8, MaxBlocksPerSeq: 12, KVDtype: ptx.BF16, Softcap: 50, Window: 9},
	{Heads: 8, KVHeads: 2, HeadDim: 128, BlockSize: 16, MaxBlocksPerSeq: 6, KVDtype: ptx.BF16, Softcap: 2.5, Window: 17},
	{Heads: 6, KVHeads: 2, HeadDim: 96, BlockSize: 4, MaxBlocksPerSeq: 24, KVDtype: ptx.BF16, Window: 3},
}

func TestGemmaAttentionPrefill(t *testing.T) {
	r := rand.New(rand.NewPCG(77, 78))
	for _, c := range gemmaPrefillShapes {
		c = scaled(c)
		t.Run(shapeName(c), func(t *testing.T) {
			k := must(t)(AttentionPrefill("attn_gemma_prefill", c))
			pos, seq := prefillRows(c)
			z0 := randF32(r, len(pos)*c.Heads*c.HeadDim, 1)
			newAttnCall(t, r, k, c, c.LaunchPrefill(len(pos)), pos, seq, 0, z0).check(t, 1e-2)
		})
	}
}

// TestGemmaAttentionPrefillGeometry: head dim 256 doubles the warps of a block (each holds
// half of O), smaller head dims keep the geometry they had.
func TestGemmaAttentionPrefillGeometry(t *testing.T) {
	for _, c := range []struct {
		cfg          AttnConfig
		ds, warps    int
		grid0, block int
	}{
		{AttnConfig{Heads: 8, KVHeads: 4, HeadDim: 256, KVDtype: ptx.BF16}, 2, 8, 2, 256},  // Gemma-2-2B
		{AttnConfig{Heads: 16, KVHeads: 8, HeadDim: 256, KVDtype: ptx.BF16}, 2, 8, 2, 256}, // Gemma-2-9B
		{AttnConfig{Heads: 32, KVHeads: 8, HeadDim: 128, KVDtype: ptx.BF16}, 1, 4, 4, 128}, // Llama-3.1-8B
	} {
		g := c.cfg.prefillGeom()
		l := c.cfg.LaunchPrefill(64)
		if g.ds != c.ds || g.warps != c.warps || l.Grid[0] != c.grid0 || l.Block[0] != c.block || !c.cfg.PrefillOK() {
			t.Errorf("%+v: geometry %+v, launch %v", c.cfg, g, l)
		}
	}
}

// TestGemmaAttentionPrefillRowsIndependent: with the window and head dim 256 a chunk's rows
// give the same bits at another offset of the step (its segment starts streaming K/V at
// another tile when its first row moves).
func TestGemmaAttentionPrefillRowsIndependent(t *testing.T) {
	checkPrefillRowsIndependent(t, scaled(gemmaPrefillShapes[1]), 50, 81, 79)
}

func TestGemmaAttentionRejects(t *testing.T) {
	ok := AttnConfig{Heads: 4, KVHeads: 2, HeadDim: 256, BlockSize: 16, MaxBlocksPerSeq: 4, KVDtype: ptx.BF16, Scale: 0.0625, Softcap: 50, Window: 4096}
	must(t)(Attention("a", ok))
	must(t)(AttentionPrefill("a", ok))
	for _, edit := range []func(*AttnConfig){
		func(c *AttnConfig) { c.Window = -1 },
		func(c *AttnConfig) { c.Softcap = -1 },
	} {
		c := ok
		edit(&c)
		if _, err := Attention("a", c); err == nil {
			t.Errorf("%+v accepted", c)
		}
	}
}

// TestGemmaAttentionDecodeSplitWindowCap: a chunk word sized for a long context (512 per
// split) is capped at the window's own chunk (200 positions over 3 splits: 128), so the
// window spans two splits; contexts inside and past the window.
func TestGemmaAttentionDecodeSplitWindowCap(t *testing.T) {
	c := scaled(AttnConfig{Heads: 4, KVHeads: 2, HeadDim: 64, BlockSize: 16, MaxBlocksPerSeq: 20, KVDtype: ptx.BF16, Softcap: 50, Window: 200, Split: true})
	k := must(t)(Attention("attn_window_cap", c))
	pos := []uint32{150, 199, 200, 260, 319}
	seq := []uint32{0, 1, 2, 0, 1}
	a := newAttnCall(t, rand.New(rand.NewPCG(83, 84)), k, c, c.Launch(len(pos), 3), pos, seq, 512, nil)
	a.check(t, 1e-5)
	// Row 3 (context 261, window 200) ran in two splits: split 1 wrote its record's sum l.
	const row, splits = 3, 3
	rec := adCounterBytes(len(pos)*c.Heads/c.geom().hpb) + (row*c.Heads*splits+1)*(c.HeadDim+4)*4
	if l := math.Float32frombits(binary.LittleEndian.Uint32(a.ws[rec+4*(c.HeadDim+1):])); !(l > 0) {
		t.Fatalf("split 1 of row %d left no record (l = %v): the window's chunk was not capped", row, l)
	}
}
