package codegen

import (
	"fmt"
	"math"

	"xmix/bundle"
	"xmix/ir"
	"xmix/mi"
	"xmix/ops"
	"xmix/ptx"
)

// SampleConfig is the sampler over a vocabulary of Vocab logits per sample.
type SampleConfig struct {
	Vocab int
	// Logprobs is how many top tokens a sample may ask for (ops.SampleAttrs.Logprobs; 0:
	// the kernel reports no logprobs); EOS are the ids a sample under min_tokens may not
	// pick (none: no ban).
	Logprobs int
	EOS      []int
	// Overrides are token_override ops (hook sampled): ops with Template "token_override",
	// Alpha the index of the token in Scal, and gates other than activation.
	Overrides []ir.MI
}

func (c SampleConfig) refOverrides() []ops.TokenOverride {
	var out []ops.TokenOverride
	for _, o := range c.Overrides {
		out = append(out, ops.TokenOverride{Bit: o.Bit, Token: o.Alpha, ScalStride: o.ScalStride, ScalRows: o.ScalRows, Gates: o.Gates, Fired: o.FiredWidth})
	}
	return out
}

// threads is the block size: a thread per few logits for small vocabularies, up to 1024 for
// large ones. One block reads its sample's whole row on one SM, each pass waiting on what its
// threads keep in flight, so the greedy arg-max and the nucleus passes take the most threads;
// the final scan is serial over the threads' segment sums, which a sampled row pays once.
func (c SampleConfig) threads() int {
	return min(1024, max(32, (c.Vocab/4+31)/32*32))
}

// Launch is the grid for samples samples: one block per sample.
func (c SampleConfig) Launch(samples int) ops.Launch {
	return ops.Launch{Grid: [3]int{samples, 1, 1}, Block: [3]int{c.threads(), 1, 1}}
}

// Sample generates the sampler kernel; parameters: logits, temperature, top_p, rng, out (all
// u64). temperature <= 0 is greedy; otherwise the nucleus is found without sorting by
// bisecting a threshold on relative log2-probability (ops.SampleIters block reductions), and
// the token is the first in index order whose prefix of kept probability exceeds
// rng/2^32 * kept mass. ops "sample" forms every sum in the same order, so the two agree on
// the token. A sample whose logits are not all finite gets bundle.NonFinite, which no override
// replaces: the pass that reads every logit first (the max, or the greedy arg-max) also adds
// up x-x, NaN from the first NaN or infinity on. With overrides, the parameters go on as
// ops.SampleAttrs says.
func Sample(name string, c SampleConfig) (*Kernel, error) {
	attrs := ops.SampleAttrs{Vocab: c.Vocab, Logprobs: c.Logprobs, EOS: c.EOS, Overrides: c.refOverrides()}
	if err := attrs.Check(); err != nil {
		return nil, fmt.Errorf("sample %s: %w", name, err)
	}
	for i, o := range c.Overrides {
		if o.Template != "token_override" || o.Scal == "" {
			return nil, fmt.Errorf("sample %s: override %d: template %s with scalar table %q", name, i, o.Template, o.Scal)
		}
	}
	g := sampleGen{emitter: newEmitter(name), c: c, nt: c.threads()}
	g.MaxNTid = g.nt // ptxas keeps the registers to what a block of nt threads may have
	if err := g.emit(attrs.Overrides); err != nil {
		return nil, fmt.Errorf("sample %s: %w", name, err)
	}
	return finish(g.Kernel, "sample", attrs)
}

type sampleGen struct {
	emitter
	c         SampleConfig
	nt        int
	tid, lb   ptx.Reg // thread id, this sample's logits
	m, scale  ptx.Reg // max logit, log2(e)/T
	red, redi ptx.Sym
	// outAddr is this sample's token; finish follows the overrides, where a non-finite
	// sample goes once bundle.NonFinite is stored.
	outAddr ptx.Addr
	finish  string
}

