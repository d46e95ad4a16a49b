package emu

import (
	"encoding/binary"
	"strings"
	"testing"

	"xmix/ptx"
)

const (
	bulkOp   = "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes"
	tensorOp = "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
)

// clusterExchange: in clusters of two, thread t of each block writes ctaid*100+t into its
// partner's buf[t] (mapa + st.shared::cluster), both wait at barrier.cluster, then each
// block stores its own buf to out.
func clusterExchange() *ptx.Kernel {
	k := ptx.NewKernel("xchg")
	k.ClusterX = 2
	out := k.Reg(ptx.U64)
	k.Emit("ld.param.u64", out, ptx.Addr{Base: k.Param("out", ptx.U64)})
	buf := k.DeclareShared("buf", ptx.U32, 32)
	r := k.Regs(ptx.U32, 8)
	tid, cta, rank, partner, local, remote, v, idx := r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7]
	k.Emit("mov.u32", tid, ptx.TidX)
	k.Emit("mov.u32", cta, ptx.CtaidX)
	k.Emit("mov.u32", rank, ptx.ClusterCtaRank)
	k.Emit("xor.b32", partner, rank, ptx.Imm(1))
	k.Emit("mov.u32", local, buf)
	k.Emit("mad.lo.u32", local, tid, ptx.Imm(4), local)
	k.Emit("mapa.shared::cluster.u32", remote, local, partner)
	k.Emit("mad.lo.u32", v, cta, ptx.Imm(100), tid)
	k.Emit("st.shared::cluster.u32", ptx.Addr{Base: remote}, v)
	k.Emit("barrier.cluster.arrive.release")
	k.Emit("barrier.cluster.wait.acquire")
	k.Emit("ld.shared::cta.u32", v, ptx.Addr{Base: local})
	k.Emit("mad.lo.u32", idx, cta, ptx.Imm(32), tid)
	a := k.Reg(ptx.U64)
	k.Emit("mul.wide.u32", a, idx, ptx.Imm(4))
	k.Emit("add.u64", a, a, out)
	k.Emit("st.global.u32", ptx.Addr{Base: a}, v)
	return k
}

func TestClusterExchange(t *testing.T) {
	const blocks = 6
	mem := NewMemory()
	out := mem.Alloc(4 * 32 * blocks)
	l := Launch{Grid: [3]int{blocks, 1, 1}, Block: [3]int{32, 1, 1}}
	if err := Run(compile(t, clusterExchange()), "xchg", l, mem, []uint64{out}); err != nil {
		t.Fatal(err)
	}
	got := readU32(mem, out, 32*blocks)
	for c := range blocks {
		for th := range 32 {
			if want := uint32((c^1)*100 + th); got[c*32+th] != want {
				t.Fatalf("block %d thread %d: got %d want %d", c, th, got[c*32+th], want)
			}
		}
	}
}

// clusterIDs stores %cluster_ctarank and %cluster_nctarank of each block.
func clusterIDs(cluster int) *ptx.Kernel {
	k := ptx.NewKernel("ids")
	k.ClusterX = cluster
	out := k.Reg(ptx.U64)
	k.Emit("ld.param.u64", out, ptx.Addr{Base: k.Param("out", ptx.U64)})
	r := k.Regs(ptx.U32, 3)
	k.Emit("mov.u32", r[0], ptx.CtaidX)
	k.Emit("mov.u32", r[1], ptx.ClusterCtaRank)
	k.Emit("mov.u32", r[2], ptx.ClusterNCtaRank)
	a := k.Reg(ptx.U64)
	k.Emit("mul.wide.u32", a, r[0], ptx.Imm(8))
	k.Emit("add.u64", a, a, out)
	k.Emit("st.global.v2.u32", ptx.Addr{Base: a}, ptx.Vec{r[1], r[2]})
	return k
}

func TestClusterSpecials(t *testing.T) {
	for _, c := range []int{0, 1, 4} {
		mem := NewMemory()
		out := mem.Alloc(8 * 8)
		l := Launch{Grid: [3]int{8, 1, 1}, Block: [3]int{2, 1, 1}}
		if err := Run(compile(t, clusterIDs(c)), "ids", l, mem, []uint64{out}); err != nil {
			t.Fatal(err)
		}
		got := readU32(mem, out, 16)
		n := max(c, 1)
		for b := range 8 {
			if got[2*b] != uint32(b%n) || got[2*b+1] != uint32(n) {
				t.Fatalf("cluster %d block %d: rank %d of %d", c, b, got[2*b], got[2*b+1])
			}
		}
	}
}

