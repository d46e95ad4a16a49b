package cpu

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"xmix/bundle"
	"xmix/loader/rendezvous"
	"xmix/ops"
)

// loopback joins n ranks over 127.0.0.1 and returns their groups, rank 0 first.
func loopback(t *testing.T, n int) []*rendezvous.Group {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg := rendezvous.Config{World: n, Addr: ln.Addr().String(), Bundle: "test", Timeout: 5 * time.Second}
	gs := make([]*rendezvous.Group, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := 1; r < n; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := cfg
			c.Rank = r
			gs[r], errs[r] = rendezvous.Join(context.Background(), c)
		}()
	}
	gs[0], errs[0] = rendezvous.Lead(context.Background(), ln, cfg)
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	t.Cleanup(func() {
		for _, g := range gs {
			g.Close()
		}
	})
	return gs
}

func newHub(g *rendezvous.Group, wait time.Duration) *hub {
	return &hub{n: g.World, links: g.Links, wait: wait}
}

// overTCP runs fn as rank 0 with the hub and as every other rank with its spoke, at once.
func overTCP(t *testing.T, n int, fn func(c exchanger, id int) error) []error {
	gs := loopback(t, n)
	return concurrently(n, func(id int) exchanger {
		if id == 0 {
			return newHub(gs[0], 5*time.Second)
		}
		return spoke{gs[id].Links[0]}
	}, fn)
}

// reduceRank is a rank whose one template runs kernel k, then all-reduces 4 floats held in
// a buffer "x" that host writes can reach.
func reduceRank(id, tp int, k ops.RunnerFunc) *rank {
	mem := alignedBytes(16)
	x := ops.Arg{Mem: mem}.F32()[:4]
	return rankOf(id, tp, map[string][]byte{"x": mem}, boundNode{label: "k", run: k},
		boundNode{label: "reduce", coll: &collective{op: "all_reduce_sum", in: x, out: x, rows: 1, cols: 4}})
}

// rankOf is a rank with buffers bufs whose one template runs nodes.
func rankOf(id, tp int, bufs map[string][]byte, nodes ...boundNode) *rank {
	return &rank{id: id, tp: tp, bufs: bufs, templates: []bundle.Template{{Name: "t"}}, lists: [][][]boundNode{{nodes}}}
}

func nop([]ops.Arg, ops.Launch) error { return nil }

// groupOf2 is rank 0's backend over TCP and the error its worker (running rk1) ended with.
func groupOf2(t *testing.T, rk1 *rank, wait time.Duration) (*Backend, chan error) {
	gs := loopback(t, 2)
	done := make(chan error, 1)
	go func() { done <- serve(rk1, gs[1].Links[0]) }()
	h := newHub(gs[0], wait)
	if err := h.awaitAll(frameReady); err != nil {
		t.Fatal(err)
	}
	return &Backend{ranks: []*rank{reduceRank(0, 2, nop)}, sharded: map[string]bool{}, hub: h}, done
}

// TestGroupForwardsWritesAndSteps: rank 0's writes reach the worker before its step, the
// sum comes back to both, and Close lets the worker return nil.
func TestGroupForwardsWritesAndSteps(t *testing.T) {
	rk1 := reduceRank(1, 2, nop)
	be, done := groupOf2(t, rk1, 5*time.Second)
	if err := be.Write("x", 4, []byte{0, 0, 0x80, 0x3f}); err != nil { // x[1] = 1
		t.Fatal(err)
	}
	if err := be.Step(0); err != nil {
		t.Fatal(err)
	}
	// x[1] was 1 on both ranks: the sum is 2 on both.
	if got := (ops.Arg{Mem: be.Buffer("x")}).F32()[1]; got != 2 {
		t.Errorf("rank 0: x[1] = %v, want 2", got)
	}
	if err := be.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("worker after goodbye: %v", err)
	}
	if got := (ops.Arg{Mem: rk1.bufs["x"]}).F32()[1]; got != 2 {
		t.Errorf("rank 1: x[1] = %v, want 2", got)
	}
	if err := be.Step(0); err == nil || !strings.Contains(err.Error(), "stopped after an earlier failure: rank 0 closed the group") {
		t.Errorf("step after close: %v", err)
	}
}

// TestGroupWorkerFails: a worker whose kernel fails tells rank 0, whose step returns that
// error naming the rank; later steps say the group stopped.
func TestGroupWorkerFails(t *testing.T) {
	bad := func([]ops.Arg, ops.Launch) error { return errors.New("bad input") }
	be, done := groupOf2(t, reduceRank(1, 2, bad), 5*time.Second)
	err := be.Step(0)
	if err == nil || !strings.Contains(err.Error(), "rank 1 at 127.0.0.1:") || !strings.Contains(err.Error(), "failed: rank 1: node k: bad input") {
		t.Fatalf("step: %v", err)
	}
	if werr := <-done; werr == nil || !strings.Contains(werr.Error(), "bad input") {
		t.Errorf("worker: %v", werr)
	}
	if err := be.Step(0); err == nil || !strings.Contains(err.Error(), "stopped after an earlier failure") {
		t.Errorf("second step: %v", err)
	}
}

// TestGroupWorkerDies: a worker that vanishes mid-step (its process killed: the connection
// closes) fails rank 0's step at once, naming it; one that hangs fails it at the wait limit.
func TestGroupWorkerDies(t *testing.T) {
	for _, c := range []struct {
		name string
		k    ops.RunnerFunc
		want string
	}{
		{"dies", nil, "closed the connection"},
		{"hangs", func([]ops.Arg, ops.Launch) error { time.Sleep(2 * time.Second); return nil }, "timed out"},
	} {
		t.Run(c.name, func(t *testing.T) {
			gs := loopback(t, 2)
			link := gs[1].Links[0]
			go func() {
				link.Post(frameReady, nil)
				link.Recv(time.Time{}) // the step
				if c.k == nil {
					link.Close()
					return
				}
				c.k(nil, ops.Launch{})
			}()
			h := newHub(gs[0], 300*time.Millisecond)
			if err := h.awaitAll(frameReady); err != nil {
				t.Fatal(err)
			}
			be := &Backend{ranks: []*rank{reduceRank(0, 2, nop)}, hub: h}
			start := time.Now()
			err := be.Step(0)
			if err == nil || !strings.Contains(err.Error(), "node reduce: rank 1 at 127.0.0.1:") || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("step: %v", err)
			}
			if el := time.Since(start); el > time.Second {
				t.Errorf("rank 0 noticed after %s", el)
			}
		})
	}
}
