package codegen

import (
	"fmt"
	"math"

	"xmix/ops"
	"xmix/ptx"
)

// The logit lens is a heavy read: RMSNorm with the final norm's weight and the whole LM head
// (vocab x hidden weights) for each row that enables it, then a top-k. It is not fused into a
// row kernel; it runs as four nodes after the add+norm kernel of its layer's resid_post:
//
//   - lens_norm: one block per row normalises the residual into act.lens_x.
//   - lens_logits: the model's own LM-head GEMM (the decode kernel below 8 rows, tensor cores
//     or cuBLASLt from 8), guarded, from act.lens_x into act.lens ([rows, Vocab]): it reads
//     the LM head once for every row of the step, at the GEMM's bandwidth, where one GEMV per
//     row would read it once per row. Its numbers are the model's logits' numbers: from 8
//     rows under cuBLASLt the normalised row is rounded to bf16 first.
//   - lens_topk_part: a block per (slice of lensTopKSlice logits, row) picks the slice's
//     top k into act.lens_cand, so that the scan of a row's logits is spread over the GPU.
//   - lens_topk: one block per row merges its Parts x k candidates into the app's buffer.
//
// Every row of the step goes through the norm and the GEMM (garbage for rows without the
// app, read by nobody); the top-k kernels skip those rows.
//
// Don't use, don't pay: every kernel first reads ctl.any_mask, the OR of the batch's app
// masks that the host writes per step, and returns at once when the app's bit is clear, so
// nothing else (weights, residuals) is read. The CUDA backend goes further and replays a
// graph without these nodes (loader/cuda/variants.go); the early exit is what holds on every
// other backend and past that graph's cap on heavy apps.

const (
	lensThreads   = 256
	lensTopKSlice = 1024 // logits per lens_topk_part block: 4 per thread per round
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
	// WOffset is added to the final norm's weight (1: Gemma's (1 + w)); Softcap, when not 0,
	// caps the top K's logits as the model's own are (Gemma 2's final soft-cap: the order,
	// and so the ids, are the same capped or not).
	WOffset, Softcap float32
}

func (c LensConfig) check() error {
	switch {
	case c.Hidden <= 0 || c.Vocab <= 0 || c.Vocab >= 1<<24:
		return fmt.Errorf("hidden %d, vocab %d (want vocab below 2^24, ids are stored as f32)", c.Hidden, c.Vocab)
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
		K: c.K, OutWidth: c.OutWidth, OutCol: c.OutCol, Slice: lensTopKSlice, WOffset: c.WOffset, Softcap: c.Softcap}
}

// Parts is how many slices lens_topk_part cuts a row's logits into.
func (c LensConfig) Parts() int { return (c.Vocab + lensTopKSlice - 1) / lensTopKSlice }

// CandWidth is a row of act.lens_cand: Parts x K ids, then their logits.
func (c LensConfig) CandWidth() int { return 2 * c.Parts() * c.K }

// RowsLaunch is lens_norm's and lens_topk's grid for rows rows: a block per row.
func (c LensConfig) RowsLaunch(rows int) ops.Launch {
	return ops.Launch{Grid: [3]int{rows, 1, 1}, Block: [3]int{lensThreads, 1, 1}}
}

