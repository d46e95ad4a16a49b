package codegen

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"testing"

	"xmix/bundle"
	"xmix/ops"
	"xmix/ptx"
	"xmix/ptx/emu"
)

// prefillShapes: GQA groups of 1, 4 and 8 (and 3: warps that are not a power of two), head
// dims 32 to 128, bf16 caches (the tensor cores read bf16).
var prefillShapes = []AttnConfig{
	{Heads: 2, KVHeads: 2, HeadDim: 64, BlockSize: 8, MaxBlocksPerSeq: 12, KVDtype: ptx.BF16},
	{Heads: 8, KVHeads: 2, HeadDim: 128, BlockSize: 16, MaxBlocksPerSeq: 6, KVDtype: ptx.BF16},
	{Heads: 8, KVHeads: 1, HeadDim: 32, BlockSize: 16, MaxBlocksPerSeq: 6, KVDtype: ptx.BF16},
	{Heads: 6, KVHeads: 2, HeadDim: 96, BlockSize: 4, MaxBlocksPerSeq: 24, KVDtype: ptx.BF16},
}

// TestAttentionPrefill: the tensor-core kernel computes the rows of a prefill step that share
// their sequence with a neighbour (chunks crossing KV blocks, chunks meeting inside a row
// tile, padding rows) and leaves the decode rows; with bf16 Q and P it is within bf16
// rounding of the f32 reference.
func TestAttentionPrefill(t *testing.T) {
	r := rand.New(rand.NewPCG(51, 52))
	for _, c := range prefillShapes {
		c = scaled(c)
		t.Run(fmt.Sprintf("h%d_kv%d_d%d", c.Heads, c.KVHeads, c.HeadDim), func(t *testing.T) {
			k := must(t)(AttentionPrefill("attn_prefill", c))
			pos, seq := prefillRows(c)
			z0 := randF32(r, len(pos)*c.Heads*c.HeadDim, 1)
			newAttnCall(t, r, k, c, c.LaunchPrefill(len(pos)), pos, seq, 0, z0).check(t, 1e-2)
		})
	}
}

// TestAttentionPrefillPlusSingles: the prefill template's two kernels on one z compute every
// row, as op "attention" over all rows does.
func TestAttentionPrefillPlusSingles(t *testing.T) {
	r := rand.New(rand.NewPCG(53, 54))
	c := scaled(prefillShapes[1])
	pos, seq := prefillRows(c)
	pre := must(t)(AttentionPrefill("p", c))
	sc := c
	sc.Singles = true
	single := must(t)(Attention("s", sc))
	a := newAttnCall(t, r, pre, c, c.LaunchPrefill(len(pos)), pos, seq, 0, nil)
	smod, err := ptx.Parse(single.PTX)
	if err != nil {
		t.Fatal(err)
	}
	sl := c.Launch(len(pos), 1)
	if err := emu.Run(smod, single.Name, emu.Launch{Grid: sl.Grid, Block: sl.Block}, a.mem, append(a.params[:7:7], 0)); err != nil {
		t.Fatal(err)
	}
	if err := emu.Run(a.mod, pre.Name, emu.Launch{Grid: a.launch.Grid, Block: a.launch.Block}, a.mem, a.params); err != nil {
		t.Fatal(err)
	}
	all := ops.AttnAttrs{KVAttrs: ops.KVAttrs{Heads: c.Heads, KVHeads: c.KVHeads, HeadDim: c.HeadDim, BlockSize: c.BlockSize,
		MaxBlocksPerSeq: c.MaxBlocksPerSeq, KVDtype: "bf16"}, Scale: c.Scale}
	ref := must(t)(&Kernel{Op: "attention", Attrs: ops.EncodeAttrs(all)}, nil)
	a.k = ref
	a.launch = sl
	a.args = append(a.args[:7:7], nullPtr(bundle.AttnZBF16))
	want := floats(a.reference(t), "f32")
	got := floats(a.mem.Bytes(a.params[6])[:4*a.args[6].out], "f32")
	if e := relL2(got, want); !(e <= 1e-2) {
		t.Fatalf("relative L2 error %.3g", e)
	}
}

// TestAttentionPrefillRowsIndependent: a chunk's rows give the same bits when the chunk sits
// at another offset of the step (other rows in its row tiles, other tile boundaries).
func TestAttentionPrefillRowsIndependent(t *testing.T) {
	checkPrefillRowsIndependent(t, scaled(prefillShapes[1]), 20, 55, 57)
}

// checkPrefillRowsIndependent runs a 40-row chunk of sequence 0 at positions first.. with five
// decode rows of sequences 1..5 before it, then after it, and wants the chunk's rows to give
// the same bits both times; the cache is drawn from seeds (cacheSeed, cacheSeed+1), the
// chunk's q/k/v from (qSeed, qSeed+1).
func checkPrefillRowsIndependent(t *testing.T, c AttnConfig, first uint32, cacheSeed, qSeed uint64) {
	t.Helper()
	k := must(t)(AttentionPrefill("p", c))
	const chunk, others = 40, 5
	qkvRow := (c.Heads + 2*c.KVHeads) * c.HeadDim
	qs := randF32(rand.New(rand.NewPCG(qSeed, qSeed+1)), chunk*qkvRow, 3)
	var outs [][]byte
	for _, lead := range []int{0, others} {
		// The same rows in another order: decode rows of sequences 1..5 before or after
		// sequence 0's chunk, so that the cache (drawn first, same sizes) is the same.
		var pos, seq []uint32
		decode := func() {
			for i := range others {
				pos, seq = append(pos, uint32(7+i)), append(seq, uint32(1+i))
			}
		}
		if lead > 0 {
			decode()
		}
		for p := range uint32(chunk) {
			pos, seq = append(pos, p+first), append(seq, 0)
		}
		if lead == 0 {
			decode()
		}
		a := newAttnCall(t, rand.New(rand.NewPCG(cacheSeed, cacheSeed+1)), k, c, c.LaunchPrefill(len(pos)), pos, seq, 0, nil)
		copy(a.mem.Bytes(a.params[0])[4*lead*qkvRow:], targ{f32: qs}.bytesOf())
		row := c.Heads * c.HeadDim * 4
		z := a.run(t)
		outs = append(outs, z[lead*row:(lead+chunk)*row])
	}
	if !bytes.Equal(outs[0], outs[1]) {
		t.Fatal("a chunk's attention changed with its offset in the step")
	}
}

func TestAttentionPrefillRejects(t *testing.T) {
	ok := AttnConfig{Heads: 4, KVHeads: 1, HeadDim: 64, BlockSize: 16, MaxBlocksPerSeq: 4, KVDtype: ptx.BF16, Scale: 0.125}
	must(t)(AttentionPrefill("p", ok))
	for _, c := range []func(*AttnConfig){
		func(c *AttnConfig) { c.KVDtype = ptx.F32 },
		func(c *AttnConfig) { c.HeadDim = 288 },
		func(c *AttnConfig) { c.Window = -1 },
		func(c *AttnConfig) { c.Scale = 0 },
	} {
		cfg := ok
		c(&cfg)
		if _, err := AttentionPrefill("p", cfg); err == nil {
			t.Errorf("%+v accepted", cfg)
		}
	}
}
