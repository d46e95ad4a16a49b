package codegen

import (
	"fmt"
	"math"

	"xmix/bundle"
	"xmix/ops"
	"xmix/ptx"
)

// Prefill attention on tensor cores (FlashAttention-2 style over the paged cache): the kernel
// for op "attention" rows "runs" (ops.AttnRowsRuns), the rows of a step that share their
// sequence with a neighbour, i.e. prompt chunks; the decode kernel with Singles takes the
// rest (decode rows mixed into the step).
//
// Work split. A block takes 16*rt rows and hb query heads of one kv head: grid
// (ceil(rows/(16*rt)), Heads/hb), hb*rt warps (hb the largest divisor of the GQA group up to
// 8, rt = 4/hb row tiles when hb < 4), warp w owning row tile w/hb and query head w%hb. The
// block's rows are cut into segments, maximal runs of consecutive rows of one sequence (every
// thread walks the same row table in shared memory, so the walk is uniform). For each
// segment the block streams that sequence's K and V from position 0 to the segment's last
// position in tiles of 32: the block loads a tile's K and V into shared memory once for all
// its heads and row tiles (the next tile's loads are in flight while the current one is
// multiplied), and every warp whose rows meet the segment computes
//
//	S = Q.K^T (mma m16n8k16, Q the A operand from registers, K the B operand: a cache row
//	    is the .col layout already), masked to position <= pos of each row,
//	online softmax per row (max and sum across the 4 lanes of a row's quad),
//	O += P.V (P re-packed from S's accumulators as the A operand, V transposed into shared
//	    memory as it is stored so that B's two positions per register are one word).
//
// Q (pre-scaled by Scale*log2 e) and P are rounded to bf16 for the tensor cores, K and V
// already are (bf16 cache): results are within bf16 rounding of the f32 reference, like any
// bf16 attention kernel. A row's bits depend only on its own q, pos and sequence: tiles past
// a row's position are masked to zero weight and leave its state exactly as it was, so rows
// give the same bits whatever shares their block.
//
// Head dims past 128 (Gemma 2's 256) split O: ds = ceil(HeadDim/128) warps share a (row
// tile, head), each computing S and the softmax state whole (the same bits in each) and the
// O columns of its HeadDim/ds dims, so that a lane holds at most 64 O registers. The K/V
// tiles in shared memory serve them all.
//
// Soft-capped scores (Softcap, Gemma 2) go through capTanh right after S = Q.K^T, Q scaled
// for it (AttnConfig.qScale); a sliding window (Window) masks positions before each row's
// pos-Window+1 as the causal mask masks those after pos, and the K/V stream of a segment
// starts at the tile of its first row's window.
//
// Shared memory per block: the K tile 32 x (HeadDim/2+4) words, the transposed V tile
// HeadDim x 20 words (pitches = 4 mod 32 words: the fragment loads of a warp hit 32 banks),
// 19 KB at HeadDim 128, 37 KB at 256. Registers per lane: Q HeadDim/4 words, O
// HeadDim/(2 ds) f32, S 16 f32.
//
// Bytes: K and V of each segment's positions are read once per block (from L2 for all but
// the first of the sequence's blocks); z written once.
const (
	apTile   = 32 // positions per K/V tile
	apPitchV = apTile/2 + 4
	// apMaxDim bounds the head dim (the K and V tiles in static shared memory: 37 KB at 256).
	apMaxDim = 256
	// apWarpDims bounds the O dims of one warp (HeadDim/(2 ds) registers per lane).
	apWarpDims = 128
)

type apGeom struct {
	hb, rt, warps int
	ds            int // warps sharing a (row tile, head), each with HeadDim/ds dims of O
	pitchK        int // words per K row in shared memory
}

func (c AttnConfig) prefillGeom() apGeom {
	group := c.Heads / c.KVHeads
	hb := 1
	for h := min(group, 8); h >= 1; h-- {
		if group%h == 0 {
			hb = h
			break
		}
	}
	rt := max(1, 4/hb)
	ds := (c.HeadDim + apWarpDims - 1) / apWarpDims
	return apGeom{hb: hb, rt: rt, ds: ds, warps: hb * rt * ds, pitchK: c.HeadDim/2 + 4}
}