// ring is a producer/consumer kernel over S=2 stages of 128 bytes (64 used) in dynamic shared
// memory: thread 0 fills chunk i (of n) into stage i%2 with a bulk copy of x+64i, or with a
// tensor copy of the box at (8(i&1)-4, (i>>1)-1); warp 1 waits for each stage, adds element
// lane%16 of it and releases the stage. out[32*block+lane] is the block's consumer's sum: each
// block has stages and barriers of its own, and an out of its own (blocks run at once).
func ring(tensor bool, n int) *ptx.Kernel {
	k := ptx.NewKernel("ring")
	x, out := k.Reg(ptx.U64), k.Reg(ptx.U64)
	k.Emit("ld.param.u64", x, ptx.Addr{Base: k.Param("x", ptx.U64)})
	k.Emit("ld.param.u64", out, ptx.Addr{Base: k.Param("out", ptx.U64)})
	bars := k.DeclareShared("bars", ptx.B64, 4) // full[0..1], empty[0..1]
	smem := k.DeclareDynamicShared("smem", 128)
	u := func() ptx.Reg { return k.Reg(ptx.U32) }
	tid, warp, lane, i, s, kk, par, a, b := u(), u(), u(), u(), u(), u(), u(), u(), u()
	p, q := k.Reg(ptx.Pred), k.Reg(ptx.Pred)
	st := k.Reg(ptx.B64)
	k.Emit("mov.u32", tid, ptx.TidX)
	k.Emit("shr.u32", warp, tid, ptx.Imm(5))
	k.Emit("and.b32", lane, tid, ptx.Imm(31))
	k.Emit("setp.eq.u32", p, tid, ptx.Imm(0))
	init := k.NewLabel("init")
	k.EmitIf(p, true, "bra", ptx.Sym(init))
	for j, cnt := range []int64{1, 1, 32, 32} {
		k.Emit("mbarrier.init.shared::cta.b64", ptx.Addr{Base: bars, Offset: int64(8 * j)}, ptx.Imm(cnt))
	}
	k.Emit("fence.mbarrier_init.release.cluster")
	k.Label(init)
	k.Emit("bar.sync", ptx.Imm(0))
	k.Emit("setp.eq.u32", q, warp, ptx.Imm(1))
	consume, done := k.NewLabel("consume"), k.NewLabel("done")
	k.EmitIf(q, false, "bra", ptx.Sym(consume))
	k.EmitIf(p, true, "bra", ptx.Sym(done))

	// Producer.
	loop, fill, wait := k.NewLabel("ploop"), k.NewLabel("fill"), k.NewLabel("pwait")
	k.Emit("mov.u32", i, ptx.Imm(0))
	k.Label(loop)
	k.Emit("setp.ge.u32", p, i, ptx.Imm(int64(n)))
	k.EmitIf(p, false, "bra", ptx.Sym(done))
	k.Emit("and.b32", s, i, ptx.Imm(1))
	k.Emit("shr.u32", kk, i, ptx.Imm(1))
	k.Emit("setp.lt.u32", p, i, ptx.Imm(2))
	k.EmitIf(p, false, "bra", ptx.Sym(fill))
	k.Emit("sub.u32", par, kk, ptx.Imm(1))
	k.Emit("and.b32", par, par, ptx.Imm(1))
	k.Emit("mov.u32", a, bars)
	k.Emit("mad.lo.u32", a, s, ptx.Imm(8), a)
	k.Label(wait)
	k.Emit("mbarrier.try_wait.parity.shared::cta.b64", p, ptx.Addr{Base: a, Offset: 16}, par)
	k.EmitIf(p, true, "bra", ptx.Sym(wait))
	k.Label(fill)
	k.Emit("mov.u32", a, bars)
	k.Emit("mad.lo.u32", a, s, ptx.Imm(8), a)
	k.Emit("mbarrier.arrive.expect_tx.shared::cta.b64", st, ptx.Addr{Base: a}, ptx.Imm(64))
	k.Emit("mov.u32", b, smem)
	k.Emit("mad.lo.u32", b, s, ptx.Imm(128), b)
	if tensor {
		c0, c1 := u(), u()
		k.Emit("and.b32", c0, i, ptx.Imm(1))
		k.Emit("mad.lo.u32", c0, c0, ptx.Imm(8), ptx.Imm(-4))
		k.Emit("sub.u32", c1, kk, ptx.Imm(1))
		k.Emit(tensorOp, ptx.Addr{Base: b}, ptx.TensorAddr{Map: x, Coords: ptx.Vec{c0, c1}}, ptx.Addr{Base: a})
	} else {
		src := k.Reg(ptx.U64)
		k.Emit("mul.wide.u32", src, i, ptx.Imm(64))
		k.Emit("add.u64", src, src, x)
		k.Emit(bulkOp, ptx.Addr{Base: b}, ptx.Addr{Base: src}, ptx.Imm(64), ptx.Addr{Base: a})
	}
	k.Emit("add.u32", i, i, ptx.Imm(1))
	k.Emit("bra", ptx.Sym(loop))

	// Consumers.
	k.Label(consume)
	cloop, cwait := k.NewLabel("cloop"), k.NewLabel("cwait")
	acc, v := k.Reg(ptx.F32), k.Reg(ptx.F32)
	k.Emit("mov.f32", acc, ptx.F32Imm(0))
	k.Emit("mov.u32", i, ptx.Imm(0))
	k.Label(cloop)
	k.Emit("setp.ge.u32", p, i, ptx.Imm(int64(n)))
	store := k.NewLabel("store")
	k.EmitIf(p, false, "bra", ptx.Sym(store))
	k.Emit("and.b32", s, i, ptx.Imm(1))
	k.Emit("shr.u32", par, i, ptx.Imm(1))
	k.Emit("and.b32", par, par, ptx.Imm(1))
	k.Emit("mov.u32", a, bars)
	k.Emit("mad.lo.u32", a, s, ptx.Imm(8), a)
	k.Label(cwait)
	k.Emit("mbarrier.try_wait.parity.shared::cta.b64", p, ptx.Addr{Base: a}, par)
	k.EmitIf(p, true, "bra", ptx.Sym(cwait))
	k.Emit("mov.u32", b, smem)
	k.Emit("mad.lo.u32", b, s, ptx.Imm(128), b)
	k.Emit("and.b32", kk, lane, ptx.Imm(15))
	k.Emit("mad.lo.u32", b, kk, ptx.Imm(4), b)
	k.Emit("ld.shared.f32", v, ptx.Addr{Base: b})
	k.Emit("add.f32", acc, acc, v)
	k.Emit("mbarrier.arrive.shared::cta.b64", st, ptx.Addr{Base: a, Offset: 16})
	k.Emit("add.u32", i, i, ptx.Imm(1))
	k.Emit("bra", ptx.Sym(cloop))
	k.Label(store)
	o, at := k.Reg(ptx.U64), u()
	k.Emit("mov.u32", at, ptx.CtaidX)
	k.Emit("mad.lo.u32", at, at, ptx.Imm(32), lane)
	k.Emit("mul.wide.u32", o, at, ptx.Imm(4))
	k.Emit("add.u64", o, o, out)
	k.Emit("st.global.f32", ptx.Addr{Base: o}, acc)
	k.Label(done)
	return k
}

