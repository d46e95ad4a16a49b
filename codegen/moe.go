package codegen

import (
	"fmt"
	"math"

	"xmix/bundle"
	"xmix/ir"
	"xmix/ops"
	"xmix/ptx"
)

// Mixture-of-experts kernels (Mixtral). The router is a row kernel over the E logits, so the
// router_logits MI ops run through the same miSet machinery as every fused op; its two
// templates are registered below next to the others. The expert kernels group the batch's
// (row, slot) pairs by expert: a block compacts the pairs that picked its expert into shared
// memory and each warp streams one output column of that expert's weights once for a group
// of up to moeGroup pairs, keeping a register accumulator per pair. So a launch reads each
// picked expert's weights ceil(pairs on it / moeGroup) times (once per expert at decode
// batches up to moeGroup rows), where reading per (row, slot) read B*k experts' weights;
// experts no row picked are not read at all.

// RouterConfig configures Router.
type RouterConfig struct {
	Hidden, Experts, TopK int
	WDtype                ptx.Type
	Ops                   []ir.MI // at router_logits, over rows of Experts logits
}

// Launch is one block per row.
func (c RouterConfig) Launch(rows int) ops.Launch { return rowLaunch(c.Experts, rows) }

// Router generates the router kernel: per row, the logits x·w_e (each warp takes experts
// warp, warp+W, ..., its lanes striding Hidden), the MI ops, then one thread does softmax and
// top-k over the E logits in shared memory exactly as ops.Route does. Parameters: x, w, idx,
// wts, ctl_mask, [ctl_tokens], [ctl_gen], [ctl_seq], [ctl_latch], MI parameters.
func Router(name string, c RouterConfig) (*Kernel, error) {
	return named("moe_router", name, c, router)
}

func router(name string, c RouterConfig) (*Kernel, error) {
	dt, ok := dtypeName(c.WDtype)
	if !ok {
		return nil, fmt.Errorf("weight dtype %s is not f32 or bf16", c.WDtype)
	}
	if c.Experts < 1 || c.Experts > ops.MaxExperts || c.TopK < 1 || c.TopK > c.Experts || c.Hidden <= 0 {
		return nil, fmt.Errorf("%d experts, top-%d, hidden %d: want 1 <= top-k <= experts <= %d", c.Experts, c.TopK, c.Hidden, ops.MaxExperts)
	}
	r, err := newRowEmitter(name, c.Experts)
	if err != nil {
		return nil, err
	}
	E, K, H := c.Experts, c.TopK, c.Hidden
	x := r.param("x", ptx.U64)
	w := r.param("w", ptx.U64)
	idx := r.param("idx", ptx.U64)
	wts := r.param("wts", ptx.U64)
	mi, err := declareMI(r, c.Ops)
	if err != nil {
		return nil, err
	}
	r.begin()
	mi.loadCtl(r)
	logits := r.DeclareShared("logits", ptx.F32, E)
	taken := r.DeclareShared("taken", ptx.U32, E)

	lane := r.op3("and.b32", ptx.U32, r.tid, ptx.Imm(31))
	warp := r.op3("shr.u32", ptx.U32, r.tid, ptx.Imm(5))
	xrow := r.byteAddr(x, r.row, 4*H)
	e := r.Reg(ptx.U32)
	r.forLoop(e, warp, ptx.Imm(int64(E)), ptx.Imm(int64(r.threads/32)), func() {
		wrow := r.byteAddr(w, e, H*c.WDtype.Bytes())
		acc := r.f32(0)
		i := r.Reg(ptx.U32)
		r.forLoop(i, lane, ptx.Imm(int64(H)), ptx.Imm(32), func() {
			xv := r.Reg(ptx.F32)
			r.Emit("ld.global.f32", xv, ptx.Addr{Base: r.byteAddr(xrow, i, 4)})
			wv := r.loadAt(ptx.Addr{Base: r.byteAddr(wrow, i, c.WDtype.Bytes())}, c.WDtype)
			r.Emit("fma.rn.f32", acc, xv, wv, acc)
		})
		r.warpReduce(acc, "add")
		r.EmitIf(r.cmp("eq", ptx.U32, lane, ptx.Imm(0)), false, "st.shared.f32", ptx.Addr{Base: r.sharedAddr(logits, e, 4)}, acc)
	})
	r.Emit("bar.sync", ptx.Imm(0))

	// Thread t holds logit t (per is 1: at most 64 experts over 128 threads).
	p := r.elemPred(0, nil)
	l := r.f32(0)
	r.emitMaybe(p, "ld.shared.f32", l, ptx.Addr{Base: r.sharedAddr(logits, r.tid, 4)})
	mi.emit(r, 0, []ptx.Reg{l}, nil)
	r.emitMaybe(p, "st.shared.f32", ptx.Addr{Base: r.sharedAddr(logits, r.tid, 4)}, l)
	r.Emit("bar.sync", ptx.Imm(0))

	r.when(r.cmp("eq", ptx.U32, r.tid, ptx.Imm(0)), false, func() {
		r.route(logits, taken, idx, wts, E, K)
	})
	return finish(r.Kernel, "moe_router", ops.MoERouterAttrs{Hidden: H, Experts: E, TopK: K, WDtype: dt, Ops: mi.ref[0]})
}