// LaunchPrefill is AttentionPrefill's grid for rows rows.
func (c AttnConfig) LaunchPrefill(rows int) ops.Launch {
	g := c.prefillGeom()
	br := 16 * g.rt
	return ops.Launch{Grid: [3]int{(rows + br - 1) / br, c.Heads / g.hb, 1}, Block: [3]int{32 * g.warps, 1, 1}}
}

// PrefillOK reports whether AttentionPrefill serves c (a bf16 cache, head dim at most 256).
func (c AttnConfig) PrefillOK() bool { return c.KVDtype == ptx.BF16 && c.HeadDim <= apMaxDim }

// AttentionPrefill generates the tensor-core prefill kernel; parameters: qkv, pos, seq,
// block_table, kcache, vcache, z (u64), rows (u32: the call's row count, since the grid
// counts blocks of rows). Launch it with c.LaunchPrefill(rows).
func AttentionPrefill(name string, c AttnConfig) (*Kernel, error) {
	attrs, err := checkAttn(c)
	if err != nil {
		return nil, fmt.Errorf("attention_prefill %s: %w", name, err)
	}
	if !c.PrefillOK() || c.HeadDim/c.prefillGeom().ds%8 != 0 {
		return nil, fmt.Errorf("attention_prefill %s: %s cache, head dim %d: the tensor-core kernel needs a bf16 cache and head dim at most %d",
			name, c.KVDtype, c.HeadDim, apMaxDim)
	}
	g := &apGen{emitter: newEmitter(name), c: c, geo: c.prefillGeom()}
	g.MaxNTid = 32 * g.geo.warps
	g.emit()
	return finish(g.Kernel, bundle.OpAttention, c.attnAttrs(attrs, ops.AttnRowsRuns))
}

type apGen struct {
	emitter
	c   AttnConfig
	geo apGeom

	qkv, posP, seqP, table, kc, vc, z, rows ptx.Reg
	tid, lane, warp, g4, t4                 ptx.Reg
	r0, kvh, hq, tr0, dp                    ptx.Reg      // dp: the warp's part of O (geo.ds > 1)
	qa                                      [][4]ptx.Reg // [k step]: the A fragment of Q
	sSeq, sPos, sRun, sK, sV                ptx.Sym
}

func (g *apGen) emit() {
	c, geo := g.c, g.geo
	g.qkv = g.param("qkv", ptx.U64)
	g.posP = g.param("pos", ptx.U64)
	g.seqP = g.param("seq", ptx.U64)
	g.table = g.param("block_table", ptx.U64)
	g.kc = g.param("kcache", ptx.U64)
	g.vc = g.param("vcache", ptx.U64)
	g.z = g.param("z", ptx.U64)
	g.rows = g.param("rows", ptx.U32)
	br := 16 * geo.rt
	g.sSeq = g.DeclareShared("ap_seq", ptx.U32, br)
	g.sPos = g.DeclareShared("ap_pos", ptx.U32, br)
	g.sRun = g.DeclareShared("ap_run", ptx.U32, br)
	g.sK = g.DeclareShared("ap_k", ptx.U32, apTile*geo.pitchK)
	g.sV = g.DeclareShared("ap_v", ptx.U32, c.HeadDim*apPitchV)

	g.tid = g.special(ptx.TidX)
	g.lane = g.op3("and.b32", ptx.U32, g.tid, ptx.Imm(31))
	g.warp = g.op3("shr.u32", ptx.U32, g.tid, ptx.Imm(5))
	g.g4 = g.op3("shr.u32", ptx.U32, g.lane, ptx.Imm(2))
	g.t4 = g.op3("and.b32", ptx.U32, g.lane, ptx.Imm(3))
	g.r0 = g.op3("mul.lo.u32", ptx.U32, g.special(ptx.CtaidX), ptx.Imm(int64(br)))
	head0 := g.op3("mul.lo.u32", ptx.U32, g.special(ptx.CtaidY), ptx.Imm(int64(geo.hb)))
	g.kvh = g.op3("div.u32", ptx.U32, head0, ptx.Imm(int64(c.Heads/c.KVHeads)))
	w := g.warp // warp w: O part w%ds, then head and row tile of w/ds
	if geo.ds > 1 {
		g.dp = g.op3("rem.u32", ptx.U32, g.warp, ptx.Imm(int64(geo.ds)))
		w = g.op3("div.u32", ptx.U32, g.warp, ptx.Imm(int64(geo.ds)))
	}
	g.hq = g.op3("add.u32", ptx.U32, head0, g.op3("rem.u32", ptx.U32, w, ptx.Imm(int64(geo.hb))))
	g.tr0 = g.op3("div.u32", ptx.U32, w, ptx.Imm(int64(geo.hb)))
	g.Emit("shl.b32", g.tr0, g.tr0, ptx.Imm(4))

	g.rowTable(br)
	g.loadQ()
	g.segments(br)
}