const ringBlocks = 3

var ringLaunch = Launch{Grid: [3]int{ringBlocks, 1, 1}, Block: [3]int{64, 1, 1}, Shared: 256}

func TestRingBulkCopy(t *testing.T) {
	const n = 7
	xv := make([]float32, 16*n)
	for j := range xv {
		xv[j] = float32(j)
	}
	mem := NewMemory()
	x, out := allocF32(mem, xv), mem.Alloc(4*32*ringBlocks)
	if err := Run(compile(t, ring(false, n)), "ring", ringLaunch, mem, []uint64{x, out}); err != nil {
		t.Fatal(err)
	}
	got := readF32(mem, out, 32*ringBlocks)
	for j := range got {
		lane := j % 32
		var want float32
		for i := range n {
			want += xv[16*i+lane%16]
		}
		if got[j] != want {
			t.Fatalf("block %d lane %d: %v, want %v", j/32, lane, got[j], want)
		}
	}
}

// putTensorMap stores a map made by TensorMap2D in global memory and returns its address.
func putTensorMap(t *testing.T, mem *Memory, base uint64, dims [2]int, stride int, box [2]int, eb, swizzle int) uint64 {
	t.Helper()
	m, err := TensorMap2D(base, dims, stride, box, eb, swizzle)
	if err != nil {
		t.Fatal(err)
	}
	a := mem.Alloc(128)
	copy(mem.Bytes(a), m[:])
	return a
}

func TestRingTensorCopyZeroFills(t *testing.T) {
	const n, cols, rows, pitch = 8, 12, 3, 16 // rows of 12 f32, 16 apart: 64 bytes
	xv := make([]float32, rows*pitch)
	for j := range xv {
		xv[j] = float32(j + 1)
	}
	mem := NewMemory()
	x, out := allocF32(mem, xv), mem.Alloc(4*32*ringBlocks)
	mp := putTensorMap(t, mem, x, [2]int{cols, rows}, 4*pitch, [2]int{8, 2}, 4, 0)
	if err := Run(compile(t, ring(true, n)), "ring", ringLaunch, mem, []uint64{mp, out}); err != nil {
		t.Fatal(err)
	}
	at := func(c, r int) float32 {
		if c < 0 || c >= cols || r < 0 || r >= rows {
			return 0
		}
		return xv[r*pitch+c]
	}
	got := readF32(mem, out, 32*ringBlocks)
	for j := range got {
		lane := j % 32
		var want float32
		e := lane % 16
		for i := range n {
			c0, c1 := 8*(i&1)-4, i>>1-1
			want += at(c0+e%8, c1+e/8)
		}
		if got[j] != want {
			t.Fatalf("block %d lane %d: %v, want %v", j/32, lane, got[j], want)
		}
	}
}

