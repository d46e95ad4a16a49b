package codegen

import (
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"xmix/bundle"
	"xmix/ptx"
)

// kvFixture is a paged cache for seqs sequences of maxBlocks pages each, with the pages
// shuffled over the pool so that a wrong page lookup shows.
type kvFixture struct {
	table          []uint32
	kcache, vcache targ
}

func newKVFixture(r *rand.Rand, c RopeConfig, seqs int) kvFixture {
	pages := seqs * c.MaxBlocksPerSeq
	table := make([]uint32, pages)
	for i, p := range r.Perm(pages) {
		table[i] = uint32(p)
	}
	n := pages * c.BlockSize * c.KVHeads * c.HeadDim
	cache := func(name string) targ {
		a := targ{name: name, out: n, f32: randF32(r, n, 1)}
		if c.KVDtype == ptx.BF16 {
			a.bf16, a.f32, a.dtype = a.f32, nil, "bf16"
		}
		return a
	}
	return kvFixture{table: table, kcache: cache("kcache"), vcache: cache("vcache")}
}

func TestRopeKVKernel(t *testing.T) {
	r := rand.New(rand.NewPCG(21, 22))
	for _, c := range []RopeConfig{
		{Heads: 4, KVHeads: 1, HeadDim: 32, BlockSize: 4, MaxBlocksPerSeq: 4, KVDtype: ptx.F32},
		{Heads: 2, KVHeads: 2, HeadDim: 64, BlockSize: 8, MaxBlocksPerSeq: 2, KVDtype: ptx.BF16},
		{Heads: 3, KVHeads: 1, HeadDim: 96, BlockSize: 2, MaxBlocksPerSeq: 8, KVDtype: ptx.F32},
		// Llama-3.1-8B's heads: 48 over three blocks of 16 per row (q; q; k and v).
		{Heads: 32, KVHeads: 8, HeadDim: 128, BlockSize: 4, MaxBlocksPerSeq: 8, KVDtype: ptx.BF16},
		// 24 heads over two blocks of 16: the second has k, v and 8 idle head slots.
		{Heads: 20, KVHeads: 2, HeadDim: 128, BlockSize: 4, MaxBlocksPerSeq: 8, KVDtype: ptx.F32},
	} {
		k, err := RopeKV("rope_test", c)
		if err != nil {
			t.Fatal(err)
		}
		const rows, seqs = 5, 3
		maxPos := c.BlockSize * c.MaxBlocksPerSeq
		cos, sin := RopeTables(10000, c.HeadDim, maxPos, nil)
		pos := []uint32{0, uint32(maxPos - 1), uint32(c.BlockSize), 3, uint32(maxPos / 2)}
		seq := []uint32{0, 2, 1, 2, 0}
		kv := newKVFixture(r, c, seqs)
		width := rows * (c.Heads + 2*c.KVHeads) * c.HeadDim
		checkKernel(t, k, c.Launch(rows), []targ{
			{name: "qkv", f32: randF32(r, width, 1), out: width},
			{name: "cos", f32: cos}, {name: "sin", f32: sin},
			{name: "pos", u32: pos}, {name: "seq", u32: seq}, {name: "block_table", u32: kv.table},
			kv.kcache, kv.vcache,
		})
	}
}

// A row's heads spread over blocks of headsPerBlock heads, one head per thread at most.
func TestRopeKVHeadGroups(t *testing.T) {
	for _, c := range []struct {
		heads, kvHeads, headDim, groups int
	}{{32, 8, 128, 3}, {20, 2, 128, 2}, {4, 1, 32, 1}, {64, 8, 64, 3}} {
		rc := RopeConfig{Heads: c.heads, KVHeads: c.kvHeads, HeadDim: c.headDim}
		if l := rc.Launch(5); l.Grid != [3]int{5, c.groups, 1} || l.Block[0]*l.Block[1] > ropeThreads {
			t.Errorf("%+v: grid %v block %v, want %d blocks per row", c, l.Grid, l.Block, c.groups)
		}
	}
}

func TestRopeKVRejectsBadShapes(t *testing.T) {
	for _, c := range []RopeConfig{
		{Heads: 4, KVHeads: 3, HeadDim: 32, BlockSize: 4, MaxBlocksPerSeq: 1, KVDtype: ptx.F32},
		{Heads: 4, KVHeads: 1, HeadDim: 32, BlockSize: 12, MaxBlocksPerSeq: 1, KVDtype: ptx.F32},
		{Heads: 4, KVHeads: 1, HeadDim: 32, BlockSize: 4, MaxBlocksPerSeq: 1, KVDtype: ptx.F16},
	} {
		if _, err := RopeKV("r", c); err == nil {
			t.Errorf("%+v accepted", c)
		}
	}
}

