// Package bundle is the .xmb file: the only contract between compile time and run time. It
// holds the model configuration, the deployed apps, every kernel's PTX with its parameter
// layout and reference-op binding, one graph template per bucket, the apps' parameter tensors,
// the tokenizer and optionally the weights. Types here are plain data; codegen fills them, the
// loader reads them.
package bundle

import "encoding/json"

// Bundle is a whole .xmb file in memory.
type Bundle struct {
	Manifest  Manifest
	Kernels   []Kernel
	Templates []Template
	// Params is a safetensors file holding every app parameter tensor and every constant
	// table codegen precomputed (RoPE frequencies); buffers name tensors in it.
	Params []byte
	// Tokenizer is the tokenizer definition (tokenizer.json bytes; empty for a byte tokenizer).
	Tokenizer []byte
	// Weights, when present, is a safetensors file embedded in the bundle; otherwise the
	// manifest's Weights reference names the file and its hash.
	Weights []byte
}

// KernelsByName indexes b's kernels by name (Verify checks that names are unique).
func (b *Bundle) KernelsByName() map[string]Kernel {
	m := make(map[string]Kernel, len(b.Kernels))
	for _, k := range b.Kernels {
		m[k.Name] = k
	}
	return m
}

// Manifest describes everything in the bundle except bulk data.
type Manifest struct {
	Model   ModelConfig `json:"model"`
	Weights WeightsRef  `json:"weights"`
	Apps    []App       `json:"apps"`
	Buffers []Buffer    `json:"buffers"`
	Sites   []Site      `json:"sites"`
	Build   BuildInfo   `json:"build"`
	// TP is the tensor-parallel degree the templates were compiled for; 0 or 1: one device.
	// At TP > 1 every rank (0..TP-1) replays the same templates (SPMD) over its own copy of
	// every buffer: a buffer with a Shard holds that rank's part of its tensors, every other
	// buffer is replicated, and Collective nodes exchange activations between the ranks.
	// The host writes control buffers to every rank and reads outputs from rank 0 (every
	// rank computes them alike: MI ops run after the all-reduce, on replicated data).
	TP int `json:"tp,omitempty"`
}

