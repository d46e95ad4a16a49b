package codegen

import (
	"math/rand/v2"
	"strings"
	"testing"

	"xmix/ops"
	"xmix/ptx"
)

// TestGemmTCRing: a tensor-core GEMM with its W through a shared-memory ring (GemmConfig.Ring)
// against the reference and bit for bit against the same kernel with W in registers: rings of
// 2-6 steps of 1-3 chunks; K groups of 1, 2 and 8 (the reduction inside the rings' memory);
// steps that K fills exactly, partly and not at all; the 16-wide tail; more rows than the
// bucket (a second pass, whose ring fills after the wait); built for early launch (the first
// steps copied before the wait, and L2 asked only for the lines past them) or not; guarded.
func TestGemmTCRing(t *testing.T) {
	r := rand.New(rand.NewPCG(29, 30))
	for _, c := range []struct {
		k, n, rows, bucket, unroll, wk, ring, prefetch int
		guard                                          uint32
	}{
		{1024, 32, 8, 8, 1, 4, 4, 0, 0},       // 32 chunks over 4 groups: 8 steps through 4 slots
		{1024, 16, 8, 8, 1, 8, 6, 512, 0},     // 4 chunks a group, 5 primed steps: the ring outlasts K
		{2560, 16, 5, 8, 2, 8, 3, 1 << 20, 0}, // 80 chunks over 8 groups, 2 a step: a partial step
		{1040, 32, 8, 8, 1, 1, 4, 512, 0},     // one K group, 32 chunks and the 16-wide tail
		{448, 48, 20, 16, 1, 8, 2, 512, 0},    // two passes over W: the second fills its own ring
		{4096, 16, 8, 8, 3, 8, 2, 4096, 1 << 3},
		{320, 32, 30, 32, 1, 4, 5, 0, 0},       // 10 chunks, 4 row tiles
		{4096, 32, 8, 8, 4, 4, 3, 512, 0},      // 12 KiB a warp: blocks of 4 warps
		{2048, 64, 8, 8, 4, 1, 3, 1 << 20, 0},  // 4 column warps, one K group
		{1024, 32, 16, 16, 4, 2, 6, 0, 0},      // 24 KiB a warp: blocks of 2 warps
		{2048, 16, 8, 8, 8, 1, 6, 512, 1 << 3}, // 48 KiB: one warp a block
	} {
		plain := GemmConfig{K: c.k, N: c.n, WDtype: ptx.BF16, Rows: c.bucket, Unroll: c.unroll, Prefetch: c.prefetch, Guard: c.guard}
		cfg := plain
		cfg.Ring = c.ring
		// The K groups set each column's order of summation: the register kernel with as many
		// (in blocks of 8 warps) computes the same bits.
		warps := cfg.tcBlockWarps()
		k := must(t)(gemmTC("gemm_tc_ring_test", cfg, warps/c.wk))
		base := must(t)(gemmTC("gemm_tc_ring_test", plain, tcWarps/c.wk))
		if !strings.Contains(k.PTX, "cp.async.cg.shared.global") || !strings.Contains(k.PTX, "cp.async.wait_group") {
			t.Fatalf("%+v: no ring in the PTX", c)
		}
		if c.prefetch > 0 {
			prefetches, preloads := prefetchesBeforeWait(t, k)
			if want := 2 * c.unroll * (c.ring - 1); len(preloads) != want {
				t.Errorf("%+v: %d copies before the wait, want %d", c, len(preloads), want)
			}
			first := (64*c.wk*c.unroll*(c.ring-1) + 127) / 128
			if lines := min(c.prefetch, 2*c.k) / 128; lines > first {
				if len(prefetches) == 0 || prefetches[0].Args[0].(ptx.Addr).Offset != int64(128*first) {
					t.Errorf("%+v: prefetches %v, want the first at line %d", c, prefetches, first)
				}
			} else if len(prefetches) != 0 {
				t.Errorf("%+v: %d prefetches of lines the ring copies", c, len(prefetches))
			}
		}
		launch := func(warps int) ops.Launch {
			wc := warps / c.wk
			return ops.Launch{Grid: [3]int{(c.n/16 + wc - 1) / wc, 1, 1}, Block: [3]int{32 * warps, 1, 1}}
		}
		args := []targ{{name: "x", f32: randF32(r, c.rows*c.k, 1)}, {name: "w", bf16: randF32(r, c.n*c.k, 1)},
			{name: "y", out: c.rows * c.n}, scalarU32("rows", uint32(c.rows))}
		if c.guard != 0 {
			args = append(args, targ{name: "any_mask", u32: []uint32{c.guard}})
		}
		checkKernel(t, k, launch(warps), args)
		a, b := newEmuBufs(), newEmuBufs()
		a.run(t, k, launch(warps), args)
		b.run(t, base, launch(tcWarps), args)
		samePair(t, k, "y", a, b)
	}
	for _, bad := range []struct {
		ring, unroll int
		want         string
	}{
		{1, 1, "want 2 to 8"}, {MaxTCRing + 1, 1, "want 2 to 8"}, {7, 7, "past 49152"},
	} {
		cfg := GemmConfig{K: 1024, N: 16, WDtype: ptx.BF16, Rows: 8, Unroll: bad.unroll, Ring: bad.ring}
		if _, err := GemmTC("g", cfg); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("ring %d of %d chunks: %v, want %q", bad.ring, bad.unroll, err, bad.want)
		}
	}
}
