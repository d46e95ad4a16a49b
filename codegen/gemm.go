package codegen

import (
	"cmp"
	"fmt"

	"xmix/bundle"
	"xmix/ops"
	"xmix/ptx"
)

// GemmConfig is y[rows,N] = x[rows,K] @ w[N,K]^T with x and y in f32 and w stored as WDtype.
type GemmConfig struct {
	K, N   int
	WDtype ptx.Type
	Guard  uint32 // not zero: a heavy app's GEMM, run only when ctl.any_mask has one of these bits
	// Prefetch, when not 0, is how many bytes of each of its weight rows a warp asks L2 for
	// before the kernel waits for the grid ahead (a kernel built for early launch, BuildInfo.PDL:
	// it then waits itself, after the prefetch; earlyLaunch adds only the launch). The weights
	// never change, so reading them early is safe, and a GEMV launched early starts streaming
	// them while the small kernels ahead of it (attention, add+norm, SiLU) run, instead of after.
	// A tensor-core GEMM (GemmTC) also loads its first step's weights into registers before
	// the wait and prefetches only the bytes past them; loaded so, the GEMV's batch-1 step
	// took 10% longer on the H200 (session 12). It changes no result: the op's attributes leave
	// it out.
	Prefetch int
	// Cols (> 1, dividing N) gives each warp Cols adjacent columns instead of one, so that the
	// x loads of a K step serve them all: at rows > 1 the x loads, not the weights, bound the
	// one-column GEMV (every weight chunk takes two 16-byte x loads per row). Each column's sum
	// takes the same instructions in the same order as in the one-column GEMV, so the bits are
	// the same and a row's result does not depend on the bucket it runs in. It changes no
	// result: the op's attributes leave it out.
	Cols int
	// Unroll (> 1) makes each K step of a lane Unroll chunks, every weight load of them issued
	// before the first is used: a warp then has Unroll times the bytes in flight (on the H200
	// that shortens steps of 2-7 rows by 3-12%; at one row the extra registers cost more warps
	// than the loads gain). The chunks are summed in the order of the loop without it, so the
	// bits are the same; the op's attributes leave it out. In a tensor-core GEMM (GemmTC) it is
	// the K chunks each K group takes per step (gemm_tc.go, "Loads in flight").
	Unroll int
	// Rows, when not 0, is the most rows a call of a tensor-core GEMM has (its decode bucket):
	// it then keeps accumulators for only that many rows per pass over W. More rows still work,
	// in more passes. The bits are the same; the op's attributes leave it out. (CUDA-core
	// GEMVs built so for buckets under gemmTile rows, 36 registers instead of 80 at batch 1 on
	// Llama-3.1-8B, made the step 4-23% longer on the H200, session 13: fewer loads in flight.)
	Rows int
	// Split (2, 4 or 8), when not 0 or 1, splits each column's K over Split warps of a block,
	// which sum their warps' totals through shared memory in warp order: a GEMM of few
	// columns then has Split times the warps, so its last wave of blocks is a smaller share
	// of the kernel (on the H200 Llama-3.1-8B's o and down projections, 4096 columns at
	// batch 1, fill 1.3 waves of resident warps). It changes the order of each column's sum,
	// so every GEMV of a weight takes the same Split (splitFor), which keeps a row's result
	// independent of its bucket; the op's attributes leave it out, as the reference's
	// tolerance covers any order.
	Split int
	// Warps (1, 2, 4 or 8; 0: gemmWarps) is the warps of a CUDA-core GEMV's block. A warp's
	// work does not depend on its block, so the bits are the same; smaller blocks end more
	// evenly at the kernel's tail (a block of a many-wave GEMV streams Warps times a warp's
	// columns). The op's attributes leave it out.
	Warps int
	// Tickets is how many u32 ticket counters open a staged tensor-core GEMM's workspace
	// (GemmTCStaged), the same for every staged GEMM of a bundle, at least StagedTickets of
	// each (gemm_tc_staged.go, "Workspace"). It changes no result.
	Tickets int
}

// colsPerWarp is how many columns a warp of the plain GEMV computes (GemmConfig.Cols).
func (c GemmConfig) colsPerWarp() int {
	if c.Cols > 1 && c.N%c.Cols == 0 {
		return c.Cols
	}
	return 1
}

// splitWarps is how many warps share each column's K (GemmConfig.Split; 1: one).
func (c GemmConfig) splitWarps() int { return max(1, c.Split) }

