package codegen

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"xmix/bundle"
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

// TestGemmTCBucket: a tensor-core GEMM built for a bucket (GemmConfig.Rows, its row tiles
// only) taking 1-4 chunks a step (GemmConfig.Unroll) against the reference and bit for bit
// against the kernel for any row count at one chunk: steps that K fills exactly, that leave
// chunks over and that K does not fill once; the 16-wide tail; fewer rows than the bucket,
// exactly as many, and more (a second pass over W); one and several K groups.
func TestGemmTCBucket(t *testing.T) {
	r := rand.New(rand.NewPCG(25, 26))
	for _, c := range []struct {
		k, n, rows, bucket, unroll, wc int
	}{
		{256, 16, 8, 8, 4, 1},  // 8 chunks over 8 K groups: one step, three of its chunks past K
		{1024, 32, 5, 8, 4, 2}, // 32 chunks over 4 groups: two full steps
		{1040, 16, 8, 8, 4, 1}, // 32 chunks and the 16-wide tail
		{448, 48, 9, 16, 3, 1}, // 14 chunks over 8 groups: a partial step
		{192, 16, 16, 16, 3, 8},
		{320, 32, 20, 16, 2, 2}, // more rows than the bucket: two passes over W
		{128, 16, 30, 32, 2, 1},
		{96, 16, 3, 8, 1, 1},    // one chunk a step, tiles capped
		{1024, 32, 8, 8, 8, 2},  // 8 chunks a step: one full step per group
		{2560, 16, 8, 8, 4, 1},  // 80 chunks over 8 groups: two steps and a partial one
		{320, 32, 20, 16, 5, 2}, // 5 chunks a step, two passes over W
	} {
		one := GemmConfig{K: c.k, N: c.n, WDtype: ptx.BF16}
		cfg := one
		cfg.Rows, cfg.Unroll = c.bucket, c.unroll
		k := must(t)(gemmTC("gemm_tc_test", cfg, c.wc))
		base := must(t)(gemmTC("gemm_tc_test", one, c.wc))
		l := one.LaunchTC(c.rows)
		l.Grid[0] = (c.n/16 + c.wc - 1) / c.wc
		args := []targ{{name: "x", f32: randF32(r, c.rows*c.k, 1)}, {name: "w", bf16: randF32(r, c.n*c.k, 1)},
			{name: "y", out: c.rows * c.n}, scalarU32("rows", uint32(c.rows))}
		checkKernel(t, k, l, args)
		a, b := newEmuBufs(), newEmuBufs()
		a.run(t, k, l, args)
		b.run(t, base, l, args)
		samePair(t, k, "y", a, b)
	}
	for _, bad := range []GemmConfig{{K: 64, N: 16, WDtype: ptx.BF16, Unroll: MaxTCChunks + 1}, {K: 64, N: 16, WDtype: ptx.BF16, Rows: -1}} {
		if _, err := GemmTC("g", bad); err == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
}

// TestTCSettings: decode buckets get their row count and chunks per step, larger calls the
// kernel for any row count, and the kernel's name says which; every call gets the build's
// prefetch.
func TestTCSettings(t *testing.T) {
	for _, c := range []struct {
		chunks             [2]int
		rows, want, unroll int
		suffix             string
	}{
		{DefaultTCChunks, 8, 8, 4, "_r8u4"}, {DefaultTCChunks, 16, 16, 3, "_r16u3"}, {DefaultTCChunks, 32, 32, 3, "_r32u3"},
		{DefaultTCChunks, 64, 64, 0, "_r64u1"}, {DefaultTCChunks, 128, 0, 0, ""}, {DefaultTCChunks, 512, 0, 0, ""},
		// --tc-chunks 6,4: up to 32 rows; the kernel for any row count past 64.
		{[2]int{6, 4}, 8, 8, 6, "_r8u6"}, {[2]int{6, 4}, 9, 9, 4, "_r9u4"}, {[2]int{6, 4}, 64, 64, 0, "_r64u1"}, {[2]int{6, 4}, 128, 0, 0, ""},
	} {
		got := (&gen{prefetch: 512, tcChunks: c.chunks}).tcSettings(GemmConfig{K: 64, N: 16, WDtype: ptx.BF16}, c.rows)
		if got.Rows != c.want || got.Unroll != c.unroll || tcSuffix(got) != c.suffix || got.Prefetch != 512 {
			t.Errorf("%+v: Rows %d Unroll %d suffix %q", c, got.Rows, got.Unroll, tcSuffix(got))
		}
	}
	for _, bad := range [][]int{{4}, {4, 3, 2}, {0, 3}, {4, MaxTCChunks + 1}} {
		if _, err := tcChunks(bad); err == nil || !strings.Contains(err.Error(), "want two counts of 1 to 8") {
			t.Errorf("chunks %v: %v", bad, err)
		}
	}
}

// TestGemmTCPrefetch: a tensor-core GEMM built for early launch (GemmConfig.Prefetch) loads
// its K group's first step of W into registers (two loads per chunk: rows g and g+8), asks L2
// for the first lines of each of a warp's 16 W rows past what the block's K groups preload
// (rows g and g+8 per lane, every fourth line per lane), waits for the grid ahead after both
// and before it touches memory otherwise (the guard's word included), and computes the bits of
// the kernel without either.
func TestGemmTCPrefetch(t *testing.T) {
	r := rand.New(rand.NewPCG(27, 28))
	for _, c := range []struct {
		k, prefetch, rows, unroll int
		first, rounds             int // lines the 8 K groups preload; prefetch rounds past them
		guard                     uint32
	}{
		{1024, 512, 8, 1, 4, 0, 0},       // 4 lines, all preloaded
		{1024, 640, 9, 1, 4, 1, 0},       // 5 lines: one more, a partial round
		{1024, 1 << 20, 3, 1, 4, 3, 0},   // past the 2048-byte row: its 12 lines past the preload
		{1024, 1 << 20, 16, 2, 8, 2, 0},  // two chunks a step: 8 lines preloaded
		{64, 512, 8, 2, 8, 0, 1 << 3},    // a 128-byte row, preloaded whole; guarded
		{1024, 100, 8, 1, 4, 0, 1 << 3},  // no whole line: no prefetch, but the preload and the wait
		{1024, 512, 40, 2, 8, 0, 0},      // three passes over W: only the first uses the preload
		{1024, 1 << 20, 40, 4, 16, 0, 0}, // 4 chunks preloaded (the whole row), three passes
		{2048, 1 << 20, 9, 3, 12, 5, 0},  // 3 chunks: 12 of 32 lines preloaded
	} {
		plainCfg := GemmConfig{K: c.k, N: 32, WDtype: ptx.BF16, Guard: c.guard, Rows: 16, Unroll: c.unroll}
		cfg := plainCfg
		cfg.Prefetch = c.prefetch
		plain, k := must(t)(GemmTC("gemm_tc_test", plainCfg)), must(t)(GemmTC("gemm_tc_test", cfg))
		if !slices.Equal(paramNames(plain), paramNames(k)) {
			t.Fatalf("%+v: parameters %v, without prefetch %v", c, paramNames(k), paramNames(plain))
		}
		var offs []int64
		prefetches, preloads := prefetchesBeforeWait(t, k)
		for _, in := range prefetches {
			offs = append(offs, in.Args[0].(ptx.Addr).Offset)
		}
		var want []int64
		for i := range c.rounds {
			at := int64(128*c.first + 512*i)
			want = append(want, at, int64(8*2*c.k)+at)
		}
		if !slices.Equal(offs, want) {
			t.Fatalf("%+v: prefetch offsets %v, want %v", c, offs, want)
		}
		if len(preloads) != 2*c.unroll {
			t.Fatalf("%+v: %d preloads, want %d", c, len(preloads), 2*c.unroll)
		}
		l := cfg.LaunchTC(c.rows)
		args := []targ{{name: "x", f32: randF32(r, c.rows*c.k, 1)}, {name: "w", bf16: randF32(r, 32*c.k, 1)},
			{name: "y", out: c.rows * 32}, scalarU32("rows", uint32(c.rows))}
		if c.guard != 0 {
			args = append(args, targ{name: "any_mask", u32: []uint32{c.guard}})
		}
		checkKernel(t, k, l, args)
		a, b := newEmuBufs(), newEmuBufs()
		a.run(t, k, l, args)
		b.run(t, plain, l, args)
		samePair(t, k, "y", a, b)
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

// TestGemmTCGatedKernel: the gate/up projection on tensor cores with the gated activation in
// its epilogue against its reference (op gemm_gated) and bit for bit against what it replaces,
// the tensor-core GEMM over both halves (the same K groups) and then SiluMul: one and several
// K groups, the 16-wide K tail, steps that K does not fill, fewer rows than the bucket and
// more (a second pass over W), blocks past the last tile, both activations, and early launch
// (the W preloaded and prefetched before the wait, each part's rows at their own offsets).
func TestGemmTCGatedKernel(t *testing.T) {
	r := rand.New(rand.NewPCG(29, 30))
	for _, c := range []struct {
		k, inter, rows, bucket, unroll, wc, prefetch int
		act                                          string
	}{
		{256, 16, 8, 8, 2, 1, 0, ""},             // one tile pair, 8 K groups
		{1024, 48, 5, 8, 2, 2, 0, ActGeluTanh},   // 3 pairs over blocks of 2: the second block's last warp idle
		{1040, 32, 8, 8, 2, 4, 0, ""},            // the 16-wide tail
		{448, 16, 12, 16, 1, 1, 0, ""},           // two row tiles
		{320, 32, 20, 16, 2, 2, 0, ActGeluTanh},  // more rows than the bucket: two passes over W
		{2048, 64, 8, 8, 2, 4, 1 << 20, ""},      // early launch: preload, then the prefetch past it
		{1024, 32, 3, 8, 1, 8, 512, ActGeluTanh}, // early launch with one K group
		{96, 16, 7, 8, 2, 1, 512, ""},            // 3 chunks over 8 groups, early launch
	} {
		gc := GemmConfig{K: c.k, N: 2 * c.inter, WDtype: ptx.BF16, Rows: c.bucket, Unroll: c.unroll, Prefetch: c.prefetch}
		fc := GemmGatedConfig{Gemm: gc, Act: c.act}
		k := must(t)(gemmTCGated("gemm_gated_tc_test", fc, c.wc))
		l := fc.LaunchTC(c.rows)
		l.Grid[0] = (c.inter/16 + c.wc - 1) / c.wc
		x, w := targ{name: "x", f32: randF32(r, c.rows*c.k, 1)}, targ{name: "w", bf16: randF32(r, gc.N*c.k, 1)}
		rows := scalarU32("rows", uint32(c.rows))
		act := targ{name: "act", out: c.rows * c.inter}
		checkKernel(t, k, l, []targ{x, w, act, rows})

		one, two := newEmuBufs(), newEmuBufs()
		one.run(t, k, l, []targ{x, w, act, rows})
		plain := must(t)(gemmTC("gemm_tc_test", gc, c.wc))
		pl := gc.LaunchTC(c.rows)
		pl.Grid[0] = (gc.N/16 + c.wc - 1) / c.wc
		two.run(t, plain, pl, []targ{x, w, {name: "gu", out: c.rows * gc.N}, rows})
		sc := SiluConfig{Inter: c.inter, Act: c.act}
		two.run(t, must(t)(SiluMul("silu_test", sc)), sc.Launch(c.rows), []targ{{name: "gu"}, act, nullPtr(bundle.GatedActBF16), nullPtr(bundle.GatedGuBF16)})
		samePair(t, k, "act", one, two)
	}
	for _, bad := range []GemmGatedConfig{
		{Gemm: GemmConfig{K: 64, N: 48, WDtype: ptx.BF16}},              // Inter not a multiple of 16
		{Gemm: GemmConfig{K: 64, N: 64, WDtype: ptx.F32}},               // f32 weights
		{Gemm: GemmConfig{K: 64, N: 64, WDtype: ptx.BF16, Guard: 1}},    // guarded
		{Gemm: GemmConfig{K: 64, N: 64, WDtype: ptx.BF16}, Act: "relu"}, // no such activation
		{Gemm: GemmConfig{K: 1 << 16, N: 1 << 15, WDtype: ptx.BF16}},    // the up half past 2 GiB
		{Gemm: GemmConfig{K: 64, N: 64, WDtype: ptx.BF16, Unroll: MaxTCChunks + 1}},
	} {
		if _, err := GemmTCGated("g", bad); err == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
}
