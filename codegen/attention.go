package codegen

import (
	"cmp"
	"errors"
	"fmt"
	"math"

	"xmix/bundle"
	"xmix/frontend"
	"xmix/ops"
	"xmix/ptx"
)

// Decode attention (flash-decoding): the kernel for op "attention" (ops/attention.go) over
// decode rows, any number of rows and any context, paged KV.
//
// Work split. One block per (row, group of hpb query heads of one kv head, context split):
// grid (rows, Heads/hpb, splits). The block computes every query head of its group from the
// same K and V loads, so K/V are read once per kv head, not once per query head (hpb is the
// whole GQA group for Llama-class shapes). With Split, the host writes the step's positions
// per split to a control word (ctl.attn_chunk, from the step's longest context, its rows and
// the bucket's grid, choosing the split count whose waves of blocks end first:
// bundle.AttnSplit, splitPlan): row r's context n = pos+1 is cut into ceil(n/chunk)
// splits, split s owning positions [s*chunk, min(n, (s+1)*chunk)); blocks past a row's last
// split exit at once, so one graph serves every context and the split count changes per step
// with no rebuild. The kernel raises the chunk to ceil(n/grid z) itself, so a short or missing
// word cannot overrun the grid.
//
// Lanes (the CUDA-core step; where the layer allows it, the default is the tensor-core step of
// attention_tc.go, which shares everything else here). A position's K (or V) row of one kv
// head is HeadDim*kvBytes contiguous bytes, read as 16-byte loads by `lanes` lanes (a power
// of two, 16 for HeadDim 128 bf16), each lane `chunks` loads; a warp covers 32/lanes
// positions per load instruction and unroll of those per step, every K and V load of the step
// issued before the first use. Lane l of a position group owns dims [(c*lanes+l)*dpc, +dpc)
// of chunk c for every head of the block (q in registers, pre-scaled by Scale*log2 e so that
// scores come out in log2 units), reduces its partial dot products over the group's lanes by
// shuffles, and keeps an online softmax per head (running max m, sum l, unnormalised acc).
// The block-table entries of the block's positions are staged in shared memory first, so a K
// load waits on one shared load instead of a global one.
//
// Merge. The position groups of a warp fold by shuffles, the warps through shared memory (a
// fixed order: the result does not depend on timing). A row with one split writes z. With
// more, every split writes its unnormalised record (acc[D], m, l) to the workspace and draws a
// ticket from its (row, head group) counter (drawTicket: one fence before, one after); the
// block that draws the last ticket sums the records in split order 0..n-1 (deterministic),
// writes z and resets the counter so that the next launch finds it zero. Split 0 holds
// position 0, so the combined max is finite.
//
// Clusters (Cluster, with Split): where a bucket's splits fit in one wave of blocks, a row's
// splits are one thread-block cluster of Cluster blocks, consecutive along the grid's x
// (grid (rows*Cluster, Heads/hpb, 1)). Each split with more than one in its row stores its
// record into rank 0's shared memory (mapa, st.shared::cluster); after the cluster barrier
// rank 0 sums them in split order and writes z. No workspace, counter, fence or L2 round trip:
// the global merge's fences, atomic ticket and record loads are some microseconds on the
// critical path of every layer. Blocks past a row's last split exit at once (barrier.cluster
// waits only for threads that have not exited). A first cluster barrier, arrived at on
// entry and waited on before the stores, makes sure rank 0 has begun. For measuring only
// (xmixc build --attn-cluster): on the H200 (session 37, Llama-3.1-8B inside the graph)
// clusters of 2 made the 16-row step 1.1-1.3% shorter at context 2112 but 0.4-1.0% longer at
// 80-576, and clusters of 4 and 8 made the 8- and 4-row steps 2-5% longer at 576-2112, with
// or without early launch.
//
// Workspace `ws` (Split without Cluster), c.SplitWorkspaceBytes(rows, splits): rows*Heads/hpb u32
// counters (rounded up to 16 bytes), then rows*Heads*splits records of HeadDim+4 f32 (acc, m,
// l, two pad words keeping records 16-byte aligned), record (row, head, split) at index
// (row*Heads+head)*splits+split, splits being the launch's grid z. Zero before the first launch.
//
// Singles (prefill templates): the kernel computes only the rows that are alone of their
// sequence in the call (decode rows mixed into a prefill step); AttentionPrefill computes the
// rest on tensor cores. Both follow ops.AttnRowSingle.
//
// Bytes per layer at batch B and context n: K and V once per kv head, 2*B*n*KVHeads*HeadDim*kb
// from HBM, plus the split records (B*Heads*splits*(HeadDim+4)*4 written and read, in L2).
type AttnConfig struct {
	Heads, KVHeads, HeadDim, BlockSize, MaxBlocksPerSeq int
	KVDtype                                             ptx.Type
	Scale                                               float32
	// Split: a row's context may span the launch's grid z blocks (parameters ws and chunk).
	Split bool
	// Cluster, with Split: a row's splits are one cluster of Cluster blocks along x, merged in
	// rank 0's shared memory (parameter chunk, no ws; ClusterSplits). 0: the workspace merge.
	Cluster int
	// Singles: only rows alone of their sequence in the call (ops.AttnRowsSingle).
	Singles bool
	// Softcap, when not 0, caps the scaled scores at Softcap * tanh(s / Softcap) (Gemma 2:
	// 50). Window, when not 0, is a sliding window: a row attends to its last Window
	// positions only (Gemma 2: 4096 on every other layer). Both as ops.AttnAttrs.
	Softcap float32
	Window  int
	// Warps, when not 0, is the warps per block (adWarps when 0; a decode bucket's by default
	// DecodeWarps), Unroll the position loads of a warp's step (adGeom.unroll when 0): more of
	// either covers more positions in one pass of a block (a split's fixed cost, its start and
	// merge, then serves more of them). Both change only the order of the sums, not what is
	// summed (xmixc build --attn-warps, --attn-unroll).
	Warps, Unroll int
	// EarlyLaunch: the kernel is built for programmatic dependent launch (BuildInfo.PDL) and
	// waits for the grid ahead itself (bundle.PriorGridWait), once it has read the control
	// block and staged its first block-table entries, which the host wrote before the step.
	EarlyLaunch bool
	// Prefetch, with EarlyLaunch, is how many of its passes' K and V rows a block asks L2 for
	// before it waits (prefetchKV; 0: none). It changes no result.
	Prefetch int
	// EarlyKV, with EarlyLaunch: the split kernels on tensor cores, which peel a warp's first
	// step off their loop (firstStepTC), issue that step's K/V loads before the wait wherever
	// every position they read precedes the row's newest (firstStepEarlyTC); other kernels
	// are unchanged. It changes no result (xmixc build --attn-early-kv).
	EarlyKV bool
	// TensorCores: the warp step runs on tensor cores where the shape allows (tcOK,
	// attention_tc.go; xmixc build --attn-tc, the default), Unroll then counting 16-position
	// tiles.
	TensorCores bool
	// ZOptional (not Singles): the kernel stores z only where its address is not 0, so that a
	// backend may pass z_bf16 alone where no node reads z's f32 (BuildInfo.OptionalF32Out).
	// AttentionPrefill ignores it: the prefill step's kernels write z's rows between them.
	ZOptional bool
	// Rope (an unsplit decode kernel on tensor cores whose block holds a whole GQA group):
	// the kernel does rope_kv's work itself, without its launch (parameters cos and sin after
	// z_bf16; ops.AttnAttrs.Rope). Each block writes its kv head's k (rotated) and v of the
	// row's newest position into the caches and, after a block barrier, attends with its q
	// heads rotated in registers, with rope_kv's instructions, so z and the caches have the
	// bits of rope_kv and the kernel without it. qkv is left unrotated
	// (BuildInfo.RopeInAttention). Rows of sequence slot PadSeq (the engine's padding rows,
	// each at its own position of the one padding sequence) write no k and v, so that no
	// block reads what another writes (ops.AttnAttrs.PadSeq).
	Rope   bool
	PadSeq int
}

