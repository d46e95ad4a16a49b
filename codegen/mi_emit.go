package codegen

import (
	"fmt"
	"slices"

	"xmix/bundle"
	"xmix/ir"
	"xmix/mi"
	"xmix/ptx"
)

// MI ops fused into row kernels. Each op is guarded twice by uniform branches: first on the
// app bit (a row without it pays the mask test and a branch), then on its gates. Everything
// a predicate reads is per row, so a block never diverges and the reductions inside probe and
// projection templates may use bar.sync. Each template's own code is its emitter (package mi,
// one file per template), over the row kernel through miRow; writing templates change x in
// place and must keep tail elements (outside the row) zero.

// miBound is one MI op of a kernel with its parameter registers.
type miBound struct {
	ir.MI
	ref    mi.Op
	index  int                // i in mi<i>_*
	params map[string]ptx.Reg // suffix (vec, pool, scal, out, fired, g<j>) -> pointer
	scal   ptx.Reg            // this row's scalars: params["scal"], at its sequence's row
	// scalars, when set, holds the row's scalars the op and its thresholds read, by index,
	// loaded before the kernel waits for the grid ahead (miSet.preloadScalars), and scalRow
	// the row's scalars' address found there; nil: loaded where the op runs.
	scalars map[int]ptx.Reg
	scalRow ptx.Reg
	barrier bool // a later op's gate reads what this op writes
	// changed, set by an emitter whose op may leave the row alone (clamp_projection), holds
	// whether it changed the row: what the op's fired word records.
	changed *ptx.Reg
	// vec, when set, holds the thread's elements of the op's compiled vector, loaded before
	// the kernel waits for the grid ahead (miSet.preloadParams); nil: loaded where the op
	// runs.
	vec []ptx.Reg
}

// miSet is every MI op of one kernel, grouped by where the kernel applies them.
type miSet struct {
	groups                         [][]*miBound
	ref                            [][]mi.Op // reference attributes, per group
	tokens, gen, seq, latch, vslot bool
	mask, tok, genReg              ptx.Reg // per-row control values, loaded by loadCtl
	maskLoaded                     bool    // mask holds the row's mask (loadMask), not its array
	seqLoaded                      bool    // seqReg holds the row's sequence slot (loadSeq)
	seqReg, latchReg, vslotReg     ptx.Reg
	// lead is true in the one thread of a row that stores the ops' fired words (thread 0;
	// the logits kernel narrows it to its row's first block). Set by loadCtl.
	lead ptx.Reg
}

