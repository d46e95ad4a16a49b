// Package compile is the compiler's pipeline: specs -> frontend -> passes -> codegen ->
// bundle, checked against the checkpoint it names. xmixc builds with it, and xmix with the
// default model. Each stage's error is wrapped with the stage's name.
package compile

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"xmix/bundle"
	"xmix/chat"
	"xmix/checkpoint"
	"xmix/codegen"
	"xmix/frontend"
	"xmix/input"
	"xmix/passes"
	"xmix/safetensors"
	"xmix/tokenizer"
)

// Compiler names the toolchain version recorded in bundles.
const Compiler = "xmixc 0.1"

// Options control a build.
type Options struct {
	EmbedWeights bool
	Verify       bool                          // run the verifier after every pass
	Progress     func(format string, a ...any) // may be nil
	Trace        func(pass string, p *passes.Program)
	GEMM         string // codegen.Options.GEMM
	MoE          string // codegen.Options.MoE
	// TP is the tensor-parallel degree: N > 1 shards the model over N ranks (bundle.Manifest.TP).
	TP int
	// VectorSlots, when > 0, replaces the model spec's serving.vector_slots.
	VectorSlots int
	// Fuse names the decode-kernel fusions to apply (passes.Fusions, "all" or "none"; nil:
	// passes.DefaultFusions).
	Fuse []string
	// SerialLaunch builds kernels that run strictly one after another: without it (the
	// default) they are built for programmatic dependent launch (bundle.BuildInfo.PDL).
	SerialLaunch bool
	// Prefetch is how many bytes of each weight row a decode GEMV or a tensor-core GEMM built
	// for early launch asks L2 for before it waits for the kernel ahead
	// (bundle.BuildInfo.Prefetch): 0 takes DefaultPrefetch, a negative value none.
	Prefetch int
	// GemvCols is how many columns a warp of a CUDA-core GEMV computes in buckets of 2-7 rows
	// (bundle.BuildInfo.GemvCols; 0: DefaultGemvCols).
	GemvCols int
	// GemvUnroll is how many K chunks a lane of a CUDA-core GEMV of a bucket of 2-7 rows
	// loads before it uses the first (bundle.BuildInfo.GemvUnroll; 0: DefaultGemvUnroll).
	GemvUnroll int
	// AttnWarps and AttnUnroll are the decode attention's warps per block and loads per warp
	// step (bundle.BuildInfo.AttnWarps, AttnUnroll; 0: the defaults).
	AttnWarps, AttnUnroll int
	// AttnPrefetch is how many passes of K and V rows each block of a decode attention built
	// for early launch asks L2 for before it waits (bundle.BuildInfo.AttnPrefetch): 0 takes
	// DefaultAttnPrefetch, a negative value none.
	AttnPrefetch int
	// AttnPrefetchOneRow is the same for the decode bucket of one row
	// (bundle.BuildInfo.AttnPrefetchOneRow): 0 takes DefaultAttnPrefetchOneRow, a negative
	// value none; where AttnPrefetch asks for more, that.
	AttnPrefetchOneRow int
	// AttnCUDACores keeps the decode attention's warp step on CUDA cores, the kernels before
	// the tensor-core step became the default (bundle.BuildInfo.AttnTC false; xmixc build
	// --attn-tc=false): for measuring, and for rebuilding older bundles.
	AttnCUDACores bool
	// AttnCluster merges a decode bucket's attention splits in a thread-block cluster where
	// they fit in one wave (bundle.BuildInfo.AttnCluster; xmixc build --attn-cluster): for
	// measuring, off by default (session 37 measured it slower at 4 and 8 rows).
	AttnCluster bool
	// KVCacheTokens, when not 0, is the KV page pool's size in tokens in place of the model
	// spec's serving.kv_cache_tokens (xmixc build --kv-cache-tokens), checked as that key is.
	KVCacheTokens int
	// AttnLateKV keeps the split decode attention kernels on tensor cores from loading their
	// warps' first K/V tiles before the wait where no row's newest position is in them
	// (bundle.BuildInfo.AttnEarlyKV; xmixc build --attn-early-kv=false): for measuring. The
	// early loads are the default since session 64 (0.2-1.0% shorter 8- and 32-row steps on
	// an H100, testsuite/gpu/RESULTS.md) and need kernels launched early, so SerialLaunch
	// leaves them out too.
	AttnLateKV bool
	// F32OutAlways builds the add+norm and decode attention kernels to write their f32
	// output always (xmixc build --optional-f32-out=false). By default it may be dropped where
	// the GEMM after them reads their bf16 copy and no later node reads the f32
	// (bundle.BuildInfo.OptionalF32Out): on the H200 that made Llama-3.1-8B's steps 0.04-0.97%
	// shorter at 8-128 rows and contexts 576-2112 (testsuite/gpu/RESULTS.md, session 59).
	F32OutAlways bool
	// GemvSplit is the most warps a CUDA-core GEMV splits each column's K over
	// (bundle.BuildInfo.GemvSplit; 0: one).
	GemvSplit int
	// GemvWarps is the warps of a CUDA-core GEMV's block (bundle.BuildInfo.GemvWarps; 0:
	// DefaultGemvWarps, or GemvSplit where that is more: a block holds a column's warps).
	GemvWarps int
	// TensorCoreRows is the decode bucket size from which GEMMs run on tensor cores
	// (bundle.BuildInfo.TensorCoreRows; 0: codegen.TensorCoreRows).
	TensorCoreRows int
	// TCChunks are the K chunks in flight of the tensor-core GEMMs of buckets of up to 8 and
	// of 9-32 rows (bundle.BuildInfo.TCChunks; nil: codegen.DefaultTCChunks, recorded as nil).
	TCChunks []int
	// CopyGemms are the GEMM shapes ("KxN", or "none" alone) given copy-engine kernels
	// (bundle.BuildInfo.CopyGemms; nil: the measured ones), CopyGemmSlots the slots of
	// their rings (0: the measured default).
	CopyGemms     []string
	CopyGemmSlots int
	// CopyGemmNextAtAsk: the copy-engine kernels let the grid after them launch once each CTA
	// has asked for its last stage of W (bundle.BuildInfo.CopyGemmNextAtAsk).
	CopyGemmNextAtAsk bool
	// CopyGemmWide: the plain copy-engine kernels of 64 and 128 rows take the wide form
	// (bundle.BuildInfo.CopyGemmWide).
	CopyGemmWide bool
	// CopyGemmRows are the decode row counts given copy-engine kernels
	// (bundle.BuildInfo.CopyGemmRows; nil: the measured ones).
	CopyGemmRows []int
	// GatedTCRows: tensor-core buckets of at most this many rows run the gate/up projection
	// and its activation as one kernel (bundle.BuildInfo.GatedTCRows; 0: the measured
	// default, codegen.DefaultGatedTCRows; negative: none).
	GatedTCRows int
	// GatedCopyRows: decode buckets of at most this many rows served by the warpgroup
	// copy-engine kernels get one for the gate/up GEMM and its activation together
	// (bundle.BuildInfo.GatedCopyRows; 0: the measured default, codegen.DefaultGatedCopyRows;
	// negative: none).
	GatedCopyRows int
	// GatedCopyWide: which buckets run a wider layout's gated copy-engine kernel
	// (bundle.BuildInfo.GatedCopyWide; "": the measured default, codegen.GatedWideAuto).
	GatedCopyWide string
	// MIPreloadCoherent: the row kernels preload their MI ops' vectors and scalars with
	// coherent loads (bundle.BuildInfo.MIPreloadCoherent).
	MIPreloadCoherent bool
	// MIPreloadRegs: those row kernels' bound on a thread's registers
	// (bundle.BuildInfo.MIPreloadRegs; 0: the measured default, codegen.DefaultMIPreloadRegs;
	// negative: none).
	MIPreloadRegs int
	// MIPreloadRegsMultiWave: the bound in templates of more rows than one wave holds
	// (bundle.BuildInfo.MIPreloadRegsMultiWave; 0: the measured default,
	// codegen.DefaultMIPreloadRegsMultiWave; negative: MIPreloadRegs's).
	MIPreloadRegsMultiWave int
	// RopeCopyRows: decode buckets of at most this many rows served by the warpgroup
	// copy-engine kernels get one for the q/k/v GEMM and its rope_kv together
	// (bundle.BuildInfo.RopeCopyRows; 0: the measured default, codegen.DefaultRopeCopyRows;
	// negative: none).
	RopeCopyRows int
	// RopeApart keeps rope_kv a kernel of its own in the decode buckets whose attention could
	// do its work (bundle.BuildInfo.RopeInAttention false; xmixc build
	// --rope-in-attention=false): for measuring. The rotation in the attention is the default
	// since session 92: on an H100, Llama-3.1-8B's 128- and 256-row steps 0.66-1.03% shorter
	// and Llama-3.2-1B's 128-row step 0.70-0.74%, the same bits (testsuite/gpu/RESULTS.md).
	RopeApart bool
	// RopeWaves lets a rope_kv grid take more than one wave of blocks where fewer blocks a
	// row would fit one (bundle.BuildInfo.RopeOneWave false; xmixc build
	// --rope-one-wave=false): for measuring. One wave is the default since session 92: the
	// 8B's 128- and 256-row steps with rope_kv apart 0.19-0.46% shorter on an H100.
	RopeWaves bool
}

