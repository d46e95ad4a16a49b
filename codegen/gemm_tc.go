package codegen

import (
	"fmt"

	"xmix/bundle"
	"xmix/ops"
	"xmix/ptx"
)

// The tensor-core GEMM for decode batches (op "gemm_tc"): y[rows,N] = bf16(x)[rows,K] .
// w[N,K]^T with mma.sync.m16n8k16 (bf16 in, f32 accumulate).
//
// Mapping. A 16-column tile of W ([N,K] row-major) is exactly mma's A operand (row-major,
// M = 16 output columns, K = 16), and 8 rows of x ([rows,K], each row contiguous in K) are B
// in .col layout, so D[16 columns x 8 rows] = W_tile . x_tile^T needs no transposes.
//
// Fragments straight from global memory. A dot product may visit K in any order as long as
// W and x agree, so each 32-wide K chunk is permuted to make every load wide: lane (g, t) =
// (laneid>>2, laneid&3) loads W elements [8t, 8t+8) of rows g and g+8 of its tile (two
// 16-byte loads; the 4 lanes of a group read a row's 64 contiguous bytes, so every sector is
// used whole) and x elements [8t, 8t+8) of row g of each row tile (two 16-byte loads, packed
// to bf16x2 by cvt). Words 0,1 of each feed the first mma and words 2,3 the second: the first
// mma's logical k {2t, 2t+1, 2t+8, 2t+9} are physical {8t, 8t+1, 8t+2, 8t+3}, the second's
// are {8t+4, ..., 8t+7}, for A and B alike. A K % 32 == 16 tail uses the 16-wide variant
// (8-byte W loads, logical {2t, 2t+1, 2t+8, 2t+9} = physical {4t, ..., 4t+3}).
//
// Work split. A block is 8 warps: tcWc column warps (one 16-column tile each) times
// tcWk = 8/tcWc K groups; K group j takes 32-chunks j, j+Wk, ... The K groups' partial sums
// meet in shared memory in a fixed order (group 0 stores, 1..Wk-1 add, the last adds and
// writes y), so the result is deterministic and no y pre-zeroing or atomics are needed. The
// generator picks the widest tcWc that still gives at least tcMinBlocks blocks (one per SM
// on an H200), so small N (4096) fills the GPU by splitting K inside blocks.
//
// Rows. A warp keeps up to 16 row tiles (128 rows) of accumulators (64 f32 per lane); tiles
// past ceil(rows/8) are skipped, x rows past rows read as zero and are never stored. More
// than 128 rows loop over groups of 128 and stream W again per group (correct, not fast). A
// kernel built for a decode bucket (GemmConfig.Rows) keeps only that bucket's tiles: an
// 8-row call then needs 4 accumulators, not 64, and the registers go to loads in flight.
//
// Loads in flight. Each step of a K group takes U chunks (GemmConfig.Unroll; tcSettings in
// lower.go picks it per bucket), chunks ch, ch+Wk, ..., ch+(U-1)Wk: the W of the next step's
// U chunks loads while this step's are multiplied, and per row tile the x of all U chunks is
// loaded before the first is used, so a warp keeps U KiB of W in flight. At one chunk and 16
// row tiles, 150-160 registers left one 8-warp block per SM and 8 KiB of W in flight per SM,
// a quarter of what the H200's 4.25 TB/s needs at its memory latency: Llama-3.1-8B's gate/up
// GEMM at 8 rows streamed W at 1.4 TB/s. Two blocks fit from 128 registers down. Every
// accumulator still sums its chunks in the same order, so the bits depend on neither U nor
// Rows. A ring of 8U W registers, each slot refilled with the chunk U*Wk further on as soon
// as it was multiplied (94 registers instead of 126 at 4 chunks and 8 rows), made the step
// 42-281% longer on the H200 at 8-32 rows (session 13): each chunk's x then loads right
// before its multiply.
// Built for early launch, a K group loads its first step's W before it waits for the grid
// ahead (preloadWeights): -0.2% to -1.5% a step on the H200 under --gemm ptx (session 12).
//
// Bytes moved per call (rows <= 128): W is read from HBM exactly once, N*K*2 bytes, and y is
// written once, rows*N*4. Every block reads x for its columns' whole K range, so L2 serves
// (N/(16*tcWc)) * rows*K*4 bytes of x (a block's column warps share it through L1): at
// N = 4096 (tcWc = 1) that equals W's bytes at rows = 8 and is 16x them at rows = 128. L1
// serves each warp rows*128 bytes of x per KiB of W it streams, and every warp loads its x in
// f32 and splits it into hi/lo for every chunk, so the work per KiB of W grows with the rows:
// on the H200 a Llama-3.1-8B decode step served by these kernels takes 1.03x the step served
// by cuBLASLt at 8 rows, 1.45x at 16 and about 2.3x at 32. Without the split (bf16 x, one mma
// per chunk instead of two; measured only) it would still take 1.36x and 2.0x, so the per-warp
// x loads, not the split, are most of it (testsuite/gpu/RESULTS.md, "The tensor-core GEMM's
// loads in flight").
const (
	tcWarps = 8
	// MaxTCChunks bounds the chunks a step takes (GemmConfig.Unroll of a tensor-core GEMM):
	// W registers grow with it.
	MaxTCChunks = 8
	tcRowTiles  = 16 // row tiles (of 8) a warp accumulates at once: 128 rows
	tcMinBlocks = targetSMs
	tcRedStride = 20 // f32 per row in the reduction buffer: 16 columns + pad against bank conflicts
	// tcGatedWidth is what the gated kernel's gate/up width is a multiple of: a column warp's
	// 16-column tile of gate and the same tile of up.
	tcGatedWidth = 2 * 16
)