const (
	// Warps per block, unless set (AttnConfig.Warps) or the bucket is small or large
	// (DecodeWarps: adWideRows, adNarrowWarps).
	adWarps = 4
	// adNarrowWarps is the warps per block of a decode bucket whose blocks of adWarps warps
	// would take more than one wave (attnSplitBlocks): blocks half as wide, twice as many an
	// SM, so that batch 128's 1024 blocks of a Llama run in one wave. On the H200 with the
	// tensor-core step (session 27 call 1, Llama-3.2-1B, 128 rows, graph replay per decode
	// step): 1.889 -> 1.858 ms at context 576, 3.300 -> 3.264 ms at 2112; 8 warps were 4-5%
	// longer. (With the CUDA-core step, session 13, two warps had measured the same as four.)
	adNarrowWarps = 2
	// Per lane, the block's heads times the lane's dims: q values, and as many accumulators.
	// Past 64 each the kernel would spill; wider groups get more blocks (smaller hpb).
	adMaxLaneValues = 64
	// adTableCap is how many block-table entries a block stages in shared memory at a time.
	adTableCap = 256
	// AttnMaxSplits bounds the grid z of a split decode attention.
	AttnMaxSplits = 128
	// attnMaxCluster is the most splits a cluster merges: the portable cluster size.
	attnMaxCluster = 8
	// adCombineBatch is how many splits' records a thread of the combining block asks for at
	// once (six loads each): one round for the splits the plan gives a bucket of 4 rows or
	// more on Llama shapes (at most 8), three for one row's (at most 33).
	adCombineBatch = 16
	// attnSplitBlocks is how many blocks a decode bucket's full grid aims for on an H200 (132
	// SMs, four 128-thread blocks each), attnMinChunk the fewest positions a split gets,
	// rounded up to a block's pass (splitPlan, which rounds every chunk to whole passes):
	// shorter splits cost more in their merge than they save, and contexts below it never
	// split, whatever the batch.
	attnSplitBlocks = 4 * targetSMs
	attnMinChunk    = 64
	// adWideRows is the largest decode bucket whose attention blocks get 8 warps (DecodeWarps).
	adWideRows = 32
	// MaxAttnWarps and MaxAttnUnroll bound AttnConfig.Warps and Unroll: a block's threads, and
	// the K/V registers of a step.
	MaxAttnWarps  = 16
	MaxAttnUnroll = 8
	// MaxAttnPrefetch bounds AttnConfig.Prefetch: each pass asks L2 for about one line a
	// thread, and L2 (50 MiB) holds what the resident blocks ask for.
	MaxAttnPrefetch = 8
)

// warps is the kernel's warps per block.
func (c AttnConfig) warps() int { return cmp.Or(c.Warps, adWarps) }

// DecodeWarps is the warps per block of c's attention in a decode bucket of rows rows: 8 up
// to adWideRows rows (where their merge states fit in shared memory), adNarrowWarps where
// the bucket's blocks of adWarps warps would take more than one wave, adWarps between. A
// bucket of few rows has few blocks even split, and a wider block covers twice the positions
// in one pass, so a context takes fewer splits and the cross-block merge less often; past it
// the grid fills the GPU anyway and narrower blocks pack the SMs better. On the H200 (session
// 13, graph replay per decode step, 8 against 4 warps): steps up to 4.5% shorter at 1-32 rows
// and contexts 80-2112 on Llama-3.1-8B and -3.2-1B (none longer by more than 1.0%), 0-6.6%
// longer at 128 rows. With the tensor-core step, 4 warps at 1-32 rows were 0.1-1.3% longer at
// most shapes (session 22 call 4).
func (c AttnConfig) DecodeWarps(rows int) int {
	wide := c
	wide.Warps = 8
	switch {
	case rows <= adWideRows && wide.sharedBytes() <= maxStaticShared:
		return wide.Warps
	case rows*c.Heads/c.geom().hpb > attnSplitBlocks:
		return adNarrowWarps
	}
	return adWarps
}

// sharedBytes is the static shared memory of c's decode kernel: the staged block-table
// entries, every warp's merge state per head (m, l and HeadDim sums), and with splits the
// combine's ticket or, merged in a cluster, rank 0's records.
func (c AttnConfig) sharedBytes() int {
	hpb := c.geom().hpb
	n := 4 * (min(c.MaxBlocksPerSeq, adTableCap) + c.warps()*hpb*(c.HeadDim+2))
	switch {
	case c.clustered():
		n += 4 * hpb * c.Cluster * adRecWords(c.HeadDim)
	case c.Split:
		n += 4 // the combine's ticket
	}
	return n
}

// adRecWords is a split's record of one head in f32 words: the HeadDim sums, m and l, and two
// pad words that keep records 16-byte aligned.
func adRecWords(headDim int) int { return headDim + 4 }

// adGeom is the lane layout of the decode kernel for one shape.
type adGeom struct {
	tc                 bool // the tensor-core step (tcGeom): pp is a tile, the lane fields unused
	lanes, chunks, dpc int  // lanes per position, 16-byte loads per lane per row, dims per load
	pp, unroll         int  // positions per warp load, loads of a step
	dims               int  // dims per lane: chunks*dpc
	hpb                int  // query heads per block
}

func (c AttnConfig) geom() adGeom {
	if c.tcOK() {
		return c.tcGeom()
	}
	kvs := c.KVDtype.Bytes()
	n16 := c.HeadDim * kvs / 16
	lanes := 1
	for lanes < 32 && n16%(2*lanes) == 0 {
		lanes *= 2
	}
	g := adGeom{lanes: lanes, chunks: n16 / lanes, dpc: 16 / kvs, pp: 32 / lanes}
	g.dims = g.chunks * g.dpc
	g.unroll = cmp.Or(c.Unroll, max(1, 4/g.chunks))
	group := c.Heads / c.KVHeads
	for h := group; h >= 1; h-- {
		if group%h == 0 && h*g.dims <= adMaxLaneValues {
			g.hpb = h
			break
		}
	}
	return g
}

func (c AttnConfig) ropeConfig() RopeConfig {
	return RopeConfig{Heads: c.Heads, KVHeads: c.KVHeads, HeadDim: c.HeadDim, BlockSize: c.BlockSize,
		MaxBlocksPerSeq: c.MaxBlocksPerSeq, KVDtype: c.KVDtype}
}

// Launch is the decode kernel's grid for rows rows and up to splits context splits per row
// (1 unless c.Split).
func (c AttnConfig) Launch(rows, splits int) ops.Launch {
	geo := c.geom()
	block := [3]int{32 * c.warps(), 1, 1}
	if c.clustered() {
		return ops.Launch{Grid: [3]int{rows * c.Cluster, c.Heads / geo.hpb, 1}, Block: block}
	}
	return ops.Launch{Grid: [3]int{rows, c.Heads / geo.hpb, max(1, min(splits, AttnMaxSplits))}, Block: block}
}

// ClusterSplits is the cluster of a split decode bucket of rows rows (AttnConfig.Cluster,
// with c's warps): the most splits whose blocks the GPU holds in one wave (the split plan's
// WaveBlocks), when that is 2 to attnMaxCluster, fewer where their records would not fit in
// shared memory; else 0, and the bucket keeps the workspace merge (one row takes 33 splits
// to fill the H200, 32 rows not two). Within one wave the split plan never picks more: a
// second wave costs more than the splits save.
func (c AttnConfig) ClusterSplits(rows int) int {
	p := c.splitPlan(1)
	s := p.WaveBlocks / max(1, rows*p.RowBlocks)
	if s > attnMaxCluster {
		return 0
	}
	c.Split = true
	for c.Cluster = s; c.Cluster >= 2; c.Cluster-- {
		if c.sharedBytes() <= maxStaticShared {
			return c.Cluster
		}
	}
	return 0
}

// DecodeSplits is the grid z of a split decode bucket of rows rows: enough splits that the
// bucket's rows fill the GPU (attnSplitBlocks), 1 when they do without.
func (c AttnConfig) DecodeSplits(rows int) int {
	return min(AttnMaxSplits, max(1, (attnSplitBlocks+rows*c.KVHeads-1)/(rows*c.KVHeads)))
}

// splitPlan is how the host cuts a split decode bucket's contexts over its grid of splits
// splits (bundle.AttnSplit): chunks in multiples of the positions a block covers in one
// pass (every warp's step), at least attnMinChunk, on a GPU holding attnSplitBlocks blocks.
// A block's time goes by passes, not by positions: chunks of one warp's step, which share a
// row's context evenly (8 rows at 2112: 4 x 528 in five passes each, against 3 x 640 and
// 192), made both Llamas' 8- and 16-row steps 0.3-1.1% longer on the H200 (session 39,
// testsuite/gpu/RESULTS.md).
func (c AttnConfig) splitPlan(splits int) *bundle.AttnSplit {
	geo := c.geom()
	step := c.warps() * geo.unroll * geo.pp
	return &bundle.AttnSplit{Buffer: bundle.CtlAttnChunk, MaxSplits: splits, Step: step,
		MinChunk: (attnMinChunk + step - 1) / step * step, RowBlocks: c.Heads / geo.hpb,
		WaveBlocks: max(1, attnSplitBlocks*adWarps/c.warps())}
}

// SplitWorkspaceBytes is the size of the split kernel's ws for rows rows and splits splits
// (0 when it takes none).
func (c AttnConfig) SplitWorkspaceBytes(rows, splits int) int {
	if !c.Split || c.clustered() || splits <= 1 || rows <= 0 {
		return 0
	}
	return adCounterBytes(rows*c.Heads/c.geom().hpb) + rows*c.Heads*splits*(c.HeadDim+4)*4
}