func (g *sampleGen) emit(refs []ops.TokenOverride) error {
	logits := g.param("logits", ptx.U64)
	tempP := g.param("temperature", ptx.U64)
	topP := g.param("top_p", ptx.U64)
	rngP := g.param("rng", ptx.U64)
	out := g.param("out", ptx.U64)
	var lpKP, lpOut, banP ptx.Reg
	if g.c.Logprobs > 0 {
		lpKP, lpOut = g.param("lp_k", ptx.U64), g.param("lp_out", ptx.U64)
	}
	if len(g.c.EOS) > 0 {
		banP = g.param("eos_ban", ptx.U64)
	}
	override, err := g.declareOverrides(refs)
	if err != nil {
		return err
	}
	g.red = g.DeclareShared("smp_red", ptx.F32, 4*g.nt/32)
	g.redi = g.DeclareShared("smp_redi", ptx.U32, g.nt/32)
	part := g.DeclareShared("smp_part", ptx.F32, g.nt)
	smp := g.special(ptx.CtaidX)
	g.tid = g.special(ptx.TidX)
	g.lb = g.byteAddr(logits, smp, 4*g.c.Vocab)
	load := func(p ptx.Reg, t ptx.Type) ptx.Reg {
		r := g.Reg(t)
		g.Emit("ld.global."+t.String(), r, ptx.Addr{Base: g.byteAddr(p, smp, 4)})
		return r
	}
	temp, tp, rng := load(tempP, ptx.F32), load(topP, ptx.F32), load(rngP, ptx.U32)
	outAddr := ptx.Addr{Base: g.byteAddr(out, smp, 4)}
	// Logprobs come from the logits as given, so they are taken before the EOS ban.
	var lp *logprobRegs
	if g.c.Logprobs > 0 {
		lp = g.logprobStats(load(lpKP, ptx.U32), g.byteAddr(lpOut, smp, 4*(1+2*g.c.Logprobs)))
	}
	var ban *eosBan
	if len(g.c.EOS) > 0 {
		ban = g.banEOS(load(banP, ptx.U32))
	}
	g.outAddr, g.finish = outAddr, g.NewLabel("finish")
	end, greedy := g.NewLabel("end"), g.NewLabel("greedy")
	g.EmitIf(g.cmp("gt", ptx.F32, temp, ptx.F32Imm(0)), true, "bra", ptx.Sym(greedy))

	mx, bad := g.f32(float32(math.Inf(-1))), g.f32(0)
	g.scanAll(func(_, x ptx.Reg) {
		g.Emit("max.f32", mx, mx, x)
		g.addNonFinite(bad, x)
	})
	var flag ptx.Reg
	g.m, flag = g.blockReduce2(mx, g.nonFiniteFlag(bad), "max", g.red, g.tid, g.nt)
	// Every thread has the flag: a uniform branch past the barriers below.
	g.when(g.cmp("gt", ptx.F32, flag, ptx.F32Imm(0)), false, func() {
		g.EmitIf(g.cmp("eq", ptx.U32, g.tid, ptx.Imm(0)), false, "st.global.u32", outAddr, g.imm32(bundle.NonFinite))
		g.Emit("bra", ptx.Sym(g.finish))
	})
	g.scale = g.Reg(ptx.F32)
	g.Emit("rcp.rn.f32", g.scale, temp)
	g.Emit("mul.rn.f32", g.scale, g.scale, ptx.F32Imm(ops.Log2E))

	thr := g.f32(float32(math.Inf(-1)))
	g.when(g.cmp("gt", ptx.F32, tp, ptx.F32Imm(0)), false, func() {
		g.when(g.cmp("lt", ptx.F32, tp, ptx.F32Imm(1)), false, func() {
			lo, hi, target := g.f32(ops.SampleFloor), g.f32(0), g.Reg(ptx.F32)
			g.bisectTwice(lo, hi, target, tp)
			it := g.Reg(ptx.U32)
			g.forLoop(it, ptx.Imm(1), ptx.Imm(ops.SampleIters/2), ptx.Imm(1), func() { g.bisectTwice(lo, hi, target, ptx.Reg{}) })
			g.Emit("mov.f32", thr, lo)
		})
	})

	// Each thread sums the kept mass of its contiguous segment of the vocabulary.
	seg := (g.c.Vocab + g.nt - 1) / g.nt
	segSum := g.f32(0)
	g.segment(g.tid, seg, func(i, w ptx.Reg) { g.Emit("add.rn.f32", segSum, segSum, w) }, thr)
	g.Emit("st.shared.f32", ptx.Addr{Base: g.sharedAddr(part, g.tid, 4)}, segSum)
	g.Emit("bar.sync", ptx.Imm(0))
	g.EmitIf(g.cmp("ne", ptx.U32, g.tid, ptx.Imm(0)), false, "bra", ptx.Sym(end))
	// Thread 0 scans the segment sums, then walks the segment the draw falls in.
	total, j := g.f32(0), g.Reg(ptx.U32)
	partAt := func(j ptx.Reg, k int) ptx.Reg {
		v := g.Reg(ptx.F32)
		g.Emit("ld.shared.f32", v, ptx.Addr{Base: g.sharedAddr(part, j, 4), Offset: int64(4 * k)})
		return v
	}
	g.unrolled(j, ptx.Imm(0), ptx.Imm(int64(g.nt)), 1, sampleUnroll, partAt, func(_, pj ptx.Reg) {
		g.Emit("add.rn.f32", total, total, pj)
	})
	u := g.Reg(ptx.F32)
	g.Emit("cvt.rn.f32.u32", u, rng)
	g.Emit("mul.rn.f32", u, u, ptx.F32Imm(0x1p-32))
	g.Emit("mul.rn.f32", u, u, total)
	run, base, prev, segIdx := g.f32(0), g.f32(0), g.Reg(ptx.F32), g.imm32(0)
	found := g.NewLabel("found")
	g.unrolled(j, ptx.Imm(0), ptx.Imm(int64(g.nt)), 1, sampleUnroll, partAt, func(j, pj ptx.Reg) {
		g.Emit("mov.f32", prev, run)
		g.Emit("add.rn.f32", run, run, pj)
		nz := g.cmp("gt", ptx.F32, pj, ptx.F32Imm(0))
		g.Emit("selp.u32", segIdx, j, segIdx, nz)
		g.Emit("selp.f32", base, prev, base, nz)
		g.EmitIf(g.cmp("gt", ptx.F32, run, u), false, "bra", ptx.Sym(found))
	})
	// Rounding left no prefix above u: take the last token with mass.
	g.Emit("mov.f32", u, ptx.F32Imm(float32(math.Inf(1))))
	g.Label(found)
	last := g.imm32(0)
	g.segment(segIdx, seg, func(i, w ptx.Reg) {
		g.Emit("selp.u32", last, i, last, g.cmp("gt", ptx.F32, w, ptx.F32Imm(0)))
		g.Emit("add.rn.f32", base, base, w)
		picked := g.cmp("gt", ptx.F32, base, u)
		g.EmitIf(picked, false, "st.global.u32", outAddr, i)
		g.EmitIf(picked, false, "bra", ptx.Sym(end))
	}, thr)
	g.Emit("st.global.u32", outAddr, last)
	g.Emit("bra", ptx.Sym(end))

	g.Label(greedy)
	g.argmax(outAddr)
	g.Label(end)
	override(smp, outAddr)
	g.Label(g.finish)
	if ban != nil {
		g.unbanEOS(ban)
	}
	if lp != nil {
		g.sampledLogprob(lp, outAddr)
	}
	return nil
}

