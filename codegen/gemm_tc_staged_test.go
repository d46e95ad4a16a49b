package codegen

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"xmix/ptx"
	"xmix/ptx/emu"
)

// stagedArgs are the harness arguments of one call; ws is passed as zeros (at least 16 bytes,
// so that a kernel without splits still gets a valid pointer).
func stagedArgs(r *rand.Rand, rows, k, n, wsBytes int) []targ {
	return []targ{
		{name: "x", f32: randF32(r, rows*k, 1)},
		{name: "w", bf16: randF32(r, n*k, 1)},
		{name: "y", out: rows * n}, scalarU32("rows", uint32(rows)),
		{name: "ws", u32: make([]uint32, max(wsBytes, 16)/4)},
	}
}

// stagedWorkspace is the workspace of a call over rows rows of a kernel of layout l with
// tickets ticket counters.
func stagedWorkspace(l tsLayout, rows, n, tickets int) int {
	if l.splits == 1 {
		return 0
	}
	return ticketBytes(tickets) + l.partialBytes(rows, n)
}

func checkStaged(t *testing.T, rows, k, n int, l tsLayout) {
	t.Helper()
	cfg := GemmConfig{K: k, N: n, WDtype: ptx.BF16, Tickets: l.tickets(rows)}
	kern, err := gemmTCStaged("gemm_tc_staged_test", cfg, l)
	if err != nil {
		t.Fatal(err)
	}
	if kern.Op != "gemm_tc" {
		t.Fatalf("op %q, want gemm_tc", kern.Op)
	}
	r := rand.New(rand.NewPCG(uint64(rows), uint64(k*1000+n)))
	checkKernel(t, kern, l.launch(), stagedArgs(r, rows, k, n, stagedWorkspace(l, rows, n, cfg.Tickets)))
}

func TestGemmTCStagedKernel(t *testing.T) {
	for _, rows := range []int{1, 8, 9, 33, 128} {
		for _, c := range []struct{ k, n int }{{64, 16}, {512, 64}, {1024, 80}} {
			t.Run(fmt.Sprintf("rows%d_k%d_n%d", rows, c.k, c.n), func(t *testing.T) {
				checkStaged(t, rows, c.k, c.n, tsLayoutFor(c.k, c.n))
			})
		}
	}
}

func TestGemmTCStagedShapes(t *testing.T) {
	for _, c := range []struct {
		name          string
		rows, k, n    int
		per           int // stages per split; 0: the default layout
		splits, tiles int
	}{
		{"one split writes y directly", 9, 128, 80, 2, 1, 1},
		{"uneven last split", 33, 320, 32, 2, 3, 1},
		{"K%64=16 tail", 9, 80, 48, 0, 2, 1},
		{"K%64=48 tail, one split", 8, 112, 16, 2, 1, 1},
		{"K=16", 5, 16, 16, 0, 1, 1},
		{"two column tiles, idle warps", 9, 128, 144, 0, 2, 2},
		{"two row groups", 130, 64, 32, 0, 1, 1},
		{"two row groups, split", 136, 128, 16, 1, 2, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			l := tsLayoutFor(c.k, c.n)
			if c.per > 0 {
				l = tsLayoutPer(c.k, c.n, c.per)
			}
			if l.splits != c.splits || l.tiles != c.tiles {
				t.Fatalf("layout %+v, want %d splits, %d tiles", l, c.splits, c.tiles)
			}
			checkStaged(t, c.rows, c.k, c.n, l)
		})
	}
}

