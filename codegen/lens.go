package codegen

import (
	"fmt"
	"math"

	"xmix/ops"
	"xmix/ptx"
)

// The logit lens is a heavy read: RMSNorm with the final norm's weight and the whole LM head
// (vocab x hidden weights) for each row that enables it, then a top-k. It is not fused into a
// row kernel; it runs as two nodes after the add+norm kernel of its layer's resid_post:
//
//   - lens_logits: a grid of Vocab/lensVocabPerBlock blocks, independent of the batch size.
//     Each block loops over the rows; for a row whose mask has the app bit it normalises the
//     residual into shared memory and computes its slice of the row's logits (one warp per
//     vocabulary entry, reading the weight row coalesced) into a [rows, Vocab] scratch.
//   - lens_topk: one block per row; k block-wide arg-max rounds over the row's logits write
//     ids and logits into the app's buffer.
//
// Don't use, don't pay: every block of both kernels first reads ctl.any_mask, the OR of the
// batch's app masks that the host writes per step, and returns at once when the app's bit is
// clear, so nothing else (weights, residuals) is read. Expected idle cost on a GPU: two
// launches in the graph, ~Vocab/64 + rows blocks that each load one cached word and exit —
// a few microseconds, no memory traffic. A CUDA conditional node around the pair would bring
// it to ~nothing; the early exit keeps the graph plain and works on every backend.

const (
	lensThreads       = 256
	lensVocabPerBlock = 64 // 8 warps of 8 vocabulary entries
	lensSharedMax     = 48 * 1024
)

// LensConfig configures the two logit-lens kernels of one op.
type LensConfig struct {
	Hidden, Vocab int
	Eps           float32
	WDtype        ptx.Type // final norm and LM head storage
	Bit           int      // the app's bit in ctl_mask and any_mask
	K             int      // top-k
	OutWidth      int      // the export buffer's row
	OutCol        int      // first column of the op's 2K
}

func (c LensConfig) check() error {
	switch {
	case c.Hidden <= 0 || c.Vocab <= 0 || c.Vocab >= 1<<24:
		return fmt.Errorf("hidden %d, vocab %d (want vocab below 2^24, ids are stored as f32)", c.Hidden, c.Vocab)
	case 4*c.Hidden > lensSharedMax:
		return fmt.Errorf("hidden %d: the normalised row does not fit %d bytes of shared memory", c.Hidden, lensSharedMax)
	case c.WDtype != ptx.F32 && c.WDtype != ptx.BF16:
		return fmt.Errorf("weight dtype %s", c.WDtype)
	case c.Bit < 0 || c.Bit > 31:
		return fmt.Errorf("app bit %d", c.Bit)
	case c.K < 1 || c.K > c.Vocab || c.OutCol < 0 || c.OutCol+2*c.K > c.OutWidth:
		return fmt.Errorf("top %d into columns %d.. of %d", c.K, c.OutCol, c.OutWidth)
	}
	return nil
}

func (c LensConfig) attrs() ops.LensAttrs {
	return ops.LensAttrs{Hidden: c.Hidden, Vocab: c.Vocab, Eps: c.Eps, WDtype: c.WDtype.String(), Bit: c.Bit,
		K: c.K, OutWidth: c.OutWidth, OutCol: c.OutCol}
}

// LogitsLaunch is lens_logits' grid: it does not grow with rows.
func (c LensConfig) LogitsLaunch() ops.Launch {
	return ops.Launch{Grid: [3]int{(c.Vocab + lensVocabPerBlock - 1) / lensVocabPerBlock, 1, 1}, Block: [3]int{lensThreads, 1, 1}}
}

// TopKLaunch is lens_topk's grid for rows rows.
func (c LensConfig) TopKLaunch(rows int) ops.Launch {
	return ops.Launch{Grid: [3]int{rows, 1, 1}, Block: [3]int{lensThreads, 1, 1}}
}

func loadU32(e emitter, a ptx.Addr) ptx.Reg {
	r := e.Reg(ptx.U32)
	e.Emit("ld.global.u32", r, a)
	return r
}