// logprobRegs are a sample's log-softmax terms, for the logprob of x = (x - m) - l.
type logprobRegs struct {
	on   ptx.Reg // lp_k != 0: the sample wants logprobs
	m, l ptx.Reg
	row  ptx.Reg // the sample's row of lp_out
}

// logprobStats emits, for a sample with lp_k != 0, the max logit m, l = ln(sum 2^((x-m)
// log2 e)) summed per thread over a stride then across the block, and the lp_k-1 top tokens
// (emitTopK's rounds over the vocabulary) into the sample's row of lp_out.
func (g *sampleGen) logprobStats(k, row ptx.Reg) *logprobRegs {
	lp := &logprobRegs{on: g.cmp("ne", ptx.U32, k, ptx.Imm(0)), m: g.f32(0), l: g.f32(0), row: row}
	nw := g.nt / 32
	redV := g.DeclareShared("lp_v", ptx.F32, nw+1)
	redI := g.DeclareShared("lp_i", ptx.U32, nw+1)
	g.when(lp.on, false, func() {
		mx := g.f32(float32(math.Inf(-1)))
		g.strided(func(_, x ptx.Reg) { g.Emit("max.f32", mx, mx, x) })
		g.Emit("mov.f32", lp.m, g.blockReduce(mx, "max", g.red, g.tid, g.nt))
		sum := g.f32(0)
		g.strided(func(_, x ptx.Reg) {
			y := g.op3("sub.rn.f32", ptx.F32, x, lp.m)
			g.Emit("mul.rn.f32", y, y, ptx.F32Imm(ops.Log2E))
			g.Emit("add.rn.f32", sum, sum, g.exp2(y))
		})
		tot := g.blockReduce(sum, "add", g.red, g.tid, g.nt)
		g.Emit("lg2.approx.f32", lp.l, tot)
		g.Emit("mul.rn.f32", lp.l, lp.l, ptx.F32Imm(ops.Ln2))
		top := g.op3("sub.u32", ptx.U32, k, ptx.Imm(1))
		emitTopK(g.emitter, topKLoop{tid: g.tid, threads: g.nt, redV: redV, redI: redI, rounds: top,
			lo: ptx.Imm(0), hi: ptx.Imm(int64(g.c.Vocab)), none: int64(g.c.Vocab),
			load: func(i, ov, oi ptx.Reg) {
				g.Emit("ld.global.f32", ov, ptx.Addr{Base: g.byteAddr(g.lb, i, 4)})
				g.Emit("mov.u32", oi, i)
			},
			store: func(j, bi, bv ptx.Reg) {
				col := g.op3("add.u32", ptx.U32, j, ptx.Imm(1))
				id := g.Reg(ptx.F32)
				g.Emit("cvt.rn.f32.u32", id, bi)
				g.Emit("st.global.f32", ptx.Addr{Base: g.byteAddr(row, col, 4)}, id)
				g.Emit("st.global.f32", ptx.Addr{Base: g.byteAddr(row, col, 4), Offset: int64(4 * g.c.Logprobs)}, g.logprobOf(lp, bv))
			}})
	})
	return lp
}

