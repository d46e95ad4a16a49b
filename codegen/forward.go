package codegen

import (
	"bytes"
	"cmp"
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"

	"xmix/bundle"
	"xmix/frontend"
	"xmix/ir"
	"xmix/passes"
	"xmix/ptx"
	"xmix/safetensors"
)

// Options are the parts of a bundle that do not come from the program.
type Options struct {
	// Build is the record of how the bundle is made. Its kernel settings also steer the
	// kernels, so what it says is what was built: PDL rewrites every generated kernel (not an
	// app's own PTX, not the weight synthesiser, which runs outside the graphs) for
	// programmatic dependent launch (earlyLaunch); with it, Prefetch is GemmConfig.Prefetch of
	// every CUDA-core GEMV and tensor-core GEMM; GemvCols and GemvUnroll are GemmConfig.Cols
	// and Unroll of the CUDA-core GEMVs of buckets of more than one row (0 or 1: one);
	// TCChunks are GemmConfig.Unroll of the tensor-core GEMMs of buckets of up to 8 and of
	// 9-32 rows (tcSettings); AttnWarps and AttnUnroll are AttnConfig.Warps and Unroll of
	// the decode buckets' attention, AttnPrefetch AttnConfig.Prefetch and AttnTC
	// AttnConfig.TensorCores of every decode attention, AttnPrefetchOneRow the Prefetch of the
	// one-row decode bucket's, AttnCluster whether splits merge in clusters where they fit,
	// AttnEarlyKV AttnConfig.EarlyKV of every decode attention.
	Build   bundle.BuildInfo
	Weights bundle.WeightsRef
	// Tokenizer is the tokenizer definition to embed (empty for a byte tokenizer).
	Tokenizer []byte
	// Progress, when set, is told about each phase.
	Progress func(format string, args ...any)
	// GEMM picks the GEMM kernels of buckets from Build.TensorCoreRows rows: "" or "tc" (tensor
	// cores, x re-read per block), "tc-staged" (x staged once per block, split-K with a
	// workspace), "cuda-core" (no tensor cores). For measuring one against another.
	GEMM string
	// MoE picks how Mixtral buckets of TensorCoreRows rows and more run their experts: "" or
	// "dense" (every expert over every row as ordinary GEMMs, then a weighted sum of each row's
	// top-k: E/k times the FLOPs, but the GEMMs run on tensor cores, or cuBLASLt on the GPU),
	// "grouped" (the expert kernels of moe.go, rows grouped by expert: each chosen expert read
	// once, computed on CUDA cores). Dense measured 15x faster on 512-token prefill chunks on
	// the H200 (RATIONALE.md); smaller buckets always run grouped.
	MoE string
}