// exitUnless emits the early exit: return unless bit is set in word.
func exitUnless(e emitter, word ptx.Reg, bit int, end string) {
	b := e.op3("and.b32", ptx.U32, word, ptx.Imm(int64(1)<<bit))
	e.EmitIf(e.cmp("eq", ptx.U32, b, ptx.Imm(0)), false, "bra.uni", ptx.Sym(end))
}

// LensLogits generates the lens's LM-head kernel. Parameters: any_mask, ctl_mask, resid
// ([rows, Hidden] f32), w (final norm), head ([Vocab, Hidden]), out ([rows, Vocab] f32),
// rows (u32 constant).
func LensLogits(name string, c LensConfig) (*Kernel, error) {
	if err := c.check(); err != nil {
		return nil, fmt.Errorf("lens_logits %s: %w", name, err)
	}
	e := newEmitter(name)
	e.MaxNTid = lensThreads
	anyP := e.param("any_mask", ptx.U64)
	maskP := e.param("ctl_mask", ptx.U64)
	resid := e.param("resid", ptx.U64)
	w := e.param("w", ptx.U64)
	head := e.param("head", ptx.U64)
	out := e.param("out", ptx.U64)
	rows := e.param("rows", ptx.U32)
	xs := e.DeclareShared("lens_x", ptx.F32, c.Hidden)
	red := e.DeclareShared("lens_red", ptx.F32, lensThreads/32)
	end := e.NewLabel("end")
	anyW := loadU32(e, ptx.Addr{Base: anyP})
	exitUnless(e, anyW, c.Bit, end)

	tid, blk := e.special(ptx.TidX), e.special(ptx.CtaidX)
	lane := e.op3("and.b32", ptx.U32, tid, ptx.Imm(31))
	warp := e.op3("shr.u32", ptx.U32, tid, ptx.Imm(5))
	first := e.Reg(ptx.U32) // this warp's first vocabulary entry
	e.Emit("mul.lo.u32", first, blk, ptx.Imm(lensVocabPerBlock))
	e.Emit("mad.lo.u32", first, warp, ptx.Imm(lensVocabPerBlock/(lensThreads/32)), first)
	row, i := e.Reg(ptx.U32), e.Reg(ptx.U32)
	e.forLoop(row, ptx.Imm(0), rows, ptx.Imm(1), func() {
		next := e.NewLabel("next_row")
		m := loadU32(e, ptx.Addr{Base: e.byteAddr(maskP, row, 4)})
		exitUnless(e, m, c.Bit, next)
		rb := e.byteAddr(resid, row, 4*c.Hidden)
		ss := e.f32(0)
		e.forLoop(i, tid, ptx.Imm(int64(c.Hidden)), ptx.Imm(lensThreads), func() {
			x := e.loadAt(ptx.Addr{Base: e.byteAddr(rb, i, 4)}, ptx.F32)
			e.Emit("fma.rn.f32", ss, x, x, ss)
			e.Emit("st.shared.f32", ptx.Addr{Base: e.sharedAddr(xs, i, 4)}, x)
		})
		// The reduction's barriers also publish every thread's stores to lens_x.
		tot := e.blockReduce(ss, "add", red, tid, lensThreads)
		e.Emit("mul.rn.f32", tot, tot, ptx.F32Imm(1/float32(c.Hidden)))
		e.Emit("add.rn.f32", tot, tot, ptx.F32Imm(c.Eps))
		rs := e.Reg(ptx.F32)
		e.Emit("rsqrt.approx.f32", rs, tot)
		e.forLoop(i, tid, ptx.Imm(int64(c.Hidden)), ptx.Imm(lensThreads), func() {
			a := ptx.Addr{Base: e.sharedAddr(xs, i, 4)}
			x := e.Reg(ptx.F32)
			e.Emit("ld.shared.f32", x, a)
			e.Emit("mul.rn.f32", x, x, rs)
			e.Emit("mul.rn.f32", x, x, e.loadF32(w, i, c.WDtype))
			e.Emit("st.shared.f32", a, x)
		})
		e.Emit("bar.sync", ptx.Imm(0))
		ob := e.byteAddr(out, row, 4*c.Vocab)
		for j := range lensVocabPerBlock / (lensThreads / 32) {
			v := e.op3("add.u32", ptx.U32, first, ptx.Imm(int64(j)))
			// Uniform per warp, so the shuffles below see all 32 lanes.
			e.when(e.cmp("lt", ptx.U32, v, ptx.Imm(int64(c.Vocab))), false, func() {
				wb := e.Reg(ptx.U64)
				e.Emit("mul.wide.u32", wb, v, ptx.Imm(int64(c.Hidden*c.WDtype.Bytes())))
				e.Emit("add.u64", wb, wb, head)
				acc := e.f32(0)
				e.forLoop(i, lane, ptx.Imm(int64(c.Hidden)), ptx.Imm(32), func() {
					x := e.Reg(ptx.F32)
					e.Emit("ld.shared.f32", x, ptx.Addr{Base: e.sharedAddr(xs, i, 4)})
					e.Emit("fma.rn.f32", acc, x, e.loadF32(wb, i, c.WDtype), acc)
				})
				e.warpReduce(acc, "add")
				e.EmitIf(e.cmp("eq", ptx.U32, lane, ptx.Imm(0)), false, "st.global.f32", ptx.Addr{Base: e.byteAddr(ob, v, 4)}, acc)
			})
		}
		// lens_x is rewritten for the next row only after every warp is done with it.
		e.Emit("bar.sync", ptx.Imm(0))
		e.Label(next)
	})
	e.Label(end)
	return finish(e.Kernel, "lens_logits", c.attrs())
}