// rowTable fills the block's row table: each row's sequence, position and whether it shares
// its sequence with a neighbour (ops.AttnRowSingle); rows past the call are not runs.
func (g *apGen) rowTable(br int) {
	g.when(g.cmp("lt", ptx.U32, g.tid, ptx.Imm(int64(br))), false, func() {
		r := g.op3("add.u32", ptx.U32, g.r0, g.tid)
		s, p, run := g.imm32(0), g.imm32(0), g.imm32(0)
		g.when(g.cmp("lt", ptx.U32, r, g.rows), false, func() {
			g.Emit("ld.global.u32", s, ptx.Addr{Base: g.byteAddr(g.seqP, r, 4)})
			g.Emit("ld.global.u32", p, ptx.Addr{Base: g.byteAddr(g.posP, r, 4)})
			for _, d := range []int64{-1, 1} {
				nb := g.op3("add.u32", ptx.U32, r, ptx.Imm(d))
				g.when(g.cmp("lt", ptx.U32, nb, g.rows), false, func() { // row -1 wraps past rows
					ns := loadU32(g.emitter, ptx.Addr{Base: g.byteAddr(g.seqP, nb, 4)})
					g.EmitIf(g.cmp("eq", ptx.U32, ns, s), false, "mov.u32", run, ptx.Imm(1))
				})
			}
		})
		for _, v := range []struct {
			arr ptx.Sym
			r   ptx.Reg
		}{{g.sSeq, s}, {g.sPos, p}, {g.sRun, run}} {
			g.Emit("st.shared.u32", ptx.Addr{Base: g.sharedAddr(v.arr, g.tid, 4)}, v.r)
		}
	})
	g.Emit("bar.sync", ptx.Imm(0))
}

// loadQ loads the warp's A fragments of Q for rows g and g+8 of its row tile (rows past the
// call read the last row), scaled to log2 units and rounded to bf16 pairs.
func (g *apGen) loadQ() {
	c := g.c
	d := c.HeadDim
	last := g.op3("sub.u32", ptx.U32, g.rows, ptx.Imm(1))
	qs := ptx.F32Imm(c.qScale())
	var base [2]ptx.Reg
	for i := range base {
		r := g.op3("add.u32", ptx.U32, g.r0, g.tr0)
		g.Emit("add.u32", r, r, g.g4)
		g.Emit("add.u32", r, r, ptx.Imm(int64(8*i)))
		g.Emit("min.u32", r, r, last)
		qr := g.Reg(ptx.U32)
		g.Emit("mad.lo.u32", qr, r, ptx.Imm(int64(c.Heads+2*c.KVHeads)), g.hq)
		base[i] = g.byteAddr(g.byteAddr(g.qkv, qr, 4*d), g.op3("shl.b32", ptx.U32, g.t4, ptx.Imm(1)), 4)
	}
	x := g.Regs(ptx.F32, 2)
	g.qa = make([][4]ptx.Reg, d/16)
	for kk := range g.qa {
		for j := range 4 { // a0a1: row g, k 2t; a2a3: row g+8; a4a5, a6a7: k 2t+8
			g.Emit("ld.global.v2.f32", ptx.Vec(x), ptx.Addr{Base: base[j&1], Offset: int64(4 * (16*kk + 8*(j>>1)))})
			g.Emit("mul.f32", x[0], x[0], qs)
			g.Emit("mul.f32", x[1], x[1], qs)
			g.qa[kk][j] = g.Reg(ptx.B32)
			g.Emit("cvt.rn.bf16x2.f32", g.qa[kk][j], x[1], x[0])
		}
	}
}

