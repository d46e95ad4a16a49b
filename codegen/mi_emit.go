package codegen

import (
	"fmt"

	"xmix/bundle"
	"xmix/ops"
	"xmix/ptx"
)

// MI ops fused into row kernels. Each op is guarded twice by uniform branches: first on the
// app bit (a row without it pays the mask test and a branch), then on its gates. Everything
// a predicate reads is per row, so a block never diverges and the reductions inside probe and
// projection templates may use bar.sync. The emitters below are the one place templates are
// spelled in PTX; ops.MITemplates holds their parameter facts and ops/mi.go their reference.

// miEmitters maps each template to the code it becomes. x is the thread's part of the row;
// writing templates change it in place and must keep tail elements (outside the row) zero.
var miEmitters = map[string]func(r *rowEmitter, op *miBound, x []ptx.Reg){
	"capture":      emitCapture,
	"probe_linear": emitProbeLinear,
	"steer_add":    emitSteerAdd,
	"project_out":  emitProjectOut,
	"steer_set":    emitSetProjection,
	// clamp_projection shares steer_set's shape: only the target projection differs.
	"clamp_projection": emitSetProjection,
	"scale":            emitScale,
	"head_ablate":      emitHeadAblate,
	"patch":            emitPatch,
}

// miBound is one MI op of a kernel with its parameter registers.
type miBound struct {
	MIOp
	ref     ops.MIOp
	index   int                // i in mi<i>_*
	params  map[string]ptx.Reg // suffix (vec, pool, scal, out, fired, g<j>) -> pointer
	scal    ptx.Reg            // this row's scalars: params["scal"], at its sequence's row
	barrier bool               // a later op's gate reads what this op writes
	// changed, set by an emitter whose op may leave the row alone (clamp_projection), holds
	// whether it changed the row: what the op's fired word records.
	changed *ptx.Reg
}

// miSet is every MI op of one kernel, grouped by where the kernel applies them.
type miSet struct {
	groups                         [][]*miBound
	ref                            [][]ops.MIOp // reference attributes, per group
	tokens, gen, seq, latch, vslot bool
	mask, tok, genReg              ptx.Reg // per-row control values, loaded by loadCtl
	seqReg, latchReg, vslotReg     ptx.Reg
	// lead is true in the one thread of a row that stores the ops' fired words (thread 0;
	// the logits kernel narrows it to its row's first block). Set by loadCtl.
	lead ptx.Reg
}

// toRef converts an op to its reference form.
func (o MIOp) toRef() ops.MIOp {
	r := ops.MIOp{Template: o.Template, Bit: o.Bit, Width: o.Width, Alpha: o.Alpha, Bias: o.Bias,
		Activation: o.Activation, OutCol: o.OutCol, OutWidth: o.OutWidth, ScalStride: o.ScalStride, ScalRows: o.ScalRows}
	if o.Pool != "" {
		r.Pool = o.PoolSlots
	}
	if o.Fired != "" {
		r.Fired = o.FiredWidth
	}
	for _, g := range o.Gates {
		r.Gates = append(r.Gates, ops.MIGate{Kind: g.Kind, Col: g.Col, Width: g.Width, Cmp: g.Cmp, Value: g.Value,
			Thresh: g.Thresh, Latch: g.Latch, Tokens: g.Tokens, From: g.From, To: g.To, Positions: g.Positions,
			Word: g.Word, Bit: g.Bit})
	}
	return r
}

// buffer is the buffer name the op binds to parameter p.
func (o MIOp) buffer(p ops.MIParam) string {
	switch p.Suffix {
	case "vec":
		return o.Vec
	case "pool":
		return o.Pool
	case "scal":
		return o.Scal
	case "out":
		return o.Out
	case "fired":
		return o.Fired
	}
	return o.Gates[p.Gate].Buf
}

// MIBindings maps each MI parameter of a kernel whose MI ops are miops (in kernel order, as
// RowConfig.MIOps lists them) to the buffer it reads or writes.
func MIBindings(miops []MIOp) map[string]string {
	m := map[string]string{}
	for i, o := range miops {
		for _, p := range o.toRef().Params() {
			m[fmt.Sprintf("mi%d_%s", i, p.Suffix)] = o.buffer(p)
		}
	}
	return m
}

