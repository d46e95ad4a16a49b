package emu

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"xmix/ptx"
)

// wgmmaCase configures wgmmaGemm: the GEMM's N, how the tensor copies lay A and B out in
// shared memory (the 128-byte swizzle, or 8x16-byte core matrices without swizzle), whether
// the descriptors say the 128-byte swizzle where the copies wrote densely (a layout mismatch
// that must not pass), whether the first k-step clears the accumulators (scale-d a false
// predicate) and whether some steps negate an operand.
type wgmmaCase struct {
	n         int
	swizzle   bool
	mismatch  bool
	zeroFirst bool
	negate    bool
}

// wgmmaInit is what the accumulators hold before the first k-step.
const wgmmaInit = 0.5

// wgmmaSign is the sign imm-scale-a and imm-scale-b give k-step j's products when c.negate:
// step 1 negates A, step 2 B, step 3 both.
func wgmmaSign(c wgmmaCase, j int) (a, b int64) {
	if !c.negate {
		return 1, 1
	}
	return [4]int64{1, -1, 1, -1}[j], [4]int64{1, 1, -1, -1}[j]
}

// wgmmaGemm is one warpgroup (128 threads) computing D[64xn] = A[64x64] . B[nx64]^T plus
// wgmmaInit: thread 0 loads A and B (bf16, rows of 64 k) into dynamic shared memory with
// tensor copies, everyone waits for the mbarrier, then the warpgroup runs four wgmma k-steps
// of 16 (the descriptors' start advancing 32 bytes a step inside the swizzled 128-byte rows,
// or two core matrices without swizzle) and each thread stores its accumulators to out,
// row-major 64xn f32, where the PTX ISA's fragment table puts them:
//
//	row = 16*warp + lane/4 + 8*((i/2)%2),  col = 8*(i/4) + 2*(lane%4) + i%2.
func wgmmaGemm(c wgmmaCase) *ptx.Kernel {
	n := c.n
	k := ptx.NewKernel("gemm")
	ma, mb, out := k.Reg(ptx.U64), k.Reg(ptx.U64), k.Reg(ptx.U64)
	k.Emit("ld.param.u64", ma, ptx.Addr{Base: k.Param("mapa", ptx.U64)})
	k.Emit("ld.param.u64", mb, ptx.Addr{Base: k.Param("mapb", ptx.U64)})
	k.Emit("ld.param.u64", out, ptx.Addr{Base: k.Param("out", ptx.U64)})
	bars := k.DeclareShared("bars", ptx.B64, 1)
	smem := k.DeclareDynamicShared("smem", 1024)
	tid, sa, sb, c0, c1 := k.Reg(ptx.U32), k.Reg(ptx.U32), k.Reg(ptx.U32), k.Reg(ptx.U32), k.Reg(ptx.U32)
	p := k.Reg(ptx.Pred)
	st := k.Reg(ptx.B64)
	k.Emit("mov.u32", tid, ptx.TidX)
	k.Emit("mov.u32", sa, smem)
	k.Emit("add.u32", sb, sa, ptx.Imm(64*64*2)) // B after A's 8 KiB, still 1024-aligned
	k.Emit("setp.eq.u32", p, tid, ptx.Imm(0))
	load := k.NewLabel("load")
	k.EmitIf(p, true, "bra", ptx.Sym(load))
	k.Emit("mbarrier.init.shared::cta.b64", ptx.Addr{Base: bars}, ptx.Imm(1))
	k.Emit("mbarrier.arrive.expect_tx.shared::cta.b64", st, ptx.Addr{Base: bars}, ptx.Imm(int64((64+n)*64*2)))
	k.Emit("mov.u32", c1, ptx.Imm(0))
	if c.swizzle || c.mismatch {
		// One box each: all 64 k of every row.
		k.Emit("mov.u32", c0, ptx.Imm(0))
		k.Emit(tensorOp, ptx.Addr{Base: sa}, ptx.TensorAddr{Map: ma, Coords: ptx.Vec{c0, c1}}, ptx.Addr{Base: bars})
		k.Emit(tensorOp, ptx.Addr{Base: sb}, ptx.TensorAddr{Map: mb, Coords: ptx.Vec{c0, c1}}, ptx.Addr{Base: bars})
	} else {
		// Boxes of 8 k (16 bytes) by every row: box c is the column of core matrices for
		// k = 8c..8c+7, rows 16 bytes apart; A's columns are 64*16 bytes apart, B's n*16.
		for j := range 8 {
			k.Emit("mov.u32", c0, ptx.Imm(int64(8*j)))
			k.Emit(tensorOp, ptx.Addr{Base: sa, Offset: int64(j * 64 * 16)}, ptx.TensorAddr{Map: ma, Coords: ptx.Vec{c0, c1}}, ptx.Addr{Base: bars})
			k.Emit(tensorOp, ptx.Addr{Base: sb, Offset: int64(j * n * 16)}, ptx.TensorAddr{Map: mb, Coords: ptx.Vec{c0, c1}}, ptx.Addr{Base: bars})
		}
	}
	k.Label(load)
	k.Emit("bar.sync", ptx.Imm(0))
	wait := k.NewLabel("wait")
	k.Label(wait)
	k.Emit("mbarrier.try_wait.parity.shared::cta.b64", p, ptx.Addr{Base: bars}, ptx.Imm(0))
	k.EmitIf(p, true, "bra", ptx.Sym(wait))

	// Descriptors: the start address >> 4 in bits 0-13, LBO >> 4 in 16-29, SBO >> 4 in
	// 32-45, the layout in 62-63.
	desc := func(s ptx.Reg, lbo, sbo int64, layout int64) ptx.Reg {
		d := k.Reg(ptx.U64)
		k.Emit("cvt.u64.u32", d, s)
		k.Emit("shr.u64", d, d, ptx.Imm(4))
		k.Emit("and.b64", d, d, ptx.Imm(0x3fff))
		k.Emit("or.b64", d, d, ptx.Imm(lbo>>4<<16|sbo>>4<<32|layout<<62))
		return d
	}
	var da, db ptx.Reg
	var stepA, stepB int64 // the start's advance per k-step, >> 4
	if c.swizzle || c.mismatch {
		// 8 rows of 128 bytes make a 1024-byte swizzle atom: SBO 1024; LBO is unused (1, as
		// CUTLASS writes it).
		da, db = desc(sa, 16, 1024, 1), desc(sb, 16, 1024, 1)
		stepA, stepB = 32>>4, 32>>4
	} else {
		// Core matrices 128 bytes apart along the rows (SBO), a column of them apart along k
		// (LBO); a k-step of 16 is two columns.
		da, db = desc(sa, 64*16, 128, 0), desc(sb, int64(n*16), 128, 0)
		stepA, stepB = 2*64*16>>4, int64(2*n*16>>4)
	}
	acc := ptx.Vec(k.Regs(ptx.F32, n/2))
	for _, r := range acc {
		k.Emit("mov.f32", r, ptx.F32Imm(wgmmaInit))
	}
	never := k.Reg(ptx.Pred)
	k.Emit("setp.ne.u32", never, tid, tid)
	op := fmt.Sprintf("wgmma.mma_async.sync.aligned.m64n%dk16.f32.bf16.bf16", n)
	k.Emit("wgmma.fence.sync.aligned")
	for j := range 4 {
		dj, ej := k.Reg(ptx.U64), k.Reg(ptx.U64)
		k.Emit("add.u64", dj, da, ptx.Imm(int64(j)*stepA))
		k.Emit("add.u64", ej, db, ptx.Imm(int64(j)*stepB))
		var scaleD ptx.Operand = ptx.Imm(1)
		if j == 0 && c.zeroFirst {
			scaleD = never
		}
		sA, sB := wgmmaSign(c, j)
		k.Emit(op, acc, dj, ej, scaleD, ptx.Imm(sA), ptx.Imm(sB), ptx.Imm(0), ptx.Imm(0))
	}
	k.Emit("wgmma.commit_group.sync.aligned")
	k.Emit("wgmma.wait_group.sync.aligned", ptx.Imm(0))

	// base = out + 4*(row0*n + col0), row0 = 16*warp + lane/4, col0 = 2*(lane%4).
	row, col, base := k.Reg(ptx.U32), k.Reg(ptx.U32), k.Reg(ptx.U64)
	k.Emit("shr.u32", row, tid, ptx.Imm(5))
	k.Emit("shl.b32", row, row, ptx.Imm(4))
	k.Emit("and.b32", col, tid, ptx.Imm(31))
	k.Emit("shr.u32", col, col, ptx.Imm(2))
	k.Emit("add.u32", row, row, col)
	k.Emit("and.b32", col, tid, ptx.Imm(3))
	k.Emit("shl.b32", col, col, ptx.Imm(1))
	k.Emit("mad.lo.u32", row, row, ptx.Imm(int64(n)), col)
	k.Emit("mul.wide.u32", base, row, ptx.Imm(4))
	k.Emit("add.u64", base, base, out)
	for i, r := range acc {
		off := 8*(i/2%2)*n + 8*(i/4) + i%2
		k.Emit("st.global.f32", ptx.Addr{Base: base, Offset: int64(4 * off)}, r)
	}
	return k
}