// segments walks the block's row table and runs one pass per segment.
func (g *apGen) segments(br int) {
	i := g.imm32(0)
	v := g.Reg(ptx.U32)
	lo, sq, maxp := g.Reg(ptx.U32), g.Reg(ptx.U32), g.Reg(ptx.U32)
	var minp ptx.Reg // the segment's lowest position (sliding window only)
	if g.c.Window > 0 {
		minp = g.Reg(ptx.U32)
	}
	ld := func(arr ptx.Sym, idx ptx.Reg) {
		g.Emit("ld.shared.u32", v, ptx.Addr{Base: g.sharedAddr(arr, idx, 4)})
	}
	top, done := g.NewLabel("segment"), g.NewLabel("segments_done")
	ext, extDone := g.NewLabel("extend"), g.NewLabel("extend_done")
	g.Label(top)
	g.EmitIf(g.cmp("ge", ptx.U32, i, ptx.Imm(int64(br))), false, "bra", ptx.Sym(done))
	ld(g.sRun, i)
	g.Emit("add.u32", i, i, ptx.Imm(1))
	g.EmitIf(g.cmp("eq", ptx.U32, v, ptx.Imm(0)), false, "bra", ptx.Sym(top))
	g.Emit("sub.u32", lo, i, ptx.Imm(1))
	ld(g.sSeq, lo)
	g.Emit("mov.u32", sq, v)
	ld(g.sPos, lo)
	g.Emit("mov.u32", maxp, v)
	if g.c.Window > 0 {
		g.Emit("mov.u32", minp, v)
	}
	g.Label(ext)
	g.EmitIf(g.cmp("ge", ptx.U32, i, ptx.Imm(int64(br))), false, "bra", ptx.Sym(extDone))
	ld(g.sRun, i)
	g.EmitIf(g.cmp("eq", ptx.U32, v, ptx.Imm(0)), false, "bra", ptx.Sym(extDone))
	ld(g.sSeq, i)
	g.EmitIf(g.cmp("ne", ptx.U32, v, sq), false, "bra", ptx.Sym(extDone))
	ld(g.sPos, i)
	g.Emit("max.u32", maxp, maxp, v)
	if g.c.Window > 0 {
		g.Emit("min.u32", minp, minp, v)
	}
	g.Emit("add.u32", i, i, ptx.Imm(1))
	g.Emit("bra", ptx.Sym(ext))
	g.Label(extDone)
	g.pass(lo, i, sq, maxp, minp)
	g.Emit("bra", ptx.Sym(top))
	g.Label(done)
}

