package codegen

import (
	"fmt"
	"math"
	"slices"

	"xmix/bundle"
	"xmix/ir"
	"xmix/ops"
	"xmix/ptx"
)

// Row kernels run one block per row. Thread t holds columns t, t+T, t+2T, ... of the row in
// registers (T = threads per block), so every load and store of a warp touches 128
// contiguous bytes, and MI ops, reductions and the norm work on registers without a second
// pass over memory. The row width is a compile-time constant, so each thread's element count
// is too; only its last element may fall past the row (the tail), which is loaded as zero and
// never stored, so reductions need no masking. Keeping the whole row in registers bounds the
// width: at most maxPerThread elements per thread, which with 512 threads is 32768 columns
// (SiLU rows of 14336 use 56 registers per thread at 256 threads).

// maxPerThread bounds the registers a row takes per thread; ptxas has 255, and 512 threads
// of 64 row registers plus working registers still fit an SM's register file.
const maxPerThread = 64

// rowThreads picks the block size: 128 threads for narrow rows, 1024 up to 16384 columns
// (at most 16 registers of row per thread; at batch 1 one block is all a row kernel has, and
// 256 threads took 6.6 us for a 4096-wide add+norm on an H200), 512 beyond.
func rowThreads(width int) int {
	switch {
	case width <= 1024:
		return 128
	case width <= 16384:
		return 1024
	}
	return 512
}

// rowPer is how many of a row's elements each thread of its block holds.
func rowPer(width int) int { return (width + rowThreads(width) - 1) / rowThreads(width) }

// rowLaunch is the grid of a row kernel over rows rows of width columns.
func rowLaunch(width, rows int) ops.Launch {
	return ops.Launch{Grid: [3]int{rows, 1, 1}, Block: [3]int{rowThreads(width), 1, 1}}
}

// rowEmitter builds a row kernel of a fixed width.
type rowEmitter struct {
	emitter
	width, threads, per int
	tid, row            ptx.Reg
	tail                *ptx.Reg // this thread's last element is inside the row; nil: no tail
	scratch             ptx.Sym  // reduction scratch, declared on first use
	scratch2            ptx.Sym  // two-value reduction scratch, declared on first use
	lane0               *ptx.Reg // the thread is its warp's lane 0 (prefetchRow), set on first use
	// fold, when set, lets a residual project_out hand the norm its sum of squares
	// (emitProjectOut); a later op that writes the row takes it back (miSet.emit). nil in
	// kernels without such an op.
	fold *normFold
}

// normFold carries a sum of squares from a residual op to rmsNorm: have is true once tot
// holds the row's sum of squares.
type normFold struct {
	have, tot ptx.Reg
}

// foldNorm prepares the kernel for a residual op that computes the norm's sum of squares.
func (r *rowEmitter) foldNorm() {
	r.fold = &normFold{have: r.Reg(ptx.Pred), tot: r.Reg(ptx.F32)}
	r.Emit("setp.ne.u32", r.fold.have, r.tid, r.tid)
}

// reduce2 sums a and b over the block in one round; every thread gets both totals.
func (r *rowEmitter) reduce2(a, b ptx.Reg) (ptx.Reg, ptx.Reg) {
	if r.scratch2 == "" {
		r.scratch2 = r.DeclareShared("red2", ptx.F32, 2*r.threads/32)
	}
	return r.blockReduce2(a, b, "add", r.scratch2, r.tid, r.threads)
}

// squares is this thread's partial sum of x², in the order every sum of squares here uses.
func (r *rowEmitter) squares(x []ptx.Reg) ptx.Reg {
	ss := r.Reg(ptx.F32)
	r.Emit("mul.rn.f32", ss, x[0], x[0])
	for _, v := range x[1:] {
		r.Emit("fma.rn.f32", ss, v, v, ss)
	}
	return ss
}

func newRowEmitter(name string, width int) (*rowEmitter, error) {
	if width <= 0 {
		return nil, fmt.Errorf("row width %d", width)
	}
	t, per := rowThreads(width), rowPer(width)
	if per > maxPerThread {
		return nil, fmt.Errorf("row width %d exceeds the %d columns a register-resident row may have", width, t*maxPerThread)
	}
	r := &rowEmitter{emitter: newEmitter(name), width: width, threads: t, per: per}
	r.MaxNTid = t
	return r, nil
}