// putBF16 stores rows of values rounded to bf16 and returns the address and the values as
// bf16 holds them.
func putBF16(mem *Memory, v [][]float32) (uint64, [][]float64) {
	cols := len(v[0])
	a := mem.Alloc(2 * cols * len(v))
	b := mem.Bytes(a)
	exact := make([][]float64, len(v))
	for i, row := range v {
		exact[i] = make([]float64, cols)
		for j, x := range row {
			h := bf16Nearest(x)
			binary.LittleEndian.PutUint16(b[2*(i*cols+j):], h)
			exact[i][j] = float64(math.Float32frombits(uint32(h) << 16))
		}
	}
	return a, exact
}

// runWgmmaGemm runs wgmmaGemm on A (64x64) and B (nx64) and returns D (64xn).
func runWgmmaGemm(t *testing.T, c wgmmaCase, A, B [][]float32) ([]float32, error) {
	t.Helper()
	mem := NewMemory()
	pa, _ := putBF16(mem, A)
	pb, _ := putBF16(mem, B)
	boxK, swz := 8, 0
	if c.swizzle || c.mismatch {
		boxK = 64
	}
	if c.swizzle {
		swz = 128
	}
	mapA := putTensorMap(t, mem, pa, [2]int{64, 64}, 128, [2]int{boxK, 64}, 2, swz)
	mapB := putTensorMap(t, mem, pb, [2]int{64, c.n}, 128, [2]int{boxK, c.n}, 2, swz)
	out := mem.Alloc(4 * 64 * c.n)
	l := Launch{Grid: [3]int{1, 1, 1}, Block: [3]int{128, 1, 1}, Shared: (64 + c.n) * 64 * 2}
	if err := Run(compile(t, wgmmaGemm(c)), "gemm", l, mem, []uint64{mapA, mapB, out}); err != nil {
		return nil, err
	}
	return readF32(mem, out, 64*c.n), nil
}