// tcColumnWarps is how many 16-column tiles a block covers for N columns: the most (sharing
// x best) that still leaves tcMinBlocks blocks.
func tcColumnWarps(n int) int {
	tiles := n / 16
	for _, wc := range []int{8, 4, 2} {
		if (tiles+wc-1)/wc >= tcMinBlocks {
			return wc
		}
	}
	return 1
}

// LaunchTC is the grid of the tensor-core GEMM (GemmTC) for a call over rows rows.
func (c GemmConfig) LaunchTC(rows int) ops.Launch {
	wc := tcColumnWarps(c.N)
	return ops.Launch{Grid: [3]int{(c.N/16 + wc - 1) / wc, 1, 1}, Block: [3]int{32 * tcWarps, 1, 1}}
}

// GemmTC generates the tensor-core GEMM; parameters: x, w, y (u64), rows (u32). W must be
// bf16 and K and N multiples of 16. Launch it with c.LaunchTC(rows).
func GemmTC(name string, c GemmConfig) (*Kernel, error) {
	return gemmTC(name, c, tcColumnWarps(c.N))
}

func gemmTC(name string, c GemmConfig, wc int) (*Kernel, error) {
	if err := checkTC(c); err != nil {
		return nil, fmt.Errorf("gemm_tc %s: %w", name, err)
	}
	g := newTCGen(name, c, wc)
	g.emit()
	return finish(g.Kernel, "gemm_tc", bundle.GemmTCAttrs{K: c.K, N: c.N, Guard: c.Guard})
}

func newTCGen(name string, c GemmConfig, wc int) *tcGen {
	g := &tcGen{emitter: newEmitter(name), c: c, wc: wc, wk: tcWarps / wc, tiles: tcRowTiles, unroll: max(1, c.Unroll), parts: 1}
	if c.Rows > 0 {
		g.tiles = min(tcRowTiles, (c.Rows+7)/8)
	}
	g.MaxNTid = 32 * tcWarps
	return g
}

// LaunchTC is the grid of the tensor-core gate/up GEMM (GemmTCGated) for a call over rows
// rows: one column warp for each 16 columns of the activation.
func (c GemmGatedConfig) LaunchTC(rows int) ops.Launch {
	return GemmConfig{N: c.Gemm.N / 2}.LaunchTC(rows)
}

