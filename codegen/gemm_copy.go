package codegen

import (
	"fmt"
	"slices"

	"xmix/bundle"
	"xmix/ops"
	"xmix/ptx"
)

// The copy-engine GEMM (op bundle.OpGemmCopy): y[rows,N] = bf16(x)[rows,K] . w[N,K]^T for
// decode buckets of at most 8 rows, served beside a library GEMM (the backend picks it per
// node; bundle.GemmCopyKernels). Inside a decode step a GEMM of 8 rows is a read of W, and
// what decides its time is how much of W is on its way before the grid ahead ends: this
// kernel asks the copy engine (TMA: cp.async.bulk.tensor with mbarrier completion) for its
// first stages of W before griddepcontrol.wait, up to ~160 KiB a CTA, which no register ring
// can hold. On the H200 it shortens the Llama-3.1-8B 8-row step by 2.3-4.3% at contexts 80-2112
// where it serves o, down and q/k/v beside cuBLASLt (testsuite/gpu/RESULTS.md, sessions 30-31).
//
// Work split. A CTA owns gcCols = 64 output columns (W rows) and one part of K: K splits over
// the Split CTAs of a cluster where the column tiles alone would leave most SMs idle (N/64 <
// gcSplitBelow: the 8B's o and down, 64 tiles), so that twice as many SMs pull W. Its 16 warps
// are four 16-column groups (cg) by four quarters of a stage's K (q); each warp multiplies its
// 16 columns by the 8 token rows with m16n8k16 (A = W, row-major; B = x, column-major).
//
// Stages. A stage is gcStage = 256 of the CTA's K: one tensor-map box of W (64 rows x 256,
// 32 KiB, rows 512 bytes apart) and the rows' x (8 rows of 256 f32, gcXStride apart, one bulk
// copy each by lane r of warp 0), completing one mbarrier. Thread 0 asks for W of the first
// Stages stages, then every thread waits for the grid ahead; warp 0 then asks for their x.
// Each stage's slot refills with stage i+Stages once every warp is past it (bar.sync).
//
// Sums. In a warp, lane (g, t) reads W elements [8t, 8t+8) of its quarter's 32-element chunks
// for rows g and g+8 and the same x elements of token row g; the K permutation is the same for
// both operands, so the products are W . x. The four quarters meet in shared memory (added in
// quarter order); with a split, ranks 1.. store their sums into rank 0's shared memory
// (mapa, st.shared::cluster) and rank 0 adds them in rank order after the cluster barrier, so
// every run gives the same bits. x is rounded to bf16 as the library's cast rounds it: the
// op is gemm_copy, not gemm_tc's exact split.
const (
	gcCols       = 64
	gcStage      = 256
	gcWarps      = gcCols / 16 * 4
	gcRows       = 8
	gcWRow       = 2 * gcStage          // shared bytes of one W row of a stage (the box's rows)
	gcXStride    = 4*gcStage + 16       // shared bytes of one staged x row: 16 bytes of pad against bank conflicts
	gcBars       = 128                  // the mbarriers, before slot 0
	gcShared     = 200000               // dynamic shared memory a CTA may take (of 227 KiB)
	gcSplitBelow = 90                   // column tiles below which K splits over a cluster
	gcSplit      = 2                    // CTAs of such a cluster (4 measured slower)
	gcPolls      = 1 << 22              // mbarrier polls before a stage that never lands traps
	gcRedBytes   = 32 * 16              // one warp's partial sums: 32 lanes x 4 f32
	gcWBox       = gcCols * 2 * gcStage // bytes of one stage's W box
)

// GemmCopyConfig is one copy-engine GEMM: K x N, K split over Split CTAs, Stages slots.
type GemmCopyConfig struct{ K, N, Split, Stages int }

func (c GemmCopyConfig) slotBytes() int { return (gcWBox + gcRows*gcXStride + 127) &^ 127 }
func (c GemmCopyConfig) kStages() int   { return c.K / c.Split / gcStage }
func (c GemmCopyConfig) recvOff() int   { return gcBars + c.Stages*c.slotBytes() }
func (c GemmCopyConfig) shared() int    { return c.recvOff() + (c.Split-1)*gcCols/16*gcRedBytes }