// ModelConfig is the architecture and serving limits the bundle was compiled for.
type ModelConfig struct {
	Name          string       `json:"name"`
	Family        string       `json:"family"`
	Hidden        int          `json:"hidden"`
	Intermediate  int          `json:"intermediate"`
	Layers        int          `json:"layers"`
	Heads         int          `json:"heads"`
	KVHeads       int          `json:"kv_heads"`
	HeadDim       int          `json:"head_dim"`
	Vocab         int          `json:"vocab"`
	RopeTheta     float64      `json:"rope_theta"`
	RopeScaling   *RopeScaling `json:"rope_scaling,omitempty"`
	RMSEps        float64      `json:"rms_eps"`
	TieEmbeddings bool         `json:"tie_embeddings"`
	QKVBias       bool         `json:"qkv_bias,omitempty"` // q/k/v projection biases (qwen2)
	QKNorm        bool         `json:"qk_norm,omitempty"`  // RMSNorm of each q and k head before RoPE (qwen3)
	WeightDtype   string       `json:"weight_dtype"`       // "bf16" or "f32": how weights sit in memory
	KVDtype       string       `json:"kv_dtype"`
	MaxSeqLen     int          `json:"max_seq_len"`
	MaxSeqs       int          `json:"max_seqs"`      // requests resident at once
	KVBlockSize   int          `json:"kv_block_size"` // tokens per KV-cache page
	KVBlocks      int          `json:"kv_blocks"`     // pages in the pool
	// KVPadPages is how many pages at the end of the pool belong to the padding sequence:
	// the padding rows of a bucket write their K/V there, each to its own slot.
	KVPadPages int `json:"kv_pad_pages,omitempty"`
	// MaxBatchedTokens is the token budget of one step, decode and prompt rows together
	// (vLLM's max_num_batched_tokens); 0 (bundles from before it existed): the largest
	// prefill chunk.
	MaxBatchedTokens int    `json:"max_batched_tokens,omitempty"`
	Tokenizer        string `json:"tokenizer"` // "bytes" or "hf"
	BOS              int    `json:"bos"`
	EOS              []int  `json:"eos"`
	// ChatTemplate is the checkpoint's Jinja chat template (from tokenizer_config.json), with
	// the bos and eos token texts it refers to; empty when the checkpoint has none.
	ChatTemplate string `json:"chat_template,omitempty"`
	ChatBOS      string `json:"chat_bos,omitempty"`
	ChatEOS      string `json:"chat_eos,omitempty"`

	// Experts > 0: each layer's MLP is a mixture of Experts experts of Intermediate columns,
	// TopK routed per token (mixtral).
	Experts int `json:"experts,omitempty"`
	TopK    int `json:"top_k,omitempty"`

	// What Gemma 2 (family gemma2) adds to the Llama forward; zero for the others (see
	// frontend.Model): the MLP's activation ("gelu_tanh": GeGLU), the offset added to every
	// RMSNorm weight (1: (1 + w)), norms on the attention and MLP outputs before their adds,
	// the embedding scale, query_pre_attn_scalar (scores scaled by its inverse square root),
	// the attention and final-logit soft-caps, and the sliding window of the layers marked.
	Activation         string  `json:"activation,omitempty"`
	NormOffset         float64 `json:"norm_offset,omitempty"`
	PostNorms          bool    `json:"post_norms,omitempty"`
	EmbedScale         float32 `json:"embed_scale,omitempty"`
	QueryPreAttnScalar float64 `json:"query_pre_attn_scalar,omitempty"`
	AttnSoftcap        float64 `json:"attn_softcap,omitempty"`
	FinalSoftcap       float64 `json:"final_softcap,omitempty"`
	SlidingWindow      int     `json:"sliding_window,omitempty"`
	SlidingLayers      []bool  `json:"sliding_layers,omitempty"`

	// VectorSlots, in a bundle with per-request vectors, is how many requests may hold them
	// at once: each per-request Vector has a Slots buffer of that many rows, and a request
	// holding slot s has ctl.vslot = s on its rows (ops.NoRow on the others).
	VectorSlots int `json:"vector_slots,omitempty"`
	// Logprobs is how many top tokens a sample may ask logprobs of: the sampler then reads
	// ctl.logprobs ([max_samples] u32: 0, or 1 + the top count) and writes out.logprobs
	// ([max_samples, 1+2*Logprobs] f32: the sampled token's logprob, Logprobs ids, their
	// logprobs). With EOS ids it also reads ctl.eos_ban ([max_samples] u32; not 0: EOS may
	// not be sampled, for min_tokens).
	Logprobs int `json:"logprobs,omitempty"`
}

// RopeScaling is Llama-3's frequency-dependent RoPE scaling.
type RopeScaling struct {
	Type            string  `json:"type"`
	Factor          float64 `json:"factor"`
	LowFreqFactor   float64 `json:"low_freq_factor"`
	HighFreqFactor  float64 `json:"high_freq_factor"`
	OriginalMaxPos  int     `json:"original_max_position_embeddings"`
	AttentionFactor float64 `json:"attention_factor,omitempty"`
}

// WeightsRef says where the weights come from when they are not embedded.
type WeightsRef struct {
	Path      string `json:"path,omitempty"` // safetensors file or HF directory, as given at build
	SHA256    string `json:"sha256,omitempty"`
	Synthetic *Synth `json:"synthetic,omitempty"`
}

// Synth asks the loader to generate deterministic weights (like vLLM's --load-format dummy).
type Synth struct {
	Seed uint64  `json:"seed"`
	Std  float64 `json:"std"`
	// Kernel names the bundle kernel (ops "synth") that generates a matrix on the device.
	Kernel string `json:"kernel,omitempty"`
}