// GemmTCGated generates the gate/up projection on tensor cores with the gated activation in
// its epilogue (op gemm_gated, as GemmGated; parameters x, w, act, rows): each column warp
// computes a 16-column tile of gate and the same tile of up, so every x fragment it loads
// and splits serves twice the weights, and act(gate) * up is taken in registers after the K
// groups' sums, with SiluMul's arithmetic. Each tile's sum takes the instructions of GemmTC's
// in the same order, so its columns are GemmTC's over N = 2*Inter, then SiluMul's, bit for
// bit. Launch it with c.LaunchTC(rows).
func GemmTCGated(name string, c GemmGatedConfig) (*Kernel, error) {
	inter := c.Gemm.N / 2
	return gemmTCGated(name, c, tcColumnWarps(inter))
}

// gatedTCReaches says whether GemmTCGated can serve c: a gate row's up row is an immediate
// offset away, 32 bits, signed.
func gatedTCReaches(c GemmConfig) bool { return int64(c.N)*int64(c.K) < 1<<31 }

func gemmTCGated(name string, c GemmGatedConfig, wc int) (*Kernel, error) {
	a, err := c.attrs(tcGatedWidth)
	switch {
	case err != nil:
	case c.Gemm.Guard != 0:
		err = fmt.Errorf("guard %#x: want none", c.Gemm.Guard)
	case !gatedTCReaches(c.Gemm):
		err = fmt.Errorf("%d x %d weights: the up half starts past 2 GiB", c.Gemm.N, c.Gemm.K)
	default:
		err = checkTC(c.Gemm)
	}
	if err != nil {
		return nil, fmt.Errorf("gemm_gated %s: %w", name, err)
	}
	g := newTCGen(name, c.Gemm, wc)
	g.parts, g.act = 2, c.Act
	g.emit()
	a.Split = true
	return finish(g.Kernel, "gemm_gated", a)
}

// checkTC checks what both tensor-core GEMMs (GemmTC, GemmTCStaged) need of c: bf16 weights,
// K and N positive multiples of 16 (the mma tiles), a row count of at least 0 and at most
// MaxTCChunks K chunks in flight.
func checkTC(c GemmConfig) error {
	switch {
	case c.WDtype != ptx.BF16:
		return fmt.Errorf("weight dtype %s: tensor-core GEMM needs bf16", c.WDtype)
	case c.K <= 0 || c.N <= 0 || c.K%16 != 0 || c.N%16 != 0:
		return fmt.Errorf("sizes K=%d N=%d: both must be positive multiples of 16", c.K, c.N)
	case c.Rows < 0 || c.Unroll < 0 || c.Unroll > MaxTCChunks:
		return fmt.Errorf("%d rows, %d chunks in flight: want rows >= 0 and 0 to %d chunks", c.Rows, c.Unroll, MaxTCChunks)
	}
	return nil
}

type tcGen struct {
	emitter
	c              GemmConfig
	wc, wk         int
	x, w, y, rows  ptx.Reg
	g, t, kg, wcol ptx.Reg     // lane group, lane in group, K group, column warp
	colBase        ptx.Reg     // first output column of this warp's tile
	acc            [][]ptx.Reg // [row tile] the 4 accumulators of its m16n8 tile
	red            ptx.Sym
	tiles          int // row tiles a pass over W computes
	unroll         int // chunks a K group takes per step
	// pre: the W of the K group's first step, loaded before the wait (preloadWeights); fresh:
	// it is loaded and not yet used. pre is nil without early launch.
	pre   []ptx.Reg
	fresh ptx.Reg
	// parts is the 16-column tiles a column warp computes: 1, or 2 for the gated kernel's
	// gate tile and its up tile, units() columns apart in W; act is the gated activation.
	parts int
	act   string
}

// units is y's columns: N, or the gated kernel's Inter (its parts' columns apart in W).
func (g *tcGen) units() int { return g.c.N / g.parts }

// chunkWords is how many W registers a lane takes for one 32-wide K chunk: 4 words of each of
// its two rows, for each part.
func (g *tcGen) chunkWords() int { return 8 * g.parts }

const mmaOp = "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"

