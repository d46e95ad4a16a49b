package emu

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
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

// scalarKernel wraps body (which leaves its result in %r1) in a one-thread kernel that
// stores %r1 to out.
func scalarKernel(body string) string {
	return `.visible .entry k(.param .u64 out)
{
	.reg .pred %p<4>;
	.reg .b16 %rs<4>;
	.reg .b32 %r<8>;
	.reg .b64 %rd<4>;
	.reg .f32 %f<8>;
	.reg .f64 %fd<4>;
	ld.param.u64 %rd1, [out];
	` + body + `
	st.global.b32 [%rd1], %r1;
	ret;
}`
}

func TestInstructions(t *testing.T) {
	cases := []struct {
		body string
		want uint32
	}{
		{"mov.b32 %r2, -7; shr.s32 %r1, %r2, 1;", 0xFFFFFFFC},
		{"mov.b32 %r2, -7; shr.u32 %r1, %r2, 28;", 15},
		{"mov.b32 %r2, 1; shl.b32 %r1, %r2, 40;", 0},
		{"mov.u32 %r2, 0xFFFFFFFF; mul.hi.u32 %r1, %r2, %r2;", 0xFFFFFFFE},
		{"mov.s32 %r2, -3; mul.hi.s32 %r1, %r2, 5;", 0xFFFFFFFF},
		{"mov.s32 %r2, -2; mul.wide.s32 %rd2, %r2, 3; shr.u64 %rd2, %rd2, 32; cvt.u32.u64 %r1, %rd2;", 0xFFFFFFFF},
		{"mov.u32 %r2, 0x80000000; mul.wide.u32 %rd2, %r2, 4; shr.u64 %rd2, %rd2, 32; cvt.u32.u64 %r1, %rd2;", 2},
		{"mov.s32 %r2, -7; div.s32 %r1, %r2, 2;", 0xFFFFFFFD},
		{"mov.s32 %r2, -7; rem.s32 %r1, %r2, 2;", 0xFFFFFFFF},
		{"mov.u32 %r2, 7; mad.lo.u32 %r1, %r2, 3, 4;", 25},
		{"mov.s32 %r2, -1; min.s32 %r1, %r2, 3;", 0xFFFFFFFF},
		{"mov.s32 %r2, -1; min.u32 %r1, %r2, 3;", 3},
		{"mov.u32 %r2, 0xF0F0; popc.b32 %r1, %r2;", 8},
		{"mov.u32 %r2, 0x100; clz.b32 %r1, %r2;", 23},
		{"mov.u64 %rd2, 0x100000005; cvt.u32.u64 %r1, %rd2;", 5},
		{"mov.s32 %r2, -1; cvt.s64.s32 %rd2, %r2; shr.u64 %rd2, %rd2, 32; cvt.u32.u64 %r1, %rd2;", 0xFFFFFFFF},
		{"mov.f32 %f1, 0f7FC00000; min.f32 %f2, %f1, 0f3F800000; mov.b32 %r1, %f2;", 0x3F800000},
		{"mov.f32 %f1, 0f80000000; max.f32 %f2, %f1, 0f00000000; mov.b32 %r1, %f2;", 0},
		{"mov.f32 %f1, 0f7FC00000; setp.lt.f32 %p1, %f1, 0f3F800000; selp.u32 %r1, 1, 0, %p1;", 0},
		{"mov.f32 %f1, 0f7FC00000; setp.ltu.f32 %p1, %f1, 0f3F800000; selp.u32 %r1, 1, 0, %p1;", 1},
		{"mov.f32 %f1, 0f7FC00000; setp.ne.f32 %p1, %f1, %f1; selp.u32 %r1, 1, 0, %p1;", 0},
		{"mov.s32 %r2, -1; setp.lt.s32 %p1, %r2, 0; setp.lo.u32 %p2, %r2, 0; and.pred %p3, %p1, %p2; not.pred %p3, %p3; selp.u32 %r1, 1, 0, %p3;", 1},
		{"mov.f32 %f1, -2.7; cvt.rzi.s32.f32 %r1, %f1;", 0xFFFFFFFE},
		{"mov.f32 %f1, 2.5; cvt.rni.s32.f32 %r1, %f1;", 2},
		{"mov.f32 %f1, -2.5; cvt.rmi.s32.f32 %r1, %f1;", 0xFFFFFFFD},
		{"mov.f32 %f1, -5.0; cvt.rzi.u32.f32 %r1, %f1;", 0},
		{"mov.f32 %f1, 1e10; cvt.rzi.s32.f32 %r1, %f1;", 0x7FFFFFFF},
		{"mov.f32 %f1, 0f7FC00000; cvt.rzi.s32.f32 %r1, %f1;", 0},
		{"mov.f32 %f1, 2.5; cvt.rni.f32.f32 %f2, %f1; mov.b32 %r1, %f2;", 0x40000000},
		{"mov.s32 %r2, -3; cvt.rn.f32.s32 %f1, %r2; mov.b32 %r1, %f1;", 0xC0400000},
		{"mov.u32 %r2, 16777217; cvt.rn.f32.u32 %f1, %r2; mov.b32 %r1, %f1;", 0x4B800000},
		{"mov.f32 %f1, 3.0; ex2.approx.ftz.f32 %f2, %f1; mov.b32 %r1, %f2;", 0x41000000},
		{"mov.f32 %f1, 4.0; rsqrt.approx.f32 %f2, %f1; mov.b32 %r1, %f2;", 0x3F000000},
		{"mov.f32 %f1, 4.0; rcp.rn.f32 %f2, %f1; mov.b32 %r1, %f2;", 0x3E800000},
		{"mov.f32 %f1, 2.0; sqrt.rn.f32 %f2, %f1; mov.b32 %r1, %f2;", math.Float32bits(float32(math.Sqrt(2)))},
		{"mov.f32 %f1, 1.0; div.rn.f32 %f2, %f1, 0f40400000; mov.b32 %r1, %f2;", math.Float32bits(1.0 / float32(3))},
		// fma rounds once: (1+2^-23)(1-2^-23) - 1 = -2^-46, which a separate mul would lose.
		{"mov.f32 %f1, 0f3F800001; mov.f32 %f2, 0f3F7FFFFE; fma.rn.f32 %f3, %f1, %f2, 0fBF800000; mov.b32 %r1, %f3;", 0xA8800000},
		{"mov.f32 %f1, 0f3F800001; mov.f32 %f2, 0f3F7FFFFE; mul.rn.f32 %f3, %f1, %f2; sub.f32 %f3, %f3, 0f3F800000; mov.b32 %r1, %f3;", 0},
		{"mov.f32 %f1, 1.5; neg.f32 %f2, %f1; abs.f32 %f3, %f2; add.f32 %f3, %f3, %f2; mov.b32 %r1, %f2;", 0xBFC00000},
		{"mov.f32 %f1, 1.0; cvt.rn.f16.f32 %rs1, %f1; cvt.u32.u16 %r1, %rs1;", 0x3C00},
		// Directed roundings to bf16: 1 + 2^-8 + 2^-9 lies between 0x3F80 and 0x3F81, nearer
		// the second; -(that) between 0xBF81 and 0xBF80; 3e38 past bf16's largest finite.
		{"mov.b32 %f1, 0x3F80C000; cvt.rn.bf16.f32 %rs1, %f1; cvt.u32.u16 %r1, %rs1;", 0x3F81},
		{"mov.b32 %f1, 0x3F80C000; cvt.rz.bf16.f32 %rs1, %f1; cvt.u32.u16 %r1, %rs1;", 0x3F80},
		{"mov.b32 %f1, 0x3F80C000; cvt.rm.bf16.f32 %rs1, %f1; cvt.u32.u16 %r1, %rs1;", 0x3F80},
		{"mov.b32 %f1, 0x3F804000; cvt.rp.bf16.f32 %rs1, %f1; cvt.u32.u16 %r1, %rs1;", 0x3F81},
		{"mov.b32 %f1, 0xBF80C000; cvt.rz.bf16.f32 %rs1, %f1; cvt.u32.u16 %r1, %rs1;", 0xBF80},
		{"mov.b32 %f1, 0xBF80C000; cvt.rm.bf16.f32 %rs1, %f1; cvt.u32.u16 %r1, %rs1;", 0xBF81},
		{"mov.b32 %f1, 0xBF80C000; cvt.rp.bf16.f32 %rs1, %f1; cvt.u32.u16 %r1, %rs1;", 0xBF80},
		{"mov.b32 %f1, 0x7F7FFFFF; cvt.rz.bf16.f32 %rs1, %f1; cvt.u32.u16 %r1, %rs1;", 0x7F7F},
		{"mov.b32 %f1, 0x80000001; cvt.rm.bf16.f32 %rs1, %f1; cvt.u32.u16 %r1, %rs1;", 0x8001},
		{"mov.b16 %rs1, 0x3555; cvt.f32.f16 %f1, %rs1; mov.b32 %r1, %f1;", math.Float32bits(0.333251953125)},
		{"mov.f32 %f1, 0.1; cvt.f64.f32 %fd1, %f1; add.f64 %fd1, %fd1, %fd1; cvt.rn.f32.f64 %f2, %fd1; mov.b32 %r1, %f2;", math.Float32bits(0.2)},
		{"mov.u32 %r2, 3; mov.u32 %r3, 4; st.global.v2.u32 [%rd1+8], {%r2, %r3}; ld.global.v2.u32 {%r4, %r1}, [%rd1+8]; add.u32 %r1, %r1, %r4;", 7},
		{"mov.u32 %r1, 9; mov.u32 %r2, 1; setp.gt.u32 %p1, %r2, 0; @%p1 mov.u32 %r1, 5; @!%p1 mov.u32 %r1, 6;", 5},
		// prmt: the low halves of two words, the high halves, bytes reversed, a sign replicated.
		{"mov.b32 %r2, 0x44332211; mov.b32 %r3, 0x88776655; prmt.b32 %r1, %r2, %r3, 0x5410;", 0x66552211},
		{"mov.b32 %r2, 0x44332211; mov.b32 %r3, 0x88776655; prmt.b32 %r1, %r2, %r3, 0x7632;", 0x88774433},
		{"mov.b32 %r2, 0x44332211; mov.b32 %r3, 0x88776655; prmt.b32 %r1, %r2, %r3, 0x0123;", 0x11223344},
		{"mov.b32 %r2, 0x44332211; mov.b32 %r3, 0x88776655; prmt.b32 %r1, %r2, %r3, 0x8F70;", 0x00FF8811},
	}
	for _, c := range cases {
		mod := parseText(t, scalarKernel(c.body))
		mem := NewMemory()
		out := mem.Alloc(16)
		if err := Run(mod, "k", Launch{Grid: [3]int{1, 1, 1}, Block: [3]int{1, 1, 1}}, mem, []uint64{out}); err != nil {
			t.Errorf("%s: %v", c.body, err)
			continue
		}
		if got := readU32(mem, out, 1)[0]; got != c.want {
			t.Errorf("%s: got 0x%X, want 0x%X", c.body, got, c.want)
		}
	}
}

