package codegen

import (
	"cmp"
	"fmt"
	"slices"

	"xmix/bundle"
	"xmix/ptx"
)

// The copy-engine GEMM's wide form, for decode buckets of 64 and 128 rows (gcLayout.Wide):
// a CTA per Wide output columns, in one wave. The other warpgroup forms are swapped (W is
// wgmma's A, 64 columns a CTA, x its B), and at 128 rows that loses twice over: the 8B's
// gate/up has 448 tiles of 64 columns, 3.4 waves, and every tile reads all of x (twice its W's
// bytes) from L2 again, so its gated kernel took 109.7 us a layer where cuBLASLt's GEMM and
// the activation kernel took 74 (session 53, testsuite/gpu/RESULTS.md). Here x is A (one
// warpgroup per 64 rows) and the CTA's W rows are B, one wgmma.m64n{W rows}k16, so a CTA
// reads x once for all its columns.
//   - Gated (Act): Wide rows of gate and the same Wide rows of up. On Llama-3.1-8B's gate/up
//     (14336 columns of act) Wide is 112: 128 CTAs, one wave of the H200's 132 SMs, each
//     streaming 1.8 MB of W. At 128 rows (the layout's Share) two neighbouring tiles share x:
//     each asks for its 64 rows of a stage's x, multicast to both (askSharedX), and a slot is
//     refilled once all four warpgroups have read it, so L2 serves x once per pair: 64 MB a
//     step of the 8B's gate/up instead of 128, beside 235 MB of W.
//   - Plain: Wide rows of W, K split over a cluster of Split CTAs where the column tiles alone
//     would be few (wideSplit), the ranks' sums added slice by slice (wideStore).
//   - Rope: the q/k/v projection with rope_kv's rotation and KV write (wideStoreRope): Wide
//     pairs' first W rows (a head's first half), then their second rows, in boxes that never
//     cross a head (wBoxRows), so register i + Wide/2 holds the partner of register i's
//     element. K splits as the plain form's, each rank owning whole pairs. On Llama-3.1-8B at
//     128 rows: 96 pairs a CTA (three boxes of 32 a half) over 4 ranks, 128 CTAs, as many as
//     the plain form's 192 columns over 4.
//
// Ring. A stage is one box of K (gcBoxK): the W rows (with Act gate's and up's stacked: the
// 128-byte swizzle's pattern repeats every 8 rows, so two boxes are one canonical K-major
// operand) and x's box of every row, all 1024-byte aligned. A producer warp (past the
// warpgroups) asks for W of the first stages before the grid ahead ends and x after, then
// refills each slot once every warpgroup has read it (their free mbarrier, freeSlot), as the
// shared-x form's producer does.
//
// Sums. Warp w of warpgroup h holds x rows 64h + 16w + g (+8) and register i column 8*(i/4)
// + 2t + i%2 of the CTA's W rows (lane (g, t)). With Act registers i < Wide/2 are gate's
// columns and register i + Wide/2 is up's of the same column, so each thread pairs its own
// registers.

// wideGatedFor is GatedCopyFor's kernel in the wide form: the fewest output columns a CTA
// (wideCols) that fill no more than the SMs, a ring of as many slots as asked (slots > 0),
// else wgWideSlots, and never more than fit.
func wideGatedFor(k, n, rows, slots int, act string) (GemmCopyConfig, error) {
	c := GemmCopyConfig{K: k, N: n, Rows: rows, Split: 1, Act: act, Wide: wideCols(n / 2)}
	if n%2 != 0 || c.Wide == 0 {
		return GemmCopyConfig{}, fmt.Errorf("copy-engine GEMM with an activation, wide form: N=%d: want twice a width with a divisor that is a multiple of 8, at most %d, in at most %d tiles", n, wgMaxN/2, targetSMs)
	}
	// Neighbouring tiles share x where the layout says so and they pair up: each asks for its
	// rows of a stage's x, multicast to both, so L2 serves x once per pair.
	if share := c.layout().Share; share > 1 && n/c.wRows()%share == 0 && rows%(share*8) == 0 {
		c.Share = share
	}
	return c.wideRing(slots)
}