// pass computes the rows [lo, hi) of the block's row table, all of sequence sq, over
// positions 0..maxp (with a window, from the tile of minp's window start).
func (g *apGen) pass(lo, hi, sq, maxp, minp ptx.Reg) {
	c := g.c
	d := c.HeadDim
	// The warp takes part when its row tile meets [lo, hi); its lanes' rows g and g+8.
	active := g.cmp("lt", ptx.U32, g.tr0, hi)
	tileEnd := g.op3("add.u32", ptx.U32, g.tr0, ptx.Imm(16))
	g.Emit("setp.gt.and.u32", active, tileEnd, lo, active)
	var in [2]ptx.Reg
	var lim, first [2]ptx.Reg // positions first[i] <= p < lim[i] (first only with a window)
	for i := range in {
		a := g.op3("add.u32", ptx.U32, g.tr0, g.g4)
		g.Emit("add.u32", a, a, ptx.Imm(int64(8*i)))
		in[i] = g.cmp("ge", ptx.U32, a, lo)
		g.Emit("setp.lt.and.u32", in[i], a, hi, in[i])
		lim[i] = g.imm32(0)
		g.when(in[i], false, func() {
			g.Emit("ld.shared.u32", lim[i], ptx.Addr{Base: g.sharedAddr(g.sPos, a, 4)})
			g.Emit("add.u32", lim[i], lim[i], ptx.Imm(1))
		})
		if c.Window > 0 {
			first[i] = g.windowStart(c, lim[i])
		}
	}
	o := make([][]ptx.Reg, d/g.geo.ds/8)
	for j := range o {
		o[j] = g.Regs(ptx.F32, 4)
		for _, r := range o[j] {
			g.Emit("mov.f32", r, ptx.F32Imm(0))
		}
	}
	m := [2]ptx.Reg{g.f32(float32(math.Inf(-1))), g.f32(float32(math.Inf(-1)))}
	l := [2]ptx.Reg{g.f32(0), g.f32(0)}
	nt := g.op3("add.u32", ptx.U32, maxp, ptx.Imm(apTile))
	g.Emit("shr.u32", nt, nt, ptx.Imm(5))
	pf := g.newPrefetch()
	var kt0 ptx.Operand = ptx.Imm(0) // the first tile: 0, or that of minp's window start
	if c.Window > 0 {
		t0 := g.op3("add.u32", ptx.U32, minp, ptx.Imm(1))
		t0 = g.windowStart(c, t0)
		g.Emit("shr.u32", t0, t0, ptx.Imm(5))
		pf.load(g, g.op3("shl.b32", ptx.U32, t0, ptx.Imm(5)), sq, maxp)
		kt0 = t0
	} else {
		pf.load(g, g.imm32(0), sq, maxp)
	}
	kt := g.Reg(ptx.U32)
	g.forLoop(kt, kt0, nt, ptx.Imm(1), func() {
		g.Emit("bar.sync", ptx.Imm(0)) // every warp is done with the previous tile
		pf.store(g)
		g.Emit("bar.sync", ptx.Imm(0))
		next := g.op3("add.u32", ptx.U32, kt, ptx.Imm(1))
		g.when(g.cmp("lt", ptx.U32, next, nt), false, func() {
			pf.load(g, g.op3("shl.b32", ptx.U32, next, ptx.Imm(5)), sq, maxp)
		})
		g.when(active, false, func() { g.tile(kt, lim, first, m, l, o) })
	})
	g.when(active, false, func() { g.writeRows(in, l, o) })
}

// apPrefetch is one thread's share of a K/V tile in flight: K chunks (16 bytes of one
// position) and V pairs (the same 16 bytes of two neighbouring positions).
type apPrefetch struct {
	k, v   [][]ptx.Reg
	kn, vn int // chunks of the tile, pairs of the tile
}

func (g *apGen) newPrefetch() *apPrefetch {
	d, threads := g.c.HeadDim, 32*g.geo.warps
	pf := &apPrefetch{kn: apTile * d / 8, vn: apTile / 2 * d / 8}
	for range (pf.kn + threads - 1) / threads {
		pf.k = append(pf.k, g.Regs(ptx.B32, 4))
	}
	for range (pf.vn + threads - 1) / threads {
		pf.v = append(pf.v, g.Regs(ptx.B32, 8))
	}
	return pf
}

// kvAddr is the byte address of dims [8ch, 8ch+8) of tile position tp (clamped to maxp: past
// it, valid memory whose scores are masked) in cache base.
func (g *apGen) kvAddr(base, pb, tp, ch, sq, maxp ptx.Reg) ptx.Reg {
	c := g.c
	bs, _ := log2(c.BlockSize)
	p := g.op3("add.u32", ptx.U32, pb, tp)
	g.Emit("min.u32", p, p, maxp)
	blk := g.op3("shr.u32", ptx.U32, p, ptx.Imm(int64(bs)))
	ti := g.Reg(ptx.U32)
	g.Emit("mad.lo.u32", ti, sq, ptx.Imm(int64(c.MaxBlocksPerSeq)), blk)
	page := loadU32(g.emitter, ptx.Addr{Base: g.byteAddr(g.table, ti, 4)})
	slot := g.op3("and.b32", ptx.U32, p, ptx.Imm(int64(c.BlockSize-1)))
	g.Emit("mad.lo.u32", slot, page, ptx.Imm(int64(c.BlockSize)), slot)
	kvRow := g.Reg(ptx.U32)
	g.Emit("mad.lo.u32", kvRow, slot, ptx.Imm(int64(c.KVHeads)), g.kvh)
	elem := g.Reg(ptx.U32)
	g.Emit("mad.lo.u32", elem, kvRow, ptx.Imm(int64(c.HeadDim)), g.op3("shl.b32", ptx.U32, ch, ptx.Imm(3)))
	return g.byteAddr(base, elem, 2)
}

