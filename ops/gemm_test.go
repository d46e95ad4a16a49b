package ops

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
)

// Helpers shared by the forward-op tests (gemm, rope, attention, sample).

func fwdF32Arg(v []float32) Arg {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
	}
	return Arg{Mem: b}
}

func fwdBF16Arg(v []float32) Arg {
	b := make([]byte, 2*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint16(b[2*i:], F32ToBF16(x))
	}
	return Arg{Mem: b}
}

func fwdU32Arg(v []uint32) Arg {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], x)
	}
	return Arg{Mem: b}
}

func fwdRand(r *rand.Rand, n int) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = r.Float32()*2 - 1
	}
	return v
}

// fwdRelErr is |got-want|/|want| over float64 references.
func fwdRelErr(got []float32, want []float64) float64 {
	var num, den float64
	for i, w := range want {
		d := float64(got[i]) - w
		num += d * d
		den += w * w
	}
	return math.Sqrt(num / den)
}

func TestGemmMatchesFloat64(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, c := range []struct {
		k, n, rows int
		dt         string
	}{{37, 11, 3, "f32"}, {96, 40, 9, "bf16"}, {5, 1, 1, "f32"}} {
		x, w := fwdRand(r, c.rows*c.k), fwdRand(r, c.n*c.k)
		wa := fwdF32Arg(w)
		if c.dt == "bf16" {
			wa = fwdBF16Arg(w)
			for i := range w {
				w[i] = BF16ToF32(F32ToBF16(w[i]))
			}
		}
		y := fwdF32Arg(make([]float32, c.rows*c.n))
		run, err := Build("gemm", EncodeAttrs(GemmAttrs{K: c.k, N: c.n, WDtype: c.dt}))
		if err != nil {
			t.Fatal(err)
		}
		if err := run.Run([]Arg{fwdF32Arg(x), wa, y, {Bits: uint64(c.rows)}}, Launch{}); err != nil {
			t.Fatal(err)
		}
		want := make([]float64, c.rows*c.n)
		for i := range c.rows {
			for j := range c.n {
				for kk := range c.k {
					want[i*c.n+j] += float64(x[i*c.k+kk]) * float64(w[j*c.k+kk])
				}
			}
		}
		if e := fwdRelErr(y.F32(), want); e > 1e-6 {
			t.Errorf("%+v: relative error %g", c, e)
		}
	}
}

func TestGemmRejectsShortArgs(t *testing.T) {
	run, err := Build("gemm", EncodeAttrs(GemmAttrs{K: 4, N: 2, WDtype: "f32"}))
	if err != nil {
		t.Fatal(err)
	}
	x, w, y := fwdF32Arg(make([]float32, 8)), fwdF32Arg(make([]float32, 8)), fwdF32Arg(make([]float32, 4))
	if err := run.Run([]Arg{x, w, y, {Bits: 3}}, Launch{}); err == nil {
		t.Error("3 rows over buffers sized for 2: no error")
	}
	if _, err := Build("gemm", EncodeAttrs(GemmAttrs{K: 4, N: 2, WDtype: "f16"})); err == nil {
		t.Error("f16 weights accepted")
	}
}

// TestGemmIsBitIdenticalToDot: gemm's tiles of columns and chunks of K, and its few-row form
// over four columns at a time, over row counts that are and are not multiples of four, K with and without elements past its last group of four
// and past a chunk, and column counts past a tile, give every element dot's bits, with f32
// and bf16 weights.
func TestGemmIsBitIdenticalToDot(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 9))
	for _, c := range []struct{ rows, k, n int }{{1, 2, 5}, {1, 64, 9}, {2, 7, 4}, {3, 133, 11}, {4, 1, 3}, {5, 3, 17}, {8, 7, 1}, {9, 64, 33}, {12, 257, 20}, {4, gemmChunk + 5, gemmTile + 1}, {7, 2*gemmChunk + 4, 2}} {
		x, wf := make([]float32, c.rows*c.k), make([]float32, c.n*c.k)
		for i := range x {
			x[i] = r.Float32()*2 - 1
		}
		for i := range wf {
			wf[i] = BF16ToF32(F32ToBF16(r.Float32()*2 - 1)) // so that the bf16 weights are the same
		}
		for _, bf16 := range []bool{false, true} {
			w := fwdF32Arg(wf)
			if bf16 {
				w = fwdBF16Arg(wf)
			}
			y := make([]float32, c.rows*c.n)
			gemm(x, w, y, c.rows, c.k, c.n, bf16)
			for row := range c.rows {
				for j := range c.n {
					want := dot(x[row*c.k:(row+1)*c.k], wf[j*c.k:(j+1)*c.k])
					if got := y[row*c.n+j]; math.Float32bits(got) != math.Float32bits(want) {
						t.Fatalf("%+v bf16 %v: y[%d,%d] = %v, dot %v", c, bf16, row, j, got, want)
					}
				}
			}
		}
	}
}