// bf16Nearest rounds x to bf16 by value, the reference cvt.rn.bf16.f32 is checked against
// (independent of the emulator's bit arithmetic): of the two bf16 around x, the nearer, the
// one with an even mantissa on a tie; past the largest finite value by half an ulp or more,
// infinity. A NaN keeps its bits, quieted.
func bf16Nearest(x float32) uint16 {
	b := math.Float32bits(x)
	if x != x {
		return uint16(b>>16) | 0x40
	}
	lo := uint16(b >> 16) // toward zero
	value := func(h uint16) float64 {
		if h&0x7fff == 0x7f80 { // one past the largest finite bf16: 2^128 as a rounding target
			return math.Copysign(math.Ldexp(1, 128), float64(x))
		}
		return float64(math.Float32frombits(uint32(h) << 16))
	}
	if float64(x) == value(lo) || math.IsInf(float64(x), 0) {
		return lo
	}
	dlo, dhi := math.Abs(float64(x)-value(lo)), math.Abs(value(lo+1)-float64(x))
	if dlo < dhi || dlo == dhi && lo&1 == 0 {
		return lo
	}
	return lo + 1
}

func TestBF16Conversion(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	var xs []float32
	for _, b := range []uint32{0, 0x80000000, 0x7f800000, 0xff800000, 0x7fc00000, 0x7f800001, 0x00000001,
		0x3f808000, 0x3f818000, 0x3f80ffff, 0x7f7fffff, 0x007fffff} {
		xs = append(xs, math.Float32frombits(b))
	}
	for len(xs) < 4096 {
		xs = append(xs, math.Float32frombits(r.Uint32()))
	}
	n := len(xs)
	k := ptx.NewKernel("bf")
	x, h, back := k.Reg(ptx.U64), k.Reg(ptx.U64), k.Reg(ptx.U64)
	k.Emit("ld.param.u64", x, ptx.Addr{Base: k.Param("x", ptx.U64)})
	k.Emit("ld.param.u64", h, ptx.Addr{Base: k.Param("h", ptx.U64)})
	k.Emit("ld.param.u64", back, ptx.Addr{Base: k.Param("back", ptx.U64)})
	i, _ := globalIndex(k)
	o4, o2 := k.Reg(ptx.U64), k.Reg(ptx.U64)
	k.Emit("mul.wide.u32", o4, i, ptx.Imm(4))
	k.Emit("mul.wide.u32", o2, i, ptx.Imm(2))
	k.Emit("add.u64", x, x, o4)
	k.Emit("add.u64", h, h, o2)
	k.Emit("add.u64", back, back, o4)
	v, hb := k.Reg(ptx.F32), k.Reg(ptx.B16)
	k.Emit("ld.global.f32", v, ptx.Addr{Base: x})
	k.Emit("cvt.rn.bf16.f32", hb, v)
	k.Emit("st.global.b16", ptx.Addr{Base: h}, hb)
	k.Emit("cvt.f32.bf16", v, hb)
	k.Emit("st.global.f32", ptx.Addr{Base: back}, v)
	mem := NewMemory()
	xa, ha, ba := allocF32(mem, xs), mem.Alloc(2*n), mem.Alloc(4*n)
	l := Launch{Grid: [3]int{n / 128, 1, 1}, Block: [3]int{128, 1, 1}}
	if err := Run(compile(t, k), "bf", l, mem, []uint64{xa, ha, ba}); err != nil {
		t.Fatal(err)
	}
	hs := mem.Bytes(ha)
	backs := readU32(mem, ba, n)
	for j := range n {
		want := bf16Nearest(xs[j])
		if got := binary.LittleEndian.Uint16(hs[2*j:]); got != want {
			t.Fatalf("bf16(%08x) = %04x, want %04x", math.Float32bits(xs[j]), got, want)
		}
		if backs[j] != uint32(want)<<16 {
			t.Fatalf("f32(bf16 %04x) = %08x", want, backs[j])
		}
	}
}