// TestGemmTCStagedBucket: the staged kernel built for a bucket (GemmConfig.Rows: its row
// tiles, two x buffers and one barrier a stage) with 1-4 stages of W in flight
// (GemmConfig.Unroll chunks, two a stage), early-launch preloads (GemmConfig.Prefetch) or not,
// gives the bits of the kernel for any row count (one buffer, one stage in flight): splits
// that the ring fills, leaves stages over in or does not fill once, K tails, fewer rows than
// the bucket and more (passes over W that refill the ring), several column tiles.
func TestGemmTCStagedBucket(t *testing.T) {
	for _, c := range []struct {
		rows, k, n, per    int // per: stages per split (0: the default layout)
		bucket, unroll, pf int
	}{
		{8, 1024, 32, 5, 8, 4, 0},    // 16 stages in splits of 5: two stages a round, the last split short
		{8, 1024, 32, 5, 8, 8, 512},  // four stages in flight, preloaded
		{5, 576, 16, 0, 8, 6, 512},   // 9 stages, the default layout; three in flight
		{16, 1040, 48, 4, 16, 3, 0},  // the 16-wide tail
		{32, 592, 16, 3, 32, 4, 512}, // K % 64 = 16 tail in a split of 3, preloaded
		{20, 512, 32, 3, 16, 2, 512}, // more rows than the bucket: two passes over W refill the ring
		{9, 320, 144, 2, 16, 1, 0},   // two column tiles, idle warps
		{64, 256, 16, 1, 64, 0, 512}, // 64 rows: two buffers of 20 KiB
		{40, 128, 32, 0, 8, 2, 512},  // five passes of 8 rows
	} {
		t.Run(fmt.Sprintf("rows%d_k%d_n%d_r%du%d_pf%d", c.rows, c.k, c.n, c.bucket, c.unroll, c.pf), func(t *testing.T) {
			l := tsLayoutFor(c.k, c.n)
			if c.per > 0 {
				l = tsLayoutPer(c.k, c.n, c.per)
			}
			// More tickets than the call needs, as a bundle's shared workspace has: the
			// partials start past them all.
			one := GemmConfig{K: c.k, N: c.n, WDtype: ptx.BF16, Tickets: l.tickets(c.rows) + 5}
			cfg := one
			cfg.Rows, cfg.Unroll, cfg.Prefetch = c.bucket, c.unroll, c.pf
			k := must(t)(gemmTCStaged("gemm_tc_staged_test", cfg, l))
			base := must(t)(gemmTCStaged("gemm_tc_staged_test", one, l))
			r := rand.New(rand.NewPCG(uint64(c.rows), uint64(c.k)))
			args := stagedArgs(r, c.rows, c.k, c.n, stagedWorkspace(l, c.rows, c.n, one.Tickets))
			checkKernel(t, k, l.launch(), args)
			a, b := newEmuBufs(), newEmuBufs()
			a.run(t, k, l.launch(), args)
			b.run(t, base, l.launch(), args)
			samePair(t, k, "y", a, b)
		})
	}
}

// TestGemmTCStagedReplay runs the kernel twice on the same memory, as a replayed graph does:
// the second run must find the ticket counters reset and give the same y bit for bit.
func TestGemmTCStagedReplay(t *testing.T) {
	const rows, k, n = 33, 512, 144
	cfg := GemmConfig{K: k, N: n, WDtype: ptx.BF16}
	cfg.Tickets = cfg.StagedTickets(rows)
	kern, err := GemmTCStaged("gemm_tc_staged", cfg)
	if err != nil {
		t.Fatal(err)
	}
	mod, err := ptx.Parse(kern.PTX)
	if err != nil {
		t.Fatal(err)
	}
	wsBytes := cfg.WorkspaceBytes(rows)
	if l := tsLayoutFor(k, n); l.splits < 2 || wsBytes == 0 {
		t.Fatalf("layout %+v, workspace %d: the test needs a split reduction", l, wsBytes)
	}
	r := rand.New(rand.NewPCG(31, 32))
	mem := emu.NewMemory()
	var params []uint64
	for _, a := range stagedArgs(r, rows, k, n, wsBytes) {
		if a.isVal {
			params = append(params, a.bits)
			continue
		}
		b := a.bytesOf()
		addr := mem.Alloc(len(b))
		copy(mem.Bytes(addr), b)
		params = append(params, addr)
	}
	y, ws := mem.Bytes(params[2])[:4*rows*n], mem.Bytes(params[4])[:wsBytes]
	counters := ws[:4*cfg.Tickets]
	var first []byte
	for run := range 2 {
		for i := range y {
			y[i] = 0xFF
		}
		if err := emu.Run(mod, kern.Name, emu.Launch{Grid: cfg.LaunchTCStaged(rows).Grid, Block: cfg.LaunchTCStaged(rows).Block}, mem, params); err != nil {
			t.Fatalf("run %d: %v", run, err)
		}
		for i := 0; i < len(counters); i += 4 {
			if c := binary.LittleEndian.Uint32(counters[i:]); c != 0 {
				t.Fatalf("run %d: counter %d left at %d", run, i/4, c)
			}
		}
		if run == 0 {
			first = append([]byte(nil), y...)
		} else if !bytes.Equal(y, first) {
			t.Fatal("second run's y differs from the first")
		}
	}
}

