package codegen

import (
	"fmt"
	"math"

	"xmix/ops"
	"xmix/ptx"
)

// AttnConfig describes paged causal attention over the cache RopeKV fills. HeadDim must be a
// multiple of 32 (at most 256) and BlockSize a power of two.
type AttnConfig struct {
	Heads, KVHeads, HeadDim, BlockSize, MaxBlocksPerSeq int
	KVDtype                                             ptx.Type
	Scale                                               float32
}

// One block per (row, query head); its warps take positions round-robin, each keeping an
// online softmax (running max, running sum, running weighted v with HeadDim/32 values per
// lane), and the warps' partial results are merged through shared memory at the end.
// Each warp works on attnUnroll positions at a time so that their loads overlap; a decode
// row at long context is bound by that latency, not by bandwidth.
const (
	attnWarps  = 16
	attnUnroll = 4
)

// Launch is the grid for rows rows: (row, kv head, query head within the group), so the kernel
// finds the kv head without a division.
func (c AttnConfig) Launch(rows int) ops.Launch {
	return ops.Launch{Grid: [3]int{rows, c.KVHeads, max(1, c.Heads/max(1, c.KVHeads))}, Block: [3]int{32 * attnWarps, 1, 1}}
}

// Attention generates the kernel; parameters: qkv, pos, seq, block_table, kcache, vcache, z
// (all u64).
func Attention(name string, c AttnConfig) (*Kernel, error) {
	rc := RopeConfig{Heads: c.Heads, KVHeads: c.KVHeads, HeadDim: c.HeadDim, BlockSize: c.BlockSize,
		MaxBlocksPerSeq: c.MaxBlocksPerSeq, KVDtype: c.KVDtype}
	attrs, err := kvAttrs(rc)
	if err != nil {
		return nil, fmt.Errorf("attention %s: %w", name, err)
	}
	if c.HeadDim%32 != 0 || c.HeadDim > 256 {
		return nil, fmt.Errorf("attention %s: head dim %d: want a multiple of 32, at most 256", name, c.HeadDim)
	}
	if !(c.Scale > 0) || math.IsInf(float64(c.Scale), 0) {
		return nil, fmt.Errorf("attention %s: scale %g: want positive and finite", name, c.Scale)
	}
	e := newEmitter(name)
	qkv := e.param("qkv", ptx.U64)
	posP := e.param("pos", ptx.U64)
	seqP := e.param("seq", ptx.U64)
	table := e.param("block_table", ptx.U64)
	kc := e.param("kcache", ptx.U64)
	vc := e.param("vcache", ptx.U64)
	z := e.param("z", ptx.U64)

	d, per, kvs := c.HeadDim, c.HeadDim/32, c.KVDtype.Bytes()
	group := c.Heads / c.KVHeads
	row := e.special(ptx.CtaidX)
	kvh := e.special(ptx.CtaidY)
	h := e.Reg(ptx.U32)
	e.Emit("mad.lo.u32", h, kvh, ptx.Imm(int64(group)), e.special(ptx.CtaidZ))
	tid := e.special(ptx.TidX)
	lane := e.op3("and.b32", ptx.U32, tid, ptx.Imm(31))
	warp := e.op3("shr.u32", ptx.U32, tid, ptx.Imm(5))
	p := e.Reg(ptx.U32)
	e.Emit("ld.global.u32", p, ptx.Addr{Base: e.byteAddr(posP, row, 4)})
	s := e.Reg(ptx.U32)
	e.Emit("ld.global.u32", s, ptx.Addr{Base: e.byteAddr(seqP, row, 4)})

	// Lane l holds dims l, l+32, ...; q is pre-scaled so that scores come out in log2 units.
	qh := e.Reg(ptx.U32)
	e.Emit("mad.lo.u32", qh, row, ptx.Imm(int64(c.Heads+2*c.KVHeads)), h)
	qa := e.byteAddr(e.byteAddr(qkv, qh, 4*d), lane, 4)
	qs := e.f32(c.Scale * float32(math.Log2E))
	q := e.Regs(ptx.F32, per)
	for j := range q {
		e.Emit("ld.global.f32", q[j], ptx.Addr{Base: qa, Offset: int64(4 * 32 * j)})
		e.Emit("mul.f32", q[j], q[j], qs)
	}
	m := e.f32(float32(math.Inf(-1)))
	l := e.f32(0)
	acc := make([]ptx.Reg, per)
	for j := range acc {
		acc[j] = e.f32(0)
	}
	n := e.op3("add.u32", ptx.U32, p, ptx.Imm(1))
	last := e.op3("sub.u32", ptx.U32, n, ptx.Imm(1))
	negInf := ptx.F32Imm(float32(math.Inf(-1)))
	t := e.Reg(ptx.U32)
	e.forLoop(t, warp, n, ptx.Imm(attnWarps*attnUnroll), func() {
		// attnUnroll positions per step, their loads all issued before any reduction; a
		// position past the end reads the last one (valid memory) and scores -inf.
		var va [attnUnroll]ptx.Reg
		var score, valid [attnUnroll]ptx.Reg
		for u := range attnUnroll {
			tu := e.op3("add.u32", ptx.U32, t, ptx.Imm(int64(u*attnWarps)))
			valid[u] = e.cmp("lt", ptx.U32, tu, n)
			e.Emit("min.u32", tu, tu, last)
			slot := e.kvSlot(rc, table, s, tu)
			kvRow := e.Reg(ptx.U32)
			e.Emit("mad.lo.u32", kvRow, slot, ptx.Imm(int64(c.KVHeads)), kvh)
			elem := e.Reg(ptx.U32)
			e.Emit("mad.lo.u32", elem, kvRow, ptx.Imm(int64(d)), lane)
			ka := e.byteAddr(kc, elem, kvs)
			va[u] = e.byteAddr(vc, elem, kvs)
			score[u] = e.f32(0)
			for j := range q {
				k := e.loadAt(ptx.Addr{Base: ka, Offset: int64(32 * j * kvs)}, c.KVDtype)
				e.Emit("fma.rn.f32", score[u], q[j], k, score[u])
			}
		}
		mNew := e.Reg(ptx.F32)
		e.Emit("mov.f32", mNew, m)
		for u := range attnUnroll {
			e.warpReduce(score[u], "add")
			e.Emit("selp.f32", score[u], score[u], negInf, valid[u])
			e.Emit("max.f32", mNew, mNew, score[u])
		}
		alpha := e.exp2(e.op3("sub.f32", ptx.F32, m, mNew))
		e.Emit("mul.f32", l, l, alpha)
		for j := range acc {
			e.Emit("mul.f32", acc[j], acc[j], alpha)
		}
		for u := range attnUnroll {
			w := e.exp2(e.op3("sub.f32", ptx.F32, score[u], mNew))
			e.Emit("add.f32", l, l, w)
			for j := range acc {
				v := e.loadAt(ptx.Addr{Base: va[u], Offset: int64(32 * j * kvs)}, c.KVDtype)
				e.Emit("fma.rn.f32", acc[j], w, v, acc[j])
			}
		}
		e.Emit("mov.f32", m, mNew)
	})

	// Merge the warps: out = sum_w acc_w*2^(m_w-M) / sum_w l_w*2^(m_w-M), M the largest m_w.
	// A warp that saw no position has m_w = -inf and weighs 0; warp 0 always sees position 0.
	sm := e.DeclareShared("attn_m", ptx.F32, attnWarps)
	sl := e.DeclareShared("attn_l", ptx.F32, attnWarps)
	sacc := e.DeclareShared("attn_acc", ptx.F32, attnWarps*d)
	lane0 := e.cmp("eq", ptx.U32, lane, ptx.Imm(0))
	mAddr := e.sharedAddr(sm, warp, 4)
	e.EmitIf(lane0, false, "st.shared.f32", ptx.Addr{Base: mAddr}, m)
	e.EmitIf(lane0, false, "st.shared.f32", ptx.Addr{Base: e.sharedAddr(sl, warp, 4)}, l)
	accIdx := e.Reg(ptx.U32)
	e.Emit("mad.lo.u32", accIdx, warp, ptx.Imm(int64(d)), lane)
	accAddr := e.sharedAddr(sacc, accIdx, 4)
	for j := range acc {
		e.Emit("st.shared.f32", ptx.Addr{Base: accAddr, Offset: int64(4 * 32 * j)}, acc[j])
	}
	e.Emit("bar.sync", ptx.Imm(0))
	mw := e.Regs(ptx.F32, attnWarps)
	big := e.f32(float32(math.Inf(-1)))
	for w := range mw {
		e.Emit("ld.shared.f32", mw[w], ptx.Addr{Base: sm, Offset: int64(4 * w)})
		e.Emit("max.f32", big, big, mw[w])
	}
	sum := e.f32(0)
	scale := make([]ptx.Reg, attnWarps)
	for w := range mw {
		scale[w] = e.exp2(e.op3("sub.f32", ptx.F32, mw[w], big))
		lw := e.Reg(ptx.F32)
		e.Emit("ld.shared.f32", lw, ptx.Addr{Base: sl, Offset: int64(4 * w)})
		e.Emit("fma.rn.f32", sum, lw, scale[w], sum)
	}
	inv := e.Reg(ptx.F32)
	e.Emit("rcp.rn.f32", inv, sum)
	zrow := e.Reg(ptx.U32)
	e.Emit("mad.lo.u32", zrow, row, ptx.Imm(int64(c.Heads)), h)
	zbase := e.byteAddr(z, zrow, 4*d)
	di := e.Reg(ptx.U32)
	e.forLoop(di, tid, ptx.Imm(int64(d)), ptx.Imm(32*attnWarps), func() {
		a := e.sharedAddr(sacc, di, 4)
		o := e.f32(0)
		for w := range scale {
			x := e.Reg(ptx.F32)
			e.Emit("ld.shared.f32", x, ptx.Addr{Base: a, Offset: int64(4 * d * w)})
			e.Emit("fma.rn.f32", o, x, scale[w], o)
		}
		e.Emit("mul.f32", o, o, inv)
		e.Emit("st.global.f32", ptx.Addr{Base: e.byteAddr(zbase, di, 4)}, o)
	})
	return finish(e.Kernel, "attention", ops.AttnAttrs{KVAttrs: attrs, Scale: c.Scale})
}