// route is ops.Route on one thread: logits (shared, E) become probabilities in place, and
// the row's k picks land in idx and wts.
func (r *rowEmitter) route(logits, taken ptx.Sym, idx, wts ptx.Reg, E, K int) {
	e := r.Reg(ptx.U32)
	at := func() ptx.Addr { return ptx.Addr{Base: r.sharedAddr(logits, e, 4)} }
	m := r.f32(float32negInf())
	r.forLoop(e, ptx.Imm(0), ptx.Imm(int64(E)), ptx.Imm(1), func() {
		v := r.Reg(ptx.F32)
		r.Emit("ld.shared.f32", v, at())
		// max.f32 returns the number when one operand is NaN, as Route's comparison does.
		r.Emit("max.f32", m, m, v)
		r.Emit("st.shared.u32", ptx.Addr{Base: r.sharedAddr(taken, e, 4)}, ptx.Imm(0))
	})
	s := r.f32(0)
	r.forLoop(e, ptx.Imm(0), ptx.Imm(int64(E)), ptx.Imm(1), func() {
		v := r.Reg(ptx.F32)
		a := at()
		r.Emit("ld.shared.f32", v, a)
		r.Emit("sub.rn.f32", v, v, m)
		r.Emit("mul.rn.f32", v, v, ptx.F32Imm(1.4426950408889634))
		r.Emit("ex2.approx.f32", v, v)
		r.Emit("st.shared.f32", a, v)
		r.Emit("add.rn.f32", s, s, v)
	})
	r.forLoop(e, ptx.Imm(0), ptx.Imm(int64(E)), ptx.Imm(1), func() {
		v := r.Reg(ptx.F32)
		a := at()
		r.Emit("ld.shared.f32", v, a)
		r.Emit("div.rn.f32", v, v, s)
		r.Emit("st.shared.f32", a, v)
	})
	tot := r.f32(0)
	best := make([]ptx.Reg, K)
	bv := make([]ptx.Reg, K)
	for i := range K {
		best[i] = r.imm32(-1)
		bv[i] = r.f32(float32negInf())
		r.forLoop(e, ptx.Imm(0), ptx.Imm(int64(E)), ptx.Imm(1), func() {
			v := r.Reg(ptx.F32)
			r.Emit("ld.shared.f32", v, at())
			t := r.Reg(ptx.U32)
			r.Emit("ld.shared.u32", t, ptx.Addr{Base: r.sharedAddr(taken, e, 4)})
			// take = !taken[e] && (best < 0 || v > bv)
			take := r.cmp("eq", ptx.U32, best[i], ptx.Imm(-1))
			r.Emit("or.pred", take, take, r.cmp("gt", ptx.F32, v, bv[i]))
			r.Emit("and.pred", take, take, r.cmp("eq", ptx.U32, t, ptx.Imm(0)))
			r.Emit("selp.b32", best[i], e, best[i], take)
			r.Emit("selp.f32", bv[i], v, bv[i], take)
		})
		r.Emit("st.shared.u32", ptx.Addr{Base: r.sharedAddr(taken, best[i], 4)}, ptx.Imm(1))
		r.Emit("add.rn.f32", tot, tot, bv[i])
	}
	base := r.Reg(ptx.U32)
	r.Emit("mul.lo.u32", base, r.row, ptx.Imm(int64(K)))
	for i := range K {
		q := r.op3("add.u32", ptx.U32, base, ptx.Imm(int64(i)))
		r.Emit("st.global.u32", ptx.Addr{Base: r.byteAddr(idx, q, 4)}, best[i])
		wv := r.op3("div.rn.f32", ptx.F32, bv[i], tot)
		r.Emit("st.global.f32", ptx.Addr{Base: r.byteAddr(wts, q, 4)}, wv)
	}
}

func float32negInf() float32 { return float32(math.Inf(-1)) }

// MoEConfig configures ExpertGateUp and ExpertDown.
type MoEConfig struct {
	Hidden, Inter, Experts, TopK int
	WDtype                       ptx.Type
}

// The expert kernels group the batch's (row, slot) pairs by expert. A block takes a tile of
// moeWarps output columns (one per warp) and, for an expert, compacts the pairs that picked it
// into a shared list in pair order; each warp then streams its column's weights once per
// group of up to moeGroup pairs, its lanes striding the reduction with 16-byte loads and
// keeping one accumulator per pair (two in gate/up). Pairs are taken from a window of the
// batch at a time (moeGateUpWindow pairs, moeDownPairs for down, whose window holds whole
// rows), so shared memory stays bounded for any batch.
const (
	moeWarps        = 8
	moeGroup        = 8
	moeGateUpWindow = 1024
	moeDownPairs    = 256
)