func TestGemmTCStagedPublic(t *testing.T) {
	cfg := GemmConfig{K: 64, N: 48, WDtype: ptx.BF16}
	k, err := GemmTCStaged("gemm_tc_staged", cfg)
	if err != nil {
		t.Fatal(err)
	}
	names := paramNames(k)
	if got := strings.Join(names, ","); got != "x,w,y,rows,ws" {
		t.Errorf("params %s", got)
	}
	for _, want := range []string{mmaOp, "ld.global.nc.v4.b32", "ld.shared.v4.b32", "st.shared.v4.b32", "cvt.rn.bf16x2.f32"} {
		if !strings.Contains(k.PTX, want) {
			t.Errorf("PTX lacks %s", want)
		}
	}
	for _, bad := range []GemmConfig{{K: 48, N: 40, WDtype: ptx.BF16}, {K: 40, N: 48, WDtype: ptx.BF16}, {K: 64, N: 48, WDtype: ptx.F32}, {K: 0, N: 16, WDtype: ptx.BF16}, {K: -16, N: 16, WDtype: ptx.BF16},
		{K: 4096, N: 4096, WDtype: ptx.BF16},                          // 8 splits and no ticket counters
		{K: 4096, N: 4096, WDtype: ptx.BF16, Rows: 16, Tickets: 32}} { // 16 rows need 64
		if _, err := GemmTCStaged("g", bad); err == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
}

// TestGemmTCStagedLayout pins the Llama-3.1-8B shapes: the grid fills two blocks per H200 SM
// where K allows, the LM head needs no workspace, and static shared memory stays <= 48 KiB.
func TestGemmTCStagedLayout(t *testing.T) {
	for _, c := range []struct{ k, n, tiles, splits, ws128 int }{
		{4096, 6144, 48, 6, 16*48*4 + 6*128*6144*4},
		{4096, 4096, 32, 8, 16*32*4 + 8*128*4096*4},
		{4096, 28672, 224, 2, 16*224*4 + 2*128*28672*4},
		{14336, 4096, 32, 9, 16*32*4 + 9*128*4096*4},
		{4096, 128256, 1002, 1, 0},
	} {
		cfg := GemmConfig{K: c.k, N: c.n, WDtype: ptx.BF16}
		l := cfg.LaunchTCStaged(128)
		if l.Grid != [3]int{c.tiles, c.splits, 1} || l.Block != [3]int{256, 1, 1} {
			t.Errorf("K=%d N=%d: launch %v", c.k, c.n, l)
		}
		if ws := cfg.WorkspaceBytes(128); ws != c.ws128 {
			t.Errorf("K=%d N=%d: workspace %d at 128 rows, want %d", c.k, c.n, ws, c.ws128)
		}
		if c.splits > 1 && cfg.WorkspaceBytes(9) != (2*c.tiles*4+15)/16*16+c.splits*16*c.n*4 {
			t.Errorf("K=%d N=%d: workspace %d at 9 rows", c.k, c.n, cfg.WorkspaceBytes(9))
		}
		cfg.Tickets = cfg.StagedTickets(128)
		k, err := GemmTCStaged("g", cfg)
		if err != nil {
			t.Fatal(err)
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
			t.Errorf("K=%d N=%d: %d bytes of static shared memory", c.k, c.n, shared)
		}
	}
}
