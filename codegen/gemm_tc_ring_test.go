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
// steps copied before the wait, and L2 asked only for the lines past them) or not; guarded;
// rings that carry x too (GemmConfig.RingX).
func TestGemmTCRing(t *testing.T) {
	r := rand.New(rand.NewPCG(29, 30))
	for _, c := range []struct {
		k, n, rows, bucket, unroll, wk, ring, prefetch int
		guard                                          uint32
		x                                              bool // x through the ring too
	}{
		{1024, 32, 8, 8, 1, 4, 4, 0, 0, false},       // 32 chunks over 4 groups: 8 steps through 4 slots
		{1024, 16, 8, 8, 1, 8, 6, 512, 0, false},     // 4 chunks a group, 5 primed steps: the ring outlasts K
		{2560, 16, 5, 8, 2, 8, 3, 1 << 20, 0, false}, // 80 chunks over 8 groups, 2 a step: a partial step
		{1040, 32, 8, 8, 1, 1, 4, 512, 0, false},     // one K group, 32 chunks and the 16-wide tail
		{448, 48, 20, 16, 1, 8, 2, 512, 0, false},    // two passes over W: the second fills its own ring
		{4096, 16, 8, 8, 3, 8, 2, 4096, 1 << 3, false},
		{320, 32, 30, 32, 1, 4, 5, 0, 0, false},       // 10 chunks, 4 row tiles
		{4096, 32, 8, 8, 4, 4, 3, 512, 0, false},      // 12 KiB a warp: blocks of 4 warps
		{2048, 64, 8, 8, 4, 1, 3, 1 << 20, 0, false},  // 4 column warps, one K group
		{1024, 32, 16, 16, 4, 2, 6, 0, 0, false},      // 24 KiB a warp: blocks of 2 warps
		{2048, 16, 8, 8, 8, 1, 6, 512, 1 << 3, false}, // 48 KiB: one warp a block
		// x through the ring: copied after the wait (the first steps' W before it), rows
		// past rows read stale bytes and are zeroed, the tail chunk loads its x from L2.
		{1024, 32, 5, 8, 4, 2, 3, 512, 0, true},          // 24 KiB a warp: blocks of 2
		{2048, 64, 8, 8, 2, 1, 3, 1 << 20, 1 << 3, true}, // 4 column warps
		{1040, 16, 3, 8, 1, 4, 4, 0, 0, true},            // no early launch; the 16-wide tail
		{448, 48, 20, 8, 1, 2, 2, 512, 0, true},          // three passes: the later ones fill x and W
	} {
		plain := GemmConfig{K: c.k, N: c.n, WDtype: ptx.BF16, Rows: c.bucket, Unroll: c.unroll, Prefetch: c.prefetch, Guard: c.guard}
		cfg := plain
		cfg.Ring, cfg.RingX = c.ring, c.x
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
		ring, unroll, rows int
		x                  bool
		want               string
	}{
		{1, 1, 8, false, "want 2 to 8"}, {MaxTCRing + 1, 1, 8, false, "want 2 to 8"}, {7, 7, 8, false, "past 49152"},
		{5, 5, 8, true, "past 49152"}, {0, 1, 8, true, "needs a ring"}, {3, 1, 16, true, "want a bucket of 1 to 8"},
		{3, 1, 0, true, "want a bucket of 1 to 8"},
	} {
		cfg := GemmConfig{K: 1024, N: 16, WDtype: ptx.BF16, Rows: bad.rows, Unroll: bad.unroll, Ring: bad.ring, RingX: bad.x}
		if _, err := GemmTC("g", cfg); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%+v: %v, want %q", bad, err, bad.want)
		}
	}
}
