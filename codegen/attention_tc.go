package codegen

import (
	"math"

	"xmix/bundle"
	"xmix/ptx"
)

// Decode attention on tensor cores (AttnConfig.TensorCores, xmixc build --attn-tc): the
// decode kernel's warp step as mma.sync, everything around it (splits, block-table staging,
// prefetch, the merge across warps and splits) as in attention.go.
//
// Why. The CUDA-core step spends some 80 instructions a position on a Llama-3.1-8B kv head
// (16 lanes a K row: the q.k products, four levels of shuffles per head, bf16 widening, the
// softmax repeated on every lane, the p.v products). At 32-128 rows and long contexts that
// many instructions, not the K/V bytes, bound the kernel: it reads K/V at 1.1-1.4x the
// HBM floor inside the graph. On tensor cores a 16-position tile takes 16 + HeadDim/16 mmas.
//
// Tiles. A warp step takes unroll tiles of 16 positions, each within one KV block (tile
// starts are multiples of 16: splits are cut at multiples of 16, segments at KV blocks, and
// BlockSize is a multiple of 16), so a tile needs one block-table entry. Lane (g, t) =
// (lane>>2, lane&3):
//
//	S = Q.K^T, m16n8k16 with Q the A operand (rows: the block's hpb query heads, the rest
//	    zero) and K the B operand, n-tile j the positions 8j..8j+7. K is the .col layout as
//	    stored; the 32 dims of chunk c are permuted (logical k {2t, 2t+1, 2t+8, 2t+9} of the
//	    chunk's first mma are dims 8t..8t+3, of its second 8t+4..8t+7, for Q and K alike), so
//	    that a lane loads 16 contiguous bytes of K row g (and 8+g) per chunk.
//	O^T += V^T.P^T, with V^T the A operand (rows: dims) and P^T the B operand (columns: heads,
//	    so at most 8 heads a block): S's accumulators of head g at positions 2t, 2t+1 (and
//	    8+2t, 8+2t+1) are exactly P^T's B fragment, so P never leaves the lane. Dims are
//	    permuted as well: m-tile i's row g is dim 2Mg+i and row g+8 dim 2Mg+M+i (M =
//	    HeadDim/16 m-tiles), so a lane loads the 2M contiguous dims 2Mg.. of its four
//	    positions 2t, 2t+1, 2t+8, 2t+9 and packs two positions' bf16 of one dim per word with
//	    one prmt.
//
// Softmax. Lane (g, t) keeps the running max and its partial sum of head g; the max is the
// quad's (two shuffles), and the accumulators of heads 2t, 2t+1 take their scale from the
// lanes of those heads (two shuffles a step). Q and P are rounded to bf16 for the tensor
// cores, K and V already are: results are within bf16 rounding of the f32 reference, like
// the prefill kernel's, and depend on neither the bucket nor the row's neighbours.
//
// Registers per lane at head dim 128: Q 16 words, O 32 f32, and per tile 32 words of K and
// 32 of V in flight (8 KiB of K/V a warp).
const (
	tcAttnTile     = 16 // positions of a tile
	tcAttnMaxHeads = 8  // the n of O^T's mma
	tcAttnMaxDim   = 128
	// tcAttnWarpsPerSM is the warps an SM should hold (.minnctapersm): at head dim 128 ptxas
	// gives the step 146-148 registers unasked, one block of 8 warps an SM, and Llama-3.1-8B's
	// batch 32 at 2k contexts then lost 1-2% to the CUDA-core step (session 22 call 1).
	tcAttnWarpsPerSM = 16
	prmtLowHalves    = 0x5410 // prmt selector: {b.lo, a.lo}
	prmtHighHalves   = 0x7632 // {b.hi, a.hi}
)

// tcOK reports whether c's decode kernel runs on tensor cores: asked for, a bf16 cache, head
// dim 64 or 128, no sliding window (whose spans start anywhere) and KV blocks of whole tiles.
func (c AttnConfig) tcOK() bool {
	return c.TensorCores && c.KVDtype == ptx.BF16 && c.HeadDim%64 == 0 && c.HeadDim <= tcAttnMaxDim &&
		c.Window == 0 && c.BlockSize%tcAttnTile == 0
}