// App is one deployed app: its bit in the per-row app mask, its scalars, its replaceable
// vectors, its after_token latches and its exports.
type App struct {
	Name    string   `json:"name"`
	Bit     int      `json:"bit"`
	Source  string   `json:"source"`
	Scalars []Scalar `json:"scalars"`
	// ScalarTable is the control buffer of [max_seqs+1, TableWidth()] f32 the app's kernels
	// read their scalars from: row s belongs to sequence slot s (row max_seqs to the padding
	// sequence). The host writes a request's row, defaults with its overrides, then the
	// words of its layer masks, when it admits the request. Empty when the app has neither.
	ScalarTable string   `json:"scalar_table,omitempty"`
	Vectors     []Vector `json:"vectors,omitempty"`
	Latches     []Latch  `json:"latches,omitempty"`
	Exports     []Export `json:"exports"`
	// LayerMasks are the app's ops a request may run at fewer of their layers.
	LayerMasks []LayerMask `json:"layer_masks,omitempty"`
	// Fired lists every site (op, layer) of the app; FiredBuffer ([max_tokens, words] u32,
	// KindOutput) holds, per token row with the app's bit, a byte per site the kernels count
	// (rows of 4*words bytes): 1 where the op fired there (changed or read the row), 0 where
	// its conditions left the row alone.
	FiredBuffer string      `json:"fired_buffer,omitempty"`
	Fired       []FiredSite `json:"fired,omitempty"`
}

// FiredSite is one site of an app op: byte Column of FiredBuffer's rows, or -1 for ops the host
// counts itself (custom kernels and logit lenses, which take no conditions: they fire on
// every row with the bit). Samples: the kernel runs on the sampled token rows only (hooks
// logits and sampled, final_norm), so only those rows' words mean anything.
type FiredSite struct {
	Op      int  `json:"op"`
	Layer   int  `json:"layer"`
	Column  int  `json:"column"`
	Samples bool `json:"samples,omitempty"`
}

// LayerMask is one app op whose layers a request may narrow: Words u32 words stored, as
// their bits, in the scalar table's columns from Column; bit l%32 of word Column+l/32 on
// lets the op run at layer l. Layers are the op's compiled layers (a request may only drop
// some); the default row sets every bit.
type LayerMask struct {
	Op     int   `json:"op"`
	Column int   `json:"column"`
	Words  int   `json:"words"`
	Layers []int `json:"layers"`
}

// TableWidth is the width of a row of the app's scalar table: the scalars, then the layer
// masks' words.
func (a App) TableWidth() int {
	n := len(a.Scalars)
	for _, m := range a.LayerMasks {
		n += m.Words
	}
	return n
}

// Scalar is a run-time replaceable scalar of an app, stored at column Index of the app's
// scalar table. Name is what requests override it by, prefixed with the app's name
// ("steer.op0.alpha").
type Scalar struct {
	Name  string  `json:"name"`
	Index int     `json:"index"`
	Value float32 `json:"value"`
	// Scales, for a scalar that multiplies one of the app's vectors (steer_add's alpha),
	// names that vector's buffer, and Limit is ProductLimit of the vector (Residual: the
	// product is added to the residual stream): the loader refuses a value above it, and
	// recomputes it when the vector is replaced.
	Scales   string  `json:"scales,omitempty"`
	Residual bool    `json:"residual,omitempty"`
	Limit    float32 `json:"limit,omitempty"`
}

// Vector is an app param living in a param buffer of [Width] f32, replaceable at run time.
// Unit: the buffer holds the param normalised to unit length (a direction), so a
// replacement must be normalised the same way.
type Vector struct {
	Param  string `json:"param"`
	Buffer string `json:"buffer"`
	Width  int    `json:"width"`
	Unit   bool   `json:"unit,omitempty"`
	// Slots, for a per_request param, is the buffer of [VectorSlots, Width] f32 (KindSlots)
	// that requests bringing their own value write at admission; Buffer holds the default.
	Slots string `json:"slots,omitempty"`
}

// Latch is one after_token condition an app's kernels test: bit Bit of a row's ctl.latch
// word (a control buffer of [max_tokens] u32) is set by the host once a token of Tokens has
// appeared in the request at or before the row's position. Apps with the same token set
// share a bit.
type Latch struct {
	Bit    int   `json:"bit"`
	Tokens []int `json:"tokens"`
}