// gen is the state of one Generate call.
type gen struct {
	p       *passes.Program
	m       *frontend.Model
	wdt     ptx.Type
	kvdt    ptx.Type
	maxT    int
	maxS    int
	blocks  int                // KV pages per sequence
	kernels map[string]*Kernel // by the name a template asks for
	bodies  map[string]*Kernel // by what the kernel is (kernel)
	// soloTag ends the names of the kernels that host MI ops while an app's Solo node list is
	// lowered (miName): their ops are that app's alone, the kernels of the same site in Nodes
	// all the apps'.
	soloTag   string
	gemmKind  string
	moeKind   string
	pdl       bool
	prefetch  int    // GemmConfig.Prefetch of the CUDA-core GEMVs
	gemvCols  int    // GemmConfig.Cols of the plain GEMVs of more than one row
	unroll    int    // GemmConfig.Unroll of the CUDA-core GEMVs of more than one row
	split     int    // the most warps a CUDA-core GEMV splits a column's K over (splitFor)
	gemvWarps int    // a CUDA-core GEMV block's warps (GemmConfig.Warps; 0: gemmWarps)
	tcRows    int    // the bucket size from which GEMMs run on tensor cores (tensorCores)
	tcChunks  [2]int // GemmConfig.Unroll of the tensor-core GEMMs of up to 8, of 9-32 rows
	// gatedTCRows: decode buckets on tensor cores of at most this many rows take the gate/up
	// projection with its activation as one kernel (BuildInfo.GatedTCRows, matmulGatedTC).
	gatedTCRows int
	// copyShapes are the GEMM shapes given copy-engine kernels (copyShape), copySlots the
	// slots of their rings (0: the default, gcStages).
	copyShapes []copyGemmShape
	copySlots  int
	// copyNextAtAsk: GemmCopyConfig.NextAtAsk of every copy-engine kernel
	// (BuildInfo.CopyGemmNextAtAsk).
	copyNextAtAsk bool
	// copyWide: the plain copy-engine kernels of rows whose layout has a wide form take it
	// (BuildInfo.CopyGemmWide).
	copyWide bool
	// copyRows are the row counts given copy-engine kernels, fewest first (CopyGemmRows).
	copyRows []int
	// decodeBuckets are the model's decode buckets (gatedCopyServes).
	decodeBuckets []int
	// gatedCopyRows: decode buckets of at most this many rows get a copy-engine kernel for
	// the gate/up GEMM and its activation together (BuildInfo.GatedCopyRows, gatedCopies).
	gatedCopyRows int
	// gatedCopyWide: which buckets below the smallest wide layout's rows run that layout's
	// gated kernel (BuildInfo.GatedCopyWide, "" read as GatedWideOwn; gatedCopyFor).
	gatedCopyWide string
	// miPreloadCoherent: row kernels that preload their MI ops' parameters use coherent loads
	// (BuildInfo.MIPreloadCoherent, RowConfig.PreloadCoherent).
	miPreloadCoherent bool
	// miPreloadRegs: those kernels' bound on a thread's registers, 0 none
	// (BuildInfo.MIPreloadRegs, RowConfig.PreloadMaxRegs).
	miPreloadRegs int
	// miPreloadRegsMultiWave: the bound in templates of more than MIPreloadWaveRows rows, 0
	// miPreloadRegs's (BuildInfo.MIPreloadRegsMultiWave).
	miPreloadRegsMultiWave int
	// ropeCopyRows: decode buckets of at most this many rows get a copy-engine kernel for the
	// q/k/v GEMM and its rope_kv together (BuildInfo.RopeCopyRows, ropeCopies).
	ropeCopyRows int
	// attnWarps and attnUnroll are AttnConfig.Warps and Unroll of the decode buckets' attention.
	attnWarps, attnUnroll int
	// attnPrefetch and attnTC are AttnConfig.Prefetch and TensorCores of every decode
	// attention kernel, attnPrefetchOneRow the Prefetch of the one-row decode bucket's where
	// it is more.
	attnPrefetch, attnPrefetchOneRow int
	attnTC                           bool
	// attnCluster: decode buckets whose splits fit in one wave merge them in a cluster
	// (AttnConfig.Cluster, ClusterSplits).
	attnCluster bool
	// attnEarlyKV is AttnConfig.EarlyKV of every decode attention kernel.
	attnEarlyKV bool
	// optionalF32Out: the add+norm and decode attention kernels may be passed an out or z of
	// 0 (RowConfig.OutOptional, AttnConfig.ZOptional).
	optionalF32Out bool
	// ropeOneWave: the rope_kv kernels of templates whose grid would take more than a wave
	// share a row's heads among fewer blocks (BuildInfo.RopeOneWave, RopeConfig.Groups).
	ropeOneWave bool
	// ropeInAttention: the decode buckets whose attention runs one block a row on tensor
	// cores leave the q/k/v rotation and KV write to it (BuildInfo.RopeInAttention,
	// AttnConfig.Rope; tb.ropeToAttention).
	ropeInAttention bool
	// gemmTickets is GemmConfig.Tickets of every staged tensor-core GEMM (--gemm tc-staged).
	gemmTickets int
	order       []string
	bufs        []bundle.Buffer
	// tp is the tensor-parallel degree (1: one device); the graph's widths are a rank's.
	tp int
	// siteKernels is the kernel (as a template asks for it) each MI op runs in.
	siteKernels map[*ir.MI]string
	// finalNorm and lmHead are the weights a logit lens reads (the model's own), finalOffset
	// the norm's weight offset and finalSoftcap the logits' cap (0: none) it applies as the
	// model does.
	finalNorm, lmHead         string
	finalOffset, finalSoftcap float32
	// attn is the forward's attention shape: a decode bucket's context split is chosen by it.
	attn ir.AttentionAttrs
}

