package codegen

import (
	"fmt"
	"math"

	"xmix/ops"
	"xmix/ptx"
)

// SampleConfig is the sampler over a vocabulary of Vocab logits per sample.
type SampleConfig struct {
	Vocab int
}

// threads is the block size: a thread per few logits for small vocabularies, 512 for large
// ones (the final scan is serial over the threads' segment sums, so more would not pay).
func (c SampleConfig) threads() int {
	return min(512, max(32, (c.Vocab/4+31)/32*32))
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
// the token.
func Sample(name string, c SampleConfig) (*Kernel, error) {
	if c.Vocab <= 0 || c.Vocab >= 1<<24 {
		return nil, fmt.Errorf("sample %s: vocab %d: want 1 to 2^24-1", name, c.Vocab)
	}
	g := sampleGen{emitter: newEmitter(name), c: c, nt: c.threads()}
	g.emit()
	return finish(g.Kernel, "sample", ops.SampleAttrs{Vocab: c.Vocab})
}

type sampleGen struct {
	emitter
	c         SampleConfig
	nt        int
	tid, lb   ptx.Reg // thread id, this sample's logits
	m, scale  ptx.Reg // max logit, log2(e)/T
	red, redi ptx.Sym
}

func (g *sampleGen) emit() {
	logits := g.param("logits", ptx.U64)
	tempP := g.param("temperature", ptx.U64)
	topP := g.param("top_p", ptx.U64)
	rngP := g.param("rng", ptx.U64)
	out := g.param("out", ptx.U64)
	g.red = g.DeclareShared("smp_red", ptx.F32, g.nt/32)
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
	end, greedy := g.NewLabel("end"), g.NewLabel("greedy")
	g.EmitIf(g.cmp("gt", ptx.F32, temp, ptx.F32Imm(0)), true, "bra", ptx.Sym(greedy))

	mx := g.f32(float32(math.Inf(-1)))
	g.strided(func(i ptx.Reg) { g.Emit("max.f32", mx, mx, g.logit(i)) })
	g.m = g.blockReduce(mx, "max", g.red, g.tid, g.nt)
	g.scale = g.Reg(ptx.F32)
	g.Emit("rcp.rn.f32", g.scale, temp)
	g.Emit("mul.rn.f32", g.scale, g.scale, ptx.F32Imm(ops.Log2E))

	thr := g.f32(float32(math.Inf(-1)))
	g.when(g.cmp("gt", ptx.F32, tp, ptx.F32Imm(0)), false, func() {
		g.when(g.cmp("lt", ptx.F32, tp, ptx.F32Imm(1)), false, func() {
			target := g.op3("mul.rn.f32", ptx.F32, tp, g.keptSum(g.f32(float32(math.Inf(-1)))))
			lo, hi, mid := g.f32(ops.SampleFloor), g.f32(0), g.Reg(ptx.F32)
			it := g.Reg(ptx.U32)
			g.forLoop(it, ptx.Imm(0), ptx.Imm(ops.SampleIters), ptx.Imm(1), func() {
				g.Emit("add.rn.f32", mid, lo, hi)
				g.Emit("mul.rn.f32", mid, mid, ptx.F32Imm(0.5))
				ok := g.cmp("ge", ptx.F32, g.keptSum(mid), target)
				g.Emit("selp.f32", lo, mid, lo, ok)
				g.Emit("selp.f32", hi, hi, mid, ok)
			})
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
	total, pj := g.f32(0), g.Reg(ptx.F32)
	j := g.Reg(ptx.U32)
	g.forLoop(j, ptx.Imm(0), ptx.Imm(int64(g.nt)), ptx.Imm(1), func() {
		g.Emit("ld.shared.f32", pj, ptx.Addr{Base: g.sharedAddr(part, j, 4)})
		g.Emit("add.rn.f32", total, total, pj)
	})
	u := g.Reg(ptx.F32)
	g.Emit("cvt.rn.f32.u32", u, rng)
	g.Emit("mul.rn.f32", u, u, ptx.F32Imm(0x1p-32))
	g.Emit("mul.rn.f32", u, u, total)
	run, base, prev, segIdx := g.f32(0), g.f32(0), g.Reg(ptx.F32), g.imm32(0)
	found := g.NewLabel("found")
	g.forLoop(j, ptx.Imm(0), ptx.Imm(int64(g.nt)), ptx.Imm(1), func() {
		g.Emit("ld.shared.f32", pj, ptx.Addr{Base: g.sharedAddr(part, j, 4)})
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
}

// logit loads this sample's logit i.
func (g *sampleGen) logit(i ptx.Reg) ptx.Reg {
	x := g.Reg(ptx.F32)
	g.Emit("ld.global.f32", x, ptx.Addr{Base: g.byteAddr(g.lb, i, 4)})
	return x
}

// strided runs body for i = tid, tid+threads, ... below Vocab.
func (g *sampleGen) strided(body func(i ptx.Reg)) {
	i := g.Reg(ptx.U32)
	g.forLoop(i, g.tid, ptx.Imm(int64(g.c.Vocab)), ptx.Imm(int64(g.nt)), func() { body(i) })
}

// kept returns token i's relative probability 2^y if y >= thr, else 0, where
// y = (logit-max)*log2(e)/T, rounded step by step exactly as ops "sample" does.
func (g *sampleGen) kept(i, thr ptx.Reg) ptx.Reg {
	y := g.op3("sub.rn.f32", ptx.F32, g.logit(i), g.m)
	g.Emit("mul.rn.f32", y, y, g.scale)
	q := g.exp2(y)
	w := g.Reg(ptx.F32)
	g.Emit("selp.f32", w, q, ptx.F32Imm(0), g.cmp("ge", ptx.F32, y, thr))
	return w
}

// keptSum is the block-wide sum of kept(i, thr) over the vocabulary.
func (g *sampleGen) keptSum(thr ptx.Reg) ptx.Reg {
	acc := g.f32(0)
	g.strided(func(i ptx.Reg) { g.Emit("add.rn.f32", acc, acc, g.kept(i, thr)) })
	return g.blockReduce(acc, "add", g.red, g.tid, g.nt)
}

// segment runs body(i, kept(i, thr)) over segment s: tokens s*seg .. min((s+1)*seg, Vocab)-1.
func (g *sampleGen) segment(s ptx.Reg, seg int, body func(i, w ptx.Reg), thr ptx.Reg) {
	start := g.Reg(ptx.U32)
	g.Emit("mul.lo.u32", start, s, ptx.Imm(int64(seg)))
	stop := g.op3("add.u32", ptx.U32, start, ptx.Imm(int64(seg)))
	g.Emit("min.u32", stop, stop, ptx.Imm(int64(g.c.Vocab)))
	i := g.Reg(ptx.U32)
	g.forLoop(i, start, stop, ptx.Imm(1), func() { body(i, g.kept(i, thr)) })
}

// argmax stores the lowest index of the largest logit: per-thread strided scans keep the
// first maximum they meet, and merges prefer the lower index on ties.
func (g *sampleGen) argmax(outAddr ptx.Addr) {
	bv, bi := g.f32(float32(math.Inf(-1))), g.Reg(ptx.U32)
	g.Emit("mov.u32", bi, g.tid)
	g.strided(func(i ptx.Reg) {
		x := g.logit(i)
		p := g.cmp("gt", ptx.F32, x, bv)
		g.Emit("selp.f32", bv, x, bv, p)
		g.Emit("selp.u32", bi, i, bi, p)
	})
	ov, oi := g.Reg(ptx.F32), g.Reg(ptx.U32)
	for off := 16; off > 0; off /= 2 {
		g.Emit("shfl.sync.bfly.b32", ov, bv, ptx.Imm(int64(off)), ptx.Imm(0x1f), ptx.Imm(-1))
		g.Emit("shfl.sync.bfly.b32", oi, bi, ptx.Imm(int64(off)), ptx.Imm(0x1f), ptx.Imm(-1))
		g.better(bv, bi, ov, oi)
	}
	lane := g.op3("and.b32", ptx.U32, g.tid, ptx.Imm(31))
	warp := g.op3("shr.u32", ptx.U32, g.tid, ptx.Imm(5))
	lane0 := g.cmp("eq", ptx.U32, lane, ptx.Imm(0))
	g.EmitIf(lane0, false, "st.shared.f32", ptx.Addr{Base: g.sharedAddr(g.red, warp, 4)}, bv)
	g.EmitIf(lane0, false, "st.shared.u32", ptx.Addr{Base: g.sharedAddr(g.redi, warp, 4)}, bi)
	g.Emit("bar.sync", ptx.Imm(0))
	g.when(g.cmp("eq", ptx.U32, g.tid, ptx.Imm(0)), false, func() {
		for w := 1; w < g.nt/32; w++ {
			g.Emit("ld.shared.f32", ov, ptx.Addr{Base: g.red, Offset: int64(4 * w)})
			g.Emit("ld.shared.u32", oi, ptx.Addr{Base: g.redi, Offset: int64(4 * w)})
			g.better(bv, bi, ov, oi)
		}
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
