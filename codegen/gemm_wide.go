package codegen

import (
	"cmp"
	"fmt"

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
		return GemmCopyConfig{}, fmt.Errorf("copy-engine GEMM with an activation, wide form: N=%d: want twice a width with a divisor that is a multiple of 8, at most %d, in at most %d tiles", n, wgMaxN/2, gcSMs)
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
	c.Wide, c.Split = wideSplit(k, n, rows)
	if c.Wide == 0 {
		return GemmCopyConfig{}, fmt.Errorf("copy-engine GEMM, wide form: N=%d: want N with a divisor that is a multiple of 8 up to %d in at most %d tiles", n, wgMaxN, gcSMs)
	}
	return c.wideRing(slots)
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
// wgMaxN/2, that divide it into no more tiles than gcSMs; 0 if none does. Llama-3.1-8B's
// 14336: 112 (128 CTAs); Llama-3.2-1B's 8192: 64.
func wideCols(width int) int {
	for w := 8; w <= wgMaxN/2; w += 8 {
		if width%w == 0 && width/w <= gcSMs {
			return w
		}
	}
	return 0
}

// wideSplit is the plain wide form's columns a CTA and K split for a K x N GEMM of rows rows:
// of the columns (a multiple of 8 per rank, at most wgMaxN, dividing N) and splits (1, 2 or
// 4, dividing K into whole boxes) that fill no more than the SMs, those with the most CTAs,
// and of them the fewest bytes read from L2 besides W: every column tile's x (rows x K
// bf16) and every rank's sums sent to the others (rows x N f32 a rank but one). Llama-3.1-8B
// at 128 rows: o and down 128 columns over 4 ranks, q/k/v 192 over 4 (128 CTAs each).
// (0, 0) if none fits.
func wideSplit(k, n, rows int) (cols, split int) {
	best, bestBytes := 0, 0
	for s := 1; s <= wgMaxSplit; s *= 2 {
		for w := 8 * s; w <= wgMaxN; w += 8 * s {
			ctas := n / w * s
			if n%w != 0 || k%(s*gcBoxK) != 0 || ctas > gcSMs {
				continue
			}
			bytes := n/w*rows*k*2 + (s-1)*rows*n*4
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
	if !c.warpgroup() || !c.layout().Wide || c.Tiles > 1 || c.Rope != nil || c.NextAtAsk || c.Wide <= 0 ||
		gated && (c.Split != 1 || c.Wide%8 != 0 || 2*c.Wide > wgMaxN || c.Share > 1 && (c.N/c.wRows()%c.Share != 0 || c.Rows%(c.Share*8) != 0)) ||
		!gated && (c.Split < 1 || c.Split > wgMaxSplit || c.Wide%(8*c.Split) != 0 || c.Wide > wgMaxN || c.Share > 1) ||
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

// wideStore stores the plain wide form's sums into y, [rows, N]. With K split, rank r owns
// column slice r of the CTA's (registers [r*per, (r+1)*per) of every thread): each rank
// sends every other slice to its owner's ring (every rank's loop has ended, so the rings are
// free: part j of partBytes, j the sender's rank less one past the owner's), and the owner
// adds the ranks' sums in rank order, so every run gives the same bits, and stores them.
func (g *gcGen) wideStore(acc []ptx.Reg) {
	c := g.c
	if c.Split == 1 {
		g.wideStoresFrom(c.N, 0, len(acc), func(i int) ptx.Reg { return acc[i] }, false)
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
			for q := range per / 4 {
				g.Emit("st.shared::cluster.v4.f32", ptx.Addr{Base: remote, Offset: int64(16 * q)}, ptx.Vec(acc[owner*per+4*q:owner*per+4*q+4]))
			}
		})
	}
	g.Emit("barrier.cluster.arrive.release")
	g.Emit("barrier.cluster.wait.acquire")
	sum := g.Regs(ptx.F32, per)
	in := g.Regs(ptx.F32, 4)
	for owner := range c.Split {
		g.when(g.cmp("eq", ptx.U32, g.rank, ptx.Imm(int64(owner))), false, func() {
			for sender := range c.Split {
				for q := range per / 4 {
					src := acc[owner*per+4*q : owner*per+4*q+4]
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
			g.wideStoresFrom(c.N, owner*per, per, func(i int) ptx.Reg { return sum[i-owner*per] }, false)
		})
	}
}

// wideStoresFrom stores value(i) for the thread's registers i in [first, first+n) into y,
// [rows, width], two neighbouring columns a store: register i at x row 64h + 16w + g +
// 8*(i/2 % 2) of warp w of warpgroup h, column col0 + 8*(i/4) + 2t + i%2 (lane (g, t)). With
// act (a gated kernel's activation) y only where it is not 0, and bf16 of the values into
// y_bf16 where that is not 0.
func (g *gcGen) wideStoresFrom(width, first, n int, value func(i int) ptx.Reg, act bool) {
	row0 := g.op3("shr.u32", ptx.U32, g.tid, ptx.Imm(5)) // warpgroup h and warp w: 4h + w
	g.Emit("mad.lo.u32", row0, row0, ptx.Imm(16), g.gg)
	col := g.op3("shl.b32", ptx.U32, g.t, ptx.Imm(1))
	g.Emit("add.u32", col, col, g.col0)
	for i := first; i < first+n; i += 2 {
		row := g.op3("add.u32", ptx.U32, row0, ptx.Imm(int64(8*(i/2%2))))
		idx := g.Reg(ptx.U32)
		g.Emit("mad.lo.u32", idx, row, ptx.Imm(int64(width)), col)
		g.Emit("add.u32", idx, idx, ptx.Imm(int64(8*(i/4))))
		v := ptx.Vec{value(i), value(i + 1)}
		in := g.cmp("lt", ptx.U32, row, g.rows)
		if !act {
			g.EmitIf(in, false, "st.global.v2.f32", ptx.Addr{Base: g.byteAddr(g.y, idx, 4)}, v)
			continue
		}
		store := g.Reg(ptx.Pred)
		g.Emit("and.pred", store, in, g.yOn)
		g.EmitIf(store, false, "st.global.v2.f32", ptx.Addr{Base: g.byteAddr(g.y, idx, 4)}, v)
		h := g.Reg(ptx.B32)
		g.Emit("cvt.rn.bf16x2.f32", h, v[1], v[0])
		g.Emit("and.pred", in, in, g.ybOn)
		g.EmitIf(in, false, "st.global.b32", ptx.Addr{Base: g.byteAddr(g.yb, idx, 2)}, h)
	}
}
