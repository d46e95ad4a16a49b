package bundle

import (
	"encoding/json"
	"fmt"
	"slices"
)

// The run-time ABI: every name and number that the generated kernels, the compiler and the
// runtime share. The compiler writes them into templates and buffers, the backends and the
// engine read them; nothing outside this file spells them.

// BufferKind says who writes a buffer and when (Buffer.Kind).
type BufferKind string

// Buffer kinds.
const (
	KindWeight     BufferKind = "weight"     // model weight, loaded from Tensors of the weights file
	KindActivation BufferKind = "activation" // scratch written and read within a step
	KindKV         BufferKind = "kv"         // KV-cache pool
	KindControl    BufferKind = "control"    // written by the host before each step
	KindOutput     BufferKind = "output"     // written by kernels, read by the host after each step
	KindParam      BufferKind = "param"      // initialised from Tensors of the bundle's Params section
	// KindSlots buffers hold per-request values the host writes when it admits a request
	// (per-request vector slots); zero at load, read by kernels, never by the host.
	KindSlots BufferKind = "slots"
)

// Programmatic dependent launch (Kernel.EarlyLaunch): a kernel built for it begins with
// PriorGridLaunch, which lets the grid after it launch at once, then PriorGridWait, which
// holds it until the grid ahead has ended and its writes are visible.
const (
	PriorGridLaunch = "griddepcontrol.launch_dependents"
	PriorGridWait   = "griddepcontrol.wait"
)

// TemplateKind says which steps a template serves (Template.Kind).
type TemplateKind string

// Template kinds.
const (
	Decode  TemplateKind = "decode"  // one row per running sequence, each sampled
	Prefill TemplateKind = "prefill" // prompt chunks, with the decode rows of the step
)

// The control block: buffers of kind control that the host writes before each step. Per
// token row ([max_tokens] u32 unless said otherwise):
const (
	CtlTokens = "ctl.tokens" // the row's token
	CtlPos    = "ctl.pos"    // its position in its sequence
	CtlSeq    = "ctl.seq"    // its sequence slot (max_seqs: the padding sequence)
	CtlMask   = "ctl.mask"   // its app mask: bit App.Bit set when the row's request enables the app
	CtlGen    = "ctl.gen"    // the generation step as int32; -1 on prompt rows
	CtlOutRow = "ctl.out_row"
	CtlLatch  = "ctl.latch" // after_token latch bits (Latch), in bundles with latches
	CtlVSlot  = "ctl.vslot" // the request's vector slot (NoRow: none), with per-request vectors
)

// Per sample ([max_samples]):
const (
	CtlTemperature = "ctl.temperature" // f32; <= 0 is greedy
	CtlTopP        = "ctl.top_p"       // f32
	CtlRNG         = "ctl.rng"         // u32 random bits of the sample's draw
	CtlSRow        = "ctl.s_row"       // u32: the sample's token row, NoRow for unused samples
	CtlLogprobs    = "ctl.logprobs"    // u32: 0, or 1 + how many top logprobs (ModelConfig.Logprobs)
	CtlEOSBan      = "ctl.eos_ban"     // u32: not 0 while EOS may not be sampled (min_tokens)
)

// One word per step, and the page table:
const (
	// CtlAnyMask is the OR of the step's app masks ([1] u32), in bundles with apps: heavy
	// nodes (Node.SkipUnless) exit when it lacks their bits, a step with none runs
	// Template.Plain, and one with a single app's bit may run that app's Template.Solo.
	CtlAnyMask = "ctl.any_mask"
	// CtlAttnChunk is a split decode attention's positions per split ([1] u32, AttnSplit).
	CtlAttnChunk = "ctl.attn_chunk"
	// KVBlockTable maps each sequence slot's positions to KV pages ([max_seqs+1, pages] u32).
	KVBlockTable = "kv.block_table"
)

// Buffers the host reads after a step:
const (
	OutSampled  = "out.sampled"  // [max_samples] u32: each sample's token (NonFinite: none)
	OutLogprobs = "out.logprobs" // [max_samples, 1+2*Logprobs] f32 (ModelConfig.Logprobs)
	ActLogits   = "act.logits"   // [max_samples, vocab] f32, as the sampler saw them (tests and tools)
)

