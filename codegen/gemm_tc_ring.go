package codegen

import (
	"fmt"

	"xmix/ptx"
)

// The tensor-core GEMM's weight ring (GemmConfig.Ring = D > 0): W reaches the mma fragments
// through shared memory instead of straight from global memory.
//
// Why. In the register pipeline (stepLoop) a warp has one step of W in flight, U KiB, and
// the registers that hold it bound how many warps fit an SM: at 8 rows the kernel streams W
// 10-29% slower than the one-row GEMV (session 21, Nsight Compute), and more chunks a step
// cost a block per SM. cp.async copies a lane's 16-byte pieces into shared memory without
// registers, so a warp keeps D-1 steps in flight while it multiplies the oldest.
//
// Blocks. A warp's ring is D*U KiB and a block's static shared memory 48 KiB, so a block
// takes as many warps (8, 4, 2 or 1) as their rings fit (GemmConfig.tcBlockWarps), and the
// grid as many more blocks as keep the warps of 132 blocks of 8 where N has the column tiles
// (tcColumnWarps): 3 steps of 4 chunks give blocks of 4 warps and 8 KiB of W in flight a warp.
//
// Measured (H200, session 23, rings in blocks of 8 warps only): 3 steps of 2 chunks, 6 and 4
// of 1, made the 8-row step 6-55% longer than W in registers (4 chunks a step), the more the
// fewer chunks a step: those rings kept 3-5 KiB in flight a warp, against the registers' 4,
// and every step still waits for its x (L2) after its wait and shared loads. Deeper rings of
// 4-chunk steps in smaller blocks, and x through the ring, are not measured yet. For
// measuring only (--tc-ring, --tc-ring-x).
//
// Layout. Every lane copies exactly the bytes it later reads (its W words of rows g and g+8
// of each chunk, as loadW loads them), so no other thread's copies need waiting for:
// cp.async.wait_group alone orders a lane's copies before its own ld.shared, and no barrier
// is needed. Warp w's ring is D slots of one step each; in a slot, chunk i's row-g pieces of
// the 32 lanes sit at 512*P*i + 16*lane (P = 2 pieces a chunk, 4 with x) and its row-(g+8)
// pieces 512 bytes on, so a warp's 16-byte shared loads are contiguous (conflict-free).
//
// Pipeline. Steps 0..D-2 are copied first, one commit group each (before the wait for the
// grid ahead when the kernel is built for early launch: W never changes). Step j then copies
// step j+D-1 into the slot step j-1 used, commits it, waits until at most D-1 groups are
// pending (so step j's have landed), loads its W from its slot and multiplies it as stepLoop
// does. Chunks past K copy nothing (their groups are empty), and every chunk is summed in
// the same order as in the register pipeline, so the bits are those of the register
// pipeline with as many K groups (TestGemmTCRing): the same in blocks of 8 warps, and in
// smaller blocks wherever N leaves the K groups as they were (Llama-3.1-8B's q/k/v and
// gate/up at 3 steps of 4 chunks; its o and down get 4 K groups instead of 8).
//
// x too (GemmConfig.RingX, buckets of up to 8 rows). A step's x loads (from L2, issued when
// the step starts and used right after) are the other latency each step pays; with RingX each
// chunk's slot also holds the lane's 8 f32 of x (two 16-byte pieces, 512 bytes apart), copied
// with the chunk's W, so a step waits for nothing issued within it. x is the grid ahead's
// output, so a kernel launched early copies the first steps' x after its wait, a group a step
// after the W's groups (still older than any step's wait leaves pending). A warp's ring then
// takes 2 KiB per step and chunk.
//
// The K groups' reduction reuses the ring's shared memory after a barrier.

// MaxTCRing bounds GemmConfig.Ring, the steps of a tensor-core GEMM's weight ring.
const MaxTCRing = 8

// ringWarpBytes is the shared memory of one warp's ring of ring steps of unroll chunks: two
// 16-byte pieces of W (rows g and g+8) for each of 32 lanes a chunk, two of x more with x.
func ringWarpBytes(ring, unroll int, x bool) int {
	return ring * max(1, unroll) * ringPieces(x) * 512
}