// TestTensorCopySwizzles: under the 128-byte swizzle, box row r's 16-byte chunk c lands at
// chunk c^(r%8) of its 128-byte row, as the GPU lays it out; a destination not 1024-byte
// aligned is an error.
func TestTensorCopySwizzles(t *testing.T) {
	const rows, cols = 16, 32 // f32: 128-byte rows
	xv := make([]float32, rows*cols)
	for j := range xv {
		xv[j] = float32(j)
	}
	for _, off := range []int64{0, 512} {
		mem := NewMemory()
		x, out := allocF32(mem, xv), mem.Alloc(4*rows*cols)
		mp := putTensorMap(t, mem, x, [2]int{cols, rows}, 4*cols, [2]int{cols, rows}, 4, 128)
		k := ptx.NewKernel("swz")
		m, o := k.Reg(ptx.U64), k.Reg(ptx.U64)
		k.Emit("ld.param.u64", m, ptx.Addr{Base: k.Param("map", ptx.U64)})
		k.Emit("ld.param.u64", o, ptx.Addr{Base: k.Param("out", ptx.U64)})
		bars := k.DeclareShared("bars", ptx.B64, 1)
		smem := k.DeclareDynamicShared("smem", 1024)
		c, a, v := k.Reg(ptx.U32), k.Reg(ptx.U32), k.Reg(ptx.F32)
		p := k.Reg(ptx.Pred)
		st := k.Reg(ptx.B64)
		k.Emit("mbarrier.init.shared::cta.b64", ptx.Addr{Base: bars}, ptx.Imm(1))
		k.Emit("mbarrier.arrive.expect_tx.shared::cta.b64", st, ptx.Addr{Base: bars}, ptx.Imm(4*rows*cols))
		k.Emit("mov.u32", c, ptx.Imm(0))
		k.Emit(tensorOp, ptx.Addr{Base: smem, Offset: off}, ptx.TensorAddr{Map: m, Coords: ptx.Vec{c, c}}, ptx.Addr{Base: bars})
		wait := k.NewLabel("wait")
		k.Label(wait)
		k.Emit("mbarrier.try_wait.parity.shared::cta.b64", p, ptx.Addr{Base: bars}, ptx.Imm(0))
		k.EmitIf(p, true, "bra", ptx.Sym(wait))
		loop := k.NewLabel("copy")
		k.Label(loop)
		k.Emit("mov.u32", a, smem)
		k.Emit("mad.lo.u32", a, c, ptx.Imm(4), a)
		k.Emit("ld.shared.f32", v, ptx.Addr{Base: a})
		ga := k.Reg(ptx.U64)
		k.Emit("mul.wide.u32", ga, c, ptx.Imm(4))
		k.Emit("add.u64", ga, ga, o)
		k.Emit("st.global.f32", ptx.Addr{Base: ga}, v)
		k.Emit("add.u32", c, c, ptx.Imm(1))
		k.Emit("setp.lt.u32", p, c, ptx.Imm(rows*cols))
		k.EmitIf(p, false, "bra", ptx.Sym(loop))
		err := Run(compile(t, k), "swz", Launch{Grid: [3]int{1, 1, 1}, Block: [3]int{1, 1, 1}, Shared: 2048}, mem, []uint64{mp, out})
		if off != 0 {
			if err == nil || !strings.Contains(err.Error(), "needs 1024-byte alignment") {
				t.Errorf("destination at 512: error %v, want a 1024-byte alignment error", err)
			}
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		got := readF32(mem, out, rows*cols)
		for r := range rows {
			for j := range cols {
				at := r*cols + (j/4^r%8)*4 + j%4
				if got[at] != xv[r*cols+j] {
					t.Fatalf("row %d element %d: at %d reads %v, want %v", r, j, at, got[at], xv[r*cols+j])
				}
			}
		}
	}
}

func TestTensorMap2DRejects(t *testing.T) {
	cases := []struct {
		base    uint64
		dims    [2]int
		stride  int
		box     [2]int
		eb      int
		swizzle int
		want    string
	}{
		{0x1008, [2]int{8, 8}, 32, [2]int{8, 8}, 4, 0, "not 16-byte aligned"},
		{0x1000, [2]int{8, 8}, 24, [2]int{8, 8}, 4, 0, "row stride 24"},
		{0x1000, [2]int{8, 8}, 16, [2]int{8, 8}, 4, 0, "row stride 16"},
		{0x1000, [2]int{8, 8}, 32, [2]int{8, 300}, 4, 0, "box [8 300]"},
		{0x1000, [2]int{8, 8}, 32, [2]int{3, 8}, 4, 0, "box row of 12 bytes"},
		{0x1000, [2]int{0, 8}, 32, [2]int{4, 8}, 4, 0, "dimensions [0 8]"},
		{0x1000, [2]int{8, 8}, 32, [2]int{4, 8}, 3, 0, "element size 3"},
		{0x1000, [2]int{64, 8}, 256, [2]int{64, 8}, 4, 64, "swizzle 64"},
		{0x1000, [2]int{64, 8}, 256, [2]int{16, 8}, 4, 128, "box row of 64 bytes under the 128-byte swizzle"},
	}
	for _, c := range cases {
		_, err := TensorMap2D(c.base, c.dims, c.stride, c.box, c.eb, c.swizzle)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: error %v, want %q", c, err, c.want)
		}
	}
}

