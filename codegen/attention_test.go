package codegen

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"xmix/bundle"
	"xmix/ops"
	"xmix/ptx"
	"xmix/ptx/emu"
)

// attnCall is one attention kernel call laid out in emulator memory: the reference op's seven
// arguments, then (split decode kernel) the workspace (unless its splits merge in a cluster)
// and the chunk word.
type attnCall struct {
	mod    *ptx.Module
	k      *Kernel
	launch ops.Launch
	args   []targ
	mem    *emu.Memory
	params []uint64
	ws     []byte // nil without a workspace
	z0     []float32
}

// newAttnCall lays out a call of k over rows at positions pos of sequences seq with a fresh
// random cache. z starts as z0 when given (kernels that compute some rows leave the others),
// else poisoned. chunk is the split kernel's positions per split.
func newAttnCall(t *testing.T, r *rand.Rand, k *Kernel, c AttnConfig, l ops.Launch, pos, seq []uint32, chunk uint32, z0 []float32) *attnCall {
	t.Helper()
	if k.Op != "attention" {
		t.Fatalf("op %q, want attention", k.Op)
	}
	mod, err := ptx.Parse(k.PTX)
	if err != nil {
		t.Fatalf("parse: %v\n%s", err, k.PTX)
	}
	seqs := 0
	for _, s := range seq {
		seqs = max(seqs, int(s)+1)
	}
	kv := newKVFixture(r, c.ropeConfig(), seqs)
	kv.kcache.out, kv.vcache.out = 0, 0 // read only
	rows := len(pos)
	a := &attnCall{mod: mod, k: k, launch: l, mem: emu.NewMemory(), z0: z0}
	// Scores of order 1-3 so the softmax is neither flat nor one-hot.
	a.args = []targ{
		{name: "qkv", f32: randF32(r, rows*(c.Heads+2*c.KVHeads)*c.HeadDim, 3)},
		{name: "pos", u32: pos}, {name: "seq", u32: seq}, {name: "block_table", u32: kv.table},
		kv.kcache, kv.vcache, {name: "z", out: rows * c.Heads * c.HeadDim, f32: z0},
	}
	switch k.Params[7].Name {
	case "rows":
		a.args = append(a.args, scalarU32("rows", uint32(rows)))
	case bundle.AttnZBF16:
		a.args = append(a.args, targ{name: bundle.AttnZBF16, out: rows * c.Heads * c.HeadDim, dtype: "bf16"})
	}
	for _, arg := range a.args {
		if arg.isVal {
			a.params = append(a.params, arg.bits)
			continue
		}
		b := arg.bytesOf()
		addr := a.mem.Alloc(len(b))
		copy(a.mem.Bytes(addr), b)
		a.params = append(a.params, addr)
	}
	if c.Split {
		if c.Cluster == 0 {
			var wsAddr uint64
			if n := c.SplitWorkspaceBytes(rows, l.Grid[2]); n > 0 {
				wsAddr = a.mem.Alloc(n)
				a.ws = a.mem.Bytes(wsAddr)[:n]
				clear(a.ws)
			}
			a.params = append(a.params, wsAddr)
		}
		ca := a.mem.Alloc(4)
		binary.LittleEndian.PutUint32(a.mem.Bytes(ca), chunk)
		a.params = append(a.params, ca)
	}
	if len(a.params) != len(k.Params) {
		t.Fatalf("%d args, kernel has %d params", len(a.params), len(k.Params))
	}
	return a
}

// run emulates the kernel over z's initial contents (and z_bf16's, where the kernel takes
// it), checks that the split counters are back at zero and returns z's bytes.
func (a *attnCall) run(t *testing.T) []byte {
	t.Helper()
	z := a.mem.Bytes(a.params[6])[:4*a.args[6].out]
	copy(z, a.args[6].bytesOf())
	if zb := a.zBF16(); zb != nil {
		copy(zb, a.args[7].bytesOf())
	}
	if err := emu.Run(a.mod, a.k.Name, emu.Launch{Grid: a.launch.Grid, Block: a.launch.Block}, a.mem, a.params); err != nil {
		t.Fatalf("emulate: %v", err)
	}
	if a.ws != nil {
		for i := range a.launch.Grid[0] * a.launch.Grid[1] {
			if v := binary.LittleEndian.Uint32(a.ws[4*i:]); v != 0 {
				t.Fatalf("counter %d left at %d", i, v)
			}
		}
	}
	return append([]byte(nil), z...)
}

// reference runs op "attention" on the seven arguments the kernel shares with it.
func (a *attnCall) reference(t *testing.T) []byte {
	t.Helper()
	ref, err := ops.Build(a.k.Op, a.k.Attrs)
	if err != nil {
		t.Fatal(err)
	}
	args := make([]ops.Arg, len(a.args))
	for i, arg := range a.args {
		args[i] = ops.Arg{Mem: arg.bytesOf(), Bits: arg.bits}
	}
	if err := ref.Run(args, a.launch); err != nil {
		t.Fatalf("reference: %v", err)
	}
	return args[6].Mem
}

// zBF16 is z_bf16's bytes where the kernel takes it and the call passes a buffer, else nil.
func (a *attnCall) zBF16() []byte {
	if len(a.args) < 8 || a.args[7].name != bundle.AttnZBF16 || a.params[7] == 0 {
		return nil
	}
	return a.mem.Bytes(a.params[7])[:2*a.args[7].out]
}

// checkZBF16 checks, where the kernel takes z_bf16, that it wrote bf16 of its own z bit for
// bit (the cast's rounding) in every row it computes and nothing in the others, and that
// passed 0 there it writes z's same bits and stores nothing else (a store would fault). A
// kernel built with ZOptional, passed a z of 0, writes the same z_bf16 alone, as its
// reference op does (checkZAlone).
func (a *attnCall) checkZBF16(t *testing.T, z []byte) {
	t.Helper()
	zb := a.zBF16()
	if zb == nil {
		return
	}
	var a0 struct {
		Rows        string `json:"rows"`
		OutOptional bool   `json:"out_optional"`
	}
	if err := json.Unmarshal(a.k.Attrs, &a0); err != nil {
		t.Fatal(err)
	}
	seq := a.args[2].u32
	per := len(zb) / 2 / len(seq)
	got, y := ops.Arg{Mem: zb}.U16(), ops.Arg{Mem: z}.F32()
	for i, v := range y[:len(got)] {
		want := ops.F32ToBF16(v)
		if a0.Rows == ops.AttnRowsSingle && !ops.AttnRowSingle(seq, i/per) {
			want = 0xFFFF // left as it was
		}
		if got[i] != want {
			t.Fatalf("z_bf16[%d] = %#04x, want %#04x (z %v)", i, got[i], want, v)
		}
	}
	if a0.OutOptional {
		a.checkZAlone(t, bytes.Clone(zb))
	}
	addr := a.params[7]
	a.params[7] = 0
	again := a.run(t)
	a.params[7] = addr
	if !bytes.Equal(again, z) {
		t.Fatal("z differs with z_bf16 0")
	}
}