// begin reads the thread and row indices; call it after declaring every parameter.
func (r *rowEmitter) begin() {
	r.tid = r.special(ptx.TidX)
	r.row = r.special(ptx.CtaidX)
	if rem := r.width - (r.per-1)*r.threads; rem < r.threads {
		p := r.Reg(ptx.Pred)
		r.Emit("setp.lt.u32", p, r.tid, ptx.Imm(rem))
		r.tail = &p
	}
}

// outRow is the row a norm stores to: this block's row, or with gather the row out_row
// names, jumping to end when that is bundle.NoRow (a row whose norm nobody reads).
func (r *rowEmitter) outRow(gather bool, outRow ptx.Reg, end string) ptx.Reg {
	if !gather {
		return r.row
	}
	dst := r.Reg(ptx.U32)
	r.Emit("ld.global.nc.u32", dst, ptx.Addr{Base: r.elemAddr(outRow, r.row, 4)})
	skip := r.Reg(ptx.Pred)
	r.Emit("setp.eq.u32", skip, dst, ptx.Imm(bundle.NoRow))
	r.EmitIf(skip, false, "bra.uni", ptx.Sym(end))
	return dst
}

// rowPtr addresses this thread's elements of one row: element j is at reg + off +
// j*threads*size.
type rowPtr struct {
	reg ptx.Reg
	off int64
	dt  ptx.Type // storage type: F32 or BF16
	// nc: never written during a step (weights, compiled vectors): loads may take the
	// non-coherent path. Not for what an earlier kernel of the step wrote: ptxas moves
	// ld.global.nc above griddepcontrol.wait, so a kernel launched early would read its
	// input before the grid that writes it has ended (session 17: the delta of an add+norm
	// with an app's prefetches ahead of its wait).
	nc   bool
	size int
}

// ptr returns the rowPtr of base[rowIdx*stride + col + tid] for storage type dt.
func (r *rowEmitter) ptr(base, rowIdx ptx.Reg, stride, col int, dt ptx.Type, nc bool) rowPtr {
	size := dt.Bytes()
	off := r.Reg(ptx.U64)
	r.Emit("mul.wide.u32", off, rowIdx, ptx.Imm(stride*size))
	a := r.Reg(ptx.U64)
	r.Emit("add.u64", a, base, off)
	toff := r.Reg(ptx.U64)
	r.Emit("mul.wide.u32", toff, r.tid, ptx.Imm(size))
	r.Emit("add.u64", a, a, toff)
	return rowPtr{reg: a, off: int64(col * size), dt: dt, nc: nc, size: size}
}

// vecPtr addresses this thread's elements of a [width] vector.
func (r *rowEmitter) vecPtr(base ptx.Reg, dt ptx.Type) rowPtr {
	a := r.Reg(ptx.U64)
	r.Emit("mul.wide.u32", a, r.tid, ptx.Imm(dt.Bytes()))
	r.Emit("add.u64", a, a, base)
	return rowPtr{reg: a, dt: dt, nc: true, size: dt.Bytes()}
}

func (r *rowEmitter) addr(p rowPtr, j int) ptx.Addr {
	return ptx.Addr{Base: p.reg, Offset: p.off + int64(j*r.threads*p.size)}
}

// elemPred is the predicate under which element j is loaded or stored: guard (may be nil)
// and, for the last element, the tail. nil means unconditionally.
func (r *rowEmitter) elemPred(j int, guard *ptx.Reg) *ptx.Reg {
	if j != r.per-1 || r.tail == nil {
		return guard
	}
	if guard == nil {
		return r.tail
	}
	p := r.Reg(ptx.Pred)
	r.Emit("and.pred", p, *r.tail, *guard)
	return &p
}

// emitMaybe emits one instruction, guarded by p unless p is nil.
func (r *rowEmitter) emitMaybe(p *ptx.Reg, op string, args ...ptx.Operand) {
	if p == nil {
		r.Emit(op, args...)
		return
	}
	r.EmitIf(*p, false, op, args...)
}

// loadElem loads element j as f32; under pred (from elemPred) elements outside read as 0.
func (r *rowEmitter) loadElem(p rowPtr, j int, pred *ptx.Reg) ptx.Reg {
	x := r.Reg(ptx.F32)
	if pred != nil {
		r.Emit("mov.f32", x, ptx.F32Imm(0))
	}
	ld := "ld.global."
	if p.nc {
		ld = "ld.global.nc."
	}
	switch p.dt {
	case ptx.F32:
		r.emitMaybe(pred, ld+"f32", x, r.addr(p, j))
	default: // BF16; configs are validated to these two
		h := r.Reg(ptx.B16)
		r.emitMaybe(pred, ld+"b16", h, r.addr(p, j))
		r.emitMaybe(pred, "cvt.f32.bf16", x, h)
	}
	return x
}