// GemmCopyFor is the copy-engine GEMM for a K x N weight, or an error saying why there is
// none: N a multiple of 64, K of 256 (times the split).
func GemmCopyFor(k, n int) (GemmCopyConfig, error) {
	if k <= 0 || n <= 0 || n%gcCols != 0 {
		return GemmCopyConfig{}, fmt.Errorf("copy-engine GEMM: N=%d must be a positive multiple of %d", n, gcCols)
	}
	c := GemmCopyConfig{K: k, N: n, Split: 1}
	if n/gcCols < gcSplitBelow {
		c.Split = gcSplit
	}
	if k%(c.Split*gcStage) != 0 {
		return GemmCopyConfig{}, fmt.Errorf("copy-engine GEMM: K=%d must be a positive multiple of %d", k, c.Split*gcStage)
	}
	c.Stages = min(c.kStages(), (gcShared-c.shared())/c.slotBytes())
	return c, nil
}

// Attrs are the kernel's reference attributes and launch.
func (c GemmCopyConfig) Attrs() bundle.GemmCopyAttrs {
	return bundle.GemmCopyAttrs{K: c.K, N: c.N, Rows: gcRows, Box: [2]int{gcStage, gcCols},
		Grid: c.N / gcCols * c.Split, Cluster: c.Split, Block: 32 * gcWarps, Shared: c.shared()}
}

// Launch is the kernel's grid, block and dynamic shared memory.
func (c GemmCopyConfig) Launch() ops.Launch {
	a := c.Attrs()
	return ops.Launch{Grid: [3]int{a.Grid, 1, 1}, Block: [3]int{a.Block, 1, 1}, Shared: a.Shared}
}

// copyGemmShapes are the GEMMs (K, N) a bundle carries a copy-engine kernel for: those
// measured faster inside the decode step than cuBLASLt's, on the H200 at Llama-3.1-8B's o
// (4096 x 4096), q/k/v (6144 x 4096) and down (4096 x 14336). Its gate/up (28672 columns:
// enough CTAs for the library's kernel to stream W at full speed) made the step longer; other
// shapes (the 1B's, a tensor-parallel rank's, Qwen3's down) were not measured.
var copyGemmShapes = [][2]int{{4096, 4096}, {4096, 6144}, {14336, 4096}}

// copyGemms adds to the bundle a copy-engine GEMM for each GEMM shape that a decode bucket
// of at most gcRows rows runs on tensor cores (a node a backend may give a library) and
// copyGemmShapes lists; guarded GEMMs (heavy apps') are left alone.
func (g *gen) copyGemms(templates []bundle.Template) error {
	seen := map[[2]int]bool{}
	for _, t := range templates {
		if t.Kind != bundle.Decode || t.Tokens > gcRows {
			continue
		}
		for _, n := range append(slices.Clone(t.Nodes), t.Plain...) {
			k := g.kernels[n.Kernel]
			if k == nil {
				continue
			}
			m, ok, err := bundle.GemmOf(n, k.bundleKernel())
			if err != nil {
				return fmt.Errorf("template %s: %w", t.Name, err)
			}
			key := [2]int{m.K, m.N}
			if !ok || m.Guard != 0 || m.M > gcRows || seen[key] || !slices.Contains(copyGemmShapes, key) {
				continue
			}
			seen[key] = true
			c, err := GemmCopyFor(m.K, m.N)
			if err != nil {
				return fmt.Errorf("template %s: node %s: %w", t.Name, n.Label, err)
			}
			name := fmt.Sprintf("gemm_copy_k%d_n%d", m.K, m.N)
			if _, err := g.kernel(name, func() (*Kernel, error) { return GemmCopy(name, c) }); err != nil {
				return err
			}
		}
	}
	return nil
}

// GemmCopy generates the copy-engine GEMM; parameters x (u64), w_map (128 bytes by value: a
// tensor map of W with boxes of 256 x 64, bundle.GemmWMap), y (u64), rows (u32, at most 8). x must be 16-byte
// aligned. Launch it with c.Launch().
func GemmCopy(name string, c GemmCopyConfig) (*Kernel, error) {
	if c.Split < 1 || c.K%(c.Split*gcStage) != 0 || c.N%gcCols != 0 || c.Stages < 1 || c.Stages > c.kStages() || c.Stages > gcBars/8 || c.shared() > gcShared {
		return nil, fmt.Errorf("copy-engine GEMM %s: bad configuration %+v (use GemmCopyFor)", name, c)
	}
	g := gcGen{emitter: newEmitter(name), c: c}
	g.emit()
	return finish(g.Kernel, bundle.OpGemmCopy, c.Attrs())
}

