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
// than 128 rows loop over groups of 128 and stream W again per group (correct, not fast).
//
// Bytes moved per call (rows <= 128): W is read from HBM exactly once, N*K*2 bytes, and y is
// written once, rows*N*4. Every block reads x for its columns' whole K range, so L2 serves
// (N/(16*tcWc)) * rows*K*4 bytes of x (a block's column warps share it through L1): at
// N = 4096 (tcWc = 1) that equals W's bytes at rows = 8 and is 16x them at rows = 128. L1
// serves each warp rows*128 bytes of x per KiB of W it streams. The next chunk's W is
// prefetched into registers while the current one is multiplied (64 bytes per lane in
// flight). What to measure first: achieved HBM bandwidth per row count; if x traffic
// dominates at large rows, stage x once per block as bf16 in shared memory and widen blocks.
const (
	tcWarps     = 8
	tcRowTiles  = 16 // row tiles (of 8) a warp accumulates at once: 128 rows
	tcMinBlocks = 132
	tcRedStride = 20 // f32 per row in the reduction buffer: 16 columns + pad against bank conflicts
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
	if c.WDtype != ptx.BF16 {
		return nil, fmt.Errorf("gemm_tc %s: weight dtype %s: tensor-core GEMM needs bf16", name, c.WDtype)
	}
	if c.K <= 0 || c.N <= 0 || c.K%16 != 0 || c.N%16 != 0 {
		return nil, fmt.Errorf("gemm_tc %s: K=%d N=%d must be positive multiples of 16", name, c.K, c.N)
	}
	g := tcGen{emitter: newEmitter(name), c: c, wc: wc, wk: tcWarps / wc}
	g.MaxNTid = 32 * tcWarps
	g.emit()
	return finish(g.Kernel, "gemm_tc", bundle.GemmTCAttrs{K: c.K, N: c.N, Guard: c.Guard})
}

type tcGen struct {
	emitter
	c              GemmConfig
	wc, wk         int
	x, w, y, rows  ptx.Reg
	g, t, kg, wcol ptx.Reg // lane group, lane in group, K group, column warp
	colBase        ptx.Reg // first output column of this warp's tile
	acc            [tcRowTiles][]ptx.Reg
	red            ptx.Sym
}

const mmaOp = "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"

func (g *tcGen) emit() {
	c := g.c
	g.x = g.param("x", ptx.U64)
	g.w = g.param("w", ptx.U64)
	g.y = g.param("y", ptx.U64)
	g.rows = g.param("rows", ptx.U32)
	g.guard(c.Guard)
	if g.wk > 1 {
		g.red = g.DeclareShared("red", ptx.F32, g.wc*8*tcRowTiles*tcRedStride)
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
	// Warps past N (the last block's) do no math but still meet every barrier.
	active := g.cmp("lt", ptx.U32, g.colBase, ptx.Imm(int64(c.N)))
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
	var skip, valid [tcRowTiles]ptx.Reg
	for rt := range skip {
		skip[rt] = g.cmp("le", ptx.U32, ntiles, ptx.Imm(int64(rt)))
		r := g.op3("add.u32", ptx.U32, g.g, ptx.Imm(int64(8*rt)))
		valid[rt] = g.cmp("lt", ptx.U32, r, left)
	}
	g.when(active, false, func() { g.mainLoop(r0, skip, valid) })
	g.reduce(r0, left, skip, active)
	g.Emit("add.u32", r0, r0, ptx.Imm(8*tcRowTiles))
	g.Emit("bra", ptx.Sym(top))
	g.Label(done)
}

// mainLoop accumulates this warp's tile over its K group's chunks for the row group at r0.
func (g *tcGen) mainLoop(r0 ptx.Reg, skip, valid [tcRowTiles]ptx.Reg) {
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
		// Software pipelining: W of chunk ch+Wk loads while chunk ch is multiplied.
		cur, nxt := g.Regs(ptx.B32, 8), g.Regs(ptx.B32, 8)
		g.loadW(cur, g.cmp("lt", ptx.U32, g.kg, ptx.Imm(int64(chunks))), wl, g.kg, 4)
		ch := g.Reg(ptx.U32)
		g.forLoop(ch, g.kg, ptx.Imm(int64(chunks)), ptx.Imm(int64(g.wk)), func() {
			nch := g.op3("add.u32", ptx.U32, ch, ptx.Imm(int64(g.wk)))
			g.loadW(nxt, g.cmp("lt", ptx.U32, nch, ptx.Imm(int64(chunks))), wl, nch, 4)
			g.chunk(cur, g.byteAddr(xl, ch, 128), 4, skip, valid)
			for i := range cur {
				g.Emit("mov.b32", cur[i], nxt[i])
			}
		})
	}
	if c.K%32 != 0 {
		// The 16-wide tail goes to the K group next in the interleave.
		g.when(g.cmp("eq", ptx.U32, g.kg, ptx.Imm(int64(chunks%g.wk))), false, func() {
			off := g.op3("shl.b32", ptx.U32, g.t, ptx.Imm(2)) // 4t
			k0 := g.op3("add.u32", ptx.U32, off, ptx.Imm(int64(32*chunks)))
			wv := g.Regs(ptx.B32, 4)
			g.loadW(wv, ptx.Reg{}, g.byteAddr(wbase, k0, 2), ptx.Reg{}, 2)
			g.chunk(wv, g.byteAddr(xbase, k0, 4), 2, skip, valid)
		})
	}
}