// checkZAlone runs the kernel with a z of 0 and checks that it writes z_bf16 as want (what it
// wrote beside z), and its reference op with and without z: the same z_bf16 either way.
func (a *attnCall) checkZAlone(t *testing.T, want []byte) {
	t.Helper()
	zb := a.zBF16()
	copy(zb, a.args[7].bytesOf())
	zAddr := a.params[6]
	a.params[6] = 0
	err := emu.Run(a.mod, a.k.Name, emu.Launch{Grid: a.launch.Grid, Block: a.launch.Block}, a.mem, a.params)
	a.params[6] = zAddr
	if err != nil {
		t.Fatalf("emulate with z 0: %v", err)
	}
	if !bytes.Equal(zb, want) {
		t.Fatal("z_bf16 alone differs from z_bf16 beside z")
	}
	ref, err := ops.Build(a.k.Op, a.k.Attrs)
	if err != nil {
		t.Fatal(err)
	}
	var zbs [2][]byte
	for i := range zbs {
		args := make([]ops.Arg, 8)
		for j, arg := range a.args[:8] {
			args[j] = ops.Arg{Mem: arg.bytesOf(), Bits: arg.bits}
		}
		if i == 1 {
			args[6] = ops.Arg{}
		}
		if err := ref.Run(args, a.launch); err != nil {
			t.Fatalf("reference (z 0: %v): %v", i == 1, err)
		}
		zbs[i] = args[7].Mem
	}
	if !bytes.Equal(zbs[0], zbs[1]) {
		t.Fatal("the reference's z_bf16 with z 0 differs from its z_bf16 beside z")
	}
}

func (a *attnCall) check(t *testing.T, tol float64) {
	t.Helper()
	z := a.run(t)
	a.checkZBF16(t, z)
	g, w := floats(z, "f32"), floats(a.reference(t), "f32")
	if e := relL2(g, w); !(e <= tol) {
		rows := len(a.args[1].u32)
		per := len(w) / rows
		for r := range rows {
			if e := relL2(g[r*per:(r+1)*per], w[r*per:(r+1)*per]); !(e <= tol) {
				t.Errorf("row %d (pos %d, seq %d): relative L2 error %.3g (got %v want %v)", r, a.args[1].u32[r], a.args[2].u32[r], e, head(g[r*per:]), head(w[r*per:]))
			}
		}
		t.Fatalf("relative L2 error %.3g", e)
	}
}

// attnShapes are the attention shapes the kernels are checked on: GQA groups of 1, 4 and 8,
// head dims 32 to 128 (96: lanes that are not a power of two per row), f32 and bf16 caches.
var attnShapes = []AttnConfig{
	{Heads: 8, KVHeads: 2, HeadDim: 32, BlockSize: 16, MaxBlocksPerSeq: 20, KVDtype: ptx.F32},
	{Heads: 2, KVHeads: 2, HeadDim: 64, BlockSize: 8, MaxBlocksPerSeq: 40, KVDtype: ptx.BF16},
	{Heads: 8, KVHeads: 2, HeadDim: 128, BlockSize: 16, MaxBlocksPerSeq: 19, KVDtype: ptx.BF16},
	{Heads: 8, KVHeads: 1, HeadDim: 64, BlockSize: 16, MaxBlocksPerSeq: 19, KVDtype: ptx.BF16},
	{Heads: 2, KVHeads: 2, HeadDim: 128, BlockSize: 32, MaxBlocksPerSeq: 10, KVDtype: ptx.F32},
	{Heads: 6, KVHeads: 2, HeadDim: 96, BlockSize: 4, MaxBlocksPerSeq: 75, KVDtype: ptx.F32},
}

func scaled(c AttnConfig) AttnConfig {
	c.Scale = float32(1 / math.Sqrt(float64(c.HeadDim)))
	return c
}

// TestAttentionDecode: every row computed, one split.
func TestAttentionDecode(t *testing.T) {
	r := rand.New(rand.NewPCG(31, 32))
	for _, c := range attnShapes {
		c = scaled(c)
		t.Run(fmt.Sprintf("h%d_kv%d_d%d_%s", c.Heads, c.KVHeads, c.HeadDim, c.KVDtype), func(t *testing.T) {
			k := must(t)(Attention("attn_test", c))
			maxPos := uint32(c.BlockSize * c.MaxBlocksPerSeq)
			// Ragged contexts: the first position, one block, one past, the last position.
			pos := []uint32{0, uint32(c.BlockSize - 1), uint32(c.BlockSize), maxPos - 1, maxPos / 2}
			seq := []uint32{1, 0, 2, 0, 1}
			newAttnCall(t, r, k, c, c.Launch(len(pos), 1), pos, seq, 0, nil).check(t, 1e-5)
		})
	}
}

// splitBoundaryRows are decode rows at contexts on a split kernel's boundaries for chunks of
// chunk positions over splits splits (one position, exactly one split, one past, two, every
// split, the longest context maxPos, where they fit), over three sequences.
func splitBoundaryRows(chunk, splits, maxPos int) (pos, seq []uint32) {
	for _, n := range []int{1, chunk, chunk + 1, 2 * chunk, splits * chunk, maxPos} {
		if n <= maxPos {
			pos = append(pos, uint32(n-1))
		}
	}
	for i := range pos {
		seq = append(seq, uint32(i%3))
	}
	return pos, seq
}

// TestAttentionDecodeSplit: contexts at the split boundaries (one position, exactly one split,
// one past, exactly k splits, the grid's last split) and a chunk word too small for the grid,
// which the kernel raises.
func TestAttentionDecodeSplit(t *testing.T) {
	r := rand.New(rand.NewPCG(41, 42))
	for _, c := range attnShapes {
		c = scaled(c)
		c.Split = true
		maxPos := c.BlockSize * c.MaxBlocksPerSeq
		for _, sc := range []struct{ splits, chunk int }{{3, 64}, {8, 32}, {5, 5}, {4, 1}, {40, 2}} {
			name := fmt.Sprintf("h%d_kv%d_d%d_%s_s%d_c%d", c.Heads, c.KVHeads, c.HeadDim, c.KVDtype, sc.splits, sc.chunk)
			t.Run(name, func(t *testing.T) {
				k := must(t)(Attention("attn_split_test", c))
				pos, seq := splitBoundaryRows(sc.chunk, sc.splits, maxPos)
				a := newAttnCall(t, r, k, c, c.Launch(len(pos), sc.splits), pos, seq, uint32(sc.chunk), nil)
				a.check(t, 1e-5)
			})
		}
	}
}

