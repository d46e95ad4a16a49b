package codegen

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"xmix/bundle"
	"xmix/ops"
	"xmix/ptx"
	"xmix/ptx/emu"
)

// runGemmCopy runs kernel k of configuration c over rows rows of random x and W in the
// emulator (W through the emulator's tensor map) and returns y with the reference op's y.
// With an activation, y_bf16 is 0 for an odd number of rows (nothing may be written there)
// and otherwise must get bf16(y) of the kernel's own y, bit for bit, and the same again in a
// second run with y 0 (bf16(y) alone).
func runGemmCopy(t *testing.T, k *Kernel, c GemmCopyConfig, rows int, seed uint64) (got, want []float64) {
	t.Helper()
	mod, err := ptx.Parse(k.PTX)
	if err != nil {
		t.Fatalf("%s: parse: %v\n%s", k.Name, err, k.PTX)
	}
	r := rand.New(rand.NewPCG(seed, uint64(c.K*7+c.N)))
	xs := randF32(r, rows*c.K, 1)
	x := targ{f32: xs}.bytesOf()
	w := targ{bf16: randF32(r, c.N*c.K, 1)}.bytesOf()
	yCols := c.N
	if c.Act != "" {
		yCols = c.N / 2 // the activation's width
	}
	y := targ{out: rows * yCols}.bytesOf()
	mem := emu.NewMemory()
	put := func(b []byte) uint64 {
		a := mem.Alloc(len(b))
		copy(mem.Bytes(a), b)
		return a
	}
	xa, wa, ya := put(x), put(w), put(y)
	a := c.Attrs()
	wm, err := emu.TensorMap2D(wa, [2]int{c.K, c.N}, 2*c.K, a.Box, 2, a.Swizzle)
	if err != nil {
		t.Fatal(err)
	}
	// The warpgroup form reads bf16(x), which the backend's cast writes on the GPU.
	xm, err := emu.TensorMap2D(xa, [2]int{c.K, rows}, 4*c.K, a.XBox, 4, a.XSwizzle)
	if a.XBF16 {
		xm, err = emu.TensorMap2D(put(targ{bf16: xs}.bytesOf()), [2]int{c.K, rows}, 2*c.K, a.XBox, 2, a.XSwizzle)
	}
	if err != nil {
		t.Fatal(err)
	}
	l := c.Launch()
	// Lag: each CTA of a cluster runs ahead of the ones ranked after it, so a copy into a
	// partner's slot before the partner has read it would show in y.
	args := []uint64{put(xm[:]), put(wm[:]), ya, uint64(rows)}
	refArgs := []ops.Arg{{Mem: x}, {Mem: w}, {Mem: append([]byte(nil), y...)}, {Bits: uint64(rows)}}
	var yb uint64
	if a.YBF16 {
		if rows%2 == 0 {
			yb = put(make([]byte, 2*rows*yCols))
		}
		args = append(args, yb)
		refArgs = append(refArgs, ops.Arg{})
	}
	mem.RecordReads()
	if err := emu.Run(mod, k.Name, emu.Launch{Grid: l.Grid, Block: l.Block, Shared: l.Shared, Lag: true}, mem, args); err != nil {
		t.Fatalf("%s: emulate: %v", k.Name, err)
	}
	// Launched early, the kernel asks the copy engine for W before its wait and loads nothing
	// itself: x is the grid ahead's.
	if early := mem.EarlyLoads(); len(early) > 0 {
		t.Fatalf("%s: %d loads before the wait, the first %d bytes at 0x%x; want none", k.Name, len(early), early[0].N, early[0].Addr)
	}
	ref, err := ops.Build(k.Op, k.Attrs)
	if err != nil {
		t.Fatal(err)
	}
	if err := ref.Run(refArgs, l); err != nil {
		t.Fatalf("%s: reference: %v", k.Name, err)
	}
	got = floats(mem.Bytes(ya)[:4*rows*yCols], "f32")
	if yb != 0 {
		for i, v := range got {
			if h := binary.LittleEndian.Uint16(mem.Bytes(yb)[2*i:]); h != ops.F32ToBF16(float32(v)) {
				t.Fatalf("%s: y_bf16[%d] = %#04x, want bf16(y) = %#04x", k.Name, i, h, ops.F32ToBF16(float32(v)))
			}
		}
		alone := put(make([]byte, 2*rows*yCols))
		if err := emu.Run(mod, k.Name, emu.Launch{Grid: l.Grid, Block: l.Block, Shared: l.Shared, Lag: true}, mem, []uint64{args[0], args[1], 0, uint64(rows), alone}); err != nil {
			t.Fatalf("%s: emulate with y 0: %v", k.Name, err)
		}
		if !bytes.Equal(mem.Bytes(alone)[:2*rows*yCols], mem.Bytes(yb)[:2*rows*yCols]) {
			t.Fatalf("%s: with y 0, y_bf16 differs from the run with y", k.Name)
		}
	}
	return got, floats(refArgs[2].Mem[:4*rows*yCols], "f32")
}

