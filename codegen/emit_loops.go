package codegen

import "xmix/ptx"

// Structured control flow and address idioms for the forward kernels. Loops and branches take
// their bodies as closures so that the generators read like the loops they emit.

// forLoop emits `for i = start; i < end; i += step { body }` over u32 values.
func (e emitter) forLoop(i ptx.Reg, start, end, step ptx.Operand, body func()) {
	e.Emit("mov.u32", i, start)
	e.whileLoop(i, end, step, body)
}

// whileLoop emits `for ; i < end; i += step { body }` over u32 values.
func (e emitter) whileLoop(i ptx.Reg, end, step ptx.Operand, body func()) {
	top, done := e.NewLabel("loop"), e.NewLabel("loop_end")
	p := e.Reg(ptx.Pred)
	e.Label(top)
	e.Emit("setp.ge.u32", p, i, end)
	e.EmitIf(p, false, "bra", ptx.Sym(done))
	body()
	e.Emit("add.u32", i, i, step)
	e.Emit("bra", ptx.Sym(top))
	e.Label(done)
}

// unrolled emits `for i = start; i < end; i += step { use(i, load(i, 0)) }` with the loads
// of u consecutive iterations issued before the first of them is used: load(i, j) loads the
// element of iteration i + j*step. The uses run in the loop's order, one iteration at a time,
// so a sum keeps its order bit for bit, and a use may branch out of the loop. The iterations
// after the last whole group of u run one by one. end + (u-1)*step must fit in a u32.
func (e emitter) unrolled(i ptx.Reg, start, end ptx.Operand, step, u int, load func(i ptx.Reg, j int) ptx.Reg, use func(i, x ptx.Reg)) {
	unrolledOf(e, i, start, end, step, u, load, use)
}

// unrolledOf is unrolled for loads of any shape: T is what one iteration loads (a register,
// or the registers of one vector load).
func unrolledOf[T any](e emitter, i ptx.Reg, start, end ptx.Operand, step, u int, load func(i ptx.Reg, j int) T, use func(i ptx.Reg, x T)) {
	group, tail, done := e.NewLabel("unrolled"), e.NewLabel("unrolled_tail"), e.NewLabel("unrolled_end")
	last, p := e.Reg(ptx.U32), e.Reg(ptx.Pred)
	e.Emit("mov.u32", i, start)
	e.Label(group)
	e.Emit("add.u32", last, i, ptx.Imm(int64((u-1)*step)))
	e.Emit("setp.ge.u32", p, last, end)
	e.EmitIf(p, false, "bra", ptx.Sym(tail))
	xs := make([]T, u)
	for j := range xs {
		xs[j] = load(i, j)
	}
	for _, x := range xs {
		use(i, x)
		e.Emit("add.u32", i, i, ptx.Imm(int64(step)))
	}
	e.Emit("bra", ptx.Sym(group))
	e.Label(tail)
	e.Emit("setp.ge.u32", p, i, end)
	e.EmitIf(p, false, "bra", ptx.Sym(done))
	use(i, load(i, 0))
	e.Emit("add.u32", i, i, ptx.Imm(int64(step)))
	e.Emit("bra", ptx.Sym(tail))
	e.Label(done)
}

// when emits body guarded by a branch over it: it runs only where p holds (or fails, if neg).
func (e emitter) when(p ptx.Reg, neg bool, body func()) {
	skip := e.NewLabel("skip")
	e.EmitIf(p, !neg, "bra", ptx.Sym(skip))
	body()
	e.Label(skip)
}