// A guarded GEMM takes ctl.any_mask last; without it the call is refused by name.
func TestGemmGuardNeedsAnyMask(t *testing.T) {
	for _, op := range []string{"gemm", "gemm_tc"} {
		r, err := Build(op, EncodeAttrs(GemmAttrs{K: 4, N: 2, WDtype: "bf16", Guard: 8}))
		if err != nil {
			t.Fatal(err)
		}
		err = r.Run([]Arg{}, Launch{})
		if err == nil || !strings.Contains(err.Error(), "the last argument must be any_mask") {
			t.Errorf("%s without any_mask: %v", op, err)
		}
	}
}

// BenchmarkGemm times the CPU GEMM at Llama-3.1-8B's o projection (K = N = 4096, bf16
// weights) over 8, 32 and 128 rows: go test ./ops -run '^$' -bench Gemm.
func BenchmarkGemm(b *testing.B) {
	const k, n = 4096, 4096
	r := rand.New(rand.NewPCG(1, 2))
	wf := make([]float32, n*k)
	for i := range wf {
		wf[i] = r.Float32()*2 - 1
	}
	w := fwdBF16Arg(wf)
	for _, rows := range []int{1, 2, 8, 32, 128} {
		b.Run(fmt.Sprintf("rows%d", rows), func(b *testing.B) {
			x, y := make([]float32, rows*k), make([]float32, rows*n)
			for i := range x {
				x[i] = r.Float32()*2 - 1
			}
			for b.Loop() {
				gemm(x, w, y, rows, k, n, true)
			}
			b.ReportMetric(float64(2*rows*k*n)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
		})
	}
}

// TestDot4AccIsDot4AccGo: dot4Acc (on amd64 the SSE form) adds the same bits to every one of
// its sixteen sums as dot4AccGo, from sums that are not 0, over 0 to 67 groups.
func TestDot4AccIsDot4AccGo(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for _, groups := range []int{0, 1, 2, 5, 64, 67} {
		n := 4 * groups
		rows := make([][]float32, 4)
		for i := range rows {
			rows[i] = make([]float32, n+3) // longer than b: only len(b) elements count
			for j := range rows[i] {
				rows[i][j] = r.Float32()*2 - 1
			}
		}
		b := make([]float32, n)
		for j := range b {
			b[j] = r.Float32()*2 - 1
		}
		var want [4][4]float32
		for i := range want {
			for l := range want[i] {
				want[i][l] = r.Float32() * 8
			}
		}
		got := want
		dot4AccGo(&want, rows[0], rows[1], rows[2], rows[3], b)
		dot4Acc(&got, rows[0], rows[1], rows[2], rows[3], b)
		for i := range want {
			for l := range want[i] {
				if math.Float32bits(got[i][l]) != math.Float32bits(want[i][l]) {
					t.Fatalf("%d groups: row %d lane %d: %v, dot4AccGo %v", groups, i, l, got[i][l], want[i][l])
				}
			}
		}
	}
}

// TestDotBF16x4IsDotBF16x4Go: dotBF16x4 (on amd64 the SSE form) adds the same bits to every
// one of its sixteen sums as dotBF16x4Go, from sums that are not 0, over 0 to 67 groups.
func TestDotBF16x4IsDotBF16x4Go(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for _, groups := range []int{0, 1, 2, 5, 64, 67} {
		n := 4 * groups
		a := make([]float32, n)
		for j := range a {
			a[j] = r.Float32()*2 - 1
		}
		cols := make([][]uint16, 4)
		for c := range cols {
			cols[c] = make([]uint16, n+3) // longer than a: only len(a) elements count
			for j := range cols[c] {
				cols[c][j] = F32ToBF16(r.Float32()*2 - 1)
			}
		}
		var want [4][4]float32
		for c := range want {
			for l := range want[c] {
				want[c][l] = r.Float32() * 8
			}
		}
		got := want
		dotBF16x4Go(&want, a, cols[0], cols[1], cols[2], cols[3])
		dotBF16x4(&got, a, cols[0], cols[1], cols[2], cols[3])
		for c := range want {
			for l := range want[c] {
				if math.Float32bits(got[c][l]) != math.Float32bits(want[c][l]) {
					t.Fatalf("%d groups: column %d lane %d: %v, dotBF16x4Go %v", groups, c, l, got[c][l], want[c][l])
				}
			}
		}
	}
}

// TestWidenBF16: widenBF16 (on amd64 SSE in groups of eight) gives every bf16 value's
// BF16ToF32 bits, over lengths with and without a tail past the last group.
func TestWidenBF16(t *testing.T) {
	src := make([]uint16, 1<<16+5)
	for i := range src {
		src[i] = uint16(i * 40503) // every value once in the first 65536
	}
	for _, n := range []int{0, 3, 8, 13, len(src)} {
		dst := make([]float32, n+1)
		dst[n] = 7 // past the end: left alone
		widenBF16(dst[:n], src[:n])
		for i, h := range src[:n] {
			if math.Float32bits(dst[i]) != math.Float32bits(BF16ToF32(h)) {
				t.Fatalf("n %d: dst[%d] = %#08x, want %#08x", n, i, math.Float32bits(dst[i]), math.Float32bits(BF16ToF32(h)))
			}
		}
		if dst[n] != 7 {
			t.Fatalf("n %d: wrote past the end", n)
		}
	}
}