func adCounterBytes(n int) int { return (n + 3) / 4 * 16 }

// CheckAttnSettings checks the decode attention's warps a block and position loads a step
// (AttnConfig.Warps and Unroll, bundle.BuildInfo.AttnWarps and AttnUnroll, xmixc build
// --attn-warps and --attn-unroll): 0 for the default, else 1 to MaxAttnWarps and 1 to
// MaxAttnUnroll.
func CheckAttnSettings(warps, unroll int) error {
	if warps < 0 || warps > MaxAttnWarps {
		return fmt.Errorf("%d warps a block: want 1 to %d, or 0 for the default", warps, MaxAttnWarps)
	}
	if unroll < 0 || unroll > MaxAttnUnroll {
		return fmt.Errorf("%d loads a step: want 1 to %d, or 0 for the default", unroll, MaxAttnUnroll)
	}
	return nil
}

// CheckAttnEarlyKV checks the decode attention's early K/V loads (AttnConfig.EarlyKV,
// bundle.BuildInfo.AttnEarlyKV, xmixc build --attn-early-kv): only in kernels launched early
// (pdl), the others having no grid ahead to overlap.
func CheckAttnEarlyKV(early, pdl bool) error {
	if early && !pdl {
		return errors.New("early K/V loads need early launch (--pdl): a kernel that starts after the one ahead has ended has nothing to overlap")
	}
	return nil
}

// CheckAttnPrefetch checks the passes of K and V rows a decode attention block asks L2 for
// before its wait (AttnConfig.Prefetch, bundle.BuildInfo.AttnPrefetch, xmixc build
// --attn-prefetch): 0 (none) to MaxAttnPrefetch, and only in kernels launched early (pdl).
func CheckAttnPrefetch(passes int, pdl bool) error {
	switch {
	case passes < 0 || passes > MaxAttnPrefetch:
		return fmt.Errorf("K/V prefetch of %d passes: want 0 (none) to %d", passes, MaxAttnPrefetch)
	case passes > 0 && !pdl:
		return fmt.Errorf("K/V prefetch of %d passes needs early launch (--pdl): a kernel that starts after the one ahead has ended has nothing to overlap", passes)
	}
	return nil
}

// checkAttn checks what every attention kernel needs of c and returns the op's attributes.
func checkAttn(c AttnConfig) (ops.KVAttrs, error) {
	attrs, err := kvAttrs(c.ropeConfig())
	if err != nil {
		return attrs, err
	}
	if c.HeadDim%frontend.HeadDimStep != 0 || c.HeadDim > frontend.MaxHeadDim {
		return attrs, fmt.Errorf("head dim %d: want a multiple of %d, at most %d", c.HeadDim, frontend.HeadDimStep, frontend.MaxHeadDim)
	}
	if err := CheckAttnSettings(c.Warps, c.Unroll); err != nil {
		return attrs, err
	}
	if err := CheckAttnPrefetch(c.Prefetch, c.EarlyLaunch); err != nil {
		return attrs, err
	}
	if err := CheckAttnEarlyKV(c.EarlyKV, c.EarlyLaunch); err != nil {
		return attrs, err
	}
	if c.Cluster != 0 && (!c.Split || c.Singles || c.Cluster < 2 || c.Cluster > attnMaxCluster) {
		return attrs, fmt.Errorf("a cluster of %d splits: want 2 to %d, in a split decode kernel over every row", c.Cluster, attnMaxCluster)
	}
	if n := c.sharedBytes(); n > maxStaticShared {
		if c.clustered() {
			return attrs, fmt.Errorf("%d warps a block of %d heads of dim %d in a cluster of %d: %d bytes of shared memory, past %d; use fewer warps or a smaller cluster", c.warps(), c.geom().hpb, c.HeadDim, c.Cluster, n, maxStaticShared)
		}
		return attrs, fmt.Errorf("%d warps a block of %d heads of dim %d: %d bytes of shared memory, past %d; use fewer warps", c.warps(), c.geom().hpb, c.HeadDim, n, maxStaticShared)
	}
	if !(c.Scale > 0) || math.IsInf(float64(c.Scale), 0) {
		return attrs, fmt.Errorf("scale %g: want positive and finite", c.Scale)
	}
	if c.ZOptional && c.Singles {
		return attrs, fmt.Errorf("z optional over the rows alone of their sequence: the prefill kernel writes the others' z")
	}
	if c.Window < 0 || !(c.Softcap >= 0) || math.IsInf(float64(c.Softcap), 0) {
		return attrs, fmt.Errorf("window %d, softcap %g: want both at least 0 (0: none) and finite", c.Window, c.Softcap)
	}
	if c.Rope && !c.RopeOK() {
		return attrs, fmt.Errorf("rope in the attention: want a decode kernel of one block a row (no split, not singles) on tensor cores whose block holds the whole GQA group of %d heads", c.Heads/c.KVHeads)
	}
	return attrs, nil
}

// RopeOK says whether the kernel may do rope_kv's work (Rope): one block a row on tensor
// cores, its block holding a whole GQA group, so that exactly one block writes a kv head's
// newest k and v and reads them back.
func (c AttnConfig) RopeOK() bool {
	return !c.Split && !c.Singles && c.tcOK() && c.geom().hpb == c.Heads/c.KVHeads
}

// attnAttrs are the reference op's attributes of kernel c computing rows.
func (c AttnConfig) attnAttrs(kv ops.KVAttrs, rows string) ops.AttnAttrs {
	a := ops.AttnAttrs{KVAttrs: kv, Scale: c.Scale, Rows: rows, Softcap: c.Softcap, Window: c.Window, OutOptional: c.ZOptional, Rope: c.Rope}
	if c.Rope {
		a.PadSeq = c.PadSeq
	}
	if c.clustered() {
		a.Splits = c.Cluster
	}
	return a
}

// qScale is what q is multiplied by so that q.k comes out in the units the kernels take the
// softmax in: log2 units (Scale * log2 e), or with a softcap capTanh's (Scale * 2 log2 e /
// Softcap), whose result is in log2 units again (c = Softcap * log2 e, softcapScores).
func (c AttnConfig) qScale() float32 {
	if c.Softcap > 0 {
		return c.Scale * capScale(c.Softcap)
	}
	return c.Scale * float32(math.Log2E)
}

// softcapScores caps scores computed with qScale, leaving them in log2 units.
func (e emitter) softcapScores(c AttnConfig, s ...ptx.Reg) {
	if c.Softcap == 0 {
		return
	}
	for _, x := range s {
		e.capTanh(x, c.Softcap*float32(math.Log2E))
	}
}

// windowStart is the first position a row of context n attends to: 0, or with a sliding
// window max(n, Window) - Window.
func (e emitter) windowStart(c AttnConfig, n ptx.Reg) ptx.Reg {
	lo := e.op3("max.u32", ptx.U32, n, ptx.Imm(int64(c.Window)))
	e.Emit("sub.u32", lo, lo, ptx.Imm(int64(c.Window)))
	return lo
}

// Attention generates the decode kernel; parameters: qkv, pos, seq, block_table, kcache,
// vcache, z, z_bf16 (bundle.AttnZBF16: where not 0, bf16 of z goes there too, so that the o
// projection after it reads that with no cast), then with c.Split ws and chunk (all u64;
// chunk points at the u32 positions per split). Launch it with c.Launch(rows, splits).
func Attention(name string, c AttnConfig) (*Kernel, error) {
	attrs, err := checkAttn(c)
	if err != nil {
		return nil, fmt.Errorf("attention %s: %w", name, err)
	}
	g := &adGen{emitter: newEmitter(name), c: c, geo: c.geom()}
	g.MaxNTid = 32 * c.warps()
	if g.c.clustered() {
		g.ClusterX = c.Cluster
	}
	if g.geo.tc {
		g.MinBlocks = max(1, tcAttnWarpsPerSM/c.warps())
	}
	g.emit()
	rows := ""
	if c.Singles {
		rows = ops.AttnRowsSingle
	}
	return finish(g.Kernel, bundle.OpAttention, c.attnAttrs(attrs, rows))
}

type adGen struct {
	emitter
	c   AttnConfig
	geo adGeom

	qkv, table, kc, vc, z, ws ptx.Reg
	zb                        ptx.Reg // z_bf16 (bundle.AttnZBF16)
	cos, sin, pos             ptx.Reg // Rope: the tables, and the row's newest position
	noZB                      ptx.Reg // zb is 0: no bf16 copy
	noZ                       ptx.Reg // with ZOptional, z is 0: the bf16 copy alone
	row, by, split, nsplit    ptx.Reg
	tid, lane, warp, sub, sl  ptx.Reg
	head0, kvh, s, dim0       ptx.Reg
	q, acc                    [][]ptx.Reg // [head][dim of the lane]; tensor cores: [m-tile][O^T fragment]
	m, l                      []ptx.Reg
	sTable                    ptx.Sym
	// Tensor cores only: what the step needs of the lane, Q's A fragments.
	tl tcLane
	qa [][2]ptx.Reg
}

