package codegen

import (
	"fmt"

	"xmix/bundle"
	"xmix/ops"
	"xmix/ptx"
)

// The staged tensor-core GEMM: a second kernel for op "gemm_tc" (y[rows,N] = (hi+lo)(x) .
// w[N,K]^T, the reference in ops/gemm_tc.go) built for decode batches of 8-128 rows, where
// GemmTC re-reads x from L2 once per 16-128 output columns.
//
// Work split. A block owns tsCols = 128 output columns (8 warps, one 16-column mma tile each)
// and one K slice; grid = (ceil(N/128), S). S splits K into slices of whole 64-column stages
// so that the grid has at least tsMinBlocks = 2*132 blocks (two per H200 SM) where K allows.
// Per stage the block's 256 threads load x[rows, 64 columns] once (coalesced 16-byte loads),
// split it into bf16 hi/lo pairs and store them in shared memory; then every warp builds its
// B fragments from there (ld.shared.v4) and multiplies them with W fragments it streams from
// global memory. Fragments and the K permutation are GemmTC's: lane (g, t) holds W elements
// [8t, 8t+8) of rows g and g+8 of each 32-column chunk, and reads x elements [8t, 8t+8) of
// row g of each row tile.
//
// Pipeline. W sits in a ring of D stages of registers (D = ceil(GemmConfig.Unroll/2), the
// tensor-core GEMMs' chunks in flight, two chunks a stage): the slot of stage s reloads with
// stage s+D as soon as it is multiplied, so a warp keeps D*2 KiB of W in flight across the
// barriers; built for early launch (GemmConfig.Prefetch), the ring fills before the kernel
// waits for the grid ahead. The x of stage s+1 loads from global memory into registers
// before stage s multiplies and is stored after it. A kernel built for a bucket
// (GemmConfig.Rows: its row tiles only) has two stage buffers, so one barrier a stage keeps
// stores and reads apart; the kernel for any row count (128 rows a pass, 40 KiB a buffer)
// has one buffer and two barriers a stage. Every accumulator sums its stages in order, hi before lo, so the
// bits depend on none of this (TestGemmTCStagedBucket).
//
// Shared layout. Per staged row, 320 bytes: for chunk c (0, 1) and lane slot t, the 16 bytes
// of hi at 128c + 16t and of lo at 128c + 64 + 16t, then 64 bytes of padding. A 16-byte
// shared load is served eight lanes at a time; lanes (g, t) and (g+1, t) then sit 320 bytes
// = 2.5 bank rows apart, so the eight lanes cover all 32 banks once (no conflicts). 128 rows
// take 40 KiB, under the 48 KiB of static shared memory a launch gets without an attribute;
// a bucket of up to 64 rows takes two buffers of at most 20 KiB.
//
// Split-K reduction (S > 1). Every block writes its partial sums to the workspace in fragment
// order (one 16-byte store per lane and row tile, so a warp writes 512 contiguous bytes),
// fences, and takes a ticket from the counter of its column tile and row group. The block
// that draws ticket S-1 sums the S partials in split order 0..S-1, so y does not depend on
// which block finished last, writes y and resets the counter to zero, so the next launch (a
// replayed graph) finds it clean. With S = 1 (N >= 264*128, the LM head) the block writes y
// directly and ws is not touched (it may be null).
//
// Workspace `ws` (u64, after x, w, y, rows), WorkspaceBytes(rows): GemmConfig.Tickets u32
// ticket counters (rounded up to 16 bytes), counter (r0/8)*T + column tile for the pass at
// row r0 (a pass of any bucket's size starts at a row tile); then S * R8 * N * 4 bytes of
// partials, R8 = rows rounded up to 8. The counters must be zero before the first launch and
// stay zero between launches. Every staged GEMM of a bundle shares one workspace and one
// ticket count (the most any of them needs, StagedTickets at the largest template): with
// counters placed after each GEMM's own partials, as they were until session 12, a GEMM of
// wider N wrote its partials over a narrower one's counters and that GEMM's next call drew
// garbage tickets (found by TestEmulatedBundleMatchesReferenceOps).
//
// Rows. As in GemmTC, up to 16 row tiles (128 rows, 64 f32 accumulators per lane) per pass,
// or a bucket's; more rows loop over passes and stream W again per pass (correct, not fast).
//
// Bytes moved per call, rows r <= 128, T = ceil(N/128) column tiles: W from HBM once, N*K*2;
// x from L2 T*r*K*4 (each block reads its slice once; GemmTC: once per 16-128 columns);
// partials S*r*N*4 written, then read once (L2-resident: at most 18 MiB); y r*N*4.
// Llama-3.1-8B, per layer, in MiB (partials one way):
//
//	GEMM     N x K          S  blocks  W     x(L2) r=8/32/128   partials r=8/32/128
//	qkv      6144 x 4096    6  288     48    6 / 24 / 96        1.1 / 4.5 / 18
//	o        4096 x 4096    8  256     32    4 / 16 / 64        1 / 4 / 16
//	gate_up  28672 x 4096   2  448     224   28 / 112 / 448     1.8 / 7 / 28
//	down     4096 x 14336   9  288     112   14 / 56 / 224      1.1 / 4.5 / 18
//	lm_head  128256 x 4096  1  1002    1002  125 / 501 / 2004   0
//
// GemmTC's x traffic at 128 rows is 384 / 512 / 448 / 1792 MiB for these (7.5x the layer's
// 416 MiB of W); here it is 832 MiB plus 80 MiB of partials (2.2x W). Shared memory then
// carries the x volume instead: every warp reads rows*K*4 bytes of hi/lo per 16 columns,
// rows/8 times its W bytes (16x at 128 rows, ~7 ms per 8B step at ~33 TB/s of shared
// bandwidth), and the hi/lo split doubles the mma work (~4 TFLOP per 8B step at 128 rows).
// Measured (session 2, before buckets and the ring: one stage in flight, two barriers a
// stage): the 8B step at 8 / 32 / 128 rows took 9.88 / 14.75 / 43.0 ms against cuBLASLt's
// 5.02 / 5.68 / 7.85 (testsuite/gpu/RESULTS.md, "GEMM servers side by side"). The bucket
// kernels with the ring (session 12), timed in session 13 (fuse_ab.sh variant staged under
// --gemm ptx): 6.03 / 7.18 / 10.35 ms at 8 / 16 / 32 rows against cuBLASLt's 4.80 / 4.82 /
// 5.10, and the default tensor-core kernel's 4.87 / 6.92 / 11.53. Local ptxas (sm_90): 79-94
// registers at 8-32 rows with the default chunks (two stages in flight, three blocks per SM),
// 102-128 with --tc-chunks 8,6. The LM head's 2 GiB of x at 128 rows (as in GemmTC) wants
// 256-column blocks next.
const (
	tsWarps     = 8
	tsCols      = 16 * tsWarps // output columns per block
	tsStage     = 64           // K columns of x staged per pass
	tsRowBytes  = 320          // shared bytes per staged row: 64 hi+lo pairs (256 B) + 64 B pad
	tsMinBlocks = 2 * targetSMs
)