// The grids keep the reference ops' y extents (rows*TopK slots for gate/up, rows for down);
// x is sized so that the blocks, numbered y*gridX + x, cover the work items: (expert,
// column tile) for gate/up, column tiles for down. The few blocks past the last item leave.

// LaunchGateUp is the grid of ExpertGateUp over rows rows: Experts * Inter/moeWarps items over
// rows*TopK slots.
func (c MoEConfig) LaunchGateUp(rows int) ops.Launch {
	q := max(1, rows*c.TopK)
	items := c.Experts * tiles(c.Inter)
	return ops.Launch{Grid: [3]int{(items + q - 1) / q, q, 1}, Block: [3]int{32 * moeWarps, 1, 1}}
}

// LaunchDown is the grid of ExpertDown over rows rows: Hidden/moeWarps column tiles over rows.
func (c MoEConfig) LaunchDown(rows int) ops.Launch {
	r := max(1, rows)
	return ops.Launch{Grid: [3]int{(tiles(c.Hidden) + r - 1) / r, r, 1}, Block: [3]int{32 * moeWarps, 1, 1}}
}

// tiles is the number of moeWarps-column tiles over n columns.
func tiles(n int) int { return (n + moeWarps - 1) / moeWarps }

func (c MoEConfig) attrs() (ops.MoEAttrs, error) {
	dt, ok := dtypeName(c.WDtype)
	if !ok {
		return ops.MoEAttrs{}, fmt.Errorf("weight dtype %s is not f32 or bf16", c.WDtype)
	}
	if c.Hidden <= 0 || c.Inter <= 0 || c.Experts < 1 || c.Experts > ops.MaxExperts || c.TopK < 1 || c.TopK > c.Experts {
		return ops.MoEAttrs{}, fmt.Errorf("hidden %d, inter %d, %d experts, top-%d", c.Hidden, c.Inter, c.Experts, c.TopK)
	}
	return ops.MoEAttrs{Hidden: c.Hidden, Inter: c.Inter, Experts: c.Experts, TopK: c.TopK, WDtype: dt}, nil
}

// moeGen is what both expert kernels share: the thread's place in the block and the shared
// list of the pairs that picked the expert at hand.
type moeGen struct {
	emitter
	c               MoEConfig
	tid, lane, warp ptx.Reg
	list, counts    ptx.Sym
}

func newMoEGen(name string, c MoEConfig) *moeGen {
	g := &moeGen{emitter: newEmitter(name), c: c}
	g.MaxNTid = 32 * moeWarps
	return g
}

// begin reads the thread's place and declares the pair list (capacity pairs) and the
// per-warp counts the compaction exchanges. It returns the block's work item, numbered
// y*gridX + x.
func (g *moeGen) begin(capacity int) ptx.Reg {
	g.tid = g.special(ptx.TidX)
	g.lane = g.op3("and.b32", ptx.U32, g.tid, ptx.Imm(31))
	g.warp = g.op3("shr.u32", ptx.U32, g.tid, ptx.Imm(5))
	g.list = g.DeclareShared("pairs", ptx.U32, capacity)
	g.counts = g.DeclareShared("counts", ptx.U32, moeWarps)
	item := g.Reg(ptx.U32)
	g.Emit("mad.lo.u32", item, g.special(ptx.CtaidY), g.special(ptx.NCtaidX), g.special(ptx.CtaidX))
	return item
}

