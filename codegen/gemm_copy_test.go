package codegen

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"xmix/bundle"
	"xmix/ops"
	"xmix/ptx"
	"xmix/ptx/emu"
)

// runGemmCopy runs kernel k of configuration c over rows rows of random x and W in the
// emulator (W through the emulator's tensor map) and returns y with the reference op's y.
func runGemmCopy(t *testing.T, k *Kernel, c GemmCopyConfig, rows int, seed uint64) (got, want []float64) {
	t.Helper()
	mod, err := ptx.Parse(k.PTX)
	if err != nil {
		t.Fatalf("%s: parse: %v\n%s", k.Name, err, k.PTX)
	}
	r := rand.New(rand.NewPCG(seed, uint64(c.K*7+c.N)))
	xv := randF32(r, rows*c.K, 1)
	w := targ{bf16: randF32(r, c.N*c.K, 1)}.bytesOf()
	y := targ{out: rows * c.N}.bytesOf()
	kx := targ{f32: xv}.bytesOf() // x as the kernel takes it: bf16 where the backend casts it first
	if c.XBF16 {
		kx = targ{bf16: xv}.bytesOf()
	}
	mem := emu.NewMemory()
	put := func(b []byte) uint64 {
		a := mem.Alloc(len(b))
		copy(mem.Bytes(a), b)
		return a
	}
	xa, wa, ya := put(kx), put(w), put(y)
	a := c.Attrs()
	m, err := emu.TensorMap2D(wa, [2]int{c.K, c.N}, 2*c.K, a.Box, 2)
	if err != nil {
		t.Fatal(err)
	}
	ma := put(m[:])
	l := c.Launch()
	if err := emu.Run(mod, k.Name, emu.Launch{Grid: l.Grid, Block: l.Block, Shared: l.Shared}, mem, []uint64{xa, ma, ya, uint64(rows)}); err != nil {
		t.Fatalf("%s: emulate: %v", k.Name, err)
	}
	ref, err := ops.Build(k.Op, k.Attrs)
	if err != nil {
		t.Fatal(err)
	}
	refArgs := []ops.Arg{{Mem: kx}, {Mem: w}, {Mem: append([]byte(nil), y...)}, {Bits: uint64(rows)}}
	if err := ref.Run(refArgs, l); err != nil {
		t.Fatalf("%s: reference: %v", k.Name, err)
	}
	return floats(mem.Bytes(ya)[:4*rows*c.N], "f32"), floats(refArgs[2].Mem[:4*rows*c.N], "f32")
}

func TestGemmCopyMatchesReference(t *testing.T) {
	for _, c := range []struct {
		GemmCopyConfig
		rows []int
	}{
		{GemmCopyConfig{K: 2048, N: 64, Rows: 8, Split: 2, Stages: 2}, []int{1, 3, 8}},               // four stages a CTA through two slots: refills and a phase flip
		{GemmCopyConfig{K: 1024, N: 128, Rows: 8, Split: 1, Stages: 4}, []int{1, 3, 8}},              // no cluster, every stage asked for before the wait
		{GemmCopyConfig{K: 512, N: 64, Rows: 8, Split: 2, Stages: 1}, []int{1, 3, 8}},                // one slot: every stage waits for its refill
		{GemmCopyConfig{K: 1024, N: 64, Rows: 16, Split: 2, Stages: 2, XBF16: true}, []int{9, 16}},   // two row tiles, the second partly filled
		{GemmCopyConfig{K: 1024, N: 128, Rows: 32, Split: 1, Stages: 3, XBF16: true}, []int{17, 32}}, // four row tiles, a ring that wraps
		{GemmCopyConfig{K: 1024, N: 64, Rows: 32, Split: 2, Stages: 1, XBF16: true}, []int{25, 32}},  // four row tiles' sums through the cluster
		{GemmCopyConfig{K: 1024, N: 64, Rows: 16, Split: 2, Stages: 2}, []int{16}},                   // f32 x over two row tiles
	} {
		for _, rows := range c.rows {
			t.Run(fmt.Sprintf("k%d_n%d_r%d_split%d_stages%d_rows%d", c.K, c.N, c.Rows, c.Split, c.Stages, rows), func(t *testing.T) {
				k := must(t)(GemmCopy("gemm_copy_test", c.GemmCopyConfig))
				got, want := runGemmCopy(t, k, c.GemmCopyConfig, rows, uint64(rows))
				if e := relL2(got, want); !(e <= 1e-5) {
					t.Fatalf("relative L2 error %.3g > 1e-5 (first values got %v want %v)", e, head(got), head(want))
				}
			})
		}
	}
}

func TestGemmCopyFor(t *testing.T) {
	for _, c := range []struct {
		k, n, rows    int
		split, stages int
		err           bool
	}{
		{4096, 4096, 8, 2, 4, false},  // the 8B's o: 64 column tiles, split
		{14336, 4096, 8, 2, 4, false}, // down
		{4096, 6144, 8, 1, 4, false},  // q/k/v: 96 tiles, not split
		{4096, 6144, 16, 1, 4, false}, // 16 rows (x in bf16 from here)
		{4096, 4096, 32, 2, 4, false}, // 32 rows: four slots still fit
		{256, 6144, 8, 1, 1, false},
		{4096, 4096, 12, 0, 0, true}, // rows not one of gcRowsFor
		{4096, 100, 8, 0, 0, true},   // N not a multiple of 64
		{384, 4096, 8, 0, 0, true},   // K not a multiple of 512 under a split
	} {
		got, err := GemmCopyFor(c.k, c.n, c.rows)
		if (err != nil) != c.err {
			t.Fatalf("GemmCopyFor(%d, %d, %d): error %v, want error %v", c.k, c.n, c.rows, err, c.err)
		}
		if err != nil {
			continue
		}
		if got.Split != c.split || got.Stages != c.stages {
			t.Errorf("GemmCopyFor(%d, %d, %d) = %+v, want split %d, stages %d", c.k, c.n, c.rows, got, c.split, c.stages)
		}
		if s := got.Attrs().Shared; s > bundle.MaxDynamicShared {
			t.Errorf("GemmCopyFor(%d, %d, %d): %d bytes of shared memory, past %d", c.k, c.n, c.rows, s, bundle.MaxDynamicShared)
		}
	}
	for _, c := range []GemmCopyConfig{
		{K: 4096, N: 4096, Rows: 8, Split: 2, Stages: 9},  // past the shared memory
		{K: 4096, N: 4096, Rows: 32, Split: 2, Stages: 4}, // f32 x: three slots fit
		{K: 4096, N: 4096, Rows: 24, Split: 2, Stages: 2}, // rows not one of gcRowsFor
	} {
		if _, err := GemmCopy("bad", c); err == nil {
			t.Errorf("GemmCopy took %+v", c)
		}
	}
}