// loadRow loads this thread's elements; with guard, all of them read as 0 unless it holds.
func (r *rowEmitter) loadRow(p rowPtr, guard *ptx.Reg) []ptx.Reg {
	x := make([]ptx.Reg, r.per)
	for j := range x {
		x[j] = r.loadElem(p, j, r.elemPred(j, guard))
	}
	return x
}

// prefetchRow asks L2 for this thread's lines of the row at p: lane 0 of each warp asks for
// the 128 bytes its warp's elements j span, for every j.
func (r *rowEmitter) prefetchRow(p rowPtr) {
	if r.lane0 == nil {
		lane, first := r.Reg(ptx.U32), r.Reg(ptx.Pred)
		r.Emit("and.b32", lane, r.tid, ptx.Imm(31))
		r.Emit("setp.eq.u32", first, lane, ptx.Imm(0))
		r.lane0 = &first
	}
	for j := range r.per {
		r.emitMaybe(r.elemPred(j, r.lane0), "prefetch.global.L2", r.addr(p, j))
	}
}

// storeRow stores this thread's elements in p's storage type (BF16 rounded to nearest even).
func (r *rowEmitter) storeRow(p rowPtr, x []ptx.Reg) {
	for j, v := range x {
		if p.dt == ptx.BF16 {
			h := r.Reg(ptx.B16)
			r.Emit("cvt.rn.bf16.f32", h, v)
			r.emitMaybe(r.elemPred(j, nil), "st.global.b16", r.addr(p, j), h)
			continue
		}
		r.emitMaybe(r.elemPred(j, nil), "st.global.f32", r.addr(p, j), v)
	}
}

// reduce sums v over the block; every thread gets the total.
func (r *rowEmitter) reduce(v ptx.Reg) ptx.Reg {
	if r.scratch == "" {
		r.scratch = r.DeclareShared("red", ptx.F32, r.threads/32)
	}
	return r.blockReduce(v, "add", r.scratch, r.tid, r.threads)
}

// rmsNorm turns x into x * rsqrt(mean(x²) + eps) * w, in place (HF LlamaRMSNorm order); w
// holds this thread's weights, loaded by loadNormWeight.
func (r *rowEmitter) rmsNorm(x, w []ptx.Reg, eps float32) {
	var tot ptx.Reg
	if r.fold == nil {
		tot = r.reduce(r.squares(x))
	} else {
		// A residual op may already have summed the squares (foldNorm); rows it skipped sum
		// them here, exactly as a kernel without it does.
		tot = r.fold.tot
		done := r.NewLabel("norm_total")
		r.EmitIf(r.fold.have, false, "bra.uni", ptx.Sym(done))
		r.Emit("mov.f32", tot, r.reduce(r.squares(x)))
		r.Label(done)
	}
	mean := r.Reg(ptx.F32)
	r.Emit("mul.rn.f32", mean, tot, ptx.F32Imm(1/float32(r.width)))
	r.Emit("add.rn.f32", mean, mean, ptx.F32Imm(eps))
	rs := r.Reg(ptx.F32)
	r.Emit("rsqrt.approx.f32", rs, mean)
	for j, v := range x {
		r.Emit("mul.rn.f32", v, v, rs)
		r.Emit("mul.rn.f32", v, v, w[j])
	}
}