func runText(t *testing.T, text string, l Launch, mem *Memory, params ...uint64) error {
	t.Helper()
	return Run(parseText(t, text), "k", l, mem, params)
}

func TestAtomics(t *testing.T) {
	src := `.visible .entry k(.param .u64 cnt, .param .u64 perblock)
{
	.reg .pred %p<2>;
	.reg .b32 %r<8>;
	.reg .b64 %rd<6>;
	.reg .f32 %f<2>;
	.shared .align 4 .u32 local[1];
	ld.param.u64 %rd1, [cnt];
	ld.param.u64 %rd2, [perblock];
	mov.u32 %r1, %tid.x;
	mov.u32 %r2, %ctaid.x;
	atom.global.add.u32 %r3, [%rd1], 1;
	red.global.add.f32 [%rd1+4], 0f3F800000;
	mad.lo.u32 %r4, %r2, 1000, %r1;
	atom.global.max.s32 %r3, [%rd1+8], %r4;
	atom.global.min.s32 %r3, [%rd1+12], %r4;
	atom.global.add.u64 %rd3, [%rd1+16], 3;
	atom.shared.add.u32 %r3, [local], 2;
	atom.global.exch.b32 %r5, [%rd1+24], %r1;
	bar.sync 0;
	setp.ne.u32 %p1, %r1, 0;
	@%p1 bra DONE;
	ld.shared.u32 %r6, [local];
	mul.wide.u32 %rd4, %r2, 4;
	add.u64 %rd4, %rd4, %rd2;
	st.global.u32 [%rd4], %r6;
	atom.global.cas.b32 %r7, [%rd1+28], 0, 77;
DONE:
	ret;
}`
	const blocks, threads = 9, 96
	mem := NewMemory()
	cnt, per := mem.Alloc(32), mem.Alloc(4*blocks)
	binary.LittleEndian.PutUint32(mem.Bytes(cnt)[12:], 1<<30)
	l := Launch{Grid: [3]int{blocks, 1, 1}, Block: [3]int{threads, 1, 1}}
	if err := runText(t, src, l, mem, cnt, per); err != nil {
		t.Fatal(err)
	}
	c := readU32(mem, cnt, 8)
	if c[0] != blocks*threads || math.Float32frombits(c[1]) != blocks*threads {
		t.Errorf("counters %d %v, want %d", c[0], math.Float32frombits(c[1]), blocks*threads)
	}
	if c[2] != (blocks-1)*1000+threads-1 || c[3] != 0 {
		t.Errorf("max %d min %d", c[2], c[3])
	}
	if got := binary.LittleEndian.Uint64(mem.Bytes(cnt)[16:]); got != 3*blocks*threads {
		t.Errorf("u64 sum %d", got)
	}
	if c[6] >= threads || c[7] != 77 {
		t.Errorf("exch left %d, cas left %d", c[6], c[7])
	}
	for b, v := range readU32(mem, per, blocks) {
		if v != 2*threads {
			t.Errorf("block %d shared count %d, want %d", b, v, 2*threads)
		}
	}
}