// compact writes to the list, in increasing order, the pairs p in [lo, hi) whose expert
// idx[p] (clamped to the last expert) is ex, and returns their count; every thread of the
// block must call it, and all get the same count. Each thread tests one pair per pass; a
// warp's matches are gathered with an OR over the warp's bits (a ballot), and the warps'
// counts are added in warp order through shared memory, so the order is the pairs' own.
func (g *moeGen) compact(idx, ex, lo, hi ptx.Reg) ptx.Reg {
	n := g.imm32(0)
	one := g.op3("shl.b32", ptx.B32, g.imm32(1), g.lane)
	below := g.op3("sub.u32", ptx.U32, one, ptx.Imm(1))
	p0 := g.Reg(ptx.U32)
	g.forLoop(p0, lo, hi, ptx.Imm(32*moeWarps), func() {
		p := g.op3("add.u32", ptx.U32, p0, g.tid)
		in := g.cmp("lt", ptx.U32, p, hi)
		v := g.imm32(0)
		g.EmitIf(in, false, "ld.global.u32", v, ptx.Addr{Base: g.byteAddr(idx, p, 4)})
		g.Emit("min.u32", v, v, ptx.Imm(int64(g.c.Experts-1)))
		m := g.cmp("eq", ptx.U32, v, ex)
		g.Emit("and.pred", m, m, in)
		bits := g.Reg(ptx.B32)
		g.Emit("selp.b32", bits, one, ptx.Imm(0), m)
		t := g.Reg(ptx.B32)
		for off := 16; off > 0; off /= 2 {
			g.Emit("shfl.sync.bfly.b32", t, bits, ptx.Imm(off), ptx.Imm(0x1f), ptx.Imm(-1))
			g.Emit("or.b32", bits, bits, t)
		}
		cnt := g.Reg(ptx.U32)
		g.Emit("popc.b32", cnt, bits)
		g.EmitIf(g.cmp("eq", ptx.U32, g.lane, ptx.Imm(0)), false, "st.shared.u32", ptx.Addr{Base: g.sharedAddr(g.counts, g.warp, 4)}, cnt)
		g.Emit("bar.sync", ptx.Imm(0))
		at := g.Reg(ptx.U32)
		g.Emit("and.b32", bits, bits, below)
		g.Emit("popc.b32", at, bits)
		g.Emit("add.u32", at, at, n)
		c := g.Reg(ptx.U32)
		for w := range moeWarps {
			g.Emit("ld.shared.u32", c, ptx.Addr{Base: g.counts, Offset: int64(4 * w)})
			g.EmitIf(g.cmp("gt", ptx.U32, g.warp, ptx.Imm(int64(w))), false, "add.u32", at, at, c)
			g.Emit("add.u32", n, n, c)
		}
		g.EmitIf(m, false, "st.shared.u32", ptx.Addr{Base: g.sharedAddr(g.list, at, 4)}, p)
		g.Emit("bar.sync", ptx.Imm(0))
	})
	return n
}

// groups runs body over the list's n pairs in groups: moeGroup pairs at a time, and the last
// few with the smallest power-of-two group that holds them. A group past the list's end
// repeats its last pair, whose outputs are then written twice with the same value. Control
// flow depends only on n, so a warp stays converged for its shuffles.
func (g *moeGen) groups(n ptx.Reg, body func(qs []ptx.Reg)) {
	g0 := g.imm32(0)
	top, done := g.NewLabel("group"), g.NewLabel("groups_end")
	last := g.op3("sub.u32", ptx.U32, n, ptx.Imm(1))
	left := g.Reg(ptx.U32)
	run := func(s int) {
		qs := g.Regs(ptx.U32, s)
		for j := range qs {
			at := g.op3("add.u32", ptx.U32, g0, ptx.Imm(int64(j)))
			g.Emit("min.u32", at, at, last)
			g.Emit("ld.shared.u32", qs[j], ptx.Addr{Base: g.sharedAddr(g.list, at, 4)})
		}
		body(qs)
		g.Emit("add.u32", g0, g0, ptx.Imm(int64(s)))
		g.Emit("min.u32", g0, g0, n) // a padded group ends the list
		g.Emit("bra", ptx.Sym(top))
	}
	g.Label(top)
	g.Emit("sub.u32", left, n, g0)
	g.EmitIf(g.cmp("eq", ptx.U32, left, ptx.Imm(0)), false, "bra", ptx.Sym(done))
	for s := 1; s < moeGroup; s *= 2 {
		g.when(g.cmp("le", ptx.U32, left, ptx.Imm(int64(s))), false, func() { run(s) })
	}
	run(moeGroup)
	g.Label(done)
}

// vecOf is the elements a lane takes per step over a reduction of n: 16 bytes of weights
// when n allows, else one.
func vecOf(dt ptx.Type, n int) int {
	if v := 16 / dt.Bytes(); n%v == 0 {
		return v
	}
	return 1
}

// dots returns, reduced over the warp, the dot products of each weight row in ws (storage
// dt) with each f32 row in xs, over n elements taken vec at a time: out[i][j] = ws[i]·xs[j].
// Each weight chunk is loaded once and applied to every row.
func (g *moeGen) dots(ws, xs []ptx.Reg, n, vec int) [][]ptx.Reg {
	dt := g.c.WDtype
	acc := make([][]ptx.Reg, len(ws))
	for i := range acc {
		acc[i] = make([]ptx.Reg, len(xs))
		for j := range acc[i] {
			acc[i][j] = g.f32(0)
		}
	}
	k := g.Reg(ptx.U32)
	g.forLoop(k, g.lane, ptx.Imm(int64(n/vec)), ptx.Imm(32), func() {
		wv := make([][]ptx.Reg, len(ws))
		for i, w := range ws {
			wv[i] = loadChunk(g.emitter, ptx.Addr{Base: g.byteAddr(w, k, vec*dt.Bytes())}, dt, vec)
		}
		for j, x := range xs {
			xv := loadChunk(g.emitter, ptx.Addr{Base: g.byteAddr(x, k, 4*vec)}, ptx.F32, vec)
			for i := range ws {
				for u, v := range xv {
					g.Emit("fma.rn.f32", acc[i][j], v, wv[i][u], acc[i][j])
				}
			}
		}
	})
	for i := range acc {
		for _, a := range acc[i] {
			g.warpReduce(a, "add")
		}
	}
	return acc
}

