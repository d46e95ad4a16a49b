// Command xmixc compiles a model spec and MI app specs into an .xmb bundle.
package main

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"xmix/bundle"
	"xmix/codegen"
	"xmix/compile"
	"xmix/passes"
)

func main() {
	if err := rootCmd().Execute(); err != nil {
		os.Exit(1)
	}
}

func rootCmd() *cobra.Command {
	root := &cobra.Command{
		Version: compile.Version(),
		Use:     "xmixc",
		Short:   "Compile LLM models with mechanistic-interpretability apps into xmix bundles",
		Long: `xmixc reads a model spec (specs/models/*.yaml) and any number of app specs
(specs/apps/*.yaml), fuses the apps' MI operations into generated PTX kernels, and writes one
.xmb bundle that 'xmix run' executes on a GPU or the CPU.`,
		SilenceUsage: true,
	}
	root.AddCommand(buildCmd(), checkCmd(), inspectCmd(), ptxCmd())
	return root
}

// writeBundle writes data to path. A file is written under a temporary name first and then
// renamed over path, so that a failed write never leaves half a bundle (the temporary file is
// removed when the write or the rename fails). Something that exists and is not a file, as
// /dev/null or a pipe, is written in place: renamed over, it would be replaced by a file.
func writeBundle(path string, data []byte) error {
	if st, err := os.Stat(path); err == nil && !st.Mode().IsRegular() {
		return os.WriteFile(path, data, 0o644)
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		os.Remove(tmp)
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return err
	}
	return nil
}