// TestLoop sums 0..tid with a backward branch and stores through a u8 store too.
func TestLoop(t *testing.T) {
	src := `.visible .entry k(.param .u64 out, .param .u64 bytes)
{
	.reg .pred %p<3>;
	.reg .b16 %rs<2>;
	.reg .b32 %r<6>;
	.reg .b64 %rd<6>;
	ld.param.u64 %rd1, [out];
	ld.param.u64 %rd2, [bytes];
	mov.u32 %r1, %tid.x;
	mov.u32 %r2, 0;
	mov.u32 %r3, 0;
LOOP:
	setp.gt.u32 %p1, %r3, %r1;
	@%p1 bra.uni END;
	add.u32 %r2, %r2, %r3;
	add.u32 %r3, %r3, 1;
	bra LOOP;
END:
	mul.wide.u32 %rd3, %r1, 4;
	add.u64 %rd3, %rd3, %rd1;
	st.global.u32 [%rd3], %r2;
	cvt.u64.u32 %rd4, %r1;
	add.u64 %rd4, %rd4, %rd2;
	cvt.u16.u32 %rs1, %r2;
	st.global.u8 [%rd4], %rs1;
	ld.global.u8 %r4, [%rd4];
	setp.ne.u32 %p2, %r4, %r2;
	@%p2 st.global.u32 [%rd3], 0;
	exit;
}`
	const n = 20
	mem := NewMemory()
	out, bytes := mem.Alloc(4*n), mem.Alloc(n)
	if err := runText(t, src, Launch{Grid: [3]int{1, 1, 1}, Block: [3]int{n, 1, 1}}, mem, out, bytes); err != nil {
		t.Fatal(err)
	}
	got := readU32(mem, out, n)
	for i := range n {
		want := uint32(i * (i + 1) / 2)
		if i > 22 { // results above 255 fail the u8 round trip and are zeroed
			want = 0
		}
		if got[i] != want || mem.Bytes(bytes)[i] != byte(want) {
			t.Errorf("thread %d: sum %d byte %d, want %d", i, got[i], mem.Bytes(bytes)[i], want)
		}
	}
}