// TestRopeTablesLlama3 checks Llama 3.1's scaling (factor 8, low 1, high 4, original 8192) on
// one frequency of each regime, computed by hand from the formulas in float64.
func TestRopeTablesLlama3(t *testing.T) {
	s := &bundle.RopeScaling{Type: "llama3", Factor: 8, LowFreqFactor: 1, HighFreqFactor: 4, OriginalMaxPos: 8192}
	const theta, dim = 500000.0, 128
	inv := ropeInvFreq(theta, dim, s)
	base := func(i int) float64 { return math.Pow(theta, -float64(2*i)/dim) }
	// i=0: wavelength 2*pi, far below 8192/4 = 2048: unchanged.
	// i=63: wavelength about 2.6e6, above 8192: divided by the factor.
	// i=31: inv 1.736e-3, wavelength 3619, between 2048 and 8192: smoothed with
	// s = (8192/3619 - 1)/(4 - 1) = 0.4212.
	w31 := 2 * math.Pi / base(31)
	sm := (8192/w31 - 1) / 3
	for _, c := range []struct {
		i    int
		want float64
	}{{0, 1}, {63, base(63) / 8}, {31, (1-sm)*base(31)/8 + sm*base(31)}} {
		if got := float64(inv[c.i]); math.Abs(got-c.want) > 2e-6*c.want {
			t.Errorf("inv_freq[%d] = %.8g, want %.8g", c.i, got, c.want)
		}
	}
	if sm < 0.42 || sm > 0.43 {
		t.Errorf("frequency 31 smooth factor %g, want about 0.4212", sm)
	}
	cos, sin := RopeTables(theta, dim, 3, s)
	p, i := 2, 31
	ang := float64(float32(p) * inv[i])
	if cos[p*dim/2+i] != float32(math.Cos(ang)) || sin[p*dim/2+i] != float32(math.Sin(ang)) {
		t.Errorf("cos/sin at pos %d, freq %d: %g %g", p, i, cos[p*dim/2+i], sin[p*dim/2+i])
	}
	plain := ropeInvFreq(theta, dim, nil)
	if plain[63] != float32(1/float32(math.Pow(theta, float64(float32(126)/dim)))) {
		t.Errorf("unscaled inv_freq[63] = %g", plain[63])
	}
}

// TestRopeKVQwenKernel covers the bias (Qwen2) and QK-norm (Qwen3) options, alone and
// together, over head dims whose halves fill a warp, part of one, and one and a half.
func TestRopeKVQwenKernel(t *testing.T) {
	r := rand.New(rand.NewPCG(23, 24))
	for _, c := range []RopeConfig{
		{Heads: 4, KVHeads: 1, HeadDim: 32, BlockSize: 4, MaxBlocksPerSeq: 4, KVDtype: ptx.F32, Bias: true, WDtype: ptx.BF16},
		{Heads: 4, KVHeads: 2, HeadDim: 64, BlockSize: 8, MaxBlocksPerSeq: 2, KVDtype: ptx.BF16, QKNorm: true, Eps: 1e-6, WDtype: ptx.BF16},
		{Heads: 3, KVHeads: 1, HeadDim: 96, BlockSize: 2, MaxBlocksPerSeq: 8, KVDtype: ptx.F32, Bias: true, QKNorm: true, Eps: 1e-5, WDtype: ptx.F32},
		// 48 heads over three blocks of 16: the third normalises and rotates 8 k heads while
		// its other threads copy the v heads.
		{Heads: 32, KVHeads: 8, HeadDim: 128, BlockSize: 4, MaxBlocksPerSeq: 2, KVDtype: ptx.F32, QKNorm: true, Eps: 1e-6, WDtype: ptx.BF16},
	} {
		k, err := RopeKV("rope_qwen_test", c)
		if err != nil {
			t.Fatal(err)
		}
		const rows = 3
		args := ropeKVArgs(r, c, 1e6)
		for i, p := range k.Params {
			if p.Name != args[i].name {
				t.Fatalf("%+v: parameter %d is %s, want %s", c, i, p.Name, args[i].name)
			}
		}
		checkKernel(t, k, c.Launch(rows), args)
	}
}

func TestRopeKVRejectsBadOptions(t *testing.T) {
	base := RopeConfig{Heads: 2, KVHeads: 1, HeadDim: 8, BlockSize: 4, MaxBlocksPerSeq: 1, KVDtype: ptx.F32}
	noEps, noDtype := base, base
	noEps.QKNorm, noEps.WDtype = true, ptx.F32
	noDtype.Bias = true
	for _, c := range []RopeConfig{noEps, noDtype} {
		if _, err := RopeKV("r", c); err == nil {
			t.Errorf("%+v accepted", c)
		}
	}
}