// Export is a read buffer returned to the caller per row per step.
type Export struct {
	Name   string `json:"name"`
	Buffer string `json:"buffer"` // device buffer of [max_tokens, Width] f32
	Width  int    `json:"width"`
	// Samples: only the token rows that were sampled are written (reads at hook logits).
	Samples bool `json:"samples,omitempty"`
}

// Buffer is a symbolic device buffer that template slots name.
type Buffer struct {
	Name  string     `json:"name"`
	Kind  BufferKind `json:"kind"`
	Dtype string     `json:"dtype"` // f32, bf16, u32
	Shape []int      `json:"shape"`
	// Tensors name the source tensors of a weight or param buffer; several are concatenated
	// along their first dimension (a fused QKV projection is q_proj, k_proj, v_proj).
	Tensors []string `json:"tensors,omitempty"`
	// Shard, only in bundles with TP > 1, cuts the buffer across ranks (Megatron-style).
	Shard *Shard `json:"shard,omitempty"`
}

// Shard says which part of a weight or param buffer's tensors a rank holds. Each source
// tensor is split into TP equal parts along Dim (0: rows, the output features of a
// column-parallel projection, or the elements of a vector; 1: columns, the input features of
// a row-parallel projection); rank r takes part r of each, and those parts are stacked along
// the first dimension in Tensors order. The buffer's Shape is the per-rank shape.
type Shard struct {
	Dim int `json:"dim"`
	// Extents are the unsharded sizes along Dim of the source tensors, in Tensors order,
	// so that a rank finds its part without the tensors (synthetic weights have none).
	Extents []int `json:"extents"`
	// Global names the unsharded buffer whose synthetic values this buffer is cut from, when
	// it is not the buffer's own name (the LM head of a model with tied embeddings is cut
	// from "embed").
	Global string `json:"global,omitempty"`
}

// Collective is a node that exchanges an f32 activation between tensor-parallel ranks
// instead of launching a kernel. In and Out are read and written from offset 0 with row
// strides Cols (In) and Cols for all_reduce_sum, TP*Cols for all_gather_cols (Out).
type Collective struct {
	Op   string `json:"op"`
	In   string `json:"in"`
	Out  string `json:"out"`
	Rows int    `json:"rows"`
	Cols int    `json:"cols"`
}

// Site records where MI ops were placed: for inspect/check output and for tests. Kernel is
// the kernel that runs the op in the first template that has it; a host built in more than
// one form names that one (an add+norm kernel whose vectors preload, name_pv, runs the op in
// templates of 8 rows and more).
type Site struct {
	Layer  int    `json:"layer"` // -1 for whole-model hooks
	Hook   string `json:"hook"`
	App    string `json:"app"`
	Op     int    `json:"op"` // index of the op in its app
	Kernel string `json:"kernel"`
	Fused  bool   `json:"fused"`
	What   string `json:"what"`
}

