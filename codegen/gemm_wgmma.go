package codegen

import (
	"fmt"
	"slices"

	"xmix/ptx"
)

// The copy-engine GEMM's warpgroup form, for decode buckets of 32 rows and more (gcLayouts'
// layouts with Warpgroup): the ring, the tensor-map copies and the early W are the mma.sync
// form's (gemm_copy.go), but the multiplies are Hopper's warpgroup MMAs, which read both
// operands from shared memory themselves. Swapped, as small-batch GEMMs are: A is W (the
// CTA's 64 columns, M = 64), B is x (the node's token rows, N = Rows), so one
// wgmma.m64n{Rows}k16 covers every row, and x, which the mma.sync form stages in f32 and
// reads into registers once per column group, is the library cast's bf16, read by the
// tensor cores once a CTA. A CTA is one warpgroup: at 128 rows, two warpgroups of 64
// columns each (128 a CTA, K over clusters of up to 4 where tiles are few) made the 8B's
// step 10-21% longer than cuBLASLt's, one warpgroup 1.5% (sessions 41-42,
// testsuite/gpu/RESULTS.md).
//
// Shared x (gcLayout.Share, 128 rows where K is not split). At 128 rows a CTA's x is twice
// its W's bytes, and each column tile read all of it from L2. Two neighbouring CTAs of a
// cluster (column tiles 2t and 2t+1) now each ask for half of a stage's x boxes, multicast
// to both; a slot is refilled only once both have read it, which each one's thread 0 tells
// both CTAs' "free" mbarriers (freeSlot). A fifth warp (produce) waits for that and refills
// the ring, so the warpgroup never waits for its partner: with thread 0 refilling, the step
// took 8.1-11.0 ms against cuBLASLt's 6.0; with the producer 5.94 against 5.89, q/k/v at
// 0.638 ms a step against the library's 0.609 (session 43).
//
// Layout. W's boxes (64 K by 64 columns) and x's (64 K by Rows) both have 128-byte
// rows under the 128-byte swizzle, 1024-byte aligned: the canonical K-major layout a wgmma
// descriptor names with a stride of 1024 bytes between groups of 8 rows (wgSBO). Each of a
// box's four K steps of 16 starts 32 bytes further into the rows; the swizzle is applied to
// the address, so the step is a plain offset.
//
// Sums. Warp w holds rows 16w..16w+15 of the 64 columns: lane (g, t) has
// register i at column 16w + g + 8*(i/2 % 2), token 8*(i/4) + 2t + i%2. With K split over a
// cluster, ranks 1.. store every thread's registers into rank 0's ring once every rank's loop
// has ended, and rank 0 adds them in rank order, so every run gives the same bits.

const (
	wgSBO   = 1024 // bytes between a K-major operand's groups of 8 rows: 8 rows of 128 bytes
	wgKStep = 16   // K of one wgmma
	// wgDescHi is a descriptor's upper word: the stride (wgSBO >> 4) and the 128-byte swizzle
	// (layout type 1 at bits 62-63).
	wgDescHi = wgSBO>>4 | 1<<30
	// wgDescLo is what the lower word holds besides the start address: the leading offset,
	// unused under the 128-byte swizzle with K-major rows, as 1 (16 bytes) as CUTLASS sets it.
	wgDescLo = 1 << 16
)

