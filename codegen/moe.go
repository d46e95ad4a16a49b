package codegen

import (
	"fmt"
	"math"

	"xmix/bundle"
	"xmix/ops"
	"xmix/passes"
	"xmix/ptx"
)

// Mixture-of-experts kernels (Mixtral). The router is a row kernel over the E logits, so the
// router_logits MI ops run through the same miSet machinery as every fused op; its two
// templates are registered below next to the others. The expert kernels are the decode GEMM's
// simplest form: one warp per output column per (row, slot), lanes striding the reduction with
// scalar loads. Each (row, slot) reads its expert's whole weights, so a batch of B rows reads
// B*k experts' weights even when rows share experts: right at decode batch 1 (k experts, the
// floor), wasteful for large batches and prefill, where grouping rows by expert would read
// each expert once.

func init() {
	// router_bias is steer_add over the logits; router_mask writes -inf where its mask is set.
	miEmitters["router_bias"] = emitSteerAdd
	miEmitters["router_mask"] = emitRouterMask
}

// emitRouterMask sets the logits of masked experts to -inf. The tail's mask loads as zero.
func emitRouterMask(r *rowEmitter, b *miBound, x []ptx.Reg) {
	vp := r.vecPtr(b.params["vec"], ptx.F32)
	for j := range x {
		m := r.loadElem(vp, j, r.elemPred(j, nil))
		on := r.Reg(ptx.Pred)
		r.Emit("setp.neu.f32", on, m, ptx.F32Imm(0))
		r.EmitIf(on, false, "mov.b32", x[j], ptx.Imm(-8388608)) // 0xFF800000, -inf
	}
}

// RouterConfig configures Router.
type RouterConfig struct {
	Hidden, Experts, TopK int
	WDtype                ptx.Type
	Ops                   []MIOp // at router_logits, over rows of Experts logits
}

// Launch is one block per row.
func (c RouterConfig) Launch(rows int) ops.Launch { return rowLaunch(c.Experts, rows) }

