package codegen

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"xmix/ops"
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

// TestGemmGuard: a guarded GEMM of each generator computes y when ctl.any_mask has its bit
// and leaves y as it was when it does not, as its reference does.
func TestGemmGuard(t *testing.T) {
	const k, n, rows, bit = 64, 48, 9, uint32(1) << 3
	cfg := GemmConfig{K: k, N: n, WDtype: ptx.BF16, Guard: bit}
	cfg.Tickets = cfg.StagedTickets(rows)
	gen := must(t)
	plain, tc, staged := gen(Gemm("gemm_guard", cfg)), gen(GemmTC("gemm_tc_guard", cfg)), gen(GemmTCStaged("gemm_tcs_guard", cfg))
	r := rand.New(rand.NewPCG(13, 14))
	for _, c := range []struct {
		k      *Kernel
		launch ops.Launch
		ws     bool
	}{{plain, cfg.Launch(rows), false}, {tc, cfg.LaunchTC(rows), false}, {staged, cfg.LaunchTCStaged(rows), true}} {
		if p := c.k.Params[len(c.k.Params)-1].Name; p != "any_mask" {
			t.Fatalf("%s: last parameter %q, want any_mask", c.k.Name, p)
		}
		for _, any := range []uint32{bit | 1, 1} {
			args := []targ{{name: "x", f32: randF32(r, rows*k, 1)}, {name: "w", bf16: randF32(r, n*k, 1)},
				{name: "y", f32: fill(rows*n, -3), out: rows * n}, scalarU32("rows", rows)}
			if c.ws {
				args = append(args, targ{name: "ws", u32: make([]uint32, max(cfg.WorkspaceBytes(rows), 16)/4)})
			}
			args = append(args, targ{name: "any_mask", u32: []uint32{any}})
			checkKernel(t, c.k, c.launch, args)
			y := emulate(t, c.k, c.launch, args)[2]
			if untouched := !slices.ContainsFunc(y, func(v float32) bool { return v != -3 }); untouched != (any&bit == 0) {
				t.Fatalf("%s any_mask %b: y untouched %v", c.k.Name, any, untouched)
			}
		}
	}
}

// TestGemmColumnsPerWarp: a GEMV whose warps compute several columns (GemmConfig.Cols)
// against its reference and bit for bit against the one-column GEMV, at every tile size and
// past a full tile; a Cols that does not divide N falls back to one column.
func TestGemmColumnsPerWarp(t *testing.T) {
	r := rand.New(rand.NewPCG(73, 74))
	for _, c := range []struct {
		k, n, rows, cols int
		dt               ptx.Type
	}{
		{96, 40, 2, 4, ptx.BF16}, {96, 40, 3, 2, ptx.F32}, {96, 40, 7, 8, ptx.BF16},
		{96, 48, 9, 4, ptx.BF16}, {37, 12, 5, 3, ptx.F32}, {64, 72, 17, 8, ptx.BF16},
		{64, 30, 4, 4, ptx.BF16},  // 4 does not divide 30: one column per warp
		{128, 32, 1, 2, ptx.BF16}, // one row, as oneWaveCols gives the one-row GEMVs of few columns
	} {
		one := GemmConfig{K: c.k, N: c.n, WDtype: c.dt}
		cfg := one
		cfg.Cols = c.cols
		k, plain := must(t)(Gemm("gemm_test", cfg)), must(t)(Gemm("gemm_test", one))
		wantGrid := (c.n/c.cols + gemmWarps - 1) / gemmWarps
		if c.n%c.cols != 0 {
			wantGrid = one.Launch(c.rows).Grid[0]
			if k.PTX != plain.PTX {
				t.Fatalf("%+v: columns that do not divide N changed the kernel", c)
			}
		}
		if g := cfg.Launch(c.rows).Grid[0]; g != wantGrid {
			t.Fatalf("%+v: grid %d, want %d", c, g, wantGrid)
		}
		sameGemvBits(t, r, k, plain, cfg, one, c.rows)
	}
	if _, err := Gemm("g", GemmConfig{K: 8, N: 16, WDtype: ptx.BF16, Cols: 9}); err == nil {
		t.Error("9 columns per warp accepted")
	}
}