// RowConfig configures RowNorm.
type RowConfig struct {
	Hidden, Vocab int
	Eps           float32
	WDtype        ptx.Type // storage of table and w: F32 or BF16
	Load          string   // embed | add
	// DeltaOps apply to delta (Load "add"), ResidOps to the residual before it is stored,
	// NormOps to the normed row; in a kernel they are numbered in that order.
	DeltaOps, ResidOps, NormOps []ir.MI
	Gather                      bool // out_row[row] picks the output row; NoRow skips the norm
	// WOffset is added (in f32) to every norm weight before it scales: 1 for Gemma's
	// RMSNorm, which multiplies by (1 + w); 0 for Llama's w.
	WOffset float32
	// DeltaNorm (Load "add") RMS-normalises delta with its own weight delta_w (plus WOffset)
	// before anything else sees it: Gemma 2's post-attention and post-feedforward norms, so
	// that the delta ops (attn_out, mlp_out) see what is added to the residual.
	DeltaNorm bool
	// EmbedScale (Load "embed"), when not 0, multiplies the embedded row before its ops:
	// Gemma's sqrt(hidden) (rounded to the model's dtype, as transformers does).
	EmbedScale float32
	// EarlyLaunch: the kernel is built for programmatic dependent launch (BuildInfo.PDL). One
	// with MI ops that read a vector or scalars then asks L2 for them before it waits for the
	// grid ahead (bundle.PriorGridWait, which earlyLaunch then leaves to it): they never
	// change during a step, and a kernel launched early is resident while the GEMM ahead
	// streams a layer's weights through L2, which evicts them. An op then finds them in L2
	// when it needs them, right after the residual add. It changes no result: the op's
	// attributes leave it out.
	EarlyLaunch bool
	// PreloadVectors (with EarlyLaunch): the kernel loads the compiled vectors and the scalars
	// of the ops a row enables into registers before it waits, instead of only asking L2 for
	// them (miSet.preloadParams; lowering sets it for templates of preloadMinRows rows and
	// more). It changes no result either.
	PreloadVectors bool
	// PreloadCoherent (with PreloadVectors): those loads are coherent (ld.global). ptxas 12.4
	// moves most read-only loads (ld.global.nc) of a preloading kernel past its wait, so that
	// only the mask's load stays ahead of it (session 68, Llama-3.1-8B with apps 1-6); it
	// keeps coherent ones where they are. It changes no result.
	PreloadCoherent bool
	// PreloadMaxRegs (with PreloadVectors), when not 0, bounds a thread's registers
	// (.maxnreg). A kernel launched early becomes resident only where an SM has room beside
	// the CTAs of the kernel ahead: at 1024 threads, one of more than 48 registers a thread
	// does not fit beside the 8-row copy-engine GEMM's CTA (512 threads at 32 registers; the
	// 8B's o and down take 128 of 132 SMs), and with its scalars preloaded ptxas 12.4 gives
	// the 8B's add+norm kernels with apps 1-6 52-64 where 44-54 without. It changes no result.
	PreloadMaxRegs int
	// OutOptional (not Gather): the kernel stores its f32 output only where out is not 0, so
	// that a backend may pass out_bf16 alone where no node reads the f32 (BuildInfo's
	// OptionalF32Out). A bundle built without it may not take an out of 0: its kernels store
	// there unguarded.
	OutOptional bool
}

// Launch is the grid for rows rows.
func (c RowConfig) Launch(rows int) ops.Launch { return rowLaunch(c.Hidden, rows) }

// MIOps lists the kernel's MI ops in parameter order (the order MIBindings expects).
func (c RowConfig) MIOps() []ir.MI {
	return append(append(append([]ir.MI(nil), c.DeltaOps...), c.ResidOps...), c.NormOps...)
}

// RowNorm generates the residual kernel: it loads a residual row (embedding lookup or
// resid + delta), applies MI ops, stores it back, and RMS-normalises it into out. Parameters:
// [tokens, table, resid | resid, delta, [delta_w]], w, out, [out_row | out_bf16], ctl_mask,
// [ctl_tokens], [ctl_gen], MI parameters. A token id >= Vocab embeds as zeros. Where
// out_bf16 (bundle.NormOutBF16; every kernel but the gathering final norm's) is not 0 the
// kernel also stores bf16 of each normalised value there, rounded as the backend's cast
// rounds it, so that the GEMM after it reads that with no cast; with OutOptional, where out
// is 0 it stores the bf16 alone.
func RowNorm(name string, c RowConfig) (*Kernel, error) {
	return named(bundle.OpRowNorm, name, c, rowNorm)
}

