package codegen

import (
	"cmp"
	"fmt"

	"xmix/bundle"
	"xmix/ptx"
)

// The gated copy-engine GEMM's wide form, for decode buckets of 64 and 128 rows (gcLayout's
// GatedWide): the gate/up projection and its activation as one launch, a CTA per Wide output
// columns, in one wave. The other warpgroup forms are swapped (W is wgmma's A, 64 columns a
// CTA, x its B), and at 128 rows that lost twice over: gate/up's 448 tiles of 64 columns take
// 3.4 waves, and every tile reads all of x (twice its W's bytes) from L2 again, so that kernel
// took 109.7 us a layer where cuBLASLt's GEMM and the activation kernel took 74 (session 53,
// testsuite/gpu/RESULTS.md). Here x is A (64 rows a warpgroup, one warpgroup per 64 rows) and
// W is B: Wide rows of gate and the same Wide rows of up, one wgmma.m64n{2*Wide}k16, so a
// CTA reads x once for all its columns. On Llama-3.1-8B's gate/up (14336 columns of act)
// Wide is 112: 128 CTAs, one wave of the H200's 132 SMs, each streaming 1.8 MB of W.
//
// Ring. A stage is one box of K (gcBoxK): gate's Wide rows and up's stacked (the 128-byte
// swizzle's pattern repeats every 8 rows, so two boxes are one canonical K-major operand of
// 2*Wide rows) and x's box of every row, all 1024-byte aligned. A producer warp (past the
// warpgroups) asks for W of the first stages before the grid ahead ends and x after, then
// refills each slot once both warpgroups have read it (their free mbarrier, freeSlot), as the
// shared-x form's producer does.
//
// Sums. Warp w of warpgroup h holds x rows 64h + 16w + g (+8) and register i column 8*(i/4)
// + 2t + i%2 of the CTA's 2*Wide (lane (g, t)): registers i < Wide/2 are gate's columns, and
// register i + Wide/2 is up's of the same column, so each thread pairs its own registers.

// wideGatedFor is GatedCopyFor's kernel in the wide form: the fewest output columns a CTA
// (wideCols) that fill no more than the SMs, a ring of as many slots as asked (slots > 0),
// else wgWideSlots, and never more than fit.
func wideGatedFor(k, n, rows, slots int, act string) (GemmCopyConfig, error) {
	c := GemmCopyConfig{K: k, N: n, Rows: rows, Split: 1, Act: act, Wide: wideCols(n / 2)}
	if n%2 != 0 || c.Wide == 0 {
		return GemmCopyConfig{}, fmt.Errorf("copy-engine GEMM with an activation, wide form: N=%d: want twice a width with a divisor that is a multiple of 8, at most %d, in at most %d tiles", n, wgMaxN/2, gcSMs)
	}
	if k <= 0 || k%gcBoxK != 0 {
		return GemmCopyConfig{}, fmt.Errorf("copy-engine GEMM with an activation, wide form: K=%d must be a positive multiple of %d", k, gcBoxK)
	}
	c.Stages = min(c.kStages(), cmp.Or(max(slots, 0), wgWideSlots), c.fitSlots(), gcBars/16)
	if err := wideErr(c); err != nil {
		return GemmCopyConfig{}, err
	}
	return c, nil
}

// wideCols is the wide form's output columns a CTA for an activation width of width: the
// fewest, a multiple of 8 (wgmma's N steps, and up's register pairs gate's) and at most
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

// wideErr says why c is no wide-form configuration.
func wideErr(c GemmCopyConfig) error {
	if !c.warpgroup() || c.Act == "" || c.Split != 1 || c.Share > 1 || c.Tiles > 1 || c.Rope != nil || c.NextAtAsk ||
		c.Wide%8 != 0 || c.Wide <= 0 || 2*c.Wide > wgMaxN || c.N%(2*c.Wide) != 0 || c.Rows%wgRows != 0 || c.consumers() > wgMaxConsumers ||
		c.Stages < 1 || 2*c.Stages > gcBars/8 || c.shared() > bundle.MaxDynamicShared {
		return fmt.Errorf("copy-engine GEMM with an activation, wide form: bad configuration %+v", c)
	}
	return nil
}

// wideMainLoop multiplies the CTA's stages in order, slot by slot: warpgroup h its rows
// 64h.. of x by the slot's 2*Wide W rows, then frees the slot for the producer.
func (g *gcGen) wideMainLoop() {
	c := g.c
	acc := g.Regs(ptx.F32, c.Wide)
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
// is not 0), and bf16 of it into y_bf16 (where that is not 0), as wgStore does: register i <
// Wide/2 (gate) with i + Wide/2 (up), at x row 64h + 16w + g + 8*(i/2 % 2) and column col0 +
// 8*(i/4) + 2t + i%2, two neighbouring columns a store.
func (g *gcGen) wideStoreGated(acc []ptx.Reg) {
	c := g.c
	row0 := g.op3("shr.u32", ptx.U32, g.tid, ptx.Imm(5)) // warpgroup h and warp w: 4h + w
	g.Emit("mad.lo.u32", row0, row0, ptx.Imm(16), g.gg)
	col := g.op3("shl.b32", ptx.U32, g.t, ptx.Imm(1))
	g.Emit("add.u32", col, col, g.col0)
	act := actOfOp(c.Act)
	half := c.Wide / 2
	for i := 0; i < half; i += 2 {
		row := g.op3("add.u32", ptx.U32, row0, ptx.Imm(int64(8*(i/2%2))))
		idx := g.Reg(ptx.U32)
		g.Emit("mad.lo.u32", idx, row, ptx.Imm(int64(c.N/2)), col)
		g.Emit("add.u32", idx, idx, ptx.Imm(int64(8*(i/4))))
		v := []ptx.Reg{gateAct(g.emitter, act, acc[i], acc[i+half]), gateAct(g.emitter, act, acc[i+1], acc[i+1+half])}
		in := g.cmp("lt", ptx.U32, row, g.rows)
		store := g.Reg(ptx.Pred)
		g.Emit("and.pred", store, in, g.yOn)
		g.EmitIf(store, false, "st.global.v2.f32", ptx.Addr{Base: g.byteAddr(g.y, idx, 4)}, ptx.Vec(v))
		h := g.Reg(ptx.B32)
		g.Emit("cvt.rn.bf16x2.f32", h, v[1], v[0])
		g.Emit("and.pred", in, in, g.ybOn)
		g.EmitIf(in, false, "st.global.b32", ptx.Addr{Base: g.byteAddr(g.yb, idx, 2)}, h)
	}
}
