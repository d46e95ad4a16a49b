package codegen

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"xmix/ops"
	"xmix/ptx"
	"xmix/ptx/emu"
)

// asCall is one AttentionSplit call laid out in emulator memory.
type asCall struct {
	mod    *ptx.Module
	k      *Kernel
	launch ops.Launch
	args   []targ // the reference op's seven arguments
	mem    *emu.Memory
	params []uint64
	ws     []byte // nil when the kernel takes no workspace
}

// newASCall builds the kernel and a call over rows decode rows at positions pos of sequences
// seq; ws is zeroed, or a null pointer with one split (the kernel must not touch it).
func newASCall(t *testing.T, r *rand.Rand, c AttnConfig, splits int, pos, seq []uint32) *asCall {
	t.Helper()
	k, err := AttentionSplit("attention_split_test", c, splits)
	if err != nil {
		t.Fatal(err)
	}
	if k.Op != "attention" {
		t.Fatalf("op %q, want attention", k.Op)
	}
	mod, err := ptx.Parse(k.PTX)
	if err != nil {
		t.Fatalf("parse: %v\n%s", err, k.PTX)
	}
	rc := RopeConfig{Heads: c.Heads, KVHeads: c.KVHeads, HeadDim: c.HeadDim, BlockSize: c.BlockSize,
		MaxBlocksPerSeq: c.MaxBlocksPerSeq, KVDtype: c.KVDtype}
	kv := newKVFixture(r, rc, 2)
	kv.kcache.out, kv.vcache.out = 0, 0 // read only
	rows := len(pos)
	a := &asCall{mod: mod, k: k, launch: c.LaunchSplit(rows, splits), mem: emu.NewMemory()}
	// Scores of order 1-3 so the softmax is neither flat nor one-hot.
	a.args = []targ{
		{name: "qkv", f32: randF32(r, rows*(c.Heads+2*c.KVHeads)*c.HeadDim, 3)},
		{name: "pos", u32: pos}, {name: "seq", u32: seq}, {name: "block_table", u32: kv.table},
		kv.kcache, kv.vcache, {name: "z", out: rows * c.Heads * c.HeadDim},
	}
	for _, arg := range a.args {
		b := arg.bytesOf()
		addr := a.mem.Alloc(len(b))
		copy(a.mem.Bytes(addr), b)
		a.params = append(a.params, addr)
	}
	var wsAddr uint64
	if n := c.SplitWorkspaceBytes(rows, splits); n > 0 {
		wsAddr = a.mem.Alloc(n)
		a.ws = a.mem.Bytes(wsAddr)[:n]
		clear(a.ws)
	}
	a.params = append(a.params, wsAddr)
	if len(a.params) != len(k.Params) {
		t.Fatalf("%d args, kernel has %d params", len(a.params), len(k.Params))
	}
	return a
}

// run emulates the kernel over a poisoned z, checks that the counters are back at zero and
// returns z's bytes.
func (a *asCall) run(t *testing.T) []byte {
	t.Helper()
	z := a.mem.Bytes(a.params[6])[:4*a.args[6].out]
	for i := range z {
		z[i] = 0xFF
	}
	if err := emu.Run(a.mod, a.k.Name, emu.Launch{Grid: a.launch.Grid, Block: a.launch.Block}, a.mem, a.params); err != nil {
		t.Fatalf("emulate: %v", err)
	}
	if a.ws != nil {
		rows, kvh := a.launch.Grid[0], a.launch.Grid[1]
		for i := range rows * kvh {
			if v := binary.LittleEndian.Uint32(a.ws[4*i:]); v != 0 {
				t.Fatalf("counter %d left at %d", i, v)
			}
		}
	}
	return append([]byte(nil), z...)
}

// reference runs op "attention" on the seven arguments the kernel shares with it (all but ws).
func (a *asCall) reference(t *testing.T) []byte {
	t.Helper()
	ref, err := ops.Build(a.k.Op, a.k.Attrs)
	if err != nil {
		t.Fatal(err)
	}
	args := make([]ops.Arg, len(a.args))
	for i, arg := range a.args {
		args[i] = ops.Arg{Mem: arg.bytesOf()}
	}
	if err := ref.Run(args, a.launch); err != nil {
		t.Fatalf("reference: %v", err)
	}
	return args[6].Mem
}

func TestAttentionSplitKernel(t *testing.T) {
	r := rand.New(rand.NewPCG(41, 42))
	for _, c := range []AttnConfig{
		{Heads: 8, KVHeads: 2, HeadDim: 32, BlockSize: 16, MaxBlocksPerSeq: 20, KVDtype: ptx.F32},
		{Heads: 2, KVHeads: 2, HeadDim: 64, BlockSize: 8, MaxBlocksPerSeq: 40, KVDtype: ptx.BF16},
		{Heads: 4, KVHeads: 1, HeadDim: 128, BlockSize: 16, MaxBlocksPerSeq: 19, KVDtype: ptx.BF16},
		{Heads: 2, KVHeads: 2, HeadDim: 128, BlockSize: 32, MaxBlocksPerSeq: 10, KVDtype: ptx.F32},
		{Heads: 6, KVHeads: 2, HeadDim: 96, BlockSize: 4, MaxBlocksPerSeq: 75, KVDtype: ptx.F32},
	} {
		c.Scale = float32(1 / math.Sqrt(float64(c.HeadDim)))
		maxPos := uint32(c.BlockSize * c.MaxBlocksPerSeq)
		// Position 0 leaves all splits but the first empty; position 1 with 3 splits one;
		// the rest span every split, up to the last position of a sequence (~300).
		pos := []uint32{0, 1, 37, maxPos - 1, maxPos / 2}
		seq := []uint32{1, 0, 1, 0, 1}
		for _, splits := range []int{1, 3, 8} {
			name := fmt.Sprintf("h%d_kv%d_d%d_%s_s%d", c.Heads, c.KVHeads, c.HeadDim, c.KVDtype, splits)
			t.Run(name, func(t *testing.T) {
				a := newASCall(t, r, c, splits, pos, seq)
				got, want := a.run(t), a.reference(t)
				g, w := floats(got, "f32"), floats(want, "f32")
				if e := relL2(g, w); !(e <= 1e-5) {
					t.Fatalf("relative L2 error %.3g (first values got %v want %v)", e, head(g), head(w))
				}
			})
		}
	}
}