// ExpertGateUp generates act[q] = silu(gate_e·x[q/k]) * (up_e·x[q/k]) for q = row*k+slot and
// e = idx[q]. Parameters: x, w, idx, act; grid LaunchGateUp. A block takes one expert and
// moeWarps columns; blocks whose expert no pair picked leave after the compaction, so each
// picked expert's gate and up rows are read once per group of moeGroup pairs that picked it.
func ExpertGateUp(name string, c MoEConfig) (*Kernel, error) {
	a, err := c.attrs()
	if err != nil {
		return nil, fmt.Errorf("moe_gate_up %s: %w", name, err)
	}
	g := newMoEGen(name, c)
	x := g.param("x", ptx.U64)
	w := g.param("w", ptx.U64)
	idx := g.param("idx", ptx.U64)
	act := g.param("act", ptx.U64)
	item := g.begin(moeGateUpWindow)
	done := g.NewLabel("done")
	// The whole block leaves together, before any barrier.
	g.EmitIf(g.cmp("ge", ptx.U32, item, ptx.Imm(int64(c.Experts*tiles(c.Inter)))), false, "bra", ptx.Sym(done))
	ex := g.op3("rem.u32", ptx.U32, item, ptx.Imm(int64(c.Experts)))
	col := g.op3("div.u32", ptx.U32, item, ptx.Imm(int64(c.Experts)))
	g.Emit("mad.lo.u32", col, col, ptx.Imm(moeWarps), g.warp)
	valid := g.cmp("lt", ptx.U32, col, ptx.Imm(int64(c.Inter)))
	gi := g.Reg(ptx.U32)
	g.Emit("mad.lo.u32", gi, ex, ptx.Imm(int64(2*c.Inter)), col)
	ui := g.op3("add.u32", ptx.U32, gi, ptx.Imm(int64(c.Inter)))
	rb := c.Hidden * c.WDtype.Bytes()
	gw, uw := g.byteAddr(w, gi, rb), g.byteAddr(w, ui, rb)
	vec := vecOf(c.WDtype, c.Hidden)

	pairs := g.special(ptx.NCtaidY) // rows*TopK
	lo, hi := g.Reg(ptx.U32), g.Reg(ptx.U32)
	g.forLoop(lo, ptx.Imm(0), pairs, ptx.Imm(moeGateUpWindow), func() {
		g.Emit("add.u32", hi, lo, ptx.Imm(moeGateUpWindow))
		g.Emit("min.u32", hi, hi, pairs)
		n := g.compact(idx, ex, lo, hi)
		g.when(valid, false, func() {
			g.groups(n, func(qs []ptx.Reg) {
				xs := make([]ptx.Reg, len(qs))
				for j, q := range qs {
					row := g.op3("div.u32", ptx.U32, q, ptx.Imm(int64(c.TopK)))
					xs[j] = g.byteAddr(x, row, 4*c.Hidden)
				}
				d := g.dots([]ptx.Reg{gw, uw}, xs, c.Hidden, vec)
				isLane0 := g.cmp("eq", ptx.U32, g.lane, ptx.Imm(0))
				for j, q := range qs {
					// silu(g) * u, as SiluMul computes it.
					t := gateAct(g.emitter, "", d[0][j], d[1][j])
					oi := g.Reg(ptx.U32)
					g.Emit("mad.lo.u32", oi, q, ptx.Imm(int64(c.Inter)), col)
					g.EmitIf(isLane0, false, "st.global.f32", ptx.Addr{Base: g.byteAddr(act, oi, 4)}, t)
				}
			})
		})
	})
	g.Label(done)
	return finish(g.Kernel, "moe_gate_up", a)
}