// Sentinels in u32 control and output words.
const (
	// NoRow marks a row that is not there: an unused sample (ctl.s_row), a row whose norm
	// nobody reads (ctl.out_row), a request without a vector slot (ctl.vslot).
	NoRow = 0xFFFFFFFF
	// NonFinite is the sampler's answer for a sample whose logits are not all finite (a NaN
	// or an infinity: the forward overflowed, or an app wrote one): no token, which the
	// engine reports as the request's end. It is above any vocabulary (at most 2^24 ids).
	NonFinite = 0xFFFFFFFE
)

// Collective operations (Collective.Op).
const (
	// AllReduceSum replaces In ([Rows, Cols] f32, In == Out) on every rank by the sum over
	// ranks, added in rank order so that every rank and every run gets the same bits.
	AllReduceSum = "all_reduce_sum"
	// AllGatherCols writes Out[row, r*Cols+c] = In of rank r [row, c] on every rank: the
	// vocab-parallel LM head's column shards assembled into whole logits rows.
	AllGatherCols = "all_gather_cols"
)

// OpGemmTC is the reference op of the tensor-core GEMM kernels (y[M,N] = x[M,K] · w[N,K]^T,
// x and y f32, w bf16). A node whose kernel has it is a GEMM node (GemmOf): a backend may
// serve it with a library GEMM instead of the kernel.
const OpGemmTC = "gemm_tc"

// GemmTCAttrs are the attributes of an OpGemmTC kernel. Guard != 0 makes it a heavy app's
// GEMM: it takes ctl.any_mask as its last parameter and does nothing unless that has a bit
// of Guard.
type GemmTCAttrs struct {
	K     int    `json:"k"`
	N     int    `json:"n"`
	Guard uint32 `json:"guard,omitempty"`
}

// The operand roles of a GEMM kernel: its parameters by name.
const (
	GemmX    = "x"    // [M,K] f32
	GemmW    = "w"    // [N,K] bf16
	GemmY    = "y"    // [M,N] f32
	GemmRows = "rows" // M, a u32 constant
)

// GEMM is a GEMM node as a backend serves it: Y[M,N] = X[M,K] · W[N,K]^T, X, W and Y
// indexing the node's Args.
type GEMM struct {
	M, N, K int
	X, W, Y int
	Guard   uint32
}

// The attributes the ABI's readers decode, each type's memo (attrs.go).
var (
	gemmTCAttrs   attrsMemo[GemmTCAttrs]
	bf16CopyAttrs attrsMemo[struct {
		Gather      bool   `json:"gather"`
		Rows        string `json:"rows"`
		Splits      int    `json:"splits"`
		OutOptional bool   `json:"out_optional"`
	}]
	gatedActAttrs attrsMemo[struct {
		Inter   int             `json:"inter"`
		Chunked bool            `json:"chunked"`
		Ops     json.RawMessage `json:"ops"`
	}]
	ropeKVAttrs attrsMemo[struct {
		KVShape
		Bias   bool `json:"bias"`
		QKNorm bool `json:"qk_norm"`
	}]
)

// GemmOf reads node n, whose kernel is k, as a GEMM: ok is false when k is not an OpGemmTC
// kernel, and an error says how a node that claims to be one is malformed.
func GemmOf(n Node, k Kernel) (g GEMM, ok bool, err error) {
	if k.Op != OpGemmTC {
		return GEMM{}, false, nil
	}
	a, err := gemmTCAttrs.decode(k.Attrs)
	if err != nil || a.K <= 0 || a.N <= 0 {
		return GEMM{}, false, fmt.Errorf("node %s: kernel %s: GEMM attributes %s: want positive k and n", n.Label, k.Name, k.Attrs)
	}
	g = GEMM{N: a.N, K: a.K, Guard: a.Guard, X: -1, W: -1, Y: -1}
	rows := -1
	for i, p := range k.Params {
		switch p.Name {
		case GemmX:
			g.X = i
		case GemmW:
			g.W = i
		case GemmY:
			g.Y = i
		case GemmRows:
			rows = i
		}
	}
	if g.X < 0 || g.W < 0 || g.Y < 0 || rows < 0 || len(n.Args) != len(k.Params) || n.Args[rows].Buffer != "" {
		return GEMM{}, false, fmt.Errorf("node %s: kernel %s: a GEMM needs parameters x, w, y and a constant rows", n.Label, k.Name)
	}
	g.M = int(uint32(n.Args[rows].Const))
	return g, true, nil
}