func TestShuffleModes(t *testing.T) {
	src := `.visible .entry k(.param .u64 out)
{
	.reg .b32 %r<8>;
	.reg .b64 %rd<4>;
	ld.param.u64 %rd1, [out];
	mov.u32 %r1, %laneid;
	mov.u32 %r7, %tid.x;
	mul.wide.u32 %rd2, %r7, 16;
	add.u64 %rd2, %rd2, %rd1;
	shfl.sync.down.b32 %r2, %r1, 3, 0x1f, -1;
	shfl.sync.up.b32 %r3, %r1, 3, 0, -1;
	shfl.sync.idx.b32 %r4, %r1, 5, 0x1f, -1;
	shfl.sync.bfly.b32 %r5, %r1, 6, 0x1f, -1;
	st.global.v4.u32 [%rd2], {%r2, %r3, %r4, %r5};
	ret;
}`
	mem := NewMemory()
	out := mem.Alloc(16 * 64)
	if err := runText(t, src, Launch{Grid: [3]int{1, 1, 1}, Block: [3]int{64, 1, 1}}, mem, out); err != nil {
		t.Fatal(err)
	}
	got := readU32(mem, out, 4*64)
	for tid := range 64 {
		l := uint32(tid % 32)
		down, up := l+3, l-3
		if l+3 > 31 {
			down = l
		}
		if l < 3 {
			up = l
		}
		want := []uint32{down, up, 5, l ^ 6}
		for j, w := range want {
			if got[4*tid+j] != w {
				t.Errorf("thread %d result %d: got %d want %d", tid, j, got[4*tid+j], w)
			}
		}
	}
}