// TestAttentionDecodeCluster: a row's splits merged in its cluster (AttnConfig.Cluster) give
// the reference's attention on the CUDA-core and the tensor-core step, at the split boundaries
// (one position, exactly one split, one past, the cluster's every split, a chunk word the
// kernel raises to fill the cluster), and the kernel has no workspace and draws no ticket.
func TestAttentionDecodeCluster(t *testing.T) {
	r := rand.New(rand.NewPCG(45, 46))
	shapes := append(slices.Clone(attnShapes), attnTCShapes...)
	for i, c := range shapes {
		c = scaled(c)
		tol := 1e-5
		if i >= len(attnShapes) {
			c.TensorCores, tol = true, attnTCTolerance
		}
		c.Split = true
		maxPos := c.BlockSize * c.MaxBlocksPerSeq
		for _, sc := range []struct{ cluster, chunk int }{{2, 64}, {3, 16}, {4, 32}, {8, 5}} {
			c.Cluster = sc.cluster
			name := fmt.Sprintf("h%d_kv%d_d%d_%s%s_c%d", c.Heads, c.KVHeads, c.HeadDim, c.KVDtype, AttnKernelSuffix(c), sc.chunk)
			t.Run(name, func(t *testing.T) {
				if c.sharedBytes() > maxStaticShared {
					if _, err := Attention("attn_cluster_test", c); err == nil || !strings.Contains(err.Error(), "or a smaller cluster") {
						t.Fatalf("records past shared memory: %v", err)
					}
					return
				}
				k := must(t)(Attention("attn_cluster_test", c))
				if !strings.Contains(k.PTX, fmt.Sprintf(".reqnctapercluster %d, 1, 1", sc.cluster)) || strings.Contains(k.PTX, "atom.") || strings.Contains(k.PTX, "membar") {
					t.Fatal("not a cluster kernel, or one that still draws a ticket")
				}
				pos, seq := splitBoundaryRows(sc.chunk, sc.cluster, maxPos)
				l := c.Launch(len(pos), sc.cluster)
				if want := [3]int{len(pos) * sc.cluster, c.Heads / c.geom().hpb, 1}; l.Grid != want {
					t.Fatalf("grid %v, want %v", l.Grid, want)
				}
				a := newAttnCall(t, r, k, c, l, pos, seq, uint32(sc.chunk), nil)
				a.check(t, tol)
				if !bytes.Equal(a.run(t), a.run(t)) {
					t.Fatal("a replay's z differs")
				}
				if k.Attrs == nil || c.SplitWorkspaceBytes(len(pos), sc.cluster) != 0 {
					t.Fatal("a cluster kernel sizes a workspace")
				}
			})
		}
	}
}

// TestClusterSplits: on Llama-3.1-8B's shape the buckets of 4, 8 and 16 rows (8-warp blocks,
// 264 a wave) merge in clusters of the splits that fit one wave; one and two rows need more
// splits than a cluster holds, 32 rows and more fill the wave without splitting.
func TestClusterSplits(t *testing.T) {
	c := AttnConfig{Heads: 32, KVHeads: 8, HeadDim: 128, BlockSize: 16, MaxBlocksPerSeq: 512, KVDtype: ptx.BF16, Scale: 0.088, TensorCores: true}
	for rows, want := range map[int]int{1: 0, 2: 0, 4: 8, 8: 4, 16: 2, 32: 0, 64: 0, 128: 0} {
		cw := c
		cw.Warps = c.DecodeWarps(rows)
		if got := cw.ClusterSplits(rows); got != want {
			t.Errorf("%d rows: cluster of %d, want %d", rows, got, want)
		}
	}
	// Eight heads of dim 128 a block, 33 rows: 8 splits fill the wave, but their records
	// would not fit in shared memory; 7 do.
	wide := AttnConfig{Heads: 16, KVHeads: 1, HeadDim: 128, BlockSize: 16, MaxBlocksPerSeq: 19, KVDtype: ptx.BF16, Scale: 0.088, TensorCores: true, Warps: 4}
	if got := wide.ClusterSplits(33); got != 7 {
		t.Errorf("8 heads of dim 128, 4 warps, 33 rows: cluster of %d, want 7", got)
	}
}

// TestAttentionDecodeWarps: blocks of other warp counts and steps of other load counts
// (xmixc build --attn-warps, --attn-unroll) compute the same attention, split and not, and
// their split plan counts a pass's positions and a wave's blocks by them.
func TestAttentionDecodeWarps(t *testing.T) {
	r := rand.New(rand.NewPCG(47, 48))
	for _, base := range []AttnConfig{attnShapes[0], attnShapes[2]} {
		base = scaled(base)
		maxPos := base.BlockSize * base.MaxBlocksPerSeq
		for _, wu := range [][2]int{{1, 1}, {8, 0}, {16, 0}, {0, 8}, {16, 2}} {
			c := base
			c.Warps, c.Unroll = wu[0], wu[1]
			for _, split := range []bool{false, true} {
				c.Split = split
				t.Run(fmt.Sprintf("d%d_%s_w%d_u%d_split%v", c.HeadDim, c.KVDtype, c.Warps, c.Unroll, split), func(t *testing.T) {
					k := must(t)(Attention("attn_warps_test", c))
					if !strings.Contains(k.PTX, fmt.Sprintf(".maxntid %d", 32*c.warps())) {
						t.Errorf("kernel not built for %d threads", 32*c.warps())
					}
					if shared := staticShared(t, k); shared != c.sharedBytes() || shared > maxStaticShared {
						t.Errorf("%d bytes of static shared memory (sharedBytes %d, at most %d)", shared, c.sharedBytes(), maxStaticShared)
					}
					pos := []uint32{0, 37, uint32(maxPos - 1), uint32(maxPos / 3)}
					seq := []uint32{0, 1, 2, 1}
					splits, chunk := 1, 0
					if split {
						splits, chunk = 5, 48
					}
					newAttnCall(t, r, k, c, c.Launch(len(pos), splits), pos, seq, uint32(chunk), nil).check(t, 1e-5)
				})
			}
		}
	}
	c := AttnConfig{Heads: 32, KVHeads: 8, HeadDim: 128, BlockSize: 16, MaxBlocksPerSeq: 512, KVDtype: ptx.BF16, Scale: 0.088, Split: true}
	for _, wu := range [][4]int{{0, 0, 32, 4 * 132}, {16, 0, 128, 132}, {8, 8, 128, 2 * 132}} {
		c.Warps, c.Unroll = wu[0], wu[1]
		if p := c.splitPlan(8); p.Step != wu[2] || p.MinChunk != max(64, wu[2]) || p.WaveBlocks != wu[3] {
			t.Errorf("warps %d unroll %d: plan %+v, want step %d, wave %d", wu[0], wu[1], *p, wu[2], wu[3])
		}
		if l := c.Launch(1, 8); l.Block[0] != 32*c.warps() {
			t.Errorf("warps %d: block %v", wu[0], l.Block)
		}
	}
}

// TestDecodeWarps: decode buckets of up to 32 rows get 8 warps where their merge states fit
// in shared memory, those whose blocks of 4 warps would take more than one wave 2, the rest 4.
func TestDecodeWarps(t *testing.T) {
	llama := AttnConfig{Heads: 32, KVHeads: 8, HeadDim: 128, BlockSize: 16, MaxBlocksPerSeq: 512, KVDtype: ptx.BF16, Scale: 0.088, Split: true}
	wide := AttnConfig{Heads: 16, KVHeads: 2, HeadDim: 256, BlockSize: 16, MaxBlocksPerSeq: 512, KVDtype: ptx.BF16, Scale: 0.0625, Split: true}
	for _, c := range []struct {
		cfg        AttnConfig
		rows, want int
	}{{llama, 1, 8}, {llama, 32, 8}, {llama, 64, 4}, {llama, 66, 4}, {llama, 67, 2}, {llama, 128, 2}, {wide, 1, 4}, {wide, 264, 4}, {wide, 265, 2}} {
		if got := c.cfg.DecodeWarps(c.rows); got != c.want {
			t.Errorf("h%d kv%d d%d, %d rows: %d warps, want %d", c.cfg.Heads, c.cfg.KVHeads, c.cfg.HeadDim, c.rows, got, c.want)
		}
		cfg := c.cfg
		cfg.Warps = c.want
		must(t)(Attention("a", cfg))
	}
	wide.Warps = 8
	if _, err := Attention("a", wide); err == nil || !strings.Contains(err.Error(), "past 49152; use fewer warps") {
		t.Errorf("8 warps of 8 heads of dim 256: %v", err)
	}
}