func buildCmd() *cobra.Command {
	var out string
	var embed, verify, quiet, pdl bool
	var gemm, moe string
	var fuse []string
	var tp, vectorSlots, prefetch, gemvCols, gemvUnroll, gemvSplit, gemvWarps, tcRows, attnWarps, attnUnroll, attnPrefetch, attnPrefetchOneRow int
	var attnTC, attnCluster, attnEarlyKV, optionalF32Out bool
	var tcChunks []int
	var copyGemms []string
	var copyGemmSlots int
	var copyGemmNext, gatedCopyWide string
	var copyGemmWide, miPreloadCoherent bool
	var copyGemmRows []int
	var gatedTCRows, gatedCopyRows, ropeCopyRows, kvCacheTokens, miPreloadRegs, miPreloadRegsMultiWave int
	var ropeOneWave, ropeInAttention bool
	c := &cobra.Command{
		Use:   "build MODEL.yaml [APP.yaml...] -o OUT.xmb",
		Short: "Compile specs into a bundle",
		Example: `  xmixc build specs/models/tiny.yaml specs/apps/tiny-steer.yaml -o tiny.xmb
  xmixc build specs/models/llama-3.1-8b.yaml specs/apps/*.yaml -o llama8b.xmb
  xmixc build specs/models/tiny.yaml specs/apps/tiny-steer.yaml --tp 2 -o tiny-tp2.xmb`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if out == "" {
				return fmt.Errorf("no output file: add -o OUT.xmb")
			}
			if st, err := os.Stat(out); err == nil && st.IsDir() {
				return fmt.Errorf("-o %s is a directory: give the bundle's file name, e.g. -o %s", out, filepath.Join(out, "model.xmb"))
			}
			if gemvCols < 1 || gemvCols > codegen.MaxGemvCols {
				return fmt.Errorf("--gemv-cols %d: want 1 to %d columns per warp", gemvCols, codegen.MaxGemvCols)
			}
			if gemvUnroll < 1 || gemvUnroll > codegen.MaxGemvUnroll {
				return fmt.Errorf("--gemv-unroll %d: want 1 to %d chunks per step", gemvUnroll, codegen.MaxGemvUnroll)
			}
			if kvCacheTokens < 0 {
				return fmt.Errorf("--kv-cache-tokens %d: want a count of tokens, or 0 for the spec's serving.kv_cache_tokens", kvCacheTokens)
			}
			if prefetch < 0 {
				return fmt.Errorf("--prefetch %d: want a byte count, or 0 for none", prefetch)
			}
			if vectorSlots < 0 {
				return fmt.Errorf("--vector-slots %d: want a count of requests, or 0 for the spec's serving.vector_slots", vectorSlots)
			}
			if err := codegen.CheckGemvSplit(gemvSplit); err != nil {
				return fmt.Errorf("--gemv-split: %w", err)
			}
			if !cmd.Flags().Changed("gemv-warps") {
				gemvWarps = 0 // the default, or the split's warps where those are more
			} else if err := codegen.CheckGemvWarps(gemvWarps, gemvSplit); err != nil {
				return fmt.Errorf("--gemv-warps: %w", err)
			}
			if err := codegen.CheckTensorCoreRows(tcRows); err != nil {
				return fmt.Errorf("--tensor-core-rows: %w", err)
			}
			if err := codegen.CheckAttnSettings(attnWarps, 0); err != nil {
				return fmt.Errorf("--attn-warps: %w", err)
			}
			if err := codegen.CheckAttnSettings(0, attnUnroll); err != nil {
				return fmt.Errorf("--attn-unroll: %w", err)
			}
			if err := codegen.CheckAttnPrefetch(attnPrefetch, true); err != nil {
				return fmt.Errorf("--attn-prefetch: %w", err)
			}
			if err := codegen.CheckAttnPrefetch(attnPrefetchOneRow, true); err != nil {
				return fmt.Errorf("--attn-prefetch-one-row: %w", err)
			}
			// The early loads are on by default, and left out without --pdl unless asked for.
			if err := codegen.CheckAttnEarlyKV(attnEarlyKV && cmd.Flags().Changed("attn-early-kv"), pdl); err != nil {
				return fmt.Errorf("--attn-early-kv: %w", err)
			}
			switch {
			case gemm == "cuda-core" && cmd.Flags().Changed("tc-chunks"):
				return fmt.Errorf("--tc-chunks sets the tensor-core GEMMs, which --gemm cuda-core does not build; leave it out")
			}
			if err := codegen.CheckTCChunks(tcChunks); err != nil {
				return fmt.Errorf("--tc-chunks %s: %w (e.g. --tc-chunks %d,%d)",
					cmd.Flags().Lookup("tc-chunks").Value, err, codegen.DefaultTCChunks[0], codegen.DefaultTCChunks[1])
			}
			if !cmd.Flags().Changed("copy-gemms") {
				copyGemms = nil // the measured shapes
			} else if _, err := bundle.ParseGemmShapes(copyGemms); err != nil {
				return fmt.Errorf("--copy-gemms: %w", err)
			}
			if err := codegen.CheckCopyGemmSlots(copyGemmSlots); err != nil {
				return fmt.Errorf("--copy-gemm-slots: %w", err)
			}
			if copyGemmNext != "read" && copyGemmNext != "asked" {
				return fmt.Errorf("--copy-gemm-next %q: want read (the grid after a copy-engine kernel launches once the kernel has read its W) or asked (once it has asked for its last stage)", copyGemmNext)
			}
			if err := codegen.CheckCopyGemmRows(copyGemmRows); err != nil {
				return fmt.Errorf("--copy-gemm-rows: %w", err)
			}
			if err := codegen.CheckGatedTCRows(gatedTCRows); err != nil {
				return fmt.Errorf("--gated-tc-rows: %w", err)
			}
			if err := codegen.CheckGatedCopyRows(gatedCopyRows); err != nil {
				return fmt.Errorf("--gated-copy-rows: %w", err)
			}
			if err := codegen.CheckGatedCopyWide(gatedCopyWide); err != nil {
				return fmt.Errorf("--gated-copy-wide: %w", err)
			}
			if err := codegen.CheckRopeCopyRows(ropeCopyRows); err != nil {
				return fmt.Errorf("--rope-copy-rows: %w", err)
			}
			if err := codegen.CheckMIPreloadRegs(miPreloadRegs); err != nil {
				return fmt.Errorf("--mi-preload-regs: %w", err)
			}
			if err := codegen.CheckMIPreloadRegsMultiWave(miPreloadRegsMultiWave); err != nil {
				return fmt.Errorf("--mi-preload-regs-multi-wave: %w", err)
			}
			start := time.Now()
			progress := func(f string, a ...any) {
				if !quiet {
					fmt.Fprintf(os.Stderr, "[%6.2fs] %s\n", time.Since(start).Seconds(), fmt.Sprintf(f, a...))
				}
			}
			b, err := compile.Build(args[0], args[1:], compile.Options{EmbedWeights: embed, Verify: verify, Progress: progress, GEMM: gemm, MoE: moe, TP: tp, VectorSlots: vectorSlots, KVCacheTokens: kvCacheTokens, Fuse: fuse, SerialLaunch: !pdl, Prefetch: noneOption(prefetch), GemvCols: gemvCols, GemvUnroll: gemvUnroll, GemvSplit: gemvSplit, GemvWarps: gemvWarps, TensorCoreRows: tcRows, TCChunks: tcChunks, CopyGemms: copyGemms, CopyGemmSlots: copyGemmSlots, CopyGemmNextAtAsk: copyGemmNext == "asked", CopyGemmWide: copyGemmWide, CopyGemmRows: copyGemmRows, GatedTCRows: noneOption(gatedTCRows), GatedCopyRows: noneOption(gatedCopyRows), GatedCopyWide: gatedCopyWide, MIPreloadCoherent: miPreloadCoherent, MIPreloadRegs: noneOption(miPreloadRegs), MIPreloadRegsMultiWave: noneOption(miPreloadRegsMultiWave), RopeCopyRows: noneOption(ropeCopyRows), RopeWaves: !ropeOneWave, RopeApart: !ropeInAttention, AttnWarps: attnWarps, AttnUnroll: attnUnroll, AttnPrefetch: noneOption(attnPrefetch), AttnPrefetchOneRow: noneOption(attnPrefetchOneRow), AttnCUDACores: !attnTC, AttnCluster: attnCluster, AttnLateKV: !attnEarlyKV, F32OutAlways: !optionalF32Out})
			if err != nil {
				return err
			}
			data, err := bundle.Marshal(b)
			if err != nil {
				return err
			}
			if err := writeBundle(out, data); err != nil {
				return err
			}
			progress("wrote %s (%.1f MB, %d kernels, %d templates)", out, float64(len(data))/1e6, len(b.Kernels), len(b.Templates))
			return nil
		},
	}
	c.Flags().StringVarP(&out, "output", "o", "", "bundle file to write")
	c.Flags().BoolVar(&embed, "embed-weights", false, "copy the weights into the bundle instead of referencing them")
	c.Flags().BoolVar(&verify, "verify-passes", false, "run the IR verifier after every pass")
	c.Flags().BoolVarP(&quiet, "quiet", "q", false, "no progress output")
	c.Flags().StringVar(&gemm, "gemm", "tc", "GEMM kernels from --tensor-core-rows rows: tc, tc-staged or cuda-core (for measuring)")
	c.Flags().IntVar(&tcRows, "tensor-core-rows", codegen.TensorCoreRows, fmt.Sprintf("the decode bucket size from which GEMMs run on tensor cores (cuBLASLt on the GPU), 2 to %d: below it CUDA-core GEMVs keep f32 activations and every bucket computes a row's bits the same, so a batch of fewer rows gives each request exactly what it gets alone; 4 makes steps of 3-4 rows about 20%% shorter on the H200, and their rows then differ from a lone request's in the last bits", codegen.TensorCoreRows))
	c.Flags().StringVar(&moe, "moe", "", "Mixtral experts in buckets from 8 rows: dense (the default: every expert as a tensor-core GEMM, then a weighted sum of each row's top-k), or grouped (expert kernels that read only the chosen experts, on CUDA cores; for measuring)")
	c.Flags().IntVar(&tp, "tp", 1, "tensor-parallel degree: shard the model over N ranks (GPUs, or goroutines on the cpu backend)")
	c.Flags().IntVar(&kvCacheTokens, "kv-cache-tokens", 0, "tokens the KV page pool holds, every resident request together, in place of the spec's serving.kv_cache_tokens (0: the spec's): the same spec on a card with less memory (xmix says how many fit when a bundle does not); whole kv_block_size pages, from max_seq_len to max_seqs x max_seq_len")
	c.Flags().IntVar(&vectorSlots, "vector-slots", 0, "how many requests may hold per_request vectors at once (default: the spec's serving.vector_slots, else max_seqs)")
	fuseFlag(c, &fuse)
	c.Flags().BoolVar(&pdl, "pdl", true, "programmatic dependent launch (Hopper): each generated kernel lets the next one launch at once and waits for the one ahead before touching memory, so the gaps between launches overlap the kernels (same results bit for bit; 1-4% faster decode steps on the H200); --pdl=false builds kernels that run one after another")
	c.Flags().IntVar(&prefetch, "prefetch", compile.DefaultPrefetch, "bytes of each weight row a decode GEMV or a bundle's tensor-core GEMM reads before it waits for the kernel ahead (with --pdl), so that its weights stream in while the small kernels ahead of it run: GEMVs ask L2 for them, tensor-core GEMMs load their first step into registers and ask L2 for the rest; 0: none (same results bit for bit)")
	c.Flags().IntVar(&gemvCols, "gemv-cols", compile.DefaultGemvCols, "columns each warp of a CUDA-core decode GEMV computes in buckets of 2 rows up to --tensor-core-rows (2-7 by default), 1 to 8 (more columns share each x load; same results bit for bit)")
	c.Flags().IntVar(&gemvUnroll, "gemv-unroll", compile.DefaultGemvUnroll, "K chunks each lane of a CUDA-core decode GEMV loads before it uses the first in buckets of 2 rows up to --tensor-core-rows (2-7 by default), 1 to 8 (more bytes in flight per warp; same results bit for bit)")
	c.Flags().IntVar(&gemvSplit, "gemv-split", 1, "the most warps a CUDA-core decode GEMV splits each column's K over, 1, 2, 4 or 8: a weight of few columns (Llama-3.1-8B's q/k/v, o and down) takes the fewest that give it 16384 warps, so the last wave of blocks is a small part of the kernel; the warps' totals add in warp order, so results change in the last bits, the same in every bucket. Off by default: on the H200, 4 made Llama-3.2-1B's steps of 4 rows 10-12% shorter and of 1 row 3-4% longer, Llama-3.1-8B's 1 row 0.8% shorter and 4 rows 3% longer")
	c.Flags().IntVar(&gemvWarps, "gemv-warps", compile.DefaultGemvWarps, "warps per block of the CUDA-core decode GEMVs, 1, 2, 4 or 8, at least --gemv-split (unset: the default, or --gemv-split where that is more): a block streams its warps' columns, so smaller blocks end more evenly at a many-wave GEMV's tail (same results bit for bit)")
	c.Flags().IntSliceVar(&tcChunks, "tc-chunks", codegen.DefaultTCChunks[:], fmt.Sprintf("K chunks (of 32) each K group of a bundle's tensor-core GEMM keeps in flight, in buckets of up to 8 rows and of 9-32 rows, 1 to %d each (the staged kernel of --gemm tc-staged: half as many stages of two chunks; more bytes in flight, more registers; same results bit for bit; for measuring)", codegen.MaxTCChunks))
	c.Flags().StringSliceVar(&copyGemms, "copy-gemms", nil, "the GEMM shapes, each KxN (K inputs, N outputs, e.g. 4096x28672 for Llama-3.1-8B's gate/up), given copy-engine kernels (W and x brought to shared memory by the TMA, W asked for before the kernel ahead ends) for the decode buckets of --copy-gemm-rows, which --gemm auto serves them with instead of cuBLASLt; none: no such kernels (unset: the shapes measured faster in the step, in the buckets where they were: Llama-3.1-8B's o and down in buckets of up to 128 rows and its q/k/v of up to 64 (H200), and Llama-3.2-1B's o, q/k/v and down of up to 32 (H100); for measuring)")
	c.Flags().IntVar(&gatedTCRows, "gated-tc-rows", codegen.DefaultGatedTCRows, fmt.Sprintf("decode buckets on tensor cores of at most this many rows run the gate/up projection and its activation as one kernel of the bundle's (mma.sync, x split into two bf16 halves), not a library's GEMM and the activation kernel, unless a gated copy-engine kernel of the bundle serves the bucket (the 8B's 8 rows: the 32-row bucket's wide one) (0: none; at most %d; the default is the measured one)", codegen.MaxGatedTCRows))
	c.Flags().IntVar(&gatedCopyRows, "gated-copy-rows", codegen.DefaultGatedCopyRows, fmt.Sprintf("decode buckets whose GEMMs warpgroup copy-engine kernels (32 rows and up) of at most this many rows serve also get one for the gate/up GEMM with its activation in its epilogue, which --gemm auto runs in place of the library's GEMM and the activation kernel; from 64 rows in its wide form, each CTA's columns of gate and of up multiplied by every row in one wave (0: none; at most %d; the default is the measured one)", codegen.MaxGatedCopyRows))
	c.Flags().StringVar(&gatedCopyWide, "gated-copy-wide", codegen.GatedWideAuto, fmt.Sprintf("which decode buckets of fewer rows than the smallest wide layout (64) run its gated copy-engine kernel (--gated-copy-rows), over x's rows past theirs zero-filled: auto, where it runs more CTAs than the bucket's own kernel or the bucket has none of its own (Llama-3.1-8B's 32 rows: 128 CTAs against 112; its 16 rows; Llama-3.2-1B's own kernels run 128 and stay), all, or own (each bucket its own layout's kernel or none); one of %v. On an H100 auto made the 8B's 16- and 32-row steps 1.8-3.1%% shorter, and all the 1B's 32-row step 0.7-1.1%% longer than own (testsuite/gpu/RESULTS.md, session 73); the default is the measured one", codegen.GatedWideModes))
	c.Flags().BoolVar(&miPreloadCoherent, "mi-preload-coherent", false, "the add+norm and embedding kernels of templates of 8 rows and more, which load their MI ops' vectors and scalars before they wait for the kernel ahead, do so with coherent loads: ptxas moves most of the read-only loads they use otherwise past that wait; same results bit for bit; for measuring")
	c.Flags().IntVar(&miPreloadRegs, "mi-preload-regs", codegen.DefaultMIPreloadRegs, "those preloading kernels take at most this many registers a thread (ptxas .maxnreg; 0: no bound), so that launched early a block of 1024 threads fits an SM beside the CTA of the GEMM ahead: 48 leaves room for the 8-row copy-engine GEMM's (512 threads at 32), which the 8B's o and down run on 128 of 132 SMs; same results bit for bit; the default is the measured one")
	c.Flags().IntVar(&miPreloadRegsMultiWave, "mi-preload-regs-multi-wave", codegen.DefaultMIPreloadRegsMultiWave, fmt.Sprintf("the same bound in templates of more than %d rows (prefill chunks, the 256-row decode bucket), whose blocks take more than one wave of the SMs: 32 fits two blocks of 1024 threads an SM (0: --mi-preload-regs's bound); same results bit for bit; the default is the measured one", codegen.MIPreloadWaveRows))
	c.Flags().IntVar(&ropeCopyRows, "rope-copy-rows", codegen.DefaultRopeCopyRows, fmt.Sprintf("decode buckets whose GEMMs warpgroup copy-engine kernels (32 rows and up) of at most this many rows serve also get one for the q/k/v GEMM with RoPE and the KV-cache write in its epilogue, which --gemm auto runs in place of the q/k/v GEMM and the rope_kv kernel, in those buckets and in smaller ones; from 64 rows in its wide form, each CTA's pairs multiplied by every row, K split over a cluster (0: none; at most %d; the default is the measured one)", codegen.MaxRopeCopyRows))
	c.Flags().IntSliceVar(&copyGemmRows, "copy-gemm-rows", nil, fmt.Sprintf("the decode row counts given copy-engine kernels, among %v (8 and 16 multiply with mma.sync; from 32 rows with Hopper's warpgroup MMAs over the library cast's bf16 x); a bucket takes the fewest that hold its rows (unset: %v, the ones measured faster in the step and checked against the CPU on the GPU; for measuring)", codegen.CopyGemmLayoutRows(), codegen.CopyGemmDefaultRows()))
	c.Flags().StringVar(&copyGemmNext, "copy-gemm-next", "read", "when the grid after a copy-engine kernel may launch: read (once each CTA has read every stage of its W, the default) or asked (once it has asked for its last stage, a ring's worth of W sooner); same results bit for bit; for measuring")
	c.Flags().BoolVar(&copyGemmWide, "copy-gemm-wide", false, "the copy-engine kernels of 64 and 128 rows in the wide form: x is the warpgroup MMA's A (a warpgroup per 64 rows) and a CTA's columns of W (up to 256) its B, K split over a cluster of up to 4 CTAs whose ranks add each column slice's sums in rank order, so that each CTA reads x once for many columns (the default form: 64 columns a CTA, x read again by each); for measuring")
	c.Flags().IntVar(&copyGemmSlots, "copy-gemm-slots", 0, "the ring slots (stages of W and x in flight) of a copy-engine kernel, 1 to 4 (0: the measured default, 3; never more than fit the shared memory; fewer ask for less before the kernel ahead ends; same results bit for bit; for measuring)")
	c.Flags().IntVar(&attnWarps, "attn-warps", 0, fmt.Sprintf("warps per block of the decode buckets' attention, 1 to %d (0: the default, 8 in buckets of up to 32 rows, 2 where blocks of 4 would take more than one wave of the GPU, 4 between); more warps cover more positions in one pass, so a context needs fewer splits and merges (for measuring)", codegen.MaxAttnWarps))
	c.Flags().IntVar(&attnUnroll, "attn-unroll", 0, fmt.Sprintf("position loads each warp of the decode attention issues before the first is used, 1 to %d (0: the default: 4 at head dim 128 bf16 on CUDA cores, one tile of 16 positions on tensor cores, where it counts tiles); more bytes in flight, more registers (for measuring)", codegen.MaxAttnUnroll))
	c.Flags().IntVar(&attnPrefetch, "attn-prefetch", compile.DefaultAttnPrefetch, fmt.Sprintf("passes of K and V rows each block of the decode attention asks L2 for before it waits for the kernel ahead (with --pdl), 0 (none) to %d: a pass is the positions its warps load in one step each (128 on tensor cores, 64 on CUDA cores at head dim 128 in bf16, 8 warps), so the first loads after the wait find L2 instead of HBM (same results bit for bit)", codegen.MaxAttnPrefetch))
	c.Flags().IntVar(&attnPrefetchOneRow, "attn-prefetch-one-row", compile.DefaultAttnPrefetchOneRow, fmt.Sprintf("the same for the attention of the decode bucket of one row, 0 (none) to %d, where --attn-prefetch asks for fewer (same results bit for bit)", codegen.MaxAttnPrefetch))
	c.Flags().BoolVar(&attnEarlyKV, "attn-early-kv", true, "the decode attention's split kernels on tensor cores (buckets of up to 32 rows on Llama-class shapes), launched early (--pdl), load each warp's first K/V tile before they wait for the kernel ahead, wherever the tile holds no row's newest position (the one the kernel ahead writes), so that a block's first loads overlap that kernel's last stores; same results bit for bit. Measured 0.2-1.0% shorter 8- and 32-row steps (session 64); =false for measuring. Left out with --pdl=false")
	c.Flags().BoolVar(&attnCluster, "attn-cluster", false, "merge a row's context splits of the decode attention in a thread-block cluster (rank 0's shared memory) where a bucket's splits fit in one wave of blocks (on Llama-class shapes the buckets of 4 to 16 rows), instead of through a workspace in global memory with a fence and an atomic ticket. For measuring: on the H200 it made Llama-3.1-8B's 4- and 8-row steps 2-5% longer at contexts 576-2112, and its 16-row step 1.1-1.3% shorter at 2112 but 0.4-1.0% longer at 80-576 (testsuite/gpu/RESULTS.md, session 37)")
	c.Flags().BoolVar(&optionalF32Out, "optional-f32-out", true, "build the add+norm kernels (and the embedding's) and the decode attention kernels so that their f32 output may be left out: where the GEMM after one reads the bf16 copy it writes and no later node reads the f32 (an app's op on the norm's output or on attn.z does), the CUDA backend passes it no f32 output, and the kernel stores bf16 alone. Same results bit for bit; on the H200 Llama-3.1-8B's steps 0.04-0.97% shorter at 8-128 rows (testsuite/gpu/RESULTS.md, session 59). --optional-f32-out=false writes the f32 always, as bundles before it did")
	c.Flags().BoolVar(&ropeOneWave, "rope-one-wave", true, "where a template's rope_kv kernel (one block a row's 16 heads at head dim 128) would take more than one wave of the card's blocks (Llama-3.1-8B from 128 rows, where --rope-in-attention leaves none), share each row's heads among fewer blocks, every thread rotating more heads one after another; same results bit for bit. Measured 0.19-0.46% shorter 128- and 256-row steps of the 8B with rope_kv apart (session 92); =false for measuring")
	c.Flags().BoolVar(&ropeInAttention, "rope-in-attention", true, "in decode buckets whose attention runs one block a row on tensor cores (Llama-class shapes from 128 rows), leave the q/k/v rotation and the KV-cache write to the attention kernel, which rotates q in registers and writes its kv head's newest k and v itself, in place of the rope_kv kernel and its launch; same results bit for bit. Measured 0.66-1.03% shorter 128- and 256-row steps of Llama-3.1-8B and 0.70-0.74% of Llama-3.2-1B's 128-row step (session 92); =false for measuring")
	c.Flags().BoolVar(&attnTC, "attn-tc", true, "run the decode attention's warp step on tensor cores where the layer allows it (bf16 cache, head dim 64 or 128, KV blocks a multiple of 16, no sliding window; other layers keep the CUDA-core step). Q and the softmax weights are rounded to bf16 for the mma, within bf16 rounding of the CUDA-core step's results, the same in every bucket. --attn-tc=false builds the CUDA-core step everywhere, as bundles before it had (for measuring)")
	return c
}