// DefaultGemvCols is Options.GemvCols's default, measured on the H200 (testsuite/gpu/GEMV_AB.md,
// session 8 call 3): two columns per warp shorten the decode step of Llama-3.1-8B by 11% at
// batch 2 and 34% at batch 4, of Llama-3.2-1B by 1% and 22%; four or eight are slower at
// batch 2 (fewer warps stream the weights) and within 2% of two at batch 4.
const DefaultGemvCols = 2

// DefaultGemvUnroll is Options.GemvUnroll's default, measured on the H200 (GEMV_AB.md, session
// 8 call 5): four chunks a step shorten the decode step of Llama-3.1-8B by 7.3% at batch 2 and
// 3.4% at batch 4, of Llama-3.2-1B by 12% and 4%. At batch 1 unrolling does not pay (two
// chunks: +9% on the 8B; four: -0.5% on the 8B, +0.9% on the 1B), so it applies to buckets of
// 2-7 rows only.
const DefaultGemvUnroll = 4

// DefaultGemvWarps is Options.GemvWarps's default, measured on the H200 (testsuite/gpu/RESULTS.md,
// session 19): a block streams its warps' columns, so at the end of a many-wave GEMV the
// SMs whose last blocks end first idle for up to a block's time. Two-warp blocks shorten the
// batch-1 step by 1.0-1.1% on Llama-3.1-8B and 1.8% on Llama-3.2-1B, and they make the
// gate-act fusion pay (its warps stream two columns each, so its eight-warp blocks took
// twice as long). One warp a block: the same as two on the 8B, 11% slower than eight on
// the 1B.
const DefaultGemvWarps = 2