// wgMainLoop multiplies the CTA's stages in order, slot by slot, as mainLoop does.
func (g *gcGen) wgMainLoop() {
	c := g.c
	acc := g.Regs(ptx.F32, c.Rows/2)
	for _, a := range acc {
		g.Emit("mov.f32", a, ptx.F32Imm(0))
	}
	g.acc = [][]ptx.Reg{acc}
	hi := g.imm32(wgDescHi)
	stage, slot, phase := g.imm32(0), g.imm32(0), g.imm32(0)
	top := g.NewLabel("stage")
	g.Label(top)
	g.wait(g.barAddr(slot), phase)
	// Descriptors hold start addresses >> 4; the slots are 1024-byte aligned and every offset
	// below a multiple of 16, so a descriptor's lower word is base>>4 + offset>>4 + wgDescLo.
	slotBase := g.slotAddr(g.slot0, slot)
	base := g.op3("shr.u32", ptx.U32, slotBase, ptx.Imm(4))
	g.Emit("add.u32", base, base, ptx.Imm(wgDescLo))
	lo, da, db := g.Reg(ptx.U32), g.Reg(ptx.B64), g.Reg(ptx.B64)
	g.Emit("wgmma.fence.sync.aligned")
	for b := range c.stageK() / gcBoxK {
		for j := range gcBoxK / wgKStep {
			step := int64(j * wgKStep * 2)
			g.Emit("add.u32", lo, base, ptx.Imm((int64(b*gcCols*2*gcBoxK)+step)>>4))
			g.Emit("mov.b64", da, ptx.Vec{lo, hi})
			g.Emit("add.u32", lo, base, ptx.Imm((int64(c.wBytes()+b*c.Rows*2*gcBoxK)+step)>>4))
			g.Emit("mov.b64", db, ptx.Vec{lo, hi})
			g.Emit(wgmmaOp(c.Rows), ptx.Vec(acc), da, db, ptx.Imm(1), ptx.Imm(1), ptx.Imm(1), ptx.Imm(0), ptx.Imm(0))
		}
	}
	g.Emit("wgmma.commit_group.sync.aligned")
	// The slot is refilled once the MMAs have read it.
	g.Emit("wgmma.wait_group.sync.aligned", ptx.Imm(0))
	if c.tiles() == 1 {
		g.nextStage(stage, slot, phase, top)
		return
	}
	// Several tiles a CTA: the slot is refilled (perhaps with the next tile's stage), and at
	// a tile's last stage its activation is stored and the sums start again.
	g.refill(stage, slot)
	last := g.op3("rem.u32", ptx.U32, stage, ptx.Imm(int64(c.kStages())))
	more := g.cmp("ne", ptx.U32, last, ptx.Imm(int64(c.kStages()-1)))
	next := g.NewLabel("tile_on")
	g.EmitIf(more, false, "bra", ptx.Sym(next))
	g.wgStoreGated(acc, g.tileCol(stage))
	for _, a := range acc {
		g.Emit("mov.f32", a, ptx.F32Imm(0))
	}
	g.Label(next)
	g.advance(stage, slot, phase, top)
}

// wgmmaOp is the warpgroup MMA of rows token rows: D[64 x rows] += W[64 x 16] . x[rows x 16]^T,
// bf16 operands from shared memory, f32 sums.
func wgmmaOp(rows int) string {
	return fmt.Sprintf("wgmma.mma_async.sync.aligned.m64n%dk16.f32.bf16.bf16", rows)
}

// wgReduce adds the cluster's ranks' sums (K split) and stores y: thread by thread, register
// by register, rank 1's then rank 2's... onto rank 0's. Rank r's registers go to rank 0's
// ring at (r-1)*partBytes, register quad q of thread tid at q*threads*16 + tid*16.
func (g *gcGen) wgReduce() {
	c := g.c
	acc := g.acc[0]
	if c.Split > 1 {
		// Every rank's loop has ended, so rank 0's ring is free.
		g.Emit("barrier.cluster.arrive.release")
		g.Emit("barrier.cluster.wait.acquire")
		mine := g.Reg(ptx.U32)
		g.Emit("mad.lo.u32", mine, g.tid, ptx.Imm(16), g.slot0)
		sender := g.cmp("ne", ptx.U32, g.rank, ptx.Imm(0))
		g.when(sender, false, func() {
			remote := g.rankPart(mine)
			for q := range len(acc) / 4 {
				g.Emit("st.shared::cluster.v4.f32", ptx.Addr{Base: remote, Offset: int64(q * c.threads() * 16)}, ptx.Vec(acc[4*q:4*q+4]))
			}
		})
		g.Emit("barrier.cluster.arrive.release")
		g.Emit("barrier.cluster.wait.acquire")
		g.EmitIf(sender, false, "exit")
		part := g.Regs(ptx.F32, 4)
		for r := 1; r < c.Split; r++ {
			for q := range len(acc) / 4 {
				g.Emit("ld.shared.v4.f32", ptx.Vec(part), ptx.Addr{Base: mine, Offset: int64((r-1)*c.partBytes() + q*c.threads()*16)})
				for i := range part {
					g.Emit("add.f32", acc[4*q+i], acc[4*q+i], part[i])
				}
			}
		}
	}
	switch {
	case c.tiles() > 1: // each tile's activation is stored in the main loop
	case c.Act != "":
		g.wgStoreGated(acc, g.col0)
	case c.Rope != nil:
		g.wgStoreRope(acc)
	default:
		g.wgStore(acc, c.N, g.col0)
	}
}