func TestFaults(t *testing.T) {
	one := Launch{Grid: [3]int{2, 1, 1}, Block: [3]int{40, 1, 1}}
	cases := []struct {
		name, body string
		want       []string
	}{
		{"out of bounds", `mov.u32 %r1, %tid.x; mul.wide.u32 %rd2, %r1, 4; add.u64 %rd2, %rd2, %rd1; st.global.u32 [%rd2], %r1;`,
			[]string{"instr 4 (st.global.u32 [%rd2], %r1)", "block (0,0,0) thread (32,0,0)", "outside every allocation"}},
		{"misaligned", `ld.global.u32 %r1, [%rd1+2];`, []string{"misaligned 4-byte"}},
		{"prefetch out of bounds", `prefetch.global.L2 [%rd1+128];`, []string{"prefetch at 0x", "outside every allocation"}},
		{"shared out of window", `mov.u32 %r1, 64; st.shared.u32 [%r1], %r1;`, []string{"outside the 16-byte shared window"}},
		{"division by zero", `mov.u32 %r1, 0; div.u32 %r1, %r1, %r1;`, []string{"division by zero"}},
		{"deadlock", `mov.u32 %r1, %laneid; setp.lt.u32 %p1, %r1, 16; @%p1 bra SH; bar.sync 0; ret; SH: shfl.sync.bfly.b32 %r2, %r1, 1, 0x1f, -1;`,
			[]string{"deadlock", "waits at a barrier", "waits at a shuffle"}},
		{"runaway loop", `L: bra L;`, []string{"runaway loop"}},
		{"undeclared register", `mov.u32 %r9, 1;`, []string{"register %r9 is not declared"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			src := `.visible .entry k(.param .u64 out)
{
	.reg .pred %p<2>;
	.reg .b32 %r<4>;
	.reg .b64 %rd<4>;
	.shared .align 16 .f32 sm[4];
	ld.param.u64 %rd1, [out];
	` + c.body + `
	ret;
}`
			mem := NewMemory()
			out := mem.Alloc(4 * 32)
			wantError(t, runText(t, src, one, mem, out), c.want...)
		})
	}
}

// wantError fails t unless err is an error whose text holds every one of want.
func wantError(t *testing.T, err error, want ...string) {
	t.Helper()
	if err == nil {
		t.Fatal("no error")
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q lacks %q", err, w)
		}
	}
}

// TestBuiltModule runs a module straight from the builder, without printing and parsing.
func TestBuiltModule(t *testing.T) {
	k := vecAdd()
	k.Emit("ret")
	mem := NewMemory()
	a, b, c := allocF32(mem, []float32{1, 2}), allocF32(mem, []float32{3, 4}), mem.Alloc(8)
	l := Launch{Grid: [3]int{1, 1, 1}, Block: [3]int{2, 1, 1}}
	if err := Run(ptx.NewModule(k), "vadd", l, mem, []uint64{a, b, c, 1, 2}); err != nil {
		t.Fatal(err)
	}
	if got := readF32(mem, c, 2); got[0] != 4 || got[1] != 6 {
		t.Fatalf("got %v", got)
	}
}

// TestPrefetchRecorded: a prefetch inside an allocation changes nothing and, while the memory
// records, leaves its address (any byte of the allocation, its last one too); before
// RecordReads and after a new call of it nothing old is kept.
func TestPrefetchRecorded(t *testing.T) {
	src := `.visible .entry k(.param .u64 buf)
{
	.reg .b32 %r<2>;
	.reg .b64 %rd<4>;
	ld.param.u64 %rd1, [buf];
	mov.u32 %r1, %tid.x;
	mul.wide.u32 %rd2, %r1, 40;
	add.u64 %rd2, %rd2, %rd1;
	prefetch.global.L2 [%rd2+3];
	ret;
}`
	mem := NewMemory()
	buf := mem.Alloc(84) // thread 2 asks for byte 83, the last
	l := Launch{Grid: [3]int{1, 1, 1}, Block: [3]int{3, 1, 1}}
	if err := runText(t, src, l, mem, buf); err != nil {
		t.Fatal(err)
	}
	if got := mem.Prefetched(); len(got) != 0 {
		t.Fatalf("recorded %v before RecordReads", got)
	}
	mem.RecordReads()
	if err := runText(t, src, l, mem, buf); err != nil {
		t.Fatal(err)
	}
	got := mem.Prefetched()
	slices.Sort(got)
	if want := []uint64{buf + 3, buf + 43, buf + 83}; !slices.Equal(got, want) {
		t.Fatalf("prefetched %x, want %x", got, want)
	}
	mem.RecordReads()
	if got := mem.Prefetched(); len(got) != 0 {
		t.Fatalf("RecordReads kept %v", got)
	}
}