// miSlots binds each MI parameter of miops to its buffer; an op's fired parameter points at
// its column of the app's fired buffer.
func miSlots(miops []MIOp) slots {
	s := slots{}
	for n, b := range MIBindings(miops) {
		s[n] = buf(b)
	}
	for i, o := range miops {
		if o.Fired != "" {
			s[fmt.Sprintf("mi%d_fired", i)] = bundle.Slot{Buffer: o.Fired, Offset: int64(o.FiredCol)}
		}
	}
	return s
}

// declareMI validates the ops of each group against the row width and declares ctl_mask,
// then ctl_tokens, ctl_gen, ctl_seq and ctl_latch when an op needs them (see ops.MIControl
// and ops.MIRequestControl), then every op's parameters, in that order.
func declareMI(r *rowEmitter, groups ...[]MIOp) (*miSet, error) {
	m := &miSet{groups: make([][]*miBound, len(groups)), ref: make([][]ops.MIOp, len(groups))}
	var all []*miBound
	for g, group := range groups {
		for _, o := range group {
			i := len(all)
			ref := o.toRef()
			if err := ref.Validate(r.width); err != nil {
				return nil, fmt.Errorf("MI op %d: %w", i, err)
			}
			if miEmitters[o.Template] == nil {
				return nil, fmt.Errorf("MI op %d: template %s has no PTX emitter", i, o.Template)
			}
			b := &miBound{MIOp: o, ref: ref, index: i, params: map[string]ptx.Reg{}}
			m.groups[g] = append(m.groups[g], b)
			m.ref[g] = append(m.ref[g], ref)
			all = append(all, b)
		}
	}
	m.tokens, m.gen = ops.MIControl(m.ref...)
	if len(all) > 0 {
		m.mask = r.param("ctl_mask", ptx.U64)
	} else {
		r.Param("ctl_mask", ptx.U64) // kept so that every row kernel has the same control slots
	}
	if m.tokens {
		m.tok = r.param("ctl_tokens", ptx.U64)
	}
	if m.gen {
		m.genReg = r.param("ctl_gen", ptx.U64)
	}
	m.seq, m.latch, m.vslot = ops.MIRequestControl(m.ref...)
	if m.seq {
		m.seqReg = r.param("ctl_seq", ptx.U64)
	}
	if m.latch {
		m.latchReg = r.param("ctl_latch", ptx.U64)
	}
	if m.vslot {
		m.vslotReg = r.param("ctl_vslot", ptx.U64)
	}
	for i, b := range all {
		for _, p := range b.ref.Params() {
			if b.buffer(p) == "" {
				return nil, fmt.Errorf("MI op %d (%s): no buffer for %s", i, b.Template, p.Suffix)
			}
			b.params[p.Suffix] = r.param(fmt.Sprintf("mi%d_%s", i, p.Suffix), ptx.U64)
		}
		for _, later := range all[i+1:] {
			for _, g := range later.Gates {
				if g.Kind == "activation" && b.Out != "" && g.Buf == b.Out {
					b.barrier = true
				}
			}
		}
	}
	return m, nil
}

// loadCtl replaces the control array pointers by this row's values. Call it once, after
// begin and before any emit.
func (m *miSet) loadCtl(r *rowEmitter) {
	load := func(p ptx.Reg) ptx.Reg {
		v := r.Reg(ptx.U32)
		r.Emit("ld.global.nc.u32", v, ptx.Addr{Base: r.elemAddr(p, r.row, 4)})
		return v
	}
	if m.mask.T != 0 {
		m.mask = load(m.mask)
	}
	if m.tokens {
		m.tok = load(m.tok)
	}
	if m.gen {
		m.genReg = load(m.genReg)
	}
	if m.seq {
		m.seqReg = load(m.seqReg)
	}
	if m.latch {
		m.latchReg = load(m.latchReg)
	}
	if m.vslot {
		m.vslotReg = load(m.vslotReg)
	}
	for _, group := range m.groups {
		for _, b := range group {
			if _, ok := b.params["fired"]; ok && m.lead.T == 0 {
				m.lead = r.Reg(ptx.Pred)
				r.Emit("setp.eq.u32", m.lead, r.tid, ptx.Imm(0))
			}
		}
	}
}

