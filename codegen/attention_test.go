package codegen

import (
	"math"
	"math/rand/v2"
	"testing"

	"xmix/ptx"
)

func TestAttentionKernel(t *testing.T) {
	r := rand.New(rand.NewPCG(31, 32))
	for _, c := range []AttnConfig{
		{Heads: 4, KVHeads: 1, HeadDim: 32, BlockSize: 4, MaxBlocksPerSeq: 6, KVDtype: ptx.F32},
		{Heads: 2, KVHeads: 2, HeadDim: 64, BlockSize: 8, MaxBlocksPerSeq: 3, KVDtype: ptx.BF16},
		{Heads: 6, KVHeads: 2, HeadDim: 96, BlockSize: 2, MaxBlocksPerSeq: 4, KVDtype: ptx.F32},
	} {
		c.Scale = float32(1 / math.Sqrt(float64(c.HeadDim)))
		k, err := Attention("attn_test", c)
		if err != nil {
			t.Fatal(err)
		}
		rc := RopeConfig{Heads: c.Heads, KVHeads: c.KVHeads, HeadDim: c.HeadDim, BlockSize: c.BlockSize,
			MaxBlocksPerSeq: c.MaxBlocksPerSeq, KVDtype: c.KVDtype}
		kv := newKVFixture(r, rc, 2)
		kv.kcache.out, kv.vcache.out = 0, 0 // read only
		maxPos := uint32(c.BlockSize * c.MaxBlocksPerSeq)
		// A prefill chunk of sequence 1 (causal through pos) and decode rows of both.
		pos := []uint32{0, 1, 2, maxPos - 1, maxPos / 2}
		seq := []uint32{1, 1, 1, 0, 1}
		rows := len(pos)
		// Scores of order 1-3 so the softmax is neither flat nor one-hot.
		qkv := randF32(r, rows*(c.Heads+2*c.KVHeads)*c.HeadDim, 3)
		checkKernel(t, k, c.Launch(rows), []targ{
			{name: "qkv", f32: qkv}, {name: "pos", u32: pos}, {name: "seq", u32: seq},
			{name: "block_table", u32: kv.table}, kv.kcache, kv.vcache,
			{name: "z", out: rows * c.Heads * c.HeadDim},
		})
	}
}

func TestAttentionRejectsBadShapes(t *testing.T) {
	for _, c := range []AttnConfig{
		{Heads: 4, KVHeads: 1, HeadDim: 48, BlockSize: 4, MaxBlocksPerSeq: 1, KVDtype: ptx.F32, Scale: 1},
		{Heads: 4, KVHeads: 1, HeadDim: 288, BlockSize: 4, MaxBlocksPerSeq: 1, KVDtype: ptx.F32, Scale: 1},
		{Heads: 4, KVHeads: 1, HeadDim: 32, BlockSize: 4, MaxBlocksPerSeq: 1, KVDtype: ptx.F32},
	} {
		if _, err := Attention("a", c); err == nil {
			t.Errorf("%+v accepted", c)
		}
	}
}
