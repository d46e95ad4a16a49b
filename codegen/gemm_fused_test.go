package codegen

import (
	"math"
	"math/rand/v2"
	"testing"

	"xmix/bundle"
	"xmix/ops"
	"xmix/ptx"
	"xmix/ptx/emu"
)

// emuBufs are named buffers in one emulator memory, for kernels run one after another over
// them (a fused kernel against the pair it replaces).
type emuBufs struct {
	mem  *emu.Memory
	addr map[string]uint64
	size map[string]int
}

func newEmuBufs() *emuBufs {
	return &emuBufs{mem: emu.NewMemory(), addr: map[string]uint64{}, size: map[string]int{}}
}

// run emulates k over args: an argument named like one run before is that buffer, as that
// kernel left it; a new one is laid out as checkKernel lays it out.
func (b *emuBufs) run(t *testing.T, k *Kernel, l ops.Launch, args []targ) {
	t.Helper()
	mod, err := ptx.Parse(k.PTX)
	if err != nil {
		t.Fatalf("%s: parse: %v", k.Name, err)
	}
	params := make([]uint64, len(args))
	for i, a := range args {
		if a.isVal {
			params[i] = a.bits
			continue
		}
		if _, ok := b.addr[a.name]; !ok {
			init := a.bytesOf()
			b.addr[a.name], b.size[a.name] = b.mem.Alloc(len(init)), len(init)
			copy(b.mem.Bytes(b.addr[a.name]), init)
		}
		params[i] = b.addr[a.name]
	}
	if err := emu.Run(mod, k.Name, emu.Launch{Grid: l.Grid, Block: l.Block}, b.mem, params); err != nil {
		t.Fatalf("%s: emulate: %v", k.Name, err)
	}
}

// f32 views buffer name as f32 values (a bf16 buffer's pairs of them).
func (b *emuBufs) f32(name string) []float32 {
	return ops.Arg{Mem: b.mem.Bytes(b.addr[name])[:b.size[name]]}.F32()
}

// samePair fails t unless buffer name holds the same bits after the fused kernel (fused) as
// after the pair it replaces (pair).
func samePair(t *testing.T, k *Kernel, name string, fused, pair *emuBufs) {
	t.Helper()
	sameBits(t, k.Name+" (fused, against the pair): "+name, fused.f32(name), pair.f32(name))
}

// fusedRopeCases cover GQA ratios 1, 2 and 4, both weight and cache dtypes, the bias, head
// dims whose halves are below, at and past a warp, and row counts of one partial tile, a
// whole one, and a whole one plus one (the full-tile loop, then the remainder's code).
var fusedRopeCases = []struct {
	rope RopeConfig
	k    int
	rows int
}{
	{RopeConfig{Heads: 4, KVHeads: 1, HeadDim: 32, BlockSize: 4, MaxBlocksPerSeq: 4, KVDtype: ptx.F32}, 48, 1},
	{RopeConfig{Heads: 2, KVHeads: 2, HeadDim: 64, BlockSize: 8, MaxBlocksPerSeq: 2, KVDtype: ptx.BF16, WDtype: ptx.BF16}, 64, 3},
	{RopeConfig{Heads: 4, KVHeads: 2, HeadDim: 16, BlockSize: 2, MaxBlocksPerSeq: 8, KVDtype: ptx.F32, Bias: true, WDtype: ptx.BF16}, 40, 8},
	{RopeConfig{Heads: 8, KVHeads: 2, HeadDim: 96, BlockSize: 4, MaxBlocksPerSeq: 4, KVDtype: ptx.BF16, Bias: true, WDtype: ptx.F32}, 32, 9},
}

// ropeArgs are a fused q/k/v GEMV's arguments (fused) or the pair's (the GEMM's, then
// RopeKV's) over the same data: rows spread over the cache pages and two sequences.
func ropeArgs(r *rand.Rand, c RopeConfig, k, rows int, wdt ptx.Type) (fused, gemm, rope []targ) {
	n := (c.Heads + 2*c.KVHeads) * c.HeadDim
	maxPos := c.BlockSize * c.MaxBlocksPerSeq
	cos, sin := RopeTables(10000, c.HeadDim, maxPos, nil)
	pos, seq := make([]uint32, rows), make([]uint32, rows)
	for i := range pos {
		pos[i], seq[i] = uint32((i*5+3)%maxPos), uint32(i%2)
	}
	kv := newKVFixture(r, c, 2)
	w := targ{name: "w", f32: randF32(r, n*k, 0.5)}
	if wdt == ptx.BF16 {
		w = targ{name: "w", bf16: w.f32}
	}
	gemm = []targ{{name: "x", f32: randF32(r, rows*k, 1)}, w, {name: "qkv", out: rows * n}, scalarU32("rows", uint32(rows))}
	rope = []targ{{name: "cos", f32: cos}, {name: "sin", f32: sin}, {name: "pos", u32: pos}, {name: "seq", u32: seq},
		{name: "block_table", u32: kv.table}, kv.kcache, kv.vcache}
	if c.Bias {
		b := targ{name: "bias", f32: randF32(r, n, 0.5)}
		if c.WDtype == ptx.BF16 {
			b.bf16, b.f32 = b.f32, nil
		}
		rope = append(rope, b)
	}
	fused = append(append([]targ(nil), gemm...), rope...)
	return fused, gemm, append([]targ{gemm[2]}, rope...)
}