func TestGemmCopyMatchesReference(t *testing.T) {
	for _, c := range []struct {
		GemmCopyConfig
		rows []int
	}{
		{GemmCopyConfig{K: 2048, N: 64, Rows: 8, Split: 2, Stages: 2}, []int{1, 3, 8}}, // four stages a CTA through two slots: refills and a phase flip
		{GemmCopyConfig{K: 1024, N: 128, Rows: 8, Split: 1, Stages: 4}, []int{1, 8}},   // no cluster, every stage asked for before the wait
		{GemmCopyConfig{K: 512, N: 64, Rows: 8, Split: 2, Stages: 1}, []int{1, 8}},     // one slot: every stage waits for its refill
		{GemmCopyConfig{K: 1024, N: 64, Rows: 16, Split: 2, Stages: 2}, []int{9, 16}},  // two row tiles, eight K parts
		{GemmCopyConfig{K: 768, N: 128, Rows: 16, Split: 1, Stages: 1}, []int{1, 16}},  // the sums in the one slot
		{GemmCopyConfig{K: 2048, N: 64, Rows: 16, Split: 2, Stages: 3}, []int{13, 16}}, // three slots of four stages a CTA, a cluster
		// The warpgroup form: one warpgroup of 64 columns.
		{GemmCopyConfig{K: 1024, N: 64, Rows: 32, Split: 2, Stages: 1}, []int{1, 32}},    // a stage a slot: every stage waits for its refill
		{GemmCopyConfig{K: 1024, N: 128, Rows: 32, Split: 1, Stages: 3}, []int{17}},      // four stages through three slots, two CTAs
		{GemmCopyConfig{K: 512, N: 64, Rows: 64, Split: 2, Stages: 1}, []int{64}},        // ranks' sums through rank 0's ring
		{GemmCopyConfig{K: 1024, N: 128, Rows: 128, Split: 4, Stages: 1}, []int{5, 128}}, // a cluster of 4
		// x shared by two column tiles (multicast): refills wait until both CTAs have read a slot.
		{GemmCopyConfig{K: 1024, N: 128, Rows: 128, Split: 1, Stages: 4, Share: 2}, []int{70, 128}}, // eight stages through four slots
		{GemmCopyConfig{K: 1024, N: 256, Rows: 128, Split: 1, Stages: 3, Share: 2}, []int{128}},     // two clusters
		{GemmCopyConfig{K: 1024, N: 128, Rows: 64, Split: 1, Stages: 2, Share: 2}, []int{33}},       // two of a stage's four boxes each, two slots
		// The gate/up GEMM with its activation: gate's 32 rows and up's in each CTA's W.
		{GemmCopyConfig{K: 1024, N: 256, Rows: 32, Split: 1, Stages: 3, Act: "silu_mul"}, []int{1, 17, 32}}, // four CTAs, refills
		{GemmCopyConfig{K: 512, N: 128, Rows: 64, Split: 2, Stages: 1, Act: "gelu_tanh_mul"}, []int{5, 64}}, // the ranks' sums first
		// Several tiles a CTA through one ring: a tile's last stages beside the next one's first.
		{GemmCopyConfig{K: 512, N: 256, Rows: 32, Split: 1, Stages: 3, Tiles: 2, Act: "silu_mul"}, []int{3, 32}},    // two CTAs of two tiles
		{GemmCopyConfig{K: 1024, N: 256, Rows: 64, Split: 1, Stages: 2, Tiles: 4, Act: "gelu_tanh_mul"}, []int{64}}, // one CTA of four tiles
		{GemmCopyConfig{K: 256, N: 384, Rows: 32, Split: 1, Stages: 2, Tiles: 3, Act: "silu_mul"}, []int{32}},       // a stage a tile
		{GemmCopyConfig{K: 512, N: 256, Rows: 128, Split: 1, Stages: 3, Tiles: 2, Act: "silu_mul"}, []int{70, 128}}, // 128 rows, x not shared
		// The wide form: a CTA's gate and up rows one wgmma's B, x its A, a warpgroup per 64
		// rows, a producer warp refilling the ring once every warpgroup has read a slot.
		{GemmCopyConfig{K: 512, N: 448, Rows: 128, Split: 1, Stages: 3, Act: "silu_mul", Wide: 112}, []int{1, 70, 128}},       // two CTAs, eight stages through three slots
		{GemmCopyConfig{K: 256, N: 256, Rows: 64, Split: 1, Stages: 2, Act: "gelu_tanh_mul", Wide: 64}, []int{8, 16, 32, 64}}, // one warpgroup, two CTAs; at 8-32 rows whole warps past the rows (at 8, as the 8B's 8-row bucket, half of warp 0's too)
		{GemmCopyConfig{K: 128, N: 48, Rows: 128, Split: 1, Stages: 2, Act: "silu_mul", Wide: 8}, []int{128}},                 // every stage asked for before the wait; three CTAs of 8 columns
		// x shared by two neighbouring column tiles: each asks for its 64 rows of a stage's x,
		// multicast to both; a slot is refilled once all four warpgroups have read it.
		{GemmCopyConfig{K: 512, N: 448, Rows: 128, Split: 1, Stages: 3, Share: 2, Act: "silu_mul", Wide: 112}, []int{1, 70, 128}}, // one cluster, eight stages through three slots
		{GemmCopyConfig{K: 256, N: 896, Rows: 128, Split: 1, Stages: 4, Share: 2, Act: "gelu_tanh_mul", Wide: 112}, []int{100}},   // two clusters, every stage asked for before the wait
		// The plain wide form: K over a cluster, each rank adding one column slice's sums.
		{GemmCopyConfig{K: 512, N: 256, Rows: 128, Split: 4, Stages: 2, Wide: 128}, []int{1, 70, 128}}, // two clusters of four, two stages a rank
		{GemmCopyConfig{K: 768, N: 192, Rows: 64, Split: 2, Stages: 3, Wide: 96}, []int{64}},           // six stages a rank through three slots
		{GemmCopyConfig{K: 256, N: 64, Rows: 128, Split: 1, Stages: 4, Wide: 32}, []int{100}},          // no split: every stage asked for before the wait
		// The grid after it launched once the last stage is asked for: the same sums.
		{GemmCopyConfig{K: 2048, N: 64, Rows: 8, Split: 2, Stages: 2, NextAtAsk: true}, []int{3}},
		{GemmCopyConfig{K: 1024, N: 128, Rows: 32, Split: 1, Stages: 3, NextAtAsk: true}, []int{17}},
		{GemmCopyConfig{K: 1024, N: 128, Rows: 32, Split: 1, Stages: 4, NextAtAsk: true}, []int{32}}, // every stage asked for before the wait
		{GemmCopyConfig{K: 512, N: 256, Rows: 32, Split: 1, Stages: 3, Tiles: 2, Act: "silu_mul", NextAtAsk: true}, []int{32}},
	} {
		for _, rows := range c.rows {
			cfg := c.GemmCopyConfig
			t.Run(fmt.Sprintf("k%d_n%d_r%d_split%d_stages%d_share%d_tiles%d_wide%d_%snext%v_rows%d", cfg.K, cfg.N, cfg.Rows, cfg.Split, cfg.Stages, cfg.Share, cfg.Tiles, cfg.Wide, cfg.Act, cfg.NextAtAsk, rows), func(t *testing.T) {
				k := must(t)(GemmCopy("gemm_copy_test", cfg))
				got, want := runGemmCopy(t, k, cfg, rows, uint64(rows))
				if e := relL2(got, want); !(e <= 1e-5) {
					t.Fatalf("relative L2 error %.3g > 1e-5 (first values got %v want %v)", e, head(got), head(want))
				}
			})
		}
	}
}

