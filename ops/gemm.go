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
// product when few rows use it (decode), and widened once into a scratch row otherwise.
func gemm(x []float32, w Arg, y []float32, rows, k, n int, bf16 bool) {
	ParallelFor(n, func(lo, hi int) {
		if bf16 && rows < 4 {
			wb := w.U16()
			for j := lo; j < hi; j++ {
				for r := 0; r < rows; r++ {
					y[r*n+j] = dotBF16(x[r*k:(r+1)*k], wb[j*k:(j+1)*k])
				}
			}
			return
		}
		wrow := make([]float32, k)
		for j := lo; j < hi; j++ {
			if bf16 {
				for i, h := range w.U16()[j*k : (j+1)*k] {
					wrow[i] = BF16ToF32(h)
				}
			} else {
				copy(wrow, w.F32()[j*k:(j+1)*k])
			}
			r := 0
			for ; r+4 <= rows; r += 4 {
				y0, y1, y2, y3 := dot4(x[r*k:(r+1)*k], x[(r+1)*k:(r+2)*k], x[(r+2)*k:(r+3)*k], x[(r+3)*k:(r+4)*k], wrow)
				y[r*n+j], y[(r+1)*n+j], y[(r+2)*n+j], y[(r+3)*n+j] = y0, y1, y2, y3
			}
			for ; r < rows; r++ {
				y[r*n+j] = dot(x[r*k:(r+1)*k], wrow)
			}
		}
	})
}

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

// dot4 is dot of four rows against one weight row, each with dot's four partial sums in
// dot's order (so results are bit-identical to dot), loading each weight once.
func dot4(a0, a1, a2, a3, b []float32) (float32, float32, float32, float32) {
	b = b[:len(a0)]
	a1, a2, a3 = a1[:len(b)], a2[:len(b)], a3[:len(b)]
	var p [4][4]float32
	i := 0
	for ; i+4 <= len(b); i += 4 {
		for l := range 4 {
			w := b[i+l]
			p[0][l] += a0[i+l] * w
			p[1][l] += a1[i+l] * w
			p[2][l] += a2[i+l] * w
			p[3][l] += a3[i+l] * w
		}
	}
	for ; i < len(b); i++ {
		w := b[i]
		p[0][0] += a0[i] * w
		p[1][0] += a1[i] * w
		p[2][0] += a2[i] * w
		p[3][0] += a3[i] * w
	}
	sum := func(q [4]float32) float32 { return (q[0] + q[1]) + (q[2] + q[3]) }
	return sum(p[0]), sum(p[1]), sum(p[2]), sum(p[3])
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