// logprobOf is x's logprob, (x - m) - l.
func (g *sampleGen) logprobOf(lp *logprobRegs, x ptx.Reg) ptx.Reg {
	v := g.op3("sub.rn.f32", ptx.F32, x, lp.m)
	g.Emit("sub.rn.f32", v, v, lp.l)
	return v
}

// sampledLogprob stores the logprob of the sample's final token (after the overrides) at
// column 0 of its row; thread 0 stored the token.
func (g *sampleGen) sampledLogprob(lp *logprobRegs, outAddr ptx.Addr) {
	first := g.cmp("eq", ptx.U32, g.tid, ptx.Imm(0))
	g.Emit("and.pred", first, first, lp.on)
	g.when(first, false, func() {
		tok := g.Reg(ptx.U32)
		g.Emit("ld.global.u32", tok, outAddr)
		x := g.f32(float32(math.Inf(-1)))
		g.EmitIf(g.cmp("lt", ptx.U32, tok, ptx.Imm(int64(g.c.Vocab))), false, "ld.global.f32", x, ptx.Addr{Base: g.byteAddr(g.lb, tok, 4)})
		g.Emit("st.global.f32", ptx.Addr{Base: lp.row}, g.logprobOf(lp, x))
	})
}

// eosBan holds, for a sample under min_tokens, its EOS logits while the ban lasts.
type eosBan struct {
	on    ptx.Reg
	saved []ptx.Reg
}

// banEOS sets a banned sample's EOS logits to -MaxFloat32 before it is sampled (thread 0,
// then a barrier, so that every thread reads them so): finite, so the non-finite check passes
// them, and as good as -inf for sampling (its exp2 is 0, it never wins an arg-max).
func (g *sampleGen) banEOS(flag ptx.Reg) *eosBan {
	b := &eosBan{on: g.cmp("ne", ptx.U32, flag, ptx.Imm(0))}
	for range g.c.EOS {
		b.saved = append(b.saved, g.f32(0))
	}
	g.when(b.on, false, func() {
		first := g.cmp("eq", ptx.U32, g.tid, ptx.Imm(0))
		for i, e := range g.c.EOS {
			a := ptx.Addr{Base: g.lb, Offset: int64(4 * e)}
			g.EmitIf(first, false, "ld.global.f32", b.saved[i], a)
			g.EmitIf(first, false, "st.global.f32", a, ptx.F32Imm(-math.MaxFloat32))
		}
		g.Emit("bar.sync", ptx.Imm(0))
	})
	return b
}

// unbanEOS puts a banned sample's EOS logits back (thread 0, after it stored the token).
func (g *sampleGen) unbanEOS(b *eosBan) {
	first := g.cmp("eq", ptx.U32, g.tid, ptx.Imm(0))
	g.Emit("and.pred", first, first, b.on)
	for i, e := range g.c.EOS {
		g.EmitIf(first, false, "st.global.f32", ptx.Addr{Base: g.lb, Offset: int64(4 * e)}, b.saved[i])
	}
}

// addNonFinite adds x-x to bad: 0 while every x is finite, NaN from the first that is not.
func (g *sampleGen) addNonFinite(bad, x ptx.Reg) {
	d := g.op3("sub.rn.f32", ptx.F32, x, x)
	g.Emit("add.rn.f32", bad, bad, d)
}

// nonFiniteFlag is 1 where bad is NaN, else 0: a value max reductions keep (they drop NaN).
func (g *sampleGen) nonFiniteFlag(bad ptx.Reg) ptx.Reg {
	f := g.Reg(ptx.F32)
	g.Emit("selp.f32", f, ptx.F32Imm(1), ptx.F32Imm(0), g.cmp("nan", ptx.F32, bad, bad))
	return f
}