// wgStore stores a warpgroup's sums acc into y, [rows, width]: register i of thread (warp,
// g, t) at column col0 + 16*warp + g (+8), token 2t (+1) + 8*(i/4). With Act, each value
// also goes to y_bf16 where that is not 0, rounded as the backend's cast rounds it, so that
// the GEMM after the activation reads it without a cast; and to y only where that is not 0
// (nothing else reads it: the loader's choice).
func (g *gcGen) wgStore(acc []ptx.Reg, width int, col0 ptx.Reg) {
	col := g.op3("shr.u32", ptx.U32, g.tid, ptx.Imm(5))
	g.Emit("mul.lo.u32", col, col, ptx.Imm(16))
	g.Emit("add.u32", col, col, g.gg)
	g.Emit("add.u32", col, col, col0)
	tok := g.op3("shl.b32", ptx.U32, g.t, ptx.Imm(1))
	for i, v := range acc {
		row := g.op3("add.u32", ptx.U32, tok, ptx.Imm(int64(8*(i/4)+i%2)))
		idx := g.Reg(ptx.U32)
		g.Emit("mad.lo.u32", idx, row, ptx.Imm(int64(width)), col)
		at := g.byteAddr(g.y, idx, 4)
		in := g.cmp("lt", ptx.U32, row, g.rows)
		if g.c.Act == "" {
			g.EmitIf(in, false, "st.global.f32", ptx.Addr{Base: at, Offset: int64(32 * (i / 2 % 2))}, v)
			continue
		}
		store := g.Reg(ptx.Pred)
		g.Emit("and.pred", store, in, g.yOn)
		g.EmitIf(store, false, "st.global.f32", ptx.Addr{Base: at, Offset: int64(32 * (i / 2 % 2))}, v)
		h := g.Reg(ptx.B16)
		g.Emit("cvt.rn.bf16.f32", h, v)
		g.Emit("and.pred", in, in, g.ybOn)
		g.EmitIf(in, false, "st.global.b16", ptx.Addr{Base: g.byteAddr(g.yb, idx, 2), Offset: int64(16 * (i / 2 % 2))}, h)
	}
}

// wgStoreGated stores act(gate) * up (Act) of the tile at column col0 into y, [rows, N/2].
// Warps 0-1 hold gate's 32 columns of the tile and warps 2-3 up's same columns, register for
// register: thread 64+j's register i is the up of thread j's. Warps 2-3 pass theirs through
// shared memory past the ring (xchgBytes; the barrier ahead keeps them from overwriting
// the tile before's while it is read); warps 0-1 store as wgStore does. With one tile a CTA
// warps 2-3 then exit.
func (g *gcGen) wgStoreGated(acc []ptx.Reg, col0 ptx.Reg) {
	c := g.c
	half := wgThreads / 2
	at, done := g.wgSecondHalf(acc)
	ups := g.Regs(ptx.F32, 4)
	out := make([]ptx.Reg, len(acc))
	for q := range len(acc) / 4 {
		g.Emit("ld.shared.v4.f32", ptx.Vec(ups), ptx.Addr{Base: at, Offset: int64(q * half * 16)})
		for i, u := range ups {
			out[4*q+i] = gateAct(g.emitter, actOfOp(c.Act), acc[4*q+i], u)
		}
	}
	g.wgStore(out, c.N/2, col0)
	g.Label(done)
}

// wgSecondHalf passes the sums of warps 2-3 (the tile's second 32 W rows) to warps 0-1:
// thread 64+j's register quad q goes to at + q*64*16 in shared memory past the ring
// (xchgBytes; the barrier ahead keeps it from overwriting the tile before's while that is
// read), where thread j reads it. Then warps 2-3 exit, or with several tiles a CTA branch to
// done, which the caller places after its stores.
func (g *gcGen) wgSecondHalf(acc []ptx.Reg) (at ptx.Reg, done string) {
	c := g.c
	half := wgThreads / 2
	g.Emit("bar.sync", ptx.Imm(0))
	second := g.cmp("ge", ptx.U32, g.tid, ptx.Imm(int64(half)))
	at = g.Reg(ptx.U32)
	g.Emit("rem.u32", at, g.tid, ptx.Imm(int64(half)))
	g.Emit("mad.lo.u32", at, at, ptx.Imm(16), g.slot0)
	g.Emit("add.u32", at, at, ptx.Imm(int64(c.Stages*c.slotBytes())))
	g.when(second, false, func() {
		for q := range len(acc) / 4 {
			g.Emit("st.shared.v4.f32", ptx.Addr{Base: at, Offset: int64(q * half * 16)}, ptx.Vec(acc[4*q:4*q+4]))
		}
	})
	g.Emit("bar.sync", ptx.Imm(0))
	done = g.NewLabel("stored")
	if c.tiles() == 1 {
		g.EmitIf(second, false, "exit")
	} else {
		g.EmitIf(second, false, "bra", ptx.Sym(done))
	}
	return at, done
}