// tsLayout is the grid decomposition for a K x N weight: tiles column tiles, splits K slices
// of per stages each (the last may be shorter).
type tsLayout struct{ tiles, splits, per int }

func tsLayoutFor(k, n int) tsLayout {
	tiles := (n + tsCols - 1) / tsCols
	stages := (k + tsStage - 1) / tsStage
	s := min(stages, max(1, (tsMinBlocks+tiles-1)/tiles))
	return tsLayoutPer(k, n, (stages+s-1)/s)
}

// tsLayoutPer is the layout with per stages per split.
func tsLayoutPer(k, n, per int) tsLayout {
	stages := (k + tsStage - 1) / tsStage
	return tsLayout{tiles: (n + tsCols - 1) / tsCols, splits: (stages + per - 1) / per, per: per}
}

func (l tsLayout) launch() ops.Launch {
	return ops.Launch{Grid: [3]int{l.tiles, l.splits, 1}, Block: [3]int{32 * tsWarps, 1, 1}}
}

// partialBytes is the workspace's partial sums for a call over rows rows.
func (l tsLayout) partialBytes(rows, n int) int {
	if l.splits == 1 || rows <= 0 {
		return 0
	}
	return l.splits * 8 * ((rows + 7) / 8) * n * 4
}

// tickets is how many ticket counters a call over rows rows draws from.
func (l tsLayout) tickets(rows int) int {
	if l.splits == 1 || rows <= 0 {
		return 0
	}
	return (rows + 7) / 8 * l.tiles
}