// With NextAtAsk the kernel lets the grid after it launch where its thread 0 asks for the CTA's
// last stage (in the refill, or before the wait where the ring holds every stage), as well as
// after its main loop; without, only after the main loop. So do the kernels whose producer
// warp refills the ring (a shared x, the wide form): that warp's lanes never let the grid
// after it launch, which its idle lanes would do at the CTA's start.
func TestGemmCopyNextAtAsk(t *testing.T) {
	for _, c := range []GemmCopyConfig{
		{K: 2048, N: 64, Rows: 8, Split: 2, Stages: 2},
		{K: 1024, N: 128, Rows: 32, Split: 1, Stages: 3},
		{K: 512, N: 256, Rows: 32, Split: 1, Stages: 3, Tiles: 2, Act: "silu_mul"},
		{K: 1024, N: 128, Rows: 32, Split: 1, Stages: 4},
		{K: 512, N: 448, Rows: 64, Split: 1, Stages: 3, Act: "silu_mul", Wide: 112},
		{K: 512, N: 448, Rows: 128, Split: 1, Stages: 3, Share: 2, Act: "silu_mul", Wide: 112},
		{K: 768, N: 192, Rows: 64, Split: 2, Stages: 3, Wide: 96},
		{K: 1024, N: 256, Rows: 128, Split: 1, Stages: 2, Share: 2},
	} {
		for _, next := range []bool{false, true} {
			if c.produced() && next {
				continue // NextAtAsk is the one-warpgroup form's alone
			}
			c.NextAtAsk = next
			k := must(t)(GemmCopy("gemm_copy_test", c))
			mod, err := ptx.Parse(k.PTX)
			if err != nil {
				t.Fatal(err)
			}
			body := mod.Kernels[0].Body
			var launches, waits []int
			lastAsk := -1
			for i, in := range body {
				switch {
				case in.Op == bundle.PriorGridLaunch:
					launches = append(launches, i)
				case in.Op == bundle.PriorGridWait:
					waits = append(waits, i)
				case strings.HasPrefix(in.Op, "cp.async.bulk.tensor"):
					lastAsk = i
				}
			}
			name := fmt.Sprintf("k%d_n%d_r%d_stages%d_tiles%d_next%v", c.K, c.N, c.Rows, c.Stages, c.Tiles, next)
			if !next {
				if len(launches) != 1 || launches[0] < lastAsk {
					t.Errorf("%s: launches at %v, want one, after the last ask at %d", name, launches, lastAsk)
				}
				continue
			}
			early := launches[0]
			if len(launches) != 2 {
				t.Errorf("%s: launches at %v, want two", name, launches)
			} else if c.Stages >= c.K/c.Split/c.stageK()*c.tiles() {
				if early > waits[0] {
					t.Errorf("%s: the ring holds every stage, but the first launch (%d) is after the wait (%d)", name, early, waits[0])
				}
			} else if early < waits[0] || early > lastAsk+8 || body[early].Guard != nil {
				t.Errorf("%s: the first launch at %d, want it just after the last ask at %d, past the wait at %d", name, early, lastAsk, waits[0])
			}
		}
	}
}

