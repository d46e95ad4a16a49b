package codegen

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"xmix/bundle"
	"xmix/ptx"
)

// TestGemmPrefetch: a GEMV built for early launch (GemmConfig.Prefetch) loads its first K
// step's weights into registers, asks L2 for the lines it is told to past them, waits for the
// grid ahead after both and before it reads anything else from memory (the guard's word
// included), keeps its parameters in place, and computes the plain GEMV's bits; earlyLaunch
// gives it the launch and no second wait.
func TestGemmPrefetch(t *testing.T) {
	r := rand.New(rand.NewPCG(71, 72))
	for _, c := range []struct {
		k, n, rows, prefetch int
		guard                uint32
		dt                   ptx.Type
		lines                int // lines of each weight row requested before the wait, preloaded or prefetched
		unroll               int
	}{
		{256, 24, 1, 256, 0, ptx.BF16, 2, 1},             // the first 256 bytes of 512: lanes 0-1
		{256, 24, 3, 1 << 20, 0, ptx.BF16, 4, 1},         // past the row: the whole row, 4 lines
		{2304, 16, 2, 1 << 20, 0, ptx.BF16, 36, 1},       // 4608-byte rows: a full round of 32 lanes and 4 more
		{96, 40, 9, 4096, 1 << 2, ptx.F32, 3, 1},         // guarded, f32 weights, tiles of 8 and 1
		{20, 8, 1, 4096, 0, ptx.BF16, 0, 1},              // a 40-byte row holds no whole line: no prefetch
		{2304, 16, 1, 4096 + 128, 0, ptx.BF16, 33, 1},    // one past a round
		{2304, 16, 1, 4096 - 128, 0, ptx.BF16, 31, 1},    // one short of a round
		{2304, 16, 1, 4096 + 100, 0, ptx.BF16, 32, 1},    // a part of a line is no line
		{2304, 16, 1, 4096, 0, ptx.BF16, 32, 1},          // exactly a round
		{2304, 16, 1, 127, 0, ptx.BF16, 0, 1},            // less than a line
		{2304, 16, 1, 128, 0, ptx.BF16, 1, 1},            // exactly a line
		{2304, 16, 1, 256 * 128, 0, ptx.BF16, 36, 1},     // more than the row
		{4608 / 4, 16, 1, 1 << 30, 0, ptx.F32, 36, 1},    // f32 rows of the same bytes
		{2304, 16, 1, 36*128 - 1, 0, ptx.BF16, 35, 1},    // one byte short of the row
		{2304, 16, 1, 36 * 128, 0, ptx.BF16, 36, 1},      // exactly the row
		{2304, 16, 1, 36*128 + 1, 0, ptx.BF16, 36, 1},    // one byte past it
		{2304, 16, 1, 64 * 128, 1 << 5, ptx.BF16, 36, 1}, // guarded, whole row
		{256, 24, 1, 4096, 0, ptx.BF16, 4, 2},            // a 512-byte row, two chunks a step: no unrolled step fits
		{2304, 16, 3, 4096, 0, ptx.BF16, 32, 4},          // four chunks a step: prefetched, not preloaded
		{2304, 16, 5, 36 * 128, 0, ptx.BF16, 36, 2},      // two chunks a step, the whole row
		{96, 40, 9, 4096, 1 << 2, ptx.F32, 3, 2},         // f32, 96 4-chunks: the unrolled loop ends at once
		{4608 / 4, 16, 2, 1 << 20, 0, ptx.F32, 36, 3},    // f32 rows, three chunks a step
	} {
		plainCfg := GemmConfig{K: c.k, N: c.n, WDtype: c.dt, Guard: c.guard, Unroll: c.unroll}
		cfg := plainCfg
		cfg.Prefetch = c.prefetch
		plain, k := must(t)(Gemm("gemm_test", plainCfg)), must(t)(Gemm("gemm_test", cfg))
		if !slices.Equal(paramNames(plain), paramNames(k)) {
			t.Fatalf("%+v: parameters %v, without prefetch %v", c, paramNames(k), paramNames(plain))
		}
		checkWaitsAfterPrefetch(t, k, cfg, c.lines)
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

// checkWaitsAfterPrefetch checks that the GEMV k of c preloads its first K step where that
// step is one 16-byte chunk per lane (gemmGen.firstStep; unrolled steps are not), then prefetches
// the rest of the lines lines of its one weight row, one instruction per lane round, and waits,
// touching memory only after the wait.
func checkWaitsAfterPrefetch(t *testing.T, k *Kernel, c GemmConfig, lines int) {
	t.Helper()
	prefetches, preloads := prefetchesBeforeWait(t, k)
	row := c.K * c.WDtype.Bytes()
	u, vec := 0, 16/c.WDtype.Bytes()
	if chunks := c.K / vec; c.K%vec == 0 && (c.Unroll <= 1 || chunks <= 32*(c.Unroll-1)) {
		u = 1 // single-chunk steps only: an unrolled first loop is not preloaded
	}
	if len(preloads) != u {
		t.Fatalf("%s: %d preloads, want %d", k.Name, len(preloads), u)
	}
	for i, in := range preloads {
		if in.Guard == nil {
			t.Fatalf("%s: preload %d unguarded: lanes past the row must not load", k.Name, i)
		}
	}
	first := 0
	if u > 0 {
		first = 4 * u // 32 lanes x 16 bytes per chunk
	}
	lines -= first
	if row < 128*first {
		lines = 0
	}
	lines = max(0, lines)
	rounds := (lines + 31) / 32
	if len(prefetches) != rounds {
		t.Fatalf("%s: %d prefetch instructions, want %d for %d lines past %d preloaded", k.Name, len(prefetches), rounds, lines, first)
	}
	// Round i is lines first+32i.. (4096 bytes a round), every lane's but the last round's when
	// it is partial.
	for i, in := range prefetches {
		if off, want := in.Args[0].(ptx.Addr).Offset, int64(128*first+i*4096); off != want {
			t.Fatalf("%s: prefetch %d at offset %d, want %d", k.Name, i, off, want)
		}
		if partial := i == rounds-1 && lines%32 != 0; (in.Guard != nil) != partial {
			t.Fatalf("%s: prefetch %d of %d lines guarded %v", k.Name, i, lines, in.Guard != nil)
		}
	}
}

// prefetchesBeforeWait checks that k, a kernel that prefetches its weights, waits for the grid
// ahead, prefetches and preloads (ld.global.nc, which these kernels use for weights only)
// only before the wait and touches memory otherwise only after it, and returns its prefetch
// and preload instructions before the wait in order.
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
