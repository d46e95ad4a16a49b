package codegen

import (
	"math/rand/v2"
	"strings"
	"testing"

	"xmix/ptx"
)

func TestGemmTCKernel(t *testing.T) {
	r := rand.New(rand.NewPCG(21, 22))
	for _, c := range []struct{ k, n, rows, wc int }{
		{32, 16, 1, 1}, {64, 48, 7, 1}, {64, 80, 8, 2}, {32, 80, 9, 4}, {64, 48, 33, 8},
		{48, 16, 9, 1}, {48, 80, 33, 2}, // K % 32 == 16: the 16-wide tail chunk
		{96, 48, 5, 1},   // 3 chunks over 8 K groups: some groups idle
		{32, 32, 130, 2}, // more than 128 rows: a second row group
	} {
		cfg := GemmConfig{K: c.k, N: c.n, WDtype: ptx.BF16}
		k, err := gemmTC("gemm_tc_test", cfg, c.wc)
		if err != nil {
			t.Fatal(err)
		}
		l := cfg.LaunchTC(c.rows)
		l.Grid[0] = (c.n/16 + c.wc - 1) / c.wc
		checkKernel(t, k, l, []targ{
			{name: "x", f32: randF32(r, c.rows*c.k, 1)},
			{name: "w", bf16: randF32(r, c.n*c.k, 1)},
			{name: "y", out: c.rows * c.n}, scalarU32("rows", uint32(c.rows)),
		})
	}
}

func TestGemmTCPublic(t *testing.T) {
	r := rand.New(rand.NewPCG(23, 24))
	cfg := GemmConfig{K: 64, N: 48, WDtype: ptx.BF16}
	k, err := GemmTC("gemm_tc", cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32", "ld.global.nc.v4.b32", "cvt.rn.bf16x2.f32"} {
		if !strings.Contains(k.PTX, want) {
			t.Errorf("PTX lacks %s", want)
		}
	}
	checkKernel(t, k, cfg.LaunchTC(3), []targ{
		{name: "x", f32: randF32(r, 3*64, 1)}, {name: "w", bf16: randF32(r, 48*64, 1)},
		{name: "y", out: 3 * 48}, scalarU32("rows", 3),
	})
	for _, bad := range []GemmConfig{{K: 48, N: 40, WDtype: ptx.BF16}, {K: 40, N: 48, WDtype: ptx.BF16}, {K: 64, N: 48, WDtype: ptx.F32}, {K: 0, N: 16, WDtype: ptx.BF16}} {
		if _, err := GemmTC("g", bad); err == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
}

func TestGemmTCLayout(t *testing.T) {
	for _, c := range []struct{ n, wc, blocks int }{
		{4096, 1, 256}, {6144, 2, 192}, {14336, 4, 224}, {28672, 8, 224}, {128256, 8, 1002}, {64, 1, 4},
	} {
		cfg := GemmConfig{K: 4096, N: c.n, WDtype: ptx.BF16}
		if wc := tcColumnWarps(c.n); wc != c.wc {
			t.Errorf("N=%d: %d column warps, want %d", c.n, wc, c.wc)
		}
		if l := cfg.LaunchTC(8); l.Grid[0] != c.blocks || l.Block[0] != 256 {
			t.Errorf("N=%d: launch %v", c.n, l)
		}
	}
}