// ticketBytes is the workspace's ticket region for tickets counters.
func ticketBytes(tickets int) int { return (4*tickets + 15) / 16 * 16 }

// LaunchTCStaged is the grid of the staged tensor-core GEMM (GemmTCStaged).
func (c GemmConfig) LaunchTCStaged(rows int) ops.Launch {
	return tsLayoutFor(c.K, c.N).launch()
}

// StagedTickets is how many ticket counters GemmTCStaged's calls of up to rows rows draw
// from: GemmConfig.Tickets must be at least this.
func (c GemmConfig) StagedTickets(rows int) int { return tsLayoutFor(c.K, c.N).tickets(rows) }

// StagedPartialBytes is the partial sums GemmTCStaged's calls of up to rows rows write.
func (c GemmConfig) StagedPartialBytes(rows int) int {
	return tsLayoutFor(c.K, c.N).partialBytes(rows, c.N)
}

// WorkspaceBytes is the size of GemmTCStaged's ws buffer for a call over rows rows: its
// Tickets' counters (at least the call's own), then its partials (0: the kernel does not
// use ws).
func (c GemmConfig) WorkspaceBytes(rows int) int {
	l := tsLayoutFor(c.K, c.N)
	if l.splits == 1 || rows <= 0 {
		return 0
	}
	return ticketBytes(max(c.Tickets, l.tickets(rows))) + l.partialBytes(rows, c.N)
}

// GemmTCStaged generates the staged tensor-core GEMM for op "gemm_tc"; parameters: x, w, y
// (u64), rows (u32), ws (u64, c.WorkspaceBytes(rows) bytes, zero before the first launch).
// W must be bf16 and K and N multiples of 16. Launch it with c.LaunchTCStaged(rows).
func GemmTCStaged(name string, c GemmConfig) (*Kernel, error) {
	if c.K <= 0 {
		return nil, fmt.Errorf("gemm_tc_staged %s: K=%d must be positive", name, c.K)
	}
	return gemmTCStaged(name, c, tsLayoutFor(c.K, c.N))
}

func gemmTCStaged(name string, c GemmConfig, l tsLayout) (*Kernel, error) {
	if err := checkTC(c); err != nil {
		return nil, fmt.Errorf("gemm_tc_staged %s: %w", name, err)
	}
	if need := l.tickets(max(1, c.Rows)); l.splits > 1 && c.Tickets < need {
		return nil, fmt.Errorf("gemm_tc_staged %s: %d ticket counters, want at least %d (GemmConfig.StagedTickets of the calls' rows)", name, c.Tickets, need)
	}
	g := tsGen{emitter: newEmitter(name), c: c, l: l, rowTiles: tcRowTiles, depth: max(1, (c.Unroll+1)/2)}
	if c.Rows > 0 {
		g.rowTiles = min(tcRowTiles, (c.Rows+7)/8)
	}
	g.bufs = 1
	if 2*g.bufBytes() <= maxStaticShared {
		g.bufs = 2
	}
	g.MaxNTid = 32 * tsWarps
	g.emit()
	return finish(g.Kernel, "gemm_tc", bundle.GemmTCAttrs{K: c.K, N: c.N, Guard: c.Guard})
}

type tsGen struct {
	emitter
	c                  GemmConfig
	l                  tsLayout
	rowTiles           int // row tiles a pass over W computes
	depth              int // stages of W in flight per lane: the ring's slots
	bufs               int // x stages in shared memory: 2 where they fit (one barrier a stage), else 1
	x, w, y, rows, ws  ptx.Reg
	tid, lane, g, t    ptx.Reg
	colBase, active    ptx.Reg // the warp's first output column; whether it is < N
	st0, st1           ptx.Reg // this block's stage range
	xs, flag           ptx.Sym
	wl, xsl            ptx.Reg // lane's W address (row colBase+g, column 8t); its shared B address
	stRow, stOff, stXa ptx.Reg // staging: first row, shared offset, x address of row 0 column 8j
	stCol              ptx.Reg // staging: column 8j within a stage
	// stIn[pass]: this thread's row of a 32-row staging pass lies inside a stage buffer (the
	// bucket's 8*rowTiles rows), where the pass reaches past it; a zero Reg where it does not.
	stIn  []ptx.Reg
	acc   [][]ptx.Reg
	ring  []ptx.Reg // depth slots of one stage's W (loadW layout, 16 words)
	fresh ptx.Reg   // the ring holds the first stages, loaded before the wait (preload)
}