// ExpertDown generates y[row, col] = Σ_s wts[q]·(down_e[col]·act[q]) for q = row*k+s, e =
// idx[q], the slots summed in order s = 0..k-1 as the reference does. Parameters: act, w,
// idx, wts, y; grid LaunchDown. A block takes moeWarps columns and a window of rows at a
// time; for each expert in turn it compacts the window's pairs that picked it and each warp
// streams its column of that expert once per group of moeGroup pairs, leaving the dots in
// shared memory; the block then sums each row's slots from there. So each picked expert's
// down rows are read once per group of pairs that picked it, and no sum crosses blocks.
func ExpertDown(name string, c MoEConfig) (*Kernel, error) {
	a, err := c.attrs()
	if err != nil {
		return nil, fmt.Errorf("moe_down %s: %w", name, err)
	}
	K := c.TopK
	winRows := max(1, moeDownPairs/K)
	g := newMoEGen(name, c)
	act := g.param("act", ptx.U64)
	w := g.param("w", ptx.U64)
	idx := g.param("idx", ptx.U64)
	wts := g.param("wts", ptx.U64)
	y := g.param("y", ptx.U64)
	tile := g.begin(winRows * K)
	dots := g.DeclareShared("dots", ptx.F32, winRows*K*moeWarps) // [pair in window][warp]
	done := g.NewLabel("done")
	g.EmitIf(g.cmp("ge", ptx.U32, tile, ptx.Imm(int64(tiles(c.Hidden)))), false, "bra", ptx.Sym(done))
	col0 := g.op3("mul.lo.u32", ptx.U32, tile, ptx.Imm(moeWarps))
	col := g.op3("add.u32", ptx.U32, col0, g.warp)
	valid := g.cmp("lt", ptx.U32, col, ptx.Imm(int64(c.Hidden)))
	vec := vecOf(c.WDtype, c.Inter)

	rows := g.special(ptx.NCtaidY)
	pairs := g.op3("mul.lo.u32", ptx.U32, rows, ptx.Imm(int64(K)))
	r0, lo, hi, ex := g.Reg(ptx.U32), g.Reg(ptx.U32), g.Reg(ptx.U32), g.Reg(ptx.U32)
	g.forLoop(r0, ptx.Imm(0), rows, ptx.Imm(int64(winRows)), func() {
		g.Emit("mul.lo.u32", lo, r0, ptx.Imm(int64(K)))
		g.Emit("add.u32", hi, lo, ptx.Imm(int64(winRows*K)))
		g.Emit("min.u32", hi, hi, pairs)
		g.forLoop(ex, ptx.Imm(0), ptx.Imm(int64(c.Experts)), ptx.Imm(1), func() {
			n := g.compact(idx, ex, lo, hi)
			g.when(valid, false, func() {
				wi := g.Reg(ptx.U32)
				g.Emit("mad.lo.u32", wi, ex, ptx.Imm(int64(c.Hidden)), col)
				wrow := g.byteAddr(w, wi, c.Inter*c.WDtype.Bytes())
				g.groups(n, func(qs []ptx.Reg) {
					as := make([]ptx.Reg, len(qs))
					for j, q := range qs {
						as[j] = g.byteAddr(act, q, 4*c.Inter)
					}
					d := g.dots([]ptx.Reg{wrow}, as, c.Inter, vec)
					isLane0 := g.cmp("eq", ptx.U32, g.lane, ptx.Imm(0))
					for j, q := range qs {
						at := g.op3("sub.u32", ptx.U32, q, lo)
						g.Emit("mad.lo.u32", at, at, ptx.Imm(moeWarps), g.warp)
						g.EmitIf(isLane0, false, "st.shared.f32", ptx.Addr{Base: g.sharedAddr(dots, at, 4)}, d[0][j])
					}
				})
			})
		})
		g.Emit("bar.sync", ptx.Imm(0))
		// Thread t sums row t/moeWarps of the window at column col0 + t%moeWarps.
		nr := g.op3("sub.u32", ptx.U32, rows, r0)
		g.Emit("min.u32", nr, nr, ptx.Imm(int64(winRows)))
		g.Emit("mul.lo.u32", nr, nr, ptx.Imm(moeWarps))
		it := g.Reg(ptx.U32)
		g.forLoop(it, g.tid, nr, ptx.Imm(32*moeWarps), func() {
			cc := g.op3("and.b32", ptx.U32, it, ptx.Imm(moeWarps-1))
			oc := g.op3("add.u32", ptx.U32, col0, cc)
			g.when(g.cmp("lt", ptx.U32, oc, ptx.Imm(int64(c.Hidden))), false, func() {
				rl := g.op3("div.u32", ptx.U32, it, ptx.Imm(moeWarps))
				row := g.op3("add.u32", ptx.U32, r0, rl)
				sum := g.f32(0)
				for s := range K {
					q := g.Reg(ptx.U32)
					g.Emit("mad.lo.u32", q, row, ptx.Imm(int64(K)), ptx.Imm(int64(s)))
					at := g.op3("sub.u32", ptx.U32, q, lo)
					g.Emit("mad.lo.u32", at, at, ptx.Imm(moeWarps), cc)
					d := g.Reg(ptx.F32)
					g.Emit("ld.shared.f32", d, ptx.Addr{Base: g.sharedAddr(dots, at, 4)})
					wt := g.Reg(ptx.F32)
					g.Emit("ld.global.f32", wt, ptx.Addr{Base: g.byteAddr(wts, q, 4)})
					// Rounded apart, as the reference's acc += wt*dot.
					g.Emit("mul.rn.f32", wt, wt, d)
					g.Emit("add.rn.f32", sum, sum, wt)
				}
				oi := g.Reg(ptx.U32)
				g.Emit("mad.lo.u32", oi, row, ptx.Imm(int64(c.Hidden)), oc)
				g.Emit("st.global.f32", ptx.Addr{Base: g.byteAddr(y, oi, 4)}, sum)
			})
		})
		// The next window's compaction and dots reuse the shared arrays.
		g.Emit("bar.sync", ptx.Imm(0))
	})
	g.Label(done)
	return finish(g.Kernel, "moe_down", a)
}