func (g *tcGen) emit() {
	c := g.c
	g.x = g.param("x", ptx.U64)
	g.w = g.param("w", ptx.U64)
	g.y = g.param("y", ptx.U64)
	g.rows = g.param("rows", ptx.U32)
	if c.Prefetch == 0 {
		g.guard(c.Guard)
	}
	if g.wk > 1 {
		g.red = g.DeclareShared("red", ptx.F32, g.wc*8*g.parts*g.tiles*tcRedStride)
	}
	tid := g.special(ptx.TidX)
	lane := g.op3("and.b32", ptx.U32, tid, ptx.Imm(31))
	warp := g.op3("shr.u32", ptx.U32, tid, ptx.Imm(5))
	g.g = g.op3("shr.u32", ptx.U32, lane, ptx.Imm(2))
	g.t = g.op3("and.b32", ptx.U32, lane, ptx.Imm(3))
	g.wcol = g.op3("rem.u32", ptx.U32, warp, ptx.Imm(int64(g.wc)))
	g.kg = g.op3("div.u32", ptx.U32, warp, ptx.Imm(int64(g.wc)))
	mt := g.Reg(ptx.U32)
	g.Emit("mad.lo.u32", mt, g.special(ptx.CtaidX), ptx.Imm(int64(g.wc)), g.wcol)
	g.colBase = g.op3("shl.b32", ptx.U32, mt, ptx.Imm(4))
	// Warps past the last column (the last block's) do no math but still meet every barrier.
	active := g.cmp("lt", ptx.U32, g.colBase, ptx.Imm(int64(g.units())))
	if c.Prefetch > 0 {
		g.preloadWeights(active)
		g.prefetchWeights(active)
		g.Emit(bundle.PriorGridWait)
		g.guard(c.Guard) // ctl.any_mask is read after the wait, as every other word is
	}
	g.acc = make([][]ptx.Reg, g.parts*g.tiles) // [part*tiles + row tile]
	for rt := range g.acc {
		g.acc[rt] = g.Regs(ptx.F32, 4)
	}

	r0 := g.imm32(0)
	top, done := g.NewLabel("row_group"), g.NewLabel("rows_done")
	g.Label(top)
	g.EmitIf(g.cmp("ge", ptx.U32, r0, g.rows), false, "bra", ptx.Sym(done))
	left := g.op3("sub.u32", ptx.U32, g.rows, r0)
	ntiles := g.op3("add.u32", ptx.U32, left, ptx.Imm(7))
	g.Emit("shr.u32", ntiles, ntiles, ptx.Imm(3))
	skip, valid := make([]ptx.Reg, g.tiles), make([]ptx.Reg, g.tiles)
	for rt := range skip {
		skip[rt] = g.cmp("le", ptx.U32, ntiles, ptx.Imm(int64(rt)))
		r := g.op3("add.u32", ptx.U32, g.g, ptx.Imm(int64(8*rt)))
		valid[rt] = g.cmp("lt", ptx.U32, r, left)
	}
	g.when(active, false, func() { g.mainLoop(r0, skip, valid) })
	g.reduce(r0, left, skip, active)
	g.Emit("add.u32", r0, r0, ptx.Imm(int64(8*g.tiles)))
	g.Emit("bra", ptx.Sym(top))
	g.Label(done)
}

// mainLoop accumulates this warp's tile over its K group's chunks for the row group at r0.
func (g *tcGen) mainLoop(r0 ptx.Reg, skip, valid []ptx.Reg) {
	c := g.c
	for _, a := range g.acc {
		for _, r := range a {
			g.Emit("mov.f32", r, ptx.F32Imm(0))
		}
	}
	// wbase: W[colBase+g][0], xbase: x[r0+g][0], each per lane.
	wrow := g.op3("add.u32", ptx.U32, g.colBase, g.g)
	wbase := g.byteAddr(g.w, wrow, 2*c.K)
	xrow := g.op3("add.u32", ptx.U32, r0, g.g)
	xbase := g.byteAddr(g.x, xrow, 4*c.K)
	chunks := c.K / 32
	if chunks > 0 {
		off := g.op3("shl.b32", ptx.U32, g.t, ptx.Imm(3)) // 8t
		wl := g.byteAddr(wbase, off, 2)
		xl := g.byteAddr(xbase, off, 4)
		g.stepLoop(wl, xl, chunks, skip, valid)
	}
	if c.K%32 != 0 {
		// The 16-wide tail goes to the K group next in the interleave.
		g.when(g.cmp("eq", ptx.U32, g.kg, ptx.Imm(int64(chunks%g.wk))), false, func() {
			off := g.op3("shl.b32", ptx.U32, g.t, ptx.Imm(2)) // 4t
			k0 := g.op3("add.u32", ptx.U32, off, ptx.Imm(int64(32*chunks)))
			wv := g.Regs(ptx.B32, 4*g.parts)
			g.loadW(wv, ptx.Reg{}, g.byteAddr(wbase, k0, 2), ptx.Reg{}, 2)
			g.multiply([]tcChunk{{w: wv, xa: g.byteAddr(xbase, k0, 4)}}, 2, skip, valid)
		})
	}
}