// tcGeom is the tensor-core kernel's geometry: tiles of 16 positions a warp step, the most
// query heads of the GQA group up to 8 a block.
func (c AttnConfig) tcGeom() adGeom {
	group := c.Heads / c.KVHeads
	g := adGeom{tc: true, lanes: 32, pp: tcAttnTile, unroll: max(1, c.Unroll)}
	for h := min(group, tcAttnMaxHeads); h >= 1; h-- {
		if group%h == 0 {
			g.hpb = h
			break
		}
	}
	return g
}

// tcLane is what the tensor-core step needs of the lane, computed once: its quad coordinates
// (g, t); 2t (its first column of an S tile, and the first of its heads in O^T); 8t (its
// first dim of a 32-dim chunk of Q and K, and the lane that holds head 2t's softmax state);
// 2Mg (its first dim of V); and the zero word of Q's padding rows.
type tcLane struct {
	g, t, t2, t8, dimV, zero ptx.Reg
}

func (g *adGen) tcLanes() tcLane {
	l := tcLane{g: g.op3("shr.u32", ptx.U32, g.lane, ptx.Imm(2)), t: g.op3("and.b32", ptx.U32, g.lane, ptx.Imm(3))}
	l.t2 = g.op3("shl.b32", ptx.U32, l.t, ptx.Imm(1))
	l.t8 = g.op3("shl.b32", ptx.U32, l.t, ptx.Imm(3))
	l.dimV = g.op3("mul.lo.u32", ptx.U32, l.g, ptx.Imm(int64(2*g.c.HeadDim/16)))
	l.zero = g.Reg(ptx.B32)
	g.Emit("mov.b32", l.zero, ptx.Imm(0))
	return l
}

// askQTC asks for the lane's Q: the 4 f32 of each of S's A fragments (words 0 and 2 of
// each; rows g+8 are zero, as are rows past the block's heads, whose lanes keep zeros).
// convertQTC turns the answer into the fragments; between the two the first step's K/V
// loads are issued (firstStepTC).
func (g *adGen) askQTC() [][]ptx.Reg {
	c, geo := g.c, g.geo
	d := c.HeadDim
	if g.tl.g == (ptx.Reg{}) { // firstStepEarlyTC's loads may have needed them first
		g.tl = g.tcLanes()
	}
	x := make([][]ptx.Reg, d/16)
	for kk := range x {
		x[kk] = g.Regs(ptx.F32, 4)
		for _, r := range x[kk] {
			g.Emit("mov.f32", r, ptx.F32Imm(0))
		}
	}
	g.when(g.cmp("lt", ptx.U32, g.tl.g, ptx.Imm(int64(geo.hpb))), false, func() {
		qrow := g.Reg(ptx.U32)
		g.Emit("mad.lo.u32", qrow, g.row, ptx.Imm(int64(c.Heads+2*c.KVHeads)), g.head0)
		g.Emit("add.u32", qrow, qrow, g.tl.g)
		qa := g.byteAddr(g.byteAddr(g.qkv, qrow, 4*d), g.tl.t8, 4)
		for kk := range x {
			g.Emit("ld.global.v4.f32", ptx.Vec(x[kk]), ptx.Addr{Base: qa, Offset: int64(4 * qDimTC(kk))})
		}
		if c.Rope {
			g.rotateQTC(x)
		}
	})
	return x
}

// qDimTC is the first of the 4 dims that a lane's A fragment kk of Q holds, past its t8.
func qDimTC(kk int) int { return 32*(kk/2) + 4*(kk%2) }

// rotateQTC rotates askQTC's Q in registers (AttnConfig.Rope): dim i of fragment kk pairs
// with dim i + HeadDim/2 of fragment kk + HeadDim/32, which the same lane holds, and both
// take cos and sin of i at the row's position, as rope_kv rotates them.
func (g *adGen) rotateQTC(x [][]ptx.Reg) {
	half := g.c.HeadDim / 2
	at := g.Reg(ptx.U32)
	g.Emit("mad.lo.u32", at, g.pos, ptx.Imm(int64(half)), g.tl.t8)
	cb, sb := g.byteAddr(g.cos, at, 4), g.byteAddr(g.sin, at, 4)
	pairs := len(x) / 2
	cs, sn := make([][]ptx.Reg, pairs), make([][]ptx.Reg, pairs)
	for kk := range pairs {
		cs[kk], sn[kk] = g.Regs(ptx.F32, 4), g.Regs(ptx.F32, 4)
		g.Emit("ld.global.nc.v4.f32", ptx.Vec(cs[kk]), ptx.Addr{Base: cb, Offset: int64(4 * qDimTC(kk))})
		g.Emit("ld.global.nc.v4.f32", ptx.Vec(sn[kk]), ptx.Addr{Base: sb, Offset: int64(4 * qDimTC(kk))})
	}
	for kk := range pairs {
		for j := range 4 {
			x0, x1 := x[kk][j], x[kk+pairs][j]
			o0, o1 := g.ropeRotate(x0, x1, cs[kk][j], sn[kk][j])
			g.Emit("mov.f32", x0, o0)
			g.Emit("mov.f32", x1, o1)
		}
	}
}