// prefetchVectors asks L2 for every op's vector at once, whether or not a row enables the op
// (its branch would otherwise wait for the row's mask, then for HBM). Lane 0 of each warp
// asks for the warp's 128-byte line of each of its elements; rows without the app cost an
// L2 hit after the first block.
func (m *miSet) prefetchVectors(r *rowEmitter) {
	var lane0 *ptx.Reg
	for _, group := range m.groups {
		for _, b := range group {
			vec, ok := b.params["vec"]
			if !ok {
				continue
			}
			if lane0 == nil {
				lane, p := r.Reg(ptx.U32), r.Reg(ptx.Pred)
				r.Emit("and.b32", lane, r.tid, ptx.Imm(31))
				r.Emit("setp.eq.u32", p, lane, ptx.Imm(0))
				lane0 = &p
			}
			vp := r.vecPtr(vec, ptx.F32)
			for j := range r.per {
				r.emitMaybe(r.elemPred(j, lane0), "prefetch.global.L2", r.addr(vp, j))
			}
		}
	}
}

// emit applies group g's ops to x in order. When dirty is given, an op that changes x sets
// it to 1.
func (m *miSet) emit(r *rowEmitter, g int, x []ptx.Reg, dirty *ptx.Reg) {
	for _, b := range m.groups[g] {
		skip := r.NewLabel(fmt.Sprintf("mi%d_skip", b.index))
		bit := r.Reg(ptx.U32)
		r.Emit("and.b32", bit, m.mask, ptx.Imm(int64(1)<<b.Bit))
		off := r.Reg(ptx.Pred)
		r.Emit("setp.eq.u32", off, bit, ptx.Imm(0))
		r.EmitIf(off, false, "bra.uni", ptx.Sym(skip))
		b.scal = b.params["scal"]
		if b.ScalStride > 0 && b.scal.T != 0 {
			// Only rows that enable the app pay for finding their sequence's scalars.
			base := r.Reg(ptx.U64)
			r.Emit("mul.wide.u32", base, m.seqReg, ptx.Imm(int64(4*b.ScalStride)))
			r.Emit("add.u64", base, base, b.scal)
			b.scal = base
		}
		// With a fired word the op records on every row with its bit whether it fired: a row
		// whose gates fail jumps to the store with 0.
		firedPtr, counts := b.params["fired"]
		done, fired := skip, ptx.Reg{}
		if counts {
			done = r.NewLabel(fmt.Sprintf("mi%d_fired", b.index))
			fired = r.imm32(0)
		}
		if p := m.gates(r, b); p != nil {
			r.EmitIf(*p, true, "bra.uni", ptx.Sym(done))
		}
		compiled, perRequest := b.params["vec"], b.params["pool"]
		if perRequest.T != 0 {
			// A row whose request holds a vector slot reads the op's vector from it.
			b.params["vec"] = m.slotVector(r, b, compiled, perRequest)
		}
		b.changed = nil
		miEmitters[b.Template](r, b, x)
		b.params["vec"] = compiled
		if counts {
			if b.changed != nil {
				r.Emit("selp.u32", fired, ptx.Imm(1), ptx.Imm(0), *b.changed)
			} else {
				r.Emit("mov.u32", fired, ptx.Imm(1))
			}
		}
		if dirty != nil && ops.MITemplates[b.Template].Writes {
			r.Emit("mov.u32", *dirty, ptx.Imm(1))
		}
		if r.fold != nil && ops.MITemplates[b.Template].Writes && b.Template != "project_out" {
			// The row changed after a projection summed its squares: the norm sums again.
			r.Emit("setp.ne.u32", r.fold.have, r.tid, r.tid)
		}
		if b.barrier {
			// The op's output is read by a later gate of this kernel: make it visible to
			// every thread of the block first.
			r.Emit("bar.sync", ptx.Imm(0))
		}
		if counts {
			r.Label(done)
			storeFired(r.emitter, &m.lead, r.row, firedPtr, b.FiredWidth, fired)
		}
		r.Label(skip)
	}
}