// wgmmaErr is the largest |D - want| relative to the magnitude of the terms, want being the
// naive float64 product of the bf16 values plus what the accumulators started with.
func wgmmaErr(c wgmmaCase, A, B [][]float32, D []float32) float64 {
	round := func(v [][]float32) [][]float64 {
		out := make([][]float64, len(v))
		for i, row := range v {
			for _, x := range row {
				out[i] = append(out[i], bf(x))
			}
		}
		return out
	}
	a, b := round(A), round(B)
	worst := 0.0
	for m := range 64 {
		for n := range c.n {
			want, mag := wgmmaInit, wgmmaInit
			if c.zeroFirst {
				want, mag = 0, 0
			}
			for k := range 64 {
				sA, sB := wgmmaSign(c, k/16)
				p := float64(sA*sB) * a[m][k] * b[n][k]
				want += p
				mag += math.Abs(p)
			}
			worst = max(worst, math.Abs(float64(D[m*c.n+n])-want)/max(mag, 1e-30))
		}
	}
	return worst
}

func randRows(r *rand.Rand, rows, cols int) [][]float32 {
	v := make([][]float32, rows)
	for i := range v {
		v[i] = make([]float32, cols)
		for j := range v[i] {
			v[i][j] = r.Float32()*2 - 1
		}
	}
	return v
}