// declareOverrides declares the override parameters and returns what emits the overrides
// after sampling. Thread 0 stored the sampled token, so thread 0 alone replaces it: program
// order makes its store the last, with no barrier, and a sample whose row enables no
// override pays one mask load.
func (g *sampleGen) declareOverrides(refs []ops.TokenOverride) (func(smp ptx.Reg, outAddr ptx.Addr), error) {
	if len(refs) == 0 {
		return func(ptx.Reg, ptx.Addr) {}, nil
	}
	for i, o := range refs {
		if err := o.Validate(); err != nil {
			return nil, fmt.Errorf("override %d: %w", i, err)
		}
	}
	sRow := g.param("s_row", ptx.U64)
	m := &miSet{mask: g.param("ctl_mask", ptx.U64)}
	tokens, gen, latch := ops.OverrideControl(refs)
	if tokens {
		m.tok = g.param("ctl_tokens", ptx.U64)
	}
	if gen {
		m.genReg = g.param("ctl_gen", ptx.U64)
	}
	m.seqReg = g.param("ctl_seq", ptx.U64)
	if latch {
		m.latchReg = g.param("ctl_latch", ptx.U64)
	}
	scal, fired := make([]ptx.Reg, len(refs)), make([]ptx.Reg, len(refs))
	for i, o := range refs {
		scal[i] = g.param(fmt.Sprintf("ovr%d_scal", i), ptx.U64)
		if o.Fired > 0 {
			fired[i] = g.param(fmt.Sprintf("ovr%d_fired", i), ptx.U64)
		}
	}
	return func(smp ptx.Reg, outAddr ptx.Addr) {
		done := g.NewLabel("ovr_done")
		g.EmitIf(g.cmp("ne", ptx.U32, g.tid, ptx.Imm(0)), false, "bra", ptx.Sym(done))
		row := g.Reg(ptx.U32)
		g.Emit("ld.global.nc.u32", row, ptx.Addr{Base: g.byteAddr(sRow, smp, 4)})
		g.EmitIf(g.cmp("eq", ptx.U32, row, ptx.Imm(bundle.NoRow)), false, "bra", ptx.Sym(done))
		load := func(p ptx.Reg) ptx.Reg {
			v := g.Reg(ptx.U32)
			g.Emit("ld.global.nc.u32", v, ptx.Addr{Base: g.byteAddr(p, row, 4)})
			return v
		}
		m.mask, m.seqReg = load(m.mask), load(m.seqReg)
		if tokens {
			m.tok = load(m.tok)
		}
		if gen {
			m.genReg = load(m.genReg)
		}
		if latch {
			m.latchReg = load(m.latchReg)
		}
		r := &rowEmitter{emitter: g.emitter, row: row, tid: g.tid}
		for i, o := range g.c.Overrides {
			skip := g.NewLabel(fmt.Sprintf("ovr%d_skip", i))
			bit := g.op3("and.b32", ptx.U32, m.mask, ptx.Imm(int64(1)<<o.Bit))
			g.EmitIf(g.cmp("eq", ptx.U32, bit, ptx.Imm(0)), false, "bra", ptx.Sym(skip))
			// The fired word of the sample's token row: 0 unless the override applies.
			done, on := skip, ptx.Reg{}
			if refs[i].Fired > 0 {
				done, on = g.NewLabel(fmt.Sprintf("ovr%d_fired", i)), g.imm32(0)
			}
			if p := m.gates(r, &miBound{MI: o}); p != nil {
				g.EmitIf(*p, true, "bra", ptx.Sym(done))
			}
			a := g.Reg(ptx.U64)
			g.Emit("mul.wide.u32", a, m.seqReg, ptx.Imm(int64(4*o.ScalStride)))
			g.Emit("add.u64", a, a, scal[i])
			v := g.Reg(ptx.F32)
			g.Emit("ld.global.nc.f32", v, ptx.Addr{Base: a, Offset: int64(4 * o.Alpha)})
			tok := g.Reg(ptx.U32)
			g.Emit("cvt.rzi.u32.f32", tok, v)
			g.Emit("st.global.u32", outAddr, tok)
			if refs[i].Fired > 0 {
				g.Emit("mov.u32", on, ptx.Imm(1))
				g.Label(done)
				storeFired(g.emitter, nil, row, fired[i], refs[i].Fired, on) // thread 0 alone runs this
			}
			g.Label(skip)
		}
		g.Label(done)
	}, nil
}

// sampleUnroll is how many logits each thread of the sampler loads before it uses the first.
// A block reads its sample's whole row (128256 logits for Llama 3) on one SM, once per pass,
// and the nucleus search makes over twenty passes: with one load in flight per thread the
// passes wait on L2's latency, not its bandwidth.
const sampleUnroll = 16

// sampleQuadUnroll is how many 16-byte loads of four logits scanAll issues before it uses the
// first: 32 registers of the 64 a thread of a 1024-thread block may have (ptxas 11.8 keeps
// about five of them in flight, as it does with 16 of them).
const sampleQuadUnroll = 8

// logitAt loads logit i + j*stride of this sample (the byte offset is an immediate).
func (g *sampleGen) logitAt(i ptx.Reg, j, stride int) ptx.Reg {
	x := g.Reg(ptx.F32)
	g.Emit("ld.global.f32", x, ptx.Addr{Base: g.byteAddr(g.lb, i, 4), Offset: int64(4 * j * stride)})
	return x
}

// strided runs body(i, logit i) for i = tid, tid+threads, ... below Vocab, in that order.
func (g *sampleGen) strided(body func(i, x ptx.Reg)) {
	i := g.Reg(ptx.U32)
	g.unrolled(i, g.tid, ptx.Imm(int64(g.c.Vocab)), g.nt, sampleUnroll,
		func(i ptx.Reg, j int) ptx.Reg { return g.logitAt(i, j, g.nt) }, body)
}

