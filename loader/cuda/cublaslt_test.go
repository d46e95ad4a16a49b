package cuda

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"xmix/bundle"
	"xmix/ops"
	"xmix/ptx"
	"xmix/ptx/emu"
)

// The cast kernel that feeds cuBLASLt rounds every f32 to the nearest-even bf16 in memory
// order: four pairs a thread where x is 16-byte aligned, then the pairs past the last whole
// quad, or every pair one by one where x is not, including when the grid-stride loops wrap
// (more quads or pairs than threads).
func TestCastKernelRoundsToBF16(t *testing.T) {
	mod, err := ptx.Parse(castPTX)
	if err != nil {
		t.Fatal(err)
	}
	if err := ptx.Validate(mod); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		n, misalign int // misalign: x's bytes past a 16-byte boundary (a multiple of 8: x holds f32 pairs)
		maxGrid     int
	}{
		{2, 0, 1}, {6, 0, 1}, {8, 0, 1}, {14, 0, 1}, {512, 0, 1}, {3*2048 + 6, 0, 2}, {3 * 2048, 0, 8},
		{8, 8, 1}, {3*2048 + 6, 8, 2},
	} {
		n := c.n
		rng := rand.New(rand.NewPCG(uint64(n), 1))
		x := make([]float32, n)
		for i := range x {
			x[i] = float32(rng.NormFloat64() * math.Pow(10, float64(rng.IntN(8)-4)))
		}
		x[0] = float32(math.Float32frombits(0x3f808000))   // a tie: rounds to even (1.0)
		x[n-1] = float32(math.Float32frombits(0x3f818000)) // a tie: rounds to even (1.0234375)
		mem := emu.NewMemory()
		src, dst := mem.Alloc(4*n+16)+uint64(c.misalign), mem.Alloc(2*n+2)
		for i, v := range x {
			binary.LittleEndian.PutUint32(mem.Bytes(src)[4*i:], math.Float32bits(v))
		}
		out := mem.Bytes(dst)
		binary.LittleEndian.PutUint16(out[2*n:], 0xdead) // past the end: must survive
		pairs, quads := castWork(n, uintptr(src), true)
		if wantQuads := (n / 8) * (1 - c.misalign/8); quads != wantQuads || pairs != n/2 {
			t.Fatalf("n=%d misaligned by %d: %d pairs and %d quads, want %d and %d", n, c.misalign, pairs, quads, n/2, wantQuads)
		}
		grid, block := castLaunch(pairs, quads)
		grid = min(grid, c.maxGrid) // force the grid-stride loops on the larger sizes
		l := emu.Launch{Grid: [3]int{grid, 1, 1}, Block: [3]int{block, 1, 1}}
		if err := emu.Run(mod, castEntry, l, mem, []uint64{src, dst, uint64(pairs), uint64(quads)}); err != nil {
			t.Fatal(err)
		}
		for i, v := range x {
			if got, want := binary.LittleEndian.Uint16(out[2*i:]), ops.F32ToBF16(v); got != want {
				t.Fatalf("n=%d misaligned by %d, element %d (%g): bf16 %#04x, want %#04x", n, c.misalign, i, v, got, want)
			}
		}
		if binary.LittleEndian.Uint16(out[2*n:]) != 0xdead {
			t.Fatalf("n=%d: wrote past the end", n)
		}
	}
}

// The cast is launched early where the GEMM node's own kernel is (ltNode), so it must wait for
// the grid ahead before it reads x or writes its scratch.
func TestCastKernelWaitsBeforeMemory(t *testing.T) {
	wait := strings.Index(castPTX, bundle.PriorGridWait+";")
	if wait < 0 {
		t.Fatalf("the cast kernel never waits for the grid ahead (%s)", bundle.PriorGridWait)
	}
	for _, op := range []string{"ld.global", "st.global"} {
		if i := strings.Index(castPTX, op); i < wait {
			t.Errorf("%s at byte %d, before the wait at %d", op, i, wait)
		}
	}
}