// LensTopK generates the lens's top-k kernel. Parameters: any_mask, ctl_mask, logits
// ([rows, Vocab] f32), out ([rows, OutWidth] f32). Round j picks the largest logit below the
// previous pick in (logit descending, id ascending) order; NaN logits are never picked, and
// a round with nothing left writes id Vocab and -inf.
func LensTopK(name string, c LensConfig) (*Kernel, error) {
	if err := c.check(); err != nil {
		return nil, fmt.Errorf("lens_topk %s: %w", name, err)
	}
	e := newEmitter(name)
	e.MaxNTid = lensThreads
	anyP := e.param("any_mask", ptx.U64)
	maskP := e.param("ctl_mask", ptx.U64)
	logits := e.param("logits", ptx.U64)
	out := e.param("out", ptx.U64)
	nw := lensThreads / 32
	redV := e.DeclareShared("topk_v", ptx.F32, nw+1)
	redI := e.DeclareShared("topk_i", ptx.U32, nw+1)
	end := e.NewLabel("end")
	exitUnless(e, loadU32(e, ptx.Addr{Base: anyP}), c.Bit, end)
	tid, row := e.special(ptx.TidX), e.special(ptx.CtaidX)
	exitUnless(e, loadU32(e, ptx.Addr{Base: e.byteAddr(maskP, row, 4)}), c.Bit, end)
	lb := e.byteAddr(logits, row, 4*c.Vocab)
	ob := e.byteAddr(out, row, 4*c.OutWidth)
	lane := e.op3("and.b32", ptx.U32, tid, ptx.Imm(31))
	warp := e.op3("shr.u32", ptx.U32, tid, ptx.Imm(5))
	prevV, prevI := e.f32(float32(math.Inf(1))), e.Reg(ptx.S32)
	e.Emit("mov.s32", prevI, ptx.Imm(-1))
	j, i := e.Reg(ptx.U32), e.Reg(ptx.U32)
	bv, bi, ov, oi := e.Reg(ptx.F32), e.Reg(ptx.U32), e.Reg(ptx.F32), e.Reg(ptx.U32)
	better := func() { // (bv, bi) = (ov, oi) when ov is larger, or equal with a lower id
		gt := e.cmp("gt", ptx.F32, ov, bv)
		eq := e.cmp("eq", ptx.F32, ov, bv)
		e.Emit("and.pred", eq, eq, e.cmp("lt", ptx.U32, oi, bi))
		e.Emit("or.pred", gt, gt, eq)
		e.Emit("selp.f32", bv, ov, bv, gt)
		e.Emit("selp.u32", bi, oi, bi, gt)
	}
	e.forLoop(j, ptx.Imm(0), ptx.Imm(int64(c.K)), ptx.Imm(1), func() {
		e.Emit("mov.f32", bv, ptx.F32Imm(float32(math.Inf(-1))))
		e.Emit("mov.u32", bi, ptx.Imm(int64(c.Vocab)))
		e.forLoop(i, tid, ptx.Imm(int64(c.Vocab)), ptx.Imm(lensThreads), func() {
			e.Emit("ld.global.f32", ov, ptx.Addr{Base: e.byteAddr(lb, i, 4)})
			e.Emit("mov.u32", oi, i)
			below := e.cmp("lt", ptx.F32, ov, prevV)
			tie := e.cmp("eq", ptx.F32, ov, prevV)
			e.Emit("and.pred", tie, tie, e.cmp("gt", ptx.S32, i, prevI))
			e.Emit("or.pred", below, below, tie)
			skip := e.NewLabel("picked")
			e.EmitIf(below, true, "bra", ptx.Sym(skip))
			better()
			e.Label(skip)
		})
		for off := 16; off > 0; off /= 2 {
			e.Emit("shfl.sync.bfly.b32", ov, bv, ptx.Imm(int64(off)), ptx.Imm(0x1f), ptx.Imm(-1))
			e.Emit("shfl.sync.bfly.b32", oi, bi, ptx.Imm(int64(off)), ptx.Imm(0x1f), ptx.Imm(-1))
			better()
		}
		lane0 := e.cmp("eq", ptx.U32, lane, ptx.Imm(0))
		e.EmitIf(lane0, false, "st.shared.f32", ptx.Addr{Base: e.sharedAddr(redV, warp, 4)}, bv)
		e.EmitIf(lane0, false, "st.shared.u32", ptx.Addr{Base: e.sharedAddr(redI, warp, 4)}, bi)
		e.Emit("bar.sync", ptx.Imm(0))
		e.when(e.cmp("eq", ptx.U32, tid, ptx.Imm(0)), false, func() {
			for w := 1; w < nw; w++ {
				e.Emit("ld.shared.f32", ov, ptx.Addr{Base: redV, Offset: int64(4 * w)})
				e.Emit("ld.shared.u32", oi, ptx.Addr{Base: redI, Offset: int64(4 * w)})
				better()
			}
			e.Emit("st.shared.f32", ptx.Addr{Base: redV, Offset: int64(4 * nw)}, bv)
			e.Emit("st.shared.u32", ptx.Addr{Base: redI, Offset: int64(4 * nw)}, bi)
			col := e.op3("add.u32", ptx.U32, j, ptx.Imm(int64(c.OutCol)))
			id := e.Reg(ptx.F32)
			e.Emit("cvt.rn.f32.u32", id, bi)
			e.Emit("st.global.f32", ptx.Addr{Base: e.byteAddr(ob, col, 4)}, id)
			e.Emit("st.global.f32", ptx.Addr{Base: e.byteAddr(ob, col, 4), Offset: int64(4 * c.K)}, bv)
		})
		e.Emit("bar.sync", ptx.Imm(0))
		e.Emit("ld.shared.f32", prevV, ptx.Addr{Base: redV, Offset: int64(4 * nw)})
		e.Emit("ld.shared.s32", prevI, ptx.Addr{Base: redI, Offset: int64(4 * nw)})
		// The next round's warp sums overwrite topk_v only after everyone read the pick.
		e.Emit("bar.sync", ptx.Imm(0))
	})
	e.Label(end)
	return finish(e.Kernel, "lens_topk", c.attrs())
}