// TestAttentionDecodeReplay runs the split kernel twice on the same memory, as a replayed
// graph does: the second run must find the counters reset and give the same z bit for bit.
func TestAttentionDecodeReplay(t *testing.T) {
	c := AttnConfig{Heads: 8, KVHeads: 2, HeadDim: 64, BlockSize: 16, MaxBlocksPerSeq: 16, KVDtype: ptx.BF16, Scale: 0.125, Split: true}
	r := rand.New(rand.NewPCG(43, 44))
	k := must(t)(Attention("a", c))
	a := newAttnCall(t, r, k, c, c.Launch(3, 5), []uint32{255, 3, 100}, []uint32{0, 1, 1}, 48, nil)
	if a.ws == nil {
		t.Fatal("5 splits without a workspace")
	}
	first := a.run(t)
	if second := a.run(t); !bytes.Equal(first, second) {
		t.Fatal("second run's z differs from the first")
	}
}

// prefillRows is a prefill step's rows: decode rows of three sequences, a chunk of sequence 3
// crossing KV blocks, a one-token chunk of sequence 4, a chunk of sequence 5, padding rows.
func prefillRows(c AttnConfig) (pos, seq []uint32) {
	add := func(s uint32, ps ...uint32) {
		for _, p := range ps {
			pos, seq = append(pos, p), append(seq, s)
		}
	}
	bs := uint32(c.BlockSize)
	add(0, 3*bs+2)
	add(1, 0)
	add(2, 5)
	for p := bs - 3; p < 3*bs+4; p++ {
		add(3, p)
	}
	add(4, bs)
	for p := range uint32(19) {
		add(5, p+7)
	}
	for p := range uint32(5) {
		add(6, p)
	}
	return pos, seq
}

// TestAttentionSingles: the decode kernel of a prefill template, its step on CUDA cores or on
// tensor cores, computes the rows alone of their sequence and leaves the others.
func TestAttentionSingles(t *testing.T) {
	r := rand.New(rand.NewPCG(45, 46))
	for _, c := range append(slices.Clone(attnShapes[:3]), attnTCShapes[1]) {
		c = scaled(c)
		c.Singles = true
		k := must(t)(Attention("attn_singles", c))
		pos, seq := prefillRows(c)
		z0 := randF32(r, len(pos)*c.Heads*c.HeadDim, 1)
		tol := 1e-5
		if c.tcOK() {
			tol = attnTCTolerance
		}
		newAttnCall(t, r, k, c, c.Launch(len(pos), 1), pos, seq, 0, z0).check(t, tol)
	}
}

func TestAttentionPublic(t *testing.T) {
	// Llama-3.1-8B, -3.2-1B and -70B shapes.
	for _, c := range []struct {
		cfg    AttnConfig
		splits int
		grid   [3]int
		ws     int // at 2 rows
	}{
		{AttnConfig{Heads: 32, KVHeads: 8, HeadDim: 128, BlockSize: 16, MaxBlocksPerSeq: 512, KVDtype: ptx.BF16, Scale: 0.088, Split: true}, 32, [3]int{2, 8, 32}, 64 + 2*32*32*132*4},
		{AttnConfig{Heads: 32, KVHeads: 8, HeadDim: 64, BlockSize: 16, MaxBlocksPerSeq: 512, KVDtype: ptx.BF16, Scale: 0.125, Split: true}, 16, [3]int{2, 8, 16}, 64 + 2*32*16*68*4},
		{AttnConfig{Heads: 64, KVHeads: 8, HeadDim: 128, BlockSize: 16, MaxBlocksPerSeq: 512, KVDtype: ptx.BF16, Scale: 0.088}, 1, [3]int{2, 8, 1}, 0},
	} {
		l := c.cfg.Launch(2, c.splits)
		if l.Grid != c.grid || l.Block != [3]int{128, 1, 1} {
			t.Errorf("%+v: launch %v", c.cfg, l)
		}
		if ws := c.cfg.SplitWorkspaceBytes(2, c.splits); ws != c.ws {
			t.Errorf("%+v: workspace %d, want %d", c.cfg, ws, c.ws)
		}
		k := must(t)(Attention("a", c.cfg))
		want := "qkv,pos,seq,block_table,kcache,vcache,z,z_bf16"
		if c.cfg.Split {
			want += ",ws,chunk"
		}
		if got := strings.Join(paramNames(k), ","); got != want {
			t.Errorf("params %s", got)
		}
		if shared := staticShared(t, k); shared != c.cfg.sharedBytes() || shared > maxStaticShared {
			t.Errorf("%+v: %d bytes of static shared memory (sharedBytes %d)", c.cfg, shared, c.cfg.sharedBytes())
		}
	}
	// Splits per decode bucket on Llama-3.1-8B: the GPU filled, never past the grid bound.
	c := AttnConfig{Heads: 32, KVHeads: 8}
	for rows, want := range map[int]int{1: 66, 8: 9, 32: 3, 128: 1} {
		if got := c.DecodeSplits(rows); got != want {
			t.Errorf("%d rows: %d splits, want %d", rows, got, want)
		}
	}
	if got := (AttnConfig{Heads: 8, KVHeads: 1}).DecodeSplits(1); got != AttnMaxSplits {
		t.Errorf("MQA batch 1: %d splits, want %d", got, AttnMaxSplits)
	}
}

func TestAttentionRejects(t *testing.T) {
	ok := AttnConfig{Heads: 4, KVHeads: 1, HeadDim: 32, BlockSize: 4, MaxBlocksPerSeq: 1, KVDtype: ptx.F32, Scale: 1}
	for _, c := range []struct {
		name string
		edit func(*AttnConfig)
	}{
		{"head dim 48", func(c *AttnConfig) { c.HeadDim = 48 }},
		{"head dim 288", func(c *AttnConfig) { c.HeadDim = 288 }},
		{"no scale", func(c *AttnConfig) { c.Scale = 0 }},
		{"infinite scale", func(c *AttnConfig) { c.Scale = float32(math.Inf(1)) }},
		{"f16 cache", func(c *AttnConfig) { c.KVDtype = ptx.F16 }},
		{"heads not a multiple", func(c *AttnConfig) { c.Heads = 3; c.KVHeads = 2 }},
		{"block size 3", func(c *AttnConfig) { c.BlockSize = 3 }},
		{"17 warps", func(c *AttnConfig) { c.Warps = MaxAttnWarps + 1 }},
		{"negative warps", func(c *AttnConfig) { c.Warps = -1 }},
		{"unroll 9", func(c *AttnConfig) { c.Unroll = MaxAttnUnroll + 1 }},
		{"a cluster without splits", func(c *AttnConfig) { c.Cluster = 2 }},
		{"a cluster of one", func(c *AttnConfig) { c.Split, c.Cluster = true, 1 }},
		{"a cluster of 9", func(c *AttnConfig) { c.Split, c.Cluster = true, attnMaxCluster+1 }},
		{"a cluster of singles", func(c *AttnConfig) { c.Split, c.Singles, c.Cluster = true, true, 2 }},
		{"merge states past shared memory", func(c *AttnConfig) {
			c.Heads, c.KVHeads, c.HeadDim, c.KVDtype, c.Warps = 16, 2, 256, ptx.BF16, MaxAttnWarps
		}},
	} {
		cfg := ok
		c.edit(&cfg)
		if _, err := Attention("a", cfg); err == nil {
			t.Errorf("%s: accepted", c.name)
		} else if !strings.Contains(err.Error(), "attention a") {
			t.Errorf("%s: error %q lacks the kernel name", c.name, err)
		}
	}
	must(t)(Attention("a", ok))
}