// blockWarps is the warps of a CUDA-core GEMV's block (GemmConfig.Warps).
func (c GemmConfig) blockWarps() int { return cmp.Or(c.Warps, gemmWarps) }

// The decode GEMM gives each warp one output column (or Cols adjacent ones): lanes stride K
// with 16-byte loads, and each weight chunk, loaded once, is applied to a tile of up to
// gemmTile rows of x. Each tile size has its own code, so no lane ever computes a
// row that does not exist.
const (
	// gemmWarps is a CUDA-core GEMV block's warps unless GemmConfig.Warps says otherwise.
	gemmWarps = 8
	gemmTile  = 8
	// MaxGemvUnroll bounds GemmConfig.Unroll: the weight registers of a step grow with it.
	MaxGemvUnroll = 8
	// MaxGemvCols bounds GemmConfig.Cols: a warp's columns share its tile of x rows.
	MaxGemvCols = gemmTile
)

// Launch is the grid for a call over rows rows.
func (c GemmConfig) Launch(rows int) ops.Launch {
	return c.gemvLaunch(c.N / c.colsPerWarp())
}

// gemvLaunch is the grid of a GEMV of c computing units units, each by c's split warps.
func (c GemmConfig) gemvLaunch(units int) ops.Launch {
	warps, per := units*c.splitWarps(), c.blockWarps()
	return ops.Launch{Grid: [3]int{(warps + per - 1) / per, 1, 1}, Block: [3]int{32 * per, 1, 1}}
}

// Gemm generates the kernel; parameters: x, w, y (u64), rows (u32).
func Gemm(name string, c GemmConfig) (*Kernel, error) {
	attrs, err := gemmAttrs(c)
	if err != nil {
		return nil, fmt.Errorf("gemm %s: %w", name, err)
	}
	g := gemmGen{emitter: newEmitter(name), c: c}
	if err := g.emit(); err != nil {
		return nil, fmt.Errorf("gemm %s: %w", name, err)
	}
	return finish(g.Kernel, "gemm", attrs)
}

// gemmAttrs checks c and returns op gemm's attributes of it.
func gemmAttrs(c GemmConfig) (ops.GemmAttrs, error) {
	dt, ok := dtypeName(c.WDtype)
	if !ok {
		return ops.GemmAttrs{}, fmt.Errorf("weight dtype %s: want f32 or bf16", c.WDtype)
	}
	if c.K <= 0 || c.N <= 0 {
		return ops.GemmAttrs{}, fmt.Errorf("sizes K=%d N=%d: both must be positive", c.K, c.N)
	}
	if c.Cols < 0 || c.Cols > MaxGemvCols {
		return ops.GemmAttrs{}, fmt.Errorf("%d columns per warp: want 0 to %d", c.Cols, MaxGemvCols)
	}
	if c.Unroll < 0 || c.Unroll > MaxGemvUnroll {
		return ops.GemmAttrs{}, fmt.Errorf("unroll %d: want 0 to %d", c.Unroll, MaxGemvUnroll)
	}
	if err := CheckGemvSplit(c.Split); err != nil {
		return ops.GemmAttrs{}, err
	}
	if err := CheckGemvWarps(c.Warps, c.Split); err != nil {
		return ops.GemmAttrs{}, err
	}
	return ops.GemmAttrs{K: c.K, N: c.N, WDtype: dt, Guard: c.Guard}, nil
}

// CheckGemvSplit checks the most warps a GEMV column's K may be split over
// (GemmConfig.Split, bundle.BuildInfo.GemvSplit, xmixc build --gemv-split): 0 or 1 (none),
// 2, 4 or 8, each a divisor of a block's gemmWarps.
func CheckGemvSplit(n int) error {
	switch n {
	case 0, 1, 2, 4, 8:
		return nil
	}
	return fmt.Errorf("GEMV split %d: want 1, 2, 4 or 8 warps a column", n)
}

// GemvWarpsRecord is n, a CUDA-core GEMV block's warps, as the build info records it
// (bundle.BuildInfo.GemvWarps): 0 for gemmWarps, what a bundle built before the setting
// existed has, so its bytes stay the same. GemvWarpsOf reads the record back.
func GemvWarpsRecord(n int) int {
	if n == gemmWarps {
		return 0
	}
	return n
}

// GemvWarpsOf is the block warps that build info record n stands for (GemvWarpsRecord).
func GemvWarpsOf(n int) int { return GemmConfig{Warps: n}.blockWarps() }