func TestGemmCopyFor(t *testing.T) {
	for _, c := range []struct {
		k, n, rows, slots    int
		split, stages, share int
		err                  string
	}{
		{4096, 4096, 8, 0, 2, 3, 0, ""},  // the 8B's o: 64 column tiles, split
		{14336, 4096, 8, 0, 2, 3, 0, ""}, // down
		{4096, 6144, 8, 0, 1, 3, 0, ""},  // q/k/v: 96 tiles, not split
		{4096, 6144, 16, 0, 1, 3, 0, ""},
		{4096, 6144, 16, 4, 1, 4, 0, ""},  // four slots where asked for
		{14336, 4096, 16, 2, 2, 2, 0, ""}, // at most two slots
		{256, 6144, 8, 3, 1, 1, 0, ""},    // one stage: one slot
		{4096, 4096, 12, 0, 0, 0, 0, "12 rows, want one of [8 16 32 64 128]"},
		{4096, 4096, 32, 0, 2, 3, 0, ""},   // the warpgroup form: 64 tiles of 64 columns, split
		{4096, 6144, 32, 0, 1, 3, 0, ""},   // 96 tiles
		{4096, 4096, 128, 0, 2, 3, 0, ""},  // 64 tiles over clusters of 2: split K, no shared x
		{14336, 4096, 128, 0, 2, 3, 0, ""}, // down
		{4096, 6144, 128, 0, 1, 4, 2, ""},  // 96 tiles, pairs sharing x: a fourth slot
		{2048, 2048, 64, 0, 4, 2, 0, ""},   // 32 tiles over clusters of 4: two stages a CTA
		{4096, 192, 128, 0, 4, 3, 0, ""},   // three tiles, K over clusters of 4: no shared x
		{256, 5760, 128, 0, 1, 2, 2, ""},   // 90 tiles, two stages a CTA: both asked for before the wait, nothing to refill
		{4096, 5824, 128, 0, 1, 3, 0, ""},  // 91 tiles: one keeps its own x, so none shares
		{4096, 4096, 48, 0, 0, 0, 0, "48 rows, want one of [8 16 32 64 128]"},
		{4096, 100, 8, 0, 0, 0, 0, "N=100 must be a positive multiple of 64"},
		{384, 4096, 8, 0, 0, 0, 0, "K=384 must be a positive multiple of 512"},
	} {
		got, err := GemmCopyFor(c.k, c.n, c.rows, c.slots)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("GemmCopyFor(%d, %d, %d, %d): error %v, want %q", c.k, c.n, c.rows, c.slots, err, c.err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("GemmCopyFor(%d, %d, %d): %v", c.k, c.n, c.rows, err)
		}
		if got.Split != c.split || got.Stages != c.stages || got.Share != c.share {
			t.Errorf("GemmCopyFor(%d, %d, %d) = %+v, want split %d, stages %d, share %d", c.k, c.n, c.rows, got, c.split, c.stages, c.share)
		}
		if _, err := GemmCopy("ok", got); err != nil {
			t.Errorf("GemmCopyFor(%d, %d, %d) = %+v: %v", c.k, c.n, c.rows, got, err)
		}
	}
	if _, err := GemmCopy("bad", GemmCopyConfig{K: 4096, N: 4096, Rows: 8, Split: 2, Stages: 9}); err == nil {
		t.Error("GemmCopy took 9 stages past the shared memory")
	}
	for _, c := range []GemmCopyConfig{
		{K: 4096, N: 4096, Rows: 24, Split: 2, Stages: 1},            // no layout has 24 rows
		{K: 4096, N: 4096, Rows: 8, Split: 2, Stages: 1, Share: 2},   // the mma.sync form shares no x
		{K: 4096, N: 192, Rows: 128, Split: 1, Stages: 1, Share: 2},  // three tiles do not pair
		{K: 4096, N: 4096, Rows: 128, Split: 2, Stages: 1, Share: 2}, // split K and a shared x
		{K: 4096, N: 4096, Rows: 64, Split: 1, Stages: 1, Share: 16}, // a cluster of 16
	} {
		if _, err := GemmCopy("bad", c); err == nil {
			t.Errorf("GemmCopy took %+v", c)
		}
	}
	for n, ok := range map[int]bool{-1: false, 0: true, 1: true, gcMaxStages: true, gcMaxStages + 1: false} {
		if err := CheckCopyGemmSlots(n); (err == nil) != ok {
			t.Errorf("CheckCopyGemmSlots(%d): %v", n, err)
		}
	}
}