// Generate lowers a planned program to a bundle: kernels, one template per bucket, buffers,
// and the params section.
func Generate(p *passes.Program, opt Options) (*bundle.Bundle, error) {
	m := p.Model
	g := &gen{p: p, m: m, kernels: map[string]*Kernel{}, bodies: map[string]*Kernel{}, wdt: ptx.BF16, kvdt: ptx.F32, gemmKind: opt.GEMM, moeKind: opt.MoE, pdl: opt.Build.PDL,
		tp: max(1, p.TP), siteKernels: map[*ir.MI]string{}}
	bi := opt.Build
	if m.HeadDim%frontend.HeadDimStep != 0 {
		// Every stage before this one takes any head_dim; the attention kernels do not.
		return nil, frontend.Errorf(m.HeadDimPos, fmt.Sprintf("the attention kernels split a head evenly over a warp's %d lanes", frontend.HeadDimStep),
			"head_dim %d is not a multiple of %d", m.HeadDim, frontend.HeadDimStep)
	}
	if err := CheckGemvSplit(bi.GemvSplit); err != nil {
		return nil, err
	}
	if err := CheckGemvWarps(bi.GemvWarps, bi.GemvSplit); err != nil {
		return nil, err
	}
	if err := CheckTensorCoreRows(bi.TensorCoreRows); err != nil {
		return nil, err
	}
	g.tcRows = cmp.Or(bi.TensorCoreRows, TensorCoreRows)
	if err := CheckGatedTCRows(bi.GatedTCRows); err != nil {
		return nil, err
	}
	g.gatedTCRows = bi.GatedTCRows
	g.copyShapes = slices.Clone(copyGemmShapes)
	if len(bi.CopyGemms) > 0 {
		shapes, err := bundle.ParseGemmShapes(bi.CopyGemms)
		if err != nil {
			return nil, fmt.Errorf("copy-engine GEMMs: %w", err)
		}
		g.copyShapes = g.copyShapes[:0]
		for _, s := range shapes {
			g.copyShapes = append(g.copyShapes, copyGemmShape{K: s[0], N: s[1]})
		}
	}
	if len(bi.CopyGemms) > 0 || len(bi.CopyGemmRows) > 0 {
		// Shapes or rows a build names (for measuring) go to every bucket of its row counts.
		for i := range g.copyShapes {
			g.copyShapes[i].MaxRows = math.MaxInt
		}
	}
	if err := CheckCopyGemmSlots(bi.CopyGemmSlots); err != nil {
		return nil, err
	}
	g.copySlots, g.copyNextAtAsk, g.copyWide = bi.CopyGemmSlots, bi.CopyGemmNextAtAsk, bi.CopyGemmWide
	if err := CheckCopyGemmRows(bi.CopyGemmRows); err != nil {
		return nil, err
	}
	if err := CheckGatedCopyRows(bi.GatedCopyRows); err != nil {
		return nil, err
	}
	if err := CheckGatedCopyWide(bi.GatedCopyWide); err != nil {
		return nil, err
	}
	g.gatedCopyRows, g.gatedCopyWide = bi.GatedCopyRows, cmp.Or(bi.GatedCopyWide, GatedWideOwn)
	if err := CheckMIPreloadRegs(bi.MIPreloadRegs); err != nil {
		return nil, err
	}
	if err := CheckMIPreloadRegsMultiWave(bi.MIPreloadRegsMultiWave); err != nil {
		return nil, err
	}
	g.miPreloadCoherent, g.miPreloadRegs, g.miPreloadRegsMultiWave = bi.MIPreloadCoherent, bi.MIPreloadRegs, bi.MIPreloadRegsMultiWave
	if err := CheckRopeCopyRows(bi.RopeCopyRows); err != nil {
		return nil, err
	}
	g.ropeCopyRows = bi.RopeCopyRows
	g.ropeOneWave, g.ropeInAttention = bi.RopeOneWave, bi.RopeInAttention
	g.copyRows = gcDefaultRows
	if len(bi.CopyGemmRows) > 0 {
		g.copyRows = slices.Sorted(slices.Values(bi.CopyGemmRows))
	}
	switch {
	case bi.Prefetch < 0 || bi.Prefetch > 0 && !bi.PDL:
		return nil, fmt.Errorf("GEMV prefetch %d bytes: want 0, or a byte count with early launch", bi.Prefetch)
	case bi.GemvCols < 0 || bi.GemvCols > MaxGemvCols:
		return nil, fmt.Errorf("GEMV columns per warp %d: want 1 to %d", bi.GemvCols, MaxGemvCols)
	case bi.GemvUnroll < 0 || bi.GemvUnroll > MaxGemvUnroll:
		return nil, fmt.Errorf("GEMV unroll %d: want 1 to %d", bi.GemvUnroll, MaxGemvUnroll)
	}
	if err := CheckAttnSettings(bi.AttnWarps, bi.AttnUnroll); err != nil {
		return nil, fmt.Errorf("decode attention: %w", err)
	}
	g.attnWarps, g.attnUnroll = bi.AttnWarps, bi.AttnUnroll
	for _, n := range []int{bi.AttnPrefetch, bi.AttnPrefetchOneRow} {
		if err := CheckAttnPrefetch(n, bi.PDL); err != nil {
			return nil, fmt.Errorf("decode attention: %w", err)
		}
	}
	g.attnPrefetch, g.attnPrefetchOneRow, g.attnTC, g.attnCluster = bi.AttnPrefetch, bi.AttnPrefetchOneRow, bi.AttnTC, bi.AttnCluster
	g.attnEarlyKV = bi.AttnEarlyKV
	g.optionalF32Out = bi.OptionalF32Out
	g.prefetch, g.gemvCols, g.unroll, g.split, g.gemvWarps = bi.Prefetch, bi.GemvCols, bi.GemvUnroll, bi.GemvSplit, bi.GemvWarps
	tc, err := tcChunks(bi.TCChunks)
	if err != nil {
		return nil, err
	}
	g.tcChunks = tc
	g.readGraph()
	switch opt.GEMM {
	case "", "tc", "tc-staged", "cuda-core":
	default:
		return nil, fmt.Errorf("GEMM kind %q: use tc, tc-staged or cuda-core", opt.GEMM)
	}
	switch opt.MoE {
	case "":
		if m.Experts > 0 {
			g.moeKind = "dense"
		}
	case "grouped":
	case "dense":
		if m.Experts == 0 {
			return nil, fmt.Errorf("MoE kind dense: model %s has no experts", m.Name)
		}
	default:
		return nil, fmt.Errorf("MoE kind %q: use grouped or dense", opt.MoE)
	}
	if m.Dtype == "f32" {
		g.wdt = ptx.F32
	}
	if m.KVDtype == "bf16" {
		g.kvdt = ptx.BF16
	}
	g.decodeBuckets = m.DecodeBuckets
	g.maxT = max(m.DecodeBuckets[len(m.DecodeBuckets)-1], m.PrefillChunks[len(m.PrefillChunks)-1])
	g.maxS = max(m.DecodeBuckets[len(m.DecodeBuckets)-1], min(m.PrefillChunks[len(m.PrefillChunks)-1], m.MaxSeqs))
	g.blocks = (m.MaxSeqLen + m.KVBlockSize - 1) / m.KVBlockSize
	progress := opt.Progress
	if progress == nil {
		progress = func(string, ...any) {}
	}

	g.declareBuffers()
	var templates []bundle.Template
	for _, b := range m.DecodeBuckets {
		progress("template decode_b%d", b)
		t, err := g.template(p.Graph, fmt.Sprintf("decode_b%d", b), bundle.Decode, b, b)
		if err != nil {
			return nil, err
		}
		templates = append(templates, t)
	}
	for _, c := range m.PrefillChunks {
		progress("template prefill_t%d", c)
		t, err := g.template(p.Graph, fmt.Sprintf("prefill_t%d", c), bundle.Prefill, c, min(c, g.maxS))
		if err != nil {
			return nil, err
		}
		templates = append(templates, t)
	}
	if err := g.plainNodes(templates); err != nil {
		return nil, err
	}
	if err := g.soloNodes(templates); err != nil {
		return nil, err
	}
	if err := g.copyGemms(templates); err != nil {
		return nil, err
	}
	params, err := g.params()
	if err != nil {
		return nil, err
	}
	if s := opt.Weights.Synthetic; s != nil {
		name := "synth_" + g.wdt.String()
		if _, err := g.kernel(name, func() (*Kernel, error) { return Synth(name, g.wdt) }); err != nil {
			return nil, err
		}
		synth := *s
		synth.Kernel = name
		opt.Weights.Synthetic = &synth
	}
	b := &bundle.Bundle{
		Manifest: bundle.Manifest{
			Model:   g.modelConfig(),
			Weights: opt.Weights,
			Apps:    g.apps(),
			Buffers: g.bufs,
			Sites:   g.sites(),
			Build:   opt.Build,
			TP:      g.manifestTP(),
		},
		Templates: templates,
		Params:    params,
		Tokenizer: opt.Tokenizer,
	}
	for _, name := range g.order {
		b.Kernels = append(b.Kernels, g.kernels[name].bundleKernel())
	}
	progress("%d kernels, %d templates", len(b.Kernels), len(templates))
	return b, nil
}

