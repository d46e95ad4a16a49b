package cuda

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"testing"

	"xmix/ops"
	"xmix/ptx"
	"xmix/ptx/emu"
)

// The cast kernel that feeds cuBLASLt rounds every f32 to the nearest-even bf16 in memory
// order, including when the grid-stride loop wraps (more pairs than threads).
func TestCastKernelRoundsToBF16(t *testing.T) {
	mod, err := ptx.Parse(castPTX)
	if err != nil {
		t.Fatal(err)
	}
	if err := ptx.Validate(mod); err != nil {
		t.Fatal(err)
	}
	for _, n := range []int{2, 512, 3 * 2048} {
		rng := rand.New(rand.NewPCG(uint64(n), 1))
		x := make([]float32, n)
		for i := range x {
			x[i] = float32(rng.NormFloat64() * math.Pow(10, float64(rng.IntN(8)-4)))
		}
		x[0] = float32(math.Float32frombits(0x3f808000)) // a tie: rounds to even (1.0)
		mem := emu.NewMemory()
		src, dst := mem.Alloc(4*n), mem.Alloc(2*n+2)
		for i, v := range x {
			binary.LittleEndian.PutUint32(mem.Bytes(src)[4*i:], math.Float32bits(v))
		}
		out := mem.Bytes(dst)
		binary.LittleEndian.PutUint16(out[2*n:], 0xdead) // past the end: must survive
		grid, block := castLaunch(n)
		grid = min(grid, 2) // force the grid-stride loop on the larger sizes
		l := emu.Launch{Grid: [3]int{grid, 1, 1}, Block: [3]int{block, 1, 1}}
		if err := emu.Run(mod, castEntry, l, mem, []uint64{src, dst, uint64(n / 2)}); err != nil {
			t.Fatal(err)
		}
		for i, v := range x {
			if got, want := binary.LittleEndian.Uint16(out[2*i:]), ops.F32ToBF16(v); got != want {
				t.Fatalf("n=%d element %d (%g): bf16 %#04x, want %#04x", n, i, v, got, want)
			}
		}
		if binary.LittleEndian.Uint16(out[2*n:]) != 0xdead {
			t.Fatalf("n=%d: wrote past the end", n)
		}
	}
}

func TestCastLaunchCoversEveryPair(t *testing.T) {
	for _, n := range []int{2, 510, 512, 514, 1 << 20, 1 << 24} {
		grid, block := castLaunch(n)
		if grid < 1 || grid > 1024 || block != 256 || (grid < 1024 && grid*block < n/2) {
			t.Errorf("n=%d: grid %d block %d", n, grid, block)
		}
	}
}

func TestUnknownGemmServerIsAnError(t *testing.T) {
	_, err := New(nil, nil, Options{Gemm: "cublas"})
	if err == nil || err.Error() != `unknown GEMM server "cublas": use auto, ptx or cublaslt` {
		t.Fatalf("got %v", err)
	}
}