// scanAll runs body(i, logit i) for every logit of the sample, in an order of its own, for
// the passes whose result no order changes: the max, the arg-max (ties go to the lower index
// in every merge) and the non-finite flag. Where rows of Vocab logits keep 16-byte alignment
// (Vocab a multiple of 4) each thread loads four logits at a time, quads tid, tid+threads,
// ..., sampleQuadUnroll of them issued ahead: one block on one SM reads the whole row, and
// with strided's single logits in flight the greedy step's one pass waited on L2's latency
// (Llama 3's 128256 logits: 16.6 µs under Nsight Compute at 512 threads, 9.7 µs so at 1024).
func (g *sampleGen) scanAll(body func(i, x ptx.Reg)) {
	if g.c.Vocab%4 != 0 {
		g.strided(body)
		return
	}
	q := g.Reg(ptx.U32)
	load := func(q ptx.Reg, j int) [4]ptx.Reg {
		var x [4]ptx.Reg
		for k := range x {
			x[k] = g.Reg(ptx.F32)
		}
		g.Emit("ld.global.v4.f32", ptx.Vec(x[:]), ptx.Addr{Base: g.byteAddr(g.lb, q, 16), Offset: int64(16 * j * g.nt)})
		return x
	}
	unrolledOf(g.emitter, q, g.tid, ptx.Imm(int64(g.c.Vocab/4)), g.nt, sampleQuadUnroll, load, func(q ptx.Reg, x [4]ptx.Reg) {
		first := g.op3("shl.b32", ptx.U32, q, ptx.Imm(2))
		for k, xk := range x {
			i := first
			if k > 0 {
				i = g.op3("add.u32", ptx.U32, first, ptx.Imm(int64(k)))
			}
			body(i, xk)
		}
	})
}

// relProb returns y = (logit x - max)*log2(e)/T and the token's probability relative to the
// most likely one, 2^y, rounded step by step exactly as ops "sample" does.
func (g *sampleGen) relProb(x ptx.Reg) (y, q ptx.Reg) {
	y = g.op3("sub.rn.f32", ptx.F32, x, g.m)
	g.Emit("mul.rn.f32", y, y, g.scale)
	return y, g.exp2(y)
}

// kept returns a token's relative probability 2^y if y >= thr, else 0.
func (g *sampleGen) kept(x, thr ptx.Reg) ptx.Reg {
	y, q := g.relProb(x)
	return g.keep(y, q, thr)
}

// keep returns q if y >= thr, else 0.
func (g *sampleGen) keep(y, q, thr ptx.Reg) ptx.Reg {
	w := g.Reg(ptx.F32)
	g.Emit("selp.f32", w, q, ptx.F32Imm(0), g.cmp("ge", ptx.F32, y, thr))
	return w
}

// keptSums are the block-wide sums of kept(x, thr) over the vocabulary for each of thrs, in
// one pass over the logits; each sum is formed as a pass of its own would form it.
func (g *sampleGen) keptSums(thrs ...ptx.Reg) []ptx.Reg {
	accs := make([]ptx.Reg, len(thrs))
	for k := range accs {
		accs[k] = g.f32(0)
	}
	g.strided(func(_, x ptx.Reg) {
		y, q := g.relProb(x)
		for k, thr := range thrs {
			g.Emit("add.rn.f32", accs[k], accs[k], g.keep(y, q, thr))
		}
	})
	return g.blockReduceN(accs, "add", g.red, g.tid, g.nt)
}

// Two bisection steps a pass over the logits: the nucleus search takes SampleIters/2 passes.
var _ [1 - ops.SampleIters%2]struct{}

// bisectTwice runs two of the nucleus search's bisection steps on [lo, hi] in one pass: it
// sums the kept mass at the midpoint m2 and at the midpoints m1 and m3 of the halves, the
// only thresholds the second step can test, then keeps those the steps pick. So lo and hi
// take the bits of ops "sample"'s one-step-a-pass search. With tp set (the first pass, lo and
// hi at their start) it also sums the whole mass and sets target = tp times it.
func (g *sampleGen) bisectTwice(lo, hi, target, tp ptx.Reg) {
	m1, m2, m3 := g.Reg(ptx.F32), g.Reg(ptx.F32), g.Reg(ptx.F32)
	for _, m := range []struct{ dst, a, b ptx.Reg }{{m2, lo, hi}, {m1, lo, m2}, {m3, m2, hi}} {
		g.Emit("add.rn.f32", m.dst, m.a, m.b)
		g.Emit("mul.rn.f32", m.dst, m.dst, ptx.F32Imm(0.5))
	}
	thrs := []ptx.Reg{m1, m2, m3}
	if tp.T != 0 {
		thrs = append(thrs, g.f32(float32(math.Inf(-1))))
	}
	sums := g.keptSums(thrs...)
	if tp.T != 0 {
		g.Emit("mul.rn.f32", target, tp, sums[3])
	}
	// The first step tests m2; the second m3 if m2 held, else m1.
	first := g.cmp("ge", ptx.F32, sums[1], target)
	g.Emit("selp.f32", lo, m2, lo, first)
	g.Emit("selp.f32", hi, hi, m2, first)
	mid, sum := g.Reg(ptx.F32), g.Reg(ptx.F32)
	g.Emit("selp.f32", mid, m3, m1, first)
	g.Emit("selp.f32", sum, sums[2], sums[0], first)
	second := g.cmp("ge", ptx.F32, sum, target)
	g.Emit("selp.f32", lo, mid, lo, second)
	g.Emit("selp.f32", hi, hi, mid, second)
}