// noneOption maps a flag whose 0 means none (--prefetch, --attn-prefetch, --gated-tc-rows) to
// its compile.Options field, whose 0 means the default and a negative value none.
func noneOption(n int) int {
	if n == 0 {
		return -1
	}
	return n
}

// fuseFlag declares --fuse, the decode-kernel fusions (passes.Fusions).
func fuseFlag(c *cobra.Command, fuse *[]string) {
	var what []string
	for _, f := range passes.Fusions {
		what = append(what, f.Name+": "+f.What)
	}
	c.Flags().StringSliceVar(fuse, "fuse", nil, "decode-kernel fusions to apply, all, or none (default "+strings.Join(passes.DefaultFusions, ",")+", the one measured to pay on the H200; layers whose MI ops sit between the kernels keep them apart): "+strings.Join(what, "; "))
}

func checkCmd() *cobra.Command {
	var trace, dumpIR bool
	var dumpAfter string
	var fuse []string
	var tp int
	c := &cobra.Command{
		Use:   "check MODEL.yaml [APP.yaml...]",
		Short: "Validate specs and print the resolved plan (which MI op is fused into which kernel), or the IR",
		Long: `check runs the compiler's passes (with the verifiers after each) without generating
code, and prints where each MI op runs. --dump-ir prints the forward as the passes leave it
(the graph of nodes, values and MI ops codegen lowers), --dump-after PASS as it stands after
one pass; the passes are: ` + strings.Join(passes.PassNames(), ", ") + ".",
		Example: `  xmixc check specs/models/tiny.yaml specs/apps/tiny-steer.yaml
  xmixc check specs/models/tiny.yaml --dump-ir
  xmixc check specs/models/tiny.yaml specs/apps/tiny-steer.yaml --dump-after attach-mi`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if dumpAfter != "" && !slices.Contains(passes.PassNames(), dumpAfter) {
				return fmt.Errorf("--dump-after %s: no such pass (passes: %s)", dumpAfter, strings.Join(passes.PassNames(), ", "))
			}
			out := cmd.OutOrStdout()
			opt := compile.Options{Verify: true, TP: tp, Fuse: fuse}
			opt.Trace = func(pass string, p *passes.Program) {
				if trace {
					fmt.Fprintf(out, "after %s: %d op site(s)\n", pass, len(p.Ops))
				}
				if pass == dumpAfter {
					fmt.Fprintf(out, "after %s:\n%s", pass, p.Graph)
				}
			}
			p, err := compile.Plan(args[0], args[1:], opt)
			if err != nil {
				return err
			}
			if dumpIR {
				fmt.Fprint(out, p.Graph)
				return nil
			}
			if dumpAfter == "" {
				printPlan(out, p)
			}
			return nil
		},
	}
	c.Flags().BoolVar(&trace, "trace", false, "print a line after each pass")
	c.Flags().BoolVar(&dumpIR, "dump-ir", false, "print the IR (the forward graph) after the last pass instead of the plan")
	c.Flags().StringVar(&dumpAfter, "dump-after", "", "print the IR after pass `PASS` instead of the plan")
	c.Flags().IntVar(&tp, "tp", 1, "check the plan for this tensor-parallel degree")
	fuseFlag(c, &fuse)
	return c
}