func rowNorm(name string, c RowConfig) (*Kernel, error) {
	if c.WDtype != ptx.F32 && c.WDtype != ptx.BF16 {
		return nil, fmt.Errorf("weight dtype %s is not f32 or bf16", c.WDtype)
	}
	attrs := ops.RowNormAttrs{Hidden: c.Hidden, Eps: c.Eps, WDtype: c.WDtype.String(), Load: c.Load, Gather: c.Gather,
		WOffset: c.WOffset, DeltaNorm: c.DeltaNorm, EmbedScale: c.EmbedScale, OutOptional: c.OutOptional}
	if c.OutOptional && c.Gather {
		return nil, fmt.Errorf("out optional with gather: a gathering norm has no bf16 copy to write instead")
	}
	switch {
	case c.Load == "embed" && c.Vocab > 0 && len(c.DeltaOps) == 0 && !c.DeltaNorm:
		attrs.Vocab = c.Vocab
	case c.Load == "add" && c.EmbedScale == 0:
	default:
		return nil, fmt.Errorf("load %q with vocab %d, %d delta ops, delta norm %v, embed scale %g", c.Load, c.Vocab, len(c.DeltaOps), c.DeltaNorm, c.EmbedScale)
	}
	if !finite32(c.WOffset) || !finite32(c.EmbedScale) {
		return nil, fmt.Errorf("weight offset %g, embed scale %g: want finite", c.WOffset, c.EmbedScale)
	}
	r, err := newRowEmitter(name, c.Hidden)
	if err != nil {
		return nil, err
	}
	var tokens, table, resid, delta ptx.Reg
	if c.Load == "embed" {
		tokens = r.param("tokens", ptx.U64)
		table = r.param("table", ptx.U64)
		resid = r.param("resid", ptx.U64)
	} else {
		resid = r.param("resid", ptx.U64)
		delta = r.param("delta", ptx.U64)
	}
	var deltaW ptx.Reg
	if c.DeltaNorm {
		deltaW = r.param("delta_w", ptx.U64)
	}
	w := r.param("w", ptx.U64)
	out := r.param("out", ptx.U64)
	var outRow, outB ptx.Reg
	if c.Gather {
		outRow = r.param("out_row", ptx.U64)
	} else {
		outB = r.param(bundle.NormOutBF16, ptx.U64)
	}
	mi, err := declareMI(r, c.DeltaOps, c.ResidOps, c.NormOps)
	if err != nil {
		return nil, err
	}
	attrs.DeltaOps, attrs.ResidOps, attrs.NormOps = mi.ref[0], mi.ref[1], mi.ref[2]
	if c.PreloadVectors {
		r.MaxNReg = c.PreloadMaxRegs
	}
	r.begin()
	// Everything this kernel reads from beyond L2 is asked for up front: between two add+norm
	// kernels the GEMMs stream a layer's weights through L2, so the norm weight and the MI
	// vectors come from HBM, and a load issued after the block reduction (or after an op's
	// branch) would add its whole latency to a kernel that is latency-bound at small batches.
	// Launched early, the kernel asks for the vectors and scalar tables before it waits
	// (RowConfig.EarlyLaunch).
	//
	// The residual row of an add+norm is asked for too: its last writer is an add+norm two or
	// more kernels back, and the GEMMs since (and the one after this kernel, launched early and
	// asking for its weights while this one runs) have streamed a layer's weights through L2,
	// so after the wait the row would come from HBM behind those weight requests. A prefetch
	// puts nothing in a register, so it cannot read the row before its last write lands, as a
	// load above the wait could (rowPtr.nc): the loads after the wait read what L2 holds then.
	residPtr := r.ptr(resid, r.row, c.Hidden, 0, ptx.F32, false)
	prefetchResid, params := c.EarlyLaunch && c.Load == "add", mi.prefetches()
	early := c.EarlyLaunch && (params || prefetchResid)
	if early {
		if c.PreloadVectors && params {
			mi.preloadParams(r, c.PreloadCoherent)
		}
		mi.prefetchParams(r)
		if prefetchResid {
			r.prefetchRow(residPtr)
		}
		r.Emit(bundle.PriorGridWait)
	}
	mi.loadCtl(r)
	mi.prefetchGates(r)
	if !early {
		mi.prefetchParams(r)
	}
	wv := r.loadNormWeight(w, c)
	var dw []ptx.Reg
	if c.DeltaNorm {
		dw = r.loadNormWeight(deltaW, c)
	}

	var x []ptx.Reg
	if c.Load == "embed" {
		tok := r.Reg(ptx.U32)
		r.Emit("ld.global.nc.u32", tok, ptx.Addr{Base: r.elemAddr(tokens, r.row, 4)})
		inVocab := r.Reg(ptx.Pred)
		r.Emit("setp.lt.u32", inVocab, tok, ptx.Imm(c.Vocab))
		x = r.loadRow(r.ptr(table, tok, c.Hidden, 0, c.WDtype, true), &inVocab)
		if c.EmbedScale != 0 {
			for _, v := range x {
				r.Emit("mul.rn.f32", v, v, ptx.F32Imm(c.EmbedScale))
			}
		}
	} else {
		d := r.loadRow(r.ptr(delta, r.row, c.Hidden, 0, ptx.F32, false), nil)
		if c.DeltaNorm {
			r.rmsNorm(d, dw, c.Eps)
		}
		mi.emit(r, 0, d, nil)
		x = r.loadRow(residPtr, nil)
		for j := range x {
			r.Emit("add.rn.f32", x[j], x[j], d[j])
		}
	}
	if slices.ContainsFunc(c.ResidOps, foldsNorm) {
		r.foldNorm()
	}
	mi.emit(r, 1, x, nil)
	r.storeRow(residPtr, x)

	end := r.NewLabel("end")
	dst := r.outRow(c.Gather, outRow, end)
	r.rmsNorm(x, wv, c.Eps)
	r.fold = nil // the norm ops' projections have no norm after them to hand a sum to
	mi.emit(r, 2, x, nil)
	f32 := func() { r.storeRow(r.ptr(out, dst, c.Hidden, 0, ptx.F32, false), x) }
	if c.OutOptional {
		r.when(r.cmp("eq", ptx.U64, out, ptx.Imm(0)), true, f32)
	} else {
		f32()
	}
	if !c.Gather {
		noB := r.Reg(ptx.Pred)
		r.Emit("setp.eq.u64", noB, outB, ptx.Imm(0))
		r.EmitIf(noB, false, "bra.uni", ptx.Sym(end))
		r.storeRow(r.ptr(outB, dst, c.Hidden, 0, ptx.BF16, false), x)
	}
	r.Label(end)
	return finish(r.Kernel, bundle.OpRowNorm, attrs)
}