// BuildInfo records how the bundle was made. It holds no time stamp, so identical inputs
// give byte-identical bundles.
type BuildInfo struct {
	Compiler string        `json:"compiler"`
	Inputs   []InputDigest `json:"inputs"`
	// Fuse names the decode-kernel fusions it was built with (xmixc build --fuse), in pass
	// order.
	Fuse []string `json:"fuse,omitempty"`
	// PDL: the generated kernels may launch early (Kernel.EarlyLaunch; xmixc build --pdl, the default).
	PDL bool `json:"pdl,omitempty"`
	// Prefetch: bytes of each weight row a decode GEMV or a tensor-core GEMM asks L2 for
	// before it waits for the grid ahead (xmixc build --prefetch; 0: none).
	Prefetch int `json:"prefetch,omitempty"`
	// GemvCols: columns per warp of the CUDA-core GEMVs of buckets of 2-7 rows (xmixc build
	// --gemv-cols; 0 or 1: one).
	GemvCols int `json:"gemv_cols,omitempty"`
	// GemvUnroll: K chunks a lane of a CUDA-core GEMV of a bucket of 2-7 rows loads before it
	// uses the first (xmixc build --gemv-unroll; 0 or 1: one).
	GemvUnroll int `json:"gemv_unroll,omitempty"`
	// TCChunks: K chunks each K group of a tensor-core GEMM keeps in flight in buckets of up
	// to 8 rows and of 9-32 rows (xmixc build --tc-chunks; empty: the measured defaults,
	// codegen.DefaultTCChunks).
	TCChunks []int `json:"tc_chunks,omitempty"`
	// AttnWarps and AttnUnroll: warps per block and position loads per warp step of the
	// decode buckets' attention (xmixc build --attn-warps, --attn-unroll; 0: the defaults).
	AttnWarps  int `json:"attn_warps,omitempty"`
	AttnUnroll int `json:"attn_unroll,omitempty"`
	// AttnPrefetch: passes of K and V rows each block of the decode attention asks L2 for
	// before it waits for the grid ahead (xmixc build --attn-prefetch; 0: none; needs PDL).
	AttnPrefetch int `json:"attn_prefetch,omitempty"`
	// AttnPrefetchOneRow: the same for the attention of the decode bucket of one row, where it
	// is more than AttnPrefetch (xmixc build --attn-prefetch-one-row; 0: none, as in bundles
	// built before session 22).
	AttnPrefetchOneRow int `json:"attn_prefetch_one_row,omitempty"`
	// AttnTC: the decode attention's warp step runs on tensor cores where the shape allows
	// (codegen.AttnConfig.TensorCores; the default since session 22, xmixc build
	// --attn-tc=false leaves it out, as in bundles built before).
	AttnTC bool `json:"attn_tc,omitempty"`
	// AttnCluster: the decode buckets whose attention splits fit in one wave of blocks merge
	// a row's splits in a thread-block cluster, not through a workspace in global memory
	// (codegen.AttnConfig.Cluster; xmixc build --attn-cluster, for measuring).
	AttnCluster bool `json:"attn_cluster,omitempty"`
	// AttnEarlyKV: the split decode attention kernels on tensor cores, launched early, load
	// their warps' first K/V tiles before they wait for the grid ahead wherever a tile reads
	// no row's newest position (codegen.AttnConfig.EarlyKV; xmixc build --attn-early-kv, for
	// measuring; needs PDL).
	AttnEarlyKV bool `json:"attn_early_kv,omitempty"`
	// OptionalF32Out: the add+norm kernels (and the embedding's) and the decode attention
	// kernels store their f32 output only where its address is not 0 (attribute
	// out_optional), so a backend that feeds the GEMM after one its bf16 copy may drop the
	// f32 that no node reads (xmixc build --optional-f32-out, for measuring).
	OptionalF32Out bool `json:"optional_f32_out,omitempty"`
	// GemvSplit: the most warps a CUDA-core GEMV splits each column's K over, for weights of
	// few columns (xmixc build --gemv-split; 0 or 1: one warp a column).
	GemvSplit int `json:"gemv_split,omitempty"`
	// GemvWarps: the warps of a CUDA-core GEMV's block (xmixc build --gemv-warps; 0: eight,
	// which bundles built before the setting have).
	GemvWarps int `json:"gemv_warps,omitempty"`
	// TensorCoreRows: the decode bucket size from which GEMMs run on tensor cores (xmixc build
	// --tensor-core-rows; 0: the default, codegen.TensorCoreRows).
	TensorCoreRows int `json:"tensor_core_rows,omitempty"`
	// CopyGemms: the GEMM shapes ("KxN") given copy-engine kernels for the decode buckets
	// those take (xmixc build --copy-gemms; empty: the measured ones; "none" alone: no such
	// kernels). ParseGemmShapes reads it.
	CopyGemms []string `json:"copy_gemms,omitempty"`
	// CopyGemmSlots: the ring slots a copy-engine kernel takes, fewer where fewer fit (xmixc
	// build --copy-gemm-slots; 0: the measured default).
	CopyGemmSlots int `json:"copy_gemm_slots,omitempty"`
	// CopyGemmRows: the decode row counts given copy-engine kernels, each one of the
	// layouts codegen makes (xmixc build --copy-gemm-rows; empty: the measured ones).
	CopyGemmRows []int `json:"copy_gemm_rows,omitempty"`
	// GatedTCRows: tensor-core decode buckets of at most this many rows run the gate/up
	// projection and its activation as one tensor-core kernel, never a library's (xmixc
	// build --gated-tc-rows; 0: none, as in bundles built before it).
	GatedTCRows int `json:"gated_tc_rows,omitempty"`
	// GatedCopyRows: decode buckets of at most this many rows whose GEMMs the warpgroup
	// copy-engine kernels serve get one for the gate/up GEMM and its activation together
	// (GemmCopyAttrs.Act; xmixc build --gated-copy-rows; 0: none).
	GatedCopyRows int `json:"gated_copy_rows,omitempty"`
	// GatedCopyWide: which decode buckets of fewer rows than the smallest wide layout's run
	// that layout's gated kernel over x's rows past theirs, zero-filled: "auto" where it runs
	// more CTAs than the bucket's own or the bucket has none, "all", or "own" (none; "" in
	// bundles built before the setting). codegen.GatedWideModes; xmixc build
	// --gated-copy-wide.
	GatedCopyWide string `json:"gated_copy_wide,omitempty"`
	// MIPreloadCoherent: the row kernels that load their MI ops' vectors and scalars before
	// their wait do so with coherent loads (ld.global), which ptxas keeps ahead of the wait,
	// where it moves most of the read-only ones (ld.global.nc) past it (xmixc build
	// --mi-preload-coherent; false: read-only loads, as in bundles built before the setting).
	MIPreloadCoherent bool `json:"mi_preload_coherent,omitempty"`
	// MIPreloadRegs: those row kernels take at most this many registers a thread (.maxnreg),
	// so that launched early they fit an SM beside the CTA of the GEMM ahead (xmixc build
	// --mi-preload-regs; 0: ptxas's choice, as in bundles built before the setting).
	MIPreloadRegs int `json:"mi_preload_regs,omitempty"`
	// MIPreloadRegsMultiWave: the same bound in templates of more rows than one wave of
	// blocks holds (prefill chunks, the largest decode buckets), so that two blocks fit an SM
	// (xmixc build --mi-preload-regs-multi-wave; 0: MIPreloadRegs's, as in bundles built
	// before the setting).
	MIPreloadRegsMultiWave int `json:"mi_preload_regs_multi_wave,omitempty"`
	// RopeCopyRows: decode buckets of at most this many rows whose q/k/v GEMM the warpgroup
	// copy-engine kernels serve get one for it with the rope_kv after it (GemmCopyAttrs.RopeKV;
	// xmixc build --rope-copy-rows; 0: none, as in bundles built before it).
	RopeCopyRows int `json:"rope_copy_rows,omitempty"`
	// CopyGemmNextAtAsk: the copy-engine kernels let the grid after them launch once each CTA
	// has asked for its last stage of W, not once it has read every stage (xmixc build
	// --copy-gemm-next asked; false: read, as in bundles built before the setting).
	CopyGemmNextAtAsk bool `json:"copy_gemm_next_at_ask,omitempty"`
	// CopyGemmWide: the plain copy-engine kernels of the row counts whose layout has a wide
	// form (64 and 128) take it: a CTA's columns of W as wgmma's B over every row of x, K split
	// over a cluster (xmixc build --copy-gemm-wide; false: 64 columns a CTA, as in bundles
	// built before the setting).
	CopyGemmWide bool `json:"copy_gemm_wide,omitempty"`
	// RopeOneWave: the rope_kv kernels of templates whose grid (a block a row's 16 heads of
	// 128 dims, three a row on Llama-3.1-8B) would take more than one wave of the card share
	// each row's heads among fewer blocks, every thread rotating more heads, with the same
	// results (xmixc build --rope-one-wave, the default; false: as bundles built before it).
	RopeOneWave bool `json:"rope_one_wave,omitempty"`
	// RopeInAttention: the decode buckets whose attention runs one block a row on tensor cores
	// (Llama-class shapes from 128 rows) leave the q/k/v rotation and the KV-cache write to it,
	// with rope_kv's bits and without its launch (xmixc build --rope-in-attention, the
	// default; false: as bundles built before it).
	RopeInAttention bool `json:"rope_in_attention,omitempty"`
}