func printPlan(w io.Writer, p *passes.Program) {
	m := p.Model
	fmt.Fprintf(w, "model %s (%s): %d layers, hidden %d, %d heads (%d kv), vocab %d\n",
		m.Name, m.Family, m.Layers, m.Hidden, m.Heads, m.KVHeads, m.Vocab)
	for _, a := range p.Apps {
		fmt.Fprintf(w, "app %s: bit %d, %d scalar(s), %d vector(s), %d buffer(s)\n", a.Name, a.Bit, len(a.Scalars), len(a.Vectors), len(a.Exports))
	}
	if len(p.Ops) == 0 {
		fmt.Fprintln(w, "no MI ops: the bundle runs the bare model")
	} else {
		fmt.Fprintln(w, "ops at one hook run in the #order shown: apps in build-line order, then each app's ops in spec order")
		fmt.Fprintln(w, "(a read before a write at the same hook sees the value before it); custom kernels and logit lenses last")
	}
	order := p.HookOrder()
	for i, op := range p.Ops {
		where := "whole model"
		if op.Layer >= 0 {
			where = fmt.Sprintf("layer %d", op.Layer)
		}
		host := map[string]string{
			passes.HostEmbed: "fused into the embedding + norm kernel", passes.HostAddNorm: "fused into the residual-add + RMSNorm kernel",
			passes.HostSilu: "fused into the SiLU*up kernel", passes.HostMI: "standalone MI kernel",
			passes.HostRouter: "fused into the MoE router kernel", passes.HostCustom: "the app's own kernel, after the add+norm kernel",
			passes.HostLens: "heavy: own nodes, skipped when no row enables the app", passes.HostLogits: "MI kernel over the logits",
			passes.HostSampler: "fused into the sampler",
		}[op.Host]
		extra := ""
		if len(op.Gates) > 0 {
			var gs []string
			for _, g := range op.Gates {
				gs = append(gs, g.Kind)
			}
			extra = " when " + strings.Join(gs, " and ")
		}
		fmt.Fprintf(w, "  %-10s %-12s #%-2d %-11s %s.op%d -> %s (%s)%s\n", where, op.Hook, order[i], op.Template, op.App.Name, op.OpIndex, host, op.Role, extra)
	}
}