// clustered reports whether the kernel's splits merge in a cluster (Cluster, with Split).
func (c AttnConfig) clustered() bool { return c.Split && c.Cluster > 0 }

// earlyKV says whether the kernel loads its first step's K/V before its wait (EarlyKV).
func (c AttnConfig) earlyKV() bool { return c.EarlyKV && c.EarlyLaunch && c.Split && c.tcOK() }

func (g *adGen) emit() {
	c, geo := g.c, g.geo
	g.qkv = g.param("qkv", ptx.U64)
	posP := g.param("pos", ptx.U64)
	seqP := g.param("seq", ptx.U64)
	g.table = g.param("block_table", ptx.U64)
	g.kc = g.param("kcache", ptx.U64)
	g.vc = g.param("vcache", ptx.U64)
	g.z = g.param("z", ptx.U64)
	g.zb = g.param(bundle.AttnZBF16, ptx.U64)
	g.noZB = g.cmp("eq", ptx.U64, g.zb, ptx.Imm(0))
	if c.ZOptional {
		g.noZ = g.cmp("eq", ptx.U64, g.z, ptx.Imm(0))
	}
	var chunkP ptx.Reg
	if c.Split {
		if !g.c.clustered() {
			g.ws = g.param("ws", ptx.U64)
		}
		chunkP = g.param("chunk", ptx.U64)
	}
	if c.Rope {
		g.cos = g.param("cos", ptx.U64)
		g.sin = g.param("sin", ptx.U64)
	}
	g.row = g.special(ptx.CtaidX)
	if g.c.clustered() {
		// The cluster's first barrier phase: arrived at on entry, waited on before a split
		// stores into rank 0's shared memory (mergeStates).
		g.Emit("barrier.cluster.arrive")
		g.split = g.op3("rem.u32", ptx.U32, g.row, ptx.Imm(int64(c.Cluster)))
		g.Emit("div.u32", g.row, g.row, ptx.Imm(int64(c.Cluster)))
	}
	g.by = g.special(ptx.CtaidY)
	g.tid = g.special(ptx.TidX)
	g.lane = g.op3("and.b32", ptx.U32, g.tid, ptx.Imm(31))
	g.warp = g.op3("shr.u32", ptx.U32, g.tid, ptx.Imm(5))
	lanesLog, _ := log2(geo.lanes)
	g.sl = g.op3("and.b32", ptx.U32, g.lane, ptx.Imm(int64(geo.lanes-1)))
	g.sub = g.op3("shr.u32", ptx.U32, g.lane, ptx.Imm(int64(lanesLog)))
	p := loadU32(g.emitter, ptx.Addr{Base: g.byteAddr(posP, g.row, 4)})
	g.pos = p
	g.s = loadU32(g.emitter, ptx.Addr{Base: g.byteAddr(seqP, g.row, 4)})
	if c.Singles {
		g.exitUnlessSingle(seqP)
	}
	n := g.op3("add.u32", ptx.U32, p, ptx.Imm(1))
	group := c.Heads / c.KVHeads
	g.head0 = g.op3("mul.lo.u32", ptx.U32, g.by, ptx.Imm(int64(geo.hpb)))
	g.kvh = g.op3("div.u32", ptx.U32, g.head0, ptx.Imm(int64(group)))

	// The row attends to positions [lo, n): lo 0, or with a window n-Window when n is more.
	// Splits cut that span.
	start, end := g.imm32(0), n
	span := n
	var lo ptx.Reg
	if c.Window > 0 {
		lo = g.windowStart(c, n)
		start = lo
		span = g.op3("sub.u32", ptx.U32, n, lo)
	}
	if c.Split {
		var nz ptx.Reg
		if g.c.clustered() {
			nz = g.imm32(int64(c.Cluster))
		} else {
			g.split, nz = g.special(ptx.CtaidZ), g.special(ptx.NCtaidZ)
		}
		chunk := loadU32(g.emitter, ptx.Addr{Base: chunkP})
		if c.Window > 0 {
			// The host sizes the word from the step's longest context (bundle.AttnSplit.Chunk);
			// a span of at most Window positions takes at most Chunk(Window), so that a sliding
			// layer spreads its window over the whole grid too.
			cw := g.op3("add.u32", ptx.U32, nz, ptx.Imm(int64(c.Window-1)))
			g.Emit("div.u32", cw, cw, nz)
			g.Emit("add.u32", cw, cw, ptx.Imm(attnMinChunk-1))
			g.Emit("and.b32", cw, cw, ptx.Imm(-attnMinChunk))
			g.Emit("min.u32", chunk, chunk, cw)
		}
		minc := g.op3("add.u32", ptx.U32, span, nz)
		g.Emit("sub.u32", minc, minc, ptx.Imm(1))
		g.Emit("div.u32", minc, minc, nz)
		g.Emit("max.u32", chunk, chunk, minc)
		if g.geo.tc { // splits start at whole tiles
			g.Emit("add.u32", chunk, chunk, ptx.Imm(tcAttnTile-1))
			g.Emit("and.b32", chunk, chunk, ptx.Imm(-tcAttnTile))
		}
		g.nsplit = g.op3("add.u32", ptx.U32, span, chunk)
		g.Emit("sub.u32", g.nsplit, g.nsplit, ptx.Imm(1))
		g.Emit("div.u32", g.nsplit, g.nsplit, chunk)
		g.EmitIf(g.cmp("ge", ptx.U32, g.split, g.nsplit), false, "exit")
		start = g.op3("mul.lo.u32", ptx.U32, g.split, chunk)
		if c.Window > 0 {
			g.Emit("add.u32", start, start, lo)
		}
		end = g.op3("add.u32", ptx.U32, start, chunk)
		g.Emit("min.u32", end, end, n)
	}
	// Everything above reads only the control block, which the host wrote before the step:
	// launched early, the block does it while the kernel ahead still runs, and waits for
	// that kernel's q and K/V only now.
	seg := g.stage(start, end)
	if c.EarlyLaunch {
		g.prefetchKV(seg, start)
		if !c.earlyKV() {
			g.Emit(bundle.PriorGridWait)
		}
	}
	var next *ptx.Reg
	switch {
	case c.earlyKV():
		t := g.firstStepEarlyTC(seg, n)
		next = &t
	case geo.tc && c.Split:
		t := g.firstStepTC(seg)
		next = &t
	case geo.tc && c.Rope:
		x := g.askQTC()
		g.ropeKV()
		g.zeroStateTC()
		g.convertQTC(x)
	case geo.tc:
		g.loadQTC()
	default:
		g.loadQ()
	}
	g.scan(seg, end, next)
	g.merge()
}

// prefetchKV asks L2 for the K and V rows of the block's first c.Prefetch passes (positions
// [start, start + Prefetch*pass) of its staged segment, pass = the positions its warps load
// in one step each), every 128-byte line of each row once, spread over the block's threads.
// It runs before the block waits for the kernel ahead: the rows of past positions were
// written by earlier steps, so their first loads after the wait find L2 instead of HBM. The
// row's newest position is the one the kernel ahead writes now; its line may be asked for
// before that write lands, which is harmless: L2 is where every write goes, a prefetch fills
// no L1, and only the loads after the wait read. A row whose size is not whole lines (head
// dim 96 in bf16, say) is not asked for.
func (g *adGen) prefetchKV(seg segment, start ptx.Reg) {
	c := g.c
	rowBytes := c.HeadDim * c.KVDtype.Bytes()
	if c.Prefetch <= 0 || rowBytes%128 != 0 {
		return
	}
	rowLines := rowBytes / 128
	positions := c.Prefetch * g.stride()
	threads := 32 * c.warps()
	hi := g.op3("add.u32", ptx.U32, start, ptx.Imm(int64(positions)))
	g.Emit("min.u32", hi, hi, seg.hi)
	// Line l of the span is line l % (2*rowLines) of position start + l / (2*rowLines): its
	// K row's lines, then its V row's.
	for l0 := 0; l0 < positions*2*rowLines; l0 += threads {
		l := g.op3("add.u32", ptx.U32, g.tid, ptx.Imm(int64(l0)))
		pos := g.op3("div.u32", ptx.U32, l, ptx.Imm(int64(2*rowLines)))
		g.Emit("add.u32", pos, pos, start)
		g.when(g.cmp("lt", ptx.U32, pos, hi), false, func() {
			kvRow := g.kvRow(pos, seg.blk0)
			part := g.op3("rem.u32", ptx.U32, l, ptx.Imm(int64(2*rowLines)))
			isV := g.cmp("ge", ptx.U32, part, ptx.Imm(int64(rowLines)))
			line := g.op3("rem.u32", ptx.U32, part, ptx.Imm(int64(rowLines)))
			g.Emit("mad.lo.u32", line, kvRow, ptx.Imm(int64(rowLines)), line)
			base := g.Reg(ptx.U64)
			g.Emit("selp.b64", base, g.vc, g.kc, isV)
			g.Emit("prefetch.global.L2", ptx.Addr{Base: g.byteAddr(base, line, 128)})
		})
	}
}