// ropeKV writes the block's kv head's k (rotated) and v of the row's newest position into
// the caches, rope_kv's work for that head with its instructions, each thread a pair (i,
// i + HeadDim/2) at a time, and then waits at the block's barrier, so that the scan's loads
// of that position read them (AttnConfig.Rope). A padding row writes nothing (PadSeq).
func (g *adGen) ropeKV() {
	c := g.c
	d, half, kvs := c.HeadDim, c.HeadDim/2, c.KVDtype.Bytes()
	slot := g.kvSlot(c.ropeConfig(), g.table, g.s, g.pos)
	elem := g.Reg(ptx.U32) // element 0 of the block's kv head at the slot
	g.Emit("mad.lo.u32", elem, slot, ptx.Imm(int64(c.KVHeads)), g.kvh)
	g.Emit("mul.lo.u32", elem, elem, ptx.Imm(int64(d)))
	krow := g.Reg(ptx.U32) // the row's k head, then its v head KVHeads heads on
	g.Emit("mad.lo.u32", krow, g.row, ptx.Imm(int64(c.Heads+2*c.KVHeads)), ptx.Imm(int64(c.Heads)))
	g.Emit("add.u32", krow, krow, g.kvh)
	kx := g.byteAddr(g.qkv, krow, 4*d)
	vx := g.byteAddr(kx, ptx.Imm(int64(c.KVHeads)), 4*d)
	i := g.Reg(ptx.U32)
	// The whole block takes the same branch: its row's sequence slot.
	g.when(g.cmp("eq", ptx.U32, g.s, ptx.Imm(int64(c.PadSeq))), true, func() {
		g.forLoop(i, g.tid, ptx.Imm(int64(half)), ptx.Imm(int64(32*c.warps())), func() {
			at := g.Reg(ptx.U32)
			g.Emit("mad.lo.u32", at, g.pos, ptx.Imm(int64(half)), i)
			cs, sn := g.Reg(ptx.F32), g.Reg(ptx.F32)
			g.Emit("ld.global.nc.f32", cs, ptx.Addr{Base: g.byteAddr(g.cos, at, 4)})
			g.Emit("ld.global.nc.f32", sn, ptx.Addr{Base: g.byteAddr(g.sin, at, 4)})
			k0, k1, v0, v1 := g.Reg(ptx.F32), g.Reg(ptx.F32), g.Reg(ptx.F32), g.Reg(ptx.F32)
			ka, va := g.byteAddr(kx, i, 4), g.byteAddr(vx, i, 4)
			g.Emit("ld.global.f32", k0, ptx.Addr{Base: ka})
			g.Emit("ld.global.f32", k1, ptx.Addr{Base: ka, Offset: int64(4 * half)})
			g.Emit("ld.global.f32", v0, ptx.Addr{Base: va})
			g.Emit("ld.global.f32", v1, ptx.Addr{Base: va, Offset: int64(4 * half)})
			o0, o1 := g.ropeRotate(k0, k1, cs, sn)
			e := g.op3("add.u32", ptx.U32, elem, i)
			kc, vc := g.byteAddr(g.kc, e, kvs), g.byteAddr(g.vc, e, kvs)
			g.storeAt(ptx.Addr{Base: kc}, o0, c.KVDtype)
			g.storeAt(ptx.Addr{Base: kc, Offset: int64(half * kvs)}, o1, c.KVDtype)
			g.storeAt(ptx.Addr{Base: vc}, v0, c.KVDtype)
			g.storeAt(ptx.Addr{Base: vc, Offset: int64(half * kvs)}, v1, c.KVDtype)
		})
	})
	g.Emit("bar.sync", ptx.Imm(0))
}