// segment runs body(i, kept(i, thr)) over segment s: tokens s*seg .. min((s+1)*seg, Vocab)-1.
func (g *sampleGen) segment(s ptx.Reg, seg int, body func(i, w ptx.Reg), thr ptx.Reg) {
	start := g.Reg(ptx.U32)
	g.Emit("mul.lo.u32", start, s, ptx.Imm(int64(seg)))
	stop := g.op3("add.u32", ptx.U32, start, ptx.Imm(int64(seg)))
	g.Emit("min.u32", stop, stop, ptx.Imm(int64(g.c.Vocab)))
	i := g.Reg(ptx.U32)
	g.unrolled(i, start, stop, 1, sampleUnroll, func(i ptx.Reg, j int) ptx.Reg { return g.logitAt(i, j, 1) },
		func(i, x ptx.Reg) { body(i, g.kept(x, thr)) })
}

// argmax stores the lowest index of the largest logit: per-thread strided scans keep the
// first maximum they meet, and merges prefer the lower index on ties.
func (g *sampleGen) argmax(outAddr ptx.Addr) {
	bv, bi, bad := g.f32(float32(math.Inf(-1))), g.Reg(ptx.U32), g.f32(0)
	g.Emit("mov.u32", bi, g.tid)
	g.scanAll(func(i, x ptx.Reg) {
		p := g.cmp("gt", ptx.F32, x, bv)
		g.Emit("selp.f32", bv, x, bv, p)
		g.Emit("selp.u32", bi, i, bi, p)
		g.addNonFinite(bad, x)
	})
	flag := g.nonFiniteFlag(bad)
	ov, oi, of := g.Reg(ptx.F32), g.Reg(ptx.U32), g.Reg(ptx.F32)
	for off := 16; off > 0; off /= 2 {
		g.Emit("shfl.sync.bfly.b32", ov, bv, ptx.Imm(int64(off)), ptx.Imm(0x1f), ptx.Imm(-1))
		g.Emit("shfl.sync.bfly.b32", oi, bi, ptx.Imm(int64(off)), ptx.Imm(0x1f), ptx.Imm(-1))
		g.Emit("shfl.sync.bfly.b32", of, flag, ptx.Imm(int64(off)), ptx.Imm(0x1f), ptx.Imm(-1))
		g.better(bv, bi, ov, oi)
		g.Emit("max.f32", flag, flag, of)
	}
	lane := g.op3("and.b32", ptx.U32, g.tid, ptx.Imm(31))
	warp := g.op3("shr.u32", ptx.U32, g.tid, ptx.Imm(5))
	lane0 := g.cmp("eq", ptx.U32, lane, ptx.Imm(0))
	warps := g.nt / 32
	g.EmitIf(lane0, false, "st.shared.f32", ptx.Addr{Base: g.sharedAddr(g.red, warp, 4)}, bv)
	g.EmitIf(lane0, false, "st.shared.u32", ptx.Addr{Base: g.sharedAddr(g.redi, warp, 4)}, bi)
	g.EmitIf(lane0, false, "st.shared.f32", ptx.Addr{Base: g.sharedAddr(g.red, warp, 4), Offset: int64(4 * warps)}, flag)
	g.Emit("bar.sync", ptx.Imm(0))
	g.when(g.cmp("eq", ptx.U32, g.tid, ptx.Imm(0)), false, func() {
		for w := 1; w < warps; w++ {
			g.Emit("ld.shared.f32", ov, ptx.Addr{Base: g.red, Offset: int64(4 * w)})
			g.Emit("ld.shared.u32", oi, ptx.Addr{Base: g.redi, Offset: int64(4 * w)})
			g.Emit("ld.shared.f32", of, ptx.Addr{Base: g.red, Offset: int64(4 * (warps + w))})
			g.better(bv, bi, ov, oi)
			g.Emit("max.f32", flag, flag, of)
		}
		g.when(g.cmp("gt", ptx.F32, flag, ptx.F32Imm(0)), false, func() {
			g.Emit("st.global.u32", outAddr, g.imm32(bundle.NonFinite))
			g.Emit("bra", ptx.Sym(g.finish))
		})
		g.Emit("st.global.u32", outAddr, bi)
	})
}