// load issues the thread's loads of the tile at position pb.
func (pf *apPrefetch) load(g *apGen, pb, sq, maxp ptx.Reg) {
	threads := 32 * g.geo.warps
	cpp := g.c.HeadDim / 8 // chunks per position
	for i, w := range pf.k {
		idx := g.op3("add.u32", ptx.U32, g.tid, ptx.Imm(int64(i*threads)))
		in := g.cmp("lt", ptx.U32, idx, ptx.Imm(int64(pf.kn)))
		tp := g.op3("div.u32", ptx.U32, idx, ptx.Imm(int64(cpp)))
		ch := g.op3("rem.u32", ptx.U32, idx, ptx.Imm(int64(cpp)))
		g.when(in, false, func() {
			g.Emit("ld.global.v4.b32", ptx.Vec(w), ptx.Addr{Base: g.kvAddr(g.kc, pb, tp, ch, sq, maxp)})
		})
	}
	for i, w := range pf.v {
		idx := g.op3("add.u32", ptx.U32, g.tid, ptx.Imm(int64(i*threads)))
		in := g.cmp("lt", ptx.U32, idx, ptx.Imm(int64(pf.vn)))
		pair := g.op3("rem.u32", ptx.U32, idx, ptx.Imm(apTile/2))
		ch := g.op3("div.u32", ptx.U32, idx, ptx.Imm(apTile/2))
		g.when(in, false, func() {
			tp := g.op3("shl.b32", ptx.U32, pair, ptx.Imm(1))
			g.Emit("ld.global.v4.b32", ptx.Vec(w[:4]), ptx.Addr{Base: g.kvAddr(g.vc, pb, tp, ch, sq, maxp)})
			g.Emit("add.u32", tp, tp, ptx.Imm(1))
			g.Emit("ld.global.v4.b32", ptx.Vec(w[4:]), ptx.Addr{Base: g.kvAddr(g.vc, pb, tp, ch, sq, maxp)})
		})
	}
}

// store writes the tile in flight to shared memory: K rows as they are, V transposed (word
// (dim, pair) holds the dim of positions 2*pair and 2*pair+1, the even one in the low half).
func (pf *apPrefetch) store(g *apGen) {
	threads := 32 * g.geo.warps
	cpp := g.c.HeadDim / 8
	for i, w := range pf.k {
		idx := g.op3("add.u32", ptx.U32, g.tid, ptx.Imm(int64(i*threads)))
		in := g.cmp("lt", ptx.U32, idx, ptx.Imm(int64(pf.kn)))
		tp := g.op3("div.u32", ptx.U32, idx, ptx.Imm(int64(cpp)))
		ch := g.op3("rem.u32", ptx.U32, idx, ptx.Imm(int64(cpp)))
		wi := g.op3("shl.b32", ptx.U32, ch, ptx.Imm(2))
		g.Emit("mad.lo.u32", wi, tp, ptx.Imm(int64(g.geo.pitchK)), wi)
		g.when(in, false, func() {
			g.Emit("st.shared.v4.b32", ptx.Addr{Base: g.sharedAddr(g.sK, wi, 4)}, ptx.Vec(w))
		})
	}
	lo, hi, t := g.Reg(ptx.B32), g.Reg(ptx.B32), g.Reg(ptx.B32)
	for i, w := range pf.v {
		idx := g.op3("add.u32", ptx.U32, g.tid, ptx.Imm(int64(i*threads)))
		in := g.cmp("lt", ptx.U32, idx, ptx.Imm(int64(pf.vn)))
		pair := g.op3("rem.u32", ptx.U32, idx, ptx.Imm(apTile/2))
		ch := g.op3("div.u32", ptx.U32, idx, ptx.Imm(apTile/2))
		dim := g.op3("shl.b32", ptx.U32, ch, ptx.Imm(3))
		wi := g.Reg(ptx.U32)
		g.Emit("mad.lo.u32", wi, dim, ptx.Imm(apPitchV), pair)
		a := g.sharedAddr(g.sV, wi, 4)
		g.when(in, false, func() {
			for j := range 4 {
				even, odd := w[j], w[4+j]
				g.Emit("and.b32", lo, even, ptx.Imm(0xFFFF))
				g.Emit("shl.b32", t, odd, ptx.Imm(16))
				g.Emit("or.b32", lo, lo, t)
				g.Emit("shr.u32", hi, even, ptx.Imm(16))
				g.Emit("and.b32", t, odd, ptx.Imm(-65536))
				g.Emit("or.b32", hi, hi, t)
				g.Emit("st.shared.b32", ptx.Addr{Base: a, Offset: int64(4 * 2 * j * apPitchV)}, lo)
				g.Emit("st.shared.b32", ptx.Addr{Base: a, Offset: int64(4 * (2*j + 1) * apPitchV)}, hi)
			}
		})
	}
}