// kvRow is the row of position pos's K (or V) of the block's kv head in the paged cache:
// its page from the staged block-table entries (the segment's from KV block blk0 on), its
// slot in the page, then the head.
func (g *adGen) kvRow(pos, blk0 ptx.Reg) ptx.Reg {
	c := g.c
	bs, _ := log2(c.BlockSize)
	bi := g.op3("shr.u32", ptx.U32, pos, ptx.Imm(int64(bs)))
	g.Emit("sub.u32", bi, bi, blk0)
	page := g.Reg(ptx.U32)
	g.Emit("ld.shared.u32", page, ptx.Addr{Base: g.sharedAddr(g.sTable, bi, 4)})
	slot := g.op3("and.b32", ptx.U32, pos, ptx.Imm(int64(c.BlockSize-1)))
	g.Emit("mad.lo.u32", slot, page, ptx.Imm(int64(c.BlockSize)), slot)
	row := g.Reg(ptx.U32)
	g.Emit("mad.lo.u32", row, slot, ptx.Imm(int64(c.KVHeads)), g.kvh)
	return row
}

// exitUnlessSingle ends the block unless its row is alone of its sequence among its
// neighbours (ops.AttnRowSingle).
func (g *adGen) exitUnlessSingle(seqP ptx.Reg) {
	rows := g.special(ptx.NCtaidX)
	for _, d := range []int64{-1, 1} {
		nb := g.op3("add.u32", ptx.U32, g.row, ptx.Imm(d))
		inside := g.cmp("lt", ptx.U32, nb, rows) // row-1 of row 0 wraps past rows
		g.when(inside, false, func() {
			ns := loadU32(g.emitter, ptx.Addr{Base: g.byteAddr(seqP, nb, 4)})
			g.EmitIf(g.cmp("eq", ptx.U32, ns, g.s), false, "exit")
		})
	}
}

// dimBase is the first head dim of the lane's chunk 0; chunk c starts c*lanes*dpc dims on.
func (g *adGen) dimBase() ptx.Reg {
	if g.dim0 == (ptx.Reg{}) {
		g.dim0 = g.op3("mul.lo.u32", ptx.U32, g.sl, ptx.Imm(int64(g.geo.dpc)))
	}
	return g.dim0
}

// loadQ loads the block's query heads for the lane's dims, scaled to log2 units, and zeroes
// the softmax state.
func (g *adGen) loadQ() {
	c, geo := g.c, g.geo
	d := c.HeadDim
	qrow := g.Reg(ptx.U32)
	g.Emit("mad.lo.u32", qrow, g.row, ptx.Imm(int64(c.Heads+2*c.KVHeads)), g.head0)
	qa := g.byteAddr(g.byteAddr(g.qkv, qrow, 4*d), g.dimBase(), 4)
	qs := ptx.F32Imm(c.qScale())
	g.q, g.acc = make([][]ptx.Reg, geo.hpb), make([][]ptx.Reg, geo.hpb)
	g.m, g.l = make([]ptx.Reg, geo.hpb), make([]ptx.Reg, geo.hpb)
	for h := range geo.hpb {
		g.q[h] = g.Regs(ptx.F32, geo.dims)
		for ch := range geo.chunks {
			for i := 0; i < geo.dpc; i += 4 {
				off := int64(4 * (h*d + ch*geo.lanes*geo.dpc + i))
				g.Emit("ld.global.v4.f32", ptx.Vec(g.q[h][ch*geo.dpc+i:ch*geo.dpc+i+4]), ptx.Addr{Base: qa, Offset: off})
			}
		}
		for _, r := range g.q[h] {
			g.Emit("mul.f32", r, r, qs)
		}
		g.m[h] = g.f32(float32(math.Inf(-1)))
		g.l[h] = g.f32(0)
		g.acc[h] = make([]ptx.Reg, geo.dims)
		for i := range g.acc[h] {
			g.acc[h][i] = g.f32(0)
		}
	}
}

// segment is the span of positions [lo, hi) whose block-table entries, from KV block blk0
// on, the block holds in shared memory (sTable).
type segment struct{ lo, hi, blk0 ptx.Reg }

// stage starts the segment at start: the block-table entries of up to adTableCap KV blocks
// from start's on (at most to end), stored to shared memory by the block's threads.
func (g *adGen) stage(start, end ptx.Reg) segment {
	g.sTable = g.DeclareShared("ad_table", ptx.U32, min(g.c.MaxBlocksPerSeq, adTableCap))
	seg := segment{lo: g.Reg(ptx.U32), hi: g.Reg(ptx.U32), blk0: g.Reg(ptx.U32)}
	g.Emit("mov.u32", seg.lo, start)
	g.restage(seg, end)
	return seg
}

// restage moves seg's table entries on to those of the KV blocks from seg.lo's on.
func (g *adGen) restage(seg segment, end ptx.Reg) {
	c := g.c
	bs, _ := log2(c.BlockSize)
	tcap := min(c.MaxBlocksPerSeq, adTableCap)
	g.Emit("shr.u32", seg.blk0, seg.lo, ptx.Imm(int64(bs)))
	g.Emit("add.u32", seg.hi, seg.blk0, ptx.Imm(int64(tcap)))
	g.Emit("shl.b32", seg.hi, seg.hi, ptx.Imm(int64(bs)))
	g.Emit("min.u32", seg.hi, seg.hi, end)
	nblk := g.op3("sub.u32", ptx.U32, seg.hi, ptx.Imm(1))
	g.Emit("shr.u32", nblk, nblk, ptx.Imm(int64(bs)))
	g.Emit("sub.u32", nblk, nblk, seg.blk0)
	g.Emit("add.u32", nblk, nblk, ptx.Imm(1))
	trow := g.Reg(ptx.U32)
	g.Emit("mad.lo.u32", trow, g.s, ptx.Imm(int64(c.MaxBlocksPerSeq)), seg.blk0)
	tbase := g.byteAddr(g.table, trow, 4)
	i := g.Reg(ptx.U32)
	g.forLoop(i, g.tid, nblk, ptx.Imm(int64(32*g.c.warps())), func() {
		e := loadU32(g.emitter, ptx.Addr{Base: g.byteAddr(tbase, i, 4)})
		g.Emit("st.shared.u32", ptx.Addr{Base: g.sharedAddr(g.sTable, i, 4)}, e)
	})
	g.Emit("bar.sync", ptx.Imm(0))
}

// scan runs the warps' online softmax over positions [seg.lo, end), the first segment's
// entries staged (a span is never empty: a row attends to at least its own position), the
// next segment's staged as each ends. Each segment's loop starts at the warp's first step,
// or, given next (the split kernels, whose warps ran their first step before the scan:
// firstStepTC), the warp's position is carried from step to step and segment to segment,
// starting at next. The two forms are what measured fastest for each kernel (ptxas
// schedules them differently: firstStepTC's note).
func (g *adGen) scan(seg segment, end ptx.Reg, next *ptx.Reg) {
	geo := g.geo
	stride := ptx.Imm(int64(g.stride()))
	scanFrom := func(t ptx.Reg) func() {
		return func() {
			if geo.tc {
				g.stepTC(t, seg.hi, seg.blk0)
			} else {
				g.step(t, seg.hi, seg.blk0)
			}
		}
	}
	top, done := g.NewLabel("seg"), g.NewLabel("seg_done")
	g.Label(top)
	if next == nil {
		t0 := g.Reg(ptx.U32)
		g.warpStart(t0, seg.lo)
		t := g.Reg(ptx.U32)
		g.forLoop(t, t0, seg.hi, stride, scanFrom(t))
	} else {
		g.whileLoop(*next, seg.hi, stride, scanFrom(*next))
	}
	// The next segment overwrites the staged entries.
	g.Emit("bar.sync", ptx.Imm(0))
	g.Emit("mov.u32", seg.lo, seg.hi)
	g.EmitIf(g.cmp("ge", ptx.U32, seg.lo, end), false, "bra", ptx.Sym(done))
	g.restage(seg, end)
	if next != nil {
		g.warpStart(*next, seg.lo)
	}
	g.Emit("bra", ptx.Sym(top))
	g.Label(done)
}