// TestGemmRopeKernel: the fused q/k/v GEMV against its reference (op gemm, then op rope_kv),
// and bit for bit against the GEMV and the RopeKV kernel it replaces, in the q/k/v rows and
// both caches; with each column's K over one warp and split over four (GemmConfig.Split).
func TestGemmRopeKernel(t *testing.T) {
	r := rand.New(rand.NewPCG(61, 62))
	for _, tc := range fusedRopeCases {
		for _, v := range []struct {
			wdt   ptx.Type
			split int
		}{{ptx.F32, 1}, {ptx.BF16, 1}, {ptx.BF16, 4}} {
			wdt := v.wdt
			n := (tc.rope.Heads + 2*tc.rope.KVHeads) * tc.rope.HeadDim
			gc := GemmConfig{K: tc.k, N: n, WDtype: wdt, Split: v.split}
			c := GemmRopeConfig{Gemm: gc, Rope: tc.rope}
			fk := must(t)(GemmRope("gemm_rope_test", c))
			fused, gemm, rope := ropeArgs(r, tc.rope, tc.k, tc.rows, wdt)
			checkKernel(t, fk, c.Launch(tc.rows), fused)

			one, two := newEmuBufs(), newEmuBufs()
			one.run(t, fk, c.Launch(tc.rows), fused)
			two.run(t, must(t)(Gemm("gemm_test", gc)), gc.Launch(tc.rows), gemm)
			two.run(t, must(t)(RopeKV("rope_test", tc.rope)), tc.rope.Launch(tc.rows), rope)
			for _, b := range []string{"qkv", "kcache", "vcache"} {
				samePair(t, fk, b, one, two)
			}
			// Unrolled K steps (GemmConfig.Unroll) keep the fused GEMV's bits: K = 264 is 33
			// chunks of 8 (or 66 of 4), so lane 0 (and 1) runs an unrolled step of 2.
			long := c
			long.Gemm.K = 264
			unrolled := long
			unrolled.Gemm.Unroll = 2
			args, _, _ := ropeArgs(r, tc.rope, long.Gemm.K, tc.rows, wdt)
			three, four := newEmuBufs(), newEmuBufs()
			three.run(t, must(t)(GemmRope("gemm_rope_test", unrolled)), unrolled.Launch(tc.rows), args)
			four.run(t, must(t)(GemmRope("gemm_rope_test", long)), long.Launch(tc.rows), args)
			for _, b := range []string{"qkv", "kcache", "vcache"} {
				samePair(t, fk, b, three, four)
			}
		}
	}
}

func TestGemmRopeRefusesQKNorm(t *testing.T) {
	rc := RopeConfig{Heads: 2, KVHeads: 1, HeadDim: 8, BlockSize: 4, MaxBlocksPerSeq: 1, KVDtype: ptx.F32, QKNorm: true, Eps: 1e-6, WDtype: ptx.F32}
	if _, err := GemmRope("g", GemmRopeConfig{Gemm: GemmConfig{K: 8, N: 32, WDtype: ptx.F32}, Rope: rc}); err == nil {
		t.Error("a fused q/k/v GEMV with QK-norm was generated")
	}
	rc.QKNorm = false
	if _, err := GemmRope("g", GemmRopeConfig{Gemm: GemmConfig{K: 8, N: 24, WDtype: ptx.F32}, Rope: rc}); err == nil {
		t.Error("a fused q/k/v GEMV narrower than its q/k/v row was generated")
	}
}