// InputDigest is the hash of one input file of the build.
type InputDigest struct {
	Path   string `json:"path"`
	SHA256 string `json:"sha256"`
}

// Kernel is one PTX module with one entry, its parameter layout and reference op.
type Kernel struct {
	Name   string          `json:"name"`
	PTX    string          `json:"ptx"`
	Params []Param         `json:"params"`
	Op     string          `json:"op"`
	Attrs  json.RawMessage `json:"attrs"`
	// EarlyLaunch: the kernel waits for the grid ahead of it to end (PriorGridWait) before it
	// touches memory, so a backend may launch it while that grid still runs (Hopper's
	// programmatic dependent launch; xmixc build --pdl).
	EarlyLaunch bool `json:"early_launch,omitempty"`
}

// Param is one kernel parameter: Type is a PTX type name (u64 for pointers, u32, f32).
type Param struct {
	Name string `json:"name"`
	Type string `json:"type"`
}

// Template is the ordered node list for one bucket: Tokens rows in, Samples rows sampled.
type Template struct {
	Name    string       `json:"name"`
	Kind    TemplateKind `json:"kind"`
	Tokens  int          `json:"tokens"`
	Samples int          `json:"samples"`
	Nodes   []Node       `json:"nodes"`
	// Plain, in a bundle with apps, is the same bucket compiled without them. A row that
	// enables no app gets exactly what Plain computes, so a backend may run Plain instead of
	// Nodes for a step in which no row enables an app (ctl.any_mask == 0).
	Plain []Node `json:"plain,omitempty"`
	// Solo, in a bundle of two to passes.MaxSoloApps apps, is the same bucket compiled with
	// each app's ops alone, one entry an app (passes' app-solo). A row kernel that hosts ops
	// of several apps is compiled with all of them, so Nodes makes every row pay for every
	// deployed app's ops; a row that enables one app gets from its Solo nodes what Nodes
	// computes for it, so a backend may run them for a step in which every row that enables
	// an app enables that one (ctl.any_mask == 1<<Bit).
	Solo []AppNodes `json:"solo,omitempty"`
	// AttnSplit, when set, says that the template's attention splits each row's context over
	// up to MaxSplits blocks, and how the host picks the split for a step.
	AttnSplit *AttnSplit `json:"attn_split,omitempty"`
}