// tile multiplies the warp's rows with the K/V tile kt in shared memory and updates their
// softmax state (m, l per row g and g+8; l is the lane's partial sum) and O.
func (g *apGen) tile(kt ptx.Reg, lim, first [2]ptx.Reg, m, l [2]ptx.Reg, o [][]ptx.Reg) {
	c, geo := g.c, g.geo
	d := c.HeadDim
	// S = Q.K^T over the tile's 4 n-tiles of 8 positions: B word (k 2t.., n g) is K row
	// 8j+g, word 8kk+t; the second register 4 words on.
	kw := g.Reg(ptx.U32)
	g.Emit("mad.lo.u32", kw, g.g4, ptx.Imm(int64(geo.pitchK)), g.t4)
	ka := g.sharedAddr(g.sK, kw, 4)
	s := make([][]ptx.Reg, apTile/8)
	b := g.Regs(ptx.B32, 2)
	for j := range s {
		s[j] = g.Regs(ptx.F32, 4)
		for _, r := range s[j] {
			g.Emit("mov.f32", r, ptx.F32Imm(0))
		}
		for kk := range d / 16 {
			off := int64(4 * (8*j*geo.pitchK + 8*kk))
			g.Emit("ld.shared.b32", b[0], ptx.Addr{Base: ka, Offset: off})
			g.Emit("ld.shared.b32", b[1], ptx.Addr{Base: ka, Offset: off + 16})
			g.Emit(mmaOp, ptx.Vec(s[j]), ptx.Vec(g.qa[kk][:]), ptx.Vec(b), ptx.Vec(s[j]))
		}
	}
	for _, sj := range s {
		g.softcapScores(c, sj...)
	}
	// Mask: element i of n-tile j is row g + 8*(i>>1), position kt*32 + 8j + 2t + (i&1).
	col := g.op3("shl.b32", ptx.U32, kt, ptx.Imm(5))
	g.Emit("add.u32", col, col, g.op3("shl.b32", ptx.U32, g.t4, ptx.Imm(1)))
	negInf := ptx.F32Imm(float32(math.Inf(-1)))
	p := g.Reg(ptx.U32)
	var mx [2]ptx.Reg
	for r := range mx {
		mx[r] = g.f32(float32(math.Inf(-1)))
	}
	for j := range s {
		for i, x := range s[j] {
			g.Emit("add.u32", p, col, ptx.Imm(int64(8*j+i&1)))
			keep := g.cmp("lt", ptx.U32, p, lim[i>>1])
			if c.Window > 0 {
				g.Emit("setp.ge.and.u32", keep, p, first[i>>1], keep)
			}
			g.Emit("selp.f32", x, x, negInf, keep)
			g.Emit("max.f32", mx[i>>1], mx[i>>1], x)
		}
	}
	tmp := g.Reg(ptx.F32)
	var alpha, ms [2]ptx.Reg
	for r := range mx {
		for _, off := range []int{1, 2} {
			g.Emit("shfl.sync.bfly.b32", tmp, mx[r], ptx.Imm(int64(off)), ptx.Imm(0x1f), ptx.Imm(-1))
			g.Emit("max.f32", mx[r], mx[r], tmp)
		}
		g.Emit("max.f32", mx[r], mx[r], m[r])
		ms[r] = g.safeMax(mx[r])
		alpha[r] = g.exp2(g.op3("sub.f32", ptx.F32, m[r], ms[r]))
		g.Emit("mov.f32", m[r], mx[r])
		g.Emit("mul.f32", l[r], l[r], alpha[r])
	}
	for j := range s {
		for i, x := range s[j] {
			g.Emit("sub.f32", x, x, ms[i>>1])
			g.Emit("ex2.approx.f32", x, x)
			g.Emit("add.f32", l[i>>1], l[i>>1], x)
		}
	}
	for _, oj := range o {
		for i, r := range oj {
			g.Emit("mul.f32", r, r, alpha[i>>1])
		}
	}
	// O += P.V: P's A fragment for positions 16k2.. is n-tiles 2k2 and 2k2+1 of S; B word
	// (k 2t.., n g) is V^T row 8jd+g, word 8k2+t.
	vw := g.Reg(ptx.U32)
	g.Emit("mad.lo.u32", vw, g.g4, ptx.Imm(apPitchV), g.t4)
	if geo.ds > 1 { // V^T rows of the warp's dims
		g.Emit("mad.lo.u32", vw, g.dp, ptx.Imm(int64(d/geo.ds*apPitchV)), vw)
	}
	va := g.sharedAddr(g.sV, vw, 4)
	a := g.Regs(ptx.B32, 4)
	for k2 := range apTile / 16 {
		s0, s1 := s[2*k2], s[2*k2+1]
		g.Emit("cvt.rn.bf16x2.f32", a[0], s0[1], s0[0])
		g.Emit("cvt.rn.bf16x2.f32", a[1], s0[3], s0[2])
		g.Emit("cvt.rn.bf16x2.f32", a[2], s1[1], s1[0])
		g.Emit("cvt.rn.bf16x2.f32", a[3], s1[3], s1[2])
		for jd, oj := range o {
			off := int64(4 * (8*jd*apPitchV + 8*k2))
			g.Emit("ld.shared.b32", b[0], ptx.Addr{Base: va, Offset: off})
			g.Emit("ld.shared.b32", b[1], ptx.Addr{Base: va, Offset: off + 16})
			g.Emit(mmaOp, ptx.Vec(oj), ptx.Vec(a), ptx.Vec(b), ptx.Vec(oj))
		}
	}
}

