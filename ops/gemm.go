package ops

import (
	"fmt"
	"math"
)

func init() { Register("gemm", buildGemm) }

// GemmAttrs configures op "gemm": y[rows,N] = x[rows,K] @ w[N,K]^T, with w stored as WDtype
// ("f32" or "bf16") and x, y as f32. Parameters: x, w, y (pointers), rows (u32), and for a
// guarded GEMM (Guard != 0) any_mask last.
type GemmAttrs struct {
	K      int    `json:"k"`
	N      int    `json:"n"`
	WDtype string `json:"w_dtype"`
	Guard  uint32 `json:"guard,omitempty"`
}

// A guarded GEMM is a heavy app's (the logit lens's LM head): it takes the step's
// ctl.any_mask as its last parameter and does nothing, y untouched, unless any_mask[0] has a
// bit of Guard. unguard checks and strips that argument and says whether the GEMM runs.
func unguard(op string, guard uint32, args []Arg) ([]Arg, bool, error) {
	if guard == 0 {
		return args, true, nil
	}
	if len(args) == 0 || len(args[len(args)-1].Mem) < 4 {
		return nil, false, fmt.Errorf("%s: guarded by %#x: the last argument must be any_mask (4 bytes)", op, guard)
	}
	last := len(args) - 1
	return args[:last], args[last].U32()[0]&guard != 0, nil
}

func buildGemm(attrs []byte) (Runner, error) {
	var a GemmAttrs
	if err := DecodeAttrs(attrs, &a); err != nil {
		return nil, err
	}
	if a.K <= 0 || a.N <= 0 {
		return nil, fmt.Errorf("gemm: K=%d N=%d must be positive", a.K, a.N)
	}
	ws, err := dtypeSize(a.WDtype)
	if err != nil {
		return nil, fmt.Errorf("gemm: weights: %w", err)
	}
	return RunnerFunc(func(args []Arg, _ Launch) error {
		args, run, err := unguard("gemm", a.Guard, args)
		if err != nil || !run {
			return err
		}
		if len(args) != 4 {
			return fmt.Errorf("gemm: %d arguments, want 4", len(args))
		}
		rows := args[3].Int()
		if err := CheckArgs("gemm", args, 4*rows*a.K, ws*a.N*a.K, 4*rows*a.N, -1); err != nil {
			return err
		}
		gemm(args[0].F32(), args[1], args[2].F32(), rows, a.K, a.N, ws == 2)
		return nil
	}), nil
}

// gemm splits the work over output columns. A bf16 weight row is widened inside the dot
// product when few rows use it (decode: gemvBF16); otherwise columns go by tiles of
// gemmTile, widened once into scratch, and each group of four rows runs over a tile
// gemmChunk elements of K at a time: the group's chunk of x (4 KiB) stays in L1 while every
// column of the tile uses it, where a whole row of x a column (2 MiB of them for 128 rows at
// K 4096) came from L3 for each column. Every sum keeps dot's order, so the results are
// dot's bit for bit.
func gemm(x []float32, w Arg, y []float32, rows, k, n int, bf16 bool) {
	ParallelFor(n, func(lo, hi int) {
		if bf16 && rows < 4 {
			gemvBF16(x, w.U16(), y, rows, k, n, lo, hi)
			return
		}
		tile := make([]float32, gemmTile*k)
		groups, whole := rows/4, k&^3
		acc := make([][4][4]float32, groups*gemmTile)
		for j0 := lo; j0 < hi; j0 += gemmTile {
			cols := min(gemmTile, hi-j0)
			for t := range cols {
				wrow, j := tile[t*k:(t+1)*k], j0+t
				if bf16 {
					widenBF16(wrow, w.U16()[j*k:(j+1)*k])
				} else {
					copy(wrow, w.F32()[j*k:(j+1)*k])
				}
			}
			clear(acc)
			for c := 0; c < whole; c += gemmChunk {
				e := min(c+gemmChunk, whole)
				for g := range groups {
					xr := func(i int) []float32 { return x[(4*g+i)*k+c : (4*g+i)*k+e] }
					a0, a1, a2, a3 := xr(0), xr(1), xr(2), xr(3)
					for t := range cols {
						dot4Acc(&acc[g*gemmTile+t], a0, a1, a2, a3, tile[t*k+c:t*k+e])
					}
				}
			}
			for t := range cols {
				wrow, j := tile[t*k:(t+1)*k], j0+t
				for g := range groups {
					p := &acc[g*gemmTile+t]
					for i := range 4 {
						r := 4*g + i
						y[r*n+j] = dot4Sum(p[i], x[r*k+whole:(r+1)*k], wrow[whole:])
					}
				}
				for r := 4 * groups; r < rows; r++ {
					y[r*n+j] = dot(x[r*k:(r+1)*k], wrow)
				}
			}
		}
	})
}