// AppNodes is a template's nodes compiled with one app's ops alone (Template.Solo): the app
// of bit Bit.
type AppNodes struct {
	Bit   int    `json:"bit"`
	Nodes []Node `json:"nodes"`
}

// NodeLists are every node list of t: Nodes, then Plain and each Solo list where t has
// them. Whatever a build or a backend decides per GEMM shape or kernel must cover them all.
func (t *Template) NodeLists() [][]Node {
	lists := [][]Node{t.Nodes}
	if len(t.Plain) > 0 {
		lists = append(lists, t.Plain)
	}
	for _, s := range t.Solo {
		lists = append(lists, s.Nodes)
	}
	return lists
}

// ListFor is the index in NodeLists of the list a step runs when its rows' app masks OR to
// anyMask: Plain when no row enables an app, an app's Solo list when the rows enable that
// app alone, else Nodes (0).
func (t *Template) ListFor(anyMask uint32) int {
	next := 1
	if len(t.Plain) > 0 {
		if anyMask == 0 {
			return 1
		}
		next = 2
	}
	for i, s := range t.Solo {
		if anyMask == 1<<uint(s.Bit) {
			return next + i
		}
	}
	return 0
}

// AttnSplit is a decode template's run-time context split (codegen/attention.go): before
// each step the host writes Chunk(the step's longest context, its rows) to the u32 control
// word Buffer; a row of context n then runs in ceil(n/chunk) blocks, and the graph never
// changes.
type AttnSplit struct {
	Buffer    string `json:"buffer"`
	MaxSplits int    `json:"max_splits"`
	// MinChunk is the fewest positions a split gets: contexts up to it never split.
	MinChunk int `json:"min_chunk"`
	// Step is what chunks are multiples of: the positions a block covers in one pass.
	Step int `json:"step"`
	// RowBlocks is how many blocks one split of a row takes (its query head groups),
	// WaveBlocks how many blocks of the kernel the GPU holds at once.
	RowBlocks  int `json:"row_blocks"`
	WaveBlocks int `json:"wave_blocks"`
}