// gcRope is what a copy-engine GEMM with Rope keeps for its epilogue: its rope_kv parameters
// (bundle.RopeKVParams by name) and, read before the wait by warps 0-1 (wgPrepareRope), per
// accumulator register i: the cos and sin of its token row's position and its pair; per token
// row of the thread (wgTokens): the first cache element of its KV slot (k and v CTAs only).
type gcRope struct {
	params  map[string]ptx.Reg
	cos     []ptx.Reg
	sin     []ptx.Reg
	kvElem  []ptx.Reg
	kind    ropeHead
	yRow0   ptx.Reg // the CTA's first y column of each token row
	kvHead0 ptx.Reg // the CTA's first element of its k or v head in a KV slot
}

// ropeHead is the kind of head a CTA's 32 pairs belong to (every pair of a CTA is one head's).
type ropeHead struct{ q, v ptx.Reg }

// wgTokens is the token row of each of a thread's accumulator registers (thread (warp, g,
// t)'s register i: token 8*(i/4) + 2t + i%2, at pair 16*warp + g + 8*(i/2 % 2)): one entry
// per distinct token, and reg's index into it.
func wgTokens(regs int) (tokens []int, of []int) {
	of = make([]int, regs)
	for i := range regs {
		tok := 8*(i/4) + i%2
		j := slices.Index(tokens, tok)
		if j < 0 {
			j = len(tokens)
			tokens = append(tokens, tok)
		}
		of[i] = j
	}
	return tokens, of
}

// wgPrepareRope reads, before the wait (none of it is the grid ahead's: the host wrote the
// positions, slots and block table before the step, cos and sin are weights), what warps 0-1
// rotate and store with: each register's cos and sin and, in a k or v head's CTA, each token
// row's KV slot. Token rows past rows read row rows-1's (their results are not stored).
func (g *gcGen) wgPrepareRope() {
	c, r := g.c, g.rope
	rc := *c.Rope
	half := rc.HeadDim / 2
	p := r.params
	// The CTA's pairs: col0 = its first pair u0, of head u0/half, element u0%half.
	h := g.op3("div.u32", ptx.U32, g.col0, ptx.Imm(int64(half)))
	i0 := g.op3("rem.u32", ptx.U32, g.col0, ptx.Imm(int64(half)))
	r.kind = ropeHead{q: g.cmp("lt", ptx.U32, h, ptx.Imm(int64(rc.Heads))), v: g.cmp("ge", ptx.U32, h, ptx.Imm(int64(rc.Heads+rc.KVHeads)))}
	r.yRow0 = g.Reg(ptx.U32)
	g.Emit("mad.lo.u32", r.yRow0, h, ptx.Imm(int64(rc.HeadDim)), i0)
	r.kvHead0 = g.op3("sub.u32", ptx.U32, h, ptx.Imm(int64(rc.Heads)))
	vh := g.op3("sub.u32", ptx.U32, r.kvHead0, ptx.Imm(int64(rc.KVHeads)))
	g.Emit("selp.b32", r.kvHead0, vh, r.kvHead0, r.kind.v)
	g.Emit("mad.lo.u32", r.kvHead0, r.kvHead0, ptx.Imm(int64(rc.HeadDim)), i0)
	regs := c.Rows / 2
	tokens, of := wgTokens(regs)
	r.cos, r.sin, r.kvElem = g.Regs(ptx.F32, regs), g.Regs(ptx.F32, regs), g.Regs(ptx.U32, len(tokens))
	first := g.cmp("lt", ptx.U32, g.tid, ptx.Imm(wgThreads/2))
	g.when(first, false, func() {
		tok := g.op3("shl.b32", ptx.U32, g.t, ptx.Imm(1))
		lastRow := g.op3("sub.u32", ptx.U32, g.rows, ptx.Imm(1))
		pair := g.op3("shr.u32", ptx.U32, g.tid, ptx.Imm(5))
		g.Emit("mad.lo.u32", pair, pair, ptx.Imm(16), g.gg)
		g.Emit("add.u32", pair, pair, i0)
		pos, seq := make([]ptx.Reg, len(tokens)), make([]ptx.Reg, len(tokens))
		for j, t := range tokens {
			row := g.op3("add.u32", ptx.U32, tok, ptx.Imm(int64(t)))
			g.Emit("min.u32", row, row, lastRow)
			pos[j] = loadU32(g.emitter, ptx.Addr{Base: g.byteAddr(p["pos"], row, 4)})
			seq[j] = loadU32(g.emitter, ptx.Addr{Base: g.byteAddr(p["seq"], row, 4)})
		}
		for i := range regs {
			ti := g.Reg(ptx.U32)
			g.Emit("add.u32", ti, pair, ptx.Imm(int64(8*(i/2%2))))
			g.Emit("mad.lo.u32", ti, pos[of[i]], ptx.Imm(int64(half)), ti)
			g.Emit("ld.global.f32", r.cos[i], ptx.Addr{Base: g.byteAddr(p["cos"], ti, 4)})
			g.Emit("ld.global.f32", r.sin[i], ptx.Addr{Base: g.byteAddr(p["sin"], ti, 4)})
		}
		// Only k and v heads write the cache: a q head's CTA skips the block table.
		g.when(r.kind.q, true, func() {
			for j := range tokens {
				slot := g.kvSlot(rc, p["block_table"], seq[j], pos[j])
				g.Emit("mul.lo.u32", r.kvElem[j], slot, ptx.Imm(int64(rc.KVHeads*rc.HeadDim)))
			}
		})
	})
}