// stepLoop is mainLoop's K loop in steps of U chunks: the W of the next step's chunks loads
// while this step's are multiplied.
func (g *tcGen) stepLoop(wl, xl ptx.Reg, chunks int, skip, valid []ptx.Reg) {
	u, step, cw := g.unroll, g.wk*g.unroll, g.chunkWords()
	// at is the step at chunk ch, its W in wv; load issues its W loads. A step's chunk
	// indices and x addresses are recomputed where they are used rather than carried from
	// the load a step earlier: carried, they cost 13 registers at 8 rows (139-141), which
	// leaves one block per SM instead of two.
	at := func(wv []ptx.Reg, ch ptx.Reg) []tcChunk {
		cs := make([]tcChunk, u)
		for i := range cs {
			ci := g.op3("add.u32", ptx.U32, ch, ptx.Imm(int64(i*g.wk)))
			cs[i] = tcChunk{w: wv[cw*i : cw*(i+1)], ch: ci, ok: g.cmp("lt", ptx.U32, ci, ptx.Imm(int64(chunks)))}
		}
		return cs
	}
	load := func(cs []tcChunk) {
		for _, ch := range cs {
			g.loadW(ch.w, ch.ok, wl, ch.ch, 4)
		}
	}
	cur, nxt := g.firstLoads(wl, chunks), g.Regs(ptx.B32, cw*u)
	ch := g.Reg(ptx.U32)
	g.forLoop(ch, g.kg, ptx.Imm(int64(chunks)), ptx.Imm(int64(step)), func() {
		load(at(nxt, g.op3("add.u32", ptx.U32, ch, ptx.Imm(int64(step)))))
		cs := at(cur, ch)
		for i := range cs {
			cs[i].xa = g.byteAddr(xl, cs[i].ch, 128)
		}
		g.multiply(cs, 4, skip, valid)
		for i := range cur {
			g.Emit("mov.b32", cur[i], nxt[i])
		}
	})
}

// loadW loads this lane's W words of one chunk into wv: nw words (4 for a 32-wide chunk, 2
// for the 16-wide tail) of row g, then nw of row g+8, for each part (the gated kernel's up
// tile after its gate tile). With a guard p (a zero Reg means none), it loads only where p
// holds; chunk ch (a zero Reg means base is already the chunk's address) is 64 bytes past
// base per step.
func (g *tcGen) loadW(wv []ptx.Reg, p, base, ch ptx.Reg, nw int) {
	a := base
	if ch != (ptx.Reg{}) {
		a = g.byteAddr(base, ch, 64)
	}
	ld := fmt.Sprintf("ld.global.nc.v%d.b32", nw)
	for part := range g.parts {
		for i, off := range []int64{0, int64(8 * 2 * g.c.K)} {
			off += g.partOffset(part)
			dst := ptx.Vec(wv[(2*part+i)*nw : (2*part+i+1)*nw])
			if p != (ptx.Reg{}) {
				g.EmitIf(p, false, ld, dst, ptx.Addr{Base: a, Offset: off})
			} else {
				g.Emit(ld, dst, ptx.Addr{Base: a, Offset: off})
			}
		}
	}
}