// stride is the positions a block's warps take in one step each.
func (g *adGen) stride() int { return g.c.warps() * g.geo.unroll * g.geo.pp }

// warpStart sets r to the warp's first position of a pass that starts at lo.
func (g *adGen) warpStart(r, lo ptx.Reg) {
	g.Emit("mad.lo.u32", r, g.warp, ptx.Imm(int64(g.geo.unroll*g.geo.pp)), lo)
}

// step is one warp step at positions t + u*pp + sub, u < unroll: every K and V load first,
// then the scores, the softmax update and the weighted V sums of the block's heads.
func (g *adGen) step(t, segHi, blk0 ptx.Reg) {
	c, geo := g.c, g.geo
	kvs := c.KVDtype.Bytes()
	last := g.op3("sub.u32", ptx.U32, segHi, ptx.Imm(1))
	dimBase := g.dimBase()
	valid := make([]ptx.Reg, geo.unroll)
	kw, vw := make([][]ptx.Reg, geo.unroll), make([][]ptx.Reg, geo.unroll)
	for u := range geo.unroll {
		pu := g.op3("add.u32", ptx.U32, t, g.sub)
		g.Emit("add.u32", pu, pu, ptx.Imm(int64(u*geo.pp)))
		valid[u] = g.cmp("lt", ptx.U32, pu, segHi)
		g.Emit("min.u32", pu, pu, last) // past the end: read the last position, score -inf
		kvRow := g.kvRow(pu, blk0)
		elem := g.Reg(ptx.U32)
		g.Emit("mad.lo.u32", elem, kvRow, ptx.Imm(int64(c.HeadDim)), dimBase)
		ka, va := g.byteAddr(g.kc, elem, kvs), g.byteAddr(g.vc, elem, kvs)
		kw[u], vw[u] = g.loadRow(ka), g.loadRow(va)
	}
	negInf := ptx.F32Imm(float32(math.Inf(-1)))
	score := make([][]ptx.Reg, geo.unroll) // [u][head]
	for u := range geo.unroll {
		kf := g.widen(kw[u])
		score[u] = make([]ptx.Reg, geo.hpb)
		for h := range geo.hpb {
			s := g.Reg(ptx.F32)
			g.Emit("mul.f32", s, g.q[h][0], kf[0])
			for i := 1; i < geo.dims; i++ {
				g.Emit("fma.rn.f32", s, g.q[h][i], kf[i], s)
			}
			score[u][h] = s
		}
	}
	tmp := g.Reg(ptx.F32)
	for off := geo.lanes / 2; off > 0; off /= 2 {
		for u := range geo.unroll {
			for _, s := range score[u] {
				g.Emit("shfl.sync.bfly.b32", tmp, s, ptx.Imm(int64(off)), ptx.Imm(0x1f), ptx.Imm(-1))
				g.Emit("add.f32", s, s, tmp)
			}
		}
	}
	for u := range geo.unroll {
		g.softcapScores(c, score[u]...)
	}
	for h := range geo.hpb {
		mNew := g.Reg(ptx.F32)
		g.Emit("mov.f32", mNew, g.m[h])
		for u := range geo.unroll {
			g.Emit("selp.f32", score[u][h], score[u][h], negInf, valid[u])
			g.Emit("max.f32", mNew, mNew, score[u][h])
		}
		ms := g.safeMax(mNew)
		alpha := g.exp2(g.op3("sub.f32", ptx.F32, g.m[h], ms))
		g.Emit("mul.f32", g.l[h], g.l[h], alpha)
		for _, a := range g.acc[h] {
			g.Emit("mul.f32", a, a, alpha)
		}
		for u := range geo.unroll {
			w := score[u][h]
			g.Emit("sub.f32", w, w, ms)
			g.Emit("ex2.approx.f32", w, w)
			g.Emit("add.f32", g.l[h], g.l[h], w)
		}
		g.Emit("mov.f32", g.m[h], mNew)
	}
	for u := range geo.unroll {
		vf := g.widen(vw[u])
		for h := range geo.hpb {
			for i, a := range g.acc[h] {
				g.Emit("fma.rn.f32", a, score[u][h], vf[i], a)
			}
		}
	}
}

// safeMax is m, or 0 where m is -inf (a state that has seen no position): exponents taken
// against it give 2^-inf = 0 instead of NaN.
func (e emitter) safeMax(m ptx.Reg) ptx.Reg {
	r := e.Reg(ptx.F32)
	e.Emit("selp.f32", r, ptx.F32Imm(0), m, e.cmp("eq", ptx.F32, m, ptx.F32Imm(float32(math.Inf(-1)))))
	return r
}

// loadRow issues the lane's 16-byte loads of one K or V row at a (chunk c at c*lanes*16
// bytes): raw words for bf16, f32 values for f32.
func (g *adGen) loadRow(a ptx.Reg) []ptx.Reg {
	geo := g.geo
	t, op := ptx.B32, "ld.global.v4.b32"
	if g.c.KVDtype == ptx.F32 {
		t, op = ptx.F32, "ld.global.v4.f32"
	}
	out := make([]ptx.Reg, 0, 4*geo.chunks)
	for ch := range geo.chunks {
		w := g.Regs(t, 4)
		g.Emit(op, ptx.Vec(w), ptx.Addr{Base: a, Offset: int64(ch * geo.lanes * 16)})
		out = append(out, w...)
	}
	return out
}

// widen turns loadRow's registers into the lane's dims as f32 (bf16 pairs widened).
func (g *adGen) widen(w []ptx.Reg) []ptx.Reg {
	if g.c.KVDtype == ptx.F32 {
		return w
	}
	return g.widenBF16(w)
}

// fold merges state (m2, l2, a2) into (m, l, a): both scaled to their common max.
func (g *adGen) fold(m, l ptx.Reg, a []ptx.Reg, m2, l2 ptx.Reg, a2 []ptx.Reg) {
	mx := g.op3("max.f32", ptx.F32, m, m2)
	ms := g.safeMax(mx)
	s1 := g.exp2(g.op3("sub.f32", ptx.F32, m, ms))
	s2 := g.exp2(g.op3("sub.f32", ptx.F32, m2, ms))
	g.Emit("mul.f32", l, l, s1)
	g.Emit("fma.rn.f32", l, l2, s2, l)
	for i := range a {
		g.Emit("mul.f32", a[i], a[i], s1)
		g.Emit("fma.rn.f32", a[i], a2[i], s2, a[i])
	}
	g.Emit("mov.f32", m, mx)
}

// merge gathers the warps' states in shared memory and folds them, then writes z or this
// split's record (and combines, in the last block of a row).
func (g *adGen) merge() {
	var ms mergeArrays
	if g.geo.tc {
		ms = g.storeStateTC()
	} else {
		ms = g.storeState()
	}
	g.Emit("bar.sync", ptx.Imm(0))
	g.mergeStates(ms)
}

// mergeArrays are the block's shared arrays of the warps' softmax states, (warp, head) at
// index warp*hpb+head: m, l and the HeadDim sums; st is the warp's first index.
type mergeArrays struct {
	m, l, acc ptx.Sym
	st        ptx.Reg
}

func (g *adGen) declareMergeArrays() mergeArrays {
	nst := g.c.warps() * g.geo.hpb
	return mergeArrays{m: g.DeclareShared("ad_m", ptx.F32, nst), l: g.DeclareShared("ad_l", ptx.F32, nst),
		acc: g.DeclareShared("ad_acc", ptx.F32, nst*g.c.HeadDim),
		st:  g.op3("mul.lo.u32", ptx.U32, g.warp, ptx.Imm(int64(g.geo.hpb)))}
}

// storeState folds the warp's position groups by shuffles and writes the warp's state to the
// merge arrays.
func (g *adGen) storeState() mergeArrays {
	c, geo := g.c, g.geo
	d, hpb := c.HeadDim, geo.hpb
	for off := geo.lanes; off < 32; off *= 2 {
		for h := range hpb {
			sh := func(r ptx.Reg) ptx.Reg {
				o := g.Reg(ptx.F32)
				g.Emit("shfl.sync.bfly.b32", o, r, ptx.Imm(int64(off)), ptx.Imm(0x1f), ptx.Imm(-1))
				return o
			}
			a2 := make([]ptx.Reg, len(g.acc[h]))
			for i, a := range g.acc[h] {
				a2[i] = sh(a)
			}
			g.fold(g.m[h], g.l[h], g.acc[h], sh(g.m[h]), sh(g.l[h]), a2)
		}
	}
	ms := g.declareMergeArrays()
	sm, sl, sacc, st := ms.m, ms.l, ms.acc, ms.st
	first := g.cmp("eq", ptx.U32, g.sub, ptx.Imm(0))
	g.when(first, false, func() {
		idx := g.Reg(ptx.U32)
		g.Emit("mad.lo.u32", idx, st, ptx.Imm(int64(d)), g.dimBase())
		base := g.sharedAddr(sacc, idx, 4)
		for h := range hpb {
			for ch := range geo.chunks {
				for i := 0; i < geo.dpc; i += 4 {
					off := int64(4 * (h*d + ch*geo.lanes*geo.dpc + i))
					g.Emit("st.shared.v4.f32", ptx.Addr{Base: base, Offset: off}, ptx.Vec(g.acc[h][ch*geo.dpc+i:ch*geo.dpc+i+4]))
				}
			}
		}
		lane0 := g.cmp("eq", ptx.U32, g.lane, ptx.Imm(0))
		ma, la := g.sharedAddr(sm, st, 4), g.sharedAddr(sl, st, 4)
		for h := range hpb {
			g.EmitIf(lane0, false, "st.shared.f32", ptx.Addr{Base: ma, Offset: int64(4 * h)}, g.m[h])
			g.EmitIf(lane0, false, "st.shared.f32", ptx.Addr{Base: la, Offset: int64(4 * h)}, g.l[h])
		}
	})
	return ms
}