// TestEarlyLoadsRecorded: while the memory records, each thread's global loads before its
// griddepcontrol.wait are kept with their sizes (a vector load as one span), those after it
// and shared loads are not: thread 1 loads twice before its wait, thread 0 once.
func TestEarlyLoadsRecorded(t *testing.T) {
	src := `.visible .entry k(.param .u64 buf)
{
	.reg .pred %p<2>;
	.reg .b32 %r<8>;
	.reg .b64 %rd<4>;
	.shared .align 4 .b32 s[1];
	ld.param.u64 %rd1, [buf];
	mov.u32 %r1, %tid.x;
	mul.wide.u32 %rd2, %r1, 16;
	add.u64 %rd2, %rd2, %rd1;
	ld.global.v2.u32 {%r2, %r3}, [%rd2];
	ld.shared.u32 %r6, [s];
	setp.eq.u32 %p1, %r1, 0;
	@%p1 bra wait;
	ld.global.u32 %r4, [%rd2+8];
wait:
	griddepcontrol.wait;
	ld.global.u32 %r5, [%rd2+12];
	griddepcontrol.launch_dependents;
	ret;
}`
	mem := NewMemory()
	buf := mem.Alloc(32)
	l := Launch{Grid: [3]int{1, 1, 1}, Block: [3]int{2, 1, 1}}
	mem.RecordReads()
	if err := runText(t, src, l, mem, buf); err != nil {
		t.Fatal(err)
	}
	got := mem.EarlyLoads()
	slices.SortFunc(got, func(a, b Span) int { return int(a.Addr - b.Addr) })
	if want := []Span{{buf, 8}, {buf + 16, 8}, {buf + 24, 4}}; !slices.Equal(got, want) {
		t.Fatalf("early loads %v, want %v", got, want)
	}
	mem.RecordReads()
	if got := mem.EarlyLoads(); len(got) != 0 {
		t.Fatalf("RecordReads kept %v", got)
	}
}

func TestRunRejectsBadCalls(t *testing.T) {
	mod := compile(t, vecAdd())
	mem := NewMemory()
	l := Launch{Grid: [3]int{1, 1, 1}, Block: [3]int{32, 1, 1}}
	if err := Run(mod, "nope", l, mem, nil); err == nil || !strings.Contains(err.Error(), `no entry "nope"`) {
		t.Errorf("missing entry: %v", err)
	}
	if err := Run(mod, "vadd", l, mem, []uint64{1}); err == nil || !strings.Contains(err.Error(), "takes 5 parameters") {
		t.Errorf("wrong params: %v", err)
	}
	if err := Run(mod, "vadd", Launch{Grid: [3]int{1, 1, 1}, Block: [3]int{2048, 1, 1}}, mem, make([]uint64, 5)); err == nil {
		t.Error("oversized block accepted")
	}
}

func TestMemory(t *testing.T) {
	m := NewMemory()
	a, b, z := m.Alloc(10), m.Alloc(300), m.Alloc(0)
	if a == 0 || a%256 != 0 || b%256 != 0 || b < a+10 || z == b {
		t.Fatalf("addresses %x %x %x", a, b, z)
	}
	if len(m.Bytes(a)) != 10 || len(m.Bytes(a+3)) != 7 || m.Bytes(a+10) != nil || m.Bytes(0) != nil {
		t.Fatal("bad views")
	}
	if m.Bytes(z) == nil || len(m.Bytes(z)) != 0 {
		t.Fatal("empty allocation has no view")
	}
}

// BenchmarkInterpreter reports the cost of one thread-instruction in a tight f32 loop.
func BenchmarkInterpreter(b *testing.B) {
	src := `.visible .entry k(.param .u64 out)
{
	.reg .pred %p<2>;
	.reg .b32 %r<4>;
	.reg .b64 %rd<4>;
	.reg .f32 %f<4>;
	ld.param.u64 %rd1, [out];
	mov.u32 %r1, 0;
	mov.f32 %f1, 0f00000000;
L:
	fma.rn.f32 %f1, %f1, 0f3F7FFFFF, 0f3F800000;
	add.u32 %r1, %r1, 1;
	setp.lt.u32 %p1, %r1, 1000;
	@%p1 bra L;
	mov.u32 %r2, %tid.x;
	mul.wide.u32 %rd2, %r2, 4;
	add.u64 %rd2, %rd2, %rd1;
	st.global.f32 [%rd2], %f1;
	ret;
}`
	mod, err := ptx.Parse(".version 8.0\n.target sm_90\n.address_size 64\n" + src)
	if err != nil {
		b.Fatal(err)
	}
	mem := NewMemory()
	out := mem.Alloc(4 * 256)
	l := Launch{Grid: [3]int{4, 1, 1}, Block: [3]int{256, 1, 1}}
	b.ResetTimer()
	for range b.N {
		if err := Run(mod, "k", l, mem, []uint64{out}); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/(4*256*4000), "ns/thread-instr")
}