// asyncFault runs a one-block kernel built by body (given the dynamic shared symbol, the
// out pointer and an mbarrier address register already initialised with count 1) and
// returns its error.
func asyncFault(t *testing.T, cluster int, l Launch, setup func(mem *Memory, out uint64), body func(k *ptx.Kernel, smem ptx.Sym, out, bar ptx.Reg)) error {
	t.Helper()
	k := ptx.NewKernel("f")
	k.ClusterX = cluster
	out := k.Reg(ptx.U64)
	k.Emit("ld.param.u64", out, ptx.Addr{Base: k.Param("out", ptx.U64)})
	bars := k.DeclareShared("bars", ptx.B64, 1)
	smem := k.DeclareDynamicShared("smem", 128)
	bar := k.Reg(ptx.U32)
	k.Emit("mov.u32", bar, bars)
	k.Emit("mbarrier.init.shared::cta.b64", ptx.Addr{Base: bar}, ptx.Imm(1))
	body(k, smem, out, bar)
	mem := NewMemory()
	o := mem.Alloc(4096)
	if setup != nil {
		setup(mem, o)
	}
	return Run(compile(t, k), "f", l, mem, []uint64{o})
}

func TestAsyncFaults(t *testing.T) {
	one := Launch{Grid: [3]int{1, 1, 1}, Block: [3]int{32, 1, 1}, Shared: 1024}
	cases := []struct {
		name    string
		cluster int
		l       Launch
		setup   func(mem *Memory, out uint64)
		body    func(k *ptx.Kernel, smem ptx.Sym, out, bar ptx.Reg)
		want    []string
	}{
		{"try_wait never completes", 0, one, nil, func(k *ptx.Kernel, _ ptx.Sym, _, bar ptx.Reg) {
			p := k.Reg(ptx.Pred)
			w := k.NewLabel("w")
			k.Label(w)
			k.Emit("mbarrier.try_wait.parity.shared::cta.b64", p, ptx.Addr{Base: bar}, ptx.Imm(0))
			k.EmitIf(p, true, "bra", ptx.Sym(w))
		}, []string{"deadlock: waits at an mbarrier phase that never completes", "32 at mbarriers", "instr 4 (mbarrier.try_wait"}},
		{"grid not a multiple of the cluster", 2, Launch{Grid: [3]int{3, 1, 1}, Block: [3]int{32, 1, 1}}, nil, func(*ptx.Kernel, ptx.Sym, ptx.Reg, ptx.Reg) {},
			[]string{"kernel f: grid x 3 is not a multiple of its cluster size 2"}},
		{"plain shared with a mapa'd address", 2, Launch{Grid: [3]int{2, 1, 1}, Block: [3]int{32, 1, 1}}, nil, func(k *ptx.Kernel, smem ptx.Sym, _, _ ptx.Reg) {
			r := k.Reg(ptx.U32)
			k.Emit("mapa.shared::cluster.u32", r, smem, ptx.Imm(1))
			k.Emit("st.shared.u32", ptx.Addr{Base: r}, r)
		}, []string{"uses a cluster address (from mapa): it needs .shared::cluster", "st.shared.u32"}},
		{"mapa past the cluster", 2, Launch{Grid: [3]int{2, 1, 1}, Block: [3]int{32, 1, 1}}, nil, func(k *ptx.Kernel, smem ptx.Sym, _, _ ptx.Reg) {
			r := k.Reg(ptx.U32)
			k.Emit("mapa.shared::cluster.u32", r, smem, ptx.Imm(2))
		}, []string{"mapa to rank 2 of a 2-block cluster"}},
		{"shared::cluster past the window", 2, Launch{Grid: [3]int{2, 1, 1}, Block: [3]int{32, 1, 1}, Shared: 64}, nil, func(k *ptx.Kernel, smem ptx.Sym, _, _ ptx.Reg) {
			r := k.Reg(ptx.U32)
			k.Emit("mapa.shared::cluster.u32", r, smem, ptx.Imm(1))
			k.Emit("st.shared::cluster.u32", ptx.Addr{Base: r, Offset: 64}, r)
		}, []string{"outside the 192-byte shared window"}},
		{"misaligned bulk copy", 0, one, nil, func(k *ptx.Kernel, smem ptx.Sym, out, bar ptx.Reg) {
			k.Emit(bulkOp, ptx.Addr{Base: smem}, ptx.Addr{Base: out, Offset: 8}, ptx.Imm(64), ptx.Addr{Base: bar})
		}, []string{"bulk copy from misaligned global address"}},
		{"bulk copy to misaligned shared", 0, one, nil, func(k *ptx.Kernel, smem ptx.Sym, out, bar ptx.Reg) {
			k.Emit(bulkOp, ptx.Addr{Base: smem, Offset: 8}, ptx.Addr{Base: out}, ptx.Imm(64), ptx.Addr{Base: bar})
		}, []string{"misaligned 64-byte shared access", "needs 16-byte alignment"}},
		{"bulk copy of an odd size", 0, one, nil, func(k *ptx.Kernel, smem ptx.Sym, out, bar ptx.Reg) {
			k.Emit(bulkOp, ptx.Addr{Base: smem}, ptx.Addr{Base: out}, ptx.Imm(40), ptx.Addr{Base: bar})
		}, []string{"bulk copy of 40 bytes"}},
		{"bad tensor map", 0, one, func(mem *Memory, out uint64) { copy(mem.Bytes(out), "garbage!") }, func(k *ptx.Kernel, smem ptx.Sym, out, bar ptx.Reg) {
			c := k.Reg(ptx.U32)
			k.Emit("mov.u32", c, ptx.Imm(0))
			k.Emit(tensorOp, ptx.Addr{Base: smem}, ptx.TensorAddr{Map: out, Coords: ptx.Vec{c, c}}, ptx.Addr{Base: bar})
		}, []string{"not a map made by emu.TensorMap2D (bad magic)"}},
		{"corrupt tensor map", 0, one, func(mem *Memory, out uint64) {
			m, _ := TensorMap2D(out+256, [2]int{8, 8}, 32, [2]int{8, 8}, 4, 0)
			binary.LittleEndian.PutUint32(m[32:], 1000)
			copy(mem.Bytes(out), m[:])
		}, func(k *ptx.Kernel, smem ptx.Sym, out, bar ptx.Reg) {
			c := k.Reg(ptx.U32)
			k.Emit("mov.u32", c, ptx.Imm(0))
			k.Emit(tensorOp, ptx.Addr{Base: smem}, ptx.TensorAddr{Map: out, Coords: ptx.Vec{c, c}}, ptx.Addr{Base: bar})
		}, []string{"corrupt: box [1000 8]"}},
		{"uninitialised mbarrier", 0, one, nil, func(k *ptx.Kernel, smem ptx.Sym, _, _ ptx.Reg) {
			k.Emit("mbarrier.arrive.shared::cta.b64", k.Reg(ptx.B64), ptx.Addr{Base: smem})
		}, []string{"mbarrier is not initialized"}},
		{"too many arrivals", 0, one, nil, func(k *ptx.Kernel, _ ptx.Sym, _, bar ptx.Reg) {
			k.Emit("mbarrier.arrive.expect_tx.shared::cta.b64", k.Reg(ptx.B64), ptx.Addr{Base: bar}, ptx.Imm(16))
			k.Emit("mbarrier.arrive.shared::cta.b64", k.Reg(ptx.B64), ptx.Addr{Base: bar})
		}, []string{"mbarrier arrival beyond its expected count"}},
		{"cluster wait without arrive", 0, one, nil, func(k *ptx.Kernel, _ ptx.Sym, _, _ ptx.Reg) {
			k.Emit("barrier.cluster.wait")
		}, []string{"barrier.cluster.wait without a barrier.cluster.arrive"}},
		{"cluster barrier missing a block", 2, Launch{Grid: [3]int{2, 1, 1}, Block: [3]int{32, 1, 1}}, nil, func(k *ptx.Kernel, _ ptx.Sym, _, _ ptx.Reg) {
			// Half of rank 1 waits at a block barrier the other half never reaches.
			r, tid, p, q := k.Reg(ptx.U32), k.Reg(ptx.U32), k.Reg(ptx.Pred), k.Reg(ptx.Pred)
			k.Emit("mov.u32", r, ptx.ClusterCtaRank)
			k.Emit("mov.u32", tid, ptx.TidX)
			k.Emit("setp.eq.u32", p, r, ptx.Imm(0))
			k.Emit("setp.ge.or.u32", q, tid, ptx.Imm(16), p)
			skip := k.NewLabel("skip")
			k.EmitIf(q, false, "bra", ptx.Sym(skip))
			k.Emit("bar.sync", ptx.Imm(0))
			k.Label(skip)
			k.Emit("barrier.cluster.arrive")
			k.Emit("barrier.cluster.wait")
		}, []string{"deadlock", "block (0,0,0) thread (0,0,0): deadlock: waits at barrier.cluster forever", "block (1,0,0) thread (0,0,0): deadlock: waits at a barrier forever", "16 at barriers, 48 at barrier.cluster"}},
		{"multicast past the cluster", 2, Launch{Grid: [3]int{2, 1, 1}, Block: [3]int{32, 1, 1}, Shared: 1024}, func(mem *Memory, out uint64) {
			m, _ := TensorMap2D(out+256, [2]int{8, 8}, 32, [2]int{8, 1}, 4, 0)
			copy(mem.Bytes(out), m[:])
		}, func(k *ptx.Kernel, smem ptx.Sym, out, bar ptx.Reg) {
			c := k.Reg(ptx.U32)
			k.Emit("mov.u32", c, ptx.Imm(0))
			k.Emit(tensorOp+".multicast::cluster", ptx.Addr{Base: smem, Offset: 128}, ptx.TensorAddr{Map: out, Coords: ptx.Vec{c, c}}, ptx.Addr{Base: bar}, ptx.Imm(4))
		}, []string{"multicast mask 0x4: want ranks of the 2-block cluster"}},
		{"trap", 0, one, nil, func(k *ptx.Kernel, _ ptx.Sym, _, _ ptx.Reg) { k.Emit("trap") }, []string{"(trap): block (0,0,0) thread (0,0,0): trap"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			wantError(t, asyncFault(t, c.cluster, c.l, c.setup, c.body), c.want...)
		})
	}
}