// TestGatedCopyFor: the gated kernel takes the warpgroup form, several tiles a CTA where the
// tiles are more than the SMs (the 8B's gate/up: 448 tiles, 4 each in 112 CTAs; the 1B's: 256,
// 2 each), one where they are fewer; at 64 and 128 rows the wide form, the fewest columns a
// CTA that fill at most the SMs in one wave (the 8B's 112, the 1B's 64, Gemma-2-2B's 72: 128
// CTAs each), in four slots, 288 threads at 128 rows (two warpgroups and the producer warp),
// where clusters of two share x, each asking for 64 of its rows.
// It refuses an unknown activation, mma.sync rows, and a wide width with no such columns.
func TestGatedCopyFor(t *testing.T) {
	for _, c := range []struct {
		k, n, rows, tiles, grid, stages, wide, threads, cluster int
	}{
		{4096, 28672, 32, 4, 112, 3, 0, 128, 1},
		{4096, 28672, 64, 0, 128, 4, 112, 160, 1},
		{4096, 28672, 128, 0, 128, 4, 112, 288, 2},
		{2048, 16384, 32, 2, 128, 3, 0, 128, 1},
		{2048, 16384, 128, 0, 128, 4, 64, 288, 2},
		{2304, 18432, 128, 0, 128, 4, 72, 288, 2},
		{4096, 8192, 32, 0, 128, 3, 0, 128, 1},
	} {
		got, err := GatedCopyFor(c.k, c.n, c.rows, 0, "silu_mul")
		if err != nil {
			t.Fatalf("%d x %d at %d rows: %v", c.k, c.n, c.rows, err)
		}
		box := [2]int{gcBoxK, cmp.Or(c.wide, gcCols/2)}
		xRows := c.rows
		if c.wide > 0 {
			xRows /= c.cluster
		}
		if a := got.Attrs(); got.Tiles != c.tiles || a.Grid != c.grid || got.Stages != c.stages || got.Wide != c.wide || a.Block != c.threads || a.Cluster != c.cluster ||
			a.Act != "silu_mul" || a.Box != box || a.XBox != [2]int{gcBoxK, xRows} {
			t.Errorf("%d x %d at %d rows: %+v, attributes %+v; want %d tiles a CTA, grid %d, %d slots, wide %d, block %d, clusters of %d, x boxes of %d rows", c.k, c.n, c.rows, got, a, c.tiles, c.grid, c.stages, c.wide, c.threads, c.cluster, xRows)
		}
		if _, err := GemmCopy("gated", got); err != nil {
			t.Errorf("%d x %d at %d rows: %v", c.k, c.n, c.rows, err)
		}
	}
	for _, c := range []struct {
		rows int
		act  string
		want string
	}{
		{32, "relu", `an activation: "relu", want one of [silu_mul gelu_tanh_mul]`},
		{16, "silu_mul", "16 rows, want rows of the warpgroup form"},
	} {
		if _, err := GatedCopyFor(4096, 28672, c.rows, 0, c.act); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%d rows, %s: %v, want %q", c.rows, c.act, err, c.want)
		}
	}
	// 17312 = 32 x 541: its multiples of 8 up to 128 that divide it (8, 16, 32) make more tiles
	// than SMs.
	if _, err := GatedCopyFor(4096, 2*17312, 128, 0, "silu_mul"); err == nil || !strings.Contains(err.Error(), "wide form: N=34624") {
		t.Errorf("4096 x 34624 at 128 rows: %v, want the wide form's refusal", err)
	}
}

// TestWideCopyFor: the plain wide form takes the columns and K split that make the most CTAs
// of one wave, and of those the fewest bytes of x and of the ranks' sums (wideSplit): the
// 8B's o and down 128 columns over clusters of 4, its q/k/v 192; the 1B's 64 and 96. It
// refuses rows with no wide layout, a width no columns fit, and K not of whole boxes.
func TestWideCopyFor(t *testing.T) {
	for _, c := range []struct {
		k, n, rows, wide, split, grid, threads int
	}{
		{4096, 4096, 128, 128, 4, 128, 288},
		{4096, 6144, 128, 192, 4, 128, 288},
		{14336, 4096, 128, 128, 4, 128, 288},
		{4096, 4096, 64, 128, 4, 128, 160},
		{2048, 2048, 128, 64, 4, 128, 288},
		{2048, 3072, 128, 96, 4, 128, 288},
		{8192, 2048, 128, 64, 4, 128, 288},
	} {
		got, err := WideCopyFor(c.k, c.n, c.rows, 0)
		if err != nil {
			t.Fatalf("%d x %d at %d rows: %v", c.k, c.n, c.rows, err)
		}
		if a := got.Attrs(); got.Wide != c.wide || got.Split != c.split || a.Grid != c.grid || a.Cluster != c.split || a.Block != c.threads || got.Stages != wgWideSlots || a.Box != [2]int{gcBoxK, c.wide} {
			t.Errorf("%d x %d at %d rows: %+v, attributes %+v; want %d columns over %d ranks, grid %d, %d threads, %d slots", c.k, c.n, c.rows, got, a, c.wide, c.split, c.grid, c.threads, wgWideSlots)
		}
		if _, err := GemmCopy("wide", got); err != nil {
			t.Errorf("%d x %d at %d rows: %v", c.k, c.n, c.rows, err)
		}
	}
	for _, c := range []struct {
		k, n, rows int
		want       string
	}{
		{4096, 4096, 32, "32 rows, want one of the layouts' with it"},
		{4096, 2104, 128, "N=2104: want N with a divisor"}, // 8 x 263: only 8 columns divide it, in 263 CTAs
		{4000, 4096, 128, "K=4000 must be a positive multiple of"},
	} {
		if _, err := WideCopyFor(c.k, c.n, c.rows, 0); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%d x %d at %d rows: %v, want %q", c.k, c.n, c.rows, err, c.want)
		}
	}
}