type gcGen struct {
	emitter
	c                GemmCopyConfig
	x, wmap, y, rows ptx.Reg
	tid, warp, lane  ptx.Reg
	gg, t, cg, q     ptx.Reg // the lane's mma group and thread; the warp's column group and K quarter
	rank, col0, k0   ptx.Reg // cluster rank; the CTA's first column and first K
	bars, slot0      ptx.Reg // shared addresses: mbarrier 0, slot 0
	thread0, xLane   ptx.Reg // thread 0 asks for W; lane r < rows of warp 0 for x row r
	tx               ptx.Reg // bytes a stage's mbarrier expects
	xSrc, xDst       ptx.Reg // this lane's x row at the CTA's first K; its shared row in slot 0
	acc              []ptx.Reg
}

func (g *gcGen) emit() {
	c := g.c
	g.MaxNTid = 32 * gcWarps
	if c.Split > 1 {
		g.ClusterX = c.Split
	}
	g.x = g.param(bundle.GemmX, ptx.U64)
	// The map is a parameter (as CUTLASS passes it), so the launch carries it and no fence
	// is needed before its first use; one in global memory needs fence.proxy.tensormap, and
	// that form made the step 0.7-1.2% longer (session 32).
	wm := g.ByteParam(bundle.GemmWMap, 64, bundle.TensorMapBytes)
	g.y = g.param(bundle.GemmY, ptx.U64)
	g.rows = g.param(bundle.GemmRows, ptx.U32)
	g.wmap = g.Reg(ptx.U64)
	g.Emit("mov.u64", g.wmap, wm)
	g.Emit("cvta.param.u64", g.wmap, g.wmap)
	smem := g.DeclareDynamicShared("smem", 128)
	if c.Split > 1 {
		// Rank 0's shared memory must exist before rank 1 writes into it: this phase of the
		// cluster barrier ends, after the main loop, once every CTA of the cluster has begun.
		g.Emit("barrier.cluster.arrive")
	}
	g.tid = g.special(ptx.TidX)
	g.warp = g.op3("shr.u32", ptx.U32, g.tid, ptx.Imm(5))
	g.lane = g.op3("and.b32", ptx.U32, g.tid, ptx.Imm(31))
	g.gg = g.op3("shr.u32", ptx.U32, g.lane, ptx.Imm(2))
	g.t = g.op3("and.b32", ptx.U32, g.lane, ptx.Imm(3))
	g.cg = g.op3("shr.u32", ptx.U32, g.warp, ptx.Imm(2))
	g.q = g.op3("and.b32", ptx.U32, g.warp, ptx.Imm(3))
	g.rank = g.imm32(0)
	tile := g.special(ptx.CtaidX)
	if c.Split > 1 {
		g.Emit("mov.u32", g.rank, ptx.ClusterCtaRank)
		g.Emit("div.u32", tile, tile, ptx.Imm(int64(c.Split)))
	}
	g.col0 = g.op3("mul.lo.u32", ptx.U32, tile, ptx.Imm(gcCols))
	g.k0 = g.op3("mul.lo.u32", ptx.U32, g.rank, ptx.Imm(int64(c.K/c.Split)))
	g.bars = g.Reg(ptx.U32)
	g.Emit("mov.u32", g.bars, smem)
	g.slot0 = g.op3("add.u32", ptx.U32, g.bars, ptx.Imm(gcBars))
	g.thread0 = g.cmp("eq", ptx.U32, g.tid, ptx.Imm(0))
	g.when(g.thread0, false, func() {
		for i := range c.Stages {
			g.Emit("mbarrier.init.shared::cta.b64", ptx.Addr{Base: g.bars, Offset: int64(8 * i)}, ptx.Imm(1))
		}
		g.Emit("fence.mbarrier_init.release.cluster")
	})
	g.Emit("bar.sync", ptx.Imm(0))
	// A stage's bytes: the W box and the x rows there are.
	g.tx = g.op3("mul.lo.u32", ptx.U32, g.rows, ptx.Imm(4*gcStage))
	g.Emit("add.u32", g.tx, g.tx, ptx.Imm(gcWBox))
	for i := range c.Stages {
		g.when(g.thread0, false, func() { g.askW(g.imm32(int64(i)), ptx.Imm(int64(i))) })
	}
	g.Emit(bundle.PriorGridWait)
	g.xLane = g.cmp("lt", ptx.U32, g.tid, g.rows) // warp 0's lanes: rows <= 8
	g.xSrc = g.byteAddr(g.byteAddr(g.x, g.lane, 4*c.K), g.k0, 4)
	g.xDst = g.Reg(ptx.U32)
	g.Emit("mad.lo.u32", g.xDst, g.lane, ptx.Imm(gcXStride), g.slot0)
	g.Emit("add.u32", g.xDst, g.xDst, ptx.Imm(gcWBox))
	g.when(g.xLane, false, func() {
		for i := range c.Stages {
			g.askX(g.imm32(int64(i)), ptx.Imm(int64(i)))
		}
	})
	g.mainLoop()
	// The grid after it may launch once W is read, not before (session 32: at the start it
	// made the mixed 8-row step 2.5-2.9% longer).
	g.Emit(bundle.PriorGridLaunch)
	g.reduce()
}