// DefaultPrefetch is Options.Prefetch's default, measured on the H200 (GEMV_AB.md, session 8
// calls 2 and 3): 512 bytes per weight row shorten the batch-1 step by 1.1% on Llama-3.1-8B
// and 1.9% on Llama-3.2-1B (1024: 0.7% and 2.3%); from 2048 bytes on the step gets longer
// (+5% at 4096, +14% at 16384 on the 8B: the prefetches crowd out the weights the kernel
// ahead is still streaming, we think).
const DefaultPrefetch = 512

// DefaultAttnPrefetch is Options.AttnPrefetch's default: none. On the H200 (RESULTS.md,
// session 18 call 2) one or two passes shortened steps by at most 0.5% at contexts of 80 and
// made them up to 0.9% longer at batch 8 with contexts of 2112.
const DefaultAttnPrefetch = 0

// DefaultAttnPrefetchOneRow is Options.AttnPrefetchOneRow's default: one pass. With the
// attention on tensor cores a pass is 128 positions, a context of 80 all of it. On the H200
// (RESULTS.md, session 22 call 5) it shortened the batch-1 step of Llama-3.2-1B by 0.8% at
// contexts of 80 and 0.4% at 2112, of Llama-3.1-8B by 0.3% at 80 (+0.3% at 2112); two passes
// gained less. Only the one-row bucket takes it: at batch 8 the CUDA-core step's prefetch
// lengthened steps at long contexts (session 18).
const DefaultAttnPrefetchOneRow = 1