// Router generates the router kernel: per row, the logits x·w_e (each warp takes experts
// warp, warp+W, ..., its lanes striding Hidden), the MI ops, then one thread does softmax and
// top-k over the E logits in shared memory exactly as ops.Route does. Parameters: x, w, idx,
// wts, ctl_mask, [ctl_tokens], [ctl_gen], [ctl_seq], [ctl_latch], MI parameters.
func Router(name string, c RouterConfig) (*Kernel, error) {
	k, err := router(name, c)
	if err != nil {
		return nil, fmt.Errorf("moe_router %s: %w", name, err)
	}
	return k, nil
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

// moeWarps is the warps per block of the expert kernels (one output column each).
const moeWarps = 8

// LaunchGateUp is the grid of ExpertGateUp over rows rows: Inter columns by rows*TopK slots.
func (c MoEConfig) LaunchGateUp(rows int) ops.Launch {
	return ops.Launch{Grid: [3]int{(c.Inter + moeWarps - 1) / moeWarps, rows * c.TopK, 1}, Block: [3]int{32 * moeWarps, 1, 1}}
}

// LaunchDown is the grid of ExpertDown over rows rows: Hidden columns by rows.
func (c MoEConfig) LaunchDown(rows int) ops.Launch {
	return ops.Launch{Grid: [3]int{(c.Hidden + moeWarps - 1) / moeWarps, rows, 1}, Block: [3]int{32 * moeWarps, 1, 1}}
}

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

// moeWarp starts an expert kernel: it returns this warp's output column (whole warps past
// cols leave at done, so shuffles see 32 live lanes) and its lane.
func moeWarp(e emitter, cols int, done string) (col, lane ptx.Reg) {
	tid := e.special(ptx.TidX)
	lane = e.op3("and.b32", ptx.U32, tid, ptx.Imm(31))
	warp := e.op3("shr.u32", ptx.U32, tid, ptx.Imm(5))
	col = e.Reg(ptx.U32)
	e.Emit("mad.lo.u32", col, e.special(ptx.CtaidX), ptx.Imm(moeWarps), warp)
	e.EmitIf(e.cmp("ge", ptx.U32, col, ptx.Imm(int64(cols))), false, "bra", ptx.Sym(done))
	return col, lane
}

// expertOf loads idx[q] clamped to the last expert.
func expertOf(e emitter, idx, q ptx.Reg, experts int) ptx.Reg {
	v := e.Reg(ptx.U32)
	e.Emit("ld.global.u32", v, ptx.Addr{Base: e.byteAddr(idx, q, 4)})
	e.Emit("min.u32", v, v, ptx.Imm(int64(experts-1)))
	return v
}

// warpDots returns, reduced over the warp, the dot products of the f32 row x with each
// weight row of ws (storage dt), over n elements, lanes striding by 32.
func warpDots(e emitter, x ptx.Reg, ws []ptx.Reg, dt ptx.Type, n int, lane ptx.Reg) []ptx.Reg {
	acc := make([]ptx.Reg, len(ws))
	for j := range acc {
		acc[j] = e.f32(0)
	}
	i := e.Reg(ptx.U32)
	e.forLoop(i, lane, ptx.Imm(int64(n)), ptx.Imm(32), func() {
		xv := e.Reg(ptx.F32)
		e.Emit("ld.global.f32", xv, ptx.Addr{Base: e.byteAddr(x, i, 4)})
		for j, w := range ws {
			wv := e.loadAt(ptx.Addr{Base: e.byteAddr(w, i, dt.Bytes())}, dt)
			e.Emit("fma.rn.f32", acc[j], xv, wv, acc[j])
		}
	})
	for _, a := range acc {
		e.warpReduce(a, "add")
	}
	return acc
}

// ExpertGateUp generates act[q] = silu(gate_e·x[q/k]) * (up_e·x[q/k]) for q = row*k+slot and
// e = idx[q]. Parameters: x, w, idx, act.
func ExpertGateUp(name string, c MoEConfig) (*Kernel, error) {
	a, err := c.attrs()
	if err != nil {
		return nil, fmt.Errorf("moe_gate_up %s: %w", name, err)
	}
	e := newEmitter(name)
	x := e.param("x", ptx.U64)
	w := e.param("w", ptx.U64)
	idx := e.param("idx", ptx.U64)
	act := e.param("act", ptx.U64)
	e.MaxNTid = 32 * moeWarps
	done := e.NewLabel("done")
	col, lane := moeWarp(e, c.Inter, done)
	q := e.special(ptx.CtaidY)
	ex := expertOf(e, idx, q, c.Experts)
	row := e.op3("div.u32", ptx.U32, q, ptx.Imm(int64(c.TopK)))
	xrow := e.byteAddr(x, row, 4*c.Hidden)
	gi := e.Reg(ptx.U32)
	e.Emit("mad.lo.u32", gi, ex, ptx.Imm(int64(2*c.Inter)), col)
	ui := e.op3("add.u32", ptx.U32, gi, ptx.Imm(int64(c.Inter)))
	rb := c.Hidden * c.WDtype.Bytes()
	d := warpDots(e, xrow, []ptx.Reg{e.byteAddr(w, gi, rb), e.byteAddr(w, ui, rb)}, c.WDtype, c.Hidden, lane)
	g, u := d[0], d[1]
	// silu(g) = g / (1 + 2^(-g*log2 e)), as SiluMul computes it.
	t := e.Reg(ptx.F32)
	e.Emit("mul.rn.f32", t, g, ptx.F32Imm(-1.4426950408889634))
	e.Emit("ex2.approx.f32", t, t)
	e.Emit("add.rn.f32", t, t, ptx.F32Imm(1))
	e.Emit("div.rn.f32", t, g, t)
	e.Emit("mul.rn.f32", t, t, u)
	oi := e.Reg(ptx.U32)
	e.Emit("mad.lo.u32", oi, q, ptx.Imm(int64(c.Inter)), col)
	e.EmitIf(e.cmp("eq", ptx.U32, lane, ptx.Imm(0)), false, "st.global.f32", ptx.Addr{Base: e.byteAddr(act, oi, 4)}, t)
	e.Label(done)
	return finish(e.Kernel, "moe_gate_up", a)
}

// ExpertDown generates y[row, col] = Σ_s wts[q]·(down_e[col]·act[q]) for q = row*k+s, e =
// idx[q]. Parameters: act, w, idx, wts, y.
func ExpertDown(name string, c MoEConfig) (*Kernel, error) {
	a, err := c.attrs()
	if err != nil {
		return nil, fmt.Errorf("moe_down %s: %w", name, err)
	}
	e := newEmitter(name)
	act := e.param("act", ptx.U64)
	w := e.param("w", ptx.U64)
	idx := e.param("idx", ptx.U64)
	wts := e.param("wts", ptx.U64)
	y := e.param("y", ptx.U64)
	e.MaxNTid = 32 * moeWarps
	done := e.NewLabel("done")
	col, lane := moeWarp(e, c.Hidden, done)
	row := e.special(ptx.CtaidY)
	sum := e.f32(0)
	for s := range c.TopK {
		q := e.Reg(ptx.U32)
		e.Emit("mad.lo.u32", q, row, ptx.Imm(int64(c.TopK)), ptx.Imm(int64(s)))
		ex := expertOf(e, idx, q, c.Experts)
		wi := e.Reg(ptx.U32)
		e.Emit("mad.lo.u32", wi, ex, ptx.Imm(int64(c.Hidden)), col)
		d := warpDots(e, e.byteAddr(act, q, 4*c.Inter), []ptx.Reg{e.byteAddr(w, wi, c.Inter*c.WDtype.Bytes())}, c.WDtype, c.Inter, lane)
		wt := e.Reg(ptx.F32)
		e.Emit("ld.global.f32", wt, ptx.Addr{Base: e.byteAddr(wts, q, 4)})
		// Rounded apart, as the reference's acc += wt*dot.
		e.Emit("mul.rn.f32", wt, wt, d[0])
		e.Emit("add.rn.f32", sum, sum, wt)
	}
	oi := e.Reg(ptx.U32)
	e.Emit("mad.lo.u32", oi, row, ptx.Imm(int64(c.Hidden)), col)
	e.EmitIf(e.cmp("eq", ptx.U32, lane, ptx.Imm(0)), false, "st.global.f32", ptx.Addr{Base: e.byteAddr(y, oi, 4)}, sum)
	e.Label(done)
	return finish(e.Kernel, "moe_down", a)
}

// moeBuffers declares layer l's router and expert weights (Hugging Face names, experts
// stacked along the first dimension).
func (g *gen) moeBuffers(l int) {
	m := g.m
	wd := g.wdt.String()
	H, I, E := m.Hidden, m.Intermediate, m.Experts
	pre := fmt.Sprintf("model.layers.%d.block_sparse_moe.", l)
	g.buf(layerBuf(l, "router"), bundle.KindWeight, wd, []int{E, H}, pre+"gate.weight")
	var gu, down []string
	for e := range E {
		x := fmt.Sprintf("%sexperts.%d.", pre, e)
		gu = append(gu, x+"w1.weight", x+"w3.weight")
		down = append(down, x+"w2.weight")
	}
	// Each expert is cut like the dense MLP: its gate and up rows (column-parallel) and its
	// down columns (row-parallel); the router stays whole on every rank.
	guExt, downExt := make([]int, 2*E), make([]int, E)
	for i := range guExt {
		guExt[i] = I
	}
	for i := range downExt {
		downExt[i] = I
	}
	g.sharded(layerBuf(l, "experts_gu"), bundle.KindWeight, []int{E * 2 * I, H}, 0, guExt, gu...)
	g.sharded(layerBuf(l, "experts_down"), bundle.KindWeight, []int{E * H, I}, 1, downExt, down...)
}

// moeActivations declares the routing and expert activation buffers.
func (g *gen) moeActivations() {
	m := g.m
	g.buf("act.moe_idx", bundle.KindActivation, "u32", []int{g.maxT, m.TopK})
	g.buf("act.moe_w", bundle.KindActivation, "f32", []int{g.maxT, m.TopK})
	g.buf("act.moe_act", bundle.KindActivation, "f32", []int{g.maxT * m.TopK, g.rank().inter})
}

// routerName is layer l's router kernel: shared by the layers without router_logits ops.
func (g *gen) routerName(l int, mi []MIOp) string {
	m := g.m
	return miName(fmt.Sprintf("moe_router_h%d_e%d_k%d_%s", m.Hidden, m.Experts, m.TopK, g.wdt), mi, fmt.Sprintf("L%d", l))
}

// moe emits layer l's mixture-of-experts MLP from act.xn into act.delta.
func (t *tb) moe(l int) {
	g := t.g
	m := g.m
	lb := func(w string) bundle.Slot { return buf(layerBuf(l, w)) }
	mi := g.miOps(passes.HostRouter, l, "", "")
	rc := RouterConfig{Hidden: m.Hidden, Experts: m.Experts, TopK: m.TopK, WDtype: g.wdt, Ops: mi}
	name := g.routerName(l, mi)
	k, err := g.kernel(name, func() (*Kernel, error) { return Router(name, rc) })
	route := slots{"idx": buf("act.moe_idx"), "wts": buf("act.moe_w")}
	t.add(fmt.Sprintf("L%d.router", l), k, err, rc.Launch(t.rows), merge(route, slots{"x": buf("act.xn"), "w": lb("router")}), mi)

	c := MoEConfig{Hidden: m.Hidden, Inter: g.rank().inter, Experts: m.Experts, TopK: m.TopK, WDtype: g.wdt}
	name = fmt.Sprintf("moe_gate_up_h%d_i%d_e%d_k%d_%s", m.Hidden, c.Inter, m.Experts, m.TopK, g.wdt)
	k, err = g.kernel(name, func() (*Kernel, error) { return ExpertGateUp(name, c) })
	t.add(fmt.Sprintf("L%d.experts_gate_up", l), k, err, c.LaunchGateUp(t.rows), merge(route, slots{
		"x": buf("act.xn"), "w": lb("experts_gu"), "act": buf("act.moe_act")}), nil)
	name = fmt.Sprintf("moe_down_h%d_i%d_e%d_k%d_%s", m.Hidden, c.Inter, m.Experts, m.TopK, g.wdt)
	k, err = g.kernel(name, func() (*Kernel, error) { return ExpertDown(name, c) })
	t.add(fmt.Sprintf("L%d.experts_down", l), k, err, c.LaunchDown(t.rows), merge(route, slots{
		"act": buf("act.moe_act"), "w": lb("experts_down"), "y": buf("act.delta")}), nil)
}