// wgStoreRope rotates and stores the CTA's pairs as rope_kv does, instruction for
// instruction: warps 0-1 hold each pair's first element (the head's first half) and take its
// second from warps 2-3 (wgSecondHalf); a q or k head's pair is rotated into y, a k head's
// also into the cache, a v head's stored as it is into y and the cache.
func (g *gcGen) wgStoreRope(acc []ptx.Reg) {
	c, r := g.c, g.rope
	rc := *c.Rope
	half, kvs := rc.HeadDim/2, rc.KVDtype.Bytes()
	at, done := g.wgSecondHalf(acc)
	_, of := wgTokens(len(acc))
	second := g.Regs(ptx.F32, 4)
	tok := g.op3("shl.b32", ptx.U32, g.t, ptx.Imm(1))
	pair := g.op3("shr.u32", ptx.U32, g.tid, ptx.Imm(5))
	g.Emit("mul.lo.u32", pair, pair, ptx.Imm(16))
	g.Emit("add.u32", pair, pair, g.gg)
	for q := range len(acc) / 4 {
		g.Emit("ld.shared.v4.f32", ptx.Vec(second), ptx.Addr{Base: at, Offset: int64(q * wgThreads / 2 * 16)})
		for k, x1 := range second {
			i := 4*q + k
			x0 := acc[i]
			row := g.op3("add.u32", ptx.U32, tok, ptx.Imm(int64(8*(i/4)+i%2)))
			col := g.op3("add.u32", ptx.U32, pair, ptx.Imm(int64(8*(i/2%2))))
			in := g.cmp("lt", ptx.U32, row, g.rows)
			g.when(in, false, func() {
				yi := g.op3("add.u32", ptx.U32, r.yRow0, col)
				g.Emit("mad.lo.u32", yi, row, ptx.Imm(int64(c.N)), yi)
				y0 := g.byteAddr(g.y, yi, 4)
				ki := g.op3("add.u32", ptx.U32, r.kvHead0, col)
				g.Emit("add.u32", ki, ki, r.kvElem[of[i]])
				g.storeRopePair(rc.KVDtype, half, x0, x1, r.cos[i], r.sin[i], ptx.Addr{Base: y0}, ptx.Addr{Base: y0, Offset: int64(4 * half)},
					func() ptx.Reg { return g.byteAddr(r.params["kcache"], ki, kvs) }, func() ptx.Reg { return g.byteAddr(r.params["vcache"], ki, kvs) }, r.kind.q, r.kind.v)
			})
		}
	}
	g.Label(done)
}