// TestWideAtFullWidth: the wide kernels that Llama-3.1-8B's and Llama-3.2-1B's shapes get at
// 64 and 128 rows (GatedCopyFor, WideCopyFor, RopeCopyFor with the models' heads), every CTA
// of their real N, agree with their reference ops in the emulator: the 8B's gate/up in 128
// CTAs of 112 columns (pairs sharing x at 128 rows), its o, down and q/k/v over clusters of
// 4, the 1B's, and the gated kernels of Qwen3-8B's and Gemma-2-2B's gate/up (GELU). K is cut
// to a few stages a rank, which leaves each configuration's tiling and ring as the full K's;
// a part bucket too.
func TestWideAtFullWidth(t *testing.T) {
	l8 := RopeConfig{Heads: 32, KVHeads: 8, HeadDim: 128, BlockSize: 16, MaxBlocksPerSeq: 4, KVDtype: ptx.BF16}
	l1 := RopeConfig{Heads: 32, KVHeads: 8, HeadDim: 64, BlockSize: 16, MaxBlocksPerSeq: 4, KVDtype: ptx.BF16}
	for _, c := range []struct {
		name       string
		k, n, rows int
		act        string
		rope       *RopeConfig
		partRows   int
	}{
		{"l8_gate_up", 4096, 28672, 128, "silu_mul", nil, 70},
		{"l8_gate_up", 4096, 28672, 64, "silu_mul", nil, 33},
		{"l8_o", 4096, 4096, 128, "", nil, 1},
		{"l8_down", 14336, 4096, 128, "", nil, 100},
		{"l8_qkv", 4096, 6144, 128, "", nil, 128},
		{"l8_qkv_rope", 4096, 6144, 128, "", &l8, 57},
		{"l1_gate_up", 2048, 16384, 128, "silu_mul", nil, 128},
		{"l1_qkv_rope", 2048, 3072, 64, "", &l1, 64},
		{"qwen3_8b_gate_up", 4096, 24576, 128, "silu_mul", nil, 90},      // 96 columns of each a CTA
		{"gemma2_2b_gate_up", 2304, 18432, 64, "gelu_tanh_mul", nil, 64}, // 72 of each
	} {
		var cfg GemmCopyConfig
		var err error
		switch {
		case c.act != "":
			cfg, err = GatedCopyFor(c.k, c.n, c.rows, 0, c.act)
		case c.rope != nil:
			cfg, err = RopeCopyFor(c.k, c.n, c.rows, 0, *c.rope)
		default:
			cfg, err = WideCopyFor(c.k, c.n, c.rows, 0)
		}
		if err != nil || cfg.Wide == 0 {
			t.Fatalf("%s at %d rows: %+v, %v; want the wide form", c.name, c.rows, cfg, err)
		}
		cfg.K = 2 * cfg.Split * gcBoxK * cfg.Stages // two rings' worth of stages a rank: every slot refilled once
		t.Run(fmt.Sprintf("%s_r%d_wide%d_split%d_share%d", c.name, c.rows, cfg.Wide, cfg.Split, cfg.Share), func(t *testing.T) {
			t.Parallel()
			if c.rope != nil {
				plain := GemmCopyConfig{K: cfg.K, N: cfg.N, Rows: cfg.Rows, Split: cfg.Split, Stages: cfg.Stages, Wide: 2 * cfg.Wide}
				checkRopeCopy(t, plain, cfg, c.partRows)
				return
			}
			k := must(t)(GemmCopy("gemm_copy_full", cfg))
			for _, rows := range []int{cfg.Rows, c.partRows} {
				got, want := runGemmCopy(t, k, cfg, rows, uint64(rows))
				if e := relL2(got, want); !(e <= 1e-5) {
					t.Fatalf("%d rows: relative L2 error %.3g > 1e-5", rows, e)
				}
			}
		})
	}
}

// TestRopeCopyForWide: at 64 and 128 rows the q/k/v projection with rope_kv takes the wide
// form, with the pairs a CTA and K split that make the most CTAs, and of those the fewest
// bytes of x and of the ranks' sums, in boxes of the most rows that cross no head: on
// Llama-3.1-8B 96 pairs (three boxes of 32 a half) over 4 ranks, 128 CTAs; on Llama-3.2-1B
// (head dim 64) 64 pairs over 4, 96 CTAs (32 pairs over 4 would make 192).
func TestRopeCopyForWide(t *testing.T) {
	l8 := RopeConfig{Heads: 32, KVHeads: 8, HeadDim: 128, BlockSize: 16, MaxBlocksPerSeq: 8, KVDtype: ptx.BF16}
	l1 := RopeConfig{Heads: 32, KVHeads: 8, HeadDim: 64, BlockSize: 16, MaxBlocksPerSeq: 8, KVDtype: ptx.BF16}
	for _, c := range []struct {
		rc                                  RopeConfig
		k, n, rows, pairs, split, grid, box int
	}{
		{l8, 4096, 6144, 128, 96, 4, 128, 32},
		{l8, 4096, 6144, 64, 96, 4, 128, 32},
		{l1, 2048, 3072, 128, 64, 4, 96, 32},
	} {
		got, err := RopeCopyFor(c.k, c.n, c.rows, 0, c.rc)
		if err != nil {
			t.Fatalf("%d x %d at %d rows: %v", c.k, c.n, c.rows, err)
		}
		if a := got.Attrs(); got.Wide != c.pairs || got.Split != c.split || a.Grid != c.grid || a.Cluster != c.split || a.Box != [2]int{gcBoxK, c.box} || a.RopeKV == nil {
			t.Errorf("%d x %d at %d rows: %+v, attributes %+v; want %d pairs over %d ranks, grid %d, boxes of %d rows", c.k, c.n, c.rows, got, a, c.pairs, c.split, c.grid, c.box)
		}
		if _, err := GemmCopy("wide_rope", got); err != nil {
			t.Errorf("%d x %d at %d rows: %v", c.k, c.n, c.rows, err)
		}
	}
	// 16 pairs over 4 ranks: a rank's 2 registers of first elements are no run of 4 (ownedRegs).
	bad := GemmCopyConfig{K: 1024, N: 384, Rows: 128, Split: 4, Stages: 2, Wide: 16, Rope: &RopeConfig{Heads: 1, KVHeads: 1, HeadDim: 128, BlockSize: 16, MaxBlocksPerSeq: 2, KVDtype: ptx.BF16}}
	if _, err := GemmCopy("wide_rope", bad); err == nil || !strings.Contains(err.Error(), "bad configuration") {
		t.Errorf("%+v: %v, want a bad configuration", bad, err)
	}
	bad.Split, bad.Wide = 2, 16
	if _, err := GemmCopy("wide_rope", bad); err != nil {
		t.Errorf("%+v: %v, want none", bad, err)
	}
}