// OpGemmCopy is the reference op of the copy-engine GEMM: y[M,N] = bf16(x)[M,K] · w[N,K]^T,
// x and y f32, w bf16, f32 sums: x rounded to bf16 as a library GEMM's cast rounds it. No
// node names such a kernel. A bundle carries one beside its GEMM nodes' own kernels for each
// GEMM shape where it beats the library inside a decode step (codegen/gemm_copy.go), and a
// backend that serves GEMM nodes with a library may serve a node of the same K and N and at
// most Rows rows with it instead. Its parameters are GemmXMap, GemmWMap, GemmY and GemmRows.
const OpGemmCopy = "gemm_copy"

// GemmYBF16 is the parameter of a copy-engine GEMM with YBF16: the device address of a
// [M, width of y] bf16 copy of y, or 0 for none.
const GemmYBF16 = "y_bf16"

// GemmWMap is the copy-engine GEMM's w parameter: a tensor map of W ([N,K] bf16, K
// innermost) with boxes of Box[0] elements of K by Box[1] rows, laid out in shared memory
// with the attributes' Swizzle (0: dense; 128: the 128-byte swizzle, box rows of 128 bytes),
// TensorMapBytes passed by value (type TensorMapParam), which the backend encodes for the
// node's W (on the GPU the driver's encoding, cuTensorMapEncodeTiled; the emulator takes the
// address of its own).
const GemmWMap = "w_map"

// GemmXMap is the copy-engine GEMM's x parameter: a tensor map of x ([M,K] f32, K innermost;
// with the attributes' XBF16, of bf16(x) as a library GEMM's cast writes it) with boxes of
// XBox[0] elements of K by XBox[1] rows, under the attributes' XSwizzle as GemmWMap is under
// Swizzle, rows past M read as zeros; passed as GemmWMap is.
const GemmXMap = "x_map"

// TensorMapBytes is a tensor map's size, and TensorMapParam the type of a parameter that
// carries one by value (`.param .align 64 .b8 name[128]`).
const (
	TensorMapBytes = 128
	TensorMapParam = "b8[128]"
)

// GemmCopyAttrs are the attributes of an OpGemmCopy kernel, with the launch it needs: Grid
// CTAs along x in clusters of Cluster (declared by the kernel), Block threads, Shared bytes
// of dynamic shared memory (past the 48 KiB a launch gets without asking: a backend raises
// the kernel's limit to it).
type GemmCopyAttrs struct {
	K       int    `json:"k"`
	N       int    `json:"n"`
	Rows    int    `json:"rows"`
	Box     [2]int `json:"box"`
	Swizzle int    `json:"swizzle"`
	XBox    [2]int `json:"x_box"`
	// XBF16: the kernel reads bf16(x), which the backend casts x to first, not x itself.
	XBF16    bool `json:"x_bf16,omitempty"`
	XSwizzle int  `json:"x_swizzle,omitempty"`
	Grid     int  `json:"grid"`
	Cluster  int  `json:"cluster"`
	Block    int  `json:"block"`
	Shared   int  `json:"shared"`
	// Act, when set, is one of GatedActOps: the kernel serves a GEMM node and the gated
	// activation node after it (GatedPairAt) as one launch. W's N rows are gate's N/2 then
	// up's, each CTA asks for a box of Box[1] gate rows and the same rows of up, and y is
	// the activation, act(gate) * up, [M, N/2]; the GEMM's own y is never written.
	Act string `json:"act,omitempty"`
	// Tiles: each CTA takes this many column tiles one after another (0: one).
	Tiles int `json:"tiles,omitempty"`
	// YBF16 (with Act): the kernel's parameter after rows, GemmYBF16, is where it also writes
	// bf16(y), rounded to nearest even as the backend's cast rounds it, unless it is 0: the
	// x of a copy-engine GEMM with XBF16 right after it, which then needs no cast. y may then
	// be 0 too, where nothing else reads it: the kernel writes bf16(y) alone.
	YBF16 bool `json:"y_bf16,omitempty"`
	// RopeKV, when set, says that the kernel serves a q/k/v GEMM node and the rope_kv node
	// after it (RopePairAt) as one launch: each CTA asks for boxes of Box[1] rows of heads'
	// first halves and the same rows of their second, rotates its q and k heads in y and
	// writes its k and v heads to the paged cache, as rope_kv does; its parameters go on with
	// RopeKVParams.
	RopeKV *KVShape `json:"rope_kv,omitempty"`
	// Wide, when not 0, is the kernel's output columns a CTA in the wide form (codegen
	// gemm_wide.go): each CTA reads x once whatever its rows, so that a bucket of fewer rows
	// costs it only x's rows past M, which the copy engine fills with zeros.
	Wide int `json:"wide,omitempty"`
}