// bufBytes is the shared memory of one staged x stage.
func (g *tsGen) bufBytes() int { return g.rowTiles * 8 * tsRowBytes }

func (g *tsGen) emit() {
	c := g.c
	g.x = g.param("x", ptx.U64)
	g.w = g.param("w", ptx.U64)
	g.y = g.param("y", ptx.U64)
	g.rows = g.param("rows", ptx.U32)
	g.ws = g.param("ws", ptx.U64)
	if c.Prefetch == 0 {
		g.guard(c.Guard)
	}
	g.xs = g.DeclareShared("xs", ptx.B32, g.bufs*g.bufBytes()/4)
	if g.l.splits > 1 {
		g.flag = g.DeclareShared("ticket", ptx.U32, 1)
	}
	g.tid = g.special(ptx.TidX)
	g.lane = g.op3("and.b32", ptx.U32, g.tid, ptx.Imm(31))
	warp := g.op3("shr.u32", ptx.U32, g.tid, ptx.Imm(5))
	g.g = g.op3("shr.u32", ptx.U32, g.lane, ptx.Imm(2))
	g.t = g.op3("and.b32", ptx.U32, g.lane, ptx.Imm(3))
	ctaX := g.special(ptx.CtaidX)
	g.colBase = g.Reg(ptx.U32)
	g.Emit("mad.lo.u32", g.colBase, ctaX, ptx.Imm(tsCols), g.op3("shl.b32", ptx.U32, warp, ptx.Imm(4)))
	// Warps past N (the last column tile's) stage x and meet every barrier but do no math.
	g.active = g.cmp("lt", ptx.U32, g.colBase, ptx.Imm(int64(c.N)))
	stages := (c.K + tsStage - 1) / tsStage
	g.st0 = g.imm32(0)
	g.st1 = g.imm32(int64(stages))
	if g.l.splits > 1 {
		g.Emit("mul.lo.u32", g.st0, g.special(ptx.CtaidY), ptx.Imm(int64(g.l.per)))
		g.Emit("add.u32", g.st1, g.st0, ptx.Imm(int64(g.l.per)))
		g.Emit("min.u32", g.st1, g.st1, ptx.Imm(int64(stages)))
	}
	// W: row colBase+g, column 8t (+64 bytes per chunk, +128 per stage, +16K for row g+8).
	wrow := g.op3("add.u32", ptx.U32, g.colBase, g.g)
	g.wl = g.byteAddr(g.byteAddr(g.w, wrow, 2*c.K), g.op3("shl.b32", ptx.U32, g.t, ptx.Imm(3)), 2)
	// B fragments: row g of row tile 0, lane slot t.
	sidx := g.Reg(ptx.U32)
	g.Emit("mad.lo.u32", sidx, g.g, ptx.Imm(tsRowBytes/16), g.t)
	g.xsl = g.sharedAddr(g.xs, sidx, 16)
	// Staging: thread tid covers row tid>>3 (+32 per pass) and columns [8j, 8j+8) of the
	// stage, j = tid&7, i.e. chunk j>>2, slot j&3: eight threads read a row's 256 bytes.
	j := g.op3("and.b32", ptx.U32, g.tid, ptx.Imm(7))
	g.stRow = g.op3("shr.u32", ptx.U32, g.tid, ptx.Imm(3))
	g.stCol = g.op3("shl.b32", ptx.U32, j, ptx.Imm(3))
	slot := g.Reg(ptx.U32)
	g.Emit("mad.lo.u32", slot, g.stRow, ptx.Imm(tsRowBytes/16), g.op3("and.b32", ptx.U32, j, ptx.Imm(3)))
	g.Emit("mad.lo.u32", slot, g.op3("shr.u32", ptx.U32, j, ptx.Imm(2)), ptx.Imm(8), slot)
	g.stOff = g.sharedAddr(g.xs, slot, 16)
	g.stXa = g.byteAddr(g.byteAddr(g.x, g.stRow, 4*c.K), g.stCol, 4)
	g.stIn = make([]ptx.Reg, (8*g.rowTiles+31)/32)
	for pass := range g.stIn {
		if 32*(pass+1) > 8*g.rowTiles {
			g.stIn[pass] = g.cmp("lt", ptx.U32, g.stRow, ptx.Imm(int64(8*g.rowTiles-32*pass)))
		}
	}
	g.acc = make([][]ptx.Reg, g.rowTiles)
	for rt := range g.acc {
		g.acc[rt] = g.Regs(ptx.F32, 4)
	}
	g.ring = g.Regs(ptx.B32, 16*g.depth)
	if c.Prefetch > 0 {
		// W never changes: the first stages load before the wait, so a block launched early
		// holds them when the grid ahead ends; the first row group's ring fill skips them.
		g.fresh = g.Reg(ptx.Pred)
		g.Emit("mov.pred", g.fresh, ptx.Imm(0))
		g.fillRing()
		g.Emit("mov.pred", g.fresh, ptx.Imm(1))
		g.Emit(bundle.PriorGridWait)
		g.guard(c.Guard) // ctl.any_mask is read after the wait, as every other word is
	}

	r0 := g.imm32(0)
	top, done := g.NewLabel("row_group"), g.NewLabel("rows_done")
	g.Label(top)
	g.EmitIf(g.cmp("ge", ptx.U32, r0, g.rows), false, "bra", ptx.Sym(done))
	left := g.op3("sub.u32", ptx.U32, g.rows, r0)
	ntiles := g.op3("add.u32", ptx.U32, left, ptx.Imm(7))
	g.Emit("shr.u32", ntiles, ntiles, ptx.Imm(3))
	skip := make([]ptx.Reg, g.rowTiles)
	for rt := range skip {
		skip[rt] = g.cmp("le", ptx.U32, ntiles, ptx.Imm(int64(rt)))
	}
	g.mainLoop(r0, left, skip)
	if g.l.splits == 1 {
		g.when(g.active, false, func() { g.storeY(r0, left, skip) })
	} else {
		g.combine(r0, left, skip)
	}
	g.Emit("add.u32", r0, r0, ptx.Imm(int64(8*g.rowTiles)))
	g.Emit("bra", ptx.Sym(top))
	g.Label(done)
}

