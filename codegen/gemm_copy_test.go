package codegen

import (
	"fmt"
	"math/rand/v2"
	"testing"

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
	x := targ{f32: randF32(r, rows*c.K, 1)}.bytesOf()
	w := targ{bf16: randF32(r, c.N*c.K, 1)}.bytesOf()
	y := targ{out: rows * c.N}.bytesOf()
	mem := emu.NewMemory()
	put := func(b []byte) uint64 {
		a := mem.Alloc(len(b))
		copy(mem.Bytes(a), b)
		return a
	}
	xa, wa, ya := put(x), put(w), put(y)
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
	refArgs := []ops.Arg{{Mem: x}, {Mem: w}, {Mem: append([]byte(nil), y...)}, {Bits: uint64(rows)}}
	if err := ref.Run(refArgs, l); err != nil {
		t.Fatalf("%s: reference: %v", k.Name, err)
	}
	return floats(mem.Bytes(ya)[:4*rows*c.N], "f32"), floats(refArgs[2].Mem[:4*rows*c.N], "f32")
}

func TestGemmCopyMatchesReference(t *testing.T) {
	for _, c := range []GemmCopyConfig{
		{K: 2048, N: 64, Split: 2, Stages: 2},  // four stages a CTA through two slots: refills and a phase flip
		{K: 1024, N: 128, Split: 1, Stages: 4}, // no cluster, every stage asked for before the wait
		{K: 512, N: 64, Split: 2, Stages: 1},   // one slot: every stage waits for its refill
	} {
		for _, rows := range []int{1, 3, 8} {
			t.Run(fmt.Sprintf("k%d_n%d_split%d_stages%d_rows%d", c.K, c.N, c.Split, c.Stages, rows), func(t *testing.T) {
				k := must(t)(GemmCopy("gemm_copy_test", c))
				got, want := runGemmCopy(t, k, c, rows, uint64(rows))
				if e := relL2(got, want); !(e <= 1e-5) {
					t.Fatalf("relative L2 error %.3g > 1e-5 (first values got %v want %v)", e, head(got), head(want))
				}
			})
		}
	}
}

func TestGemmCopyFor(t *testing.T) {
	for _, c := range []struct {
		k, n          int
		split, stages int
		err           bool
	}{
		{4096, 4096, 2, 4, false},  // the 8B's o: 64 column tiles, split
		{14336, 4096, 2, 4, false}, // down
		{4096, 6144, 1, 4, false},  // q/k/v: 96 tiles, not split
		{256, 6144, 1, 1, false},
		{4096, 100, 0, 0, true}, // N not a multiple of 64
		{384, 4096, 0, 0, true}, // K not a multiple of 512 under a split
	} {
		got, err := GemmCopyFor(c.k, c.n)
		if (err != nil) != c.err {
			t.Fatalf("GemmCopyFor(%d, %d): error %v, want error %v", c.k, c.n, err, c.err)
		}
		if err != nil {
			continue
		}
		if got.Split != c.split || got.Stages != c.stages {
			t.Errorf("GemmCopyFor(%d, %d) = %+v, want split %d, stages %d", c.k, c.n, got, c.split, c.stages)
		}
		if s := got.Attrs().Shared; s > gcShared {
			t.Errorf("GemmCopyFor(%d, %d): %d bytes of shared memory, past %d", c.k, c.n, s, gcShared)
		}
	}
	if _, err := GemmCopy("bad", GemmCopyConfig{K: 4096, N: 4096, Split: 2, Stages: 9}); err == nil {
		t.Error("GemmCopy took 9 stages past the shared memory")
	}
}