// storeFired stores fired (0 or 1) as the byte of row in rows of width bytes at base, where
// lead holds (nil: always).
func storeFired(e emitter, lead *ptx.Reg, row, base ptx.Reg, width int, fired ptx.Reg) {
	a := e.Reg(ptx.U64)
	e.Emit("mul.wide.u32", a, row, ptx.Imm(int64(width)))
	e.Emit("add.u64", a, a, base)
	h := e.Reg(ptx.U16)
	e.Emit("cvt.u16.u32", h, fired)
	if lead == nil {
		e.Emit("st.global.u8", ptx.Addr{Base: a}, h)
		return
	}
	e.EmitIf(*lead, false, "st.global.u8", ptx.Addr{Base: a}, h)
}

// slotVector is the vector the row reads: slot ctl_vslot[row] of pool, or compiled when
// the row holds no slot (bundle.NoRow).
func (m *miSet) slotVector(r *rowEmitter, b *miBound, compiled, pool ptx.Reg) ptx.Reg {
	slot := r.Reg(ptx.U64)
	r.Emit("mul.wide.u32", slot, m.vslotReg, ptx.Imm(int64(4*b.Width)))
	r.Emit("add.u64", slot, slot, pool)
	none := r.Reg(ptx.Pred)
	r.Emit("setp.eq.u32", none, m.vslotReg, ptx.Imm(bundle.NoRow))
	v := r.Reg(ptx.U64)
	r.Emit("selp.b64", v, compiled, slot, none)
	return v
}

// gates returns the conjunction of the op's gates, or nil when it has none that test
// anything.
func (m *miSet) gates(r *rowEmitter, b *miBound) *ptx.Reg {
	var all *ptx.Reg
	and := func(p ptx.Reg) {
		if all == nil {
			all = &p
			return
		}
		r.Emit("and.pred", *all, *all, p)
	}
	setp := func(cmp string, a ptx.Reg, v int64) ptx.Reg {
		p := r.Reg(ptx.Pred)
		r.Emit("setp."+cmp, p, a, ptx.Imm(v))
		return p
	}
	for j, g := range b.Gates {
		switch g.Kind {
		case "activation":
			buf := b.params[fmt.Sprintf("g%d", j)]
			a := r.Reg(ptx.U64)
			r.Emit("mul.wide.u32", a, r.row, ptx.Imm(4*g.Width))
			r.Emit("add.u64", a, a, buf)
			v := r.Reg(ptx.F32)
			r.Emit("ld.global.f32", v, ptx.Addr{Base: a, Offset: int64(4 * g.Col)})
			var thresh ptx.Operand = ptx.F32Imm(g.Value)
			if g.Thresh > 0 {
				thresh = r.scalar(b, g.Thresh-1)
			}
			p := r.Reg(ptx.Pred)
			r.Emit("setp."+ops.MICmps[g.Cmp]+".f32", p, v, thresh)
			and(p)
		case "after_token":
			bit := r.Reg(ptx.U32)
			r.Emit("and.b32", bit, m.latchReg, ptx.Imm(int64(1)<<g.Latch))
			and(setp("ne.u32", bit, 0))
		case "layers":
			word := r.Reg(ptx.U32)
			r.Emit("ld.global.nc.u32", word, ptx.Addr{Base: b.scal, Offset: int64(4 * g.Word)})
			r.Emit("and.b32", word, word, ptx.Imm(int64(1)<<g.Bit))
			and(setp("ne.u32", word, 0))
		case "token_in":
			p := setp("eq.u32", m.tok, int64(g.Tokens[0]))
			for _, t := range g.Tokens[1:] {
				r.Emit("or.pred", p, p, setp("eq.u32", m.tok, int64(t)))
			}
			and(p)
		case "steps":
			// From >= 0 (validated), so gen >= From implies gen >= 0.
			and(setp("ge.s32", m.genReg, int64(g.From)))
			if g.To > 0 {
				and(setp("lt.s32", m.genReg, int64(g.To)))
			}
		case "positions":
			switch g.Positions {
			case "prompt":
				and(setp("lt.s32", m.genReg, 0))
			case "generated":
				and(setp("ge.s32", m.genReg, 0))
			}
		}
	}
	return all
}