// TestAttentionDecodeSegments: contexts past one segment of staged block-table entries
// (adTableCap KV blocks), whose next segments are staged as the scan reaches them, without
// and with splits, built for early launch.
func TestAttentionDecodeSegments(t *testing.T) {
	r := rand.New(rand.NewPCG(47, 48))
	c := AttnConfig{Heads: 4, KVHeads: 2, HeadDim: 32, BlockSize: 2, MaxBlocksPerSeq: 2*adTableCap + 40, KVDtype: ptx.F32,
		Scale: 0.125, EarlyLaunch: true}
	seg := c.BlockSize * adTableCap
	pos := []uint32{uint32(seg - 1), uint32(seg), uint32(2*seg + 7), 3}
	seq := []uint32{0, 1, 2, 1}
	k := must(t)(Attention("attn_segments", c))
	newAttnCall(t, r, k, c, c.Launch(len(pos), 1), pos, seq, 0, nil).check(t, 1e-5)
	c.Split = true
	k = must(t)(Attention("attn_segments_split", c))
	// Splits of 300 positions: the second starts inside the first segment and ends in the second.
	newAttnCall(t, r, k, c, c.Launch(len(pos), 4), pos, seq, 300, nil).check(t, 1e-5)
	// The tensor-core step: KV blocks of 16, so a segment is 4096 positions; unsplit, and split
	// in chunks of 2400 that start inside a segment.
	tc := AttnConfig{Heads: 4, KVHeads: 2, HeadDim: 64, BlockSize: 16, MaxBlocksPerSeq: 2*adTableCap + 8, KVDtype: ptx.BF16,
		Scale: 0.125, EarlyLaunch: true, TensorCores: true}
	seg = tc.BlockSize * adTableCap
	pos = []uint32{uint32(seg - 1), uint32(seg), uint32(2*seg + 7), 3}
	for _, splits := range []int{1, 4} {
		tc.Split = splits > 1
		k = must(t)(Attention("attn_segments_tc", tc))
		newAttnCall(t, r, k, tc, tc.Launch(len(pos), splits), pos, seq, 2400, nil).check(t, attnTCTolerance)
	}
}

// TestAttentionWaitsAfterControl: built for early launch, a decode kernel waits for the grid
// ahead exactly once, and before that touches no memory but the control block (pos, seq,
// block_table, chunk) and shared memory: no address derived from qkv, the caches, z or the
// split workspace is loaded or stored, and nothing global is written.
func TestAttentionWaitsAfterControl(t *testing.T) {
	c := scaled(attnShapes[2])
	c.EarlyLaunch = true
	for _, v := range []struct {
		name           string
		split, singles bool
	}{{"plain", false, false}, {"split", true, false}, {"singles", false, true}} {
		c.Split, c.Singles = v.split, v.singles
		k := must(t)(Attention("attn_"+v.name, c))
		m, err := ptx.Parse(k.PTX)
		if err != nil {
			t.Fatal(err)
		}
		body := m.Kernels[0].Body
		if n := strings.Count(k.PTX, bundle.PriorGridWait+";"); n != 1 {
			t.Fatalf("%s: %d waits, want 1", v.name, n)
		}
		dependent := map[string]bool{"qkv": true, "kcache": true, "vcache": true, "z": true, "ws": true}
		tainted := map[ptx.Reg]bool{}
		regs := func(o ptx.Operand) []ptx.Reg {
			switch o := o.(type) {
			case ptx.Reg:
				return []ptx.Reg{o}
			case ptx.Vec:
				return o
			case ptx.Addr:
				if r, ok := o.Base.(ptx.Reg); ok {
					return []ptx.Reg{r}
				}
			}
			return nil
		}
		for i, in := range body {
			if in.Op == bundle.PriorGridWait {
				if i < 5 {
					t.Errorf("%s: the wait is instruction %d, before the control block is read", v.name, i)
				}
				break
			}
			if strings.HasPrefix(in.Op, "st.global") || strings.HasPrefix(in.Op, "atom") || strings.HasPrefix(in.Op, "red") {
				t.Errorf("%s: %s before the wait", v.name, in.Op)
			}
			if strings.HasPrefix(in.Op, "ld.param") {
				if a, ok := in.Args[1].(ptx.Addr); ok {
					if s, ok := a.Base.(ptx.Sym); ok && dependent[string(s)] {
						for _, r := range regs(in.Args[0]) {
							tainted[r] = true
						}
					}
				}
				continue
			}
			if len(in.Args) == 0 {
				continue
			}
			from := in.Args[1:]
			if strings.HasPrefix(in.Op, "st.") {
				from = in.Args
			}
			dirty := false
			for _, o := range from {
				for _, r := range regs(o) {
					dirty = dirty || tainted[r]
				}
			}
			if dirty && (strings.HasPrefix(in.Op, "ld.") || strings.HasPrefix(in.Op, "st.")) {
				t.Errorf("%s: %s through an address of the grid ahead's data before the wait", v.name, in.Op)
			}
			if dirty && !strings.HasPrefix(in.Op, "st.") {
				for _, r := range regs(in.Args[0]) {
					tainted[r] = true
				}
			}
		}
	}
	// Without early launch the kernel never waits (a --pdl=false bundle is launched serially).
	c.EarlyLaunch, c.Split, c.Singles = false, true, false
	if k := must(t)(Attention("attn_serial", c)); strings.Contains(k.PTX, bundle.PriorGridWait) {
		t.Error("a kernel built without early launch waits for the grid ahead")
	}
}