// TestGemmCopyRopeMatchesThePair: the copy-engine GEMM with rope_kv in its epilogue writes y
// and both caches bit for bit as the plain copy-engine GEMM followed by the RopeKV kernel
// (both in the emulator), and within rounding of the reference op: GQA ratios 1, 2 and 4,
// head dims 64 and 128, bf16 and f32 caches, ragged positions (the first of a block, the last
// of one, one past) in shuffled pages, a full bucket and a part of one. The plain GEMM is the
// one a build gives the shape and rows beside it (plainTwin); in the wide form (pairs a CTA, K
// split) the plain wide form of the same split, whose ranks add their sums in the same order: one box of pairs a half, three a half with pairs of two
// heads a CTA, K split over 2 and 4 ranks. Before its wait the kernel reads only cos, sin, the
// positions, the slots and the block table (emu.Memory.EarlyLoads).
func TestGemmCopyRopeMatchesThePair(t *testing.T) {
	for _, c := range []struct {
		rc           RopeConfig
		k, layout    int
		rows         []int
		pairs, split int // the wide form's
	}{
		{RopeConfig{Heads: 4, KVHeads: 1, HeadDim: 64, BlockSize: 4, MaxBlocksPerSeq: 8, KVDtype: ptx.BF16}, 512, 32, []int{32, 7}, 0, 0},
		{RopeConfig{Heads: 2, KVHeads: 2, HeadDim: 64, BlockSize: 8, MaxBlocksPerSeq: 4, KVDtype: ptx.F32}, 256, 32, []int{32}, 0, 0},
		{RopeConfig{Heads: 2, KVHeads: 1, HeadDim: 128, BlockSize: 16, MaxBlocksPerSeq: 2, KVDtype: ptx.BF16}, 768, 32, []int{29}, 0, 0},
		{RopeConfig{Heads: 4, KVHeads: 2, HeadDim: 128, BlockSize: 16, MaxBlocksPerSeq: 8, KVDtype: ptx.BF16}, 512, 64, []int{64, 50}, 0, 0}, // 64 rows
		{RopeConfig{Heads: 4, KVHeads: 2, HeadDim: 64, BlockSize: 16, MaxBlocksPerSeq: 4, KVDtype: ptx.BF16}, 256, 128, []int{128, 37}, 32, 1},
		{RopeConfig{Heads: 4, KVHeads: 1, HeadDim: 128, BlockSize: 16, MaxBlocksPerSeq: 4, KVDtype: ptx.BF16}, 512, 128, []int{128, 70}, 96, 4},
		{RopeConfig{Heads: 4, KVHeads: 2, HeadDim: 64, BlockSize: 8, MaxBlocksPerSeq: 8, KVDtype: ptx.F32}, 256, 64, []int{64, 9}, 32, 2},
	} {
		rc := c.rc
		n := (rc.Heads + 2*rc.KVHeads) * rc.HeadDim
		for _, rows := range c.rows {
			fused := GemmCopyConfig{K: c.k, N: n, Rows: c.layout, Split: 1, Stages: min(2, c.k/256), Rope: &rc}
			if c.pairs > 0 {
				fused = GemmCopyConfig{K: c.k, N: n, Rows: c.layout, Split: c.split, Stages: 2, Wide: c.pairs, Rope: &rc}
			}
			// The plain kernel a build pairs with it (for layers whose q/k/v an app's op
			// parts from rope_kv).
			plain := fused.plainTwin()
			t.Run(fmt.Sprintf("h%d_kv%d_d%d_%s_k%d_r%d_pairs%d_split%d_rows%d", rc.Heads, rc.KVHeads, rc.HeadDim, rc.KVDtype, c.k, c.layout, c.pairs, c.split, rows), func(t *testing.T) {
				checkRopeCopy(t, plain, fused, rows)
			})
		}
	}
}