func finite32(v float32) bool { return !math.IsNaN(float64(v)) && !math.IsInf(float64(v), 0) }

// loadNormWeight loads this thread's elements of a norm weight, WOffset added.
func (r *rowEmitter) loadNormWeight(w ptx.Reg, c RowConfig) []ptx.Reg {
	wv := r.loadRow(r.vecPtr(w, c.WDtype), nil)
	if c.WOffset != 0 {
		for _, v := range wv {
			r.Emit("add.rn.f32", v, v, ptx.F32Imm(c.WOffset))
		}
	}
	return wv
}

// SiluConfig configures SiluMul.
type SiluConfig struct {
	Inter int
	Ops   []ir.MI // hook mlp.act, applied before the store
	// Act is the gate's activation: "" for SiLU (SwiGLU, op silu_mul) or ActGeluTanh (GeGLU,
	// op gelu_tanh_mul).
	Act string
}

// ActGeluTanh is SiluConfig.Act of Gemma 2's GeGLU: GELU's tanh approximation
// (transformers' gelu_pytorch_tanh).
const ActGeluTanh = "gelu_tanh"

// op is the reference op of c's kernel (ops.GatedActivations).
func (c SiluConfig) op() (string, error) {
	switch c.Act {
	case "":
		return "silu_mul", nil
	case ActGeluTanh:
		return "gelu_tanh_mul", nil
	}
	return "", fmt.Errorf("activation %q: want empty (SiLU) or %q", c.Act, ActGeluTanh)
}

// actOfOp is SiluConfig.Act of a gated activation's op (bundle.GatedActOps), as SiluConfig.op
// maps it; an unknown op is SiLU's (callers check ops against bundle.GatedActOps first).
func actOfOp(op string) string {
	for _, act := range []string{"", ActGeluTanh} {
		if o, _ := (SiluConfig{Act: act}).op(); o == op {
			return act
		}
	}
	return ""
}

// gateAct emits act(g) * u into a new register. SiLU: g / (1 + 2^(-g*log2 e)). GELU (tanh):
// 0.5 g (1 + tanh(k)) = g / (1 + e^(-2k)) with k = sqrt(2/pi) (g + 0.044715 g³), the same
// form with the exponent -2k: no tanh instruction (tanh.approx.f32 is 2^-11 relative), and
// 0 or g at the ends (an infinite exponent gives 0, a vanishing one g). ex2.approx is within
// 2 ulp, the division exact.
func gateAct(e emitter, act string, g, u ptx.Reg) ptx.Reg {
	const negLog2e = -1.4426950408889634
	t := e.Reg(ptx.F32)
	if act == ActGeluTanh {
		e.Emit("mul.rn.f32", t, g, g)
		e.Emit("mul.rn.f32", t, t, g)
		e.Emit("fma.rn.f32", t, t, ptx.F32Imm(0.044715), g)
		e.Emit("mul.rn.f32", t, t, ptx.F32Imm(float32(2*math.Sqrt(2/math.Pi)*negLog2e)))
	} else {
		e.Emit("mul.rn.f32", t, g, ptx.F32Imm(negLog2e))
	}
	e.Emit("ex2.approx.f32", t, t)
	e.Emit("add.rn.f32", t, t, ptx.F32Imm(1))
	e.Emit("div.rn.f32", t, g, t)
	e.Emit("mul.rn.f32", t, t, u)
	return t
}