// slotAddr is base + slot*slotBytes.
func (g *gcGen) slotAddr(base ptx.Reg, slot ptx.Operand) ptx.Reg {
	return g.scaled(base, slot, g.c.slotBytes())
}

// barAddr is the shared address of slot's mbarrier.
func (g *gcGen) barAddr(slot ptx.Operand) ptx.Reg { return g.scaled(g.bars, slot, 8) }

// scaled is base + i*size, i a register or an immediate (folded: a multiply's first source
// must be a register).
func (g *gcGen) scaled(base ptx.Reg, i ptx.Operand, size int) ptx.Reg {
	r := g.Reg(ptx.U32)
	if imm, ok := i.(ptx.Imm); ok {
		g.Emit("add.u32", r, base, ptx.Imm(int64(imm)*int64(size)))
		return r
	}
	g.Emit("mad.lo.u32", r, i, ptx.Imm(int64(size)), base)
	return r
}

// askW (thread 0) arms slot's mbarrier for a stage and asks for the stage's W box.
func (g *gcGen) askW(stage ptx.Reg, slot ptx.Operand) {
	bar := g.barAddr(slot)
	state := g.Reg(ptx.B64)
	g.Emit("mbarrier.arrive.expect_tx.shared::cta.b64", state, ptx.Addr{Base: bar}, g.tx)
	kc := g.Reg(ptx.U32)
	g.Emit("mad.lo.u32", kc, stage, ptx.Imm(gcStage), g.k0)
	g.Emit("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes",
		ptx.Addr{Base: g.slotAddr(g.slot0, slot)}, ptx.TensorAddr{Map: g.wmap, Coords: ptx.Vec{kc, g.col0}}, ptx.Addr{Base: bar})
}

// askX (lane r < rows of warp 0) asks for x row r of a stage.
func (g *gcGen) askX(stage ptx.Reg, slot ptx.Operand) {
	src := g.byteAddr(g.xSrc, stage, 4*gcStage)
	g.Emit("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes",
		ptx.Addr{Base: g.slotAddr(g.xDst, slot)}, ptx.Addr{Base: src}, ptx.Imm(4*gcStage), ptx.Addr{Base: g.barAddr(slot)})
}