// better replaces (bv, bi) by (ov, oi) when ov is larger, or equal with a lower index.
func (g *sampleGen) better(bv, bi, ov, oi ptx.Reg) {
	gt := g.cmp("gt", ptx.F32, ov, bv)
	eq := g.cmp("eq", ptx.F32, ov, bv)
	lt := g.cmp("lt", ptx.U32, oi, bi)
	g.Emit("and.pred", eq, eq, lt)
	g.Emit("or.pred", gt, gt, eq)
	g.Emit("selp.f32", bv, ov, bv, gt)
	g.Emit("selp.u32", bi, oi, bi, gt)
}

// LogitsMIConfig configures LogitsMI: elementwise MI ops (hook logits) over rows of Vocab
// logits, one row per sample.
type LogitsMIConfig struct {
	Vocab int
	Ops   []ir.MI
}

// logitsThreads is LogitsMI's block: one logit per thread, so a vocabulary-wide row spreads
// over Vocab/logitsThreads blocks and the width has no register bound.
const logitsThreads = 256

// Launch is the grid for samples samples: (blocks per row, samples).
func (c LogitsMIConfig) Launch(samples int) ops.Launch {
	return ops.Launch{Grid: [3]int{(c.Vocab + logitsThreads - 1) / logitsThreads, samples, 1}, Block: [3]int{logitsThreads, 1, 1}}
}

// LogitsMI generates the MI kernel between the LM head and the sampler. Each block finds its
// sample's token row (s_row), whose control words, scalars and output rows it uses, and exits
// after loading them when the row enables none of its apps (or is an unused sample).
// Parameters: x, s_row, then the control and MI parameters as MIKernel takes them.
func LogitsMI(name string, c LogitsMIConfig) (*Kernel, error) {
	return named("logits mi", name, c, logitsMI)
}

func logitsMI(name string, c LogitsMIConfig) (*Kernel, error) {
	if len(c.Ops) == 0 || c.Vocab <= 0 {
		return nil, fmt.Errorf("%d ops over %d logits", len(c.Ops), c.Vocab)
	}
	for i, o := range c.Ops {
		if t, ok := mi.Lookup(o.Template); !ok || !t.Elementwise {
			return nil, fmt.Errorf("op %d: template %s is not elementwise", i, o.Template)
		}
	}
	r := &rowEmitter{emitter: newEmitter(name), width: c.Vocab, threads: logitsThreads, per: 1}
	r.MaxNTid = logitsThreads
	xp := r.param("x", ptx.U64)
	sRow := r.param("s_row", ptx.U64)
	mi, err := declareMI(r, c.Ops)
	if err != nil {
		return nil, err
	}
	r.tid = r.special(ptx.TidX)
	chunk, smp := r.special(ptx.CtaidX), r.special(ptx.CtaidY)
	end := r.NewLabel("end")
	r.row = r.Reg(ptx.U32)
	r.Emit("ld.global.nc.u32", r.row, ptx.Addr{Base: r.elemAddr(sRow, smp, 4)})
	unused := r.Reg(ptx.Pred)
	r.Emit("setp.eq.u32", unused, r.row, ptx.Imm(bundle.NoRow))
	r.EmitIf(unused, false, "bra.uni", ptx.Sym(end))
	mi.loadCtl(r)
	if mi.lead.T != 0 {
		// A row spans blocks; its first block stores the fired words.
		first := r.Reg(ptx.Pred)
		r.Emit("setp.eq.u32", first, chunk, ptx.Imm(0))
		r.Emit("and.pred", mi.lead, mi.lead, first)
	}
	mi.skipWithoutApps(r, c.Ops, end)

	// This thread's column; the row emitter's tail predicate becomes "inside the row".
	first := r.Reg(ptx.U32)
	r.Emit("mul.lo.u32", first, chunk, ptx.Imm(logitsThreads))
	col := r.op3("add.u32", ptx.U32, first, r.tid)
	in := r.Reg(ptx.Pred)
	r.Emit("setp.lt.u32", in, col, ptx.Imm(int64(c.Vocab)))
	r.tail = &in
	// Vectors (compiled and per-request) and output rows are addressed from the block's
	// first column.
	shift := r.Reg(ptx.U64)
	r.Emit("mul.wide.u32", shift, first, ptx.Imm(4))
	for _, b := range mi.groups[0] {
		for _, s := range []string{"vec", "pool", "out"} {
			if p, ok := b.params[s]; ok {
				q := r.Reg(ptx.U64)
				r.Emit("add.u64", q, p, shift)
				b.params[s] = q
			}
		}
	}
	rowStart := r.Reg(ptx.U32)
	r.Emit("mul.lo.u32", rowStart, smp, ptx.Imm(int64(c.Vocab)))
	p := rowPtr{reg: r.elemAddr(xp, r.op3("add.u32", ptx.U32, rowStart, col), 4), dt: ptx.F32, size: 4}
	mi.applyInPlace(r, p, end)
	return finish(r.Kernel, "mi_samples", ops.MISamplesAttrs{Width: c.Vocab, Ops: mi.ref[0]})
}