// TestCheckAttnSettings: the decode attention's warps and loads a step, as xmixc, Generate and
// the kernel check them: 0 (the default) and the bounds pass, one past either bound or a
// negative count is refused naming the setting and the range.
func TestCheckAttnSettings(t *testing.T) {
	for _, ok := range [][2]int{{0, 0}, {1, 1}, {MaxAttnWarps, MaxAttnUnroll}} {
		if err := CheckAttnSettings(ok[0], ok[1]); err != nil {
			t.Errorf("%v: %v", ok, err)
		}
	}
	for _, c := range []struct {
		warps, unroll int
		want          string
	}{
		{MaxAttnWarps + 1, 0, "17 warps a block: want 1 to 16, or 0 for the default"},
		{-1, 0, "-1 warps a block"},
		{0, MaxAttnUnroll + 1, "9 loads a step: want 1 to 8, or 0 for the default"},
		{0, -2, "-2 loads a step"},
	} {
		if err := CheckAttnSettings(c.warps, c.unroll); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%d warps, %d loads: %v, want %q", c.warps, c.unroll, err, c.want)
		}
		if _, err := Attention("a", AttnConfig{Heads: 8, KVHeads: 2, HeadDim: 64, BlockSize: 16, MaxBlocksPerSeq: 4, KVDtype: ptx.BF16, Scale: 0.125, Warps: c.warps, Unroll: c.unroll}); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("kernel with %d warps, %d loads: %v, want %q", c.warps, c.unroll, err, c.want)
		}
	}
}

// TestAttentionPrefetchKV: built for early launch with Prefetch passes, every block of the
// decode kernel asks L2, before its wait, for exactly the 128-byte lines of the K and V rows
// of its first Prefetch passes (positions [start, start + Prefetch*pass) of its split, no
// line twice, none past its context), and computes the bits of the kernel without it. Rows of
// 1, 2, 3 and 4 lines, one split and several (a chunk word too small for the grid too), the
// CUDA-core step and the tensor-core one (a pass of 16-position tiles, splits at whole tiles).
func TestAttentionPrefetchKV(t *testing.T) {
	r := rand.New(rand.NewPCG(53, 54))
	for _, base := range append(slices.Clone(attnShapes), attnTCShapes[:2]...) {
		base = scaled(base)
		base.EarlyLaunch = true
		maxPos := base.BlockSize * base.MaxBlocksPerSeq
		rowLines := base.HeadDim * base.KVDtype.Bytes() / 128
		for _, sc := range []struct{ passes, splits, chunk int }{{1, 1, 0}, {3, 1, 0}, {1, 4, 64}, {2, 5, 5}} {
			c := base
			c.Prefetch, c.Split = sc.passes, sc.splits > 1
			name := fmt.Sprintf("h%d_kv%d_d%d_%s%s_p%d_s%d", c.Heads, c.KVHeads, c.HeadDim, c.KVDtype, AttnKernelSuffix(c), sc.passes, sc.splits)
			t.Run(name, func(t *testing.T) {
				k := must(t)(Attention("attn_pf", c))
				plainCfg := c
				plainCfg.Prefetch = 0
				plain := must(t)(Attention("attn_pf", plainCfg))
				if !strings.Contains(k.PTX, "prefetch.global.L2") || strings.Contains(plain.PTX, "prefetch.global") {
					t.Fatal("the prefetching kernel does not prefetch, or the plain one does")
				}
				pos := []uint32{0, 9, 70, uint32(maxPos - 1), uint32(maxPos / 3)}
				seq := []uint32{0, 1, 2, 3, 1}
				a := newAttnCall(t, r, k, c, c.Launch(len(pos), sc.splits), pos, seq, uint32(sc.chunk), nil)
				a.mem.RecordReads()
				got := a.run(t)
				lines := map[uint64]int{}
				for _, addr := range a.mem.Prefetched() {
					lines[addr]++
				}
				plainMod, err := ptx.Parse(plain.PTX)
				if err != nil {
					t.Fatal(err)
				}
				a.mod, a.k = plainMod, plain
				if want := a.run(t); !bytes.Equal(got, want) {
					t.Fatal("z differs from the kernel's without the prefetch")
				}

				geo := c.geom()
				pass := c.warps() * geo.unroll * geo.pp
				table, kc, vc := a.args[3].u32, a.params[4], a.params[5]
				want := map[uint64]int{}
				for row, p := range pos {
					n := int(p) + 1
					chunk := n
					if c.Split {
						chunk = max(sc.chunk, (n+sc.splits-1)/sc.splits)
						if geo.tc {
							chunk = (chunk + tcAttnTile - 1) / tcAttnTile * tcAttnTile
						}
					}
					for y := range c.Heads / geo.hpb {
						kvh := y * geo.hpb / (c.Heads / c.KVHeads)
						for start := 0; start < n; start += chunk {
							for q := start; q < min(n, start+chunk, start+sc.passes*pass); q++ {
								page := int(table[int(seq[row])*c.MaxBlocksPerSeq+q/c.BlockSize])
								kvRow := (page*c.BlockSize+q%c.BlockSize)*c.KVHeads + kvh
								for ln := range rowLines {
									want[kc+uint64((kvRow*rowLines+ln)*128)]++
									want[vc+uint64((kvRow*rowLines+ln)*128)]++
								}
							}
						}
					}
				}
				if len(lines) != len(want) {
					t.Errorf("%d lines asked for, want %d", len(lines), len(want))
				}
				for addr, n := range want {
					if lines[addr] != n {
						t.Errorf("line 0x%x asked for %d times, want %d", addr, lines[addr], n)
						break
					}
				}
			})
		}
	}
	c := scaled(attnShapes[2])
	c.Prefetch = 1
	if _, err := Attention("attn_serial_prefetch", c); err == nil || !strings.Contains(err.Error(), "needs early launch") {
		t.Errorf("prefetch without early launch: %v", err)
	}
	c.EarlyLaunch, c.Prefetch = true, MaxAttnPrefetch+1
	if _, err := Attention("attn_prefetch_bound", c); err == nil || !strings.Contains(err.Error(), "want 0 (none) to 8") {
		t.Errorf("prefetch past its bound: %v", err)
	}
}