// mergeStates folds the warps' states in warp order and writes z or this split's record (and
// combines, in the last block of a row).
func (g *adGen) mergeStates(ms mergeArrays) {
	c, geo := g.c, g.geo
	d, hpb := c.HeadDim, geo.hpb
	sm, sl, sacc := ms.m, ms.l, ms.acc

	// Head h of the block is query head head0+h: its z row and, with splits, its records.
	zrow := g.Reg(ptx.U32)
	g.Emit("mad.lo.u32", zrow, g.row, ptx.Imm(int64(c.Heads)), g.head0)
	zbase := zRow{f32: g.byteAddr(g.z, zrow, 4*d), bf16: g.byteAddr(g.zb, zrow, 2*d)}
	var recs, mine, one ptx.Reg
	var crec ptx.Sym
	recBytes := 4 * adRecWords(d)
	switch {
	case g.c.clustered():
		crec = g.DeclareShared("ad_rec", ptx.F32, hpb*c.Cluster*adRecWords(d))
		one = g.cmp("eq", ptx.U32, g.nsplit, ptx.Imm(1))
		// Every block of the cluster has begun: rank 0's records may be written.
		g.Emit("barrier.cluster.wait")
	case c.Split:
		// Records follow the counters, whose count depends on rows = %nctaid.x.
		cnt := g.op3("mul.lo.u32", ptx.U32, g.special(ptx.NCtaidX), ptx.Imm(int64(c.Heads/hpb)))
		g.Emit("add.u32", cnt, cnt, ptx.Imm(3))
		g.Emit("shr.u32", cnt, cnt, ptx.Imm(2))
		recs = g.byteAddr(g.ws, cnt, 16)
		ri := g.Reg(ptx.U32)
		g.Emit("mad.lo.u32", ri, zrow, g.special(ptx.NCtaidZ), g.split)
		mine = g.byteAddr(recs, ri, recBytes)
		one = g.cmp("eq", ptx.U32, g.nsplit, ptx.Imm(1))
	}
	e := g.Reg(ptx.U32)
	g.forLoop(e, g.op3("shl.b32", ptx.U32, g.tid, ptx.Imm(2)), ptx.Imm(int64(hpb*d)), ptx.Imm(int64(4*32*c.warps())), func() {
		h := g.op3("div.u32", ptx.U32, e, ptx.Imm(int64(d)))
		dd := g.op3("rem.u32", ptx.U32, e, ptx.Imm(int64(d)))
		mx := g.f32(float32(math.Inf(-1)))
		mw := g.Regs(ptx.F32, c.warps())
		for w := range c.warps() {
			si := g.op3("add.u32", ptx.U32, h, ptx.Imm(int64(w*hpb)))
			g.Emit("ld.shared.f32", mw[w], ptx.Addr{Base: g.sharedAddr(sm, si, 4)})
			g.Emit("max.f32", mx, mx, mw[w])
		}
		ms := g.safeMax(mx)
		sum := g.f32(0)
		o := []ptx.Reg{g.f32(0), g.f32(0), g.f32(0), g.f32(0)}
		x := g.Regs(ptx.F32, 4)
		for w := range c.warps() {
			si := g.op3("add.u32", ptx.U32, h, ptx.Imm(int64(w*hpb)))
			sw := g.exp2(g.op3("sub.f32", ptx.F32, mw[w], ms))
			lw := g.Reg(ptx.F32)
			g.Emit("ld.shared.f32", lw, ptx.Addr{Base: g.sharedAddr(sl, si, 4)})
			g.Emit("fma.rn.f32", sum, lw, sw, sum)
			ai := g.Reg(ptx.U32)
			g.Emit("mad.lo.u32", ai, si, ptx.Imm(int64(d)), dd)
			g.Emit("ld.shared.v4.f32", ptx.Vec(x), ptx.Addr{Base: g.sharedAddr(sacc, ai, 4)})
			for i := range o {
				g.Emit("fma.rn.f32", o[i], x[i], sw, o[i])
			}
		}
		write := func() { g.storeZ(zbase, e, o, sum) }
		if !c.Split {
			write()
			return
		}
		skip, end := g.NewLabel("rec"), g.NewLabel("out_done")
		g.EmitIf(one, true, "bra", ptx.Sym(skip))
		write()
		g.Emit("bra", ptx.Sym(end))
		g.Label(skip)
		if g.c.clustered() {
			// Record (h, split) of rank 0's, record-major by head.
			ri := g.Reg(ptx.U32)
			g.Emit("mad.lo.u32", ri, h, ptx.Imm(int64(c.Cluster)), g.split)
			remote := g.Reg(ptx.U32)
			g.Emit("mapa.shared::cluster.u32", remote, g.sharedAddr(crec, ri, recBytes), ptx.Imm(0))
			d0 := g.cmp("eq", ptx.U32, dd, ptx.Imm(0))
			g.EmitIf(d0, false, "st.shared::cluster.f32", ptx.Addr{Base: remote, Offset: int64(4 * d)}, mx)
			g.EmitIf(d0, false, "st.shared::cluster.f32", ptx.Addr{Base: remote, Offset: int64(4*d + 4)}, sum)
			g.Emit("mad.lo.u32", remote, dd, ptx.Imm(4), remote)
			g.Emit("st.shared::cluster.v4.f32", ptx.Addr{Base: remote}, ptx.Vec(o))
			g.Label(end)
			return
		}
		// Record of head h: (head0+h)*splits records after this block's own, whose split
		// index is already in mine.
		hr := g.op3("mul.lo.u32", ptx.U32, h, g.special(ptx.NCtaidZ))
		rec := g.byteAddr(mine, hr, recBytes)
		g.Emit("st.global.v4.f32", ptx.Addr{Base: g.byteAddr(rec, dd, 4)}, ptx.Vec(o))
		d0 := g.cmp("eq", ptx.U32, dd, ptx.Imm(0))
		g.EmitIf(d0, false, "st.global.f32", ptx.Addr{Base: rec, Offset: int64(4 * d)}, mx)
		g.EmitIf(d0, false, "st.global.f32", ptx.Addr{Base: rec, Offset: int64(4*d + 4)}, sum)
		g.Label(end)
	})
	switch {
	case g.c.clustered():
		g.EmitIf(one, false, "exit")
		g.clusterCombine(crec, zbase)
	case c.Split:
		g.when(one, true, func() { g.combine(recs, zrow, zbase) })
	}
}

// clusterCombine: the ranks' records stored, rank 0 sums them in split order into z; the
// other ranks are done.
func (g *adGen) clusterCombine(crec ptx.Sym, zbase zRow) {
	c, geo := g.c, g.geo
	d, hpb := c.HeadDim, geo.hpb
	g.Emit("barrier.cluster.arrive.release")
	g.EmitIf(g.cmp("ne", ptx.U32, g.split, ptx.Imm(0)), false, "exit")
	g.Emit("barrier.cluster.wait.acquire")
	e := g.Reg(ptx.U32)
	g.forLoop(e, g.op3("shl.b32", ptx.U32, g.tid, ptx.Imm(2)), ptx.Imm(int64(hpb*d)), ptx.Imm(int64(4*32*c.warps())), func() {
		h := g.op3("div.u32", ptx.U32, e, ptx.Imm(int64(d)))
		dd := g.op3("rem.u32", ptx.U32, e, ptx.Imm(int64(d)))
		// Record (h, s) at ((h*Cluster)+s)*adRecWords words; splits past nsplit keep m = -inf
		// and weigh nothing (split 0 holds a position, so the max is finite).
		ri := g.op3("mul.lo.u32", ptx.U32, h, ptx.Imm(int64(c.Cluster)))
		rec0 := g.sharedAddr(crec, ri, 4*adRecWords(d))
		col := g.Reg(ptx.U32)
		g.Emit("mad.lo.u32", col, dd, ptx.Imm(4), rec0)
		st := newSplitRecord(g.emitter)
		recs := make([]splitRecord, c.Cluster)
		for s := range recs {
			past := g.cmp("le", ptx.U32, g.nsplit, ptx.Imm(int64(s)))
			recs[s] = newSplitRecord(g.emitter)
			at := int64(4 * s * adRecWords(d))
			g.EmitIf(past, true, "ld.shared.f32", recs[s].m, ptx.Addr{Base: rec0, Offset: at + int64(4*d)})
			g.EmitIf(past, true, "ld.shared.f32", recs[s].l, ptx.Addr{Base: rec0, Offset: at + int64(4*d+4)})
			g.EmitIf(past, true, "ld.shared.v4.f32", ptx.Vec(recs[s].acc), ptx.Addr{Base: col, Offset: at})
		}
		g.foldRecords(st, recs)
		g.storeZ(zbase, e, st.acc, st.l)
	})
}