// moeScratch declares the buffers the experts of node n use within a step: the grouped
// kernels' activations of each (row, slot) pair, and with dense experts each expert's
// gate/up, activation and output rows.
func (g *gen) moeScratch(n *ir.Node) {
	a := n.Attrs.(ir.ExpertsAttrs)
	H, I := n.In[0].Width, a.Inter
	g.buf("act.moe_act", bundle.KindActivation, "f32", []int{g.maxT * a.TopK, I})
	if g.moeKind == "dense" {
		g.buf("act.moe_gu", bundle.KindActivation, "f32", []int{g.maxT, 2 * I})
		g.buf("act.moe_eact", bundle.KindActivation, "f32", []int{g.maxT, I})
		g.buf("act.moe_eout", bundle.KindActivation, "f32", []int{a.Experts * g.maxT, H})
	}
}

// routerName is layer l's router kernel: shared by the layers without router_logits ops.
func (g *gen) routerName(l, hidden int, a ir.RouterAttrs, mi []ir.MI) string {
	return g.miName(fmt.Sprintf("moe_router_h%d_e%d_k%d_%s", hidden, a.Experts, a.TopK, g.wdt), mi, fmt.Sprintf("L%d", l))
}

// router is an MoE router with the router_logits ops fused between its logits and top-k.
func (t *tb) router(n *ir.Node) {
	g := t.g
	a := n.Attrs.(ir.RouterAttrs)
	x := n.In[0]
	mi := group(n, 0)
	rc := RouterConfig{Hidden: x.Width, Experts: a.Experts, TopK: a.TopK, WDtype: g.wdt, Ops: mi}
	name := g.routerName(n.Layer, x.Width, a, mi)
	k, err := g.kernel(name, func() (*Kernel, error) { return Router(name, rc) })
	g.site(n, name)
	t.add(n.Name, k, err, rc.Launch(t.rows), slots{"idx": buf(n.Out[1].Buffer), "wts": buf(n.Out[2].Buffer),
		"x": buf(x.Buffer), "w": buf(n.Weight("w").Name)}, mi)
}

// experts is a layer's mixture-of-experts MLP: dense (Options.MoE "dense", from
// TensorCoreRows rows, the default, whatever the build's --tensor-core-rows: below 8 rows a
// bucket's rows choose few experts, which the grouped kernels alone read) or with the
// grouped expert kernels.
func (t *tb) experts(n *ir.Node) {
	g := t.g
	a := n.Attrs.(ir.ExpertsAttrs)
	x, y := n.In[0], n.Out[0]
	route := slots{"idx": buf(n.In[1].Buffer), "wts": buf(n.In[2].Buffer)}
	if g.moeKind == "dense" && t.rows >= TensorCoreRows {
		t.moeDense(n, route)
		return
	}
	c := MoEConfig{Hidden: x.Width, Inter: a.Inter, Experts: a.Experts, TopK: a.TopK, WDtype: g.wdt}
	name := fmt.Sprintf("moe_gate_up_h%d_i%d_e%d_k%d_%s", c.Hidden, c.Inter, c.Experts, c.TopK, g.wdt)
	k, err := g.kernel(name, func() (*Kernel, error) { return ExpertGateUp(name, c) })
	t.add(fmt.Sprintf("L%d.experts_gate_up", n.Layer), k, err, c.LaunchGateUp(t.rows), merge(route, slots{
		"x": buf(x.Buffer), "w": buf(n.Weight("gate_up").Name), "act": buf("act.moe_act")}), nil)
	name = fmt.Sprintf("moe_down_h%d_i%d_e%d_k%d_%s", c.Hidden, c.Inter, c.Experts, c.TopK, g.wdt)
	k, err = g.kernel(name, func() (*Kernel, error) { return ExpertDown(name, c) })
	t.add(fmt.Sprintf("L%d.experts_down", n.Layer), k, err, c.LaunchDown(t.rows), merge(route, slots{
		"act": buf("act.moe_act"), "w": buf(n.Weight("down").Name), "y": buf(y.Buffer)}), nil)
}