// attnTCShapes are the shapes the tensor-core decode step serves: GQA groups of 1, 4 and 8
// (8: one block of 8 heads; 16: two blocks a kv head), head dims 64 and 128, KV blocks of
// one and two tiles.
// TestAttentionEarlyKV: a split tensor-core kernel launched early with EarlyKV computes the
// bits of the kernel without it, reads K/V before its wait (for a context past a warp's first
// tile), and never reads the newest position's K or V row of any row before its wait: the
// kernel ahead writes those. Four tensor-core shapes, one split, splits of a chunk word (64
// positions) and too small a word, unroll 1 and 2, splits merged in a cluster of 4 (the
// default bundles' early loads meet --attn-cluster there), contexts of 1, 10, 16, 17, 70 and
// the cache's last position; the kernels it does not apply to (unsplit) stay byte for byte.
func TestAttentionEarlyKV(t *testing.T) {
	r := rand.New(rand.NewPCG(57, 58))
	for _, base := range attnTCShapes {
		base = scaled(base)
		base.EarlyLaunch, base.Split = true, true
		maxPos := base.BlockSize * base.MaxBlocksPerSeq
		for _, sc := range []struct{ splits, chunk, unroll, cluster int }{{1, 0, 0, 0}, {4, 64, 0, 0}, {5, 5, 0, 0}, {3, 64, 2, 0}, {4, 32, 0, 4}} {
			c := base
			c.Unroll, c.Cluster = sc.unroll, sc.cluster
			plainCfg := c
			c.EarlyKV = true
			name := fmt.Sprintf("h%d_kv%d_d%d%s_s%d_c%d", c.Heads, c.KVHeads, c.HeadDim, AttnKernelSuffix(c), sc.splits, sc.chunk)
			t.Run(name, func(t *testing.T) {
				if c.Cluster > 0 && c.sharedBytes() > maxStaticShared {
					return // TestAttentionDecodeCluster checks the refusal
				}
				k := must(t)(Attention("attn_ekv", c))
				plain := must(t)(Attention("attn_ekv", plainCfg))
				if k.PTX == plain.PTX {
					t.Fatal("EarlyKV did not change the kernel")
				}
				pos := []uint32{0, 9, 15, 16, 69, uint32(maxPos - 1)}
				seq := []uint32{0, 1, 2, 3, 4, 5}
				a := newAttnCall(t, r, k, c, c.Launch(len(pos), sc.splits), pos, seq, uint32(sc.chunk), nil)
				a.mem.RecordReads()
				got := a.run(t)
				early := a.mem.EarlyLoads()
				plainMod, err := ptx.Parse(plain.PTX)
				if err != nil {
					t.Fatal(err)
				}
				a.mod, a.k = plainMod, plain
				if want := a.run(t); !bytes.Equal(got, want) {
					t.Fatal("z differs from the kernel's without early K/V loads")
				}
				table, kc, vc := a.args[3].u32, a.params[4], a.params[5]
				rowBytes := uint64(c.HeadDim * c.KVDtype.Bytes())
				cacheBytes := uint64(len(a.args[4].bytesOf()))
				inCache := 0
				for _, sp := range early {
					for _, cache := range []uint64{kc, vc} {
						if sp.Addr < cache || sp.Addr >= cache+cacheBytes {
							continue
						}
						inCache++
						for row, p := range pos {
							page := uint64(table[int(seq[row])*c.MaxBlocksPerSeq+int(p)/c.BlockSize])
							for kvh := range c.KVHeads {
								newest := cache + ((page*uint64(c.BlockSize)+uint64(int(p)%c.BlockSize))*uint64(c.KVHeads)+uint64(kvh))*rowBytes
								if sp.Addr < newest+rowBytes && newest < sp.Addr+uint64(sp.N) {
									t.Fatalf("row %d (position %d): %d bytes at 0x%x read before the wait, in kv head %d's newest row", row, p, sp.N, sp.Addr, kvh)
								}
							}
						}
					}
				}
				if inCache == 0 {
					t.Fatal("no K/V read before the wait")
				}
			})
		}
	}
	// Kernels that do not peel their first step (no split) are the same with it.
	c := scaled(attnTCShapes[1])
	c.EarlyLaunch = true
	plain := must(t)(Attention("attn_ekv", c))
	c.EarlyKV = true
	if k := must(t)(Attention("attn_ekv", c)); k.PTX != plain.PTX {
		t.Error("EarlyKV changed an unsplit kernel")
	}
	c.EarlyLaunch = false
	if _, err := Attention("attn_ekv", c); err == nil || !strings.Contains(err.Error(), "early K/V loads need early launch") {
		t.Errorf("EarlyKV without early launch: %v", err)
	}
}

var attnTCShapes = []AttnConfig{
	{Heads: 2, KVHeads: 2, HeadDim: 64, BlockSize: 16, MaxBlocksPerSeq: 20, KVDtype: ptx.BF16, TensorCores: true},
	{Heads: 8, KVHeads: 2, HeadDim: 128, BlockSize: 16, MaxBlocksPerSeq: 19, KVDtype: ptx.BF16, TensorCores: true},
	{Heads: 8, KVHeads: 1, HeadDim: 64, BlockSize: 32, MaxBlocksPerSeq: 10, KVDtype: ptx.BF16, TensorCores: true},
	{Heads: 16, KVHeads: 1, HeadDim: 128, BlockSize: 16, MaxBlocksPerSeq: 12, KVDtype: ptx.BF16, TensorCores: true},
}

// attnTCTolerance bounds the tensor-core step's relative L2 error against the f32 reference:
// Q and P are rounded to bf16 for the mma (about 1e-3 on these shapes).
const attnTCTolerance = 4e-3

// TestAttentionDecodeTC: the tensor-core step over ragged contexts (one position, a tile,
// one past, a KV block, the last position), split at the split boundaries (chunks that are
// not whole tiles, which the kernel rounds up) and two tiles a step, within bf16 rounding of
// the reference (TestAttentionSingles takes its prefill rows).
func TestAttentionDecodeTC(t *testing.T) {
	r := rand.New(rand.NewPCG(61, 62))
	for _, c := range attnTCShapes {
		c = scaled(c)
		maxPos := c.BlockSize * c.MaxBlocksPerSeq
		for _, sc := range []struct{ splits, chunk, unroll int }{{1, 0, 0}, {1, 0, 2}, {3, 64, 0}, {5, 5, 0}, {8, 32, 2}, {40, 1, 0}} {
			c := c
			c.Split, c.Unroll = sc.splits > 1, sc.unroll
			name := fmt.Sprintf("h%d_kv%d_d%d_bs%d_s%d_c%d_u%d", c.Heads, c.KVHeads, c.HeadDim, c.BlockSize, sc.splits, sc.chunk, sc.unroll)
			t.Run(name, func(t *testing.T) {
				k := must(t)(Attention("attn_tc_test", c))
				if !strings.Contains(k.PTX, "mma.sync") || !strings.Contains(k.PTX, fmt.Sprintf(".minnctapersm %d", tcAttnWarpsPerSM/c.warps())) {
					t.Fatal("no mma in the tensor-core kernel, or no ask for 16 warps an SM")
				}
				var pos []uint32
				for _, n := range []int{1, 16, 17, c.BlockSize, c.BlockSize + 9, 2*sc.chunk + 3, maxPos / 2, maxPos} {
					if n >= 1 && n <= maxPos {
						pos = append(pos, uint32(n-1))
					}
				}
				seq := make([]uint32, len(pos))
				for i := range seq {
					seq[i] = uint32(i % 3)
				}
				newAttnCall(t, r, k, c, c.Launch(len(pos), sc.splits), pos, seq, uint32(sc.chunk), nil).check(t, attnTCTolerance)
			})
		}
	}
}

// TestAttentionZOptional: kernels built with ZOptional (one block a row, splits merged
// through the workspace or in a cluster, on CUDA cores and tensor cores) compute z as the
// reference does and, passed a z of 0, write the same z_bf16 alone (checkZBF16); over the
// prefill step's singles the option is refused.
func TestAttentionZOptional(t *testing.T) {
	r := rand.New(rand.NewPCG(71, 72))
	for _, base := range []AttnConfig{attnShapes[2], attnTCShapes[0]} {
		base = scaled(base)
		for _, sc := range []struct{ splits, chunk, cluster int }{{1, 0, 0}, {3, 64, 0}, {4, 32, 4}} {
			c := base
			c.ZOptional, c.Split, c.Cluster = true, sc.splits > 1, sc.cluster
			tol := 1e-5
			if c.tcOK() {
				tol = attnTCTolerance
			}
			t.Run(fmt.Sprintf("d%d%s_s%d", c.HeadDim, AttnKernelSuffix(c), sc.splits), func(t *testing.T) {
				k := must(t)(Attention("attn_zopt_test", c))
				pos, seq := splitBoundaryRows(max(sc.chunk, 16), max(sc.splits, 1), c.BlockSize*c.MaxBlocksPerSeq)
				newAttnCall(t, r, k, c, c.Launch(len(pos), sc.splits), pos, seq, uint32(sc.chunk), nil).check(t, tol)
			})
		}
	}
	c := scaled(attnShapes[2])
	c.ZOptional, c.Singles = true, true
	if _, err := Attention("attn_zopt_singles", c); err == nil {
		t.Error("z optional over the singles accepted")
	}
}