// earlyReads is what a kernel built for early launch reads before its wait, as built: the
// option n, def where n is 0, none where n is negative or the kernels run one after another
// (serial: they have nothing to overlap).
func earlyReads(n, def int, serial bool) int {
	n = cmp.Or(n, def)
	if n < 0 || serial {
		return 0
	}
	return n
}

// Frontend parses the model and app specs.
func Frontend(modelPath string, appPaths []string) (*frontend.Model, []*frontend.App, error) {
	m, err := frontend.LoadModel(modelPath)
	if err != nil {
		return nil, nil, err
	}
	var apps []*frontend.App
	for _, p := range appPaths {
		a, err := frontend.LoadApp(p, m)
		if err != nil {
			return nil, nil, err
		}
		apps = append(apps, a)
	}
	return m, apps, nil
}

// Plan parses the specs and runs the passes.
func Plan(modelPath string, appPaths []string, opt Options) (*passes.Program, error) {
	m, apps, err := Frontend(modelPath, appPaths)
	if err != nil {
		return nil, err
	}
	if opt.KVCacheTokens != 0 {
		if err := m.SetKVCacheTokens(opt.KVCacheTokens); err != nil {
			return nil, fmt.Errorf("%s: %w", modelPath, err)
		}
	}
	return passes.Run(m, apps, passes.Options{Verify: opt.Verify, Trace: opt.Trace, TP: opt.TP, VectorSlots: opt.VectorSlots, Fuse: opt.Fuse})
}