// loadW loads this lane's W words of one chunk into wv: nw words (4 for a 32-wide chunk, 2
// for the 16-wide tail) of row g, then nw of row g+8. With a guard p (a zero Reg means
// none), it loads only where p holds; chunk ch (a zero Reg means base is already the chunk's
// address) is 64 bytes past base per step.
func (g *tcGen) loadW(wv []ptx.Reg, p, base, ch ptx.Reg, nw int) {
	a := base
	if ch != (ptx.Reg{}) {
		a = g.byteAddr(base, ch, 64)
	}
	ld := fmt.Sprintf("ld.global.nc.v%d.b32", nw)
	for i, off := range []int64{0, int64(8 * 2 * g.c.K)} {
		if p != (ptx.Reg{}) {
			g.EmitIf(p, false, ld, ptx.Vec(wv[i*nw:(i+1)*nw]), ptx.Addr{Base: a, Offset: off})
		} else {
			g.Emit(ld, ptx.Vec(wv[i*nw:(i+1)*nw]), ptx.Addr{Base: a, Offset: off})
		}
	}
}

// chunk issues the x loads and the mmas of one K chunk: w holds the lane's nw W words of row
// g then nw of row g+8 (loadW), xa is the lane's x address in row g of row tile 0.
func (g *tcGen) chunk(w []ptx.Reg, xa ptx.Reg, nw int, skip, valid [tcRowTiles]ptx.Reg) {
	c := g.c
	wv, wv8 := w[:nw], w[nw:]
	xf := g.Regs(ptx.F32, 2*nw)
	hi := g.Regs(ptx.B32, nw)
	lo := g.Regs(ptx.B32, nw)
	bits, part := g.Reg(ptx.B32), g.Regs(ptx.F32, 2)
	end := g.NewLabel("tiles_done")
	for rt := range tcRowTiles {
		g.EmitIf(skip[rt], false, "bra", ptx.Sym(end))
		off := int64(rt * 8 * 4 * c.K)
		for q := 0; q < len(xf); q += 4 {
			g.EmitIf(valid[rt], false, "ld.global.v4.f32", ptx.Vec(xf[q:q+4]), ptx.Addr{Base: xa, Offset: off + int64(4*q)})
		}
		// x = hi + lo with hi = bf16(x), lo = bf16(x - hi): two bf16 mmas carry 16 bits of
		// x's mantissa, so the product is within ~1e-5 of f32 math at no bandwidth cost.
		for j := range hi {
			g.Emit("cvt.rn.bf16x2.f32", hi[j], xf[2*j+1], xf[2*j])
			g.Emit("shl.b32", bits, hi[j], ptx.Imm(16))
			g.Emit("mov.b32", part[0], bits)
			g.Emit("sub.rn.f32", part[0], xf[2*j], part[0])
			g.Emit("and.b32", bits, hi[j], ptx.Imm(-65536))
			g.Emit("mov.b32", part[1], bits)
			g.Emit("sub.rn.f32", part[1], xf[2*j+1], part[1])
			g.Emit("cvt.rn.bf16x2.f32", lo[j], part[1], part[0])
			g.EmitIf(valid[rt], true, "mov.b32", hi[j], ptx.Imm(0))
			g.EmitIf(valid[rt], true, "mov.b32", lo[j], ptx.Imm(0))
		}
		acc := ptx.Vec(g.acc[rt])
		for m := 0; m < nw; m += 2 {
			a := ptx.Vec{wv[m], wv8[m], wv[m+1], wv8[m+1]}
			g.Emit(mmaOp, acc, a, ptx.Vec{hi[m], hi[m+1]}, acc)
			g.Emit(mmaOp, acc, a, ptx.Vec{lo[m], lo[m+1]}, acc)
		}
	}
	g.Label(end)
}

// reduce combines the K groups' accumulators in a fixed order and stores y for the row group
// at r0. Accumulator i of row tile rt is D[col g + 8*(i>>1)][row 2t + (i&1)].
func (g *tcGen) reduce(r0, left ptx.Reg, skip [tcRowTiles]ptx.Reg, active ptx.Reg) {
	c := g.c
	// ybase: y[r0+2t][colBase+g]; row 2t+j of tile rt is left-relative 8rt+2t+j.
	t2 := g.op3("shl.b32", ptx.U32, g.t, ptx.Imm(1))
	yrow := g.op3("add.u32", ptx.U32, r0, t2)
	ycol := g.op3("add.u32", ptx.U32, g.colBase, g.g)
	yidx := g.Reg(ptx.U32)
	g.Emit("mad.lo.u32", yidx, yrow, ptx.Imm(int64(c.N)), ycol)
	ybase := g.byteAddr(g.y, yidx, 4)
	var sbase ptx.Reg
	if g.wk > 1 {
		// red[wcol][row][col] with row = 8rt + 2t + j, col = g + 8h.
		srow := g.Reg(ptx.U32)
		g.Emit("mad.lo.u32", srow, g.wcol, ptx.Imm(8*tcRowTiles), t2)
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
			for rt := range tcRowTiles {
				g.EmitIf(skip[rt], false, "bra", ptx.Sym(end))
				for i, a := range g.acc[rt] {
					j, h := i&1, i>>1
					sa := ptx.Addr{Base: sbase, Offset: int64(4 * ((8*rt+j)*tcRedStride + 8*h))}
					if s > 0 {
						g.Emit("ld.shared.f32", tmp, sa)
						g.Emit("add.f32", a, tmp, a)
					}
					if s < g.wk-1 {
						g.Emit("st.shared.f32", sa, a)
						continue
					}
					r := g.op3("add.u32", ptx.U32, t2, ptx.Imm(int64(8*rt+j)))
					g.EmitIf(g.cmp("lt", ptx.U32, r, left), false, "st.global.f32",
						ptx.Addr{Base: ybase, Offset: int64(4 * ((8*rt+j)*c.N + 8*h))}, a)
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
