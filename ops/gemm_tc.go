package ops

import (
	"fmt"

	"xmix/bundle"
)

// Op bundle.OpGemmTC is the tensor-core GEMM: y[rows,N] = x'[rows,K] @ w[N,K]^T, with x and y
// in f32 and w in bf16 (attributes bundle.GemmTCAttrs). Tensor cores take bf16 operands, so x
// is split into hi = bf16(x) and lo = bf16(x - hi) (both rounded to nearest even) and x' = hi
// + lo carries 16 bits of x's mantissa (and is exact in f32); products are summed in f32, here
// in the CUDA-core reference's order, on the GPU in the tensor cores'. Parameters: x, w, y
// (pointers), rows (u32), for the staged kernel a workspace ws the reference ignores, and for
// a guarded GEMM any_mask last (GemmAttrs).
func init() { Register(bundle.OpGemmTC, buildGemmTC) }

func buildGemmTC(attrs []byte) (Runner, error) {
	var a bundle.GemmTCAttrs
	if err := DecodeAttrs(attrs, &a); err != nil {
		return nil, err
	}
	if a.K <= 0 || a.N <= 0 {
		return nil, fmt.Errorf("gemm_tc: K=%d N=%d must be positive", a.K, a.N)
	}
	return RunnerFunc(func(args []Arg, _ Launch) error {
		args, run, err := unguard("gemm_tc", a.Guard, args)
		if err != nil || !run {
			return err
		}
		// The staged kernel takes a split-K workspace as a fifth argument; the math is the same.
		if len(args) != 4 && len(args) != 5 {
			return fmt.Errorf("gemm_tc: %d arguments, want 4 (x, w, y, rows) or 5 (+ ws)", len(args))
		}
		args = args[:4]
		rows := args[3].Int()
		if err := CheckArgs("gemm_tc", args, 4*rows*a.K, 2*a.N*a.K, 4*rows*a.N, -1); err != nil {
			return err
		}
		gemmTC(args[0].F32(), args[1], args[2].F32(), rows, a.K, a.N)
		return nil
	}), nil
}

// gemmTC splits x into hi + lo (exact in f32) and runs the CUDA-core reference on the result,
// so the CPU backend pays for the split once, not per weight.
func gemmTC(x []float32, w Arg, y []float32, rows, k, n int) {
	xs := make([]float32, rows*k)
	for i, v := range x[:rows*k] {
		hi := BF16ToF32(F32ToBF16(v))
		xs[i] = hi + BF16ToF32(F32ToBF16(v-hi))
	}
	gemm(xs, w, y, rows, k, n, true)
}