// fillRing loads the W of the block's first depth stages into the ring, skipping the loads
// the preload made (fresh).
func (g *tsGen) fillRing() {
	for i := range g.depth {
		g.loadW(g.ring[16*i:16*i+16], g.op3("add.u32", ptx.U32, g.st0, ptx.Imm(int64(i))))
	}
}

// mainLoop accumulates the row group at r0 over this block's K slice, one staged stage at a
// time: the x of stage s+1 loads from global memory while stage s multiplies, and the slot
// of stage s reloads with the W of stage s+depth as soon as it is multiplied.
func (g *tsGen) mainLoop(r0, left ptx.Reg, skip []ptx.Reg) {
	for _, a := range g.acc {
		for _, r := range a {
			g.Emit("mov.f32", r, ptx.F32Imm(0))
		}
	}
	// x row r0 of this thread's staging column.
	xa := g.Reg(ptx.U64)
	off := g.Reg(ptx.U64)
	g.Emit("mul.wide.u32", off, r0, ptx.Imm(int64(4*g.c.K)))
	g.Emit("add.u64", xa, g.stXa, off)
	g.fillRing()
	if g.fresh != (ptx.Reg{}) {
		g.Emit("mov.pred", g.fresh, ptx.Imm(0))
	}
	g.storeX(g.loadX(xa, g.st0, left, ptx.Reg{}), g.imm32(0), left)
	g.Emit("bar.sync", ptx.Imm(0))
	st := g.Reg(ptx.U32)
	g.forLoop(st, g.st0, g.st1, ptx.Imm(int64(g.depth)), func() {
		for i := range g.depth {
			s := g.op3("add.u32", ptx.U32, st, ptx.Imm(int64(i)))
			// Uniform over the block, so the barriers inside are met by every thread.
			g.when(g.cmp("lt", ptx.U32, s, g.st1), false, func() {
				next := g.op3("add.u32", ptx.U32, s, ptx.Imm(1))
				more := g.cmp("lt", ptx.U32, next, g.st1)
				cur, nxt := g.imm32(0), g.imm32(0)
				if g.bufs == 2 {
					// Stage s sits in buffer (s-st0)&1, the next one goes to the other.
					g.Emit("sub.u32", cur, s, g.st0)
					g.Emit("and.b32", cur, cur, ptx.Imm(1))
					g.Emit("xor.b32", nxt, cur, ptx.Imm(1))
					g.Emit("mul.lo.u32", cur, cur, ptx.Imm(int64(g.bufBytes())))
					g.Emit("mul.lo.u32", nxt, nxt, ptx.Imm(int64(g.bufBytes())))
				}
				xv := g.loadX(xa, next, left, more)
				slot := g.ring[16*i : 16*i+16]
				g.when(g.active, false, func() { g.multiply(slot, cur, skip) })
				g.loadW(slot, g.op3("add.u32", ptx.U32, s, ptx.Imm(int64(g.depth))))
				if g.bufs == 1 {
					// One buffer: every warp must be done reading stage s before it is overwritten.
					g.Emit("bar.sync", ptx.Imm(0))
				}
				g.when(more, false, func() { g.storeX(xv, nxt, left) })
				g.Emit("bar.sync", ptx.Imm(0))
			})
		}
	})
}