// convertQTC scales askQTC's answer to log2 units and rounds it to bf16 as S's A fragments.
func (g *adGen) convertQTC(x [][]ptx.Reg) {
	qs := ptx.F32Imm(g.c.qScale())
	g.qa = make([][2]ptx.Reg, len(x))
	for kk, w := range x {
		for _, r := range w {
			g.Emit("mul.f32", r, r, qs)
		}
		g.qa[kk] = [2]ptx.Reg{g.Reg(ptx.B32), g.Reg(ptx.B32)}
		g.Emit("cvt.rn.bf16x2.f32", g.qa[kk][0], w[1], w[0])
		g.Emit("cvt.rn.bf16x2.f32", g.qa[kk][1], w[3], w[2])
	}
}

// zeroStateTC zeroes the lane's softmax state and O.
func (g *adGen) zeroStateTC() {
	g.m = []ptx.Reg{g.f32(float32(math.Inf(-1)))}
	g.l = []ptx.Reg{g.f32(0)}
	g.acc = make([][]ptx.Reg, g.c.HeadDim/16)
	for i := range g.acc {
		g.acc[i] = make([]ptx.Reg, 4)
		for j := range g.acc[i] {
			g.acc[i][j] = g.f32(0)
		}
	}
}

// loadQTC loads Q as S's A fragments and zeroes the lane's softmax state and O.
func (g *adGen) loadQTC() {
	x := g.askQTC()
	g.zeroStateTC()
	g.convertQTC(x)
}

// firstStepTC is the warp's first step of seg, peeled off the scan's loop so that its K/V
// loads go out with Q's, before Q is converted: a block's first loads then wait on memory
// once, not twice. A warp whose first step lies past seg.hi loads seg's last position and
// skips the step. It returns the warp's next position. The loop's steps load into
// registers of their own: nothing is loaded across the loop's back edge, whose live
// registers (Q, O) are what the kernel's 128 are sized for (loading the next step's K/V
// across it spilled: session 37 call 7).
//
// Only the split kernels peel, and their scan carries the warp's position from step to
// step (scan's next). A split's warps take a few steps each, so the first step's wait is a
// large share of the kernel: on Llama-3.1-8B the steps of 1-32 rows got 0.2-1.3% shorter
// (session 38 call 1). The unsplit kernels (buckets of 64 rows and more) take tens of
// steps a warp; in that form the 8B's 128-row step was no shorter and Llama-3.2-1B's 1.5% /
// 3.3% longer at contexts 576 / 2112 (call 3), and without the peel (8bd9a93) as before.
// Peeled with the scan's loop as the unsplit kernels have it, the split kernels gained
// nothing (call 4): ptxas kept 4 bytes of spill stores there, 0 with the position carried.
func (g *adGen) firstStepTC(seg segment) ptx.Reg {
	t := g.Reg(ptx.U32)
	g.warpStart(t, seg.lo)
	x := g.askQTC()
	bases, tiles := g.loadStepTC(t, seg.hi, seg.blk0)
	g.firstStepRestTC(t, x, bases, tiles, seg)
	return t
}

// firstStepRestTC is what the first step does once its loads are out: Q's fragments from x,
// the state zeroed, the step computed where the warp's first position t lies in seg, and t
// moved on a stride.
func (g *adGen) firstStepRestTC(t ptx.Reg, x [][]ptx.Reg, bases []ptx.Reg, tiles []tcTile, seg segment) {
	g.zeroStateTC()
	g.convertQTC(x)
	g.when(g.cmp("lt", ptx.U32, t, seg.hi), false, func() {
		g.computeStepTC(bases, tiles, seg.hi)
	})
	g.Emit("add.u32", t, t, ptx.Imm(int64(g.stride())))
}