// TestMbarrierPhases: arrivals and bytes in either order complete a phase, and the state an
// arrive returns is the barrier before it.
func TestMbarrierPhases(t *testing.T) {
	m := mbar{pending: 2, expected: 2}
	if err := m.addTx(-64); err != nil { // a copy's bytes land before the expect_tx
		t.Fatal(err)
	}
	m.pending--
	m.complete()
	if m.phase != 0 {
		t.Fatal("phase completed with an arrival and bytes outstanding")
	}
	_ = m.addTx(64)
	m.pending--
	m.complete()
	if m.phase != 1 || m.pending != 2 || m.tx != 0 {
		t.Fatalf("after the phase: %+v", m)
	}
	for _, v := range []mbar{{1, 3, -5, 1}, {maxArrivals, maxArrivals, maxTx, 0}, {0, 1, -maxTx, 1}} {
		got, err := decodeMbar(v.encode())
		if err != nil || got != v {
			t.Fatalf("encode/decode %+v: %+v %v", v, got, err)
		}
	}
}

// multicastRing: in clusters of two, n rounds through one slot of two boxes (128 bytes apart). In round i rank
// r asks for row 2i+r of an 8-column f32 tensor, multicast to both ranks' slot half r; every
// rank waits for both halves, lanes 0-7 add their column of both, and before the next round
// each rank's thread 0 arrives on both ranks' "slot free" mbarrier (count 2) and waits on its
// own, so no rank's copy lands in a slot its partner still reads. Each block stores its sums.
func multicastRing(n int) *ptx.Kernel {
	k := ptx.NewKernel("mcast")
	k.ClusterX = 2
	mp, out := k.Reg(ptx.U64), k.Reg(ptx.U64)
	k.Emit("ld.param.u64", mp, ptx.Addr{Base: k.Param("map", ptx.U64)})
	k.Emit("ld.param.u64", out, ptx.Addr{Base: k.Param("out", ptx.U64)})
	smem := k.DeclareDynamicShared("smem", 128)
	r := k.Regs(ptx.U32, 6)
	tid, rank, base, row, col, lane8 := r[0], r[1], r[2], r[3], r[4], r[5]
	k.Emit("mov.u32", tid, ptx.TidX)
	k.Emit("mov.u32", rank, ptx.ClusterCtaRank)
	k.Emit("mov.u32", base, smem)
	full, free, slot := ptx.Addr{Base: base}, ptx.Addr{Base: base, Offset: 8}, base
	t0, lt8, p, r1 := k.Reg(ptx.Pred), k.Reg(ptx.Pred), k.Reg(ptx.Pred), k.Reg(ptx.Pred)
	k.Emit("setp.eq.u32", t0, tid, ptx.Imm(0))
	k.Emit("setp.eq.u32", r1, rank, ptx.Imm(1))
	k.Emit("setp.lt.u32", lt8, tid, ptx.Imm(8))
	k.EmitIf(t0, false, "mbarrier.init.shared::cta.b64", full, ptx.Imm(1))
	k.EmitIf(t0, false, "mbarrier.init.shared::cta.b64", free, ptx.Imm(2))
	k.Emit("fence.mbarrier_init.release.cluster")
	k.Emit("bar.sync", ptx.Imm(0))
	// Both ranks' barriers exist before either copies into the other.
	k.Emit("barrier.cluster.arrive.release")
	k.Emit("barrier.cluster.wait.acquire")
	k.Emit("mov.u32", col, ptx.Imm(0))
	acc, v := k.Reg(ptx.F32), k.Reg(ptx.F32)
	k.Emit("mov.f32", acc, ptx.F32Imm(0))
	k.Emit("shl.b32", lane8, tid, ptx.Imm(2))
	k.Emit("add.u32", lane8, lane8, ptx.Imm(128))
	k.Emit("add.u32", lane8, lane8, base)
	mask, st := k.Reg(ptx.B16), k.Reg(ptx.B64)
	k.Emit("mov.b16", mask, ptx.Imm(3))
	wait := func(bar ptx.Addr, parity int) {
		top := k.NewLabel("w")
		k.Label(top)
		k.Emit("mbarrier.try_wait.parity.shared::cta.b64", p, bar, ptx.Imm(int64(parity)))
		k.EmitIf(p, true, "bra", ptx.Sym(top))
	}
	for i := range n {
		skip := k.NewLabel("ask")
		k.EmitIf(t0, true, "bra", ptx.Sym(skip))
		if i > 0 {
			wait(free, (i-1)&1)
		}
		k.Emit("mbarrier.arrive.expect_tx.shared::cta.b64", st, full, ptx.Imm(64))
		k.Emit("add.u32", row, rank, ptx.Imm(int64(2*i)))
		dst := k.Reg(ptx.U32)
		k.Emit("mad.lo.u32", dst, rank, ptx.Imm(128), slot) // a tensor copy's destination is 128-byte aligned
		k.Emit(tensorOp+".multicast::cluster", ptx.Addr{Base: dst, Offset: 128}, ptx.TensorAddr{Map: mp, Coords: ptx.Vec{col, row}}, full, mask)
		k.Label(skip)
		wait(full, i&1)
		// Rank 1 lags two block barriers behind before it reads, long enough for rank 0's
		// next copy to land first if it did not wait for the slot to be free.
		lag := k.NewLabel("lag")
		k.EmitIf(r1, true, "bra", ptx.Sym(lag))
		k.Emit("bar.sync", ptx.Imm(0))
		k.Emit("bar.sync", ptx.Imm(0))
		k.Label(lag)
		k.EmitIf(lt8, false, "ld.shared.f32", v, ptx.Addr{Base: lane8})
		k.EmitIf(lt8, false, "add.f32", acc, acc, v)
		k.EmitIf(lt8, false, "ld.shared.f32", v, ptx.Addr{Base: lane8, Offset: 128})
		k.EmitIf(lt8, false, "add.f32", acc, acc, v)
		k.Emit("bar.sync", ptx.Imm(0))
		if i < n-1 {
			for peer := range 2 {
				remote := k.Reg(ptx.U32)
				k.Emit("mapa.shared::cluster.u32", remote, base, ptx.Imm(int64(peer)))
				k.EmitIf(t0, false, "mbarrier.arrive.shared::cluster.b64", ptx.Sink, ptx.Addr{Base: remote, Offset: 8})
			}
		}
	}
	cta, a := k.Reg(ptx.U32), k.Reg(ptx.U64)
	k.Emit("mov.u32", cta, ptx.CtaidX)
	k.Emit("mad.lo.u32", cta, cta, ptx.Imm(8), tid)
	k.Emit("mul.wide.u32", a, cta, ptx.Imm(4))
	k.Emit("add.u64", a, a, out)
	k.EmitIf(lt8, false, "st.global.f32", ptx.Addr{Base: a}, acc)
	return k
}