// TestWgmmaMatchesNaiveProduct: the operands as a 128-byte-swizzled tensor copy writes them
// (and as core matrices without swizzle), four k-steps, against a naive product, for N = 8,
// 32 and 128; with the accumulators kept or cleared by scale-d, and with operands negated.
func TestWgmmaMatchesNaiveProduct(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 10))
	for _, c := range []wgmmaCase{
		{n: 8, swizzle: true},
		{n: 32, swizzle: true},
		{n: 128, swizzle: true},
		{n: 32, swizzle: true, zeroFirst: true, negate: true},
		{n: 8},
		{n: 32},
		{n: 128, zeroFirst: true, negate: true},
	} {
		t.Run(fmt.Sprintf("%+v", c), func(t *testing.T) {
			A, B := randRows(r, 64, 64), randRows(r, c.n, 64)
			D, err := runWgmmaGemm(t, c, A, B)
			if err != nil {
				t.Fatal(err)
			}
			if e := wgmmaErr(c, A, B, D); e > 1e-6 {
				t.Fatalf("relative error %g", e)
			}
			// The check sees the options: the same D read as if the accumulators had
			// started otherwise, or nothing were negated, fails it.
			other := c
			other.zeroFirst = !c.zeroFirst
			if e := wgmmaErr(other, A, B, D); e < 1e-3 {
				t.Fatalf("D also matches with zeroFirst %v (error %g)", other.zeroFirst, e)
			}
			if c.negate {
				other = c
				other.negate = false
				if e := wgmmaErr(other, A, B, D); e < 1e-3 {
					t.Fatalf("D also matches without negation (error %g)", e)
				}
			}
		})
	}
}

// TestWgmmaSwizzleMatters: operands copied densely but described as 128-byte swizzled give a
// wrong product, so the swizzled case above checks the swizzle and not just the data.
func TestWgmmaSwizzleMatters(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 12))
	c := wgmmaCase{n: 32, mismatch: true}
	A, B := randRows(r, 64, 64), randRows(r, c.n, 64)
	D, err := runWgmmaGemm(t, c, A, B)
	if err != nil {
		t.Fatal(err)
	}
	if e := wgmmaErr(c, A, B, D); e < 1e-3 {
		t.Fatalf("dense operands read through the swizzle match the product (error %g)", e)
	}
}

// TestWgmmaLayoutSpotChecks pins single elements: one-hot A and B make D one-hot, so each case
// names the warp, lane and register an element of D lives in.
func TestWgmmaLayoutSpotChecks(t *testing.T) {
	for _, c := range []struct{ m, k, n int }{{0, 0, 0}, {41, 37, 13}, {63, 63, 31}, {17, 16, 8}, {8, 15, 1}, {30, 50, 22}} {
		for _, swz := range []bool{true, false} {
			wc := wgmmaCase{n: 32, swizzle: swz, zeroFirst: true}
			A, B := randRows(rand.New(rand.NewPCG(0, 0)), 64, 64), randRows(rand.New(rand.NewPCG(0, 0)), 32, 64)
			for _, v := range [][][]float32{A, B} {
				for _, row := range v {
					clear(row)
				}
			}
			A[c.m][c.k], B[c.n][c.k] = 2, 3
			D, err := runWgmmaGemm(t, wc, A, B)
			if err != nil {
				t.Fatal(err)
			}
			for m := range 64 {
				for n := range 32 {
					want := float32(0)
					if m == c.m && n == c.n {
						want = 6
					}
					if D[m*32+n] != want {
						t.Fatalf("swizzle %v, A[%d][%d]*B[%d][%d]: D[%d][%d] = %g, want %g", swz, c.m, c.k, c.n, c.k, m, n, D[m*32+n], want)
					}
				}
			}
		}
	}
	// Warp 2's lane 6 register 7 holds D[41][13]: row 32 + 6/4 + 8*((7/2)%2) = 41, column
	// 8*(7/4) + 2*(6%4) + 7%2 = 13 (the ISA's table, restated); register 0 of lane 0 is the
	// warp's first element.
	for _, c := range []struct{ lane, i, row, col int }{{6, 7, 9, 13}, {0, 0, 0, 0}, {31, 63, 15, 127}, {5, 2, 9, 2}} {
		if row, col := wgmmaD(c.lane, c.i); row != c.row || col != c.col {
			t.Errorf("wgmmaD(%d, %d) = (%d,%d), want (%d,%d)", c.lane, c.i, row, col, c.row, c.col)
		}
	}
}