// KVShape is a q/k/v row and the paged KV cache that a rope_kv node writes and an attention
// node reads (the fields of those ops' attributes, ops.KVAttrs): a row holds Heads query
// heads, then KVHeads key heads, then KVHeads value heads of HeadDim values each; the caches
// are [blocks, BlockSize, KVHeads, HeadDim] in KVDtype, a sequence's pages listed in up to
// MaxBlocksPerSeq entries of the block table.
type KVShape struct {
	Heads           int    `json:"heads"`
	KVHeads         int    `json:"kv_heads"`
	HeadDim         int    `json:"head_dim"`
	BlockSize       int    `json:"block_size"`
	MaxBlocksPerSeq int    `json:"max_blocks_per_seq"`
	KVDtype         string `json:"kv_dtype"`
}

// OpRopeKV is the reference op that rotates a q/k/v row's q and k heads and writes its k and
// v heads to the paged KV cache; its parameters are "qkv" and then RopeKVParams.
const OpRopeKV = "rope_kv"

// RopeKVParams are the parameters of a rope_kv kernel after its qkv, and of a copy-engine
// GEMM with RopeKV after its own four: the cos and sin tables, the rows' positions and
// sequence slots, the block table and the two caches.
var RopeKVParams = []Param{{"cos", "u64"}, {"sin", "u64"}, {"pos", "u64"}, {"seq", "u64"}, {"block_table", "u64"}, {"kcache", "u64"}, {"vcache", "u64"}}

// ropeCopyHalf is what half a head's rows of W must be a multiple of for a copy-engine GEMM
// with RopeKV: the swapped form asks for them in boxes of 32 rows.
const ropeCopyHalf = 32

// GemmCopyShape is what a copy-engine GEMM serves: a GEMM node of K and N, and with Act the
// gated activation after it.
type GemmCopyShape struct {
	K, N int
	Act  string
}

// GemmCopyKernels indexes a bundle's copy-engine GEMMs by shape, fewest rows first,
// checking each kernel's attributes and parameters: a malformed one is an error naming it.
func GemmCopyKernels(kernels []Kernel) (map[GemmCopyShape][]GemmCopy, error) {
	out := map[GemmCopyShape][]GemmCopy{}
	for _, k := range kernels {
		if k.Op != OpGemmCopy {
			continue
		}
		var a GemmCopyAttrs
		if err := json.Unmarshal(k.Attrs, &a); err != nil {
			return nil, fmt.Errorf("kernel %s: copy-engine GEMM attributes %s: %w", k.Name, k.Attrs, err)
		}
		if a.K <= 0 || a.N <= 0 || a.Rows <= 0 || a.Box[0] <= 0 || a.Box[1] <= 0 || a.XBox[0] <= 0 || a.XBox[1] <= 0 || a.XBox[1]*a.Cluster < a.Rows || a.Grid <= 0 || a.Cluster <= 0 ||
			a.Grid%a.Cluster != 0 || a.Block <= 0 || a.Block > 1024 || a.Shared < 0 || a.Shared > MaxDynamicShared || a.Tiles < 0 {
			return nil, fmt.Errorf("kernel %s: copy-engine GEMM attributes %s: want positive k, n, rows, box, x_box (of at least rows rows over the cluster's CTAs), grid (a multiple of cluster), block (at most 1024), shared (at most %d) and tiles not negative", k.Name, k.Attrs, MaxDynamicShared)
		}
		if a.Swizzle != 0 && (a.Swizzle != 128 || 2*a.Box[0] != a.Swizzle) {
			return nil, fmt.Errorf("kernel %s: copy-engine GEMM attributes %s: swizzle %d over box rows of %d bytes: want 0, or 128 over rows of 128 bytes", k.Name, k.Attrs, a.Swizzle, 2*a.Box[0])
		}
		xElem := 4
		if a.XBF16 {
			xElem = 2
		}
		if a.XSwizzle != 0 && (a.XSwizzle != 128 || xElem*a.XBox[0] != a.XSwizzle) {
			return nil, fmt.Errorf("kernel %s: copy-engine GEMM attributes %s: x swizzle %d over box rows of %d bytes: want 0, or 128 over rows of 128 bytes", k.Name, k.Attrs, a.XSwizzle, xElem*a.XBox[0])
		}
		if a.Act != "" && (!slices.Contains(GatedActOps, a.Act) || a.N%2 != 0) {
			return nil, fmt.Errorf("kernel %s: copy-engine GEMM attributes %s: activation %q over %d columns: want one of %v over an even width", k.Name, k.Attrs, a.Act, a.N, GatedActOps)
		}
		want := []Param{{GemmXMap, TensorMapParam}, {GemmWMap, TensorMapParam}, {GemmY, "u64"}, {GemmRows, "u32"}}
		if a.YBF16 {
			if a.Act == "" {
				return nil, fmt.Errorf("kernel %s: copy-engine GEMM attributes %s: y_bf16 without an activation", k.Name, k.Attrs)
			}
			want = append(want, Param{GemmYBF16, "u64"})
		}
		key := GemmCopyShape{K: a.K, N: a.N, Act: a.Act}
		if r := a.RopeKV; r != nil {
			if err := r.checkCopy(a); err != nil {
				return nil, fmt.Errorf("kernel %s: copy-engine GEMM attributes %s: %w", k.Name, k.Attrs, err)
			}
			want = append(want, RopeKVParams...)
			key.Act = OpRopeKV
		}
		if !slices.Equal(k.Params, want) {
			return nil, fmt.Errorf("kernel %s: a copy-engine GEMM takes parameters %v, not %v", k.Name, want, k.Params)
		}
		if slices.ContainsFunc(out[key], func(c GemmCopy) bool { return c.Attrs.Rows == a.Rows }) {
			return nil, fmt.Errorf("kernel %s: a second copy-engine GEMM for k %d, n %d%s, %d rows", k.Name, a.K, a.N, actNote(a.Act), a.Rows)
		}
		out[key] = append(out[key], GemmCopy{Kernel: k.Name, Attrs: a})
	}
	for _, ks := range out {
		slices.SortFunc(ks, func(x, y GemmCopy) int { return x.Attrs.Rows - y.Attrs.Rows })
	}
	return out, nil
}

