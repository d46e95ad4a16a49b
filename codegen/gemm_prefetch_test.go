package codegen

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"xmix/bundle"
	"xmix/ptx"
)

// TestGemmPrefetch: a GEMV that prefetches its weights (GemmConfig.Prefetch) asks L2 for the
// lines it is told to, waits for the grid ahead after them and before it reads anything else
// from memory (the guard's word included), keeps its parameters in place, and computes the
// plain GEMV's bits; earlyLaunch gives it the launch and no second wait.
func TestGemmPrefetch(t *testing.T) {
	r := rand.New(rand.NewPCG(71, 72))
	type prefetchCase struct {
		k, n, rows, prefetch int
		guard                uint32
		dt                   ptx.Type
		lines                int // prefetches per weight row the column's warps ask for
		split                int // GemmConfig.Split: the column's warps take turns at its lines
	}
	for _, c := range []prefetchCase{
		{256, 24, 1, 256, 0, ptx.BF16, 2, 0},             // the first 256 bytes of 512: lanes 0-1
		{256, 24, 3, 1 << 20, 0, ptx.BF16, 4, 0},         // past the row: the whole row, 4 lines
		{2304, 16, 2, 1 << 20, 0, ptx.BF16, 36, 0},       // 4608-byte rows: a full round of 32 lanes and 4 more
		{96, 40, 9, 4096, 1 << 2, ptx.F32, 3, 0},         // guarded, f32 weights, tiles of 8 and 1
		{20, 8, 1, 4096, 0, ptx.BF16, 0, 0},              // a 40-byte row holds no whole line: no prefetch
		{2304, 16, 1, 4096 + 128, 0, ptx.BF16, 33, 0},    // one past a round
		{2304, 16, 1, 4096 - 128, 0, ptx.BF16, 31, 0},    // one short of a round
		{2304, 16, 1, 4096 + 100, 0, ptx.BF16, 32, 0},    // a part of a line is no line
		{2304, 16, 1, 4096, 0, ptx.BF16, 32, 0},          // exactly a round
		{2304, 16, 1, 127, 0, ptx.BF16, 0, 0},            // less than a line
		{2304, 16, 1, 128, 0, ptx.BF16, 1, 0},            // exactly a line
		{2304, 16, 1, 256 * 128, 0, ptx.BF16, 36, 0},     // more than the row
		{4608 / 4, 16, 1, 1 << 30, 0, ptx.F32, 36, 0},    // f32 rows of the same bytes
		{2304, 16, 1, 36*128 - 1, 0, ptx.BF16, 35, 0},    // one byte short of the row
		{2304, 16, 1, 36 * 128, 0, ptx.BF16, 36, 0},      // exactly the row
		{2304, 16, 1, 36*128 + 1, 0, ptx.BF16, 36, 0},    // one byte past it
		{2304, 16, 1, 64 * 128, 1 << 5, ptx.BF16, 36, 0}, // guarded, whole row
		{2304, 16, 1, 1 << 20, 0, ptx.BF16, 36, 2},       // two warps a column: one round of 64 lines, partial
		{9216, 16, 3, 1 << 20, 0, ptx.BF16, 144, 2},      // 144 lines: rounds of 64, 64 and 16
		{2304, 16, 9, 32 * 128, 1 << 5, ptx.BF16, 32, 8}, // guarded, eight warps: 32 of a round of 256
		{9216, 16, 1, 128 * 128, 0, ptx.BF16, 128, 4},    // exactly a round of four warps
	} {
		plainCfg := GemmConfig{K: c.k, N: c.n, WDtype: c.dt, Guard: c.guard, Split: c.split}
		cfg := plainCfg
		cfg.Prefetch = c.prefetch
		plain, k := must(t)(Gemm("gemm_test", plainCfg)), must(t)(Gemm("gemm_test", cfg))
		if !slices.Equal(paramNames(plain), paramNames(k)) {
			t.Fatalf("%+v: parameters %v, without prefetch %v", c, paramNames(k), paramNames(plain))
		}
		checkWaitsAfterPrefetch(t, k, c.lines, 32*max(1, c.split))
		early, err := earlyLaunch(k)
		if err != nil {
			t.Fatal(err)
		}
		if n := strings.Count(early.PTX, bundle.PriorGridWait+";"); n != 1 || !strings.Contains(early.PTX, bundle.PriorGridLaunch+";") {
			t.Fatalf("%+v: early launch: %d waits, launch %v", c, n, strings.Contains(early.PTX, bundle.PriorGridLaunch))
		}

		sameGemvBits(t, r, early, plain, cfg, plainCfg, c.rows)
	}
}

// checkWaitsAfterPrefetch checks that k prefetches lines lines of its one weight row per
// lane, round lines a round (32 lanes of each warp of a column), then waits, and touches
// memory only after the wait.
func checkWaitsAfterPrefetch(t *testing.T, k *Kernel, lines, round int) {
	t.Helper()
	prefetches, preloads := prefetchesBeforeWait(t, k)
	if len(preloads) != 0 {
		// Measured and not kept: loading the first step before the wait cost the batch-1
		// step 10% on the H200 (session 12, testsuite/gpu/RESULTS.md).
		t.Fatalf("%s: %d weight loads before the wait", k.Name, len(preloads))
	}
	rounds := (lines + round - 1) / round
	if len(prefetches) != rounds {
		t.Fatalf("%s: %d prefetch instructions, want %d for %d lines", k.Name, len(prefetches), rounds, lines)
	}
	// Round i is lines round*i.. (128*round*i bytes on), every lane's but the last round's
	// when it is partial.
	for i, in := range prefetches {
		if off := in.Args[0].(ptx.Addr).Offset; off != int64(i*round*128) {
			t.Fatalf("%s: prefetch %d at offset %d, want %d", k.Name, i, off, i*round*128)
		}
		if partial := i == rounds-1 && lines%round != 0; (in.Guard != nil) != partial {
			t.Fatalf("%s: prefetch %d of %d lines guarded %v", k.Name, i, lines, in.Guard != nil)
		}
	}
}

// prefetchesBeforeWait checks that k, a kernel that prefetches its weights, waits for the grid
// ahead, prefetches and preloads (ld.global.nc, which these kernels use for weights only)
// only before the wait and touches memory otherwise only after it, and returns its prefetch
// and preload instructions in order.
func prefetchesBeforeWait(t *testing.T, k *Kernel) (prefetches, preloads []ptx.Instr) {
	t.Helper()
	m, err := ptx.Parse(k.PTX)
	if err != nil {
		t.Fatal(err)
	}
	body := m.Kernels[0].Body
	wait := slices.IndexFunc(body, func(in ptx.Instr) bool { return in.Op == bundle.PriorGridWait })
	if wait < 0 {
		t.Fatalf("%s: prefetches but never waits for the grid ahead", k.Name)
	}
	for i, in := range body {
		touches := strings.HasPrefix(in.Op, "ld.global") || strings.HasPrefix(in.Op, "st.global") || strings.HasPrefix(in.Op, "atom")
		switch {
		case i < wait && strings.HasPrefix(in.Op, "ld.global.nc."):
			preloads = append(preloads, in)
		case touches && i < wait:
			t.Fatalf("%s: %s before the wait", k.Name, in.Op)
		case in.Op == "prefetch.global.L2" && i > wait:
			t.Fatalf("%s: a prefetch after the wait", k.Name)
		case in.Op == "prefetch.global.L2":
			prefetches = append(prefetches, in)
		}
	}
	return prefetches, preloads
}