// firstStepEarlyTC is firstStepTC in a kernel launched early with EarlyKV, and waits for the
// grid ahead itself: the warp's first step's K/V loads go out before the wait wherever every
// position a tile reads precedes the row's newest, n-1, the one position the kernel ahead
// writes (earlier steps wrote the others; a tile reads up to min(its last, seg.hi-1)), and
// after the wait otherwise, into the same registers. Q, which the kernel ahead writes, is
// asked for after the wait. A block's first loads then overlap the kernel ahead's last
// stores instead of following them.
func (g *adGen) firstStepEarlyTC(seg segment, n ptx.Reg) ptx.Reg {
	t := g.Reg(ptx.U32)
	g.warpStart(t, seg.lo)
	g.tl = g.tcLanes()
	last := g.op3("sub.u32", ptx.U32, seg.hi, ptx.Imm(1))
	older := g.cmp("lt", ptx.U32, seg.hi, n) // the segment ends before the newest position
	bases := make([]ptx.Reg, g.geo.unroll)
	tiles := make([]tcTile, g.geo.unroll)
	early := make([]ptx.Reg, g.geo.unroll)
	for u := range tiles {
		bases[u] = g.op3("add.u32", ptx.U32, t, ptx.Imm(int64(u*tcAttnTile)))
		end := g.op3("add.u32", ptx.U32, bases[u], ptx.Imm(tcAttnTile))
		early[u] = g.cmp("lt", ptx.U32, end, n)
		g.Emit("or.pred", early[u], early[u], older)
		g.loadTileInto(&tiles[u], bases[u], last, seg.blk0, early[u])
	}
	g.Emit(bundle.PriorGridWait)
	x := g.askQTC()
	// The same loads, from the same addresses, where they could not go out before the wait.
	for u := range tiles {
		for _, l := range tiles[u].loads {
			g.EmitIf(early[u], true, "ld.global.v4.b32", l.words, l.at)
		}
	}
	g.firstStepRestTC(t, x, bases, tiles, seg)
	return t
}

// tcTile is one tile's K and V words in flight: K rows g and 8+g (HeadDim/8 words each), V
// rows 2t, 2t+1, 2t+8, 2t+9 (M words each: dims 2Mg..2Mg+2M); and the loads that fill them,
// K's then V's (loadTileInto).
type tcTile struct {
	k     [2][]ptx.Reg
	v     [4][]ptx.Reg
	loads []tcLoad
}

// tcLoad is one 16-byte load of a tile: its words, its address.
type tcLoad struct {
	words ptx.Vec
	at    ptx.Addr
}

// loadTileTC issues the lane's loads of the tile at base into registers of its own.
func (g *adGen) loadTileTC(base, last, blk0 ptx.Reg) tcTile {
	var tl tcTile
	g.loadTileInto(&tl, base, last, blk0)
	return tl
}

// loadTileInto issues the lane's loads of the tile at base into tl, whose registers it makes
// where tl has none yet (each load's as it goes), and keeps them in tl.loads; with guard, each
// load only where guard holds. Positions past last (a span's end) read last's rows instead
// and are masked later; a tile starting past last reads only last's.
func (g *adGen) loadTileInto(tl *tcTile, base, last, blk0 ptx.Reg, guard ...ptx.Reg) {
	c := g.c
	d, m := c.HeadDim, c.HeadDim/16
	b := g.op3("min.u32", ptx.U32, base, last)
	lim := g.op3("sub.u32", ptx.U32, last, b)
	row0 := g.kvRow(b, blk0)
	addr := func(cache, x, dim ptx.Reg, off int) ptx.Reg {
		xe := g.op3("add.u32", ptx.U32, x, ptx.Imm(int64(off)))
		g.Emit("min.u32", xe, xe, lim)
		row := g.Reg(ptx.U32)
		g.Emit("mad.lo.u32", row, xe, ptx.Imm(int64(c.KVHeads)), row0)
		elem := g.Reg(ptx.U32)
		g.Emit("mad.lo.u32", elem, row, ptx.Imm(int64(d)), dim)
		return g.byteAddr(cache, elem, 2)
	}
	words := func(w []ptx.Reg, i int) []ptx.Reg {
		if len(w) < i+4 {
			w = append(w, g.Regs(ptx.B32, 4)...)
		}
		return w
	}
	load := func(w ptx.Vec, at ptx.Addr) {
		tl.loads = append(tl.loads, tcLoad{w, at})
		if len(guard) > 0 {
			g.EmitIf(guard[0], false, "ld.global.v4.b32", w, at)
			return
		}
		g.Emit("ld.global.v4.b32", w, at)
	}
	for j := range tl.k {
		a := addr(g.kc, g.tl.g, g.tl.t8, 8*j)
		for ch := range d / 32 {
			tl.k[j] = words(tl.k[j], 4*ch)
			load(ptx.Vec(tl.k[j][4*ch:4*ch+4]), ptx.Addr{Base: a, Offset: int64(64 * ch)})
		}
	}
	for q, off := range []int{0, 1, 8, 9} {
		a := addr(g.vc, g.tl.t2, g.tl.dimV, off)
		for ch := range m / 4 {
			tl.v[q] = words(tl.v[q], 4*ch)
			load(ptx.Vec(tl.v[q][4*ch:4*ch+4]), ptx.Addr{Base: a, Offset: int64(16 * ch)})
		}
	}
}