// gemvBF16 is gemm's few-row form over columns lo..hi of bf16 weights, which it reads as
// they are: four columns at a time take each row's x once (dotBF16x4), the columns past the
// last four one by one (dotBF16). A row's sums are dotBF16's, so dot's.
func gemvBF16(x []float32, wb []uint16, y []float32, rows, k, n, lo, hi int) {
	whole := k &^ 3
	col := func(j int) []uint16 { return wb[j*k : (j+1)*k] }
	j := lo
	for ; j+4 <= hi; j += 4 {
		var tails [4][3]float32 // each column's elements past its last group of four
		for c := range 4 {
			widenBF16Go(tails[c][:k-whole], col(j + c)[whole:])
		}
		for r := range rows {
			xr := x[r*k : (r+1)*k]
			var p [4][4]float32
			dotBF16x4(&p, xr[:whole], col(j), col(j+1), col(j+2), col(j+3))
			for c := range 4 {
				y[r*n+j+c] = dot4Sum(p[c], xr[whole:], tails[c][:k-whole])
			}
		}
	}
	for ; j < hi; j++ {
		for r := range rows {
			y[r*n+j] = dotBF16(x[r*k:(r+1)*k], col(j))
		}
	}
}

// gemmTile is how many weight columns gemm widens and runs together, gemmChunk how many
// elements of K (a multiple of 4) it takes at a time.
const gemmTile, gemmChunk = 16, 256

// dot keeps four partial sums so that the loop is not bound by one add's latency.
func dot(a, b []float32) float32 {
	b = b[:len(a)]
	var s0, s1, s2, s3 float32
	i := 0
	for ; i+4 <= len(a); i += 4 {
		s0 += a[i] * b[i]
		s1 += a[i+1] * b[i+1]
		s2 += a[i+2] * b[i+2]
		s3 += a[i+3] * b[i+3]
	}
	for ; i < len(a); i++ {
		s0 += a[i] * b[i]
	}
	return (s0 + s1) + (s2 + s3)
}

// dot4AccGo adds to p, row by row, dot's four partial sums of rows a0..a3 against b over
// whole groups of four elements (len(b) a multiple of 4), two lanes at a time so that the
// eight sums it keeps stay in registers (sixteen did not: the compiler kept them on the
// stack). dot4Acc is this, or on amd64 the same sums four lanes a vector (dot_amd64.s).
func dot4AccGo(p *[4][4]float32, a0, a1, a2, a3, b []float32) {
	a0, a1, a2, a3 = a0[:len(b)], a1[:len(b)], a2[:len(b)], a3[:len(b)]
	for l := 0; l < 4; l += 2 {
		s00, s01, s10, s11 := p[0][l], p[0][l+1], p[1][l], p[1][l+1]
		s20, s21, s30, s31 := p[2][l], p[2][l+1], p[3][l], p[3][l+1]
		for i := l; i+1 < len(b); i += 4 {
			w0, w1 := b[i], b[i+1]
			s00 += a0[i] * w0
			s01 += a0[i+1] * w1
			s10 += a1[i] * w0
			s11 += a1[i+1] * w1
			s20 += a2[i] * w0
			s21 += a2[i+1] * w1
			s30 += a3[i] * w0
			s31 += a3[i+1] * w1
		}
		p[0][l], p[0][l+1], p[1][l], p[1][l+1] = s00, s01, s10, s11
		p[2][l], p[2][l+1], p[3][l], p[3][l+1] = s20, s21, s30, s31
	}
}