// partOffset is how many bytes of W lie between a row of the warp's first tile and the same
// row of its tile part.
func (g *tcGen) partOffset(part int) int64 { return int64(part) * int64(g.units()) * int64(2*g.c.K) }

// preloadWeights loads the W of this warp's first step (its K group's first U chunks, as
// mainLoop's first loads would) into pre before the kernel waits for the grid ahead: W never
// changes, and a block launched early then holds its first W when the wait ends. The first
// row group's first step uses it; every later load is mainLoop's own, so the bits are the
// same. Warps past N load nothing.
func (g *tcGen) preloadWeights(active ptx.Reg) {
	chunks := g.c.K / 32
	if chunks == 0 {
		return
	}
	g.pre = g.Regs(ptx.B32, g.chunkWords()*g.unroll)
	g.fresh = g.Reg(ptx.Pred)
	g.Emit("mov.pred", g.fresh, active)
	wrow := g.op3("add.u32", ptx.U32, g.colBase, g.g)
	wl := g.byteAddr(g.byteAddr(g.w, wrow, 2*g.c.K), g.op3("shl.b32", ptx.U32, g.t, ptx.Imm(3)), 2)
	g.loadFirst(g.pre, wl, chunks, func(ok ptx.Reg) ptx.Reg {
		g.Emit("and.pred", ok, ok, active)
		return ok
	})
}

// firstLoads loads the K group's first U chunks for mainLoop's K loop and returns their W
// registers: pre, where the first row group finds them loaded already (fresh).
func (g *tcGen) firstLoads(wl ptx.Reg, chunks int) []ptx.Reg {
	if g.pre == nil {
		w := g.Regs(ptx.B32, g.chunkWords()*g.unroll)
		g.loadFirst(w, wl, chunks, func(ok ptx.Reg) ptx.Reg { return ok })
		return w
	}
	g.loadFirst(g.pre, wl, chunks, g.unlessFresh)
	g.Emit("mov.pred", g.fresh, ptx.Imm(0))
	return g.pre
}

// loadFirst loads chunks kg, kg+Wk, ... (U of them) of this lane's W rows into w,
// chunkWords each (loadW), where on(ok) holds; ok says the chunk is inside K.
func (g *tcGen) loadFirst(w []ptx.Reg, wl ptx.Reg, chunks int, on func(ok ptx.Reg) ptx.Reg) {
	cw := g.chunkWords()
	for i := range g.unroll {
		ci := g.op3("add.u32", ptx.U32, g.kg, ptx.Imm(int64(i*g.wk)))
		g.loadW(w[cw*i:cw*(i+1)], on(g.cmp("lt", ptx.U32, ci, ptx.Imm(int64(chunks)))), wl, ci, 4)
	}
}

// unlessFresh is ok and not fresh: a load of mainLoop's first step that the preload has not
// made already.
func (g *tcGen) unlessFresh(ok ptx.Reg) ptx.Reg {
	p := g.Reg(ptx.Pred)
	g.Emit("not.pred", p, g.fresh)
	g.Emit("and.pred", p, p, ok)
	return p
}

// prefetchWeights asks L2 for the first GemmConfig.Prefetch bytes (whole 128-byte lines) of
// each of this warp's 16 W rows that the block's preloads do not load (its K groups' first
// steps: the first Wk*U chunks of 64 bytes), the 4 lanes of a row taking every fourth line,
// before the kernel waits for the grid ahead (as the GEMV does, gemm.go): its first steps' W
// then streams in while the kernels ahead still run.
func (g *tcGen) prefetchWeights(active ptx.Reg) {
	c := g.c
	first := 0
	if g.pre != nil {
		first = (64*g.wk*g.unroll + 127) / 128
	}
	lines := min(c.Prefetch, 2*c.K)/128 - first
	if lines <= 0 {
		return
	}
	wrow := g.op3("add.u32", ptx.U32, g.colBase, g.g)
	a := g.byteAddr(g.byteAddr(g.w, wrow, 2*c.K), g.t, 128)
	for i := 0; 4*i < lines; i++ {
		on := active
		if 4*(i+1) > lines { // the last round's lines are fewer than its lanes
			on = g.cmp("lt", ptx.U32, g.t, ptx.Imm(int64(lines-4*i)))
			g.Emit("and.pred", on, on, active)
		}
		for part := range g.parts {
			for _, row := range []int{0, 8} {
				g.EmitIf(on, false, "prefetch.global.L2", ptx.Addr{Base: a, Offset: g.partOffset(part) + int64(row*2*c.K+128*first+512*i)})
			}
		}
	}
}