// mainLoop multiplies the CTA's stages in order, slot by slot, refilling each slot with the
// stage Stages ahead once every warp is past it.
func (g *gcGen) mainLoop() {
	c := g.c
	gg, t, cg, q := g.gg, g.t, g.cg, g.q
	// kq = q*64 + 8t: the lane's first K of the stage; W row cg*16+g; x row g.
	kq := g.Reg(ptx.U32)
	g.Emit("shl.b32", kq, t, ptx.Imm(3))
	g.Emit("mad.lo.u32", kq, q, ptx.Imm(gcStage/4), kq)
	wrow := g.Reg(ptx.U32)
	g.Emit("mad.lo.u32", wrow, cg, ptx.Imm(16), gg)
	wOff := g.Reg(ptx.U32)
	g.Emit("mad.lo.u32", wOff, wrow, ptx.Imm(gcWRow), g.slot0)
	g.Emit("mad.lo.u32", wOff, kq, ptx.Imm(2), wOff)
	xOff := g.Reg(ptx.U32)
	g.Emit("mad.lo.u32", xOff, gg, ptx.Imm(gcXStride), g.slot0)
	g.Emit("mad.lo.u32", xOff, kq, ptx.Imm(4), xOff)
	g.Emit("add.u32", xOff, xOff, ptx.Imm(gcWBox))
	g.acc = g.Regs(ptx.F32, 4)
	for _, a := range g.acc {
		g.Emit("mov.f32", a, ptx.F32Imm(0))
	}
	stage, slot, phase := g.imm32(0), g.imm32(0), g.imm32(0)
	top := g.NewLabel("stage")
	g.Label(top)
	g.wait(g.barAddr(slot), phase)
	wa, xa := g.slotAddr(wOff, slot), g.slotAddr(xOff, slot)
	a, b := g.Regs(ptx.B32, 4), g.Regs(ptx.B32, 4)
	xs := g.Regs(ptx.F32, 8)
	xb := g.Regs(ptx.B32, 4)
	for ch := range gcStage / 128 {
		g.Emit("ld.shared.v4.b32", ptx.Vec(a), ptx.Addr{Base: wa, Offset: int64(64 * ch)})
		g.Emit("ld.shared.v4.b32", ptx.Vec(b), ptx.Addr{Base: wa, Offset: int64(64*ch + 8*gcWRow)})
		g.Emit("ld.shared.v4.f32", ptx.Vec(xs[:4]), ptx.Addr{Base: xa, Offset: int64(128 * ch)})
		g.Emit("ld.shared.v4.f32", ptx.Vec(xs[4:]), ptx.Addr{Base: xa, Offset: int64(128*ch + 16)})
		for i := range xb {
			g.Emit("cvt.rn.bf16x2.f32", xb[i], xs[2*i+1], xs[2*i])
		}
		acc := ptx.Vec(g.acc)
		g.Emit("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32", acc, ptx.Vec{a[0], b[0], a[1], b[1]}, ptx.Vec(xb[:2]), acc)
		g.Emit("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32", acc, ptx.Vec{a[2], b[2], a[3], b[3]}, ptx.Vec(xb[2:]), acc)
	}
	g.Emit("bar.sync", ptx.Imm(0))
	next := g.op3("add.u32", ptx.U32, stage, ptx.Imm(int64(c.Stages)))
	more := g.cmp("lt", ptx.U32, next, ptx.Imm(int64(c.kStages())))
	g.when(more, false, func() {
		g.when(g.thread0, false, func() { g.askW(next, slot) })
		g.when(g.xLane, false, func() { g.askX(next, slot) })
	})
	g.Emit("add.u32", slot, slot, ptx.Imm(1))
	wrap := g.cmp("eq", ptx.U32, slot, ptx.Imm(int64(c.Stages)))
	g.EmitIf(wrap, false, "mov.u32", slot, ptx.Imm(0))
	g.EmitIf(wrap, false, "xor.b32", phase, phase, ptx.Imm(1))
	g.Emit("add.u32", stage, stage, ptx.Imm(1))
	g.EmitIf(g.cmp("lt", ptx.U32, stage, ptx.Imm(int64(c.kStages()))), false, "bra", ptx.Sym(top))
}

// wait polls bar until its phase of parity phase has completed; a stage that never lands
// (a bad tensor map) traps after gcPolls polls, so the launch fails instead of hanging.
func (g *gcGen) wait(bar, phase ptx.Reg) {
	top, done := g.NewLabel("wait"), g.NewLabel("waited")
	polls := g.imm32(0)
	ok := g.Reg(ptx.Pred)
	g.Label(top)
	g.Emit("mbarrier.try_wait.parity.shared::cta.b64", ok, ptx.Addr{Base: bar}, phase)
	g.EmitIf(ok, false, "bra", ptx.Sym(done))
	g.Emit("add.u32", polls, polls, ptx.Imm(1))
	g.EmitIf(g.cmp("lt", ptx.U32, polls, ptx.Imm(gcPolls)), false, "bra", ptx.Sym(top))
	g.Emit("trap")
	g.Label(done)
}

