package rendezvous

import (
	"bytes"
	"context"
	"net"
	"strings"
	"sync"
	"testing"
	"time"
)

// listen opens rank 0's listener on a free loopback port.
func listen(t *testing.T) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

// group runs rank 0 on ln with cfg and every other config at once; it returns each rank's
// group and error in the order given (rank 0 first).
func group(ln net.Listener, lead Config, others ...Config) ([]*Group, []error) {
	gs := make([]*Group, 1+len(others))
	errs := make([]error, 1+len(others))
	var wg sync.WaitGroup
	for i, c := range others {
		wg.Add(1)
		go func() {
			defer wg.Done()
			gs[i+1], errs[i+1] = Join(context.Background(), c)
		}()
	}
	gs[0], errs[0] = Lead(context.Background(), ln, lead)
	wg.Wait()
	return gs, errs
}

func cfg(rank, world int, addr, bundle string) Config {
	return Config{Rank: rank, World: world, Addr: addr, Bundle: bundle, Timeout: 3 * time.Second}
}

func closeAll(gs []*Group) {
	for _, g := range gs {
		if g != nil {
			g.Close()
		}
	}
}

// TestRendezvous: three ranks (two dialing before rank 0 listens would be fine too) get one
// random 128-byte id, the rank table, and links that carry frames both ways.
func TestRendezvous(t *testing.T) {
	ln := listen(t)
	addr := ln.Addr().String()
	gs, errs := group(ln, cfg(0, 3, addr, "b"), cfg(2, 3, addr, "b"), cfg(1, 3, addr, "b"))
	defer closeAll(gs)
	for i, err := range errs {
		if err != nil {
			t.Fatalf("member %d: %v", i, err)
		}
	}
	if gs[0].ID == [IDBytes]byte{} {
		t.Fatal("the unique id is all zeros")
	}
	for _, g := range gs[1:] {
		if g.ID != gs[0].ID || len(g.Addrs) != 3 || g.Addrs[0] != addr || g.Links[0] == nil {
			t.Fatalf("rank %d: id or table differs from rank 0's: %v", g.Rank, g.Addrs)
		}
	}
	// Rank 0's link to rank 2 reaches the group whose Rank is 2, and back.
	to2 := gs[0].Links[2]
	if err := to2.Send(FirstUserKind, []byte("ping")); err != nil || to2.Flush() != nil {
		t.Fatal(err)
	}
	from0 := gs[1].Links[0]
	kind, p, err := from0.Recv(time.Now().Add(time.Second))
	if err != nil || kind != FirstUserKind || string(p) != "ping" {
		t.Fatalf("rank 2 got %d %q %v", kind, p, err)
	}
	// Two rendezvous give two ids.
	ln2 := listen(t)
	gs2, errs2 := group(ln2, cfg(0, 2, ln2.Addr().String(), "b"), cfg(1, 2, ln2.Addr().String(), "b"))
	defer closeAll(gs2)
	if errs2[0] != nil || errs2[1] != nil || bytes.Equal(gs2[0].ID[:], gs[0].ID[:]) {
		t.Fatalf("second rendezvous: %v %v, or the same id", errs2[0], errs2[1])
	}
}

// TestRendezvousRefuses: a rank of another group size, bundle or rank number is refused,
// and both it and rank 0 say why, naming the rank and address.
func TestRendezvousRefuses(t *testing.T) {
	for _, c := range []struct {
		name   string
		worker Config
		want   string
	}{
		{"world", Config{Rank: 1, World: 3, Bundle: "b"}, "runs a group of 3 ranks, rank 0 runs 2"},
		{"bundle", Config{Rank: 1, World: 2, Bundle: "0123456789abcdef-other"}, "runs bundle 0123456789abcdef, rank 0 runs b"},
		{"protocol", Config{}, "did not greet as an xmix rank"},
	} {
		t.Run(c.name, func(t *testing.T) {
			ln := listen(t)
			addr := ln.Addr().String()
			w := c.worker
			w.Addr, w.Timeout = addr, 3*time.Second
			var gs []*Group
			var errs []error
			if c.name == "protocol" {
				gs, errs = make([]*Group, 2), make([]error, 2)
				go rawDial(addr)
				gs[0], errs[0] = Lead(context.Background(), ln, cfg(0, 2, addr, "b"))
				errs[1] = errs[0]
			} else {
				gs, errs = group(ln, cfg(0, 2, addr, "b"), w)
			}
			defer closeAll(gs)
			if errs[0] == nil || !strings.Contains(errs[0].Error(), "rank 0 at "+addr) || !strings.Contains(errs[0].Error(), c.want) {
				t.Errorf("rank 0: %v, want %q", errs[0], c.want)
			}
			if errs[1] == nil || !strings.Contains(errs[1].Error(), c.want) {
				t.Errorf("worker: %v, want %q", errs[1], c.want)
			}
		})
	}
}

