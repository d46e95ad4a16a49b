// Package rendezvous lets the ranks of a tensor-parallel group find each other over TCP, as
// NCCL's ranks must before ncclCommInitRank: rank 0 listens, every other rank dials it
// (retrying until a deadline, so the processes may start in any order) and says its rank,
// the group's size and the bundle it runs; rank 0 checks them all, then sends every rank the
// group's unique id and the rank table. The connections stay open as framed Links, which
// the caller may use to exchange whatever its ranks exchange.
package rendezvous

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"time"
)

// IDBytes is the size of the unique id: NCCL's ncclUniqueId is 128 opaque bytes that rank 0
// makes (ncclGetUniqueId) and every rank passes to ncclCommInitRank.
const IDBytes = 128

// DefaultTimeout bounds a rendezvous when Config.Timeout is zero.
const DefaultTimeout = 60 * time.Second

// protocol names this handshake; a peer that says anything else is not an xmix rank of
// this version.
const protocol = "xmix-tp/1"

// Config is what one rank knows before the rendezvous.
type Config struct {
	Rank  int    // 0 listens; 1..World-1 dial
	World int    // number of ranks (the bundle's tensor-parallel degree)
	Addr  string // rank 0's HOST:PORT
	// Bundle identifies the bundle this rank runs (loader.BundleDigest): every rank must run
	// the same one, or their shards and templates would not fit together.
	Bundle  string
	Timeout time.Duration // the whole rendezvous; 0: DefaultTimeout
}

// Group is one rank's view of a completed rendezvous.
type Group struct {
	Rank, World int
	// ID is the group's unique id, the same on every rank.
	ID [IDBytes]byte
	// Addrs[r] is where rank 0 saw rank r (rank 0: its listening address).
	Addrs []string
	// Links: on rank 0, Links[r] reaches rank r (Links[0] is nil); on every other rank,
	// Links[0] reaches rank 0 and the rest are nil (ranks talk through rank 0).
	Links []*Link
}

// Close closes every link of the group.
func (g *Group) Close() error {
	var errs []error
	for _, l := range g.Links {
		if l != nil {
			errs = append(errs, l.Close())
		}
	}
	return errors.Join(errs...)
}

// hello is what a dialing rank says first.
type hello struct {
	Protocol string `json:"protocol"`
	Rank     int    `json:"rank"`
	World    int    `json:"world"`
	Bundle   string `json:"bundle"`
}

// welcome is rank 0's answer once every rank has joined.
type welcome struct {
	ID    []byte   `json:"id"`
	Addrs []string `json:"addrs"`
}

func (c Config) check() error {
	if c.World < 1 || c.Rank < 0 || c.Rank >= c.World {
		return fmt.Errorf("rank %d of a group of %d: want 0 <= rank < %d", c.Rank, c.World, max(c.World, 1))
	}
	if c.Addr == "" {
		return fmt.Errorf("rank %d: no address for rank 0 (HOST:PORT)", c.Rank)
	}
	if c.Timeout < 0 {
		return fmt.Errorf("rank %d: timeout %s: want 0 (the default, %s) or more", c.Rank, c.Timeout, DefaultTimeout)
	}
	return nil
}

func (c Config) deadline() time.Time { return time.Now().Add(timeoutOf(c)) }

// Join takes part in the rendezvous as cfg.Rank: rank 0 listens on cfg.Addr (see Lead),
// every other rank dials it.
func Join(ctx context.Context, cfg Config) (*Group, error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	if cfg.Rank == 0 {
		ln, err := net.Listen("tcp", cfg.Addr)
		if err != nil {
			return nil, fmt.Errorf("rank 0: listen on %s: %w", cfg.Addr, err)
		}
		return Lead(ctx, ln, cfg)
	}
	return dial(ctx, cfg)
}