// miBuffer is the buffer the op binds to parameter p.
func miBuffer(o ir.MI, p mi.Param) string {
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
func MIBindings(miops []ir.MI) map[string]string {
	m := map[string]string{}
	for i, o := range miops {
		for _, p := range o.Op.Params() {
			m[fmt.Sprintf("mi%d_%s", i, p.Suffix)] = miBuffer(o, p)
		}
	}
	return m
}

// miSlots binds each MI parameter of miops to its buffer; an op's fired parameter points at
// its column of the app's fired buffer.
func miSlots(miops []ir.MI) slots {
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
func declareMI(r *rowEmitter, groups ...[]ir.MI) (*miSet, error) {
	m := &miSet{groups: make([][]*miBound, len(groups)), ref: make([][]mi.Op, len(groups))}
	var all []*miBound
	for g, group := range groups {
		for _, o := range group {
			i := len(all)
			ref := o.Op
			if err := ref.Validate(r.width); err != nil {
				return nil, fmt.Errorf("MI op %d: %w", i, err)
			}
			if t, ok := mi.Lookup(o.Template); !ok || t.Emit == nil {
				return nil, fmt.Errorf("MI op %d: template %s has no PTX emitter", i, o.Template)
			}
			b := &miBound{MI: o, ref: ref, index: i, params: map[string]ptx.Reg{}}
			m.groups[g] = append(m.groups[g], b)
			m.ref[g] = append(m.ref[g], ref)
			all = append(all, b)
		}
	}
	m.tokens, m.gen = mi.Control(m.ref...)
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
	m.seq, m.latch, m.vslot = mi.RequestControl(m.ref...)
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
			if miBuffer(b.MI, p) == "" {
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
	load := r.loadCtlWord
	m.loadMask(r)
	if m.tokens {
		m.tok = load(m.tok)
	}
	if m.gen {
		m.genReg = load(m.genReg)
	}
	m.loadSeq(r)
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

// loadMask replaces the mask array pointer by this row's mask, once (a kernel with ops).
func (m *miSet) loadMask(r *rowEmitter) {
	if m.mask.T != 0 && !m.maskLoaded {
		m.mask, m.maskLoaded = r.loadCtlWord(m.mask), true
	}
}

// loadSeq replaces the sequence slot array pointer by this row's slot, once (a kernel whose
// ops read per-request scalars or latches).
func (m *miSet) loadSeq(r *rowEmitter) {
	if m.seq && !m.seqLoaded {
		m.seqReg, m.seqLoaded = r.loadCtlWord(m.seqReg), true
	}
}

// loadCtlWord loads this row's word of a control array. The host writes the control block
// before the step, so a kernel launched early may read it before it waits.
func (r *rowEmitter) loadCtlWord(p ptx.Reg) ptx.Reg {
	v := r.Reg(ptx.U32)
	r.Emit("ld.global.nc.u32", v, ptx.Addr{Base: r.elemAddr(p, r.row, 4)})
	return v
}

// maxPreloadedVec bounds the vector elements a thread of a row kernel holds from before its
// wait (preloadParams): with 1024 threads a block, ptxas has 64 registers a thread.
const maxPreloadedVec = 16

// preloadParams loads, before a kernel launched early waits for the grid ahead, the
// compiled vector of each op the row enables into registers, until maxPreloadedVec elements
// a thread are taken, and the row's scalars of each such op (preloadScalars); it loads the
// row's mask first. The vectors, the scalars and the mask never change during a step, and
// otherwise an op's first vector load (an L2 round trip at best) sits between the residual
// add and its dot product. Kernels of templates of preloadMinRows rows and more do this
// (RowConfig.PreloadVectors), where it made the apps cheaper; smaller ones only ask L2
// (prefetchVectors). A row without the op's bit loads nothing (its registers read 0). An op
// with per-request vectors keeps its vector loads where it runs: the row's slot picks the
// vector there. With coherent the vectors and scalars are loaded with ld.global rather than
// read-only loads (RowConfig.PreloadCoherent).
func (m *miSet) preloadParams(r *rowEmitter, coherent bool) {
	m.loadMask(r)
	taken := 0
	for _, group := range m.groups {
		for _, b := range group {
			_, hasVec := b.params["vec"]
			_, perRequest := b.params["pool"]
			loadVec := hasVec && !perRequest && taken+r.per <= maxPreloadedVec
			if _, hasScal := b.params["scal"]; !loadVec && !hasScal {
				continue
			}
			bit := r.Reg(ptx.U32)
			r.Emit("and.b32", bit, m.mask, ptx.Imm(int64(1)<<b.Bit))
			on := r.Reg(ptx.Pred)
			r.Emit("setp.ne.u32", on, bit, ptx.Imm(0))
			m.preloadScalars(r, b, on, coherent)
			if loadVec {
				vp := r.vecPtr(b.params["vec"], ptx.F32)
				vp.nc = !coherent
				b.vec = r.loadRow(vp, &on)
				taken += r.per
			}
		}
	}
}

// preloadScalars loads the scalars op b reads of a row that enables it (on) into registers:
// Scal[Alpha], Scal[Bias] and its activation gates' thresholds, its sequence's where they
// are per request (the sequence slot, which the host writes before the step, loaded first).
// Otherwise the op's branch waits on an L2 round trip for them, two where it must load the
// slot first (side-effect-free's steer and clamp, session 68: its add+norm kernel took
// 2.3 us longer than the bare one at 8 rows). A row without the bit reads 0.
func (m *miSet) preloadScalars(r *rowEmitter, b *miBound, on ptx.Reg, coherent bool) {
	scal, ok := b.params["scal"]
	if !ok {
		return
	}
	if b.ScalStride > 0 {
		m.loadSeq(r)
		base := r.Reg(ptx.U64)
		r.Emit("mul.wide.u32", base, m.seqReg, ptx.Imm(int64(4*b.ScalStride)))
		r.Emit("add.u64", base, base, scal)
		scal = base
	}
	ld := "ld.global.nc.f32"
	if coherent {
		ld = "ld.global.f32"
	}
	b.scalRow, b.scalars = scal, map[int]ptx.Reg{}
	for _, idx := range b.scalarsRead() {
		v := r.Reg(ptx.F32)
		r.Emit("mov.f32", v, ptx.F32Imm(0))
		r.EmitIf(on, false, ld, v, ptx.Addr{Base: scal, Offset: int64(4 * idx)})
		b.scalars[idx] = v
	}
}

// scalarsRead is the indices of the f32 scalars op b reads: Alpha and Bias where it has
// them, then its activation gates' thresholds, each once.
func (b *miBound) scalarsRead() []int {
	var idx []int
	for _, i := range []int{b.Alpha, b.Bias} {
		if i >= 0 {
			idx = append(idx, i)
		}
	}
	for _, g := range b.Gates {
		if g.Kind == "activation" && g.Thresh > 0 && !slices.Contains(idx, g.Thresh-1) {
			idx = append(idx, g.Thresh-1)
		}
	}
	return idx
}

// skipWithoutApps branches to label end in a row whose app mask (loadCtl) holds none of ops'
// app bits: a kernel that exists only for MI ops costs such a row the mask test and the branch.
func (m *miSet) skipWithoutApps(r *rowEmitter, ops []ir.MI, end string) {
	var bits int64
	for _, o := range ops {
		bits |= 1 << o.Bit
	}
	on := r.Reg(ptx.U32)
	r.Emit("and.b32", on, m.mask, ptx.Imm(bits))
	none := r.Reg(ptx.Pred)
	r.Emit("setp.eq.u32", none, on, ptx.Imm(0))
	r.EmitIf(none, false, "bra.uni", ptx.Sym(end))
}

// applyInPlace loads the row at p, applies the first group's ops to it and stores it back
// only where one of them changed it, then places label end (where skipWithoutApps branches).
func (m *miSet) applyInPlace(r *rowEmitter, p rowPtr, end string) {
	x := r.loadRow(p, nil)
	dirty := r.imm32(0)
	m.emit(r, 0, x, &dirty)
	clean := r.Reg(ptx.Pred)
	r.Emit("setp.eq.u32", clean, dirty, ptx.Imm(0))
	r.EmitIf(clean, false, "bra.uni", ptx.Sym(end))
	r.storeRow(p, x)
	r.Label(end)
}

// prefetchParams asks L2 for the ops' params, which never change during a step: their
// vectors and scalar tables.
func (m *miSet) prefetchParams(r *rowEmitter) {
	m.prefetchVectors(r)
	m.prefetchScalars(r)
}

// prefetches says whether an op of the kernel reads a vector or a scalar table (what
// prefetchParams asks L2 for).
func (m *miSet) prefetches() bool {
	for _, group := range m.groups {
		for _, b := range group {
			_, vec := b.params["vec"]
			_, scal := b.params["scal"]
			if vec || scal {
				return true
			}
		}
	}
	return false
}

// prefetchGates asks L2 for the value each activation gate of the kernel's ops tests: the
// row's element of a buffer an earlier kernel of the step wrote (a probe's score), which the
// op's branch would otherwise read from HBM after the residual add. Thread 0 asks, after the
// wait for the grid ahead (the writer may be the kernel just before), whether or not the row
// enables the op.
func (m *miSet) prefetchGates(r *rowEmitter) {
	var first *ptx.Reg
	for _, group := range m.groups {
		for _, b := range group {
			for j, g := range b.Gates {
				if g.Kind != "activation" {
					continue
				}
				if first == nil {
					p := r.Reg(ptx.Pred)
					r.Emit("setp.eq.u32", p, r.tid, ptx.Imm(0))
					first = &p
				}
				a := r.Reg(ptx.U64)
				r.Emit("mul.wide.u32", a, r.row, ptx.Imm(int64(4*g.Width)))
				r.Emit("add.u64", a, a, b.params[fmt.Sprintf("g%d", j)])
				r.EmitIf(*first, false, "prefetch.global.L2", ptx.Addr{Base: a, Offset: int64(4 * g.Col)})
			}
		}
	}
}

// prefetchScalars asks L2 for every op's scalar table (its alpha, bias, thresholds and layer
// words), whether or not a row enables the op: every sequence slot's row of a table with
// slots (ScalRows x ScalStride), the line of the first scalar of one without (a template's
// scalars sit at its first few indices). The host writes the tables only between steps, so a
// kernel launched early asks before it waits (RowConfig.EarlyLaunch), and the scalars an op
// reads after its branch or its reduction are L2 hits, not HBM reads on the row's path.
// Thread t asks for the line at byte min(128t, the table's last element): the table's lines,
// the last one too where the table does not start on a line, no byte outside it.
func (m *miSet) prefetchScalars(r *rowEmitter) {
	for _, group := range m.groups {
		for _, b := range group {
			scal, ok := b.params["scal"]
			if !ok {
				continue
			}
			bytes, lines := 4, 1
			if b.ScalStride > 0 {
				bytes = 4 * b.ScalRows * b.ScalStride
				lines = min(r.threads, (bytes+127)/128+1)
			}
			off := r.Reg(ptx.U32)
			r.Emit("mul.lo.u32", off, r.tid, ptx.Imm(128))
			r.Emit("min.u32", off, off, ptx.Imm(int64(bytes-4)))
			a := r.Reg(ptx.U64)
			r.Emit("cvt.u64.u32", a, off)
			r.Emit("add.u64", a, a, scal)
			p := r.Reg(ptx.Pred)
			r.Emit("setp.lt.u32", p, r.tid, ptx.Imm(int64(lines)))
			r.EmitIf(p, false, "prefetch.global.L2", ptx.Addr{Base: a})
		}
	}
}

// prefetchVectors asks L2 for every op's vector at once, whether or not a row enables the op
// (its branch would otherwise wait for the row's mask, then for HBM). Lane 0 of each warp
// asks for the warp's 128-byte line of each of its elements; rows without the app cost an
// L2 hit after the first block. These are the compiled vectors (params, never written during
// a step), so a kernel launched early asks for them before it waits (RowConfig.EarlyLaunch);
// a row's per-request slot is read where its op runs. Vectors already in registers
// (preloadParams) are not asked for.
func (m *miSet) prefetchVectors(r *rowEmitter) {
	for _, group := range m.groups {
		for _, b := range group {
			if vec, ok := b.params["vec"]; ok && b.vec == nil {
				r.prefetchRow(r.vecPtr(vec, ptx.F32))
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
		switch {
		case b.scalRow.T != 0:
			b.scal = b.scalRow // found before the wait (preloadScalars)
		case b.ScalStride > 0 && b.scal.T != 0:
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
		t, _ := mi.Lookup(b.Template)
		t.Emit(miRow{r, b}, &b.Op, x)
		b.params["vec"] = compiled
		if counts {
			if b.changed != nil {
				r.Emit("selp.u32", fired, ptx.Imm(1), ptx.Imm(0), *b.changed)
			} else {
				r.Emit("mov.u32", fired, ptx.Imm(1))
			}
		}
		if dirty != nil && t.Writes {
			r.Emit("mov.u32", *dirty, ptx.Imm(1))
		}
		if r.fold != nil && t.Writes && !t.FoldsNorm {
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
			r.Emit("setp."+mi.Cmps[g.Cmp]+".f32", p, v, thresh)
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

// scalar is the row's Scal[idx]: preloaded (preloadScalars), else loaded here.
func (r *rowEmitter) scalar(b *miBound, idx int) ptx.Reg {
	if v, ok := b.scalars[idx]; ok {
		return v
	}
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
	vec := r.vecElems(b)
	s := r.Reg(ptx.F32)
	r.Emit("mov.f32", s, ptx.F32Imm(0))
	for j := range x {
		v, _ := vec(j)
		r.Emit("fma.rn.f32", s, x[j], v, s)
	}
	return s
}

// vecElems gives element j of the thread's part of the op's vector (0 outside the row) and
// the predicate under which j is inside the row (nil: always): the preloaded register
// (miBound.vec), or a load of the op's current vector (compiled or the row's slot).
func (r *rowEmitter) vecElems(b *miBound) func(j int) (ptx.Reg, *ptx.Reg) {
	if b.vec != nil {
		return func(j int) (ptx.Reg, *ptx.Reg) { return b.vec[j], r.elemPred(j, nil) }
	}
	vp := r.vecPtr(b.params["vec"], ptx.F32)
	return func(j int) (ptx.Reg, *ptx.Reg) {
		p := r.elemPred(j, nil)
		return r.loadElem(vp, j, p), p
	}
}

// axpy sets x += a*vec (sub: x -= a*vec), rounding the product and the sum separately so
// the result is exactly x + fl(a*v) in f32. The tail element stays zero.
func (r *rowEmitter) axpy(b *miBound, a ptx.Reg, x []ptx.Reg, sub bool) {
	vec := r.vecElems(b)
	op := "add.rn.f32"
	if sub {
		op = "sub.rn.f32"
	}
	for j := range x {
		v, p := vec(j)
		t := r.Reg(ptx.F32)
		r.Emit("mul.rn.f32", t, a, v)
		r.emitMaybe(p, op, x[j], x[j], t)
	}
}

// foldsNorm says whether o, at the residual of an add+norm kernel, computes the norm's sum
// of squares with its own reduction (mi.Template.FoldsNorm).
func foldsNorm(o ir.MI) bool {
	t, ok := mi.Lookup(o.Template)
	return ok && t.FoldsNorm
}

// miRow is a row kernel as an op's emitter sees it (mi.Emitter): the kernel, the op's
// parameter registers, the thread's part of the row.
type miRow struct {
	r *rowEmitter
	b *miBound
}

func (m miRow) Kernel() *ptx.Kernel                   { return m.r.Kernel }
func (m miRow) Scalar(idx int) ptx.Reg                { return m.r.scalar(m.b, idx) }
func (m miRow) Dot(x []ptx.Reg) ptx.Reg               { return m.r.dotVec(m.b, x) }
func (m miRow) Axpy(a ptx.Reg, x []ptx.Reg, sub bool) { m.r.axpy(m.b, a, x, sub) }
func (m miRow) Pred(j int) *ptx.Reg                   { return m.r.elemPred(j, nil) }
func (m miRow) Tid() ptx.Reg                          { return m.r.tid }
func (m miRow) Index() int                            { return m.b.index }
func (m miRow) Changed(p ptx.Reg)                     { m.b.changed = &p }
func (m miRow) StoreOut(x []ptx.Reg)                  { m.r.storeRow(m.r.outPtr(m.b), x) }

func (m miRow) Maybe(p *ptx.Reg, op string, args ...ptx.Operand) { m.r.emitMaybe(p, op, args...) }

func (m miRow) Vec() func(j int) (ptx.Reg, *ptx.Reg) { return m.r.vecElems(m.b) }

func (m miRow) StoreFirst(v ptx.Reg) {
	r, b := m.r, m.b
	first := r.Reg(ptx.Pred)
	r.Emit("setp.eq.u32", first, r.tid, ptx.Imm(0))
	a := r.Reg(ptx.U64)
	r.Emit("mul.wide.u32", a, r.row, ptx.Imm(4*b.OutWidth))
	r.Emit("add.u64", a, a, b.params["out"])
	r.EmitIf(first, false, "st.global.f32", ptx.Addr{Base: a, Offset: int64(4 * b.OutCol)}, v)
}

func (m miRow) NormTotal() (tot, have ptx.Reg, ok bool) {
	if f := m.r.fold; f != nil {
		return f.tot, f.have, true
	}
	return ptx.Reg{}, ptx.Reg{}, false
}

func (m miRow) DotSquares(x []ptx.Reg) (ptx.Reg, ptx.Reg) {
	return m.r.reduce2(m.r.dotPartial(m.b, x), m.r.squares(x))
}