// loadW loads this lane's W words of stage st into wv where the warp is active, st is in the
// block's slice and the preload has not loaded them (fresh); words of columns past K (a
// K % 64 tail) are zero, so that they add nothing against the zeros staged for x there.
func (g *tsGen) loadW(wv []ptx.Reg, st ptx.Reg) {
	c := g.c
	p := g.cmp("lt", ptx.U32, st, g.st1)
	g.Emit("and.pred", p, p, g.active)
	load := p
	if g.fresh != (ptx.Reg{}) {
		load = g.Reg(ptx.Pred)
		g.Emit("not.pred", load, g.fresh)
		g.Emit("and.pred", load, load, p)
	}
	a := g.byteAddr(g.wl, st, 2*tsStage)
	var k0 ptx.Reg
	if c.K%tsStage != 0 {
		k0 = g.Reg(ptx.U32)
		g.Emit("mad.lo.u32", k0, st, ptx.Imm(tsStage), g.op3("shl.b32", ptx.U32, g.t, ptx.Imm(3)))
	}
	for ch := range 2 {
		q := load
		if c.K%tsStage != 0 {
			in := g.cmp("lt", ptx.U32, g.op3("add.u32", ptx.U32, k0, ptx.Imm(int64(32*ch))), ptx.Imm(int64(c.K)))
			for _, r := range wv[8*ch : 8*ch+8] {
				g.EmitIf(in, true, "mov.b32", r, ptx.Imm(0))
			}
			q = g.Reg(ptx.Pred)
			g.Emit("and.pred", q, in, load)
		}
		for h := range 2 {
			g.EmitIf(q, false, "ld.global.nc.v4.b32", ptx.Vec(wv[8*ch+4*h:8*ch+4*h+4]),
				ptx.Addr{Base: a, Offset: int64(64*ch + 8*2*c.K*h)})
		}
	}
}

// loadX loads this thread's x of stage st for the row group whose row r0 is at xa: 8 f32 per
// 32-row pass, zero for rows past left, columns past K and, where more is given and fails, a
// stage past the slice.
func (g *tsGen) loadX(xa, st, left, more ptx.Reg) [][]ptx.Reg {
	c := g.c
	col := g.Reg(ptx.U32)
	g.Emit("mad.lo.u32", col, st, ptx.Imm(tsStage), g.stCol)
	colOK := g.cmp("lt", ptx.U32, col, ptx.Imm(int64(c.K)))
	if more != (ptx.Reg{}) {
		g.Emit("and.pred", colOK, colOK, more)
	}
	a := g.byteAddr(xa, st, 4*tsStage)
	xv := make([][]ptx.Reg, len(g.stIn))
	for pass := range xv {
		xv[pass] = g.Regs(ptx.F32, 8)
		row := g.op3("add.u32", ptx.U32, g.stRow, ptx.Imm(int64(32*pass)))
		ok := g.cmp("lt", ptx.U32, row, left)
		g.Emit("and.pred", ok, ok, colOK)
		if in := g.stIn[pass]; in != (ptx.Reg{}) {
			g.Emit("and.pred", ok, ok, in)
		}
		for _, r := range xv[pass] {
			g.Emit("mov.f32", r, ptx.F32Imm(0))
		}
		for q := 0; q < 8; q += 4 {
			g.EmitIf(ok, false, "ld.global.v4.f32", ptx.Vec(xv[pass][q:q+4]),
				ptx.Addr{Base: a, Offset: int64(32*pass*4*c.K + 4*q)})
		}
	}
	return xv
}