// WideCopyFor is the plain copy-engine GEMM of K x N in the wide form for rows rows (a
// layout's with Wide; xmixc build --copy-gemm-wide): the CTA's columns and the K split
// (wideSplit) that make the most CTAs of one wave, a ring of as many slots as asked (slots >
// 0), else wgWideSlots, and never more than fit; or an error saying why there is none.
func WideCopyFor(k, n, rows, slots int) (GemmCopyConfig, error) {
	if l := gcLayoutOf(rows); l == nil || !l.Wide {
		return GemmCopyConfig{}, fmt.Errorf("copy-engine GEMM, wide form: %d rows, want one of the layouts' with it", rows)
	}
	if k <= 0 || k%gcBoxK != 0 {
		return GemmCopyConfig{}, fmt.Errorf("copy-engine GEMM, wide form: K=%d must be a positive multiple of %d", k, gcBoxK)
	}
	c := GemmCopyConfig{K: k, N: n, Rows: rows}
	c.Wide, c.Split = wideSplit(k, n, 1, rows)
	if c.Wide == 0 {
		return GemmCopyConfig{}, fmt.Errorf("copy-engine GEMM, wide form: N=%d: want N with a divisor that is a multiple of 8 up to %d in at most %d tiles", n, wgMaxN, targetSMs)
	}
	return c.wideRing(slots)
}

// wideRopeFor is RopeCopyFor's kernel in the wide form: the pairs a CTA and the K split
// (wideSplit) that make the most CTAs of one wave, a ring of as many slots as asked (slots >
// 0), else wgWideSlots, and never more than fit.
func wideRopeFor(k, n, rows, slots int, rc RopeConfig) (GemmCopyConfig, error) {
	c := GemmCopyConfig{K: k, N: n, Rows: rows, Rope: &rc}
	c.Wide, c.Split = wideSplit(k, n/2, 2, rows)
	if c.Wide == 0 {
		return GemmCopyConfig{}, fmt.Errorf("copy-engine GEMM with rope_kv, wide form: N=%d: want N/2 with a divisor that is a multiple of 8 up to %d in at most %d tiles", n, wgMaxN/2, targetSMs)
	}
	return c.wideRing(slots)
}

// wBoxRows is the rows of one of the CTA's W boxes: its output columns, but in the wide form
// with Rope the most that divide both its pairs and half a head, so that no box crosses a
// head (a multiple of 8, so that boxes stack under the swizzle: pairs are, and half a head a
// multiple of 32, ropeCopyErr).
func (c GemmCopyConfig) wBoxRows() int {
	if c.Wide > 0 && c.Rope != nil {
		return gcd(c.Wide, c.Rope.HeadDim/2)
	}
	return c.yCols()
}