// plainNodes gives every template of a bundle with apps the node list of the same bucket
// lowered from the graph without them (bundle.Template.Plain, passes' app-free). Rows that
// enable no app compute exactly what the app-free bundle computes, so a step in which no row
// enables an app may run these nodes instead: apps that are deployed but unused then cost
// nothing, not even a mask test.
func (g *gen) plainNodes(templates []bundle.Template) error {
	if len(g.p.Ops) == 0 {
		return nil
	}
	for i := range templates {
		t := &templates[i]
		p, err := g.template(g.p.Plain, t.Name, t.Kind, t.Tokens, t.Samples)
		if err != nil {
			return fmt.Errorf("%s without apps: %w", t.Name, err)
		}
		t.Plain = p.Nodes
	}
	return nil
}

// soloNodes gives every template of a bundle of two to passes.MaxSoloApps apps the node list
// of the same bucket lowered from each app's Solo graph (bundle.Template.Solo, passes'
// app-solo), in bit order. The kernels that host that app's ops are its own (soloTag); the
// others are the same as Nodes' or Plain's, built once.
func (g *gen) soloNodes(templates []bundle.Template) error {
	defer func() { g.soloTag = "" }()
	for _, s := range g.p.Solo {
		g.soloTag = fmt.Sprintf("_solo%d", s.App.Bit)
		for i := range templates {
			t := &templates[i]
			p, err := g.template(s.Graph, t.Name, t.Kind, t.Tokens, t.Samples)
			if err != nil {
				return fmt.Errorf("%s with app %s alone: %w", t.Name, s.App.Name, err)
			}
			t.Solo = append(t.Solo, bundle.AppNodes{Bit: s.App.Bit, Nodes: p.Nodes})
		}
	}
	return nil
}