// writeRows normalises the warp's rows that belong to the segment and stores them to z.
func (g *apGen) writeRows(in [2]ptx.Reg, l [2]ptx.Reg, o [][]ptx.Reg) {
	c := g.c
	d := c.HeadDim
	tmp := g.Reg(ptx.F32)
	for r := range l {
		for _, off := range []int{1, 2} {
			g.Emit("shfl.sync.bfly.b32", tmp, l[r], ptx.Imm(int64(off)), ptx.Imm(0x1f), ptx.Imm(-1))
			g.Emit("add.f32", l[r], l[r], tmp)
		}
		inv := g.Reg(ptx.F32)
		g.Emit("rcp.rn.f32", inv, l[r])
		row := g.op3("add.u32", ptx.U32, g.r0, g.tr0)
		g.Emit("add.u32", row, row, g.g4)
		g.Emit("add.u32", row, row, ptx.Imm(int64(8*r)))
		zr := g.Reg(ptx.U32)
		g.Emit("mad.lo.u32", zr, row, ptx.Imm(int64(c.Heads)), g.hq)
		za := g.byteAddr(g.byteAddr(g.z, zr, 4*d), g.op3("shl.b32", ptx.U32, g.t4, ptx.Imm(1)), 4)
		if g.geo.ds > 1 {
			za = g.byteAddr(za, g.dp, 4*d/g.geo.ds)
		}
		v := g.Regs(ptx.F32, 2)
		for jd, oj := range o {
			g.Emit("mul.f32", v[0], oj[2*r], inv)
			g.Emit("mul.f32", v[1], oj[2*r+1], inv)
			g.EmitIf(in[r], false, "st.global.v2.f32", ptx.Addr{Base: za, Offset: int64(4 * 8 * jd)}, ptx.Vec(v))
		}
	}
}