// TestGemmUnroll: a GEMV whose lanes load several K chunks before using them
// (GemmConfig.Unroll) against its reference and bit for bit against one chunk a step: K
// steps that do not fill one unrolled step (none of it runs), fill it exactly, and leave one
// chunk over; with one and two columns per warp, one row, a partial tile and a tile plus one.
func TestGemmUnroll(t *testing.T) {
	r := rand.New(rand.NewPCG(75, 76))
	for _, c := range []struct {
		k, unroll int
		dt        ptx.Type
	}{
		{512, 2, ptx.BF16}, {520, 2, ptx.BF16}, {264, 2, ptx.BF16}, // 64, 65 and 33 chunks
		{768, 4, ptx.BF16}, {776, 4, ptx.BF16}, {1024, 4, ptx.BF16}, // 96 (no unrolled step), 97, 128
		{260, 3, ptx.F32}, {70, 2, ptx.F32}, {37 * 3, 3, ptx.BF16}, // f32 chunks of 4; K not a multiple of the vector: chunks of 1
	} {
		for _, shape := range []struct{ rows, cols int }{{1, 1}, {3, 2}, {9, 1}} {
			one := GemmConfig{K: c.k, N: 16, WDtype: c.dt, Cols: shape.cols}
			cfg := one
			cfg.Unroll = c.unroll
			sameGemvBits(t, r, must(t)(Gemm("gemm_test", cfg)), must(t)(Gemm("gemm_test", one)), cfg, one, shape.rows)
		}
	}
	if _, err := Gemm("g", GemmConfig{K: 8, N: 16, WDtype: ptx.BF16, Unroll: MaxGemvUnroll + 1}); err == nil {
		t.Errorf("unroll %d accepted", MaxGemvUnroll+1)
	}
}

// TestGemmSplit: a GEMV whose columns' K is split over warps (GemmConfig.Split) against its
// reference, and bit for bit across what a bucket's GEMV changes (one column or two per warp,
// one chunk a step or four, the prefetch), so that a row's result is the same in every
// bucket of a build. K of fewer chunks than a round of a column's lanes (some warps sum
// nothing), exactly one round, one chunk past; one row, a partial tile, a tile plus one (the
// shared slots filled twice); f32 chunks of 4 and of 1.
func TestGemmSplit(t *testing.T) {
	r := rand.New(rand.NewPCG(77, 78))
	for _, c := range []struct {
		k, n, split int
		dt          ptx.Type
	}{
		{8 * 64, 16, 2, ptx.BF16},         // 64 chunks: one round of two warps
		{8 * 129, 16, 4, ptx.BF16},        // 129 chunks: one round of four warps and one chunk
		{8 * 40, 16, 8, ptx.BF16},         // 40 chunks: warps 2-7 of a column sum nothing
		{37 * 5, 16, 2, ptx.F32},          // chunks of one element
		{4 * 300, 32, 4, ptx.F32},         // chunks of 4: 300
		{8 * 14336 / 64, 64, 4, ptx.BF16}, // a K of the 8B's down projection scaled down 64x
	} {
		base := GemmConfig{K: c.k, N: c.n, WDtype: c.dt, Split: c.split}
		for _, bucket := range []struct{ rows, cols, unroll, prefetch int }{{1, 1, 1, 0}, {3, 2, 4, 0}, {9, 1, 1, 0}, {7, 2, 4, 4096 + 128}} {
			cfg := base
			cfg.Cols, cfg.Unroll, cfg.Prefetch = bucket.cols, bucket.unroll, bucket.prefetch
			k := must(t)(Gemm("gemm_test", cfg))
			if want := c.n / bucket.cols * c.split / gemmWarps; cfg.Launch(bucket.rows).Grid[0] != want {
				t.Fatalf("%+v %+v: grid %d, want %d blocks", c, bucket, cfg.Launch(bucket.rows).Grid[0], want)
			}
			sameGemvBits(t, r, k, must(t)(Gemm("gemm_test", base)), cfg, base, bucket.rows)
		}
	}
	for _, c := range []struct {
		n, split int
		want     string
	}{
		{16, 3, "GEMV split 3: want 1, 2, 4 or 8 warps a column"}, {16, 16, "split 16"}, {16, -1, "split -1"},
		{10, 2, "10 units of columns do not fill blocks of 4"},
	} {
		_, err := Gemm("g", GemmConfig{K: 64, N: c.n, WDtype: ptx.BF16, Split: c.split})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("N %d split %d: error %v, want %q", c.n, c.split, err, c.want)
		}
	}
}

// TestGemmBlockWarps: GEMVs in blocks of 1, 2 and 4 warps (GemmConfig.Warps) against their
// reference, and bit for bit against the default eight, with one and two columns a warp,
// a column's K split over warps, and column counts that leave the last block part empty.
func TestGemmBlockWarps(t *testing.T) {
	r := rand.New(rand.NewPCG(79, 80))
	for _, c := range []struct{ k, n, rows, cols, split, warps int }{
		{256, 40, 1, 1, 1, 4}, {256, 40, 3, 2, 1, 2}, {96, 13, 9, 1, 1, 1}, {512, 24, 1, 2, 1, 4},
		{8 * 64, 16, 1, 1, 2, 4}, {8 * 129, 16, 3, 1, 4, 4}, {8 * 64, 16, 7, 2, 2, 2},
	} {
		base := GemmConfig{K: c.k, N: c.n, WDtype: ptx.BF16, Cols: c.cols, Split: c.split}
		cfg := base
		cfg.Warps = c.warps
		l := cfg.Launch(c.rows)
		if want := (c.n/base.colsPerWarp()*c.split + c.warps - 1) / c.warps; l.Grid[0] != want || l.Block[0] != 32*c.warps {
			t.Fatalf("%+v: launch %v, want %d blocks of %d threads", c, l, want, 32*c.warps)
		}
		sameGemvBits(t, r, must(t)(Gemm("gemm_test", cfg)), must(t)(Gemm("gemm_test", base)), cfg, base, c.rows)
	}
	for _, c := range []struct {
		warps, split int
		want         string
	}{{3, 1, "block of 3 warps: want 1, 2, 4 or 8"}, {16, 1, "want 1, 2, 4 or 8"}, {-1, 1, "want 1, 2, 4 or 8"}, {2, 4, "block of 2 warps cannot hold a column split over 4"}} {
		_, err := Gemm("g", GemmConfig{K: 64, N: 16, WDtype: ptx.BF16, Warps: c.warps, Split: c.split})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("warps %d split %d: error %v, want %q", c.warps, c.split, err, c.want)
		}
	}
}

