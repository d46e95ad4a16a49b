package emu

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"
)

// mmaKernel loads each lane's fragments from per-lane slots (a: 4 words, b: 2 words, c: 4
// f32), runs one mma and stores d (4 f32) to the lane's slot.
const mmaKernel = `.visible .entry k(.param .u64 a, .param .u64 b, .param .u64 c, .param .u64 d)
{
	.reg .b32 %r<12>;
	.reg .b64 %rd<12>;
	.reg .f32 %f<12>;
	ld.param.u64 %rd1, [a];
	ld.param.u64 %rd2, [b];
	ld.param.u64 %rd3, [c];
	ld.param.u64 %rd4, [d];
	mov.u32 %r1, %laneid;
	mul.wide.u32 %rd5, %r1, 16;
	mul.wide.u32 %rd6, %r1, 8;
	add.u64 %rd7, %rd1, %rd5;
	add.u64 %rd8, %rd2, %rd6;
	add.u64 %rd9, %rd3, %rd5;
	add.u64 %rd10, %rd4, %rd5;
	ld.global.v4.b32 {%r2, %r3, %r4, %r5}, [%rd7];
	ld.global.v2.b32 {%r6, %r7}, [%rd8];
	ld.global.v4.f32 {%f1, %f2, %f3, %f4}, [%rd9];
	mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%f5, %f6, %f7, %f8}, {%r2, %r3, %r4, %r5}, {%r6, %r7}, {%f1, %f2, %f3, %f4};
	st.global.v4.f32 [%rd10], {%f5, %f6, %f7, %f8};
	ret;
}`

// The fragment layouts, written out as the PTX ISA tables state them (independently of the
// emulator's formulas): for lane l, g = l/4 and t = l%4.
//
//	A regs: a[0] = (A[g][2t], A[g][2t+1])      a[1] = (A[g+8][2t], A[g+8][2t+1])
//	        a[2] = (A[g][2t+8], A[g][2t+9])    a[3] = (A[g+8][2t+8], A[g+8][2t+9])
//	B regs: b[0] = (B[2t][g], B[2t+1][g])      b[1] = (B[2t+8][g], B[2t+9][g])
//	C/D:    c0 = C[g][2t], c1 = C[g][2t+1], c2 = C[g+8][2t], c3 = C[g+8][2t+1]
//
// (low half first in each register).
func packBF16(lo, hi float32) uint32 {
	return uint32(bf16Nearest(lo)) | uint32(bf16Nearest(hi))<<16
}

func mmaFragments(A [16][16]float32, B [16][8]float32, C [16][8]float32) (a, b []uint32, c []float32) {
	for l := range 32 {
		g, t := l/4, l%4
		a = append(a,
			packBF16(A[g][2*t], A[g][2*t+1]), packBF16(A[g+8][2*t], A[g+8][2*t+1]),
			packBF16(A[g][2*t+8], A[g][2*t+9]), packBF16(A[g+8][2*t+8], A[g+8][2*t+9]))
		b = append(b, packBF16(B[2*t][g], B[2*t+1][g]), packBF16(B[2*t+8][g], B[2*t+9][g]))
		c = append(c, C[g][2*t], C[g][2*t+1], C[g+8][2*t], C[g+8][2*t+1])
	}
	return a, b, c
}

func runMma(t *testing.T, a, b []uint32, c []float32) [16][8]float32 {
	t.Helper()
	mem := NewMemory()
	pa, pb := mem.Alloc(4*len(a)), mem.Alloc(4*len(b))
	for i, v := range a {
		putMem(mem.Bytes(pa)[4*i:4*i+4], uint64(v))
	}
	for i, v := range b {
		putMem(mem.Bytes(pb)[4*i:4*i+4], uint64(v))
	}
	pc, pd := allocF32(mem, c), mem.Alloc(4*128)
	if err := runText(t, mmaKernel, Launch{Grid: [3]int{1, 1, 1}, Block: [3]int{32, 1, 1}}, mem, pa, pb, pc, pd); err != nil {
		t.Fatal(err)
	}
	d := readF32(mem, pd, 128)
	var D [16][8]float32
	for l := range 32 {
		g, t := l/4, l%4
		D[g][2*t], D[g][2*t+1], D[g+8][2*t], D[g+8][2*t+1] = d[4*l], d[4*l+1], d[4*l+2], d[4*l+3]
	}
	return D
}

func bf(x float32) float64 { return float64(math.Float32frombits(uint32(bf16Nearest(x)) << 16)) }

// maxMmaErr is the largest |D - (A.B + C)| relative to the row's magnitude, with A and B
// rounded to bf16 and the product formed naively in float64.
func maxMmaErr(A [16][16]float32, B [16][8]float32, C [16][8]float32, D [16][8]float32) float64 {
	worst := 0.0
	for m := range 16 {
		for n := range 8 {
			want, mag := float64(C[m][n]), math.Abs(float64(C[m][n]))
			for k := range 16 {
				p := bf(A[m][k]) * bf(B[k][n])
				want += p
				mag += math.Abs(p)
			}
			worst = max(worst, math.Abs(float64(D[m][n])-want)/mag)
		}
	}
	return worst
}