func checkRopeCopy(t *testing.T, plain, fused GemmCopyConfig, rows int) {
	rc := *fused.Rope
	r := rand.New(rand.NewPCG(uint64(rows), uint64(fused.K+rc.HeadDim)))
	maxPos := rc.BlockSize * rc.MaxBlocksPerSeq
	seqs := 3
	kv := newKVFixture(r, rc, seqs)
	cos, sin := RopeTables(10000, rc.HeadDim, maxPos, nil)
	pos, seq := make([]uint32, rows), make([]uint32, rows)
	for i := range rows {
		// Different rows of a sequence write different slots, as a step's rows do.
		seq[i] = uint32(i % seqs)
		pos[i] = uint32((i/seqs*(rc.BlockSize+1) + []int{0, rc.BlockSize - 1, rc.BlockSize}[i%3]) % maxPos)
	}
	xs, ws := randF32(r, rows*fused.K, 1), randF32(r, fused.N*fused.K, 1)
	ropeArgs := []targ{{f32: cos}, {f32: sin}, {u32: pos}, {u32: seq}, {u32: kv.table}, kv.kcache, kv.vcache}

	// run emulates kernel k of config c and returns y and the caches, each cache's bytes as a
	// kernel left them; with then (the RopeKV kernel) it runs over y and the caches after k.
	run := func(c GemmCopyConfig, then *Kernel) (y, kc, vc []byte) {
		k := must(t)(GemmCopy("gemm_copy_test", c))
		mem := emu.NewMemory()
		put := func(b []byte) uint64 {
			a := mem.Alloc(len(b))
			copy(mem.Bytes(a), b)
			return a
		}
		a := c.Attrs()
		wm, err := emu.TensorMap2D(put(targ{bf16: ws}.bytesOf()), [2]int{c.K, c.N}, 2*c.K, a.Box, 2, a.Swizzle)
		if err != nil {
			t.Fatal(err)
		}
		xm, err := emu.TensorMap2D(put(targ{bf16: xs}.bytesOf()), [2]int{c.K, rows}, 2*c.K, a.XBox, 2, a.XSwizzle)
		if err != nil {
			t.Fatal(err)
		}
		ya := put(targ{out: rows * c.N}.bytesOf())
		var ropeP []uint64
		for _, arg := range ropeArgs {
			ropeP = append(ropeP, put(arg.bytesOf()))
		}
		params := []uint64{put(xm[:]), put(wm[:]), ya, uint64(rows)}
		if c.Rope != nil {
			params = append(params, ropeP...)
		}
		l := c.Launch()
		mod, err := ptx.Parse(k.PTX)
		if err != nil {
			t.Fatal(err)
		}
		mem.RecordReads()
		if err := emu.Run(mod, k.Name, emu.Launch{Grid: l.Grid, Block: l.Block, Shared: l.Shared, Lag: true}, mem, params); err != nil {
			t.Fatalf("%s: emulate: %v", k.Name, err)
		}
		// Launched early, the kernel reads before its wait only what the host wrote before the
		// step or the weights: cos, sin, the positions, the slots and the block table, never
		// x, y or the caches, which the grids ahead may still write.
		early := mem.EarlyLoads()
		if c.Rope != nil && len(early) == 0 {
			t.Fatalf("%s: nothing read before the wait, where the rotation's cos, sin and positions can be", k.Name)
		}
		for _, sp := range early {
			if !slices.ContainsFunc(ropeP[:5], func(a uint64) bool { return sp.Addr >= a && sp.Addr < a+uint64(len(mem.Bytes(a))) }) {
				t.Fatalf("%s: %d bytes at 0x%x read before the wait, in none of cos, sin, pos, seq and block_table", k.Name, sp.N, sp.Addr)
			}
		}
		if then != nil {
			rl := rc.Launch(rows)
			tm, err := ptx.Parse(then.PTX)
			if err != nil {
				t.Fatal(err)
			}
			if err := emu.Run(tm, then.Name, emu.Launch{Grid: rl.Grid, Block: rl.Block}, mem, append([]uint64{ya}, ropeP...)); err != nil {
				t.Fatalf("%s: emulate: %v", then.Name, err)
			}
		}
		cacheBytes := len(kv.kcache.bytesOf())
		return mem.Bytes(ya)[:4*rows*c.N], mem.Bytes(ropeP[5])[:cacheBytes], mem.Bytes(ropeP[6])[:cacheBytes]
	}
	yp, kp, vp := run(plain, must(t)(RopeKV("rope_test", rc)))
	yf, kf, vf := run(fused, nil)
	for _, o := range []struct {
		name      string
		got, want []byte
	}{{"y", yf, yp}, {"kcache", kf, kp}, {"vcache", vf, vp}} {
		if !bytes.Equal(o.got, o.want) {
			j := 0
			for j < len(o.got) && o.got[j] == o.want[j] {
				j++
			}
			t.Fatalf("%s differs from the plain GEMM and RopeKV's at byte %d of %d", o.name, j, len(o.want))
		}
	}
	// The reference op: the GEMM in f32 on the CPU, then rope_kv.
	k := must(t)(GemmCopy("gemm_copy_test", fused))
	ref, err := ops.Build(k.Op, k.Attrs)
	if err != nil {
		t.Fatal(err)
	}
	refArgs := []ops.Arg{{Mem: targ{f32: xs}.bytesOf()}, {Mem: targ{bf16: ws}.bytesOf()}, {Mem: targ{out: rows * fused.N}.bytesOf()}, {Bits: uint64(rows)}}
	for _, arg := range ropeArgs {
		refArgs = append(refArgs, ops.Arg{Mem: arg.bytesOf()})
	}
	if err := ref.Run(refArgs, fused.Launch()); err != nil {
		t.Fatal(err)
	}
	dt := kv.kcache.dtype
	for _, o := range []struct {
		name      string
		got, want []byte
		dtype     string
	}{{"y", yf, refArgs[2].Mem, "f32"}, {"kcache", kf, refArgs[9].Mem, dt}, {"vcache", vf, refArgs[10].Mem, dt}} {
		tol := 1e-5
		if o.dtype == "bf16" {
			tol = 1e-2
		}
		if e := relL2(floats(o.got, o.dtype), floats(o.want, o.dtype)); !(e <= tol) {
			t.Fatalf("%s: relative L2 error %.3g against the reference op, want at most %.3g", o.name, e, tol)
		}
	}
}