// stepTC is one warp step over the tiles at t + 16u, u < unroll: every load first, then S,
// the softmax update and O of each tile.
func (g *adGen) stepTC(t, segHi, blk0 ptx.Reg) {
	bases, tiles := g.loadStepTC(t, segHi, blk0)
	g.computeStepTC(bases, tiles, segHi)
}

// loadStepTC issues the loads of the step's tiles and returns their first positions.
func (g *adGen) loadStepTC(t, segHi, blk0 ptx.Reg) ([]ptx.Reg, []tcTile) {
	geo := g.geo
	last := g.op3("sub.u32", ptx.U32, segHi, ptx.Imm(1))
	bases := make([]ptx.Reg, geo.unroll)
	tiles := make([]tcTile, geo.unroll)
	for u := range tiles {
		bases[u] = g.op3("add.u32", ptx.U32, t, ptx.Imm(int64(u*tcAttnTile)))
		tiles[u] = g.loadTileTC(bases[u], last, blk0)
	}
	return bases, tiles
}

// computeStepTC runs S, the softmax update and O of the loaded tiles; positions from segHi
// on score -inf.
func (g *adGen) computeStepTC(bases []ptx.Reg, tiles []tcTile, segHi ptx.Reg) {
	c, geo := g.c, g.geo
	d, m := c.HeadDim, c.HeadDim/16
	// S: [tile][n-tile] accumulators; d0, d1 are head g at positions 8j+2t, 8j+2t+1.
	negInf := ptx.F32Imm(float32(math.Inf(-1)))
	s := make([][2][]ptx.Reg, geo.unroll)
	mx := g.f32(float32(math.Inf(-1)))
	p := g.Reg(ptx.U32)
	for u, tl := range tiles {
		for j := range 2 {
			s[u][j] = g.Regs(ptx.F32, 4)
			for _, r := range s[u][j] {
				g.Emit("mov.f32", r, ptx.F32Imm(0))
			}
			for kk := range d / 16 {
				a := []ptx.Reg{g.qa[kk][0], g.tl.zero, g.qa[kk][1], g.tl.zero}
				b := tl.k[j][4*(kk/2)+2*(kk%2) : 4*(kk/2)+2*(kk%2)+2]
				g.Emit(mmaOp, ptx.Vec(s[u][j]), ptx.Vec(a), ptx.Vec(b), ptx.Vec(s[u][j]))
			}
			g.softcapScores(c, s[u][j][:2]...)
			for i := range 2 {
				g.Emit("add.u32", p, bases[u], g.tl.t2)
				g.Emit("add.u32", p, p, ptx.Imm(int64(8*j+i)))
				g.Emit("selp.f32", s[u][j][i], s[u][j][i], negInf, g.cmp("lt", ptx.U32, p, segHi))
				g.Emit("max.f32", mx, mx, s[u][j][i])
			}
		}
	}
	tmp := g.Reg(ptx.F32)
	for _, off := range []int{1, 2} {
		g.Emit("shfl.sync.bfly.b32", tmp, mx, ptx.Imm(int64(off)), ptx.Imm(0x1f), ptx.Imm(-1))
		g.Emit("max.f32", mx, mx, tmp)
	}
	g.Emit("max.f32", mx, mx, g.m[0])
	ms := g.safeMax(mx)
	alpha := g.exp2(g.op3("sub.f32", ptx.F32, g.m[0], ms))
	g.Emit("mov.f32", g.m[0], mx)
	g.Emit("mul.f32", g.l[0], g.l[0], alpha)
	for u := range s {
		for j := range 2 {
			for _, x := range s[u][j][:2] {
				g.Emit("sub.f32", x, x, ms)
				g.Emit("ex2.approx.f32", x, x)
				g.Emit("add.f32", g.l[0], g.l[0], x)
			}
		}
	}
	// O^T's columns 2t, 2t+1 are heads 2t, 2t+1: their scales from those heads' lanes.
	var hs [2]ptx.Reg
	for b := range hs {
		src := g.op3("add.u32", ptx.U32, g.tl.t8, ptx.Imm(int64(4*b)))
		hs[b] = g.Reg(ptx.F32)
		g.Emit("shfl.sync.idx.b32", hs[b], alpha, src, ptx.Imm(0x1f), ptx.Imm(-1))
	}
	for _, o := range g.acc {
		for i, r := range o {
			g.Emit("mul.f32", r, r, hs[i&1])
		}
	}
	pb := g.Regs(ptx.B32, 2)
	a := g.Regs(ptx.B32, 4)
	for u, tl := range tiles {
		for j := range 2 {
			g.Emit("cvt.rn.bf16x2.f32", pb[j], s[u][j][1], s[u][j][0])
		}
		for i, o := range g.acc {
			sel := ptx.Imm(prmtLowHalves)
			if i&1 == 1 {
				sel = ptx.Imm(prmtHighHalves)
			}
			lo, hi := i/2, m/2+i/2 // words of dims 2Mg+i and 2Mg+M+i
			g.Emit("prmt.b32", a[0], tl.v[0][lo], tl.v[1][lo], sel)
			g.Emit("prmt.b32", a[1], tl.v[0][hi], tl.v[1][hi], sel)
			g.Emit("prmt.b32", a[2], tl.v[2][lo], tl.v[3][lo], sel)
			g.Emit("prmt.b32", a[3], tl.v[2][hi], tl.v[3][hi], sel)
			g.Emit(mmaOp, ptx.Vec(o), ptx.Vec(a), ptx.Vec(pb), ptx.Vec(o))
		}
	}
}