func TestMmaMatchesNaiveProduct(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	var A [16][16]float32
	var B [16][8]float32
	var C [16][8]float32
	for trial := range 5 {
		for i := range A {
			for j := range A[i] {
				A[i][j] = r.Float32()*2 - 1
			}
		}
		for i := range B {
			for j := range B[i] {
				B[i][j] = r.Float32()*2 - 1
			}
		}
		for i := range C {
			for j := range C[i] {
				C[i][j] = r.Float32() * 4
			}
		}
		a, b, c := mmaFragments(A, B, C)
		D := runMma(t, a, b, c)
		if e := maxMmaErr(A, B, C, D); e > 1e-6 {
			t.Fatalf("trial %d: relative error %g", trial, e)
		}
		// The check is sensitive to the layout: feeding A transposed (or B's k order
		// swapped with its column) must not pass.
		var At [16][16]float32
		for i := range A {
			for j := range A[i] {
				At[i][j] = A[j][i]
			}
		}
		a2, _, _ := mmaFragments(At, B, C)
		if e := maxMmaErr(A, B, C, runMma(t, a2, b, c)); e < 1e-3 {
			t.Fatalf("trial %d: transposed A fragments pass the check (error %g)", trial, e)
		}
		b2 := append([]uint32(nil), b...)
		for l := range 32 {
			b2[2*l], b2[2*l+1] = b[2*l+1], b[2*l]
		}
		if e := maxMmaErr(A, B, C, runMma(t, a, b2, c)); e < 1e-3 {
			t.Fatalf("trial %d: swapped B registers pass the check (error %g)", trial, e)
		}
	}
}

// TestMmaLayoutSpotChecks pins single elements: a one-hot A and B make D one-hot, so each
// case names exactly which lane, register and half an element lives in.
func TestMmaLayoutSpotChecks(t *testing.T) {
	for _, c := range []struct{ m, k, n int }{{0, 0, 0}, {9, 3, 5}, {2, 13, 7}, {15, 15, 1}, {6, 8, 3}} {
		var A [16][16]float32
		var B [16][8]float32
		var C [16][8]float32
		A[c.m][c.k], B[c.k][c.n] = 2, 3
		a, b, cc := mmaFragments(A, B, C)
		D := runMma(t, a, b, cc)
		for m := range 16 {
			for n := range 8 {
				want := float32(0)
				if m == c.m && n == c.n {
					want = 6
				}
				if D[m][n] != want {
					t.Fatalf("A[%d][%d]*B[%d][%d]: D[%d][%d] = %g, want %g", c.m, c.k, c.k, c.n, m, n, D[m][n], want)
				}
			}
		}
	}
	// Lane 6 (g=1, t=2) holds A[9][4] in the low half of a[1] and B[12][1] in the low half
	// of b[1]: the ISA's tables, restated.
	if m, k := mmaA(6, 2); m != 9 || k != 4 {
		t.Errorf("mmaA(6, a2) = (%d,%d), want (9,4)", m, k)
	}
	if k, n := mmaB(6, 2); k != 12 || n != 1 {
		t.Errorf("mmaB(6, b2) = (%d,%d), want (12,1)", k, n)
	}
	if m, n := mmaC(6, 3); m != 9 || n != 5 {
		t.Errorf("mmaC(6, c3) = (%d,%d), want (9,5)", m, n)
	}
}

func TestMmaNeedsWholeWarp(t *testing.T) {
	mem := NewMemory()
	p := []uint64{mem.Alloc(512), mem.Alloc(256), mem.Alloc(512), mem.Alloc(512)}
	err := runText(t, mmaKernel, Launch{Grid: [3]int{1, 1, 1}, Block: [3]int{16, 1, 1}}, mem, p...)
	if err == nil || !strings.Contains(err.Error(), "32 lanes") {
		t.Fatalf("mma in a 16-thread block: err = %v", err)
	}
}

func TestPacking(t *testing.T) {
	for _, c := range []struct {
		body string
		want uint32
	}{
		// cvt.rn.bf16x2.f32 d, a, b puts a in the upper half.
		{"mov.f32 %f1, 1.0; mov.f32 %f2, -2.0; cvt.rn.bf16x2.f32 %r1, %f1, %f2;", 0x3F80C000},
		// Rounding to nearest even on both halves: 1+2^-8 ties down, 1+3*2^-8 ties up.
		{"mov.f32 %f1, 0f3F808000; mov.f32 %f2, 0f3F818000; cvt.rn.bf16x2.f32 %r1, %f1, %f2;", 0x3F803F82},
		// mov.b32 packs {lo, hi}.
		{"mov.b16 %rs1, 0x1234; mov.b16 %rs2, 0xABCD; mov.b32 %r1, {%rs1, %rs2};", 0xABCD1234},
	} {
		mod := parseText(t, scalarKernel(c.body))
		mem := NewMemory()
		out := mem.Alloc(16)
		if err := Run(mod, "k", Launch{Grid: [3]int{1, 1, 1}, Block: [3]int{1, 1, 1}}, mem, []uint64{out}); err != nil {
			t.Fatalf("%s: %v", c.body, err)
		}
		if got := readU32(mem, out, 1)[0]; got != c.want {
			t.Errorf("%s: got 0x%08X, want 0x%08X", c.body, got, c.want)
		}
	}
}