func (g *gen) modelConfig() bundle.ModelConfig {
	m := g.m
	c := bundle.ModelConfig{
		Name: m.Name, Family: m.Family, Hidden: m.Hidden, Intermediate: m.Intermediate,
		Layers: m.Layers, Heads: m.Heads, KVHeads: m.KVHeads, HeadDim: m.HeadDim, Vocab: m.Vocab,
		RopeTheta: m.RopeTheta, RMSEps: m.RMSEps, TieEmbeddings: m.TieEmbeddings, QKVBias: m.QKVBias, QKNorm: m.QKNorm,
		Experts: m.Experts, TopK: m.TopK,
		WeightDtype: g.wdt.String(), KVDtype: g.kvdt.String(), MaxSeqLen: m.MaxSeqLen,
		MaxSeqs: m.MaxSeqs, KVBlockSize: m.KVBlockSize, KVBlocks: g.kvBlocks(), KVPadPages: g.padPages(),
		MaxBatchedTokens: m.MaxBatchedTokens,
		Tokenizer:        m.Tokenizer.Kind, BOS: m.BOS, EOS: m.EOS,
	}
	if g.p.PerRequestVectors() {
		c.VectorSlots = g.p.VectorSlots
	}
	c.Logprobs = m.MaxLogprobs
	// What Gemma 2 adds to the Llama forward (zero for the other families).
	c.Activation, c.NormOffset, c.PostNorms, c.EmbedScale = m.Activation, m.NormOffset, m.PostNorms, m.EmbedScale()
	c.QueryPreAttnScalar, c.AttnSoftcap, c.FinalSoftcap = m.QueryPreAttnScalar, m.AttnSoftcap, m.FinalSoftcap
	c.SlidingWindow, c.SlidingLayers = m.SlidingWindow, m.SlidingLayers
	if s := m.RopeScaling; s != nil {
		c.RopeScaling = &bundle.RopeScaling{Type: s.Type, Factor: s.Factor, LowFreqFactor: s.LowFreqFactor,
			HighFreqFactor: s.HighFreqFactor, OriginalMaxPos: s.OriginalMaxPos}
	}
	return c
}

// kvBlocks sizes the page pool: the spec's kv_cache_tokens (by default every resident
// sequence at max_seq_len), plus the pages of the padding sequence.
func (g *gen) kvBlocks() int { return g.m.KVCacheTokens/g.m.KVBlockSize + g.padPages() }

// padPages gives the padding rows of the largest bucket a slot each (row i writes position i),
// so no two rows of a step ever write the same KV element.
func (g *gen) padPages() int {
	return min(g.blocks, (g.maxT+g.m.KVBlockSize-1)/g.m.KVBlockSize)
}

func (g *gen) buf(name string, kind bundle.BufferKind, dtype string, shape []int, tensors ...string) {
	g.bufs = append(g.bufs, bundle.Buffer{Name: name, Kind: kind, Dtype: dtype, Shape: shape, Tensors: tensors})
}

// sharded declares a buffer that tensor parallelism cuts along dim: shape is the unsharded
// shape and extents each tensor's size along dim. At tp 1 it is an ordinary buffer, so
// bundles without tensor parallelism do not change.
func (g *gen) sharded(name string, kind bundle.BufferKind, dtype string, shape []int, dim int, extents []int, global string, tensors ...string) {
	if g.tp == 1 {
		g.buf(name, kind, dtype, shape, tensors...)
		return
	}
	local := append([]int(nil), shape...)
	local[dim] /= g.tp
	g.bufs = append(g.bufs, bundle.Buffer{Name: name, Kind: kind, Dtype: dtype, Shape: local, Tensors: tensors,
		Shard: &bundle.Shard{Dim: dim, Extents: extents, Global: global}})
}

// readGraph takes from the graph what the bundle's shape depends on beyond the nodes.
func (g *gen) readGraph() {
	for _, n := range g.p.Graph.Nodes {
		switch a := n.Attrs.(type) {
		case ir.AttentionAttrs:
			g.attn = a
		case ir.NormAttrs:
			if n.Op == ir.OpAddNorm && n.Out[1].Rows == ir.Samples {
				g.finalNorm, g.finalOffset = n.Weight("w").Name, a.Offset
			}
		case ir.SoftcapAttrs:
			g.finalSoftcap = a.Cap
		case ir.MatmulAttrs:
			if a.Split == ir.Vocab {
				g.lmHead = n.Weight("w").Name
			}
		}
	}
}

// manifestTP is Manifest.TP: 0 without tensor parallelism, so such bundles keep their bytes.
func (g *gen) manifestTP() int {
	if g.tp == 1 {
		return 0
	}
	return g.tp
}