// ringPieces is the 512-byte pieces (16 bytes for each of 32 lanes) of a chunk in a ring.
func ringPieces(x bool) int {
	if x {
		return 4
	}
	return 2
}

// ringStepBytes is the shared memory of one slot of a warp's ring: the step's U chunks.
func (g *tcGen) ringStepBytes() int { return ringWarpBytes(1, g.unroll, g.ringX) }

// ringBytes is the shared memory of the block's rings.
func (g *tcGen) ringBytes() int { return g.warps * g.ring * g.ringStepBytes() }

// tcBlockWarps is the warps of a tensor-core GEMM's block: tcWarps, or with a weight ring the
// most of 8, 4, 2 and 1 whose rings fit a block's static shared memory, so that a deeper ring
// takes its memory from fewer warps (the grid then has more blocks, tcColumnWarps).
func (c GemmConfig) tcBlockWarps() int {
	w := tcWarps
	for c.Ring > 0 && w > 1 && w*ringWarpBytes(c.Ring, c.Unroll, c.RingX) > maxStaticShared {
		w /= 2
	}
	return w
}

// checkRing checks the ring's steps, that one warp's ring fits the static shared memory of a
// launch, and that a ring carrying x has one row tile.
func (g *tcGen) checkRing() error {
	switch {
	case g.ring == 0 && g.ringX:
		return fmt.Errorf("x through the weight ring needs a ring (GemmConfig.Ring)")
	case g.ring == 0:
		return nil
	case g.ring < 2 || g.ring > MaxTCRing:
		return fmt.Errorf("weight ring of %d steps: want 2 to %d", g.ring, MaxTCRing)
	case g.ringX && (g.c.Rows < 1 || g.c.Rows > 8):
		return fmt.Errorf("x through the weight ring in a kernel for %d rows: want a bucket of 1 to 8", g.c.Rows)
	}
	if n := g.ringBytes(); n > maxStaticShared {
		return fmt.Errorf("weight ring of %d steps of %d chunks: %d bytes of shared memory a warp, past %d; use fewer steps or chunks", g.ring, g.unroll, n, maxStaticShared)
	}
	return nil
}

// declareRing declares the rings (and the reduction buffer inside them) and sets ringLane,
// this lane's address in slot 0 of its warp's ring.
func (g *tcGen) declareRing(warp, lane ptx.Reg) {
	words := g.ringBytes() / 4
	if g.wk > 1 {
		words = max(words, g.wc*8*g.tiles*tcRedStride)
	}
	ring := g.DeclareShared("wring", ptx.B32, words)
	g.red = ring
	idx := g.Reg(ptx.U32)
	g.Emit("mad.lo.u32", idx, warp, ptx.Imm(int64(g.ring*g.ringStepBytes()/16)), lane)
	g.ringLane = g.sharedAddr(ring, idx, 16)
}

// ringCopies says what ringCopy copies of a chunk: its W where w, its x where x holds (a zero
// Reg: none), and nothing of a chunk outside K or where on does not hold (a zero Reg: always).
type ringCopies struct {
	w     bool
	x, on ptx.Reg
}

// ringFill copies the K group's first D-1 steps into slots 0..D-2, one commit group each.
func (g *tcGen) ringFill(wl, xl ptx.Reg, chunks int, what ringCopies) {
	for j := range g.ring - 1 {
		first := g.op3("add.u32", ptx.U32, g.kg, ptx.Imm(int64(j*g.wk*g.unroll)))
		g.ringCopy(wl, xl, first, chunks, g.imm32(int64(j*g.ringStepBytes())), what)
		g.Emit("cp.async.commit_group")
	}
}