// ropeKVArgs are RopeKV's arguments for c over three rows of two sequences (positions 0, the
// last and 3) with tables of base theta, and its bias and norm weights where c has them.
func ropeKVArgs(r *rand.Rand, c RopeConfig, theta float64) []targ {
	const rows, seqs = 3, 2
	maxPos := c.BlockSize * c.MaxBlocksPerSeq
	cos, sin := RopeTables(theta, c.HeadDim, maxPos, nil)
	kv := newKVFixture(r, c, seqs)
	width := (c.Heads + 2*c.KVHeads) * c.HeadDim
	args := []targ{
		{name: "qkv", f32: randF32(r, rows*width, 1), out: rows * width},
		{name: "cos", f32: cos}, {name: "sin", f32: sin},
		{name: "pos", u32: []uint32{0, uint32(maxPos - 1), 3}}, {name: "seq", u32: []uint32{0, 1, 1}},
		{name: "block_table", u32: kv.table}, kv.kcache, kv.vcache,
	}
	weight := func(name string, n int, scale float32) targ {
		a := targ{name: name, f32: randF32(r, n, scale)}
		if c.WDtype == ptx.BF16 {
			a.bf16, a.f32 = a.f32, nil
		}
		return a
	}
	if c.Bias {
		args = append(args, weight("bias", width, 0.5))
	}
	if c.QKNorm {
		args = append(args, weight("q_norm", c.HeadDim, 2), weight("k_norm", c.HeadDim, 2))
	}
	return args
}

// TestRopeKVFewerGroups: a row's heads shared among fewer blocks (RopeConfig.Groups), each
// thread rotating several heads one after another, write what the one-head-a-thread kernel
// writes, bit for bit (q/k/v in place, both caches), with the bias and the QK-norm too; Groups
// past headGroups is refused; OneWaveGroups fits a grid into a wave where it can.
func TestRopeKVFewerGroups(t *testing.T) {
	r := rand.New(rand.NewPCG(25, 26))
	for _, c := range []RopeConfig{
		{Heads: 32, KVHeads: 8, HeadDim: 128, BlockSize: 4, MaxBlocksPerSeq: 4, KVDtype: ptx.BF16},
		{Heads: 20, KVHeads: 2, HeadDim: 128, BlockSize: 4, MaxBlocksPerSeq: 4, KVDtype: ptx.F32},
		{Heads: 32, KVHeads: 8, HeadDim: 128, BlockSize: 4, MaxBlocksPerSeq: 2, KVDtype: ptx.F32, Bias: true, QKNorm: true, Eps: 1e-6, WDtype: ptx.BF16},
	} {
		const rows = 3
		args := ropeKVArgs(r, c, 5e5)
		want := newEmuBufs()
		want.run(t, must(t)(RopeKV("rope_all", c)), c.Launch(rows), args)
		for g := 1; g < c.headGroups(); g++ {
			c.Groups = g
			k := must(t)(RopeKV("rope_groups", c))
			if l := c.Launch(rows); l.Grid[1] != g {
				t.Fatalf("%+v: grid %v", c, l.Grid)
			}
			got := newEmuBufs()
			got.run(t, k, c.Launch(rows), args)
			for _, name := range []string{"qkv", "kcache", "vcache"} {
				if !slices.Equal(got.mem.Bytes(got.addr[name])[:got.size[name]], want.mem.Bytes(want.addr[name])[:want.size[name]]) {
					t.Fatalf("%+v: %s differs from one head a thread's", c, name)
				}
			}
			checkKernel(t, k, c.Launch(rows), args)
		}
		c.Groups = c.headGroups() + 1
		if _, err := RopeKV("rope_bad", c); err == nil || !strings.Contains(err.Error(), "blocks a row") {
			t.Errorf("%+v: err %v, want a refusal", c, err)
		}
	}
	c := RopeConfig{Heads: 32, KVHeads: 8, HeadDim: 128}
	for _, w := range []struct{ rows, groups int }{{64, 0}, {88, 0}, {89, 2}, {128, 2}, {256, 1}, {264, 1}, {265, 0}, {512, 0}} {
		if g := c.OneWaveGroups(w.rows, 264); g != w.groups {
			t.Errorf("OneWaveGroups(%d, 264) = %d, want %d", w.rows, g, w.groups)
		}
	}
}