// checkCopy checks r as the rope of copy-engine GEMM a: no activation, N the q/k/v row's
// width, a head's half of whole W boxes (Box[1] rows each, a multiple of 8 so that boxes
// stack under the swizzle), a KV block of positive size.
func (r *KVShape) checkCopy(a GemmCopyAttrs) error {
	if a.Act != "" || r.Heads <= 0 || r.KVHeads <= 0 || r.Heads%r.KVHeads != 0 || r.HeadDim%(2*ropeCopyHalf) != 0 || a.N != (r.Heads+2*r.KVHeads)*r.HeadDim ||
		a.Box[1]%8 != 0 || r.HeadDim/2%a.Box[1] != 0 || r.BlockSize <= 0 || r.MaxBlocksPerSeq <= 0 || (r.KVDtype != "bf16" && r.KVDtype != "f32") {
		return fmt.Errorf("rope_kv %+v: want no activation, heads a positive multiple of kv_heads, head_dim a multiple of %d, n = (heads + 2*kv_heads)*head_dim, box rows a multiple of 8 dividing head_dim/2, a positive KV block size and blocks, kv_dtype bf16 or f32",
			*r, 2*ropeCopyHalf)
	}
	return nil
}

// GemmCopyFor is the copy-engine GEMM of kernels (one shape's, fewest rows first) that takes
// m rows with the fewest rows, or false if none takes that many.
func GemmCopyFor(kernels []GemmCopy, m int) (GemmCopy, bool) {
	for _, c := range kernels {
		if m <= c.Attrs.Rows {
			return c, true
		}
	}
	return GemmCopy{}, false
}

// GatedCopyFor is the gated copy-engine GEMM of kernels (one shape's with one activation,
// fewest rows first) that serves a GEMM and its gated activation of m rows: the one of the
// fewest rows that takes m, but unlike the rope pairs' not one of twice m rows or more unless
// it is in the wide form. The 32-row kernel made the 8B's 16-row step 1.4-1.7% longer than
// cuBLASLt's gate/up and the SiLU kernel (testsuite/gpu/RESULTS.md, session 50): each of its
// 448 column tiles reads x again, twice the bytes for half the rows. A wide kernel reads x
// once a CTA, so a bucket of fewer rows costs it little more than x's zero-filled rows; where
// a build carries one for fewer rows than the bucket's, it serves. The loader serves by it,
// and the compiler leaves a bucket's gate/up to it (codegen's gatedCopyServes).
func GatedCopyFor(kernels []GemmCopy, m int) (GemmCopy, bool) {
	c, ok := GemmCopyFor(kernels, m)
	return c, ok && (2*m > c.Attrs.Rows || c.Attrs.Wide > 0)
}

