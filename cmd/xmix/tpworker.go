package main

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"xmix/bundle"
	"xmix/loader"
	"xmix/loader/cpu"
	"xmix/loader/rendezvous"
)

// Tensor parallelism across processes: rank 0 is an ordinary run, serve or bench given
// --tp-addr; every other rank is an 'xmix tp-worker'. They meet through package rendezvous.

const tpLaunch = `A bundle built with 'xmixc build --tp N' runs as N ranks. Without --tp-addr they are
goroutines of one process. With it, each rank is its own process, on this host or on others:

  rank 0:     xmix run  model.xmb --tp-addr HOST0:29500 --prompt "Hello"   (or serve, bench)
  rank 1..N-1: xmix tp-worker model.xmb --rank R --tp-addr HOST0:29500

HOST0 is rank 0's host as the others reach it (rank 0 listens on that address; use
0.0.0.0:29500 on rank 0 to listen on every interface). Start them in any order: workers
retry until --tp-timeout, and rank 0 waits as long for them. Every rank must load the same
.xmb (checked by content digest); rank 0 then sends each the group's 128-byte unique id,
what NCCL's ncclCommInitRank would take. Rank 0 runs the engine; workers carry out its
writes and steps and exchange activations with it at every collective, and exit when it
closes. The ranks run on the CPU backend today.`

// addTPFlags registers the flags of a multi-process group's rank 0.
func (f *runFlags) addTPFlags(fl *pflag.FlagSet) {
	fl.StringVar(&f.tpAddr, "tp-addr", "", "run a --tp bundle as rank 0 of a group of processes, listening on HOST:PORT for the 'xmix tp-worker' ranks (see xmix tp-worker --help)")
	fl.DurationVar(&f.tpTimeout, "tp-timeout", rendezvous.DefaultTimeout, "with --tp-addr: how long to wait for every rank to join")
}

// openGroup loads rank 0 of b and waits for the other ranks at f.tpAddr.
func openGroup(kind string, b *bundle.Bundle, w *loader.Weights, f runFlags) (loader.Backend, error) {
	if kind == "cuda" {
		return nil, fmt.Errorf("--tp-addr: ranks in separate processes run on the CPU backend only (GPU ranks need NCCL, not yet supported)")
	}
	cfg, err := groupConfig(b, 0, f.tpAddr, f.tpTimeout)
	if err != nil {
		return nil, err
	}
	f.progress("rank 0: waiting on %s for %d more ranks (up to %s)", f.tpAddr, cfg.World-1, f.tpTimeout)
	g, err := rendezvous.Join(context.Background(), cfg)
	if err != nil {
		return nil, err
	}
	f.progress("rank 0: every rank joined: %v", g.Addrs)
	return cpu.NewGroup(b, w, g, cpu.GroupOptions{Progress: f.progress})
}

// groupConfig is the rendezvous configuration of rank of bundle b.
func groupConfig(b *bundle.Bundle, rank int, addr string, timeout time.Duration) (rendezvous.Config, error) {
	if timeout < 0 {
		return rendezvous.Config{}, fmt.Errorf("--tp-timeout %s: want 0 (the default, %s) or more", timeout, rendezvous.DefaultTimeout)
	}
	if b.Manifest.TP <= 1 {
		return rendezvous.Config{}, fmt.Errorf("the bundle is not tensor-parallel (tp %d): build it with 'xmixc build --tp N' to run it as N ranks", b.Manifest.TP)
	}
	digest, err := loader.BundleDigest(b)
	if err != nil {
		return rendezvous.Config{}, err
	}
	return rendezvous.Config{Rank: rank, World: b.Manifest.TP, Addr: addr, Bundle: digest, Timeout: timeout}, nil
}

func tpWorkerCmd() *cobra.Command {
	var (
		rank    int
		addr    string
		timeout time.Duration
		quiet   bool
	)
	c := &cobra.Command{
		Use:   "tp-worker BUNDLE.xmb --rank R --tp-addr HOST:PORT",
		Short: "Run one rank (1..N-1) of a tensor-parallel bundle for a rank 0 started with --tp-addr",
		Long:  tpLaunch,
		Example: `  xmix run tiny-tp2.xmb --tp-addr 127.0.0.1:29500 --prompt "Hello" &
  xmix tp-worker tiny-tp2.xmb --rank 1 --tp-addr 127.0.0.1:29500`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			f := runFlags{quiet: quiet}
			if rank < 1 {
				return fmt.Errorf("--rank %d: workers are ranks 1..N-1; rank 0 is 'xmix run|serve|bench --tp-addr'", rank)
			}
			return runWorker(args[0], rank, addr, timeout, f)
		},
	}
	c.Flags().IntVar(&rank, "rank", 0, "this worker's rank, 1..N-1 (N: the bundle's --tp)")
	c.Flags().StringVar(&addr, "tp-addr", "", "rank 0's HOST:PORT (its --tp-addr)")
	c.Flags().DurationVar(&timeout, "tp-timeout", rendezvous.DefaultTimeout, "how long to keep trying to reach rank 0 and wait for the others")
	c.Flags().BoolVarP(&quiet, "quiet", "q", false, "no progress output on stderr")
	c.MarkFlagRequired("tp-addr")
	return c
}

// runWorker joins the group as rank, then serves rank 0 until it closes.
func runWorker(path string, rank int, addr string, timeout time.Duration, f runFlags) error {
	b, err := bundle.ReadFile(path)
	if err != nil {
		return err
	}
	cfg, err := groupConfig(b, rank, addr, timeout)
	if err != nil {
		return err
	}
	w, err := loader.OpenWeights(b, filepath.Dir(path))
	if err != nil {
		return err
	}
	defer w.Close()
	f.progress("rank %d: joining rank 0 at %s", rank, addr)
	g, err := rendezvous.Join(context.Background(), cfg)
	if err != nil {
		return err
	}
	f.progress("rank %d of %d: joined; serving rank 0", rank, g.World)
	if err := cpu.Serve(b, w, g, f.progress); err != nil {
		return err
	}
	f.progress("rank %d: rank 0 closed the group", rank)
	return nil
}