// Build compiles the specs into a bundle.
func Build(modelPath string, appPaths []string, opt Options) (*bundle.Bundle, error) {
	progress := opt.Progress
	if progress == nil {
		progress = func(string, ...any) {}
	}
	progress("frontend: %s + %d app(s)", modelPath, len(appPaths))
	p, err := Plan(modelPath, appPaths, opt)
	if err != nil {
		return nil, err
	}
	progress("passes: %d MI op site(s) planned", len(p.Ops))
	m := p.Model
	var inputs []bundle.InputDigest
	for _, path := range append([]string{modelPath}, appPaths...) {
		d, err := fileDigest(path)
		if err != nil {
			return nil, err
		}
		inputs = append(inputs, bundle.InputDigest{Path: filepath.Base(path), SHA256: d})
	}
	var weights bundle.WeightsRef
	var embedded []byte
	switch {
	case m.Weights.Synthetic:
		weights.Synthetic = &bundle.Synth{Seed: m.Weights.Seed, Std: m.Weights.Std}
	case opt.EmbedWeights:
		files, err := checkpoint.Files(m.Weights.Path)
		if err != nil {
			return nil, err
		}
		if len(files) != 1 {
			return nil, fmt.Errorf("weights: only a single safetensors file can be embedded, %s has %d", m.Weights.Path, len(files))
		}
		if embedded, err = input.Read(files[0], input.Weights); err != nil {
			return nil, fmt.Errorf("weights: %w", err)
		}
	default:
		d, err := checkpoint.Digest(m.Weights.Path)
		if err != nil {
			return nil, err
		}
		weights.Path, weights.SHA256 = m.Weights.Path, d
	}
	var tok []byte
	var parsed *tokenizer.Tokenizer
	var cfg *chat.Config
	if m.Tokenizer.Kind == "hf" {
		if tok, err = input.Read(m.Tokenizer.Path, input.Tokenizer); err != nil {
			return nil, fmt.Errorf("tokenizer: %w", err)
		}
		if parsed, err = tokenizer.Parse(tok); err != nil {
			return nil, fmt.Errorf("tokenizer %s: %w", m.Tokenizer.Path, err)
		}
		// A checkpoint's chat template and BOS setting sit beside its tokenizer.json.
		cfgPath := filepath.Join(filepath.Dir(m.Tokenizer.Path), "tokenizer_config.json")
		if _, err := os.Lstat(cfgPath); err == nil {
			data, err := input.Read(cfgPath, input.Settings)
			if err != nil {
				return nil, fmt.Errorf("chat template: %w", err)
			}
			c, err := chat.ReadConfig(data)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", cfgPath, err)
			}
			if c.Template != "" {
				if _, err := chat.Parse(c.Template); err != nil {
					return nil, fmt.Errorf("%s: chat_template: %w", cfgPath, err)
				}
			}
			cfg = &c
		}
	}
	bos, err := PromptBOS(m, parsed, cfg)
	if err != nil {
		return nil, err
	}
	var chatSrc, chatBOS, chatEOS string
	if cfg != nil {
		chatSrc, chatBOS, chatEOS = cfg.Template, cfg.BOS, cfg.EOS
	}
	if m.ChatTemplate != "" {
		data, err := input.Read(m.ChatTemplate, input.Settings)
		if err != nil {
			return nil, fmt.Errorf("%s: chat_template: %w", m.ChatTemplatePos, err)
		}
		if _, err := chat.Parse(string(data)); err != nil {
			return nil, fmt.Errorf("%s: chat_template %s: %w", m.ChatTemplatePos, m.ChatTemplate, err)
		}
		chatSrc = string(data)
	}
	prefetch := earlyReads(opt.Prefetch, DefaultPrefetch, opt.SerialLaunch)
	attnPrefetch := earlyReads(opt.AttnPrefetch, DefaultAttnPrefetch, opt.SerialLaunch)
	attnPrefetchOneRow := earlyReads(opt.AttnPrefetchOneRow, DefaultAttnPrefetchOneRow, opt.SerialLaunch)
	build := bundle.BuildInfo{Compiler: Compiler, Inputs: inputs, Fuse: p.Fused(), PDL: !opt.SerialLaunch, Prefetch: prefetch,
		GemvCols: beyondOne(cmp.Or(opt.GemvCols, DefaultGemvCols)), GemvUnroll: beyondOne(cmp.Or(opt.GemvUnroll, DefaultGemvUnroll)),
		AttnWarps: opt.AttnWarps, AttnUnroll: opt.AttnUnroll, AttnPrefetch: attnPrefetch, AttnPrefetchOneRow: attnPrefetchOneRow, AttnTC: !opt.AttnCUDACores,
		AttnCluster: opt.AttnCluster, AttnEarlyKV: !opt.AttnLateKV && !opt.SerialLaunch, OptionalF32Out: !opt.F32OutAlways,
		GemvSplit: beyondOne(opt.GemvSplit), GemvWarps: codegen.GemvWarpsRecord(cmp.Or(opt.GemvWarps, max(DefaultGemvWarps, opt.GemvSplit)))}
	if opt.TensorCoreRows != codegen.TensorCoreRows {
		build.TensorCoreRows = opt.TensorCoreRows // the default is recorded as 0, as bundles built before the setting have it
	}
	if !slices.Equal(opt.TCChunks, codegen.DefaultTCChunks[:]) {
		build.TCChunks = opt.TCChunks
	}
	build.CopyGemms, build.CopyGemmSlots, build.CopyGemmRows = opt.CopyGemms, opt.CopyGemmSlots, opt.CopyGemmRows
	build.CopyGemmNextAtAsk, build.CopyGemmWide = opt.CopyGemmNextAtAsk, opt.CopyGemmWide
	build.GatedTCRows = max(0, cmp.Or(opt.GatedTCRows, codegen.DefaultGatedTCRows))
	build.GatedCopyRows = max(0, cmp.Or(opt.GatedCopyRows, codegen.DefaultGatedCopyRows))
	build.GatedCopyWide, build.MIPreloadCoherent = cmp.Or(opt.GatedCopyWide, codegen.GatedWideAuto), opt.MIPreloadCoherent
	build.MIPreloadRegs = max(0, cmp.Or(opt.MIPreloadRegs, codegen.DefaultMIPreloadRegs))
	build.MIPreloadRegsMultiWave = max(0, cmp.Or(opt.MIPreloadRegsMultiWave, codegen.DefaultMIPreloadRegsMultiWave))
	build.RopeCopyRows = max(0, cmp.Or(opt.RopeCopyRows, codegen.DefaultRopeCopyRows))
	build.RopeOneWave, build.RopeInAttention = !opt.RopeWaves, !opt.RopeApart
	b, err := codegen.Generate(p, codegen.Options{
		Build:     build,
		Weights:   weights,
		Tokenizer: tok,
		Progress:  func(f string, a ...any) { progress("codegen: "+f, a...) },
		GEMM:      opt.GEMM,
		MoE:       opt.MoE,
	})
	if err != nil {
		return nil, fmt.Errorf("codegen: %w", err)
	}
	b.Weights = embedded
	b.Manifest.Model.BOS = bos
	b.Manifest.Model.ChatTemplate, b.Manifest.Model.ChatBOS, b.Manifest.Model.ChatEOS = chatSrc, chatBOS, chatEOS
	if err := bundle.Verify(b); err != nil {
		return nil, fmt.Errorf("bundle: %w", err)
	}
	if err := checkWeights(b, m); err != nil {
		return nil, err
	}
	return b, nil
}