// TestAttentionSplitReplay runs the kernel twice on the same memory, as a replayed graph does:
// the second run must find the counters reset and give the same z bit for bit.
func TestAttentionSplitReplay(t *testing.T) {
	c := AttnConfig{Heads: 8, KVHeads: 2, HeadDim: 64, BlockSize: 16, MaxBlocksPerSeq: 16, KVDtype: ptx.BF16, Scale: 0.125}
	r := rand.New(rand.NewPCG(43, 44))
	a := newASCall(t, r, c, 5, []uint32{255, 3, 100}, []uint32{0, 1, 1})
	if a.ws == nil {
		t.Fatal("5 splits without a workspace")
	}
	first := a.run(t)
	if second := a.run(t); !bytes.Equal(first, second) {
		t.Fatal("second run's z differs from the first")
	}
}

func TestAttentionSplitPublic(t *testing.T) {
	// Llama-3.1-8B and -70B attention shapes.
	for _, c := range []struct {
		cfg    AttnConfig
		splits int
		block  int
		ws     int // at 2 rows
	}{
		{AttnConfig{Heads: 32, KVHeads: 8, HeadDim: 128, BlockSize: 16, MaxBlocksPerSeq: 512, KVDtype: ptx.BF16, Scale: 0.088}, 32, 256, 64 + 2*32*32*132*4},
		{AttnConfig{Heads: 64, KVHeads: 8, HeadDim: 128, BlockSize: 16, MaxBlocksPerSeq: 512, KVDtype: ptx.BF16, Scale: 0.088}, 16, 256, 64 + 2*64*16*132*4},
		{AttnConfig{Heads: 16, KVHeads: 2, HeadDim: 256, BlockSize: 16, MaxBlocksPerSeq: 8, KVDtype: ptx.F32, Scale: 0.06}, 1, 128, 0},
	} {
		l := c.cfg.LaunchSplit(2, c.splits)
		if l.Grid != [3]int{2, c.cfg.KVHeads, c.splits} || l.Block != [3]int{c.block, 1, 1} {
			t.Errorf("%+v: launch %v", c.cfg, l)
		}
		if ws := c.cfg.SplitWorkspaceBytes(2, c.splits); ws != c.ws {
			t.Errorf("%+v: workspace %d, want %d", c.cfg, ws, c.ws)
		}
		k, err := AttentionSplit("a", c.cfg, c.splits)
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.Join(paramNames(k), ","); got != "qkv,pos,seq,block_table,kcache,vcache,z,ws" {
			t.Errorf("params %s", got)
		}
		mod, err := ptx.Parse(k.PTX)
		if err != nil {
			t.Fatal(err)
		}
		shared := 0
		for _, s := range mod.Kernels[0].Shared {
			shared += s.Len * s.T.Bytes()
		}
		if shared > 48<<10 {
			t.Errorf("%+v: %d bytes of static shared memory", c.cfg, shared)
		}
	}
}

func TestAttentionSplitRejects(t *testing.T) {
	ok := AttnConfig{Heads: 4, KVHeads: 1, HeadDim: 32, BlockSize: 4, MaxBlocksPerSeq: 1, KVDtype: ptx.F32, Scale: 1}
	for _, c := range []struct {
		name   string
		edit   func(*AttnConfig)
		splits int
	}{
		{"head dim 48", func(c *AttnConfig) { c.HeadDim = 48 }, 2},
		{"head dim 288", func(c *AttnConfig) { c.HeadDim = 288 }, 2},
		{"no scale", func(c *AttnConfig) { c.Scale = 0 }, 2},
		{"infinite scale", func(c *AttnConfig) { c.Scale = float32(math.Inf(1)) }, 2},
		{"f16 cache", func(c *AttnConfig) { c.KVDtype = ptx.F16 }, 2},
		{"heads not a multiple", func(c *AttnConfig) { c.Heads = 3; c.KVHeads = 2 }, 2},
		{"zero splits", func(*AttnConfig) {}, 0},
		{"too many splits", func(*AttnConfig) {}, asMaxSplits + 1},
		{"wide group", func(c *AttnConfig) { c.Heads, c.HeadDim = 32, 128 }, 2},
	} {
		cfg := ok
		c.edit(&cfg)
		if _, err := AttentionSplit("a", cfg, c.splits); err == nil {
			t.Errorf("%s: accepted", c.name)
		} else if !strings.Contains(err.Error(), "attention_split a") {
			t.Errorf("%s: error %q lacks the kernel name", c.name, err)
		}
	}
	if _, err := AttentionSplit("a", ok, 2); err != nil {
		t.Fatal(err)
	}
}