// actNote names an activation in a message ("" for none).
func actNote(act string) string {
	if act == "" {
		return ""
	}
	return " with " + act
}

// GatedActOps are the reference ops of the gated-MLP activation kernels, act(gate) * up
// over the two halves of each row of gu (ops.GatedActivations, which checks at init that it
// has these).
var GatedActOps = []string{"silu_mul", "gelu_tanh_mul"}

// The parameters of a gated activation kernel that carries no MI ops (its attributes'
// "chunked"): gu, [rows, 2*Inter] f32, act, [rows, Inter] f32, GatedActBF16 and GatedGuBF16;
// its grid's y is the rows.
var gatedActParams = []Param{{"gu", "u64"}, {"act", "u64"}, {GatedActBF16, "u64"}, {GatedGuBF16, "u64"}}

// NormOutBF16 is the parameter after out of an add+norm kernel (op row_norm) that does not
// gather its rows, and AttnZBF16 the one after z of a decode attention kernel (op attention,
// not the prefill kernel over runs of rows): the device address of a bf16 copy of that
// output, or 0 for none. A bundle's node passes the constant 0 in them and in GatedActBF16
// (Verify checks it): only a backend that serves the GEMM after the node from the copy with
// no cast passes its scratch there.
const (
	NormOutBF16 = "out_bf16"
	AttnZBF16   = "z_bf16"
)

// BF16Copy is a node that can also write a bf16 copy of its f32 output [Rows, width], as
// BF16CopyOf reads it: the output, its rows, and which of the node's arguments are the
// output and the copy's address. Droppable: the output may be 0, the copy alone (the gated
// activation, and an add+norm built with BuildInfo.OptionalF32Out: attribute out_optional).
type BF16Copy struct {
	Out             Slot
	Rows            int
	OutArg, CopyArg int
	Droppable       bool
}

// BF16CopyOf reads node n (kernel k) as a node that can write a bf16 copy of its output and
// passes the constant 0 for it: a gated activation without MI ops (GatedActOf, GatedActBF16),
// an add+norm that does not gather (NormOutBF16), or a decode attention over every row
// (AttnZBF16; not the prefill step's kernels, which write z's rows between them). ok is false
// for any other node.
func BF16CopyOf(n Node, k Kernel) (BF16Copy, bool) {
	if a, ok := GatedActOf(n, k); ok {
		return BF16Copy{Out: a.Act, Rows: a.Rows, OutArg: 1, CopyArg: 2, Droppable: true}, true
	}
	if k.Op != OpRowNorm && k.Op != OpAttention {
		return BF16Copy{}, false
	}
	a, err := bf16CopyAttrs.decode(k.Attrs)
	var out, copyName string
	switch {
	case err != nil || len(n.Args) != len(k.Params):
		return BF16Copy{}, false
	case k.Op == OpRowNorm && !a.Gather:
		out, copyName = "out", NormOutBF16
	case k.Op == OpAttention && a.Rows == "":
		out, copyName = "z", AttnZBF16
	default:
		return BF16Copy{}, false
	}
	o := slices.IndexFunc(k.Params, func(p Param) bool { return p.Name == out })
	rows := n.Grid[0] / max(a.Splits, 1)
	if o < 0 || o+1 >= len(k.Params) || k.Params[o+1] != (Param{copyName, "u64"}) || n.Args[o].Buffer == "" || n.Args[o+1] != (Slot{}) || rows < 1 {
		return BF16Copy{}, false
	}
	return BF16Copy{Out: n.Args[o], Rows: rows, OutArg: o, CopyArg: o + 1, Droppable: a.OutOptional}, true
}

// backendParams are the parameters a bundle passes 0 and a backend may point at bf16 data
// of its own: BF16CopyOf's copies and GatedGuBF16.
var backendParams = []string{GatedActBF16, NormOutBF16, AttnZBF16, GatedGuBF16}

// OpAttention is the reference op of the attention kernels: ops.AttnAttrs.
const OpAttention = "attention"

// OpRowNorm is the reference op of the residual add + RMSNorm kernels (and the embedding
// lookup with layer 0's norm): ops.RowNormAttrs.
const OpRowNorm = "row_norm"