// Lead is rank 0's side on a listener the caller opened (tests listen on port 0 to learn
// the address first). It accepts until every other rank has joined, refuses (and fails on)
// a rank with another group size, rank or bundle, then welcomes them all. It closes ln.
func Lead(ctx context.Context, ln net.Listener, cfg Config) (*Group, error) {
	defer ln.Close()
	if err := cfg.check(); err != nil {
		return nil, err
	}
	deadline := cfg.deadline()
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	if tl, ok := ln.(*net.TCPListener); ok {
		if err := tl.SetDeadline(deadline); err != nil {
			return nil, fmt.Errorf("rank 0 at %s: %w", ln.Addr(), err)
		}
	}
	g := &Group{Rank: 0, World: cfg.World, Addrs: make([]string, cfg.World), Links: make([]*Link, cfg.World)}
	g.Addrs[0] = ln.Addr().String()
	if err := g.accept(ctx, ln, cfg, deadline); err != nil {
		g.Close()
		return nil, err
	}
	if _, err := rand.Read(g.ID[:]); err != nil {
		g.Close()
		return nil, fmt.Errorf("rank 0: unique id: %w", err)
	}
	msg, err := json.Marshal(welcome{ID: g.ID[:], Addrs: g.Addrs})
	if err != nil {
		g.Close()
		return nil, err
	}
	for _, l := range g.Links[1:] {
		if err := l.Post(kindWelcome, msg); err != nil {
			g.Close()
			return nil, fmt.Errorf("rank 0: welcome: %w", err)
		}
	}
	return g, nil
}

// accept fills g's links until every rank 1..World-1 has said a valid hello.
func (g *Group) accept(ctx context.Context, ln net.Listener, cfg Config, deadline time.Time) error {
	for joined := 1; joined < cfg.World; joined++ {
		conn, err := ln.Accept()
		if err != nil {
			return g.acceptError(ctx, ln, cfg, err)
		}
		l := newLink(conn, "rank ? at "+conn.RemoteAddr().String())
		h, err := readHello(l, deadline)
		if err == nil {
			l.Peer = fmt.Sprintf("rank %d at %s", h.Rank, conn.RemoteAddr())
			err = g.admit(h, cfg)
		}
		if err != nil {
			// Tell the refused rank why before failing, so both sides print the cause.
			l.Post(kindRefuse, []byte(err.Error()))
			l.Close()
			return fmt.Errorf("rank 0 at %s: %s: %w", ln.Addr(), l.Peer, err)
		}
		l.limit = MaxFrame
		g.Links[h.Rank], g.Addrs[h.Rank] = l, conn.RemoteAddr().String()
	}
	return nil
}

// acceptError explains why rank 0 stopped waiting: which ranks never came, and by when.
func (g *Group) acceptError(ctx context.Context, ln net.Listener, cfg Config, err error) error {
	var missing []int
	for r := 1; r < cfg.World; r++ {
		if g.Links[r] == nil {
			missing = append(missing, r)
		}
	}
	switch {
	case ctx.Err() != nil:
		err = ctx.Err()
	case errors.Is(err, os.ErrDeadlineExceeded):
		err = fmt.Errorf("timed out after %s", timeoutOf(cfg))
	}
	return fmt.Errorf("rank 0 at %s: rank(s) %v of %d never joined: %w", ln.Addr(), missing, cfg.World, err)
}

func timeoutOf(cfg Config) time.Duration {
	if cfg.Timeout == 0 {
		return DefaultTimeout
	}
	return cfg.Timeout
}

func readHello(l *Link, deadline time.Time) (hello, error) {
	var h hello
	kind, payload, err := l.Recv(deadline)
	if err != nil && !errors.Is(err, errTooLarge) {
		return h, err
	}
	if err != nil || kind != kindHello || json.Unmarshal(payload, &h) != nil || h.Protocol != protocol {
		return h, fmt.Errorf("did not greet as an xmix rank (%s); is another program dialing this port?", protocol)
	}
	return h, nil
}

