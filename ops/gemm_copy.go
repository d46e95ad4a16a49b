package ops

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"maps"
	"slices"

	"xmix/bundle"
)

// Op bundle.OpGemmCopy is the copy-engine GEMM: y[rows,N] = bf16(x)[rows,K] @ w[N,K]^T, with
// x and y in f32, w in bf16 and every x rounded to bf16 (nearest even) first, as a library
// GEMM's cast rounds it; products are summed in f32, here in the CUDA-core reference's order,
// on the GPU in the tensor cores'. Parameters: x, w (the kernel's is a tensor map of w, the
// reference's w itself), y (pointers), rows (u32), at most the attributes' Rows. With the
// attributes' Act (bundle.GatedActOps) y is that activation of the product's two halves,
// [rows, N/2]: GatedActivations[Act](gate) * up, as the activation op computes it. With the
// attributes' RopeKV, y is then rotated and its k and v heads written to the cache as op
// rope_kv does, its parameters (bundle.RopeKVParams) following rows. With the attributes'
// YBF16 the parameter after rows (bundle.GemmYBF16) gets bf16(y), unless it is empty, and y
// may be empty then.
func init() {
	Register(bundle.OpGemmCopy, buildGemmCopy)
	if len(GatedActivations) != len(bundle.GatedActOps) || slices.ContainsFunc(bundle.GatedActOps, func(op string) bool { _, ok := GatedActivations[op]; return !ok }) {
		panic(fmt.Sprintf("ops: gated activations %v, the bundle's %v: want the same ops", slices.Sorted(maps.Keys(GatedActivations)), bundle.GatedActOps))
	}
}

func buildGemmCopy(attrs []byte) (Runner, error) {
	var a bundle.GemmCopyAttrs
	if err := DecodeAttrs(attrs, &a); err != nil {
		return nil, err
	}
	if a.K <= 0 || a.N <= 0 || a.Rows <= 0 {
		return nil, fmt.Errorf("gemm_copy: K=%d N=%d rows=%d must be positive", a.K, a.N, a.Rows)
	}
	act, gated := GatedActivations[a.Act]
	if a.Act != "" && (!gated || a.N%2 != 0) {
		return nil, fmt.Errorf("gemm_copy: activation %q over %d columns: want a gated op over an even width", a.Act, a.N)
	}
	yCols := a.N
	if gated {
		yCols = a.N / 2
	}
	if a.YBF16 && !gated {
		return nil, fmt.Errorf("gemm_copy: y_bf16 without an activation")
	}
	nargs := 4
	if a.YBF16 {
		nargs++
	}
	var rope Runner
	if r := a.RopeKV; r != nil {
		ra, err := json.Marshal(RopeKVAttrs{KVAttrs: KVAttrs(*r)})
		if err != nil {
			return nil, err
		}
		if rope, err = buildRopeKV(ra); err != nil {
			return nil, fmt.Errorf("gemm_copy: %w", err)
		}
		if gated || a.N != (r.Heads+2*r.KVHeads)*r.HeadDim {
			return nil, fmt.Errorf("gemm_copy: rope_kv %+v over %d columns with activation %q: want no activation and n the q/k/v row's width", *r, a.N, a.Act)
		}
		nargs += len(bundle.RopeKVParams)
	}
	return RunnerFunc(func(args []Arg, _ Launch) error {
		if len(args) != nargs {
			return fmt.Errorf("gemm_copy: %d arguments, want %d (x, w, y, rows, and with y_bf16 its copy of y or with rope_kv its own but qkv)", len(args), nargs)
		}
		rows := args[3].Int()
		if rows > a.Rows {
			return fmt.Errorf("gemm_copy: %d rows, the kernel takes at most %d", rows, a.Rows)
		}
		need := make([]int, nargs) // rope_kv checks its own
		copy(need, []int{4 * rows * a.K, 2 * a.N * a.K, 4 * rows * yCols, -1})
		if a.YBF16 && len(args[4].Mem) > 0 {
			need[4] = 2 * rows * yCols
			if len(args[2].Mem) == 0 {
				need[2] = -1 // bf16(y) alone
			}
		}
		if err := CheckArgs("gemm_copy", args, need...); err != nil {
			return err
		}
		x := make([]float32, rows*a.K)
		for i, v := range args[0].F32()[:rows*a.K] {
			x[i] = BF16ToF32(F32ToBF16(v))
		}
		if !gated {
			gemm(x, args[1], args[2].F32(), rows, a.K, a.N, true)
			if rope != nil {
				return rope.Run(append([]Arg{{Mem: args[2].Mem[:4*rows*a.N]}}, args[4:]...), Launch{Grid: [3]int{rows, 1, 1}})
			}
			return nil
		}
		gu, y := make([]float32, rows*a.N), make([]float32, rows*yCols)
		gemm(x, args[1], gu, rows, a.K, a.N, true)
		for r := range rows {
			gatedRow(y[r*yCols:(r+1)*yCols], gu[r*a.N:(r+1)*a.N], act)
		}
		if len(args[2].Mem) > 0 {
			copy(args[2].F32(), y)
		}
		if a.YBF16 && len(args[4].Mem) > 0 {
			yb := args[4].Mem
			for i, v := range y[:rows*yCols] {
				binary.LittleEndian.PutUint16(yb[2*i:], F32ToBF16(v))
			}
		}
		return nil
	}), nil
}