// splitRecord is one split's record of four dims of a head, as a combining thread loads it
// (m, l and the four sums), or the thread's running state of the splits folded so far
// (foldRecords).
type splitRecord struct {
	m, l ptx.Reg
	acc  []ptx.Reg
}

// newSplitRecord is a record that weighs nothing (m = -inf, the rest 0): a split past a row's
// last, or a running state before the first fold.
func newSplitRecord(e emitter) splitRecord {
	return splitRecord{m: e.f32(float32(math.Inf(-1))), l: e.f32(0), acc: []ptx.Reg{e.f32(0), e.f32(0), e.f32(0), e.f32(0)}}
}

// foldRecords folds recs into the running state st in their order: st rescaled to the new
// max, then each record weighed by 2^(m-max).
func (g *adGen) foldRecords(st splitRecord, recs []splitRecord) {
	next := g.Reg(ptx.F32)
	g.Emit("mov.f32", next, st.m)
	for _, r := range recs {
		g.Emit("max.f32", next, next, r.m)
	}
	scale := g.exp2(g.op3("sub.f32", ptx.F32, st.m, next)) // 0 before the first fold
	g.Emit("mul.f32", st.l, st.l, scale)
	for _, a := range st.acc {
		g.Emit("mul.f32", a, a, scale)
	}
	for _, r := range recs {
		w := g.exp2(g.op3("sub.f32", ptx.F32, r.m, next))
		g.Emit("fma.rn.f32", st.l, r.l, w, st.l)
		for i, a := range st.acc {
			g.Emit("fma.rn.f32", a, r.acc[i], w, a)
		}
	}
	g.Emit("mov.f32", st.m, next)
}

// zRow is where a head's row of z starts, and of its bf16 copy (z_bf16; not stored to when
// that is 0).
type zRow struct{ f32, bf16 ptx.Reg }

// storeZ writes four dims of z at element e: o / sum (with ZOptional, only where z is not 0),
// and where z_bf16 is not 0 bf16 of each there, rounded as the backend's cast rounds it.
func (g *adGen) storeZ(zbase zRow, e ptx.Reg, o []ptx.Reg, sum ptx.Reg) {
	inv := g.Reg(ptx.F32)
	g.Emit("rcp.rn.f32", inv, sum)
	for i := range o {
		g.Emit("mul.f32", o[i], o[i], inv)
	}
	f32 := func() { g.Emit("st.global.v4.f32", ptx.Addr{Base: g.byteAddr(zbase.f32, e, 4)}, ptx.Vec(o)) }
	if g.c.ZOptional {
		g.when(g.noZ, true, f32)
	} else {
		f32()
	}
	g.when(g.noZB, true, func() {
		lo, hi := g.Reg(ptx.B32), g.Reg(ptx.B32)
		g.Emit("cvt.rn.bf16x2.f32", lo, o[1], o[0])
		g.Emit("cvt.rn.bf16x2.f32", hi, o[3], o[2])
		g.Emit("st.global.v2.b32", ptx.Addr{Base: g.byteAddr(zbase.bf16, e, 2)}, ptx.Vec([]ptx.Reg{lo, hi}))
	})
}

// combine draws this block's ticket and, in the block that completes its (row, head group),
// sums the splits' records in split order into z and resets the counter. Each thread takes
// its four dims of one head and asks for every split's m, l and sums of them at once, up to
// adCombineBatch splits a round, keeping a running max over the rounds: one round trip to L2
// where a row has at most that many splits (two before session 37: the weights first, then
// the sums).
func (g *adGen) combine(recs, zrow ptx.Reg, zbase zRow) {
	c, geo := g.c, g.geo
	d, hpb := c.HeadDim, geo.hpb
	recBytes := 4 * adRecWords(d)
	flag := g.DeclareShared("ad_ticket", ptx.U32, 1)
	ci := g.Reg(ptx.U32)
	g.Emit("mad.lo.u32", ci, g.row, g.special(ptx.NCtaidY), g.by)
	ctr := g.byteAddr(g.ws, ci, 4)
	ticket, first := g.drawTicket(ctr, flag, g.tid)
	lastSplit := g.op3("sub.u32", ptx.U32, g.nsplit, ptx.Imm(1))
	g.EmitIf(g.cmp("ne", ptx.U32, ticket, lastSplit), false, "exit")
	splits := g.special(ptx.NCtaidZ)
	ri := g.op3("mul.lo.u32", ptx.U32, zrow, splits)
	base := g.byteAddr(recs, ri, recBytes) // record (head0, split 0)
	hstride := g.op3("mul.lo.u32", ptx.U32, splits, ptx.Imm(int64(recBytes)))
	s := g.Reg(ptx.U32)
	e := g.Reg(ptx.U32)
	g.forLoop(e, g.op3("shl.b32", ptx.U32, g.tid, ptx.Imm(2)), ptx.Imm(int64(hpb*d)), ptx.Imm(int64(4*32*c.warps())), func() {
		h := g.op3("div.u32", ptx.U32, e, ptx.Imm(int64(d)))
		dd := g.op3("rem.u32", ptx.U32, e, ptx.Imm(int64(d)))
		hb := g.Reg(ptx.U64)
		g.Emit("mul.wide.u32", hb, h, hstride)
		g.Emit("add.u64", hb, hb, base)
		col := g.byteAddr(hb, dd, 4)
		st := newSplitRecord(g.emitter)
		g.forLoop(s, ptx.Imm(0), g.nsplit, ptx.Imm(adCombineBatch), func() {
			// .cg: other SMs wrote the records and L1 is not coherent. Splits past nsplit keep
			// the zero record; split 0 holds a position, so the max is finite.
			recs := make([]splitRecord, adCombineBatch)
			for b := range recs {
				sb := g.op3("add.u32", ptx.U32, s, ptx.Imm(int64(b)))
				in := g.cmp("lt", ptx.U32, sb, g.nsplit)
				recs[b] = newSplitRecord(g.emitter)
				off := g.Reg(ptx.U64)
				g.Emit("mul.wide.u32", off, sb, ptx.Imm(int64(recBytes)))
				ra := g.op3("add.u64", ptx.U64, hb, off)
				g.EmitIf(in, false, "ld.global.cg.f32", recs[b].m, ptx.Addr{Base: ra, Offset: int64(4 * d)})
				g.EmitIf(in, false, "ld.global.cg.f32", recs[b].l, ptx.Addr{Base: ra, Offset: int64(4*d + 4)})
				g.EmitIf(in, false, "ld.global.cg.v4.f32", ptx.Vec(recs[b].acc), ptx.Addr{Base: g.op3("add.u64", ptx.U64, col, off)})
			}
			g.foldRecords(st, recs)
		})
		g.storeZ(zbase, e, st.acc, st.l)
	})
	g.when(first, false, func() { g.Emit("st.global.u32", ptx.Addr{Base: ctr}, ptx.Imm(0)) })
}

// AttnKernelSuffix names what c sets beyond a Llama kernel (a soft-cap, a window), so that
// layers with and without the window get kernels of their own: "" for none.
func AttnKernelSuffix(c AttnConfig) string {
	s := ""
	if c.Softcap > 0 {
		s += fmt.Sprintf("_cap%g", c.Softcap)
	}
	if c.Window > 0 {
		s += fmt.Sprintf("_w%d", c.Window)
	}
	if c.Warps > 0 {
		s += fmt.Sprintf("_warps%d", c.Warps)
	}
	if c.Unroll > 0 {
		s += fmt.Sprintf("_u%d", c.Unroll)
	}
	if c.tcOK() {
		s += "_tc"
	}
	if c.Cluster > 0 {
		s += fmt.Sprintf("_cl%d", c.Cluster)
	}
	if c.Prefetch > 0 {
		s += fmt.Sprintf("_pf%d", c.Prefetch)
	}
	return s
}