// castLaunch gives a thread to every quad and to every pair past them, in at most 1024
// blocks; quads only ahead of a copy-engine GEMM and where x is 16-byte aligned: the 8B's down
// projection at 32 rows takes 224 blocks there, one a pair's 896 ahead of cuBLASLt.
func TestCastLaunchCoversEveryPair(t *testing.T) {
	for _, n := range []int{2, 510, 512, 514, 1 << 20, 1 << 24} {
		for _, x := range []uintptr{0, 8} {
			for _, wide := range []bool{true, false} {
				pairs, quads := castWork(n, x, wide)
				if quads != 0 && (!wide || x%16 != 0) {
					t.Errorf("n=%d x=%#x wide %v: %d quads, want none", n, x, wide, quads)
				}
				grid, block := castLaunch(pairs, quads)
				if grid < 1 || grid > 1024 || block != 256 || (grid < 1024 && (grid*block < quads || grid*block < pairs-4*quads)) {
					t.Errorf("n=%d x=%#x wide %v: grid %d block %d for %d pairs, %d quads", n, x, wide, grid, block, pairs, quads)
				}
			}
		}
	}
	if grid, _ := castLaunch(castWork(32*14336, 0, true)); grid != 224 {
		t.Errorf("32 x 14336 ahead of a copy-engine GEMM: %d blocks, want 224", grid)
	}
	if grid, _ := castLaunch(castWork(32*14336, 0, false)); grid != 896 {
		t.Errorf("32 x 14336 ahead of cuBLASLt: %d blocks, want one a pair's 896", grid)
	}
}

func TestUnknownGemmServerIsAnError(t *testing.T) {
	_, err := New(nil, nil, Options{Gemm: "cublas"})
	if err == nil || err.Error() != `unknown GEMM server "cublas": use auto, ptx or cublaslt` {
		t.Fatalf("got %v", err)
	}
}

// cuBLASLt serves the bundle's tensor-core GEMMs; a guarded one (a logit lens's LM head) only
// when its node is skipped on the guard's bits and those bits have graph variants, since the
// library call cannot exit early.
func TestCublasLtTakesGuardedGemmsOnlyWhereVariantsSkipThem(t *testing.T) {
	attrs := func(guard uint32) []byte { return ops.EncodeAttrs(bundle.GemmTCAttrs{K: 64, N: 32, Guard: guard}) }
	params := []bundle.Param{{Name: bundle.GemmX, Type: "u64"}, {Name: bundle.GemmW, Type: "u64"}, {Name: bundle.GemmY, Type: "u64"}, {Name: bundle.GemmRows, Type: "u32"}}
	guarded := append(params, bundle.Param{Name: "any_mask", Type: "u64"})
	be := &Backend{kernels: map[string]bundle.Kernel{
		"tc":    {Op: bundle.OpGemmTC, Attrs: attrs(0), Params: params},
		"tc_g8": {Op: bundle.OpGemmTC, Attrs: attrs(8), Params: guarded},
		"gemv":  {Op: "gemm", Attrs: attrs(0), Params: params},
	}}
	args := []bundle.Slot{{Buffer: "x"}, {Buffer: "w"}, {Buffer: "y"}, {Const: 8}, {Buffer: bundle.CtlAnyMask}}
	for _, c := range []struct {
		kernel     string
		skipUnless uint32
		variants   uint32
		want       bool
	}{
		{"tc", 0, 0, true},
		{"gemv", 0, 0, false},     // the CUDA-core kernel is always the bundle's own
		{"tc_g8", 8, 8 | 2, true}, // left out of every variant without a row enabling app 3
		{"tc_g8", 8, 2, false},    // past the variant cap: in every graph, needs its early exit
		{"tc_g8", 0, 0, false},    // guarded but never skipped
		{"tc", 8, 8, false},       // skipped on bits its kernel does not check
	} {
		n := bundle.Node{Kernel: c.kernel, Args: args[:4], SkipUnless: c.skipUnless}
		if c.kernel == "tc_g8" {
			n.Args = args
		}
		_, shape := be.gemm(n)
		if got := shape && ltMayServe(n, c.variants); got != c.want {
			t.Errorf("%s skip_unless %#x variants %#x: cuBLASLt serves it %v, want %v", c.kernel, c.skipUnless, c.variants, got, c.want)
		}
	}
}