// dotBF16x4Go adds to p[c] dotBF16's four partial sums of a against column c (b0..b3) over
// whole groups of four elements (len(a) a multiple of 4). dotBF16x4 is this, or on amd64 the
// same sums four lanes a vector (dot_amd64.s).
func dotBF16x4Go(p *[4][4]float32, a []float32, b0, b1, b2, b3 []uint16) {
	for c, b := range [4][]uint16{b0, b1, b2, b3} {
		b = b[:len(a)]
		s0, s1, s2, s3 := p[c][0], p[c][1], p[c][2], p[c][3]
		for i := 0; i+4 <= len(a); i += 4 {
			s0 += a[i] * BF16ToF32(b[i])
			s1 += a[i+1] * BF16ToF32(b[i+1])
			s2 += a[i+2] * BF16ToF32(b[i+2])
			s3 += a[i+3] * BF16ToF32(b[i+3])
		}
		p[c] = [4]float32{s0, s1, s2, s3}
	}
}

// dot4Sum is dot's result from its four partial sums over the whole groups, q, and the
// elements past them, a and b (fewer than four), which go to the first sum as in dot.
func dot4Sum(q [4]float32, a, b []float32) float32 {
	for i, v := range a {
		q[0] += v * b[i]
	}
	return (q[0] + q[1]) + (q[2] + q[3])
}

// widenBF16Go sets dst[i] to src[i] widened from bf16 (BF16ToF32). widenBF16 is this, or on
// amd64 the same eight values at a time (dot_amd64.s).
func widenBF16Go(dst []float32, src []uint16) {
	for i, h := range src {
		dst[i] = BF16ToF32(h)
	}
}

// dotBF16 is dot with b stored as bf16 (the same four partial sums, so the same result).
func dotBF16(a []float32, b []uint16) float32 {
	b = b[:len(a)]
	var s0, s1, s2, s3 float32
	i := 0
	for ; i+4 <= len(a); i += 4 {
		s0 += a[i] * math.Float32frombits(uint32(b[i])<<16)
		s1 += a[i+1] * math.Float32frombits(uint32(b[i+1])<<16)
		s2 += a[i+2] * math.Float32frombits(uint32(b[i+2])<<16)
		s3 += a[i+3] * math.Float32frombits(uint32(b[i+3])<<16)
	}
	for ; i < len(a); i++ {
		s0 += a[i] * math.Float32frombits(uint32(b[i])<<16)
	}
	return (s0 + s1) + (s2 + s3)
}

// dtypeSize is the storage size of a weight or cache element type.
func dtypeSize(dt string) (int, error) {
	switch dt {
	case "f32":
		return 4, nil
	case "bf16":
		return 2, nil
	}
	return 0, fmt.Errorf("storage dtype %q: want f32 or bf16", dt)
}

// loadElem reads element i of a buffer stored as f32 (size 4) or bf16 (size 2).
func loadElem(a Arg, size, i int) float32 {
	if size == 2 {
		return BF16ToF32(a.U16()[i])
	}
	return a.F32()[i]
}

// storeElem writes element i of a buffer stored as f32 (size 4) or bf16 (size 2).
func storeElem(a Arg, size, i int, v float32) {
	if size == 2 {
		a.U16()[i] = F32ToBF16(v)
		return
	}
	a.F32()[i] = v
}