// moeDense runs a layer's experts densely: expert e's gate/up GEMM, SiLU-gate and down GEMM
// over every row, into its own rows of act.moe_eout, then one kernel sums each row's top-k
// outputs weighted by the router. The expert weights are the stacked buffers the grouped
// kernels read, addressed at expert e's offset.
func (t *tb) moeDense(n *ir.Node, route slots) {
	g := t.g
	a := n.Attrs.(ir.ExpertsAttrs)
	l, x := n.Layer, n.In[0]
	H, I, E := x.Width, a.Inter, a.Experts
	ws := int64(g.wdt.Bytes())
	sc := SiluConfig{Inter: I}
	sname := fmt.Sprintf("silu_mul_i%d", I)
	silu, serr := g.kernel(sname, func() (*Kernel, error) { return SiluMul(sname, sc) })
	for e := range E {
		gu := buf(n.Weight("gate_up").Name)
		gu.Offset = int64(e*2*I*H) * ws
		t.gemmAt(fmt.Sprintf("L%d.e%d.gate_up", l, e), buf(x.Buffer), gu, buf("act.moe_gu"), GemmConfig{K: H, N: 2 * I, WDtype: g.wdt}, t.rows)
		t.add(fmt.Sprintf("L%d.e%d.silu_mul", l, e), silu, serr, sc.Launch(t.rows), slots{"gu": buf("act.moe_gu"), "act": buf("act.moe_eact"), bundle.GatedActBF16: konst(0), bundle.GatedGuBF16: konst(0)}, nil)
		down, out := buf(n.Weight("down").Name), buf("act.moe_eout")
		down.Offset = int64(e*H*I) * ws
		out.Offset = int64(e*g.maxT*H) * 4
		t.gemmAt(fmt.Sprintf("L%d.e%d.down", l, e), buf("act.moe_eact"), down, out, GemmConfig{K: I, N: H, WDtype: g.wdt}, t.rows)
	}
	c := MoECombineConfig{Hidden: H, Experts: E, TopK: a.TopK, Stride: g.maxT}
	name := fmt.Sprintf("moe_combine_h%d_e%d_k%d_s%d", H, E, c.TopK, c.Stride)
	k, err := g.kernel(name, func() (*Kernel, error) { return MoECombine(name, c) })
	t.add(fmt.Sprintf("L%d.experts_combine", l), k, err, c.Launch(t.rows), merge(route, slots{"out": buf("act.moe_eout"), "y": buf(n.Out[0].Buffer)}), nil)
}

// MoECombineConfig configures MoECombine.
type MoECombineConfig struct {
	Hidden, Experts, TopK int
	Stride                int // rows between two experts' outputs in the out buffer
}

// Launch is one block per row.
func (c MoECombineConfig) Launch(rows int) ops.Launch { return rowLaunch(c.Hidden, rows) }

// MoECombine generates the dense expert path's last kernel (ops "moe_combine"): each row sums
// its top-k experts' outputs weighted by the router, in slot order. Parameters: out, idx,
// wts, y.
func MoECombine(name string, c MoECombineConfig) (*Kernel, error) {
	if c.Experts < 1 || c.TopK < 1 || c.TopK > c.Experts || c.Stride < 1 {
		return nil, fmt.Errorf("moe_combine %s: %d experts, top-k %d, stride %d", name, c.Experts, c.TopK, c.Stride)
	}
	r, err := newRowEmitter(name, c.Hidden)
	if err != nil {
		return nil, fmt.Errorf("moe_combine %s: %w", name, err)
	}
	out := r.param("out", ptx.U64)
	idx := r.param("idx", ptx.U64)
	wts := r.param("wts", ptx.U64)
	y := r.param("y", ptx.U64)
	r.begin()
	acc := make([]ptx.Reg, r.per)
	for j := range acc {
		acc[j] = r.f32(0)
	}
	for s := range c.TopK {
		slot := r.Reg(ptx.U32)
		r.Emit("mad.lo.u32", slot, r.row, ptx.Imm(int64(c.TopK)), ptx.Imm(int64(s)))
		e := r.Reg(ptx.U32)
		r.Emit("ld.global.u32", e, ptx.Addr{Base: r.elemAddr(idx, slot, 4)})
		r.Emit("min.u32", e, e, ptx.Imm(int64(c.Experts-1)))
		wt := r.loadF32(wts, slot, ptx.F32)
		src := r.Reg(ptx.U32)
		r.Emit("mad.lo.u32", src, e, ptx.Imm(int64(c.Stride)), r.row)
		v := r.loadRow(r.ptr(out, src, c.Hidden, 0, ptx.F32, false), nil)
		for j := range acc {
			t := r.Reg(ptx.F32)
			r.Emit("mul.rn.f32", t, wt, v[j])
			r.Emit("add.rn.f32", acc[j], acc[j], t)
		}
	}
	r.storeRow(r.ptr(y, r.row, c.Hidden, 0, ptx.F32, false), acc)
	return finish(r.Kernel, "moe_combine", ops.MoECombineAttrs{Hidden: c.Hidden, Experts: c.Experts, TopK: c.TopK, Stride: c.Stride})
}