// reduce adds the four K quarters of each column group, then the cluster's ranks in rank
// order, and rank 0's quarter-0 warps store y.
func (g *gcGen) reduce() {
	c := g.c
	red := g.Reg(ptx.U32)
	g.Emit("mad.lo.u32", red, g.tid, ptx.Imm(16), g.slot0)
	g.Emit("st.shared.v4.f32", ptx.Addr{Base: red}, ptx.Vec(g.acc))
	g.Emit("bar.sync", ptx.Imm(0))
	q, cg := g.q, g.cg
	lead := g.cmp("eq", ptx.U32, q, ptx.Imm(0))
	part := g.Regs(ptx.F32, 4)
	add := func(a ptx.Addr) {
		g.Emit("ld.shared.v4.f32", ptx.Vec(part), a)
		for i := range part {
			g.Emit("add.f32", g.acc[i], g.acc[i], part[i])
		}
	}
	g.when(lead, false, func() {
		for qq := 1; qq < 4; qq++ {
			add(ptx.Addr{Base: red, Offset: int64(qq * gcRedBytes)})
		}
	})
	// recv: where rank r's sums of column group cg, lane l land in rank 0: row (r-1)*4 + cg.
	recv := g.Reg(ptx.U32)
	g.Emit("mad.lo.u32", recv, cg, ptx.Imm(gcRedBytes), g.bars)
	g.Emit("mad.lo.u32", recv, g.lane, ptx.Imm(16), recv)
	g.Emit("add.u32", recv, recv, ptx.Imm(int64(c.recvOff())))
	if c.Split > 1 {
		g.Emit("barrier.cluster.wait")
		sender := g.cmp("ne", ptx.U32, g.rank, ptx.Imm(0))
		send := g.Reg(ptx.Pred)
		g.Emit("and.pred", send, sender, lead)
		g.when(send, false, func() {
			at := g.Reg(ptx.U32)
			g.Emit("add.u32", at, g.rank, ptx.Imm(-1))
			g.Emit("mad.lo.u32", at, at, ptx.Imm(gcCols/16*gcRedBytes), recv)
			remote := g.Reg(ptx.U32)
			g.Emit("mapa.shared::cluster.u32", remote, at, ptx.Imm(0))
			g.Emit("st.shared::cluster.v4.f32", ptx.Addr{Base: remote}, ptx.Vec(g.acc))
		})
		g.Emit("barrier.cluster.arrive.release")
		g.Emit("barrier.cluster.wait.acquire")
		g.EmitIf(sender, false, "exit")
	}
	g.EmitIf(lead, true, "exit")
	for r := 1; r < c.Split; r++ {
		add(ptx.Addr{Base: recv, Offset: int64((r - 1) * gcCols / 16 * gcRedBytes)})
	}
	// acc: (column g, tokens 2t, 2t+1), (column g+8, tokens 2t, 2t+1).
	gg, t := g.gg, g.t
	col := g.Reg(ptx.U32)
	g.Emit("mad.lo.u32", col, cg, ptx.Imm(16), gg)
	g.Emit("add.u32", col, col, g.col0)
	tok := g.op3("shl.b32", ptx.U32, t, ptx.Imm(1))
	for i := range 2 {
		row := g.op3("add.u32", ptx.U32, tok, ptx.Imm(int64(i)))
		idx := g.Reg(ptx.U32)
		g.Emit("mad.lo.u32", idx, row, ptx.Imm(int64(c.N)), col)
		at := g.byteAddr(g.y, idx, 4)
		in := g.cmp("lt", ptx.U32, row, g.rows)
		g.EmitIf(in, false, "st.global.f32", ptx.Addr{Base: at}, g.acc[i])
		g.EmitIf(in, false, "st.global.f32", ptx.Addr{Base: at, Offset: 32}, g.acc[2+i])
	}
}