// ringCopy copies the step whose first chunk is first into the slot at byte offset slot of
// the lane's ring: each chunk's W pieces of rows g and g+8 (as loadW loads them) and, with x,
// the lane's 8 f32 of x (row g of the row tile, as multiply loads them) 1024 bytes on.
func (g *tcGen) ringCopy(wl, xl, first ptx.Reg, chunks int, slot ptx.Reg, what ringCopies) {
	dst := g.op3("add.u32", ptx.U32, g.ringLane, slot)
	pieces := ringPieces(g.ringX)
	for i := range g.unroll {
		ci := g.op3("add.u32", ptx.U32, first, ptx.Imm(int64(i*g.wk)))
		ok := g.cmp("lt", ptx.U32, ci, ptx.Imm(int64(chunks)))
		if what.on != (ptx.Reg{}) {
			g.Emit("and.pred", ok, ok, what.on)
		}
		at := func(p int) ptx.Addr { return ptx.Addr{Base: dst, Offset: int64((pieces*i + p) * 512)} }
		if what.w {
			src := g.byteAddr(wl, ci, 64)
			for p, off := range []int64{0, int64(8 * 2 * g.c.K)} {
				g.EmitIf(ok, false, "cp.async.cg.shared.global", at(p), ptx.Addr{Base: src, Offset: off}, ptx.Imm(16))
			}
		}
		if what.x != (ptx.Reg{}) {
			xok := g.Reg(ptx.Pred)
			g.Emit("and.pred", xok, ok, what.x)
			src := g.byteAddr(xl, ci, 128)
			for q := range 2 {
				g.EmitIf(xok, false, "cp.async.cg.shared.global", at(2+q), ptx.Addr{Base: src, Offset: int64(16 * q)}, ptx.Imm(16))
			}
		}
	}
}

// ringLoop is mainLoop's K loop with W (and x with GemmConfig.RingX) through the ring,
// stepLoop's counterpart; row says that the lane's row of x exists.
func (g *tcGen) ringLoop(wl, xl ptx.Reg, chunks int, skip, valid []ptx.Reg, row ptx.Reg) {
	step, stepBytes, pieces := g.wk*g.unroll, g.ringStepBytes(), ringPieces(g.ringX)
	all := ringCopies{w: true}
	if g.ringX {
		all.x = row
	}
	if g.primed == (ptx.Reg{}) {
		g.ringFill(wl, xl, chunks, all)
	} else {
		// The first row group finds its first steps' W copied before the wait; their x (written
		// by the grid ahead) is copied now, a group a step after the W's groups. Step j's wait
		// still leaves only the newest D-1 groups pending, and step j's x group is older.
		g.when(g.primed, true, func() { g.ringFill(wl, xl, chunks, all) })
		if g.ringX {
			g.when(g.primed, false, func() { g.ringFill(wl, xl, chunks, ringCopies{x: row}) })
		}
		g.Emit("mov.pred", g.primed, ptx.Imm(0))
	}
	rd, wr := g.imm32(0), g.imm32(int64((g.ring-1)*stepBytes))
	wv := g.Regs(ptx.B32, 8*g.unroll)
	ch := g.Reg(ptx.U32)
	wrap := g.Reg(ptx.Pred)
	g.forLoop(ch, g.kg, ptx.Imm(int64(chunks)), ptx.Imm(int64(step)), func() {
		g.ringCopy(wl, xl, g.op3("add.u32", ptx.U32, ch, ptx.Imm(int64((g.ring-1)*step))), chunks, wr, all)
		g.Emit("cp.async.commit_group")
		g.Emit("cp.async.wait_group", ptx.Imm(int64(g.ring-1)))
		src := g.op3("add.u32", ptx.U32, g.ringLane, rd)
		cs := g.stepChunks(wv, ch, chunks)
		for i := range cs {
			for p := range 2 {
				g.Emit("ld.shared.v4.b32", ptx.Vec(cs[i].w[4*p:4*p+4]), ptx.Addr{Base: src, Offset: int64((pieces*i + p) * 512)})
			}
			if g.ringX {
				cs[i].xs = g.op3("add.u32", ptx.U32, src, ptx.Imm(int64((pieces*i+2)*512)))
			} else {
				cs[i].xa = g.byteAddr(xl, cs[i].ch, 128)
			}
		}
		g.multiply(cs, 4, skip, valid)
		for _, s := range []ptx.Reg{rd, wr} {
			g.Emit("add.u32", s, s, ptx.Imm(int64(stepBytes)))
			g.Emit("setp.ge.u32", wrap, s, ptx.Imm(int64(g.ring*stepBytes)))
			g.EmitIf(wrap, false, "sub.u32", s, s, ptx.Imm(int64(g.ring*stepBytes)))
		}
	})
	// Only empty groups (steps past K) can be pending; the next row group starts clean.
	g.Emit("cp.async.wait_all")
}