// GatedActBF16 is the last parameter of a gated activation kernel without MI ops: the device
// address of a [rows, Inter] bf16 copy of act, or 0 for none; with it act may be 0 (the copy
// alone). A bundle's node passes the constant 0: only a backend that serves the GEMM after
// the activation from bf16(act) with no cast passes its scratch there.
const GatedActBF16 = "act_bf16"

// GatedGuBF16 is the last parameter of a gated activation kernel without MI ops: the device
// address of its input gu as bf16, [rows, 2*Inter], or 0 for none, when the kernel reads gu.
// A bundle's node passes the constant 0: only a backend whose GEMM ahead writes gu in bf16
// for this kernel alone (cuBLASLt, where bundle.GatedPairAt holds) passes its address there.
const GatedGuBF16 = "gu_bf16"

// GatedGuBF16Arg is GatedGuBF16's place among a gated activation's arguments (GatedActOf).
const GatedGuBF16Arg = 3

// GatedAct is a gated activation node as GatedActOf reads it.
type GatedAct struct {
	Op          string
	Inter, Rows int
	GU, Act     Slot
}

// GatedActOf reads node n (kernel k) as a gated activation with no MI ops (an app's op at
// mlp.act lives in another form of the kernel, which no backend folds away); ok is false for
// any other node.
func GatedActOf(n Node, k Kernel) (GatedAct, bool) {
	if !slices.Contains(GatedActOps, k.Op) {
		return GatedAct{}, false
	}
	a, err := gatedActAttrs.decode(k.Attrs)
	if err != nil || !a.Chunked || len(a.Ops) > 0 || a.Inter <= 0 ||
		!slices.Equal(k.Params, gatedActParams) || len(n.Args) != len(gatedActParams) || n.Args[0].Buffer == "" || n.Args[1].Buffer == "" ||
		n.Args[2] != (Slot{}) || n.Args[GatedGuBF16Arg] != (Slot{}) || n.Grid[1] < 1 {
		return GatedAct{}, false
	}
	return GatedAct{Op: k.Op, Inter: a.Inter, Rows: n.Grid[1], GU: n.Args[0], Act: n.Args[1]}, true
}

// GatedPairAt says whether nodes[i] and nodes[i+1] (kernels by name from kernel) are a GEMM
// and the gated activation of its y, which a copy-engine GEMM with Act may serve as one
// launch: y is gu, the same buffer and offset; the GEMM's N is twice the activation's width
// and its rows are the activation's; neither is a heavy app's (no guard, no skip); and no
// node of the list but such GEMMs and activations names gu's buffer, so that no one reads the
// y that the one launch never writes. An error says how a node that claims to be a GEMM is
// malformed. GatedPairs asks it of many i of one list.
func GatedPairAt(nodes []Node, i int, kernel func(name string) Kernel) (GEMM, GatedAct, bool, error) {
	return NewGatedPairs(nodes, kernel).At(i)
}

// GatedPairs answers GatedPairAt for one node list, reading the whole list once for each gu
// buffer rather than once for each pair: preparing the 8B's graphs with apps asked it of
// every node of 130 lists of about 300 nodes.
type GatedPairs struct {
	nodes  []Node
	kernel func(name string) Kernel
	guOnly map[string]bool // gu's buffer: whether only pairs' GEMMs and activations name it
}

// NewGatedPairs finds the gated pairs of nodes (kernels by name from kernel).
func NewGatedPairs(nodes []Node, kernel func(name string) Kernel) *GatedPairs {
	return &GatedPairs{nodes: nodes, kernel: kernel, guOnly: map[string]bool{}}
}

// Of says whether p finds the pairs of nodes: the same list, not a copy.
func (p *GatedPairs) Of(nodes []Node) bool {
	return len(nodes) == len(p.nodes) && (len(nodes) == 0 || &nodes[0] == &p.nodes[0])
}

// At is GatedPairAt(nodes, i, kernel) for p's nodes and kernels.
func (p *GatedPairs) At(i int) (GEMM, GatedAct, bool, error) {
	nodes, kernel := p.nodes, p.kernel
	if i+1 >= len(nodes) {
		return GEMM{}, GatedAct{}, false, nil
	}
	n, next := nodes[i], nodes[i+1]
	g, ok, err := GemmOf(n, kernel(n.Kernel))
	if err != nil || !ok {
		return GEMM{}, GatedAct{}, false, err
	}
	act, ok := GatedActOf(next, kernel(next.Kernel))
	if !ok || n.Args[g.Y] != act.GU || g.N != 2*act.Inter || g.M != act.Rows || g.Guard != 0 || n.SkipUnless != 0 || next.SkipUnless != 0 {
		return GEMM{}, GatedAct{}, false, nil
	}
	only, seen := p.guOnly[act.GU.Buffer]
	if !seen {
		only = p.namedByPairsOnly(act.GU.Buffer)
		p.guOnly[act.GU.Buffer] = only
	}
	if !only {
		return GEMM{}, GatedAct{}, false, nil
	}
	return g, act, true, nil
}