func inspectCmd() *cobra.Command {
	var ptxName string
	var asJSON bool
	c := &cobra.Command{
		Use:   "inspect BUNDLE.xmb",
		Short: "List a bundle's manifest, apps, kernels and templates (--ptx NAME prints one kernel)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			b, err := bundle.ReadFile(args[0])
			if err != nil {
				return err
			}
			if ptxName != "" {
				return printPTX(cmd.OutOrStdout(), b, ptxName)
			}
			if asJSON {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(b.Manifest)
			}
			printBundle(cmd.OutOrStdout(), b)
			return nil
		},
	}
	c.Flags().StringVar(&ptxName, "ptx", "", "print the PTX of this kernel")
	c.Flags().BoolVar(&asJSON, "json", false, "print the manifest as JSON")
	return c
}

func printPTX(w io.Writer, b *bundle.Bundle, name string) error {
	var names []string
	for _, k := range b.Kernels {
		if k.Name == name {
			fmt.Fprint(w, k.PTX)
			return nil
		}
		names = append(names, k.Name)
	}
	sort.Strings(names)
	return fmt.Errorf("no kernel %q in the bundle (kernels: %s)", name, strings.Join(names, ", "))
}

func printBundle(w io.Writer, b *bundle.Bundle) {
	m := b.Manifest.Model
	fmt.Fprintf(w, "model     %s (%s) layers=%d hidden=%d inter=%d heads=%d/%d head_dim=%d vocab=%d weights=%s kv=%s\n",
		m.Name, m.Family, m.Layers, m.Hidden, m.Intermediate, m.Heads, m.KVHeads, m.HeadDim, m.Vocab, m.WeightDtype, m.KVDtype)
	fmt.Fprintf(w, "serving   max_seq_len=%d max_seqs=%d kv_pages=%d x %d tokens\n", m.MaxSeqLen, m.MaxSeqs, m.KVBlocks, m.KVBlockSize)
	if tp := b.Manifest.TP; tp > 1 {
		fmt.Fprintf(w, "tp        %d ranks (weights sharded Megatron-style; the node counts below are per rank)\n", tp)
	}
	wr := b.Manifest.Weights
	switch {
	case len(b.Weights) > 0:
		fmt.Fprintf(w, "weights   embedded (%.1f MB)\n", float64(len(b.Weights))/1e6)
	case wr.Synthetic != nil:
		fmt.Fprintf(w, "weights   synthetic seed=%d std=%g\n", wr.Synthetic.Seed, wr.Synthetic.Std)
	default:
		fmt.Fprintf(w, "weights   %s (digest %s)\n", wr.Path, wr.SHA256)
	}
	fmt.Fprintf(w, "build     %s\n", b.Manifest.Build.Compiler)
	if f := b.Manifest.Build.Fuse; len(f) > 0 {
		fmt.Fprintf(w, "          fused: %s\n", strings.Join(f, ", "))
	}
	if bi := b.Manifest.Build; bi.AttnWarps > 0 || bi.AttnUnroll > 0 {
		fmt.Fprintf(w, "          decode attention: %s warps a block, %s loads a step\n", orDefault(bi.AttnWarps), orDefault(bi.AttnUnroll))
	}
	if !b.Manifest.Build.AttnTC {
		fmt.Fprintf(w, "          decode attention on CUDA cores\n")
	}
	if b.Manifest.Build.AttnCluster {
		fmt.Fprintf(w, "          decode attention splits merged in thread-block clusters where they fit one wave\n")
	}
	if bi := b.Manifest.Build; bi.PDL && !bi.AttnEarlyKV {
		fmt.Fprintf(w, "          decode attention loads K/V only after the wait for the kernel ahead (--attn-early-kv=false)\n")
	}
	if !b.Manifest.Build.RopeInAttention {
		fmt.Fprintf(w, "          rope_kv a kernel of its own where the attention could take it (--rope-in-attention=false)\n")
	}
	if !b.Manifest.Build.RopeOneWave {
		fmt.Fprintf(w, "          rope_kv grids of more than one wave of blocks (--rope-one-wave=false)\n")
	}
	if !b.Manifest.Build.OptionalF32Out {
		fmt.Fprintf(w, "          add+norm and decode attention write their f32 outputs always (--optional-f32-out=false)\n")
	}
	if bi := b.Manifest.Build; bi.PDL && bi.AttnPrefetchOneRow != compile.DefaultAttnPrefetchOneRow {
		fmt.Fprintf(w, "          decode attention at one row: %d passes of K and V asked of L2 before the wait\n", bi.AttnPrefetchOneRow)
	}
	if n := b.Manifest.Build.AttnPrefetch; n > 0 {
		fmt.Fprintf(w, "          decode attention: %d passes of K and V asked of L2 before the wait\n", n)
	}
	if s := b.Manifest.Build.GemvSplit; s > 1 {
		fmt.Fprintf(w, "          GEMVs of few columns split each column over up to %d warps\n", s)
	}
	if n := b.Manifest.Build.GatedTCRows; n > 0 {
		fmt.Fprintf(w, "          gate/up and its activation in one tensor-core kernel at up to %d rows, where no gated copy-engine kernel serves the bucket\n", n)
	}
	// carried notes where the bundle has no copy-engine kernel whose epilogue is one of acts.
	carried := func(what string, acts ...string) string {
		kernels, _ := bundle.GemmCopyKernels(b.Kernels) // checked when the bundle was read
		for shape := range kernels {
			if slices.Contains(acts, shape.Act) {
				return ""
			}
		}
		return " (none carried: no such bucket's " + what + " takes one)"
	}
	if n := b.Manifest.Build.GatedCopyRows; n > 0 {
		fmt.Fprintf(w, "          gate/up and its activation in one warpgroup copy-engine kernel at up to %d rows%s\n", n, carried("gate/up", bundle.GatedActOps...))
		switch b.Manifest.Build.GatedCopyWide {
		case codegen.GatedWideAuto:
			fmt.Fprintf(w, "          buckets below its smallest wide layout run that layout's where it runs more CTAs than their own\n")
		case codegen.GatedWideAll:
			fmt.Fprintf(w, "          buckets below its smallest wide layout run that layout's\n")
		}
	}
	if b.Manifest.Build.MIPreloadCoherent {
		fmt.Fprintf(w, "          MI vectors and scalars preloaded with coherent loads (kernels *_pvc)\n")
	}
	if n := b.Manifest.Build.MIPreloadRegs; n > 0 {
		fmt.Fprintf(w, "          row kernels that preload MI vectors and scalars take at most %d registers a thread (kernels *_nr%d)\n", n, n)
	}
	if n := b.Manifest.Build.MIPreloadRegsMultiWave; n > 0 {
		fmt.Fprintf(w, "          in templates of more than %d rows at most %d (kernels *_nr%d)\n", codegen.MIPreloadWaveRows, n, n)
	}
	if n := b.Manifest.Build.RopeCopyRows; n > 0 {
		fmt.Fprintf(w, "          q/k/v with RoPE and the KV write in one warpgroup copy-engine kernel at up to %d rows%s\n", n, carried("q/k/v", bundle.OpRopeKV))
	}
	if c := b.Manifest.Build.TCChunks; len(c) > 0 {
		fmt.Fprintf(w, "          tensor-core GEMMs: %d / %d K chunks in flight at up to 8 / 9-32 rows\n", c[0], c[1])
	}
	if bi := b.Manifest.Build; len(bi.CopyGemms) > 0 || bi.CopyGemmSlots > 0 || len(bi.CopyGemmRows) > 0 || bi.CopyGemmNextAtAsk || bi.CopyGemmWide {
		shapes, slots := "the measured shapes", "slots: the default"
		if len(bi.CopyGemms) > 0 {
			shapes = strings.Join(bi.CopyGemms, ", ")
		}
		if bi.CopyGemmSlots > 0 {
			slots = fmt.Sprintf("slots: %d", bi.CopyGemmSlots)
		}
		if len(bi.CopyGemmRows) > 0 {
			slots += fmt.Sprintf(", rows: %v", bi.CopyGemmRows)
		}
		if bi.CopyGemmNextAtAsk {
			slots += ", the next kernel launched once the last stage is asked for"
		}
		if bi.CopyGemmWide {
			slots += ", the wide form at 64 and 128 rows"
		}
		fmt.Fprintf(w, "          copy-engine GEMMs: %s, %s\n", shapes, slots)
	}
	bi := b.Manifest.Build
	gemvs := fmt.Sprintf("GEMVs in blocks of %d warps", codegen.GemvWarpsOf(bi.GemvWarps))
	switch tc := cmp.Or(bi.TensorCoreRows, codegen.TensorCoreRows); tc {
	case 2:
		gemvs += ", tensor cores from 2 rows"
	default:
		gemvs += fmt.Sprintf(", at 2-%d rows %d columns per warp and the K loop unrolled %dx", tc-1, max(1, bi.GemvCols), max(1, bi.GemvUnroll))
		if tc != codegen.TensorCoreRows {
			gemvs += fmt.Sprintf(", tensor cores from %d rows", tc)
		}
	}
	if bi.PDL {
		fmt.Fprintf(w, "          early launch; GEMVs and tensor-core GEMMs prefetch %d bytes of each weight row; %s\n", bi.Prefetch, gemvs)
	} else {
		fmt.Fprintf(w, "          kernels launched one after another (--pdl=false); %s\n", gemvs)
	}
	for _, in := range b.Manifest.Build.Inputs {
		fmt.Fprintf(w, "          %s sha256=%s\n", in.Path, in.SHA256[:16])
	}
	fmt.Fprintf(w, "apps      %d\n", len(b.Manifest.Apps))
	for _, a := range b.Manifest.Apps {
		fmt.Fprintf(w, "  bit %-2d %s (%s)\n", a.Bit, a.Name, a.Source)
		for _, s := range a.Scalars {
			fmt.Fprintf(w, "          scalar %s.%s = %g (override with --set %s.%s=V)\n", a.Name, s.Name, s.Value, a.Name, s.Name)
		}
		for _, v := range a.Vectors {
			unit := ""
			if v.Unit {
				unit = ", unit length"
			}
			perRequest := ""
			if v.Slots != "" {
				perRequest = fmt.Sprintf("; per request: %s.%s, %d slots", a.Name, v.Param, m.VectorSlots)
			}
			fmt.Fprintf(w, "          vector %s [%d]%s (replaceable at run time%s)\n", v.Param, v.Width, unit, perRequest)
		}
		for _, l := range a.Latches {
			fmt.Fprintf(w, "          after_token latch bit %d: tokens %v\n", l.Bit, l.Tokens)
		}
		for _, l := range a.LayerMasks {
			fmt.Fprintf(w, "          op%d layers %v (a request may narrow them: layers %s.op%d)\n", l.Op, l.Layers, a.Name, l.Op)
		}
		for _, x := range a.Exports {
			fmt.Fprintf(w, "          export %s (%d per token)\n", x.Name, x.Width)
		}
	}
	for _, s := range b.Manifest.Sites {
		fused := "fused"
		if !s.Fused {
			fused = "own kernel"
		}
		fmt.Fprintf(w, "  site layer %-3d %-11s %-12s %-10s -> %s (%s)\n", s.Layer, s.Hook, s.What, s.App, s.Kernel, fused)
	}
	fmt.Fprintf(w, "kernels   %d\n", len(b.Kernels))
	for _, k := range b.Kernels {
		fmt.Fprintf(w, "  %-36s op=%-10s params=%d ptx=%d lines\n", k.Name, k.Op, len(k.Params), strings.Count(k.PTX, "\n"))
	}
	fmt.Fprintf(w, "templates %d\n", len(b.Templates))
	for _, t := range b.Templates {
		plain := ""
		if len(t.Plain) > 0 {
			plain = fmt.Sprintf(" (without apps: %d)", len(t.Plain))
		}
		if len(t.Solo) > 0 {
			plain += fmt.Sprintf(" (each app alone: %d lists)", len(t.Solo))
		}
		fmt.Fprintf(w, "  %-14s %-7s tokens=%-4d samples=%-4d nodes=%d%s\n", t.Name, t.Kind, t.Tokens, t.Samples, len(t.Nodes), plain)
	}
}

func ptxCmd() *cobra.Command {
	var dir string
	c := &cobra.Command{
		Use:   "ptx BUNDLE.xmb -d DIR",
		Short: "Write every kernel of a bundle as DIR/NAME.ptx (for ptxas or cuobjdump)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			b, err := bundle.ReadFile(args[0])
			if err != nil {
				return err
			}
			if err := os.MkdirAll(dir, 0o755); err != nil {
				return err
			}
			for _, k := range b.Kernels {
				if err := os.WriteFile(dir+"/"+k.Name+".ptx", []byte(k.PTX), 0o644); err != nil {
					return err
				}
			}
			fmt.Fprintf(os.Stderr, "wrote %d kernels to %s\n", len(b.Kernels), dir)
			return nil
		},
	}
	c.Flags().StringVarP(&dir, "dir", "d", "ptx", "directory to write the kernels to")
	return c
}

// orDefault prints a build count, 0 as "default".
func orDefault(n int) string {
	if n == 0 {
		return "default"
	}
	return strconv.Itoa(n)
}