// Chunk is the positions per split for a step of rows rows whose longest context is maxN.
// Blocks of one kernel run in waves of WaveBlocks, and a wave lasts as long as its longest
// block, so of the split counts the grid allows Chunk takes the one whose waves end first:
// waves times (chunk + merge), the fewer splits on a tie. The merge, what a context that
// splits pays over one that does not (the split's partial state written and combined),
// counts as 2*MinChunk positions: on the H200 a split of Llama-3.1-8B's context of 80 in
// two cost more than the one split's second pass of 64 positions (batch 1: 4.317 against
// 4.288 ms a step; batch 8: 4.835 against 4.760), while at 576 and 2112 the splits this
// picks were the fastest of 1, 2, 4 and 8 or within 0.1% of them (testsuite/gpu/RESULTS.md,
// "The decode attention's split plan"). Batch 32 of a model with 8 head groups at context
// 2112, on a GPU holding 528 blocks: 2 splits of 1056 (512 blocks, one wave), where the
// grid's 3 would take two waves of 704 (768 blocks).
func (a *AttnSplit) Chunk(maxN, rows int) int {
	maxN, rows = max(maxN, 1), max(rows, 1)
	best, bestCost := 0, 0
	for s := 1; s <= a.MaxSplits; s++ {
		c := max(a.MinChunk, a.SplitChunk(maxN, s))
		used := (maxN + c - 1) / c
		waves := (rows*a.RowBlocks*used + a.WaveBlocks - 1) / a.WaveBlocks
		merge := 0
		if used > 1 {
			merge = 2 * a.MinChunk
		}
		if cost := waves * (c + merge); best == 0 || cost < bestCost {
			best, bestCost = c, cost
		}
	}
	return best
}

// SplitChunk is the positions per split of a context of maxN positions cut into splits
// splits, in whole passes of a block (Step).
func (a *AttnSplit) SplitChunk(maxN, splits int) int {
	return ceilTo((max(maxN, 1)+splits-1)/splits, a.Step)
}

func ceilTo(n, m int) int { return (n + m - 1) / m * m }

// Node is one kernel launch in a template, or (Collective set, Kernel empty, no launch
// dimensions and no Args) one exchange between tensor-parallel ranks.
type Node struct {
	Label      string      `json:"label"`
	Kernel     string      `json:"kernel"`
	Grid       [3]int      `json:"grid"`
	Block      [3]int      `json:"block"`
	Shared     int         `json:"shared"`
	Args       []Slot      `json:"args"`
	Collective *Collective `json:"collective,omitempty"`
	// SkipUnless, when not zero, marks a heavy node that does nothing unless some row of the
	// step enables an app whose bit is in it (ctl.any_mask & SkipUnless != 0; the kernel
	// checks that itself and exits early). A backend may leave the node out of the step
	// then: the CUDA backend replays a graph captured without it, so a deployed but unused
	// heavy app costs not even a launch.
	SkipUnless uint32 `json:"skip_unless,omitempty"`
}

// Slot binds one kernel parameter: a buffer (plus byte offset) or a constant's bits.
type Slot struct {
	Buffer string `json:"buffer,omitempty"`
	Offset int64  `json:"offset,omitempty"`
	Const  uint64 `json:"const,omitempty"`
}