// Launch is the grid for rows rows.
func (c SiluConfig) Launch(rows int) ops.Launch {
	if len(c.Ops) == 0 {
		return ops.Launch{Grid: [3]int{(c.Inter + siluChunk - 1) / siluChunk, rows, 1}, Block: [3]int{siluThreads, 1, 1}}
	}
	return rowLaunch(c.Inter, rows)
}

// Without MI ops nothing needs the whole row in one block, so SiLU*up spreads each row over
// blocks of siluChunk elements: at batch 1 a single block per row would leave the GPU idle
// (one 14336-wide row took 28 us in one block).
const (
	siluThreads = 256
	siluPer     = 4
	siluChunk   = siluThreads * siluPer
)

// SiluMul generates act = f(gate) * up over gu rows [gate | up] of 2*Inter columns (f SiLU,
// or c.Act), with MI ops on act. Parameters: gu, act, ctl_mask, [ctl_tokens], [ctl_gen], MI
// parameters.
func SiluMul(name string, c SiluConfig) (*Kernel, error) {
	return named("silu_mul", name, c, siluMul)
}

func siluMul(name string, c SiluConfig) (*Kernel, error) {
	op, err := c.op()
	if err != nil {
		return nil, err
	}
	if len(c.Ops) == 0 {
		return siluMulChunked(name, c, op)
	}
	r, err := newRowEmitter(name, c.Inter)
	if err != nil {
		return nil, err
	}
	gu := r.param("gu", ptx.U64)
	act := r.param("act", ptx.U64)
	mi, err := declareMI(r, c.Ops)
	if err != nil {
		return nil, err
	}
	r.begin()
	mi.loadCtl(r)
	gate := r.ptr(gu, r.row, 2*c.Inter, 0, ptx.F32, false)
	up := gate
	up.off = int64(4 * c.Inter)
	x := make([]ptx.Reg, r.per)
	for j := range x {
		p := r.elemPred(j, nil)
		g := r.loadElem(gate, j, p)
		u := r.loadElem(up, j, p)
		x[j] = gateAct(r.emitter, c.Act, g, u)
	}
	mi.emit(r, 0, x, nil)
	r.storeRow(r.ptr(act, r.row, c.Inter, 0, ptx.F32, false), x)
	return finish(r.Kernel, op, ops.SiluMulAttrs{Inter: c.Inter, Ops: mi.ref[0]})
}