// TestNamedBarrier: warps 0-1 meet at barrier 1 (64 threads) while warp 2 waits at an
// mbarrier that thread 0 arrives on only after that barrier; then all three meet at bar 0.
// Each thread stores 1 + how many of warps 0-1 had written their flag when it passed.
func TestNamedBarrier(t *testing.T) {
	k := ptx.NewKernel("named")
	out := k.Reg(ptx.U64)
	k.Emit("ld.param.u64", out, ptx.Addr{Base: k.Param("out", ptx.U64)})
	flags := k.DeclareShared("flags", ptx.U32, 96)
	bar := k.DeclareShared("bar", ptx.B64, 1)
	tid, base, v, n, i := k.Reg(ptx.U32), k.Reg(ptx.U32), k.Reg(ptx.U32), k.Reg(ptx.U32), k.Reg(ptx.U32)
	k.Emit("mov.u32", tid, ptx.TidX)
	k.Emit("mov.u32", base, flags)
	t0, mine, p := k.Reg(ptx.Pred), k.Reg(ptx.Pred), k.Reg(ptx.Pred)
	k.Emit("setp.eq.u32", t0, tid, ptx.Imm(0))
	k.Emit("setp.lt.u32", mine, tid, ptx.Imm(64))
	k.EmitIf(t0, false, "mbarrier.init.shared::cta.b64", ptx.Addr{Base: bar}, ptx.Imm(1))
	k.Emit("bar.sync", ptx.Imm(0))
	waiter := k.NewLabel("waiter")
	k.EmitIf(mine, true, "bra", ptx.Sym(waiter))
	a := k.Reg(ptx.U32)
	k.Emit("mad.lo.u32", a, tid, ptx.Imm(4), base)
	k.Emit("st.shared.u32", ptx.Addr{Base: a}, ptx.Imm(1))
	k.Emit("bar.sync", ptx.Imm(1), ptx.Imm(64))
	st := k.Reg(ptx.B64)
	k.EmitIf(t0, false, "mbarrier.arrive.shared::cta.b64", st, ptx.Addr{Base: bar})
	join := k.NewLabel("join")
	k.Emit("bra", ptx.Sym(join))
	k.Label(waiter)
	w := k.NewLabel("w")
	k.Label(w)
	k.Emit("mbarrier.try_wait.parity.shared::cta.b64", p, ptx.Addr{Base: bar}, ptx.Imm(0))
	k.EmitIf(p, true, "bra", ptx.Sym(w))
	k.Label(join)
	k.Emit("mov.u32", n, ptx.Imm(1))
	k.Emit("mov.u32", i, ptx.Imm(0))
	loop := k.NewLabel("sum")
	k.Label(loop)
	k.Emit("mad.lo.u32", a, i, ptx.Imm(4), base)
	k.Emit("ld.shared.u32", v, ptx.Addr{Base: a})
	k.Emit("add.u32", n, n, v)
	k.Emit("add.u32", i, i, ptx.Imm(1))
	k.Emit("setp.lt.u32", p, i, ptx.Imm(64))
	k.EmitIf(p, false, "bra", ptx.Sym(loop))
	k.Emit("bar.sync", ptx.Imm(0))
	o := k.Reg(ptx.U64)
	k.Emit("mul.wide.u32", o, tid, ptx.Imm(4))
	k.Emit("add.u64", o, o, out)
	k.Emit("st.global.u32", ptx.Addr{Base: o}, n)
	mem := NewMemory()
	outA := mem.Alloc(4 * 96)
	if err := Run(compile(t, k), "named", Launch{Grid: [3]int{1, 1, 1}, Block: [3]int{96, 1, 1}}, mem, []uint64{outA}); err != nil {
		t.Fatal(err)
	}
	b := mem.Bytes(outA)
	for th := range 96 {
		if got := binary.LittleEndian.Uint32(b[4*th:]); got != 65 {
			t.Fatalf("thread %d saw %d flags, want 64", th, got-1)
		}
	}
}