// CheckGemvWarps checks the warps of a CUDA-core GEMV's block (GemmConfig.Warps,
// bundle.BuildInfo.GemvWarps, xmixc build --gemv-warps): 0 (gemmWarps), 1, 2, 4 or 8, and at
// least the warps a column's K is split over (split, GemmConfig.Split).
func CheckGemvWarps(n, split int) error {
	switch {
	case n != 0 && n != 1 && n != 2 && n != 4 && n != 8:
		return fmt.Errorf("GEMV block of %d warps: want 1, 2, 4 or 8", n)
	case n != 0 && n < split:
		return fmt.Errorf("GEMV block of %d warps cannot hold a column split over %d", n, split)
	}
	return nil
}

type gemmGen struct {
	emitter
	c     GemmConfig
	vec   int       // elements per lane per K step: 8 (bf16) or 4 (f32) when K allows, else 1
	wrows []ptx.Reg // this warp's weight rows: its columns', or its unit's (epi)
	cols  []ptx.Reg // the output columns of wrows (the plain GEMV's)
	x, y  ptx.Reg
	lane  ptx.Reg
	col   ptx.Reg // this warp's column, or its unit (epi)
	// first is the lane's first K chunk: the lane, plus 32 per part before the warp's in a
	// split GEMV (GemmConfig.Split), whose part-0 warp alone writes (part0); partials is the
	// warp's slots of the shared array the parts' totals pass through.
	first, part0, partials ptx.Reg
	// epi, when set, makes the kernel a fused GEMV (gemm_fused.go): each warp computes the
	// columns of one unit and the epilogue writes what the kernel after the GEMM would have.
	epi gemvEpilogue
}

func (g *gemmGen) emit() error {
	c := g.c
	g.x = g.param("x", ptx.U64)
	w := g.param("w", ptx.U64)
	g.y = g.param("y", ptx.U64)
	rows := g.param("rows", ptx.U32)
	units := c.N / c.colsPerWarp()
	if g.epi != nil {
		g.epi.params(g)
		units = g.epi.units()
	}
	split, bw := c.splitWarps(), c.blockWarps()
	if per := bw / split; split > 1 && units%per != 0 {
		// A block's warps meet at barriers, so none of them may leave early.
		return fmt.Errorf("split %d: %d units of columns do not fill blocks of %d", split, units, per)
	}
	if c.Prefetch == 0 {
		g.guard(c.Guard)
	}
	g.vec = 1
	if v := 16 / c.WDtype.Bytes(); c.K%v == 0 {
		g.vec = v
	}
	tid := g.special(ptx.TidX)
	g.lane = g.op3("and.b32", ptx.U32, tid, ptx.Imm(31))
	warp := g.op3("shr.u32", ptx.U32, tid, ptx.Imm(5))
	cta := g.special(ptx.CtaidX)
	g.col = g.Reg(ptx.U32)
	g.first = g.lane
	if split > 1 {
		// Warp w computes part w%split of unit w/split of the block's.
		sh, _ := log2(split)
		part := g.op3("and.b32", ptx.U32, warp, ptx.Imm(int64(split-1)))
		g.Emit("mad.lo.u32", g.col, cta, ptx.Imm(int64(bw/split)), g.op3("shr.u32", ptx.U32, warp, ptx.Imm(int64(sh))))
		g.first = g.Reg(ptx.U32)
		g.Emit("mad.lo.u32", g.first, part, ptx.Imm(32), g.lane)
		g.part0 = g.cmp("eq", ptx.U32, part, ptx.Imm(0))
	} else {
		g.Emit("mad.lo.u32", g.col, cta, ptx.Imm(int64(bw)), warp)
	}
	done := g.NewLabel("done")
	// Whole warps leave together, so the shuffles below always see 32 live lanes.
	g.EmitIf(g.cmp("ge", ptx.U32, g.col, ptx.Imm(int64(units))), false, "bra", ptx.Sym(done))
	cols := []ptx.Reg{g.col}
	switch n := c.colsPerWarp(); {
	case g.epi != nil:
		cols = g.epi.columns(g, g.col)
	case n > 1:
		cols = make([]ptx.Reg, n)
		for i := range cols {
			cols[i] = g.Reg(ptx.U32)
			g.Emit("mad.lo.u32", cols[i], g.col, ptx.Imm(int64(n)), ptx.Imm(int64(i)))
		}
	}
	g.cols = cols
	for _, col := range cols {
		g.wrows = append(g.wrows, g.byteAddr(w, col, c.K*c.WDtype.Bytes()))
	}
	if split > 1 {
		// Each warp's totals: a slot per column and row of a tile.
		per := len(cols) * gemmTile
		g.partials = g.sharedAddr(g.DeclareShared("gemv_parts", ptx.F32, bw*per), warp, 4*per)
	}
	if c.Prefetch > 0 {
		g.prefetchWeights(c.Prefetch)
		g.Emit(bundle.PriorGridWait)
		g.guard(c.Guard) // ctl.any_mask is read after the wait, as every other word is
	}

	r0 := g.imm32(0)
	left := g.Reg(ptx.U32)
	full := g.NewLabel("full_tiles")
	g.Label(full)
	g.Emit("sub.u32", left, rows, r0)
	g.when(g.cmp("ge", ptx.U32, left, ptx.Imm(gemmTile)), false, func() {
		g.tile(r0, gemmTile)
		g.Emit("bra", ptx.Sym(full))
	})
	// The remaining rows (fewer than a tile) take one more pass over the weights, with
	// code specialised to their count.
	g.Emit("sub.u32", left, rows, r0)
	for t := 1; t < gemmTile; t++ {
		g.when(g.cmp("eq", ptx.U32, left, ptx.Imm(int64(t))), false, func() {
			g.tile(r0, t)
			g.Emit("bra", ptx.Sym(done))
		})
	}
	g.Label(done)
	return nil
}