// outPtr addresses this thread's elements of the op's output row.
func (r *rowEmitter) outPtr(b *miBound) rowPtr {
	return r.ptr(b.params["out"], r.row, b.OutWidth, b.OutCol, ptx.F32, false)
}

// scalar loads the row's Scal[idx].
func (r *rowEmitter) scalar(b *miBound, idx int) ptx.Reg {
	v := r.Reg(ptx.F32)
	r.Emit("ld.global.nc.f32", v, ptx.Addr{Base: b.scal, Offset: int64(4 * idx)})
	return v
}

// dotVec is the block-wide dot product of the row with the op's vector.
func (r *rowEmitter) dotVec(b *miBound, x []ptx.Reg) ptx.Reg {
	return r.reduce(r.dotPartial(b, x))
}

// dotPartial is this thread's partial sum of x·vec.
func (r *rowEmitter) dotPartial(b *miBound, x []ptx.Reg) ptx.Reg {
	vp := r.vecPtr(b.params["vec"], ptx.F32)
	s := r.Reg(ptx.F32)
	r.Emit("mov.f32", s, ptx.F32Imm(0))
	for j := range x {
		v := r.loadElem(vp, j, r.elemPred(j, nil))
		r.Emit("fma.rn.f32", s, x[j], v, s)
	}
	return s
}

// axpy sets x += a*vec (sub: x -= a*vec), rounding the product and the sum separately so
// the result is exactly x + fl(a*v) in f32. The tail element stays zero.
func (r *rowEmitter) axpy(b *miBound, a ptx.Reg, x []ptx.Reg, sub bool) {
	vp := r.vecPtr(b.params["vec"], ptx.F32)
	op := "add.rn.f32"
	if sub {
		op = "sub.rn.f32"
	}
	for j := range x {
		p := r.elemPred(j, nil)
		v := r.loadElem(vp, j, p)
		t := r.Reg(ptx.F32)
		r.Emit("mul.rn.f32", t, a, v)
		r.emitMaybe(p, op, x[j], x[j], t)
	}
}

func emitCapture(r *rowEmitter, b *miBound, x []ptx.Reg) {
	r.storeRow(r.outPtr(b), x)
}

func emitProbeLinear(r *rowEmitter, b *miBound, x []ptx.Reg) {
	s := r.dotVec(b, x)
	if b.Bias >= 0 {
		r.Emit("add.rn.f32", s, s, r.scalar(b, b.Bias))
	}
	if b.Activation == "sigmoid" {
		// 1 / (1 + 2^(-s*log2 e))
		t := r.Reg(ptx.F32)
		r.Emit("mul.rn.f32", t, s, ptx.F32Imm(-1.4426950408889634))
		r.Emit("ex2.approx.f32", t, t)
		r.Emit("add.rn.f32", t, t, ptx.F32Imm(1))
		r.Emit("rcp.rn.f32", s, t)
	}
	first := r.Reg(ptx.Pred)
	r.Emit("setp.eq.u32", first, r.tid, ptx.Imm(0))
	a := r.Reg(ptx.U64)
	r.Emit("mul.wide.u32", a, r.row, ptx.Imm(4*b.OutWidth))
	r.Emit("add.u64", a, a, b.params["out"])
	r.EmitIf(first, false, "st.global.f32", ptx.Addr{Base: a, Offset: int64(4 * b.OutCol)}, s)
}

func emitSteerAdd(r *rowEmitter, b *miBound, x []ptx.Reg) {
	r.axpy(b, r.scalar(b, b.Alpha), x, false)
}