// tcChunk is one K chunk of a step: the lane's W words (nw of row g, then nw of row g+8;
// loadW), the chunk's index, its x address in row g of row tile 0, and whether the chunk
// exists (ok; a zero Reg: it always does).
type tcChunk struct {
	w          []ptx.Reg
	ch, xa, ok ptx.Reg
}

// multiply issues the x loads and the mmas of a step's chunks (nw words of W per row each):
// per row tile, every chunk's x loads before the first chunk's mmas.
func (g *tcGen) multiply(cs []tcChunk, nw int, skip, valid []ptx.Reg) {
	c := g.c
	xf := make([][]ptx.Reg, len(cs))
	for i := range xf {
		xf[i] = g.Regs(ptx.F32, 2*nw)
	}
	hi := g.Regs(ptx.B32, nw)
	lo := g.Regs(ptx.B32, nw)
	bits, part := g.Reg(ptx.B32), g.Regs(ptx.F32, 2)
	load := g.Reg(ptx.Pred)
	end := g.NewLabel("tiles_done")
	for rt := range g.tiles {
		g.EmitIf(skip[rt], false, "bra", ptx.Sym(end))
		off := int64(rt * 8 * 4 * c.K)
		for i, ch := range cs {
			p := valid[rt]
			if ch.ok != (ptx.Reg{}) {
				g.Emit("and.pred", load, ch.ok, valid[rt])
				p = load
			}
			for q := 0; q < len(xf[i]); q += 4 {
				g.EmitIf(p, false, "ld.global.v4.f32", ptx.Vec(xf[i][q:q+4]), ptx.Addr{Base: ch.xa, Offset: off + int64(4*q)})
			}
		}
		for i, ch := range cs {
			mma := func() {
				// x = hi + lo with hi = bf16(x), lo = bf16(x - hi): two bf16 mmas carry 16 bits
				// of x's mantissa, so the product is within ~1e-5 of f32 math at no bandwidth
				// cost.
				g.splitBF16(hi, lo, xf[i], bits, part)
				for j := range hi {
					g.EmitIf(valid[rt], true, "mov.b32", hi[j], ptx.Imm(0))
					g.EmitIf(valid[rt], true, "mov.b32", lo[j], ptx.Imm(0))
				}
				for part := range g.parts {
					acc := ptx.Vec(g.acc[part*g.tiles+rt])
					pw := ch.w[2*nw*part : 2*nw*(part+1)]
					wv, wv8 := pw[:nw], pw[nw:]
					for m := 0; m < nw; m += 2 {
						a := ptx.Vec{wv[m], wv8[m], wv[m+1], wv8[m+1]}
						g.Emit(mmaOp, acc, a, ptx.Vec{hi[m], hi[m+1]}, acc)
						g.Emit(mmaOp, acc, a, ptx.Vec{lo[m], lo[m+1]}, acc)
					}
				}
			}
			// A chunk past K is skipped whole (its W registers hold no weights); the branch is
			// uniform, since ok depends only on the warp's K group and step.
			if ch.ok == (ptx.Reg{}) {
				mma()
			} else {
				g.when(ch.ok, false, mma)
			}
		}
	}
	g.Label(end)
}