// sameGemvBits runs GEMV kernel k (of cfg) over random x and w against its reference, and
// bit for bit against kernel base (of baseCfg: the same product computed another way), over
// rows rows; a guarded cfg gets an any_mask that runs it.
func sameGemvBits(t *testing.T, r *rand.Rand, k, base *Kernel, cfg, baseCfg GemmConfig, rows int) {
	t.Helper()
	w := targ{name: "w", f32: randF32(r, cfg.N*cfg.K, 1)}
	if cfg.WDtype == ptx.BF16 {
		w = targ{name: "w", bf16: w.f32}
	}
	args := []targ{{name: "x", f32: randF32(r, rows*cfg.K, 1)}, w, {name: "y", out: rows * cfg.N}, scalarU32("rows", uint32(rows))}
	if cfg.Guard != 0 {
		args = append(args, targ{name: "any_mask", u32: []uint32{cfg.Guard}})
	}
	checkKernel(t, k, cfg.Launch(rows), args)
	a, b := newEmuBufs(), newEmuBufs()
	a.run(t, k, cfg.Launch(rows), args)
	b.run(t, base, baseCfg.Launch(rows), args)
	samePair(t, k, "y", a, b)
}

// TestSplitFor: the split each weight's GEMVs take (splitFor), at Llama-3.1-8B's and
// -3.2-1B's widths: the fewest warps a column that reach splitColumns, up to the build's
// most; none where the build asks for none or the columns do not fill blocks.
func TestSplitFor(t *testing.T) {
	for _, c := range []struct{ most, n, want int }{
		{8, 4096, 4}, {8, 6144, 4}, {8, 28672, 1}, {8, 128256, 1}, // 8B: o and down, q/k/v, gate/up, LM head
		{8, 2048, 8}, {8, 3072, 8}, {8, 16384, 1}, // 1B: o and down, q/k/v, gate/up
		{2, 4096, 2}, {4, 2048, 4}, {1, 4096, 1}, {0, 4096, 1},
		{8, 4096 + 32, 1}, {8, 300, 1},
	} {
		g := gen{split: c.most}
		if got := g.splitFor(c.n); got != c.want {
			t.Errorf("at most %d warps, %d columns: split %d, want %d", c.most, c.n, got, c.want)
		}
	}
	for _, n := range []int{3, 16, -1} {
		if err := CheckGemvSplit(n); err == nil || !strings.Contains(err.Error(), "want 1, 2, 4 or 8 warps a column") {
			t.Errorf("split %d: %v", n, err)
		}
	}
}

// TestOneWaveCols: the columns a warp of a plain one-row GEMV computes (oneWaveCols), and
// what gemvSettings gives each kind of GEMV: two where one column a warp overflows one wave
// of gemvResidentWarps and two fit it (Llama-3.1-8B's o and down, an unfused q/k/v), one
// where one wave already holds the weight (Llama-3.2-1B's o and down, its q/k/v), where it
// fills many waves (gate/up, the LM head), past two waves and for odd widths; a fused GEMV
// keeps its epilogue's columns, and buckets of more rows the build's.
func TestOneWaveCols(t *testing.T) {
	for _, c := range []struct{ n, want int }{
		{4096, 2}, {6144, 2}, {gemvResidentWarps + 2, 2}, {2 * gemvResidentWarps, 2},
		{2048, 1}, {3072, 1}, {gemvResidentWarps, 1}, {28672, 1}, {128256, 1}, {16384, 1},
		{2*gemvResidentWarps + 2, 1}, {4097, 1}, {1, 1},
	} {
		if got := oneWaveCols(c.n); got != c.want {
			t.Errorf("%d columns: %d a warp, want %d", c.n, got, c.want)
		}
	}
	g := gen{gemvCols: 2, unroll: 4}
	for _, c := range []struct {
		rows        int
		plain       bool
		cols, unrll int
	}{{1, true, 2, 0}, {1, false, 0, 0}, {4, true, 2, 4}, {4, false, 0, 4}} {
		got := g.gemvSettings(GemmConfig{K: 4096, N: 4096}, c.rows, c.plain)
		if got.Cols != c.cols || got.Unroll != c.unrll {
			t.Errorf("%d rows, plain %v: %d columns, unroll %d; want %d, %d", c.rows, c.plain, got.Cols, got.Unroll, c.cols, c.unrll)
		}
	}
}
