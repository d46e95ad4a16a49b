package codegen

import (
	"math/rand/v2"
	"strings"
	"testing"

	"xmix/ptx"
)

func TestGemmKernel(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 12))
	for _, c := range []struct {
		k, n, rows int
		dt         ptx.Type
	}{
		{96, 40, 1, ptx.BF16}, {96, 40, 3, ptx.F32}, {96, 40, 9, ptx.BF16}, // 16-byte loads, tiles 8+1
		{37, 11, 15, ptx.BF16}, {37, 11, 2, ptx.F32}, // K not a multiple of the vector width
		{64, 9, 8, ptx.F32},
	} {
		cfg := GemmConfig{K: c.k, N: c.n, WDtype: c.dt}
		k, err := Gemm("gemm_test", cfg)
		if err != nil {
			t.Fatal(err)
		}
		w := targ{name: "w", f32: randF32(r, c.n*c.k, 1)}
		if c.dt == ptx.BF16 {
			w = targ{name: "w", bf16: w.f32}
		}
		checkKernel(t, k, cfg.Launch(c.rows), []targ{
			{name: "x", f32: randF32(r, c.rows*c.k, 1)}, w,
			{name: "y", out: c.rows * c.n}, scalarU32("rows", uint32(c.rows)),
		})
	}
}

func TestGemmUsesWideLoads(t *testing.T) {
	k, err := Gemm("g", GemmConfig{K: 128, N: 4, WDtype: ptx.BF16})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(k.PTX, "ld.global.v4.b32") || !strings.Contains(k.PTX, "ld.global.v4.f32") {
		t.Error("K=128 bf16 GEMM does not load weights and x 16 bytes at a time")
	}
	if _, err := Gemm("g", GemmConfig{K: 8, N: 4, WDtype: ptx.F16}); err == nil {
		t.Error("f16 weights accepted")
	}
}