// storeStateTC writes the warp's softmax state to the block's merge arrays: m and the quad's
// summed l of head g from lane (g, 0), and O^T's columns 2t, 2t+1 (heads) as rows of dims.
func (g *adGen) storeStateTC() mergeArrays {
	c, geo := g.c, g.geo
	d, m := c.HeadDim, c.HeadDim/16
	ms := g.declareMergeArrays()
	sm, sl, sacc, st := ms.m, ms.l, ms.acc, ms.st
	tmp := g.Reg(ptx.F32)
	for _, off := range []int{1, 2} {
		g.Emit("shfl.sync.bfly.b32", tmp, g.l[0], ptx.Imm(int64(off)), ptx.Imm(0x1f), ptx.Imm(-1))
		g.Emit("add.f32", g.l[0], g.l[0], tmp)
	}
	head := g.op3("add.u32", ptx.U32, st, g.tl.g)
	lead := g.cmp("lt", ptx.U32, g.tl.g, ptx.Imm(int64(geo.hpb)))
	g.Emit("setp.eq.and.u32", lead, g.tl.t, ptx.Imm(0), lead)
	g.when(lead, false, func() {
		g.Emit("st.shared.f32", ptx.Addr{Base: g.sharedAddr(sm, head, 4)}, g.m[0])
		g.Emit("st.shared.f32", ptx.Addr{Base: g.sharedAddr(sl, head, 4)}, g.l[0])
	})
	for b := range 2 {
		h := g.op3("add.u32", ptx.U32, g.tl.t2, ptx.Imm(int64(b)))
		g.when(g.cmp("lt", ptx.U32, h, ptx.Imm(int64(geo.hpb))), false, func() {
			idx := g.op3("add.u32", ptx.U32, st, h)
			g.Emit("mad.lo.u32", idx, idx, ptx.Imm(int64(d)), g.tl.dimV)
			base := g.sharedAddr(sacc, idx, 4)
			// Dim 2Mg+e is m-tile e's row g (e < M), else m-tile e-M's row g+8.
			for e0 := 0; e0 < 2*m; e0 += 4 {
				v := make([]ptx.Reg, 4)
				for k := range v {
					e := e0 + k
					if e < m {
						v[k] = g.acc[e][b]
					} else {
						v[k] = g.acc[e-m][2+b]
					}
				}
				g.Emit("st.shared.v4.f32", ptx.Addr{Base: base, Offset: int64(4 * e0)}, ptx.Vec(v))
			}
		})
	}
	return ms
}