// storeX writes x loaded by loadX into the stage buffer at byte offset buf of xs as bf16
// hi/lo pairs; 32-row passes wholly past left are skipped (no row tile reads them).
func (g *tsGen) storeX(xv [][]ptx.Reg, buf, left ptx.Reg) {
	hi, lo := g.Regs(ptx.B32, 4), g.Regs(ptx.B32, 4)
	bits, part := g.Reg(ptx.B32), g.Regs(ptx.F32, 2)
	at := g.op3("add.u32", ptx.U32, g.stOff, buf)
	end := g.NewLabel("staged")
	for pass, x := range xv {
		g.EmitIf(g.cmp("le", ptx.U32, left, ptx.Imm(int64(32*pass))), false, "bra", ptx.Sym(end))
		// hi = bf16(x), lo = bf16(x - hi), as GemmTC and the reference split.
		g.splitBF16(hi, lo, x, bits, part)
		so := int64(32 * pass * tsRowBytes)
		in := g.stIn[pass]
		for _, h := range []struct {
			off int64
			v   []ptx.Reg
		}{{so, hi}, {so + 64, lo}} {
			if in == (ptx.Reg{}) {
				g.Emit("st.shared.v4.b32", ptx.Addr{Base: at, Offset: h.off}, ptx.Vec(h.v))
			} else {
				g.EmitIf(in, false, "st.shared.v4.b32", ptx.Addr{Base: at, Offset: h.off}, ptx.Vec(h.v))
			}
		}
	}
	g.Label(end)
}

// multiply runs the mmas of one staged stage from the buffer at byte offset buf: w is the
// lane's W (loadW layout).
func (g *tsGen) multiply(w []ptx.Reg, buf ptx.Reg, skip []ptx.Reg) {
	hi, lo := g.Regs(ptx.B32, 4), g.Regs(ptx.B32, 4)
	at := g.op3("add.u32", ptx.U32, g.xsl, buf)
	end := g.NewLabel("tiles_done")
	for rt := range g.rowTiles {
		g.EmitIf(skip[rt], false, "bra", ptx.Sym(end))
		acc := ptx.Vec(g.acc[rt])
		for ch := range 2 {
			so := int64(8*rt*tsRowBytes + 128*ch)
			g.Emit("ld.shared.v4.b32", ptx.Vec(hi), ptx.Addr{Base: at, Offset: so})
			g.Emit("ld.shared.v4.b32", ptx.Vec(lo), ptx.Addr{Base: at, Offset: so + 64})
			wv, wv8 := w[8*ch:8*ch+4], w[8*ch+4:8*ch+8]
			for m := 0; m < 4; m += 2 {
				a := ptx.Vec{wv[m], wv8[m], wv[m+1], wv8[m+1]}
				g.Emit(mmaOp, acc, a, ptx.Vec{hi[m], hi[m+1]}, acc)
				g.Emit(mmaOp, acc, a, ptx.Vec{lo[m], lo[m+1]}, acc)
			}
		}
	}
	g.Label(end)
}

// storeY writes the accumulators of the row group at r0 to y. Accumulator i of row tile rt
// is D[column g + 8*(i>>1)][row 2t + (i&1)].
func (g *tsGen) storeY(r0, left ptx.Reg, skip []ptx.Reg) {
	c := g.c
	t2 := g.op3("shl.b32", ptx.U32, g.t, ptx.Imm(1))
	yidx := g.Reg(ptx.U32)
	g.Emit("mad.lo.u32", yidx, g.op3("add.u32", ptx.U32, r0, t2), ptx.Imm(int64(c.N)),
		g.op3("add.u32", ptx.U32, g.colBase, g.g))
	ybase := g.byteAddr(g.y, yidx, 4)
	end := g.NewLabel("stored")
	for rt := range g.rowTiles {
		g.EmitIf(skip[rt], false, "bra", ptx.Sym(end))
		for i, a := range g.acc[rt] {
			r := int64(8*rt + i&1)
			ok := g.cmp("lt", ptx.U32, g.op3("add.u32", ptx.U32, t2, ptx.Imm(r)), left)
			g.EmitIf(ok, false, "st.global.f32", ptx.Addr{Base: ybase, Offset: 4 * (r*int64(c.N) + int64(8*(i>>1)))}, a)
		}
	}
	g.Label(end)
}