// checkWeights checks the checkpoint against every weight buffer (headers only), so that a
// missing or misshapen tensor fails the build, not the first run.
func checkWeights(b *bundle.Bundle, m *frontend.Model) error {
	var ck *checkpoint.Checkpoint
	switch {
	case m.Weights.Synthetic:
		return nil
	case len(b.Weights) > 0:
		f, err := safetensors.Parse(b.Weights)
		if err != nil {
			return fmt.Errorf("weights: %w", err)
		}
		ck = checkpoint.FromFile(f, m.Weights.Path)
	default:
		var err error
		if ck, err = checkpoint.Open(m.Weights.Path); err != nil {
			return err
		}
		defer ck.Close()
	}
	return ck.Check(b.Manifest.Buffers)
}

// PromptBOS is the token every prompt starts with (-1: none), as Hugging Face's
// tokenizer(text) and vLLM's completions start them: a bos: in the spec; else, for a
// tokenizer.json, tokenizer_config.json's add_bos_token when it says (its bos_token then),
// or the token the tokenizer.json post-processor puts first; else (the bytes tokenizer) the
// BOS config.json names, if any. Chat templates write their own (loader.Chat).
func PromptBOS(m *frontend.Model, tok *tokenizer.Tokenizer, cfg *chat.Config) (int, error) {
	if m.BOSGiven || tok == nil {
		return m.BOS, nil
	}
	check := func(id int, what string) (int, error) {
		if id >= m.Vocab {
			return 0, fmt.Errorf("tokenizer %s: %s %d is not a token id of the model (vocab %d)", m.Tokenizer.Path, what, id, m.Vocab)
		}
		return id, nil
	}
	if cfg != nil && cfg.AddBOS != nil {
		if !*cfg.AddBOS {
			return -1, nil
		}
		id, ok := tok.TokenID(cfg.BOS)
		if !ok {
			return 0, fmt.Errorf("tokenizer_config.json beside %s: add_bos_token is true but bos_token %q is not a token of tokenizer.json (set bos: in the model spec)", m.Tokenizer.Path, cfg.BOS)
		}
		return check(id, "bos_token")
	}
	prefix, suffix := tok.Special()
	switch {
	case len(suffix) > 0:
		return 0, fmt.Errorf("tokenizer %s: its post-processor appends %v to every prompt, which xmix does not do (set bos: in the model spec to start prompts with one token only)", m.Tokenizer.Path, suffix)
	case len(prefix) > 1:
		return 0, fmt.Errorf("tokenizer %s: its post-processor puts %v before every prompt, xmix prepends at most one token (set bos: in the model spec)", m.Tokenizer.Path, prefix)
	case len(prefix) == 1:
		return check(prefix[0], "post-processor token")
	}
	return -1, nil
}

func fileDigest(path string) (string, error) {
	data, err := input.Read(path, input.Spec)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:]), nil
}

// beyondOne is n as the build info records a GEMV setting: 0 for 1 (one column, one chunk a
// step: what a bundle built before the setting existed has, so its bytes stay the same).
func beyondOne(n int) int {
	if n == 1 {
		return 0
	}
	return n
}