func emitProjectOut(r *rowEmitter, b *miBound, x []ptx.Reg) {
	if r.fold == nil {
		r.axpy(b, r.dotVec(b, x), x, true)
		return
	}
	// The residual op right before the add+norm kernel's norm (refusal ablation at every
	// layer): one reduction yields both x·d and ‖x‖², and ‖x − (x·d)d‖² = ‖x‖² − (x·d)² for
	// the unit d, so the norm needs no reduction of its own. When the projection removes most
	// of the row that difference loses precision, and the squares are summed again.
	p, ss := r.reduce2(r.dotPartial(b, x), r.squares(x))
	r.axpy(b, p, x, true)
	f := r.fold
	t := r.Reg(ptx.F32)
	r.Emit("mul.rn.f32", t, p, p)
	r.Emit("sub.rn.f32", f.tot, ss, t)
	r.Emit("mul.rn.f32", t, ss, ptx.F32Imm(0.25))
	exact := r.Reg(ptx.Pred)
	r.Emit("setp.ge.f32", exact, f.tot, t)
	done := r.NewLabel(fmt.Sprintf("mi%d_norm", b.index))
	r.EmitIf(exact, false, "bra.uni", ptx.Sym(done))
	r.Emit("mov.f32", f.tot, r.reduce(r.squares(x)))
	r.Label(done)
	r.Emit("setp.eq.u32", f.have, r.tid, r.tid)
}

// emitSetProjection moves the row along the unit direction d so that its projection becomes
// the target: value (steer_set) or the projection clamped to [min, max] (clamp_projection).
func emitSetProjection(r *rowEmitter, b *miBound, x []ptx.Reg) {
	p := r.dotVec(b, x)
	var c ptx.Reg
	if b.Template == "steer_set" {
		c = r.scalar(b, b.Alpha)
	} else {
		c = r.Reg(ptx.F32)
		r.Emit("mov.f32", c, p)
		if b.Alpha >= 0 {
			r.Emit("max.f32", c, c, r.scalar(b, b.Alpha))
		}
		if b.Bias >= 0 {
			r.Emit("min.f32", c, c, r.scalar(b, b.Bias))
		}
		// Inside its bounds the clamp leaves the row alone (and does not count as fired).
		moved := r.Reg(ptx.Pred)
		r.Emit("setp.neu.f32", moved, c, p)
		b.changed = &moved
	}
	r.Emit("sub.rn.f32", c, c, p)
	r.axpy(b, c, x, false)
}

// emitScale multiplies the row by Scal[Alpha], or element-wise by the vector when the op has
// no alpha. The tail element is left alone so that it stays zero whatever the factor.
func emitScale(r *rowEmitter, b *miBound, x []ptx.Reg) {
	if b.Alpha >= 0 {
		alpha := r.scalar(b, b.Alpha)
		for j := range x {
			r.emitMaybe(r.elemPred(j, nil), "mul.rn.f32", x[j], x[j], alpha)
		}
		return
	}
	vp := r.vecPtr(b.params["vec"], ptx.F32)
	for j := range x {
		p := r.elemPred(j, nil)
		r.emitMaybe(p, "mul.rn.f32", x[j], x[j], r.loadElem(vp, j, p))
	}
}

// emitHeadAblate multiplies by Scal[Alpha] the columns where the mask vector is non-zero (one
// head's slice of attn.z). The tail's mask loads as zero, so the tail is never touched.
func emitHeadAblate(r *rowEmitter, b *miBound, x []ptx.Reg) {
	alpha := r.scalar(b, b.Alpha)
	vp := r.vecPtr(b.params["vec"], ptx.F32)
	for j := range x {
		m := r.loadElem(vp, j, r.elemPred(j, nil))
		on := r.Reg(ptx.Pred)
		r.Emit("setp.neu.f32", on, m, ptx.F32Imm(0))
		r.EmitIf(on, false, "mul.rn.f32", x[j], x[j], alpha)
	}
}

// emitPatch replaces the row by the vector; the tail loads as zero.
func emitPatch(r *rowEmitter, b *miBound, x []ptx.Reg) {
	vp := r.vecPtr(b.params["vec"], ptx.F32)
	for j := range x {
		r.Emit("mov.f32", x[j], r.loadElem(vp, j, r.elemPred(j, nil)))
	}
}