// TestGemmGatedKernel: the fused gate/up GEMV against its reference (op gemm, then the gated
// op) and bit for bit against the GEMV and the SiLU*up (GELU*up) kernel it replaces, with
// each column's K over one warp and split over two, four or eight (GemmConfig.Split), in
// blocks of the default eight warps and of fewer (GemmConfig.Warps; the GEMV it replaces
// keeps eight).
func TestGemmGatedKernel(t *testing.T) {
	r := rand.New(rand.NewPCG(63, 64))
	for _, c := range []struct {
		k, inter, rows int
		wdt            ptx.Type
		act            string
		split, warps   int
	}{
		{64, 40, 1, ptx.BF16, "", 1, 0}, {37, 24, 3, ptx.F32, ActGeluTanh, 1, 0}, {96, 56, 8, ptx.BF16, ActGeluTanh, 1, 0}, {48, 20, 9, ptx.F32, "", 1, 0},
		{512, 40, 1, ptx.BF16, "", 2, 0}, {37, 24, 3, ptx.F32, ActGeluTanh, 8, 0}, {2056, 20, 9, ptx.BF16, "", 4, 0},
		{64, 40, 1, ptx.BF16, "", 1, 4}, {96, 56, 3, ptx.BF16, ActGeluTanh, 1, 2}, {37, 24, 9, ptx.F32, "", 1, 1}, {512, 40, 1, ptx.BF16, "", 2, 4},
	} {
		gc := GemmConfig{K: c.k, N: 2 * c.inter, WDtype: c.wdt, Split: c.split}
		fgc := gc
		fgc.Warps = c.warps
		fc := GemmGatedConfig{Gemm: fgc, Act: c.act}
		fk := must(t)(GemmGated("gemm_gated_test", fc))
		w := targ{name: "w", f32: randF32(r, gc.N*c.k, 0.5)}
		if c.wdt == ptx.BF16 {
			w = targ{name: "w", bf16: w.f32}
		}
		x := targ{name: "x", f32: randF32(r, c.rows*c.k, 2)}
		rows := scalarU32("rows", uint32(c.rows))
		act := targ{name: "act", out: c.rows * c.inter}
		checkKernel(t, fk, fc.Launch(c.rows), []targ{x, w, act, rows})

		one, two := newEmuBufs(), newEmuBufs()
		one.run(t, fk, fc.Launch(c.rows), []targ{x, w, act, rows})
		sc := SiluConfig{Inter: c.inter, Act: c.act}
		two.run(t, must(t)(Gemm("gemm_test", gc)), gc.Launch(c.rows), []targ{x, w, {name: "gu", out: c.rows * gc.N}, rows})
		two.run(t, must(t)(SiluMul("silu_test", sc)), sc.Launch(c.rows), []targ{{name: "gu"}, act, nullPtr(bundle.GatedActBF16), nullPtr(bundle.GatedGuBF16)})
		samePair(t, fk, "act", one, two)
	}
}

// TestFusedGemvColumnsAreTheGemvs: every column a fused GEMV computes is summed as the
// plain GEMV sums it, whatever the pair: a gate/up GEMV with the identity for an activation
// would be the plain one; here, with SiLU, act/up recovers SiLU(gate) for rows whose up is 1.
func TestFusedGemvColumnsAreTheGemvs(t *testing.T) {
	const k, inter, rows = 64, 16, 2
	r := rand.New(rand.NewPCG(65, 66))
	gc := GemmConfig{K: k, N: 2 * inter, WDtype: ptx.F32}
	w := randF32(r, gc.N*k, 0.5)
	x := randF32(r, rows*k, 1)
	// up = x[0]: its weight row is the unit vector e0.
	for j := inter; j < 2*inter; j++ {
		for i := range k {
			w[j*k+i] = 0
		}
		w[j*k] = 1
	}
	for r := range rows {
		x[r*k] = 1
	}
	fc := GemmGatedConfig{Gemm: gc}
	act := emulate(t, must(t)(GemmGated("gemm_gated_test", fc)), fc.Launch(rows),
		[]targ{{name: "x", f32: x}, {name: "w", f32: w}, {name: "act", out: rows * inter}, scalarU32("rows", rows)})[2]
	y := emulate(t, must(t)(Gemm("gemm_test", gc)), gc.Launch(rows),
		[]targ{{name: "x", f32: x}, {name: "w", f32: w}, {name: "y", out: rows * gc.N}, scalarU32("rows", rows)})[2]
	for r := range rows {
		for j := range inter {
			g := y[r*gc.N+j]
			want := float32(float64(g) / (1 + math.Exp(-float64(g))))
			if got := act[r*inter+j]; math.Abs(float64(got-want)) > 1e-6*math.Max(1, math.Abs(float64(want))) {
				t.Fatalf("row %d column %d: act %g, SiLU of the GEMV's gate %g", r, j, got, want)
			}
		}
	}
}