// tile computes rows r0..r0+t-1 of this warp's columns and advances r0 by t. Each column's
// sum takes the same instructions in the same order whatever else the warp computes, so a
// fused GEMV's columns have the plain GEMV's bits.
func (g *gemmGen) tile(r0 ptx.Reg, t int) {
	c := g.c
	xrow := make([]ptx.Reg, t)
	for j := range xrow {
		r := g.op3("add.u32", ptx.U32, r0, ptx.Imm(int64(j)))
		xrow[j] = g.byteAddr(g.x, r, 4*c.K)
	}
	if g.epi != nil {
		g.epi.prepare(g, r0, t)
	}
	acc := make([][]ptx.Reg, len(g.wrows)) // [column][row]
	for ci := range acc {
		acc[ci] = make([]ptx.Reg, t)
		for j := range t {
			acc[ci][j] = g.f32(0)
		}
	}
	// chunk applies the weights wv of chunk k (every column's) to the tile's rows.
	chunk := func(k ptx.Reg, wv [][]ptx.Reg) {
		for j := range t {
			xa := g.byteAddr(xrow[j], k, 4*g.vec)
			for q := 0; q < g.vec; q += 4 {
				var xs []ptx.Reg
				if g.vec == 1 {
					xs = []ptx.Reg{g.Reg(ptx.F32)}
					g.Emit("ld.global.f32", xs[0], ptx.Addr{Base: xa})
				} else {
					xs = g.Regs(ptx.F32, 4)
					g.Emit("ld.global.v4.f32", ptx.Vec(xs), ptx.Addr{Base: xa, Offset: int64(4 * q)})
				}
				for i, xv := range xs {
					for ci := range acc {
						g.Emit("fma.rn.f32", acc[ci][j], xv, wv[ci][q+i], acc[ci][j])
					}
				}
			}
		}
	}
	load := func(k ptx.Reg) [][]ptx.Reg {
		wv := make([][]ptx.Reg, len(g.wrows))
		for ci, wrow := range g.wrows {
			wv[ci] = g.loadW(wrow, k)
		}
		return wv
	}
	chunks := c.K / g.vec
	// A lane's chunks are first, first+stride, ...: the warps of a split column take turns
	// at 32 chunks each.
	stride := 32 * c.splitWarps()
	k := g.Reg(ptx.U32)
	start := ptx.Operand(g.first)
	if u := max(1, c.Unroll); u > 1 && chunks > stride*(u-1) {
		// Steps of u chunks (k, k+stride, ...) while the last of them is inside the row, then
		// single chunks from where they stop: each lane's chunks in the same order as without.
		g.forLoop(k, g.first, ptx.Imm(int64(chunks-stride*(u-1))), ptx.Imm(int64(stride*u)), func() {
			ks, wvs := make([]ptx.Reg, u), make([][][]ptx.Reg, u)
			for i := range u {
				ks[i] = k
				if i > 0 {
					ks[i] = g.op3("add.u32", ptx.U32, k, ptx.Imm(int64(stride*i)))
				}
				wvs[i] = load(ks[i])
			}
			for i := range u {
				chunk(ks[i], wvs[i])
			}
		})
		start = k
	}
	g.forLoop(k, start, ptx.Imm(int64(chunks)), ptx.Imm(int64(stride)), func() { chunk(k, load(k)) })
	split := c.splitWarps() > 1
	if split {
		g.sumParts(acc)
	}
	if g.epi != nil {
		if split {
			g.when(g.part0, false, func() { g.epi.store(g, r0, t, acc) })
		} else {
			g.epi.store(g, r0, t, acc)
		}
	} else {
		isLane0 := g.cmp("eq", ptx.U32, g.lane, ptx.Imm(0))
		if split {
			g.Emit("and.pred", isLane0, isLane0, g.part0)
		}
		for ci, col := range g.cols {
			for j, a := range acc[ci] {
				if !split {
					g.warpReduce(a, "add")
				}
				r := g.op3("add.u32", ptx.U32, r0, ptx.Imm(int64(j)))
				idx := g.Reg(ptx.U32)
				g.Emit("mad.lo.u32", idx, r, ptx.Imm(int64(c.N)), col)
				g.EmitIf(isLane0, false, "st.global.f32", ptx.Addr{Base: g.byteAddr(g.y, idx, 4)}, a)
			}
		}
	}
	g.Emit("add.u32", r0, r0, ptx.Imm(int64(t)))
}