// siluMulChunked is act(gate)*up over a (chunk, row) grid: thread t of block (b, r) handles
// elements b*siluChunk + j*siluThreads + t, j < siluPer. Parameters: gu, act, act_bf16
// (bundle.GatedActBF16): where act_bf16 is not 0 the kernel also stores bf16 of each value
// there, rounded as the backend's cast rounds it (the GEMM after it then reads it with no
// cast), and where act is 0 it stores the bf16 alone; gu_bf16 (bundle.GatedGuBF16): where it
// is not 0 the kernel reads gate and up there, as bf16, and not from gu (a GEMM ahead that
// writes gu in bf16 for this kernel alone then writes and the kernel reads half the bytes).
func siluMulChunked(name string, c SiluConfig, op string) (*Kernel, error) {
	if c.Inter <= 0 {
		return nil, fmt.Errorf("inter %d", c.Inter)
	}
	e := newEmitter(name)
	gu := e.param("gu", ptx.U64)
	act := e.param("act", ptx.U64)
	actB := e.param(bundle.GatedActBF16, ptx.U64)
	guB := e.param(bundle.GatedGuBF16, ptx.U64)
	e.MaxNTid = siluThreads
	noF32, noBF16, inF32 := e.Reg(ptx.Pred), e.Reg(ptx.Pred), e.Reg(ptx.Pred)
	e.Emit("setp.eq.u64", noF32, act, ptx.Imm(0))
	e.Emit("setp.eq.u64", noBF16, actB, ptx.Imm(0))
	e.Emit("setp.eq.u64", inF32, guB, ptx.Imm(0))
	tid, blk, row := e.special(ptx.TidX), e.special(ptx.CtaidX), e.special(ptx.CtaidY)
	base := e.Reg(ptx.U32)
	e.Emit("mad.lo.u32", base, blk, ptx.Imm(siluChunk), tid)
	gRow := e.Reg(ptx.U32) // row * 2*Inter
	e.Emit("mul.lo.u32", gRow, row, ptx.Imm(2*c.Inter))
	aRow := e.Reg(ptx.U32)
	e.Emit("mul.lo.u32", aRow, row, ptx.Imm(c.Inter))
	for j := range siluPer {
		col := e.Reg(ptx.U32)
		e.Emit("add.u32", col, base, ptx.Imm(j*siluThreads))
		out := e.Reg(ptx.Pred)
		e.Emit("setp.ge.u32", out, col, ptx.Imm(c.Inter))
		skip := e.NewLabel("skip")
		e.EmitIf(out, false, "bra", ptx.Sym(skip))
		gi := e.Reg(ptx.U32)
		e.Emit("add.u32", gi, gRow, col)
		ui := e.Reg(ptx.U32)
		e.Emit("add.u32", ui, gi, ptx.Imm(c.Inter))
		g, u := e.Reg(ptx.F32), e.Reg(ptx.F32)
		fromF32, loaded := e.NewLabel("gu_f32"), e.NewLabel("loaded")
		e.EmitIf(inF32, false, "bra", ptx.Sym(fromF32))
		e.Emit("mov.f32", g, e.loadF32(guB, gi, ptx.BF16))
		e.Emit("mov.f32", u, e.loadF32(guB, ui, ptx.BF16))
		e.Emit("bra", ptx.Sym(loaded))
		e.Label(fromF32)
		e.Emit("mov.f32", g, e.loadF32(gu, gi, ptx.F32))
		e.Emit("mov.f32", u, e.loadF32(gu, ui, ptx.F32))
		e.Label(loaded)
		t := gateAct(e, c.Act, g, u)
		ai := e.Reg(ptx.U32)
		e.Emit("add.u32", ai, aRow, col)
		noB := e.NewLabel("no_bf16")
		e.EmitIf(noBF16, false, "bra", ptx.Sym(noB))
		e.storeF32(actB, ai, t, ptx.BF16)
		e.Label(noB)
		e.EmitIf(noF32, false, "bra", ptx.Sym(skip))
		e.storeF32(act, ai, t, ptx.F32)
		e.Label(skip)
	}
	return finish(e.Kernel, op, ops.SiluMulAttrs{Inter: c.Inter, Chunked: true})
}

// MIKernelConfig configures MIKernel: the hooked row is x[row*Stride+Offset : +Width].
type MIKernelConfig struct {
	Width, Stride, Offset int
	Ops                   []ir.MI
}

// Launch is the grid for rows rows.
func (c MIKernelConfig) Launch(rows int) ops.Launch { return rowLaunch(c.Width, rows) }

// MIKernel generates a standalone MI kernel for hooks whose producer cannot host the ops
// (GEMM and attention outputs). It works in place on x and writes x back only when an
// enabled op changed it; a row none of whose apps is enabled exits after one mask load.
// Parameters: x, ctl_mask, [ctl_tokens], [ctl_gen], MI parameters.
func MIKernel(name string, c MIKernelConfig) (*Kernel, error) {
	return named("mi", name, c, miKernel)
}

func miKernel(name string, c MIKernelConfig) (*Kernel, error) {
	if len(c.Ops) == 0 {
		return nil, fmt.Errorf("no MI ops")
	}
	if c.Offset < 0 || c.Offset+c.Width > c.Stride {
		return nil, fmt.Errorf("row [%d, +%d) does not fit a stride of %d", c.Offset, c.Width, c.Stride)
	}
	r, err := newRowEmitter(name, c.Width)
	if err != nil {
		return nil, err
	}
	xp := r.param("x", ptx.U64)
	mi, err := declareMI(r, c.Ops)
	if err != nil {
		return nil, err
	}
	r.begin()
	mi.loadCtl(r)
	end := r.NewLabel("end")
	mi.skipWithoutApps(r, c.Ops, end)

	p := r.ptr(xp, r.row, c.Stride, c.Offset, ptx.F32, false)
	mi.applyInPlace(r, p, end)
	attrs := ops.MIKernelAttrs{Width: c.Width, Stride: c.Stride, Offset: c.Offset, Ops: mi.ref[0]}
	return finish(r.Kernel, "mi", attrs)
}

// GatedKernelName is the gated-MLP kernel's base name at inter columns: silu_mul_i.. or
// gelu_tanh_mul_i.. (its op's name).
func GatedKernelName(c SiluConfig) string {
	op, err := c.op()
	if err != nil {
		op = "gated_mul"
	}
	return fmt.Sprintf("%s_i%d", op, c.Inter)
}