// admit checks a hello against rank 0's own configuration.
func (g *Group) admit(h hello, cfg Config) error {
	switch {
	case h.World != cfg.World:
		return fmt.Errorf("it runs a group of %d ranks, rank 0 runs %d: start every rank with the same bundle", h.World, cfg.World)
	case h.Rank < 1 || h.Rank >= cfg.World:
		return fmt.Errorf("rank %d is outside 1..%d", h.Rank, cfg.World-1)
	case g.Links[h.Rank] != nil:
		return fmt.Errorf("rank %d joined twice (first from %s)", h.Rank, g.Addrs[h.Rank])
	case h.Bundle != cfg.Bundle:
		return fmt.Errorf("it runs bundle %s, rank 0 runs %s: every rank must load the same .xmb", short(h.Bundle), short(cfg.Bundle))
	}
	return nil
}

// short abbreviates a digest for messages; 16 hex digits tell bundles apart.
func short(digest string) string {
	if len(digest) > 16 {
		return digest[:16]
	}
	return digest
}

// dial is a non-zero rank's side: reach rank 0, say hello, wait for the welcome.
func dial(ctx context.Context, cfg Config) (*Group, error) {
	deadline := cfg.deadline()
	conn, err := dialRetry(ctx, cfg, deadline)
	if err != nil {
		return nil, err
	}
	l := newLink(conn, "rank 0 at "+cfg.Addr)
	stop := context.AfterFunc(ctx, func() { l.Close() })
	defer stop()
	g, err := greet(l, cfg, deadline)
	if err != nil {
		l.Close()
		return nil, fmt.Errorf("rank %d: %w", cfg.Rank, err)
	}
	return g, nil
}

// dialRetry dials rank 0 with growing pauses until deadline: rank 0 may start after us.
func dialRetry(ctx context.Context, cfg Config, deadline time.Time) (net.Conn, error) {
	pause := 20 * time.Millisecond
	for {
		d := net.Dialer{Deadline: deadline}
		conn, err := d.DialContext(ctx, "tcp", cfg.Addr)
		if err == nil {
			return conn, nil
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("rank %d: dial rank 0 at %s: %w", cfg.Rank, cfg.Addr, ctx.Err())
		}
		if time.Until(deadline) < pause {
			return nil, fmt.Errorf("rank %d: rank 0 at %s did not answer within %s (is it started, and is the address reachable?): %w",
				cfg.Rank, cfg.Addr, timeoutOf(cfg), err)
		}
		time.Sleep(pause)
		pause = min(2*pause, time.Second)
	}
}

func greet(l *Link, cfg Config, deadline time.Time) (*Group, error) {
	msg, err := json.Marshal(hello{Protocol: protocol, Rank: cfg.Rank, World: cfg.World, Bundle: cfg.Bundle})
	if err != nil {
		return nil, err
	}
	if err := l.Post(kindHello, msg); err != nil {
		return nil, err
	}
	kind, payload, err := l.Recv(deadline)
	if err != nil {
		return nil, fmt.Errorf("waiting for the other ranks to join: %w", err)
	}
	switch kind {
	case kindRefuse:
		return nil, fmt.Errorf("%s refused this rank: %s", l.Peer, payload)
	case kindWelcome:
	default:
		return nil, fmt.Errorf("%s sent frame kind %d, want a welcome", l.Peer, kind)
	}
	var w welcome
	if err := json.Unmarshal(payload, &w); err != nil || len(w.ID) != IDBytes || len(w.Addrs) != cfg.World {
		return nil, fmt.Errorf("%s sent a malformed welcome", l.Peer)
	}
	l.limit = MaxFrame
	g := &Group{Rank: cfg.Rank, World: cfg.World, Addrs: w.Addrs, Links: make([]*Link, cfg.World)}
	copy(g.ID[:], w.ID)
	g.Links[0] = l
	return g, nil
}
