package emu

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"testing"

	"xmix/ptx"
)

// compile prints k and parses it back, as the kernel tests do with generated text.
func compile(t *testing.T, k *ptx.Kernel) *ptx.Module {
	t.Helper()
	k.Emit("ret")
	text, err := ptx.NewModule(k).Print()
	if err != nil {
		t.Fatal(err)
	}
	m, err := ptx.Parse(text)
	if err != nil {
		t.Fatalf("parse: %v\n%s", err, text)
	}
	return m
}

func parseText(t *testing.T, body string) *ptx.Module {
	t.Helper()
	m, err := ptx.Parse(".version 8.0\n.target sm_90\n.address_size 64\n" + body)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func allocF32(m *Memory, v []float32) uint64 {
	a := m.Alloc(4 * len(v))
	b := m.Bytes(a)
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
	}
	return a
}

func readF32(m *Memory, a uint64, n int) []float32 {
	b := m.Bytes(a)
	out := make([]float32, n)
	for i := range out {
		out[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return out
}

func readU32(m *Memory, a uint64, n int) []uint32 {
	b := m.Bytes(a)
	out := make([]uint32, n)
	for i := range out {
		out[i] = binary.LittleEndian.Uint32(b[4*i:])
	}
	return out
}

// globalIndex emits i = ctaid.x*ntid.x + tid.x and j = ctaid.y*ntid.y + tid.y.
func globalIndex(k *ptx.Kernel) (i, j ptx.Reg) {
	r := k.Regs(ptx.U32, 6)
	k.Emit("mov.u32", r[0], ptx.CtaidX)
	k.Emit("mov.u32", r[1], ptx.NTidX)
	k.Emit("mov.u32", r[2], ptx.TidX)
	k.Emit("mad.lo.u32", r[0], r[0], r[1], r[2])
	k.Emit("mov.u32", r[3], ptx.CtaidY)
	k.Emit("mov.u32", r[4], ptx.Special("%ntid.y"))
	k.Emit("mov.u32", r[5], ptx.TidY)
	k.Emit("mad.lo.u32", r[3], r[3], r[4], r[5])
	return r[0], r[3]
}

// vecAdd adds two [rows, cols] f32 matrices over a 2-D grid, bounds-checked.
func vecAdd() *ptx.Kernel {
	k := ptx.NewKernel("vadd")
	ps := []ptx.Reg{k.Reg(ptx.U64), k.Reg(ptx.U64), k.Reg(ptx.U64)}
	for n, name := range []string{"a", "b", "c"} {
		k.Emit("ld.param.u64", ps[n], ptx.Addr{Base: k.Param(name, ptx.U64)})
	}
	rows, cols := k.Reg(ptx.U32), k.Reg(ptx.U32)
	k.Emit("ld.param.u32", rows, ptx.Addr{Base: k.Param("rows", ptx.U32)})
	k.Emit("ld.param.u32", cols, ptx.Addr{Base: k.Param("cols", ptx.U32)})
	x, y := globalIndex(k)
	p, q := k.Reg(ptx.Pred), k.Reg(ptx.Pred)
	k.Emit("setp.ge.u32", p, x, cols)
	k.Emit("setp.ge.or.u32", q, y, rows, p)
	end := k.NewLabel("end")
	k.EmitIf(q, false, "bra.uni", ptx.Sym(end))
	idx := k.Reg(ptx.U32)
	k.Emit("mad.lo.u32", idx, y, cols, x)
	off := k.Reg(ptx.U64)
	k.Emit("mul.wide.u32", off, idx, ptx.Imm(4))
	v := k.Regs(ptx.F32, 2)
	for n := range 2 {
		a := k.Reg(ptx.U64)
		k.Emit("add.u64", a, ps[n], off)
		k.Emit("ld.global.nc.f32", v[n], ptx.Addr{Base: a})
	}
	k.Emit("add.f32", v[0], v[0], v[1])
	a := k.Reg(ptx.U64)
	k.Emit("add.u64", a, ps[2], off)
	k.Emit("st.global.f32", ptx.Addr{Base: a}, v[0])
	k.Label(end)
	return k
}

func TestVecAdd2D(t *testing.T) {
	const rows, cols = 37, 45
	r := rand.New(rand.NewPCG(1, 2))
	av, bv := make([]float32, rows*cols), make([]float32, rows*cols)
	for i := range av {
		av[i], bv[i] = r.Float32(), r.Float32()
	}
	mem := NewMemory()
	a, b := allocF32(mem, av), allocF32(mem, bv)
	c := mem.Alloc(4 * rows * cols)
	mod := compile(t, vecAdd())
	l := Launch{Grid: [3]int{(cols + 15) / 16, (rows + 7) / 8, 1}, Block: [3]int{16, 8, 1}}
	if err := Run(mod, "vadd", l, mem, []uint64{a, b, c, rows, cols}); err != nil {
		t.Fatal(err)
	}
	got := readF32(mem, c, rows*cols)
	for i := range got {
		if got[i] != av[i]+bv[i] {
			t.Fatalf("c[%d] = %v, want %v", i, got[i], av[i]+bv[i])
		}
	}
}

// blockSum writes the sum of a block of x into out[ctaid.x] with shuffles, shared memory
// and barriers, the way codegen's blockReduce does.
func blockSum(nthreads int) *ptx.Kernel {
	k := ptx.NewKernel("bsum")
	x, out := k.Reg(ptx.U64), k.Reg(ptx.U64)
	k.Emit("ld.param.u64", x, ptx.Addr{Base: k.Param("x", ptx.U64)})
	k.Emit("ld.param.u64", out, ptx.Addr{Base: k.Param("out", ptx.U64)})
	scratch := k.DeclareShared("scratch", ptx.F32, 32)
	i, _ := globalIndex(k)
	tid := k.Reg(ptx.U32)
	k.Emit("mov.u32", tid, ptx.TidX)
	off := k.Reg(ptx.U64)
	k.Emit("mul.wide.u32", off, i, ptx.Imm(4))
	k.Emit("add.u64", off, off, x)
	v, tmp := k.Reg(ptx.F32), k.Reg(ptx.F32)
	k.Emit("ld.global.f32", v, ptx.Addr{Base: off})
	for o := 16; o > 0; o /= 2 {
		k.Emit("shfl.sync.bfly.b32", tmp, v, ptx.Imm(o), ptx.Imm(0x1f), ptx.Imm(-1))
		k.Emit("add.f32", v, v, tmp)
	}
	lane, warp, base, slot := k.Reg(ptx.U32), k.Reg(ptx.U32), k.Reg(ptx.U32), k.Reg(ptx.U32)
	k.Emit("and.b32", lane, tid, ptx.Imm(31))
	k.Emit("shr.u32", warp, tid, ptx.Imm(5))
	k.Emit("mov.u32", base, scratch)
	k.Emit("mad.lo.u32", slot, warp, ptx.Imm(4), base)
	p := k.Reg(ptx.Pred)
	k.Emit("setp.eq.u32", p, lane, ptx.Imm(0))
	k.EmitIf(p, false, "st.shared.f32", ptx.Addr{Base: slot}, v)
	k.Emit("bar.sync", ptx.Imm(0))
	acc := k.Reg(ptx.F32)
	k.Emit("ld.shared.f32", acc, ptx.Addr{Base: scratch})
	for w := 1; w < nthreads/32; w++ {
		k.Emit("ld.shared.f32", tmp, ptx.Addr{Base: scratch, Offset: int64(4 * w)})
		k.Emit("add.f32", acc, acc, tmp)
	}
	k.Emit("bar.sync", ptx.Imm(0))
	q := k.Reg(ptx.Pred)
	k.Emit("setp.ne.u32", q, tid, ptx.Imm(0))
	end := k.NewLabel("end")
	k.EmitIf(q, false, "bra", ptx.Sym(end))
	cta := k.Reg(ptx.U32)
	k.Emit("mov.u32", cta, ptx.CtaidX)
	o := k.Reg(ptx.U64)
	k.Emit("mul.wide.u32", o, cta, ptx.Imm(4))
	k.Emit("add.u64", o, o, out)
	k.Emit("st.global.f32", ptx.Addr{Base: o}, acc)
	k.Label(end)
	return k
}

func TestBlockReduction(t *testing.T) {
	const nthreads, nblocks = 256, 7
	r := rand.New(rand.NewPCG(3, 4))
	xv := make([]float32, nthreads*nblocks)
	for i := range xv {
		xv[i] = float32(r.IntN(1000)) // integers: every summation order is exact
	}
	mem := NewMemory()
	x, out := allocF32(mem, xv), mem.Alloc(4*nblocks)
	l := Launch{Grid: [3]int{nblocks, 1, 1}, Block: [3]int{nthreads, 1, 1}}
	if err := Run(compile(t, blockSum(nthreads)), "bsum", l, mem, []uint64{x, out}); err != nil {
		t.Fatal(err)
	}
	got := readF32(mem, out, nblocks)
	for b := range nblocks {
		var want float32
		for _, v := range xv[b*nthreads : (b+1)*nthreads] {
			want += v
		}
		if got[b] != want {
			t.Errorf("block %d: sum %v, want %v", b, got[b], want)
		}
	}
}