func (g *gen) declareBuffers() {
	m := g.m
	gr := g.p.Graph
	for _, w := range gr.Weights() {
		g.weight(w, bundle.KindWeight, g.wdt.String())
	}
	for _, w := range gr.Params() {
		g.weight(w, bundle.KindParam, "f32")
	}
	shardedVecs := g.shardedVectors()
	for _, a := range g.p.Apps {
		for _, v := range a.Vectors {
			if shardedVecs[v.Buffer] {
				g.sharded(v.Buffer, bundle.KindParam, "f32", []int{len(v.Data)}, 0, []int{len(v.Data)}, "", v.Buffer)
				continue
			}
			g.buf(v.Buffer, bundle.KindParam, "f32", []int{len(v.Data)}, v.Buffer)
			if v.PerRequest {
				g.buf(passes.SlotsBuffer(v.Buffer), bundle.KindSlots, "f32", []int{g.p.VectorSlots, len(v.Data)})
			}
		}
		if w := a.TableWidth(); w > 0 {
			// Written by the host per sequence slot, so that requests carry their own values.
			g.buf(a.ScalarTable(), bundle.KindControl, "f32", []int{m.MaxSeqs + 1, w})
		}
		for _, e := range a.Exports {
			g.buf(e.Buffer, bundle.KindOutput, "f32", []int{g.maxT, e.Width})
		}
		if w := g.p.FiredWidth(a); w > 0 {
			g.buf(a.FiredBuffer(), bundle.KindOutput, "u32", []int{g.maxT, w / 4}) // rows of w bytes
		}
	}
	for _, c := range []string{bundle.CtlTokens, bundle.CtlPos, bundle.CtlSeq, bundle.CtlMask, bundle.CtlGen, bundle.CtlOutRow} {
		g.buf(c, bundle.KindControl, "u32", []int{g.maxT})
	}
	if len(g.p.Latches) > 0 {
		g.buf(bundle.CtlLatch, bundle.KindControl, "u32", []int{g.maxT})
	}
	if g.p.PerRequestVectors() {
		// Each row's vector slot (bundle.NoRow: its request holds none and reads the defaults).
		g.buf(bundle.CtlVSlot, bundle.KindControl, "u32", []int{g.maxT})
	}
	g.buf(bundle.CtlTemperature, bundle.KindControl, "f32", []int{g.maxS})
	g.buf(bundle.CtlTopP, bundle.KindControl, "f32", []int{g.maxS})
	g.buf(bundle.CtlRNG, bundle.KindControl, "u32", []int{g.maxS})
	if m.MaxLogprobs > 0 {
		// Per sample: 0, or 1 + how many top tokens it wants; what the sampler reports.
		g.buf(bundle.CtlLogprobs, bundle.KindControl, "u32", []int{g.maxS})
		g.buf(bundle.OutLogprobs, bundle.KindOutput, "f32", []int{g.maxS, 1 + 2*m.MaxLogprobs})
	}
	if len(m.EOS) > 0 {
		g.buf(bundle.CtlEOSBan, bundle.KindControl, "u32", []int{g.maxS}) // min_tokens not reached
	}
	// Each sample's token row (bundle.NoRow for unused samples): sample-space kernels (logits
	// MI, the sampler's overrides) read their row's control words through it.
	g.buf(bundle.CtlSRow, bundle.KindControl, "u32", []int{g.maxS})
	if len(g.p.Ops) > 0 {
		// The OR of the step's app masks: heavy nodes exit at once when their bit is clear,
		// and a step that enables no app may run the template's app-free nodes (Plain).
		g.buf(bundle.CtlAnyMask, bundle.KindControl, "u32", []int{1})
	}
	if w := g.lensCandWidth(); w > 0 {
		// The logit lens's scratch (codegen/lens.go): normalised rows, logits, top-k candidates.
		g.buf("act.lens_x", bundle.KindActivation, "f32", []int{g.maxT, m.Hidden})
		g.buf("act.lens", bundle.KindActivation, "f32", []int{g.maxT, m.Vocab})
		g.buf("act.lens_cand", bundle.KindActivation, "f32", []int{g.maxT, w})
	}
	// One row per resident sequence plus the padding sequence.
	g.buf(bundle.KVBlockTable, bundle.KindControl, "u32", []int{m.MaxSeqs + 1, g.blocks})
	for _, s := range gr.State() {
		g.buf(s.Name, bundle.KindKV, s.Dtype.String(), []int{g.kvBlocks(), m.KVBlockSize, s.Heads, s.HeadDim})
	}
	if g.gemmKind == "tc-staged" {
		// One split-K workspace serves every GEMM: they run one after another, each leaves
		// its counters at zero, and the counters sit apart from every GEMM's partials.
		partials := 0
		for _, kn := range g.gemmShapes() {
			c := GemmConfig{K: kn[0], N: kn[1], WDtype: g.wdt}
			g.gemmTickets = max(g.gemmTickets, c.StagedTickets(g.maxT))
			partials = max(partials, c.StagedPartialBytes(g.maxT))
		}
		g.buf("act.gemm_ws", bundle.KindActivation, "u32", []int{max(ticketBytes(g.gemmTickets)+partials, 16) / 4})
	}
	// One split workspace serves every layer's attention: they run one after another and
	// each leaves its counters at zero. Decode buckets that split read the step's chunk.
	ws, split := 0, false
	for _, rows := range m.DecodeBuckets {
		c, splits := g.decodeAttn(g.attnConfig(g.attn), rows), g.attnSplits(rows)
		c.Split = true
		ws = max(ws, c.SplitWorkspaceBytes(rows, splits))
		split = split || splits > 1
	}
	if ws > 0 {
		g.buf("act.attn_ws", bundle.KindActivation, "u32", []int{ws / 4})
	}
	if split {
		g.buf(bundle.CtlAttnChunk, bundle.KindControl, "u32", []int{1})
	}
	g.activations()
	g.buf(bundle.OutSampled, bundle.KindOutput, "u32", []int{g.maxS})
}