func gcd(a, b int) int {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

// wideRing gives the wide configuration c its ring (slots as asked, else wgWideSlots, at most
// those that fit) and checks it.
func (c GemmCopyConfig) wideRing(slots int) (GemmCopyConfig, error) {
	if c.K <= 0 || c.K%(c.Split*gcBoxK) != 0 {
		return GemmCopyConfig{}, fmt.Errorf("copy-engine GEMM, wide form: K=%d must be a positive multiple of %d", c.K, c.Split*gcBoxK)
	}
	c.Stages = min(c.kStages(), cmp.Or(max(slots, 0), wgWideSlots), c.fitSlots(), gcBars/16)
	if err := wideErr(c); err != nil {
		return GemmCopyConfig{}, err
	}
	return c, nil
}

// wideCols is the wide gated form's output columns a CTA for an activation width of width:
// the fewest, a multiple of 8 (wgmma's N steps, and up's register pairs gate's) and at most
// wgMaxN/2, that divide it into no more tiles than targetSMs; 0 if none does. Llama-3.1-8B's
// 14336: 112 (128 CTAs); Llama-3.2-1B's 8192: 64.
func wideCols(width int) int {
	for w := 8; w <= wgMaxN/2; w += 8 {
		if width%w == 0 && width/w <= targetSMs {
			return w
		}
	}
	return 0
}

// wideSplit is the wide form's outputs a CTA and K split for a K-deep GEMM of rows rows and n
// outputs of per W rows each (1, or with Rope 2: a pair's): of the outputs a CTA (a multiple
// of 8 per rank, at most wgMaxN W rows, dividing n) and splits (1, 2 or 4, dividing K into
// whole boxes) that fill no more than the SMs, those with the most CTAs, and of them the
// fewest bytes read from L2 besides W: every column tile's x (rows x K bf16) and every
// rank's sums sent to the others (rows x n*per f32 a rank but one). Llama-3.1-8B at 128
// rows: o and down 128 columns over 4 ranks, q/k/v 192 over 4 (128 CTAs each). (0, 0) if
// none fits.
func wideSplit(k, n, per, rows int) (cols, split int) {
	best, bestBytes := 0, 0
	for s := 1; s <= wgMaxSplit; s *= 2 {
		for w := 8 * s; w*per <= wgMaxN; w += 8 * s {
			ctas := n / w * s
			if n%w != 0 || k%(s*gcBoxK) != 0 || ctas > targetSMs {
				continue
			}
			bytes := n/w*rows*k*2 + (s-1)*rows*n*per*4
			if ctas > best || ctas == best && bytes < bestBytes {
				best, bestBytes, cols, split = ctas, bytes, w, s
			}
		}
	}
	return cols, split
}

// wideErr says why c is no wide-form configuration.
func wideErr(c GemmCopyConfig) error {
	gated := c.Act != ""
	if !c.warpgroup() || !c.layout().Wide || c.Tiles > 1 || c.NextAtAsk || c.Wide <= 0 || c.wRows() > wgMaxN ||
		gated && (c.Split != 1 || c.Rope != nil || c.Wide%8 != 0 || c.Share > 1 && (c.N/c.wRows()%c.Share != 0 || c.Rows%(c.Share*8) != 0)) ||
		!gated && (c.Split < 1 || c.Split > wgMaxSplit || c.Wide%(8*c.Split) != 0 || c.Share > 1) ||
		c.Rope != nil && ropeCopyErr(*c.Rope, c.N) != nil ||
		c.N%c.wRows() != 0 || c.Rows%wgRows != 0 || c.consumers() > wgMaxConsumers ||
		c.Stages < 1 || 2*c.Stages > gcBars/8 || c.shared() > bundle.MaxDynamicShared {
		return fmt.Errorf("copy-engine GEMM, wide form: bad configuration %+v", c)
	}
	return nil
}

// wideMainLoop multiplies the CTA's stages in order, slot by slot: warpgroup h its rows
// 64h.. of x by the slot's W rows, then frees the slot for the producer.
func (g *gcGen) wideMainLoop() {
	c := g.c
	acc := g.Regs(ptx.F32, c.wRows()/2)
	for _, a := range acc {
		g.Emit("mov.f32", a, ptx.F32Imm(0))
	}
	g.acc = [][]ptx.Reg{acc}
	// The warpgroup's x rows start wgRows rows of 128 bytes further per warpgroup.
	xRows := g.op3("div.u32", ptx.U32, g.tid, ptx.Imm(wgThreads))
	g.Emit("mul.lo.u32", xRows, xRows, ptx.Imm(int64(wgRows*2*gcBoxK>>4)))
	hi := g.imm32(wgDescHi)
	stage, slot, phase := g.imm32(0), g.imm32(0), g.imm32(0)
	top := g.NewLabel("stage")
	g.Label(top)
	g.wait(g.barAddr(slot), phase)
	base := g.op3("shr.u32", ptx.U32, g.slotAddr(g.slot0, slot), ptx.Imm(4))
	g.Emit("add.u32", base, base, ptx.Imm(wgDescLo))
	xBase := g.op3("add.u32", ptx.U32, base, xRows)
	lo, da, db := g.Reg(ptx.U32), g.Reg(ptx.B64), g.Reg(ptx.B64)
	g.Emit("wgmma.fence.sync.aligned")
	for j := range gcBoxK / wgKStep {
		step := int64(j * wgKStep * 2)
		g.Emit("add.u32", lo, xBase, ptx.Imm((int64(c.wBytes())+step)>>4))
		g.Emit("mov.b64", da, ptx.Vec{lo, hi})
		g.Emit("add.u32", lo, base, ptx.Imm(step>>4))
		g.Emit("mov.b64", db, ptx.Vec{lo, hi})
		g.Emit(wgmmaOp(c.wRows()), ptx.Vec(acc), da, db, ptx.Imm(1), ptx.Imm(1), ptx.Imm(1), ptx.Imm(0), ptx.Imm(0))
	}
	g.Emit("wgmma.commit_group.sync.aligned")
	// The slot is freed once the MMAs have read it.
	g.Emit("wgmma.wait_group.sync.aligned", ptx.Imm(0))
	g.freeSlot(stage, slot)
	g.advance(stage, slot, phase, top)
}

// wideStoreGated stores act(gate) * up of the thread's registers into y, [rows, N/2] (where y
// is not 0), and bf16 of it into y_bf16 (where that is not 0): register i < Wide/2 (gate)
// with i + Wide/2 (up).
func (g *gcGen) wideStoreGated(acc []ptx.Reg) {
	c := g.c
	act := actOfOp(c.Act)
	half := c.Wide / 2
	g.wideStoresFrom(c.N/2, 0, half, func(i int) ptx.Reg { return gateAct(g.emitter, act, acc[i], acc[i+half]) }, true)
}

// ownedRegs are the thread's registers whose sums rank owner of a K split adds and stores
// (wideStore), in runs of 4: column slice owner of the CTA's, or with Rope slice owner of its
// pairs' first elements and the same of their second.
func (c GemmCopyConfig) ownedRegs(owner int) []int {
	regs := c.wRows() / 2
	if c.Rope == nil {
		per := regs / c.Split
		return regRun(owner*per, per)
	}
	per := regs / 2 / c.Split
	return append(regRun(owner*per, per), regRun(regs/2+owner*per, per)...)
}

// regRun is the registers n, n+1, ..., n+count-1.
func regRun(n, count int) []int {
	s := make([]int, count)
	for i := range s {
		s[i] = n + i
	}
	return s
}

// wideStore stores the plain wide form's sums into y, [rows, N], or with Rope rotates them
// (wideStoreRope). With K split, rank r owns the registers ownedRegs(r) of every thread: each
// rank sends every other rank's to that owner's ring (every rank's loop has ended, so the
// rings are free: part j of partBytes, j the sender's rank less one past the owner's), and
// the owner adds the ranks' sums in rank order, so every run gives the same bits, and stores
// them.
func (g *gcGen) wideStore(acc []ptx.Reg) {
	c := g.c
	store := func(owner int, value func(i int) ptx.Reg) {
		if c.Rope != nil {
			g.wideStoreRope(owner, value)
			return
		}
		regs := c.ownedRegs(owner)
		g.wideStoresFrom(c.N, regs[0], len(regs), value, false)
	}
	if c.Split == 1 {
		store(0, func(i int) ptx.Reg { return acc[i] })
		return
	}
	per := len(acc) / c.Split
	part := func(sender, owner int) int { // senders past the owner one down
		if sender > owner {
			return sender - 1
		}
		return sender
	}
	g.Emit("barrier.cluster.arrive.release")
	g.Emit("barrier.cluster.wait.acquire")
	mine := g.Reg(ptx.U32)
	g.Emit("mad.lo.u32", mine, g.tid, ptx.Imm(int64(per*4)), g.slot0)
	for owner := range c.Split {
		g.when(g.cmp("ne", ptx.U32, g.rank, ptx.Imm(int64(owner))), false, func() {
			// This rank's part at the owner: its rank, less one past the owner.
			at := g.op3("sub.u32", ptx.U32, g.rank, ptx.Imm(1))
			g.EmitIf(g.cmp("gt", ptx.U32, g.rank, ptx.Imm(int64(owner))), true, "mov.u32", at, g.rank)
			g.Emit("mad.lo.u32", at, at, ptx.Imm(int64(c.partBytes())), mine)
			remote := g.Reg(ptx.U32)
			g.Emit("mapa.shared::cluster.u32", remote, at, ptx.Imm(int64(owner)))
			regs := c.ownedRegs(owner)
			for q := range per / 4 {
				g.Emit("st.shared::cluster.v4.f32", ptx.Addr{Base: remote, Offset: int64(16 * q)}, ptx.Vec{acc[regs[4*q]], acc[regs[4*q+1]], acc[regs[4*q+2]], acc[regs[4*q+3]]})
			}
		})
	}
	g.Emit("barrier.cluster.arrive.release")
	g.Emit("barrier.cluster.wait.acquire")
	sum := g.Regs(ptx.F32, per)
	in := g.Regs(ptx.F32, 4)
	for owner := range c.Split {
		regs := c.ownedRegs(owner)
		g.when(g.cmp("eq", ptx.U32, g.rank, ptx.Imm(int64(owner))), false, func() {
			for sender := range c.Split {
				for q := range per / 4 {
					src := []ptx.Reg{acc[regs[4*q]], acc[regs[4*q+1]], acc[regs[4*q+2]], acc[regs[4*q+3]]}
					if sender != owner {
						g.Emit("ld.shared.v4.f32", ptx.Vec(in), ptx.Addr{Base: mine, Offset: int64(part(sender, owner)*c.partBytes() + 16*q)})
						src = in
					}
					for i, v := range src {
						if sender == 0 {
							g.Emit("mov.f32", sum[4*q+i], v)
						} else {
							g.Emit("add.f32", sum[4*q+i], sum[4*q+i], v)
						}
					}
				}
			}
			store(owner, func(i int) ptx.Reg { return sum[slices.Index(regs, i)] })
		})
	}
}

// wideRow0 is the thread's first x row, 64h + 16w + g (warp w of warpgroup h, lane (g, t)),
// that of its even registers' pairs; the odd pairs' (register i with i/2 odd) is 8 on.
func (g *gcGen) wideRow0() ptx.Reg {
	row0 := g.op3("shr.u32", ptx.U32, g.tid, ptx.Imm(5)) // warpgroup h and warp w: 4h + w
	g.Emit("mad.lo.u32", row0, row0, ptx.Imm(16), g.gg)
	return row0
}

// widePrepareRope reads, before the wait (none of it is the grid ahead's: the host wrote the
// positions, slots and block table before the step, cos and sin are weights), what the
// warpgroups rotate and store with (wideStoreRope): the cos and sin of each pair their rank
// owns (ownedRegs) at its token row, and each of the thread's two token rows' first cache
// element of its KV slot (in a CTA with k or v pairs). Token rows past rows read row
// rows-1's (their results are not stored).
func (g *gcGen) widePrepareRope() {
	c, r := g.c, g.rope
	rc := *c.Rope
	half := rc.HeadDim / 2
	p := r.params
	fh := c.Wide / 2 / c.Split
	r.cos, r.sin, r.kvElem = g.Regs(ptx.F32, fh), g.Regs(ptx.F32, fh), g.Regs(ptx.U32, 2)
	g.when(g.cmp("lt", ptx.U32, g.tid, ptx.Imm(int64(c.consumers()*wgThreads))), false, func() {
		row0 := g.wideRow0()
		lastRow := g.op3("sub.u32", ptx.U32, g.rows, ptx.Imm(1))
		// Only k and v pairs write the cache: a CTA of q pairs alone skips the block table.
		kv := g.op3("add.u32", ptx.U32, g.col0, ptx.Imm(int64(c.Wide)))
		anyKV := g.cmp("gt", ptx.U32, kv, ptx.Imm(int64(rc.Heads*half)))
		var pos [2]ptx.Reg
		for j := range pos {
			row := g.op3("add.u32", ptx.U32, row0, ptx.Imm(int64(8*j)))
			g.Emit("min.u32", row, row, lastRow)
			pos[j] = loadU32(g.emitter, ptx.Addr{Base: g.byteAddr(p["pos"], row, 4)})
			g.Emit("mov.u32", r.kvElem[j], ptx.Imm(0))
			g.when(anyKV, false, func() {
				s := loadU32(g.emitter, ptx.Addr{Base: g.byteAddr(p["seq"], row, 4)})
				slot := g.kvSlot(rc, p["block_table"], s, pos[j])
				g.Emit("mul.lo.u32", r.kvElem[j], slot, ptx.Imm(int64(rc.KVHeads*rc.HeadDim)))
			})
		}
		// The rank's k-th pair: 2*fh pairs a rank on (ownedRegs), then 8*(k/4) + 2t + k%2.
		u0 := g.op3("mul.lo.u32", ptx.U32, g.rank, ptx.Imm(int64(2*fh)))
		g.Emit("add.u32", u0, u0, g.col0)
		g.Emit("mad.lo.u32", u0, g.t, ptx.Imm(2), u0)
		for k := range fh {
			ti := g.op3("add.u32", ptx.U32, u0, ptx.Imm(int64(8*(k/4)+k%2)))
			g.Emit("rem.u32", ti, ti, ptx.Imm(int64(half)))
			g.Emit("mad.lo.u32", ti, pos[k/2%2], ptx.Imm(int64(half)), ti)
			g.Emit("ld.global.f32", r.cos[k], ptx.Addr{Base: g.byteAddr(p["cos"], ti, 4)})
			g.Emit("ld.global.f32", r.sin[k], ptx.Addr{Base: g.byteAddr(p["sin"], ti, 4)})
		}
	})
}

// wideStoreRope rotates and stores the pairs rank owner owns (ownedRegs) as rope_kv does,
// instruction for instruction (storeRopePair): register i's sum, pair u's first element, with
// register i + Wide/2's, its second, at the token row of register i. Pair u is element u %
// half of head u / half.
func (g *gcGen) wideStoreRope(owner int, value func(i int) ptx.Reg) {
	c, r := g.c, g.rope
	rc := *c.Rope
	d, half, kvs := rc.HeadDim, rc.HeadDim/2, rc.KVDtype.Bytes()
	fh := c.Wide / 2 / c.Split
	row0 := g.wideRow0()
	u0 := g.Reg(ptx.U32)
	g.Emit("mad.lo.u32", u0, g.t, ptx.Imm(2), g.col0)
	for k := range fh {
		i := owner*fh + k
		row := g.op3("add.u32", ptx.U32, row0, ptx.Imm(int64(8*(k/2%2))))
		g.when(g.cmp("lt", ptx.U32, row, g.rows), false, func() {
			u := g.op3("add.u32", ptx.U32, u0, ptx.Imm(int64(2*owner*fh+8*(k/4)+k%2)))
			h := g.op3("div.u32", ptx.U32, u, ptx.Imm(int64(half)))
			e := g.op3("rem.u32", ptx.U32, u, ptx.Imm(int64(half)))
			yi := g.Reg(ptx.U32)
			g.Emit("mad.lo.u32", yi, h, ptx.Imm(int64(d)), e)
			g.Emit("mad.lo.u32", yi, row, ptx.Imm(int64(c.N)), yi)
			y0 := g.byteAddr(g.y, yi, 4)
			isQ := g.cmp("lt", ptx.U32, h, ptx.Imm(int64(rc.Heads)))
			isV := g.cmp("ge", ptx.U32, h, ptx.Imm(int64(rc.Heads+rc.KVHeads)))
			// The pair's cache element: its k or v head's, element e, in the row's slot.
			kvh := g.op3("sub.u32", ptx.U32, h, ptx.Imm(int64(rc.Heads)))
			vh := g.op3("sub.u32", ptx.U32, kvh, ptx.Imm(int64(rc.KVHeads)))
			g.Emit("selp.b32", kvh, vh, kvh, isV)
			ki := g.Reg(ptx.U32)
			g.Emit("mad.lo.u32", ki, kvh, ptx.Imm(int64(d)), e)
			g.Emit("add.u32", ki, ki, r.kvElem[k/2%2])
			g.storeRopePair(rc.KVDtype, half, value(i), value(i+c.Wide/2), r.cos[k], r.sin[k], ptx.Addr{Base: y0}, ptx.Addr{Base: y0, Offset: int64(4 * half)},
				func() ptx.Reg { return g.byteAddr(r.params["kcache"], ki, kvs) }, func() ptx.Reg { return g.byteAddr(r.params["vcache"], ki, kvs) }, isQ, isV)
		})
	}
}

// wideStoresFrom stores value(i) for the thread's registers i in [first, first+n) into y,
// [rows, width], two neighbouring columns a store: register i at x row 64h + 16w + g +
// 8*(i/2 % 2) of warp w of warpgroup h, column col0 + 8*(i/4) + 2t + i%2 (lane (g, t)). With
// act (a gated kernel's activation) y only where it is not 0, and bf16 of the values into
// y_bf16 where that is not 0.
func (g *gcGen) wideStoresFrom(width, first, n int, value func(i int) ptx.Reg, act bool) {
	row0 := g.wideRow0()
	col := g.op3("shl.b32", ptx.U32, g.t, ptx.Imm(1))
	g.Emit("add.u32", col, col, g.col0)
	for i := first; i < first+n; i += 2 {
		row := g.op3("add.u32", ptx.U32, row0, ptx.Imm(int64(8*(i/2%2))))
		idx := g.Reg(ptx.U32)
		g.Emit("mad.lo.u32", idx, row, ptx.Imm(int64(width)), col)
		g.Emit("add.u32", idx, idx, ptx.Imm(int64(8*(i/4))))
		in := g.cmp("lt", ptx.U32, row, g.rows)
		if !act {
			v := ptx.Vec{value(i), value(i + 1)}
			g.EmitIf(in, false, "st.global.v2.f32", ptx.Addr{Base: g.byteAddr(g.y, idx, 4)}, v)
			continue
		}
		// A row past the bucket's is not stored, so its activation is not computed either: in
		// a bucket served by a kernel of more rows, those rows' warps ended 5.8 us after the
		// others (H100, testsuite/gpu/RESULTS.md, session 73).
		g.when(in, false, func() {
			v := ptx.Vec{value(i), value(i + 1)}
			g.EmitIf(g.yOn, false, "st.global.v2.f32", ptx.Addr{Base: g.byteAddr(g.y, idx, 4)}, v)
			h := g.Reg(ptx.B32)
			g.Emit("cvt.rn.bf16x2.f32", h, v[1], v[0])
			g.EmitIf(g.ybOn, false, "st.global.b32", ptx.Addr{Base: g.byteAddr(g.yb, idx, 2)}, h)
		})
	}
}