// drawTicket is the last-block pattern's draw, for every thread of a block: after a barrier,
// thread 0 (tid) fences at GPU scope, which orders every store of the block before it (the
// barrier made them thread 0's to order), adds 1 to the u32 counter at ctr, fences again, and
// passes the old count through the shared word flag; every thread gets it (and first, the
// predicate of thread 0, which resets the counter once the last block is done with it). The
// block that draws the last count sees every other block's stores once the barrier after
// thread 0's second fence has passed: CUTLASS's semaphore pattern (one fence, not one a
// thread).
func (e emitter) drawTicket(ctr ptx.Reg, flag ptx.Sym, tid ptx.Reg) (ticket, first ptx.Reg) {
	e.Emit("bar.sync", ptx.Imm(0))
	first = e.cmp("eq", ptx.U32, tid, ptx.Imm(0))
	ticket = e.Reg(ptx.U32)
	e.when(first, false, func() {
		e.Emit("fence.acq_rel.gpu")
		e.Emit("atom.global.add.u32", ticket, ptx.Addr{Base: ctr}, ptx.Imm(1))
		e.Emit("fence.acq_rel.gpu")
		e.Emit("st.shared.u32", ptx.Addr{Base: flag}, ticket)
	})
	e.Emit("bar.sync", ptx.Imm(0))
	e.Emit("ld.shared.u32", ticket, ptx.Addr{Base: flag})
	return ticket, first
}

// cmp emits setp.<cmp>.<t> and returns the predicate.
func (e emitter) cmp(cmp string, t ptx.Type, a, b ptx.Operand) ptx.Reg {
	p := e.Reg(ptx.Pred)
	e.Emit("setp."+cmp+"."+t.String(), p, a, b)
	return p
}

// op3 emits a two-source instruction into a fresh register of type t.
func (e emitter) op3(op string, t ptx.Type, a, b ptx.Operand) ptx.Reg {
	r := e.Reg(t)
	e.Emit(op, r, a, b)
	return r
}

// byteAddr returns base + idx*stride as a 64-bit address (idx is u32, stride in bytes).
func (e emitter) byteAddr(base ptx.Reg, idx ptx.Operand, stride int) ptx.Reg {
	off := e.Reg(ptx.U64)
	e.Emit("mul.wide.u32", off, idx, ptx.Imm(stride))
	a := e.Reg(ptx.U64)
	e.Emit("add.u64", a, base, off)
	return a
}

// loadAt loads one element of storage type dt (F32 or BF16) at a as f32.
func (e emitter) loadAt(a ptx.Addr, dt ptx.Type) ptx.Reg {
	r := e.Reg(ptx.F32)
	if dt == ptx.BF16 {
		h := e.Reg(ptx.B16)
		e.Emit("ld.global.b16", h, a)
		e.Emit("cvt.f32.bf16", r, h)
		return r
	}
	e.Emit("ld.global.f32", r, a)
	return r
}

// storeAt stores f32 v at a in storage type dt (F32 or BF16).
func (e emitter) storeAt(a ptx.Addr, v ptx.Reg, dt ptx.Type) {
	if dt == ptx.BF16 {
		h := e.Reg(ptx.B16)
		e.Emit("cvt.rn.bf16.f32", h, v)
		e.Emit("st.global.b16", a, h)
		return
	}
	e.Emit("st.global.f32", a, v)
}

// exp2 returns 2^x (ex2.approx: relative error about 2^-22, and 2^-inf = 0).
func (e emitter) exp2(x ptx.Reg) ptx.Reg {
	r := e.Reg(ptx.F32)
	e.Emit("ex2.approx.f32", r, x)
	return r
}

// sharedAddr returns the 32-bit shared-space address of arr[idx] for elements of size bytes.
func (e emitter) sharedAddr(arr ptx.Sym, idx ptx.Reg, size int) ptx.Reg {
	base := e.Reg(ptx.U32)
	e.Emit("mov.u32", base, arr)
	a := e.Reg(ptx.U32)
	e.Emit("mad.lo.u32", a, idx, ptx.Imm(int64(size)), base)
	return a
}

// log2 returns log2(n) when n is a power of two.
func log2(n int) (int, bool) {
	if n <= 0 || n&(n-1) != 0 {
		return 0, false
	}
	k := 0
	for 1<<k < n {
		k++
	}
	return k, true
}

// dtypeName is the ops attribute spelling of a storage type.
func dtypeName(t ptx.Type) (string, bool) {
	switch t {
	case ptx.F32:
		return "f32", true
	case ptx.BF16:
		return "bf16", true
	}
	return "", false
}

// dtypeOf is the storage type an ops attribute spells name (dtypeName's inverse).
func dtypeOf(name string) (ptx.Type, bool) {
	for _, t := range []ptx.Type{ptx.F32, ptx.BF16} {
		if n, _ := dtypeName(t); n == name {
			return t, true
		}
	}
	return 0, false
}
