package ops

import (
	"fmt"

	"xmix/bundle"
)

// The fused decode GEMVs (codegen/gemm_fused.go): a projection and the kernel after it in
// one. Each reference runs the two ops it fuses one after the other, so that a fused kernel
// gives exactly the unfused pair's results on the CPU backend.
func init() {
	Register("gemm_rope_kv", buildGemmRopeKV)
	Register("gemm_gated", buildGemmGated)
}

// GemmRopeKVAttrs are the attributes of op "gemm_rope_kv": op "gemm" (Gemm) writes the q, k
// and v rows into y, then op "rope_kv" (Rope) rotates them there and writes the KV cache.
// Parameters: gemm's x, w, y, rows, then rope_kv's after its qkv (cos, sin, pos, seq,
// block_table, kcache, vcache, [bias]). No kernel fuses Rope.QKNorm.
type GemmRopeKVAttrs struct {
	Gemm GemmAttrs   `json:"gemm"`
	Rope RopeKVAttrs `json:"rope"`
}

func buildGemmRopeKV(attrs []byte) (Runner, error) {
	var a GemmRopeKVAttrs
	if err := DecodeAttrs(attrs, &a); err != nil {
		return nil, err
	}
	if a.Rope.QKNorm || a.Gemm.Guard != 0 || a.Gemm.N != a.Rope.rowWidth() {
		return nil, fmt.Errorf("gemm_rope_kv: qk_norm %v, guard %#x, %d columns for rows of %d: want no QK-norm, no guard, the q/k/v row's width",
			a.Rope.QKNorm, a.Gemm.Guard, a.Gemm.N, a.Rope.rowWidth())
	}
	gemm, err := Build("gemm", EncodeAttrs(a.Gemm))
	if err != nil {
		return nil, err
	}
	rope, err := Build(bundle.OpRopeKV, EncodeAttrs(a.Rope))
	if err != nil {
		return nil, err
	}
	return named("gemm_rope_kv", func(args []Arg, l Launch) error {
		if len(args) < 4 {
			return fmt.Errorf("%d arguments, want gemm's four, then rope_kv's", len(args))
		}
		if err := gemm.Run(args[:4], l); err != nil {
			return err
		}
		return rope.Run(append([]Arg{args[2]}, args[4:]...), Launch{Grid: [3]int{args[3].Int(), 1, 1}})
	}), nil
}

// GemmGatedAttrs are the attributes of op "gemm_gated": op "gemm" (Gemm, 2*Inter columns:
// gate, then up) into rows the kernel keeps to itself, then the gated op Act
// (GatedActivations: act(gate) * up) into act. Parameters: x, w, act, rows. With Split (the
// tensor-core kernel's, bf16 weights) the GEMM is op gemm_tc's: x split into two bf16 halves.
type GemmGatedAttrs struct {
	Gemm  GemmAttrs `json:"gemm"`
	Act   string    `json:"act"`
	Split bool      `json:"split,omitempty"`
}

func buildGemmGated(attrs []byte) (Runner, error) {
	var a GemmGatedAttrs
	if err := DecodeAttrs(attrs, &a); err != nil {
		return nil, err
	}
	f, ok := GatedActivations[a.Act]
	if !ok || a.Gemm.Guard != 0 || a.Gemm.N <= 0 || a.Gemm.N%2 != 0 {
		return nil, fmt.Errorf("gemm_gated: act %q, guard %#x, %d columns: want a gated op, no guard, an even width", a.Act, a.Gemm.Guard, a.Gemm.N)
	}
	if a.Split && a.Gemm.WDtype != "bf16" {
		return nil, fmt.Errorf("gemm_gated: %s weights split for tensor cores: want bf16", a.Gemm.WDtype)
	}
	op, opAttrs := "gemm", EncodeAttrs(a.Gemm)
	if a.Split {
		op, opAttrs = bundle.OpGemmTC, EncodeAttrs(bundle.GemmTCAttrs{K: a.Gemm.K, N: a.Gemm.N})
	}
	gemm, err := Build(op, opAttrs)
	if err != nil {
		return nil, err
	}
	return named("gemm_gated", func(args []Arg, l Launch) error {
		if err := CheckArgs("gemm_gated", args, 0, 0, 0, -1); err != nil {
			return err
		}
		rows, n := args[3].Int(), a.Gemm.N/2
		if len(args[2].Mem) < 4*rows*n {
			return fmt.Errorf("act holds %d bytes, needs %d", len(args[2].Mem), 4*rows*n)
		}
		gu := Arg{Mem: make([]byte, 4*rows*2*n)}
		if err := gemm.Run([]Arg{args[0], args[1], gu, args[3]}, l); err != nil {
			return err
		}
		g, y := gu.F32(), args[2].F32()
		for r := range rows {
			gatedRow(y[r*n:(r+1)*n], g[2*r*n:2*(r+1)*n], f)
		}
		return nil
	}), nil
}