func TestMulticastRing(t *testing.T) {
	const n, cols = 5, 8
	xv := make([]float32, 2*n*cols)
	for j := range xv {
		xv[j] = float32(j*j%97) + 0.5
	}
	mem := NewMemory()
	x, out := allocF32(mem, xv), mem.Alloc(4*4*cols)
	mp := putTensorMap(t, mem, x, [2]int{cols, 2 * n}, 4*cols, [2]int{cols, 1}, 4, 0)
	for _, lag := range []bool{false, true} {
		l := Launch{Grid: [3]int{4, 1, 1}, Block: [3]int{32, 1, 1}, Shared: 512, Lag: lag}
		if err := Run(compile(t, multicastRing(n)), "mcast", l, mem, []uint64{mp, out}); err != nil {
			t.Fatalf("lag %v: %v", lag, err)
		}
		checkMulticastSums(t, readF32(mem, out, 4*cols), xv, cols)
	}
}

// checkMulticastSums: every block's column c holds the sum of column c over all rows.
func checkMulticastSums(t *testing.T, got, xv []float32, cols int) {
	t.Helper()
	for cta := range len(got) / cols {
		for c := range cols {
			var want float32
			for row := range len(xv) / cols {
				want += xv[row*cols+c]
			}
			if got[cta*cols+c] != want {
				t.Fatalf("block %d column %d: %v, want %v", cta, c, got[cta*cols+c], want)
			}
		}
	}
}