// rawDial connects and sends bytes that are no hello.
func rawDial(addr string) {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return
	}
	defer c.Close()
	c.Write([]byte("GET / HTTP/1.0\r\n\r\n"))
	time.Sleep(500 * time.Millisecond)
}

// TestRendezvousTimeouts: a rank whose rank 0 never starts, and a rank 0 whose ranks never
// come, give up at the deadline with errors naming the address and the missing ranks.
func TestRendezvousTimeouts(t *testing.T) {
	ln := listen(t)
	addr := ln.Addr().String()
	ln.Close() // nobody listens here now
	start := time.Now()
	_, err := Join(context.Background(), Config{Rank: 1, World: 2, Addr: addr, Timeout: 300 * time.Millisecond})
	if err == nil || !strings.Contains(err.Error(), "rank 1: rank 0 at "+addr+" did not answer within 300ms") {
		t.Errorf("worker without rank 0: %v", err)
	}
	if el := time.Since(start); el > 2*time.Second {
		t.Errorf("worker gave up after %s, deadline 300ms", el)
	}

	ln = listen(t)
	addr = ln.Addr().String()
	c0 := Config{Rank: 0, World: 3, Addr: addr, Timeout: 300 * time.Millisecond}
	c1 := c0
	c1.Rank = 1
	_, errs := group(ln, c0, c1)
	if errs[0] == nil || !strings.Contains(errs[0].Error(), "rank 0 at "+addr+": rank(s) [2] of 3 never joined: timed out after 300ms") {
		t.Errorf("rank 0 without rank 2: %v", errs[0])
	}
	if errs[1] == nil || !strings.Contains(errs[1].Error(), "rank 1: waiting for the other ranks to join: rank 0 at "+addr) {
		t.Errorf("rank 1 whose group never completed: %v", errs[1])
	}
}

// TestConfigChecked: impossible ranks, no address and a negative timeout fail before any
// network use.
func TestConfigChecked(t *testing.T) {
	for _, c := range []struct {
		cfg  Config
		want string
	}{
		{Config{Rank: 2, World: 2, Addr: "x:1"}, "rank 2 of a group of 2: want 0 <= rank < 2"},
		{Config{Rank: -1, World: 2, Addr: "x:1"}, "rank -1 of a group of 2"},
		{Config{Rank: 1, World: 2}, "rank 1: no address for rank 0"},
		{Config{Rank: 1, World: 2, Addr: "x:1", Timeout: -time.Second}, "rank 1: timeout -1s: want 0 (the default, 1m0s) or more"},
	} {
		if _, err := Join(context.Background(), c.cfg); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want %q", c.cfg, err, c.want)
		}
	}
}

// TestRecvRefusesHugeFrame: a length beyond MaxFrame is an error, not an allocation.
func TestRecvRefusesHugeFrame(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	go b.Write([]byte{FirstUserKind, 0xff, 0xff, 0xff, 0xff})
	l := newLink(a, "rank 1 at pipe")
	l.limit = MaxFrame
	_, _, err := l.Recv(time.Now().Add(time.Second))
	if err == nil || !strings.Contains(err.Error(), "rank 1 at pipe: announced a frame of 4294967295 bytes") {
		t.Fatalf("%v", err)
	}
}