// combine publishes this block's partial sums of the row group at r0 and, in the block that
// completes the column tile, sums all splits' partials in split order and writes y.
func (g *tsGen) combine(r0, left ptx.Reg, skip []ptx.Reg) {
	c := g.c
	// Partials: ws[s][row tile][column tile of 16][lane][4] f32; a (split, row tile) plane
	// holds 8 rows of all N columns, N*32 bytes. rtiles = ceil(rows/8) row tiles per split.
	rtiles := g.op3("add.u32", ptx.U32, g.rows, ptx.Imm(7))
	g.Emit("shr.u32", rtiles, rtiles, ptx.Imm(3))
	tile := g.op3("shr.u32", ptx.U32, r0, ptx.Imm(3))
	g.Emit("mad.lo.u32", tile, g.special(ptx.CtaidY), rtiles, tile)
	idx := g.Reg(ptx.U32)
	g.Emit("mad.lo.u32", idx, tile, ptx.Imm(int64(c.N/16)), g.op3("shr.u32", ptx.U32, g.colBase, ptx.Imm(4)))
	g.Emit("mad.lo.u32", idx, idx, ptx.Imm(32), g.lane)
	partials := g.Reg(ptx.U64)
	g.Emit("add.u64", partials, g.ws, ptx.Imm(int64(ticketBytes(c.Tickets))))
	mine := g.byteAddr(partials, idx, 16)
	plane := int64(32 * c.N)
	g.when(g.active, false, func() {
		end := g.NewLabel("published")
		for rt := range g.rowTiles {
			g.EmitIf(skip[rt], false, "bra", ptx.Sym(end))
			g.Emit("st.global.v4.f32", ptx.Addr{Base: mine, Offset: int64(rt) * plane}, ptx.Vec(g.acc[rt]))
		}
		g.Label(end)
	})
	// The ticket counter of this pass and column tile: one per row tile x column tile at the
	// head of ws (a pass of any bucket's size starts at a row tile: r0/8 names it).
	ctrIdx := g.op3("shr.u32", ptx.U32, r0, ptx.Imm(3))
	g.Emit("mad.lo.u32", ctrIdx, ctrIdx, ptx.Imm(int64(g.l.tiles)), g.special(ptx.CtaidX))
	ctr := g.byteAddr(g.ws, ctrIdx, 4)
	ticket, first := g.drawTicket(ctr, g.flag, g.tid)
	last := g.cmp("eq", ptx.U32, ticket, ptx.Imm(int64(g.l.splits-1)))
	g.when(last, false, func() {
		g.when(g.active, false, func() {
			// Split 0's partial of this lane: mine less this block's split planes.
			step := g.Reg(ptx.U64)
			g.Emit("mul.wide.u32", step, rtiles, ptx.Imm(plane))
			back := g.Reg(ptx.U64)
			g.Emit("mul.wide.u32", back, g.special(ptx.CtaidY), rtiles)
			g.Emit("mul.lo.u64", back, back, ptx.Imm(plane))
			pa := g.Reg(ptx.U64)
			g.Emit("sub.u64", pa, mine, back)
			for _, a := range g.acc {
				for _, r := range a {
					g.Emit("mov.f32", r, ptx.F32Imm(0))
				}
			}
			part := g.Regs(ptx.F32, 4)
			s := g.Reg(ptx.U32)
			g.forLoop(s, ptx.Imm(0), ptx.Imm(int64(g.l.splits)), ptx.Imm(1), func() {
				end := g.NewLabel("summed")
				for rt := range g.rowTiles {
					g.EmitIf(skip[rt], false, "bra", ptx.Sym(end))
					// .cg: other SMs wrote these; L1 is not coherent.
					g.Emit("ld.global.cg.v4.f32", ptx.Vec(part), ptx.Addr{Base: pa, Offset: int64(rt) * plane})
					for i, r := range g.acc[rt] {
						g.Emit("add.f32", r, r, part[i])
					}
				}
				g.Label(end)
				g.Emit("add.u64", pa, pa, step)
			})
			g.storeY(r0, left, skip)
		})
		g.when(first, false, func() { g.Emit("st.global.u32", ptx.Addr{Base: ctr}, ptx.Imm(0)) })
	})
}