// weight declares the buffer of graph weight w (a computed table's tensor is its own name).
func (g *gen) weight(w *ir.Weight, kind bundle.BufferKind, dtype string) {
	tensors := w.Tensors
	if w.Computed {
		tensors = []string{w.Name}
	}
	if w.Split == ir.Replicated {
		g.buf(w.Name, kind, dtype, w.Shape, tensors...)
		return
	}
	dim := 0
	if w.Split == ir.Row {
		dim = 1
	}
	g.sharded(w.Name, kind, dtype, w.Shape, dim, w.Extents, w.Global, tensors...)
}

// activations declares the buffer of every value of the graph, in the order the forward
// first writes them, with the scratch of the nodes that need some.
func (g *gen) activations() {
	seen := map[string]bool{bundle.OutSampled: true} // declared last, with the outputs
	for _, n := range g.p.Graph.Nodes {
		for _, v := range n.Out {
			if v.InKernel || seen[v.Buffer] {
				continue
			}
			seen[v.Buffer] = true
			rows := g.maxT
			if v.Rows == ir.Samples {
				rows = g.maxS
			}
			g.buf(v.Buffer, bundle.KindActivation, v.Dtype.String(), []int{rows, v.Width})
		}
		if n.Op == ir.OpExperts && !seen["act.moe_act"] {
			seen["act.moe_act"] = true
			g.moeScratch(n)
		}
	}
}

// gemmShapes are the (K, N) of every GEMM the forward runs, those of fused nodes too (a
// bucket that runs a fused node's GEMM on tensor cores runs its parts).
func (g *gen) gemmShapes() [][2]int {
	var out [][2]int
	var nodes []*ir.Node
	for _, n := range g.p.Graph.Nodes {
		nodes = append(append(nodes, n), n.Parts...)
	}
	for _, n := range nodes {
		switch a := n.Attrs.(type) {
		case ir.MatmulAttrs:
			out = append(out, [2]int{n.In[0].Width, n.Out[0].Width})
		case ir.ExpertsAttrs:
			out = append(out, [2]int{n.In[0].Width, 2 * a.Inter}, [2]int{a.Inter, n.In[0].Width})
		}
	}
	return out
}

// shardedVectors are the app vectors cut with the heads at tp > 1: those of ops at
// sharded hooks, in standalone MI kernels (head_ablate's column mask at attn.z; check-tp
// refuses the others).
func (g *gen) shardedVectors() map[string]bool {
	out := map[string]bool{}
	if g.tp == 1 {
		return out
	}
	for _, op := range g.p.Ops {
		if op.Host == passes.HostMI && op.Vec != "" {
			out[op.Vec] = true
		}
	}
	return out
}

// sampleRows says whether op's kernel runs on sampled token rows only.
func (g *gen) sampleRows(op *passes.MIOp) bool {
	final := op.Host == passes.HostAddNorm && op.Role == passes.RoleNorm
	return op.Host == passes.HostLogits || op.Host == passes.HostSampler || final
}

// params builds the params section: RoPE tables and every app's vectors. Scalar tables are
// control buffers: the host fills them from the manifest's defaults.
func (g *gen) params() ([]byte, error) {
	m := g.m
	cos, sin := RopeTables(m.RopeTheta, m.HeadDim, m.MaxSeqLen, g.modelConfig().RopeScaling)
	ts := []safetensors.Tensor{safetensors.FromF32("rope.cos", cos, m.MaxSeqLen, m.HeadDim/2), safetensors.FromF32("rope.sin", sin, m.MaxSeqLen, m.HeadDim/2)}
	for _, a := range g.p.Apps {
		for _, v := range a.Vectors {
			ts = append(ts, safetensors.FromF32(v.Buffer, v.Data, len(v.Data)))
		}
	}
	var out bytes.Buffer
	if err := safetensors.Write(&out, ts, nil); err != nil {
		return nil, fmt.Errorf("params section: %w", err)
	}
	return out.Bytes(), nil
}

