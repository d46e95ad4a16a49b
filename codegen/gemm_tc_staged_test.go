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

func checkStaged(t *testing.T, rows, k, n int, l tsLayout) {
	t.Helper()
	cfg := GemmConfig{K: k, N: n, WDtype: ptx.BF16}
	kern, err := gemmTCStaged("gemm_tc_staged_test", cfg, l)
	if err != nil {
		t.Fatal(err)
	}
	if kern.Op != "gemm_tc" {
		t.Fatalf("op %q, want gemm_tc", kern.Op)
	}
	r := rand.New(rand.NewPCG(uint64(rows), uint64(k*1000+n)))
	checkKernel(t, kern, l.launch(), stagedArgs(r, rows, k, n, l.workspace(rows, n)))
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

// TestGemmTCStagedReplay runs the kernel twice on the same memory, as a replayed graph does:
// the second run must find the ticket counters reset and give the same y bit for bit.
func TestGemmTCStagedReplay(t *testing.T) {
	const rows, k, n = 33, 512, 144
	cfg := GemmConfig{K: k, N: n, WDtype: ptx.BF16}
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
	counters := ws[wsBytes-4*((rows+127)/128)*cfg.LaunchTCStaged(rows).Grid[0]:]
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
	for _, bad := range []GemmConfig{{K: 48, N: 40, WDtype: ptx.BF16}, {K: 40, N: 48, WDtype: ptx.BF16}, {K: 64, N: 48, WDtype: ptx.F32}, {K: 0, N: 16, WDtype: ptx.BF16}, {K: -16, N: 16, WDtype: ptx.BF16}} {
		if _, err := GemmTCStaged("g", bad); err == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
}

// TestGemmTCStagedLayout pins the Llama-3.1-8B shapes: the grid fills two blocks per H200 SM
// where K allows, the LM head needs no workspace, and static shared memory stays <= 48 KiB.
func TestGemmTCStagedLayout(t *testing.T) {
	for _, c := range []struct{ k, n, tiles, splits, ws128 int }{
		{4096, 6144, 48, 6, 6*128*6144*4 + 48*4},
		{4096, 4096, 32, 8, 8*128*4096*4 + 32*4},
		{4096, 28672, 224, 2, 2*128*28672*4 + 224*4},
		{14336, 4096, 32, 9, 9*128*4096*4 + 32*4},
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
		if c.splits > 1 && cfg.WorkspaceBytes(9) != c.splits*16*c.n*4+c.tiles*4 {
			t.Errorf("K=%d N=%d: workspace %d at 9 rows", c.k, c.n, cfg.WorkspaceBytes(9))
		}
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