// sumParts makes the part-0 warp's sums of a split GEMV's tile the columns' totals (the
// sums of every lane, as rowSums and the plain store expect them after their butterflies): every
// warp folds its sums over its lanes, the other parts leave theirs in shared memory, and the
// part-0 warp adds them in part order, every lane the same. The second barrier keeps the next
// tile's totals from overwriting these before they are read.
func (g *gemmGen) sumParts(acc [][]ptx.Reg) {
	split := g.c.splitWarps()
	for _, col := range acc {
		for _, a := range col {
			g.warpReduce(a, "add")
		}
	}
	slot := func(part, ci, j int) ptx.Addr {
		return ptx.Addr{Base: g.partials, Offset: int64(4 * ((part*len(acc)+ci)*gemmTile + j))}
	}
	writer, others := g.cmp("eq", ptx.U32, g.lane, ptx.Imm(0)), g.Reg(ptx.Pred)
	g.Emit("not.pred", others, g.part0)
	g.Emit("and.pred", writer, writer, others)
	for ci, col := range acc {
		for j, a := range col {
			g.EmitIf(writer, false, "st.shared.f32", slot(0, ci, j), a)
		}
	}
	g.Emit("bar.sync", ptx.Imm(0))
	g.when(g.part0, false, func() {
		v := g.Reg(ptx.F32)
		for p := 1; p < split; p++ {
			for ci, col := range acc {
				for j, a := range col {
					g.Emit("ld.shared.f32", v, slot(p, ci, j))
					g.Emit("add.f32", a, a, v)
				}
			}
		}
	})
	g.Emit("bar.sync", ptx.Imm(0))
}

// prefetchWeights asks L2 for the first n bytes of each of the warp's weight rows, as whole
// 128-byte lines inside the row (lane l takes lines l, l+32, ...; in a split GEMV the lanes
// of a column's warps take turns as they do at its chunks), so no request reaches past the
// weight.
func (g *gemmGen) prefetchWeights(n int) {
	lines := min(n, g.c.K*g.c.WDtype.Bytes()) / 128
	if lines == 0 {
		return
	}
	round := 32 * g.c.splitWarps() // lines a round of the column's lanes asks for
	off := g.Reg(ptx.U64)
	g.Emit("mul.wide.u32", off, g.first, ptx.Imm(128))
	var part *ptx.Reg // the lanes of the last, partial round of lines
	if lines%round != 0 {
		p := g.cmp("lt", ptx.U32, g.first, ptx.Imm(int64(lines%round)))
		part = &p
	}
	for _, wrow := range g.wrows {
		a := g.Reg(ptx.U64)
		g.Emit("add.u64", a, wrow, off)
		for i := 0; i*round < lines; i++ {
			at := ptx.Addr{Base: a, Offset: int64(i * round * 128)}
			if (i+1)*round > lines {
				g.EmitIf(*part, false, "prefetch.global.L2", at)
			} else {
				g.Emit("prefetch.global.L2", at)
			}
		}
	}
}

// loadW loads weight chunk k (vec elements) of weight row wrow as f32 registers.
func (g *gemmGen) loadW(wrow, k ptx.Reg) []ptx.Reg {
	a := ptx.Addr{Base: g.byteAddr(wrow, k, g.vec*g.c.WDtype.Bytes())}
	return loadChunk(g.emitter, a, g.c.WDtype, g.vec)
}