func (g *gen) apps() []bundle.App {
	var out []bundle.App
	for _, a := range g.p.Apps {
		ba := bundle.App{Name: a.Name, Bit: a.Bit, Source: a.Spec.Path}
		for i, s := range a.Scalars {
			ba.Scalars = append(ba.Scalars, bundle.Scalar{Name: s.Name, Index: i, Value: s.Value, Scales: s.Scales, Residual: s.Residual, Limit: s.Limit})
		}
		for _, m := range a.LayerMasks {
			ba.LayerMasks = append(ba.LayerMasks, bundle.LayerMask{Op: m.OpIndex, Column: m.Col, Words: m.Words, Layers: m.Layers})
		}
		if a.TableWidth() > 0 {
			ba.ScalarTable = a.ScalarTable()
		}
		for _, v := range a.Vectors {
			if v.Param != "" {
				bv := bundle.Vector{Param: v.Param, Buffer: v.Buffer, Width: len(v.Data), Unit: v.Unit}
				if v.PerRequest {
					bv.Slots = passes.SlotsBuffer(v.Buffer)
				}
				ba.Vectors = append(ba.Vectors, bv)
			}
		}
		seen := map[int]bool{}
		for _, op := range g.p.Ops {
			for _, gt := range op.Gates {
				if op.App == a && gt.Kind == "after_token" && !seen[gt.Latch] {
					seen[gt.Latch] = true
					ba.Latches = append(ba.Latches, bundle.Latch{Bit: gt.Latch, Tokens: g.p.Latches[gt.Latch]})
				}
			}
		}
		for _, e := range a.Exports {
			if e.Export {
				ba.Exports = append(ba.Exports, bundle.Export{Name: e.Name, Buffer: e.Buffer, Width: e.Width, Samples: g.sampleSpace(e.Buffer)})
			}
		}
		for _, op := range g.p.Ops {
			if op.App == a {
				ba.Fired = append(ba.Fired, bundle.FiredSite{Op: op.OpIndex, Layer: op.Layer, Column: g.p.FiredColumn(op), Samples: g.sampleRows(op)})
			}
		}
		if g.p.FiredWidth(a) > 0 {
			ba.FiredBuffer = a.FiredBuffer()
		}
		out = append(out, ba)
	}
	return out
}

// lensCandWidth is the widest act.lens_cand row the bundle's logit-lens ops need; 0 when
// it has none.
func (g *gen) lensCandWidth() int {
	w := 0
	for _, op := range g.p.Ops {
		if op.Host == passes.HostLens {
			w = max(w, g.lensConfig(&op.MI).CandWidth())
		}
	}
	return w
}

// sampleSpace says whether buffer is filled by reads at the logits hook, which write the
// token rows that were sampled only.
func (g *gen) sampleSpace(buffer string) bool {
	for _, op := range g.p.Ops {
		if op.Out == buffer && op.Host == passes.HostLogits {
			return true
		}
	}
	return false
}

func (g *gen) sites() []bundle.Site {
	var out []bundle.Site
	for _, op := range g.p.Ops {
		out = append(out, bundle.Site{
			Layer: op.Layer, Hook: op.Hook, App: op.App.Name, Op: op.OpIndex,
			Kernel: g.builtName(g.siteKernels[&op.MI]), Fused: op.Host != passes.HostMI && op.Host != passes.HostCustom && op.Host != passes.HostLens, What: op.Template,
		})
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Layer < out[j].Layer })
	return out
}

// builtName is the name of the kernel built for name: another when it was identical to one
// built before (kernel).
func (g *gen) builtName(name string) string {
	if k, ok := g.kernels[name]; ok {
		return k.Name
	}
	return name
}

// kernel returns the cached kernel name, building it on first use. A kernel that comes out
// identical to one already built (the MI kernels of sites with the same ops, gates and app
// bits: their vectors and outputs are parameters) is kept once, under the first one's name:
// fewer kernels to JIT at load, and fewer for the SMs' instruction caches to hold while a
// step runs (the add+norm kernels of the six-app bundle shrink from 32 to 7).
func (g *gen) kernel(name string, build func() (*Kernel, error)) (*Kernel, error) {
	if k, ok := g.kernels[name]; ok {
		return k, nil
	}
	k, err := build()
	if err != nil {
		return nil, fmt.Errorf("kernel %s: %w", name, err)
	}
	if g.pdl && k.Op != customOp && k.Op != synthOp {
		if k, err = earlyLaunch(k); err != nil {
			return nil, fmt.Errorf("kernel %s: %w", name, err)
		}
	}
	body := k.Op + "\x00" + string(k.Attrs) + "\x00" + strings.ReplaceAll(k.PTX, k.Name, "")
	if same, ok := g.bodies[body]; ok {
		g.kernels[name] = same
		return same, nil
	}
	g.bodies[body] = k
	g.kernels[name] = k
	g.order = append(g.order, name)
	return k, nil
}