// wgmmaFault is a kernel whose descriptors come from its parameters: pre runs before one
// m64n8k16 wgmma on 8 KiB of static shared memory.
func wgmmaFault(pre string) string {
	return `.visible .entry k(.param .u64 da, .param .u64 db)
{
	.reg .pred %p<2>;
	.reg .b32 %r<4>;
	.reg .b64 %rd<4>;
	.reg .f32 %f<5>;
	.shared .align 1024 .b8 smem[8192];
	ld.param.u64 %rd1, [da];
	ld.param.u64 %rd2, [db];
	` + pre + `
	wgmma.fence.sync.aligned;
	wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {%f1, %f2, %f3, %f4}, %rd1, %rd2, 1, 1, 1, 0, 0;
	wgmma.commit_group.sync.aligned;
	wgmma.wait_group.sync.aligned 0;
	ret;
}`
}

func TestWgmmaFaults(t *testing.T) {
	const swz128 = 1 << 62
	const sbo1024 = 64 << 32
	good := uint64(swz128 | sbo1024)
	wg := Launch{Grid: [3]int{1, 1, 1}, Block: [3]int{128, 1, 1}}
	cases := []struct {
		name   string
		pre    string
		l      Launch
		da, db uint64
		want   []string
	}{
		{"fine", "", wg, good, good | 0x100, nil},
		{"fine without swizzle", "", wg, 0x100 | 8<<32 | 64<<16, 0x80 | 8<<32, nil},
		{"A past the window", "", wg, swz128 | 188<<32, good, []string{
			"instr 3 (wgmma.mma_async", "block (0,0,0) thread (32,0,0)",
			"wgmma operand A (descriptor 0x400000bc00000000) row 24 k 0: shared access of 2 bytes at 0x2320 is outside the 8192-byte shared window"}},
		{"B start past the window", "", wg, good, good | 0x3ff0, []string{"wgmma operand B (descriptor 0x4000004000003ff0) row 0 k 0", "at 0x3ff60 is outside"}},
		{"64-byte swizzle", "", wg, 2<<62 | sbo1024, good, []string{"wgmma operand A: descriptor 0x8000004000000000: layout 2 (the 64-byte swizzle) is not supported (only 0, no swizzle, and 1, the 128-byte swizzle)"}},
		{"32-byte swizzle", "", wg, good, 3<<62 | sbo1024, []string{"wgmma operand B", "layout 3 (the 32-byte swizzle) is not supported"}},
		{"base offset", "", wg, good | 1<<49, good, []string{"base offset 1 is not supported"}},
		{"reserved bits", "", wg, good | 1<<15, good, []string{"reserved bits 0x8000 are set"}},
		{"descriptors differ across lanes", "mov.u32 %r1, %laneid; setp.eq.u32 %p1, %r1, 5; @%p1 add.u64 %rd1, %rd1, 2;", wg, good, good, []string{
			"thread (5,0,0)", "descriptors 0x4000004000000002, 0x4000004000000000 and scale-d 1 differ from lane 0's 0x4000004000000000"}},
		{"half a warp", "", Launch{Grid: [3]int{1, 1, 1}, Block: [3]int{16, 1, 1}}, good, good, []string{"needs all 32 lanes of the warp, 16 of 32 are here"}},
		{"a lane skips it", "mov.u32 %r1, %laneid; setp.eq.u32 %p1, %r1, 3; @%p1 ret;", wg, good, good, []string{"needs all 32 lanes of the warp, 31 of 32 are here"}},
		{"two warps", "", Launch{Grid: [3]int{1, 1, 1}, Block: [3]int{64, 1, 1}}, good, good, []string{"wgmma needs the 4 warps of warpgroup 0 (threads 0..127); the block has 64 threads"}},
		{"a warp past the last warpgroup", "", Launch{Grid: [3]int{1, 1, 1}, Block: [3]int{160, 1, 1}}, good, good, []string{"thread (128,0,0)", "warpgroup 1 (threads 128..255); the block has 160 threads"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := runText(t, wgmmaFault(c.pre), c.l, NewMemory(), c.da, c.db)
			if c.want == nil {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			wantError(t, err, c.want...)
		})
	}
}