// namedByPairsOnly says whether every argument of p's nodes that names buffer is a GEMM's y
// or a gated activation's gu.
func (p *GatedPairs) namedByPairsOnly(buffer string) bool {
	for _, m := range p.nodes {
		for j, s := range m.Args {
			if s.Buffer != buffer {
				continue
			}
			k := p.kernel(m.Kernel)
			if h, ok, _ := GemmOf(m, k); ok && j == h.Y {
				continue
			}
			if a, ok := GatedActOf(m, k); ok && j == 0 && a.GU == s {
				continue
			}
			return false
		}
	}
	return true
}

// RopeKVNode is a rope_kv node as RopePairAt reads it: its shape and its arguments after qkv
// (RopeKVParams').
type RopeKVNode struct {
	Shape KVShape
	Args  []Slot
}

// RopePairAt says whether nodes[i] and nodes[i+1] (kernels by name from kernel) are a GEMM
// and the rope_kv of its y (no bias, no QK-norm), which a copy-engine GEMM with RopeKV may
// serve as one launch: y is qkv, the same buffer and offset; the GEMM's N is the q/k/v row's
// width and its rows are the rope's; neither is a heavy app's (no guard, no skip). The one
// launch writes what both would, so nothing else about y's readers matters. An error says how
// a node that claims to be a GEMM is malformed.
func RopePairAt(nodes []Node, i int, kernel func(name string) Kernel) (GEMM, RopeKVNode, bool, error) {
	if i+1 >= len(nodes) {
		return GEMM{}, RopeKVNode{}, false, nil
	}
	n, next := nodes[i], nodes[i+1]
	g, ok, err := GemmOf(n, kernel(n.Kernel))
	if err != nil || !ok {
		return GEMM{}, RopeKVNode{}, false, err
	}
	k := kernel(next.Kernel)
	if k.Op != OpRopeKV {
		return GEMM{}, RopeKVNode{}, false, nil
	}
	a, err := ropeKVAttrs.decode(k.Attrs)
	if err != nil || a.Bias || a.QKNorm || !slices.Equal(k.Params, append([]Param{{"qkv", "u64"}}, RopeKVParams...)) ||
		len(next.Args) != len(k.Params) || next.Args[0] != n.Args[g.Y] || next.Grid[0] != g.M || g.Guard != 0 || n.SkipUnless != 0 || next.SkipUnless != 0 {
		return GEMM{}, RopeKVNode{}, false, nil
	}
	if a.KVShape.checkCopy(GemmCopyAttrs{N: g.N, Box: [2]int{0, ropeCopyHalf}}) != nil {
		return GEMM{}, RopeKVNode{}, false, nil
	}
	return g, RopeKVNode{Shape: a.KVShape, Args: next.Args[1:]}, true, nil
}

// ParseGemmShapes reads a list of GEMM shapes, each "KxN" (K and N positive), or "none"
// alone (an empty list); an error names the entry and the form.
func ParseGemmShapes(list []string) ([][2]int, error) {
	if len(list) == 1 && list[0] == "none" {
		return [][2]int{}, nil
	}
	out := make([][2]int, 0, len(list))
	for _, s := range list {
		var k, n int
		if c, err := fmt.Sscanf(s, "%dx%d", &k, &n); err != nil || c != 2 || k <= 0 || n <= 0 || fmt.Sprintf("%dx%d", k, n) != s {
			return nil, fmt.Errorf("GEMM shape %q: want KxN with K and N positive (e.g. 4096x28672), or none alone", s)
		}
		out = append(out, [2]int{k, n})
	}
	return out, nil
}

// MaxDynamicShared is the most shared memory a CTA may ask for on sm_90 (227 KiB).
const MaxDynamicShared = 227 << 10

// GemmCopy is one copy-engine GEMM of a bundle: its kernel's name and attributes.
type GemmCopy struct {
	Kernel string
	Attrs  GemmCopyAttrs
}