// PartLaunch is lens_topk_part's grid for rows rows.
func (c LensConfig) PartLaunch(rows int) ops.Launch {
	return ops.Launch{Grid: [3]int{c.Parts(), rows, 1}, Block: [3]int{lensThreads, 1, 1}}
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

// LensNorm generates the lens's norm kernel. Parameters: any_mask, resid ([rows, Hidden]
// f32), w (final norm), out ([rows, Hidden] f32).
func LensNorm(name string, c LensConfig) (*Kernel, error) {
	if err := c.check(); err != nil {
		return nil, fmt.Errorf("lens_norm %s: %w", name, err)
	}
	e := newEmitter(name)
	e.MaxNTid = lensThreads
	anyP := e.param("any_mask", ptx.U64)
	resid := e.param("resid", ptx.U64)
	w := e.param("w", ptx.U64)
	out := e.param("out", ptx.U64)
	red := e.DeclareShared("lens_red", ptx.F32, lensThreads/32)
	end := e.NewLabel("end")
	exitUnless(e, loadU32(e, ptx.Addr{Base: anyP}), c.Bit, end)
	tid, row := e.special(ptx.TidX), e.special(ptx.CtaidX)
	rb := e.byteAddr(resid, row, 4*c.Hidden)
	ob := e.byteAddr(out, row, 4*c.Hidden)
	i := e.Reg(ptx.U32)
	ss := e.f32(0)
	e.forLoop(i, tid, ptx.Imm(int64(c.Hidden)), ptx.Imm(lensThreads), func() {
		x := e.loadAt(ptx.Addr{Base: e.byteAddr(rb, i, 4)}, ptx.F32)
		e.Emit("fma.rn.f32", ss, x, x, ss)
	})
	tot := e.blockReduce(ss, "add", red, tid, lensThreads)
	e.Emit("mul.rn.f32", tot, tot, ptx.F32Imm(1/float32(c.Hidden)))
	e.Emit("add.rn.f32", tot, tot, ptx.F32Imm(c.Eps))
	rs := e.Reg(ptx.F32)
	e.Emit("rsqrt.approx.f32", rs, tot)
	e.forLoop(i, tid, ptx.Imm(int64(c.Hidden)), ptx.Imm(lensThreads), func() {
		x := e.loadAt(ptx.Addr{Base: e.byteAddr(rb, i, 4)}, ptx.F32)
		e.Emit("mul.rn.f32", x, x, rs)
		wi := e.loadF32(w, i, c.WDtype)
		if c.WOffset != 0 {
			e.Emit("add.rn.f32", wi, wi, ptx.F32Imm(c.WOffset))
		}
		e.Emit("mul.rn.f32", x, x, wi)
		e.Emit("st.global.f32", ptx.Addr{Base: e.byteAddr(ob, i, 4)}, x)
	})
	e.Label(end)
	return finish(e.Kernel, "lens_norm", c.attrs())
}

// LensTopKPart generates the first top-k kernel. Parameters: any_mask, ctl_mask, logits
// ([rows, Vocab] f32), cand ([rows, CandWidth] f32). Block (p, row) writes the top K of
// logits [p*lensTopKSlice, (p+1)*lensTopKSlice) of the row as ids at cand[row][p*K:] and
// logits at cand[row][Parts*K + p*K:].
func LensTopKPart(name string, c LensConfig) (*Kernel, error) {
	return lensTopK(name, c, true)
}

// LensTopK generates the top-k merge. Parameters: any_mask, ctl_mask, cand (as
// LensTopKPart left it), out ([rows, OutWidth] f32). Both kernels order by logit descending,
// then id ascending; round j picks the first item after the previous pick in that order, so
// NaN logits are never picked, and a round with nothing left writes id Vocab and -inf. The
// top K of the union of the slices' top Ks is the row's top K.
func LensTopK(name string, c LensConfig) (*Kernel, error) {
	return lensTopK(name, c, false)
}

func lensTopK(name string, c LensConfig, part bool) (*Kernel, error) {
	kind := "lens_topk"
	if part {
		kind = "lens_topk_part"
	}
	if err := c.check(); err != nil {
		return nil, fmt.Errorf("%s %s: %w", kind, name, err)
	}
	e := newEmitter(name)
	e.MaxNTid = lensThreads
	anyP := e.param("any_mask", ptx.U64)
	maskP := e.param("ctl_mask", ptx.U64)
	inName, outName, rowDim := "cand", "out", ptx.CtaidX
	if part {
		inName, outName, rowDim = "logits", "cand", ptx.CtaidY
	}
	in := e.param(inName, ptx.U64)
	out := e.param(outName, ptx.U64)
	nw := lensThreads / 32
	redV := e.DeclareShared("topk_v", ptx.F32, nw+1)
	redI := e.DeclareShared("topk_i", ptx.U32, nw+1)
	end := e.NewLabel("end")
	exitUnless(e, loadU32(e, ptx.Addr{Base: anyP}), c.Bit, end)
	tid := e.special(ptx.TidX)
	row := e.special(rowDim)
	exitUnless(e, loadU32(e, ptx.Addr{Base: e.byteAddr(maskP, row, 4)}), c.Bit, end)
	pk := c.Parts() * c.K
	// The items: [lo, hi) of the row's logits, ids their positions (part); or the row's
	// Parts x K candidates, ids stored beside them (merge).
	var lo, hi ptx.Operand
	var vals, ids, ob, col0 ptx.Reg
	if part {
		p := e.special(ptx.CtaidX)
		vals = e.byteAddr(in, row, 4*c.Vocab)
		l := e.Reg(ptx.U32)
		e.Emit("mul.lo.u32", l, p, ptx.Imm(lensTopKSlice))
		h := e.op3("add.u32", ptx.U32, l, ptx.Imm(lensTopKSlice))
		e.Emit("min.u32", h, h, ptx.Imm(int64(c.Vocab)))
		lo, hi = l, h
		ob = e.byteAddr(out, row, 4*c.CandWidth())
		col0 = e.Reg(ptx.U32)
		e.Emit("mul.lo.u32", col0, p, ptx.Imm(int64(c.K)))
	} else {
		ids = e.byteAddr(in, row, 4*c.CandWidth())
		vals = e.byteAddr(ids, ptx.Imm(int64(pk)), 4)
		lo, hi = ptx.Imm(0), ptx.Imm(int64(pk))
		ob = e.byteAddr(out, row, 4*c.OutWidth)
		col0 = e.imm32(int64(c.OutCol))
	}
	// Where pick j's id and logit go: columns col0+j and col0+j+idLogitGap.
	idLogitGap := c.K
	if part {
		idLogitGap = pk
	}
	emitTopK(e, topKLoop{tid: tid, threads: lensThreads, redV: redV, redI: redI, rounds: ptx.Imm(int64(c.K)),
		lo: lo, hi: hi, none: int64(c.Vocab),
		load: func(i, ov, oi ptx.Reg) {
			e.Emit("ld.global.f32", ov, ptx.Addr{Base: e.byteAddr(vals, i, 4)})
			if part {
				e.Emit("mov.u32", oi, i)
			} else {
				id := e.Reg(ptx.F32)
				e.Emit("ld.global.f32", id, ptx.Addr{Base: e.byteAddr(ids, i, 4)})
				e.Emit("cvt.rzi.u32.f32", oi, id)
			}
		},
		store: func(j, bi, bv ptx.Reg) {
			col := e.op3("add.u32", ptx.U32, j, col0)
			id := e.Reg(ptx.F32)
			e.Emit("cvt.rn.f32.u32", id, bi)
			e.Emit("st.global.f32", ptx.Addr{Base: e.byteAddr(ob, col, 4)}, id)
			if c.Softcap > 0 && !part { // the merge writes the export: its logits capped
				v := e.op3("mul.rn.f32", ptx.F32, bv, ptx.F32Imm(capScale(c.Softcap)))
				e.capTanh(v, c.Softcap)
				bv = v
			}
			e.Emit("st.global.f32", ptx.Addr{Base: e.byteAddr(ob, col, 4), Offset: int64(4 * idLogitGap)}, bv)
		}})
	e.Label(end)
	return finish(e.Kernel, kind, c.attrs())
}

// topKLoop configures emitTopK.
type topKLoop struct {
	tid        ptx.Reg
	threads    int
	redV, redI ptx.Sym // shared, threads/32+1 each
	rounds     ptx.Operand
	lo, hi     ptx.Operand // the items: [lo, hi), thread tid taking lo+tid, lo+tid+threads, ...
	none       int64       // the id a round with nothing left reports (with -inf)
	// load sets ov and oi to item i's value and id; store writes round j's pick (thread 0).
	load  func(i, ov, oi ptx.Reg)
	store func(j, bi, bv ptx.Reg)
}

// emitTopK emits rounds block-wide arg-max rounds: round j picks the first item after the
// previous pick in the order value descending, id ascending, so NaN values are never
// picked and a round with nothing left picks (-inf, none). Every thread of the block runs it.
func emitTopK(e emitter, c topKLoop) {
	tid := c.tid
	lane := e.op3("and.b32", ptx.U32, tid, ptx.Imm(31))
	warp := e.op3("shr.u32", ptx.U32, tid, ptx.Imm(5))
	nw := c.threads / 32
	prevV, prevI := e.f32(float32(math.Inf(1))), e.Reg(ptx.S32)
	e.Emit("mov.s32", prevI, ptx.Imm(-1))
	j, i := e.Reg(ptx.U32), e.Reg(ptx.U32)
	start := e.Reg(ptx.U32)
	e.Emit("add.u32", start, tid, c.lo)
	bv, bi, ov, oi := e.Reg(ptx.F32), e.Reg(ptx.U32), e.Reg(ptx.F32), e.Reg(ptx.U32)
	better := func() { // (bv, bi) = (ov, oi) when ov is larger, or equal with a lower id
		gt := e.cmp("gt", ptx.F32, ov, bv)
		eq := e.cmp("eq", ptx.F32, ov, bv)
		e.Emit("and.pred", eq, eq, e.cmp("lt", ptx.U32, oi, bi))
		e.Emit("or.pred", gt, gt, eq)
		e.Emit("selp.f32", bv, ov, bv, gt)
		e.Emit("selp.u32", bi, oi, bi, gt)
	}
	e.forLoop(j, ptx.Imm(0), c.rounds, ptx.Imm(1), func() {
		e.Emit("mov.f32", bv, ptx.F32Imm(float32(math.Inf(-1))))
		e.Emit("mov.u32", bi, ptx.Imm(c.none))
		e.forLoop(i, start, c.hi, ptx.Imm(int64(c.threads)), func() {
			c.load(i, ov, oi)
			below := e.cmp("lt", ptx.F32, ov, prevV)
			tie := e.cmp("eq", ptx.F32, ov, prevV)
			e.Emit("and.pred", tie, tie, e.cmp("gt", ptx.S32, oi, prevI))
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
		e.EmitIf(lane0, false, "st.shared.f32", ptx.Addr{Base: e.sharedAddr(c.redV, warp, 4)}, bv)
		e.EmitIf(lane0, false, "st.shared.u32", ptx.Addr{Base: e.sharedAddr(c.redI, warp, 4)}, bi)
		e.Emit("bar.sync", ptx.Imm(0))
		e.when(e.cmp("eq", ptx.U32, tid, ptx.Imm(0)), false, func() {
			for w := 1; w < nw; w++ {
				e.Emit("ld.shared.f32", ov, ptx.Addr{Base: c.redV, Offset: int64(4 * w)})
				e.Emit("ld.shared.u32", oi, ptx.Addr{Base: c.redI, Offset: int64(4 * w)})
				better()
			}
			e.Emit("st.shared.f32", ptx.Addr{Base: c.redV, Offset: int64(4 * nw)}, bv)
			e.Emit("st.shared.u32", ptx.Addr{Base: c.redI, Offset: int64(4 * nw)}, bi)
			c.store(j, bi, bv)
		})
		e.Emit("bar.sync", ptx.Imm(0))
		e.Emit("ld.shared.f32", prevV, ptx.Addr{Base: c.redV, Offset: int64(4 * nw)})
		e.Emit("ld.shared.s32", prevI, ptx.Addr{Base: c.redI, Offset: int64(4 * nw)})
		// The next round's warp sums overwrite topk_v only after everyone read the pick.
		e.Emit("bar.sync", ptx.Imm(0))
	})
}