// TestAttentionTCFallback: shapes the tensor-core step cannot take (an f32 cache, head dim
// 32 or 96, KV blocks of 8, a sliding window) keep the CUDA-core step and its kernel name.
func TestAttentionTCFallback(t *testing.T) {
	for _, c := range []AttnConfig{attnShapes[0], attnShapes[1], attnShapes[5],
		{Heads: 8, KVHeads: 2, HeadDim: 128, BlockSize: 16, MaxBlocksPerSeq: 19, KVDtype: ptx.BF16, Window: 64}} {
		c = scaled(c)
		c.TensorCores = true
		k := must(t)(Attention("a", c))
		if c.tcOK() || strings.Contains(k.PTX, "mma.sync") || strings.Contains(AttnKernelSuffix(c), "tc") {
			t.Errorf("h%d kv%d d%d %s bs%d window %d: tensor cores taken", c.Heads, c.KVHeads, c.HeadDim, c.KVDtype, c.BlockSize, c.Window)
		}
	}
	if s := AttnKernelSuffix(scaled(attnTCShapes[1])); s != "_tc" {
		t.Errorf("suffix %q, want _tc", s)
	}
}

// TestAttentionRope: an unsplit tensor-core decode kernel with Rope does rope_kv's work itself:
// over ragged contexts (one position, a tile, one past, a KV block, the last position) it
// writes the caches and z (and z_bf16) bit for bit as rope_kv followed by the kernel without
// Rope, leaves qkv as it was, and agrees with the reference op; with warps of other counts
// too (pairs left over for a second pass, or threads with none). With a row of the padding
// slot (PadSeq) that row writes no k and v, as the reference. A split kernel, the singles,
// CUDA cores and a GQA group wider than a block (16 heads over blocks of 8) are refused.
func TestAttentionRope(t *testing.T) {
	r := rand.New(rand.NewPCG(81, 82))
	for _, base := range attnTCShapes[:3] {
		for _, warps := range []int{1, 2, 4} {
			c := scaled(base)
			c.Warps, c.ZOptional = warps, true
			maxPos := c.BlockSize * c.MaxBlocksPerSeq
			var pos []uint32
			for _, n := range []int{1, 16, 17, c.BlockSize + 9, maxPos} {
				pos = append(pos, uint32(n-1))
			}
			seq := []uint32{3, 0, 4, 1, 2}
			kv := newKVFixture(r, c.ropeConfig(), 5)
			cos, sin := RopeTables(5e5, c.HeadDim, maxPos, nil)
			rows, width := len(pos), (c.Heads+2*c.KVHeads)*c.HeadDim
			qkv := targ{name: "qkv", f32: randF32(r, rows*width, 3)}
			tables := []targ{{name: "cos", f32: cos}, {name: "sin", f32: sin}}
			ctl := []targ{{name: "pos", u32: pos}, {name: "seq", u32: seq}, {name: "block_table", u32: kv.table}, kv.kcache, kv.vcache}
			outs := []targ{{name: "z", out: rows * c.Heads * c.HeadDim}, {name: bundle.AttnZBF16, out: rows * c.Heads * c.HeadDim, dtype: "bf16"}}
			l := c.Launch(rows, 1)

			pair := newEmuBufs()
			pair.run(t, must(t)(RopeKV("rope_pair", c.ropeConfig())), c.ropeConfig().Launch(rows), append(append([]targ{qkv}, tables...), ctl...))
			pair.run(t, must(t)(Attention("attn_pair", c)), l, append(append([]targ{qkv}, ctl...), outs...))

			c.Rope, c.PadSeq = true, 5 // no row's
			k := must(t)(Attention("attn_rope", c))
			args := append(append(append([]targ{qkv}, ctl...), outs...), tables...)
			got := newEmuBufs()
			got.run(t, k, l, args)
			for _, name := range []string{"z", bundle.AttnZBF16, "kcache", "vcache"} {
				if !bytes.Equal(got.mem.Bytes(got.addr[name])[:got.size[name]], pair.mem.Bytes(pair.addr[name])[:pair.size[name]]) {
					t.Fatalf("h%d kv%d d%d, %d warps: %s differs from rope_kv and the kernel without rope", c.Heads, c.KVHeads, c.HeadDim, warps, name)
				}
			}
			sameBits(t, "qkv after the kernel with rope", got.f32("qkv"), qkv.f32)
			z := outs[0]
			z.tol = attnTCTolerance
			checkKernel(t, k, l, append([]targ{qkv, ctl[0], ctl[1], ctl[2], kv.kcache, kv.vcache, z, outs[1]}, tables...))
			c.PadSeq = 4 // row 2's
			padded := must(t)(Attention("attn_rope_pad", c))
			checkKernel(t, padded, l, append([]targ{qkv, ctl[0], ctl[1], ctl[2], kv.kcache, kv.vcache, z, outs[1]}, tables...))
			pad := newEmuBufs()
			pad.run(t, padded, l, args)
			// Row 2's slot: its page of the block table, then the position within it.
			slot := int(kv.table[int(seq[2])*c.MaxBlocksPerSeq+int(pos[2])/c.BlockSize])*c.BlockSize + int(pos[2])%c.BlockSize
			at := 2 * slot * c.KVHeads * c.HeadDim // bf16 bytes
			for _, cache := range []targ{kv.kcache, kv.vcache} {
				n := 2 * c.KVHeads * c.HeadDim
				if !bytes.Equal(pad.mem.Bytes(pad.addr[cache.name])[at:at+n], cache.bytesOf()[at:at+n]) {
					t.Fatalf("h%d kv%d d%d: the padding row wrote its %s slot", c.Heads, c.KVHeads, c.HeadDim, cache.name)
				}
			}
		}
	}
	for _, bad := range []struct {
		what string
		c    AttnConfig
		edit func(*AttnConfig)
	}{
		{"a group of 16 heads over blocks of 8", attnTCShapes[3], func(*AttnConfig) {}},
		{"split", attnTCShapes[1], func(c *AttnConfig) { c.Split = true }},
		{"singles", attnTCShapes[1], func(c *AttnConfig) { c.Singles = true }},
		{"CUDA cores", attnTCShapes[1], func(c *AttnConfig) { c.TensorCores = false }},
	} {
		c := scaled(bad.c)
		bad.edit(&c)
		c.Rope = true
		if _, err := Attention("attn_rope_bad", c); err == nil || !strings.Contains(err.Error(), "rope in the attention") {
			t.Errorf("%s: err %v, want a refusal", bad.what, err)
		}
	}
}