// splitBF16 splits the f32 pairs (x[2j], x[2j+1]) into hi[j] = bf16(x) and lo[j] = bf16(x -
// hi), bf16x2 words in memory order (cvt puts its first source in the upper half), so that x =
// hi + lo carries 16 bits of x's mantissa: the split of op gemm_tc (ops/gemm_tc.go). bits (b32)
// and part (two f32) are the caller's scratch registers, reused across calls.
func (e emitter) splitBF16(hi, lo, x []ptx.Reg, bits ptx.Reg, part []ptx.Reg) {
	for j := range hi {
		e.Emit("cvt.rn.bf16x2.f32", hi[j], x[2*j+1], x[2*j])
		e.Emit("shl.b32", bits, hi[j], ptx.Imm(16))
		e.Emit("mov.b32", part[0], bits)
		e.Emit("sub.rn.f32", part[0], x[2*j], part[0])
		e.Emit("and.b32", bits, hi[j], ptx.Imm(-65536))
		e.Emit("mov.b32", part[1], bits)
		e.Emit("sub.rn.f32", part[1], x[2*j+1], part[1])
		e.Emit("cvt.rn.bf16x2.f32", lo[j], part[1], part[0])
	}
}

// reduce combines the K groups' accumulators in a fixed order and stores y for the row group
// at r0 (the gated kernel: act(gate) * up). Accumulator i of row tile rt is D[col g +
// 8*(i>>1)][row 2t + (i&1)].
func (g *tcGen) reduce(r0, left ptx.Reg, skip []ptx.Reg, active ptx.Reg) {
	// ybase: y[r0+2t][colBase+g]; row 2t+j of tile rt is left-relative 8rt+2t+j.
	t2 := g.op3("shl.b32", ptx.U32, g.t, ptx.Imm(1))
	yrow := g.op3("add.u32", ptx.U32, r0, t2)
	ycol := g.op3("add.u32", ptx.U32, g.colBase, g.g)
	yidx := g.Reg(ptx.U32)
	g.Emit("mad.lo.u32", yidx, yrow, ptx.Imm(int64(g.units())), ycol)
	ybase := g.byteAddr(g.y, yidx, 4)
	var sbase ptx.Reg
	if g.wk > 1 {
		// red[wcol][row][col] with row = 8(part*tiles + rt) + 2t + j, col = g + 8h.
		srow := g.Reg(ptx.U32)
		g.Emit("mad.lo.u32", srow, g.wcol, ptx.Imm(int64(8*g.parts*g.tiles)), t2)
		sidx := g.Reg(ptx.U32)
		g.Emit("mad.lo.u32", sidx, srow, ptx.Imm(tcRedStride), g.g)
		sbase = g.sharedAddr(g.red, sidx, 4)
	}
	tmp := g.Reg(ptx.F32)
	for s := range g.wk {
		if s > 0 {
			g.Emit("bar.sync", ptx.Imm(0))
		}
		mine := g.cmp("eq", ptx.U32, g.kg, ptx.Imm(int64(s)))
		g.Emit("and.pred", mine, mine, active)
		g.when(mine, false, func() {
			end := g.NewLabel("reduce_done")
			for rt := range g.tiles {
				g.EmitIf(skip[rt], false, "bra", ptx.Sym(end))
				for i := range 4 {
					j, h := i&1, i>>1
					sums := make([]ptx.Reg, g.parts)
					for part := range sums {
						pt := part*g.tiles + rt
						a := g.acc[pt][i]
						sa := ptx.Addr{Base: sbase, Offset: int64(4 * ((8*pt+j)*tcRedStride + 8*h))}
						if s > 0 {
							g.Emit("ld.shared.f32", tmp, sa)
							g.Emit("add.f32", a, tmp, a)
						}
						if s < g.wk-1 {
							g.Emit("st.shared.f32", sa, a)
						}
						sums[part] = a
					}
					if s < g.wk-1 {
						continue
					}
					v := sums[0]
					if g.parts == 2 {
						v = gateAct(g.emitter, g.act, sums[0], sums[1])
					}
					r := g.op3("add.u32", ptx.U32, t2, ptx.Imm(int64(8*rt+j)))
					g.EmitIf(g.cmp("lt", ptx.U32, r, left), false, "st.global.f32",
						ptx.Addr{Base: ybase, Offset: int64(4 * ((8*rt+j)*g.units() + 8*h))}, v)
				}
			}
			g.Label(end)
		})
	}
	if g.wk > 1 {
		// The next row group's first stores must not overtake this one's last reads.
		g.Emit("bar.sync", ptx.Imm(0))
	}
}
