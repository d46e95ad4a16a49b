package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"

	"github.com/spf13/cobra"

	"xmix/bundle"
	"xmix/loader/cuda"
)

// maxTuneRows bounds --max-rows: the largest prefill chunk a bundle may have.
const maxTuneRows = 1 << 16

func tuneGemmCmd() *cobra.Command {
	var out string
	var maxRows int
	var quiet bool
	c := &cobra.Command{
		Use:   "tune-gemm BUNDLE.xmb... -o PICKS.json",
		Short: "Time cuBLASLt's algorithms for the bundles' GEMMs on this GPU and write the fastest",
		Long: `tune-gemm times, on GPU 0, each tensor-core GEMM shape of the bundles (decode buckets up
to --max-rows rows) with the first 32 algorithms cuBLASLt's heuristic offers and split-K
variants of its first two, the weights cold as in a decode step, and writes the shapes where
one beats the library's first choice by 1% or more. xmix run, serve and bench take the file
with --gemm-picks; without it they use the table xmix ships for the GPUs it was tuned on.
A pick applies only on the GPU and cuBLASLt version it was measured with.

A GEMM that is faster alone can still make the step longer (on the H200 some buckets of
Llama-3.1-8B did): compare xmix bench --gemm-picks FILE with --gemm-picks none, or run
testsuite/gpu/tune_gemm.sh, which keeps a bucket's picks where they shortened its step
together, or else the one pick that shortened it most alone.`,
		Example: `  xmix tune-gemm llama8b.xmb -o picks.json
  xmix bench llama8b.xmb --gemm-picks picks.json`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if out == "" {
				return fmt.Errorf("no output: add -o PICKS.json")
			}
			if err := checkOutFile(out); err != nil { // before the tuning, not after it
				return fmt.Errorf("-o %s: %w", out, err)
			}
			if maxRows < 1 || maxRows > maxTuneRows {
				return fmt.Errorf("--max-rows %d: give 1 to %d", maxRows, maxTuneRows)
			}
			progress := func(format string, a ...any) {
				if !quiet {
					fmt.Fprintf(os.Stderr, format+"\n", a...)
				}
			}
			return tuneGemm(cmd.OutOrStdout(), args, out, maxRows, progress)
		},
	}
	c.Flags().StringVarP(&out, "output", "o", "", "file to write the picks to (JSON)")
	c.Flags().IntVar(&maxRows, "max-rows", 128, "tune GEMMs of at most this many rows: the decode buckets (prefill chunks are compute-bound, where cuBLASLt's first choice serves)")
	c.Flags().BoolVarP(&quiet, "quiet", "q", false, "no progress output on stderr")
	return c
}

// tuneGemm tunes the GEMM shapes of the bundles at paths, prints what each measured and
// writes the picks to out.
func tuneGemm(w io.Writer, paths []string, out string, maxRows int, progress cuda.Progress) error {
	var shapes []cuda.GemmShape
	for _, p := range paths {
		b, err := bundle.ReadFile(p)
		if err != nil {
			return err
		}
		s, err := cuda.GemmShapes(b, maxRows)
		if err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
		for _, x := range s {
			if !slices.Contains(shapes, x) {
				shapes = append(shapes, x)
			}
		}
	}
	if len(shapes) == 0 {
		return fmt.Errorf("no tensor-core GEMM of at most %d rows in %v: nothing to tune (decode buckets from --tensor-core-rows rows run them)", maxRows, paths)
	}
	progress("tune-gemm: %d GEMM shapes", len(shapes))
	timings, err := cuda.TuneGemms(shapes, progress)
	if err != nil {
		return err
	}
	picks := []cuda.GemmPick{}
	fmt.Fprintf(w, "%-22s %10s %10s %7s  %s\n", "shape (MxNxK)", "first µs", "picked µs", "change", "algorithm")
	for _, t := range timings {
		shape := fmt.Sprintf("%dx%dx%d", t.Shape.M, t.Shape.N, t.Shape.K)
		if t.Pick == nil {
			fmt.Fprintf(w, "%-22s %10.2f %10s %7s  cuBLASLt's first (of %d timed)\n", shape, t.HeuristicUs, "-", "-", t.Candidates)
			continue
		}
		p := *t.Pick
		picks = append(picks, p)
		fmt.Fprintf(w, "%-22s %10.2f %10.2f %+6.1f%%  %s (of %d timed)\n", shape, p.HeuristicUs, p.Us,
			100*(p.Us/p.HeuristicUs-1), p.Algorithm(), t.Candidates)
	}
	data, err := json.MarshalIndent(picks, "", " ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(out, append(data, '\n'), 0o644); err != nil {
		return err
	}
	progress("tune-gemm: %d of %d shapes picked, written to %s", len(picks), len(shapes), out)
	return nil
}
