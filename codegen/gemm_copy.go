package codegen

import (
	"cmp"
	"fmt"
	"slices"

	"xmix/bundle"
	"xmix/ops"
	"xmix/ptx"
)

// The copy-engine GEMM (op bundle.OpGemmCopy): y[rows,N] = bf16(x)[rows,K] . w[N,K]^T for
// decode buckets of at most 8 or 16 rows (Rows), served beside a library GEMM (the
// backend picks it per node; bundle.GemmCopyKernels). Inside a decode step such a GEMM is a
// read of W, and what decides its time is how much of W is on its way before the grid ahead
// ends: this kernel asks the copy engine (TMA: cp.async.bulk.tensor with mbarrier
// completion) for its first stages of W before griddepcontrol.wait, up to ~144 KiB a CTA,
// which no register ring can hold. On the H200 it shortens the Llama-3.1-8B 8-row step by
// 2.7-4.6% at contexts 80-2112 where it serves o, down and q/k/v beside cuBLASLt, and the
// 16-row step by 1.0-2.1% (testsuite/gpu/RESULTS.md, sessions 30-35).
//
// Work split. A CTA owns gcCols = 64 output columns (W rows) and one part of K: K splits over
// the Split CTAs of a cluster where the column tiles alone would leave most SMs idle (N/64 <
// gcSplitBelow: the 8B's o and down, 64 tiles), so that twice as many SMs pull W. Its 16
// warps are column groups (cg) by parts of a stage's K (q), as gcLayouts says for the rows;
// each warp multiplies its columns, in tiles of 16, by the token rows, in tiles of 8, with
// m16n8k16 (A = W, row-major; B = x, column-major).
//
// Stages. A stage is gcStage = 256 of the CTA's K: four tensor-map boxes of W (64 rows x 64
// K, 128-byte rows under the 128-byte swizzle, so that the eight rows a warp reads at once
// fall in different banks) and the rows' x (one tensor-map box of 256 f32 by Rows rows,
// dense; rows past the node's read as zeros), completing one mbarrier. Thread 0 asks for W of
// the first Stages stages, then every thread waits for the grid ahead (which writes x);
// thread 0 then asks for their x. One box a stage, not a bulk copy per row: x's row copies
// made the 16-row step 3-4% longer (session 35). Each stage's slot refills with stage
// i+Stages once every warp is past it (bar.sync).
//
// Sums. In a warp, lane (g, t) reads W elements [8t, 8t+8) of each 32-element chunk of its
// part for rows g and g+8 of a column tile, and the same x elements of token row g of each
// row tile; the K permutation is the same for both operands, so the products are W . x.
// Every warp's sums meet in shared memory and thread i adds entry i of each K part in part
// order; with a split, ranks 1.. store theirs into rank 0's shared memory (mapa,
// st.shared::cluster) and rank 0 adds them in rank order after the cluster barrier, so every
// run gives the same bits. x is rounded to bf16 as the library's cast rounds it: the op is
// gemm_copy, not gemm_tc's exact split.
const (
	gcCols         = 64
	gcStage        = 256
	gcBoxK         = 64                   // K of one W box: 128-byte rows, the swizzle's span
	gcSwizzle      = 128                  // bytes: the tensor map's CU_TENSOR_MAP_SWIZZLE_128B
	gcBoxBytes     = gcCols * 2 * gcBoxK  // bytes of one W box
	gcWBox         = gcCols * 2 * gcStage // bytes of one stage's W boxes
	gcWarps        = 16
	gcTile         = 8           // token rows of one m16n8k16's B
	gcColTile      = 16          // W rows of one m16n8k16's A
	gcChunk        = 32          // K a warp multiplies at once: lane t's elements [8t, 8t+8)
	gcXStride      = 4 * gcStage // shared bytes of one staged x row: the x box's rows, dense
	gcBars         = 128         // the mbarriers, at the start of the shared memory
	gcAlign        = 1024        // the slots' alignment: the swizzle's pattern repeats every 1024 bytes
	gcMaxStages    = 4           // slots of a ring a build may ask for (more measured no faster at 8 rows)
	gcSplitBelow   = 90          // column tiles below which K splits over a cluster
	gcSplit        = 2           // CTAs of such a cluster (4 measured slower)
	gcMaxCluster   = 8           // CTAs of a cluster every sm_90 GPU can launch (the portable size)
	gcPolls        = 1 << 22     // mbarrier polls before a stage that never lands traps
	gcEntry        = 16          // one lane's sums of one column tile and row tile: 4 f32
	wgMaxN         = 256         // the most columns (token rows) of one wgmma
	wgMaxSplit     = 4           // the most CTAs the warpgroup form splits K over
	wgThreads      = 128         // the warpgroup form's CTA: one warpgroup
	wgRows         = 64          // the rows of x one warpgroup multiplies in the wide form (a wgmma's M)
	wgMaxConsumers = 2           // the wide form's warpgroups at most (wgmma accumulators of 128 rows)
	wgWideSlots    = 4           // the wide form's ring slots unless a build asks for others
)

// gcStages are a ring's slots unless a build asks for others: on the H200, 3 made the 8B's
// 8- and 16-row steps 0.1-0.3% shorter than 4, and 2 made them 6.7-9.7% longer (session 36,
// testsuite/gpu/RESULTS.md).
const gcStages = 3

// gcLayout is one row count a copy-engine GEMM is made for. Up to 16 rows its warps multiply
// with mma.sync (m16n8k16; Groups > 0): each column group reads the staged x once a stage,
// and each K part's sums are added at the end, so more rows want fewer groups. From 32 rows
// (Warpgroup) it is the warpgroup form (gemm_wgmma.go): wgmma reads W and bf16 x from shared
// memory itself, one warpgroup multiplying the CTA's 64 columns by every row, a stage StageK
// of K.
type gcLayout struct {
	Rows, Groups int
	Warpgroup    bool
	StageK       int
	// Wide (warpgroup form): the rows may take the wide form (gemm_wide.go) rather than 64 W
	// rows a CTA: a gated kernel always, a plain one where a build asks (--copy-gemm-wide).
	Wide bool
	// Share (warpgroup form): column tiles of a cluster that share each stage's x, each
	// asking for its part of x's boxes with multicast to all of them (0 or 1: none), where K
	// is not split. At 128 rows a CTA's x is twice its W's bytes, and every column tile
	// reads all of it from L2.
	Share int
}

// gcLayouts are the row counts a copy-engine GEMM is made for. Checked at init.
// A mma.sync layout of 32 rows (two groups) made the 8B's 32-row step 0.5-13% longer than
// cuBLASLt's in every form measured (session 35: its x is as many bytes as its W, and its
// ring, early in the SMs, slows the attention ahead), so 32 rows and more take the
// warpgroup form, which reads bf16 x (a quarter of W's bytes at 32 rows) and no registers'
// worth of operands.
var gcLayouts = []gcLayout{
	{Rows: 8, Groups: 4}, {Rows: 16, Groups: 2},
	{Rows: 32, Warpgroup: true, StageK: 256}, {Rows: 64, Warpgroup: true, StageK: 256, Wide: true}, {Rows: 128, Warpgroup: true, StageK: 128, Share: 2, Wide: true},
}

// gcDefaultRows are the layouts' row counts a bundle carries kernels for unless a build asks
// for others (xmixc build --copy-gemm-rows): those measured faster in the step and checked
// against the CPU on the GPU, for the shapes of copyGemmShapes whose bound reaches them. On
// the H200 the warpgroup form made the 8B's steps of 32 and 64 rows 0.9-2.6% shorter than
// cuBLASLt's at contexts 80-2112. At 128 rows its o, q/k/v and down together made that step
// 1.5% longer (sessions 41-42), 0.8-0.9% with q/k/v's x shared (session 43), but o and down
// alone 0.6-1.1% shorter (session 53, testsuite/gpu/RESULTS.md).
var gcDefaultRows = []int{8, 16, 32, 64, 128}

func init() {
	for _, l := range gcLayouts {
		if l.Warpgroup {
			if l.Groups != 0 || l.Rows%8 != 0 || l.Rows > wgMaxN || l.StageK%gcBoxK != 0 || l.StageK < gcBoxK || l.StageK/gcBoxK%max(l.Share, 1) != 0 ||
				l.Wide && (l.Rows%wgRows != 0 || l.Rows/wgRows > wgMaxConsumers) {
				panic(fmt.Sprintf("codegen: warpgroup GEMM layout %+v: rows a multiple of 8 up to %d, a stage of whole %d-element boxes, as many for each CTA sharing x; the wide form's rows a multiple of %d, at most %d warpgroups' worth", l, wgMaxN, gcBoxK, wgRows, wgMaxConsumers))
			}
			continue
		}
		if l.Share > 1 {
			panic(fmt.Sprintf("codegen: copy-engine GEMM layout %+v: only the warpgroup form shares x", l))
		}
		parts := gcWarps / max(l.Groups, 1)
		if l.Rows%gcTile != 0 || gcCols/gcColTile*l.Rows/gcTile*32 > 32*gcWarps || l.Groups < 1 || gcCols/gcColTile%l.Groups != 0 ||
			gcWarps%l.Groups != 0 || gcStage%(parts*gcChunk) != 0 {
			panic(fmt.Sprintf("codegen: copy-engine GEMM layout %+v: rows a multiple of %d up to 32 (a thread adds each entry of the sums), groups dividing %d column tiles and %d warps, K parts of whole %d-element chunks",
				l, gcTile, gcCols/gcColTile, gcWarps, gcChunk))
		}
	}
	for _, r := range gcDefaultRows {
		if gcLayoutOf(r) == nil {
			panic(fmt.Sprintf("codegen: default copy-engine GEMM rows %d: no layout", r))
		}
	}
	for _, s := range copyGemmShapes {
		if s.K <= 0 || s.N <= 0 || copyRows(gcDefaultRows, s.MaxRows) != s.MaxRows {
			panic(fmt.Sprintf("codegen: default copy-engine GEMM shape %+v: want positive K and N, and most rows one of %v", s, gcDefaultRows))
		}
	}
}

// gcLayoutOf is the layout of exactly rows rows, nil if none.
func gcLayoutOf(rows int) *gcLayout {
	i := slices.IndexFunc(gcLayouts, func(l gcLayout) bool { return l.Rows == rows })
	if i < 0 {
		return nil
	}
	return &gcLayouts[i]
}

// GemmCopyConfig is one copy-engine GEMM: K x N, at most Rows token rows, K split over Split
// CTAs, Stages slots, x shared by Share column tiles (0 or 1: none; gcLayout.Share). Act, in
// the warpgroup form, is a gated activation's op (bundle.GatedActOps): the kernel serves the
// gate/up GEMM and that activation as one launch (wgStoreGated), each CTA's 64 W rows being
// gcCols/2 of gate and the same of up.
//
// Tiles (with Act, K not split) is the column tiles a CTA takes one after another through
// one ring, the next tile's first stages on their way while the last ones of the tile before
// are multiplied and its activation stored: gate/up has 448 tiles on the 8B, 3.4 waves of
// one CTA an SM, and a CTA that ends leaves its SM without W in flight until the next one's
// first stages land.
type GemmCopyConfig struct {
	K, N, Rows, Split, Stages, Share, Tiles int
	Act                                     string
	// NextAtAsk: the grid after it may launch once the CTA has asked for its last stage of W
	// (BuildInfo.CopyGemmNextAtAsk), not only once it has read every stage.
	NextAtAsk bool
	// Rope (warpgroup form, no Act): the kernel serves the q/k/v GEMM and the rope_kv after it
	// as one launch (wgStoreRope), each CTA's 64 W rows being 32 rows of a head's first half
	// and the same 32 of its second, so that both of a rotation's elements meet in one CTA; K
	// is not split. In the wide form (wideStoreRope) the CTA's W rows are Wide pairs' first
	// elements, then their second ones, and K may be split.
	Rope *RopeConfig
	// Wide (gemm_wide.go): the kernel's wide form, each CTA's output columns, one wgmma's B
	// multiplied by every row of x, 64 rows a warpgroup. With Act its W rows are that many of
	// gate's and the same of up's (Wide a multiple of 8, at most wgMaxN/2); with Rope, that
	// many pairs' first rows and their second rows (a multiple of 8*Split, at most wgMaxN/2);
	// otherwise that many of W's (a multiple of 8*Split, at most wgMaxN). Without Act K is
	// split over the Split CTAs of a cluster.
	Wide int
}

// layout is the config's layout, the zero one if Rows has none.
func (c GemmCopyConfig) layout() gcLayout {
	if l := gcLayoutOf(c.Rows); l != nil {
		return *l
	}
	return gcLayout{}
}

// groups is the column groups of the config's mma.sync layout, 0 if it has none.
func (c GemmCopyConfig) groups() int { return c.layout().Groups }

// warpgroup says whether the config's layout is the warpgroup form.
func (c GemmCopyConfig) warpgroup() bool { return c.layout().Warpgroup }

// stageK is the K of one stage: one box in the wide form, whose W rows are up to four times
// the others'.
func (c GemmCopyConfig) stageK() int {
	if c.Wide > 0 {
		return gcBoxK
	}
	return cmp.Or(c.layout().StageK, gcStage)
}

func (c GemmCopyConfig) parts() int      { return gcWarps / c.groups() }            // K parts of a stage
func (c GemmCopyConfig) colTiles() int   { return gcCols / gcColTile / c.groups() } // a warp's
func (c GemmCopyConfig) rowTiles() int   { return c.Rows / gcTile }
func (c GemmCopyConfig) chunks() int     { return gcStage / c.parts() / gcChunk } // a warp's, a stage
func (c GemmCopyConfig) entries() int    { return gcCols / gcColTile * c.rowTiles() * 32 }
func (c GemmCopyConfig) wBytes() int     { return c.wRows() * 2 * c.stageK() } // one stage's W
func (c GemmCopyConfig) kStages() int    { return c.K / c.Split / c.stageK() }
func (c GemmCopyConfig) tiles() int      { return max(c.Tiles, 1) }
func (c GemmCopyConfig) ringStages() int { return c.kStages() * c.tiles() } // a CTA's, all its tiles'
func (c GemmCopyConfig) recvBytes() int  { return (c.Split - 1) * c.partBytes() }
func (c GemmCopyConfig) shares() int     { return max(c.Share, 1) }

// yCols is a CTA's output columns: its W rows, or with Act or Rope half of them (act(gate) *
// up; a rotation's pairs, each of two columns).
func (c GemmCopyConfig) yCols() int {
	if c.paired() {
		return c.wRows() / 2
	}
	return c.wRows()
}

// wRows is a CTA's W rows: gcCols, or in the wide form Wide (with Act, of gate's and of up's;
// with Rope, of the pairs' first elements and of their second).
func (c GemmCopyConfig) wRows() int {
	switch {
	case c.Wide > 0 && c.paired():
		return 2 * c.Wide
	case c.Wide > 0:
		return c.Wide
	}
	return gcCols
}

// consumers is the warpgroups that multiply: one, or in the wide form one per 64 rows.
func (c GemmCopyConfig) consumers() int {
	if c.Wide > 0 {
		return c.Rows / wgRows
	}
	return 1
}

// produced says whether a producer warp refills the ring while the warpgroups multiply: with
// a shared x (it waits for the partners' reads) and in the wide form (for its warpgroups').
func (c GemmCopyConfig) produced() bool { return c.shares() > 1 || c.Wide > 0 }

// ctas is the grid: a CTA per column tile (Tiles of them) and K part.
func (c GemmCopyConfig) ctas() int { return c.N / c.wRows() * c.Split / c.tiles() }

// paired says whether a CTA's W rows are two halves (of 32, or Wide: Act, gate's and up's;
// Rope, a head's first half's and its second's) whose sums meet in the epilogue.
func (c GemmCopyConfig) paired() bool { return c.Act != "" || c.Rope != nil }
func (c GemmCopyConfig) cluster() int { return c.Split * c.shares() } // CTAs: K parts or tiles sharing x

// threads is a CTA's: gcWarps warps in the mma.sync form, one warpgroup in the warpgroup
// form, and where a producer warp refills the ring its warpgroups and that warp.
func (c GemmCopyConfig) threads() int {
	switch {
	case c.produced():
		return c.consumers()*wgThreads + 32 // and the producer warp
	case c.warpgroup():
		return wgThreads
	}
	return 32 * gcWarps
}

// xchgBytes is, with Act or Rope, where the second half's sums pass to the first half's warps
// (wgSecondHalf): past the ring, which holds the next tile's stages meanwhile.
func (c GemmCopyConfig) xchgBytes() int {
	if !c.paired() || c.Wide > 0 {
		return 0
	}
	return wgThreads / 2 * c.Rows / 2 * 4
}

// xBytes is one stage's x: f32 in the mma.sync form, bf16 in the warpgroup form.
func (c GemmCopyConfig) xBytes() int {
	if c.warpgroup() {
		return c.Rows * 2 * c.stageK()
	}
	return c.Rows * gcXStride
}

// partBytes is one K part's sums (mma.sync form) or one rank's (warpgroup form: every
// thread's accumulators; in the wide form those of one rank's column slice, wideStore).
func (c GemmCopyConfig) partBytes() int {
	if c.Wide > 0 {
		return c.consumers() * wgThreads * c.wRows() / 2 / c.Split * 4
	}
	if c.warpgroup() {
		return c.threads() * c.Rows / 2 * 4
	}
	return c.entries() * gcEntry
}

func (c GemmCopyConfig) slotBytes() int {
	return (c.wBytes() + c.xBytes() + gcAlign - 1) &^ (gcAlign - 1)
}

// shared: the mbarriers, up to gcAlign bytes until the first slot (the base's alignment is
// the driver's), the slots, and rank 0's place for the other ranks' sums (in the warpgroup
// form the ring itself, free once every rank's loop has ended, or more where it is smaller).
func (c GemmCopyConfig) shared() int {
	if c.warpgroup() {
		return gcAlign + max(c.Stages*c.slotBytes(), c.recvBytes()) + c.xchgBytes()
	}
	return gcAlign + c.Stages*c.slotBytes() + c.recvBytes()
}

// fitSlots is how many ring slots fit the shared memory beside what else the CTA keeps there
// (shared): in the mma.sync form the other ranks' sums, in the warpgroup form (whose ring
// receives those) the up sums of a kernel with Act.
func (c GemmCopyConfig) fitSlots() int {
	if c.warpgroup() {
		return (bundle.MaxDynamicShared - gcAlign - c.xchgBytes()) / c.slotBytes()
	}
	return (bundle.MaxDynamicShared - gcAlign - c.recvBytes()) / c.slotBytes()
}

// GemmCopyFor is the copy-engine GEMM of at most rows token rows for a K x N weight, or an
// error saying why there is none: rows one of gcLayouts', N a multiple of the CTA's columns,
// K of a stage (times the split). Its ring has as many slots as asked for (slots > 0), else
// gcStages, and never more than fit the shared memory.
func GemmCopyFor(k, n, rows, slots int) (GemmCopyConfig, error) {
	c := GemmCopyConfig{K: k, N: n, Rows: rows, Split: 1}
	if c.layout().Rows == 0 {
		return GemmCopyConfig{}, fmt.Errorf("copy-engine GEMM: %d rows, want one of %v", rows, CopyGemmLayoutRows())
	}
	if k <= 0 || n <= 0 || n%gcCols != 0 {
		return GemmCopyConfig{}, fmt.Errorf("copy-engine GEMM: N=%d must be a positive multiple of %d", n, gcCols)
	}
	// Split K over a cluster where the column tiles alone would leave most SMs idle: in the
	// mma.sync form over gcSplit CTAs, in the warpgroup form over as many of
	// 2 and 4 as it takes to reach gcSplitBelow CTAs, as far as K divides.
	if tiles := n / gcCols; tiles < gcSplitBelow {
		c.Split = gcSplit
		for c.warpgroup() && tiles*c.Split < gcSplitBelow && k%(2*c.Split*c.stageK()) == 0 && c.Split < wgMaxSplit {
			c.Split *= 2
		}
	}
	if k%(c.Split*c.stageK()) != 0 {
		return GemmCopyConfig{}, fmt.Errorf("copy-engine GEMM: K=%d must be a positive multiple of %d", k, c.Split*c.stageK())
	}
	// Column tiles share x where they pair up and K is not split; an odd count keeps its own
	// x. Split K and a shared x make clusters of 4: the 8B's o and down at 128 rows cost 0.73
	// and 2.00 ms a step so, where cuBLASLt's cost 0.46 and 1.36 in the same run (session 43,
	// testsuite/gpu/RESULTS.md), as clusters of 4 lost in sessions 34 and 41.
	if share := c.layout().Share; share > 1 && c.Split == 1 && n/gcCols%share == 0 {
		c.Share = share
	}
	if slots <= 0 {
		slots = gcStages
		if c.Share > 1 {
			slots++ // a refill waits for the partners too: one more stage on its way
		}
	}
	c.Stages = min(c.kStages(), slots, c.fitSlots())
	if c.shared() > bundle.MaxDynamicShared {
		return GemmCopyConfig{}, fmt.Errorf("copy-engine GEMM: K=%d N=%d at %d rows: %d bytes of shared memory, more than %d", k, n, rows, c.shared(), bundle.MaxDynamicShared)
	}
	return c, nil
}

// GatedCopyFor is GemmCopyFor's kernel with the gated activation act (an op of
// bundle.GatedActOps) in its epilogue, for the gate/up projection's K x N (N = 2 x the
// activation's width): the warpgroup form only.
func GatedCopyFor(k, n, rows, slots int, act string) (GemmCopyConfig, error) {
	if !slices.Contains(bundle.GatedActOps, act) {
		return GemmCopyConfig{}, fmt.Errorf("copy-engine GEMM with an activation: %q, want one of %v", act, bundle.GatedActOps)
	}
	c, err := GemmCopyFor(k, n, rows, slots)
	if err != nil {
		return GemmCopyConfig{}, err
	}
	if !c.warpgroup() {
		return GemmCopyConfig{}, fmt.Errorf("copy-engine GEMM with an activation: %d rows, want rows of the warpgroup form", rows)
	}
	if c.layout().Wide {
		return wideGatedFor(k, n, rows, slots, act)
	}
	// The epilogue pairs a tile's gate and up columns in the CTA: x is never shared over a
	// cluster (the 128-row layout's share), so the ring is restaged without the partners' slot.
	if c.Share > 1 {
		c.Share = 0
		c.Stages = min(c.kStages(), cmp.Or(max(slots, 0), gcStages), c.fitSlots())
	}
	c.Act = act
	if tiles := n / gcCols; c.Split == 1 && tiles > targetSMs {
		// The fewest tiles a CTA that fill no more than the SMs, in CTAs of as many each.
		c.Tiles = (tiles + targetSMs - 1) / targetSMs
		for tiles%c.Tiles != 0 {
			c.Tiles++
		}
		// A ring's slots may hold the next tile's stages too.
		c.Stages = min(c.ringStages(), cmp.Or(max(slots, 0), gcStages), c.fitSlots())
	}
	if c.shared() > bundle.MaxDynamicShared {
		return GemmCopyConfig{}, fmt.Errorf("copy-engine GEMM with an activation: K=%d N=%d at %d rows: %d bytes of shared memory, more than %d", k, n, rows, c.shared(), bundle.MaxDynamicShared)
	}
	return c, nil
}

// RopeCopyFor is GemmCopyFor's kernel with the rotation and KV write of rc (no bias, no
// QK-norm) in its epilogue, for the q/k/v projection's K x N: the warpgroup form with K not
// split only.
func RopeCopyFor(k, n, rows, slots int, rc RopeConfig) (GemmCopyConfig, error) {
	if err := ropeCopyErr(rc, n); err != nil {
		return GemmCopyConfig{}, fmt.Errorf("copy-engine GEMM with rope_kv: %w", err)
	}
	c, err := GemmCopyFor(k, n, rows, slots)
	if err != nil {
		return GemmCopyConfig{}, err
	}
	if !c.warpgroup() {
		return GemmCopyConfig{}, fmt.Errorf("copy-engine GEMM with rope_kv: %d rows, want rows of the warpgroup form", rows)
	}
	if gcLayoutOf(rows).Wide {
		return wideRopeFor(k, n, rows, slots, rc)
	}
	// A CTA rotates its own pairs: K is never split over a cluster, nor x shared.
	c.Split, c.Share, c.Rope = 1, 0, &rc
	c.Stages = min(c.ringStages(), cmp.Or(max(slots, 0), gcStages), c.fitSlots())
	if c.shared() > bundle.MaxDynamicShared {
		return GemmCopyConfig{}, fmt.Errorf("copy-engine GEMM with rope_kv: K=%d N=%d at %d rows: %d bytes of shared memory, more than %d", k, n, rows, c.shared(), bundle.MaxDynamicShared)
	}
	return c, nil
}

// plainTwin is the plain kernel that sums as c, a kernel with rope_kv, does: the same form,
// K split, columns a CTA and ring, without the rotation (TestGemmCopyRopeMatchesThePair: c's
// y is the twin's rotated, bit for bit).
func (c GemmCopyConfig) plainTwin() GemmCopyConfig {
	if c.Wide > 0 {
		c.Wide = c.wRows() // the pairs' first elements and their second
	}
	c.Rope = nil
	return c
}

// ropeCopyErr says why rope rc over n columns cannot be a copy-engine GEMM's epilogue: it
// needs n to be the q/k/v row, no bias or QK-norm, and a head's half of whole 32-row boxes.
func ropeCopyErr(rc RopeConfig, n int) error {
	if _, err := ropeAttrs(rc); err != nil {
		return err
	}
	if rc.Bias || rc.QKNorm || rc.HeadDim%gcCols != 0 || n != (rc.Heads+2*rc.KVHeads)*rc.HeadDim {
		return fmt.Errorf("rope %+v over %d columns: want no bias or QK-norm, head dim a multiple of %d, and the q/k/v row's width", rc, n, gcCols)
	}
	return nil
}

// CheckCopyGemmSlots checks a build's ring slots of a copy-engine GEMM: 0 (the measured
// default, gcStages) to gcMaxStages.
func CheckCopyGemmSlots(n int) error {
	if n < 0 || n > gcMaxStages {
		return fmt.Errorf("copy-engine GEMM ring of %d slots: want 1 to %d, or 0 for the default (%d)", n, gcMaxStages, gcStages)
	}
	return nil
}

// CheckCopyGemmRows checks a build's row counts of copy-engine GEMMs: each one of
// gcLayouts', none twice.
func CheckCopyGemmRows(rows []int) error {
	for i, r := range rows {
		if gcLayoutOf(r) == nil {
			return fmt.Errorf("copy-engine GEMMs of %d rows: want rows among %v", r, CopyGemmLayoutRows())
		}
		if slices.Contains(rows[:i], r) {
			return fmt.Errorf("copy-engine GEMMs of %d rows named twice", r)
		}
	}
	return nil
}

// CopyGemmDefaultRows are the row counts a bundle carries copy-engine kernels for unless a
// build names others.
func CopyGemmDefaultRows() []int { return slices.Clone(gcDefaultRows) }

// CopyGemmLayoutRows are the row counts gcLayouts makes kernels for, fewest first.
func CopyGemmLayoutRows() []int {
	var rows []int
	for _, l := range gcLayouts {
		rows = append(rows, l.Rows)
	}
	return rows
}

// Attrs are the kernel's reference attributes and launch. In the warpgroup form x is the
// library cast's bf16, in boxes of gcBoxK under the swizzle, as W.
func (c GemmCopyConfig) Attrs() bundle.GemmCopyAttrs {
	a := bundle.GemmCopyAttrs{K: c.K, N: c.N, Rows: c.Rows, Box: [2]int{gcBoxK, c.wBoxRows()}, Swizzle: gcSwizzle, XBox: [2]int{gcStage, c.Rows},
		Grid: c.ctas(), Cluster: c.cluster(), Block: c.threads(), Shared: c.shared()}
	if c.warpgroup() {
		a.XBox, a.XBF16, a.XSwizzle = [2]int{gcBoxK, c.Rows}, true, gcSwizzle
		if c.Wide > 0 {
			a.XBox[1] = c.Rows / c.shares() // each CTA sharing x asks for its rows of it
		}
	}
	if c.Act != "" {
		a.Act, a.YBF16 = c.Act, true
	}
	if c.Tiles > 1 {
		a.Tiles = c.Tiles
	}
	a.Wide = c.Wide
	if c.Rope != nil {
		kv, _ := kvAttrs(*c.Rope) // checked by RopeCopyFor and GemmCopy
		a.RopeKV = &bundle.KVShape{Heads: kv.Heads, KVHeads: kv.KVHeads, HeadDim: kv.HeadDim,
			BlockSize: kv.BlockSize, MaxBlocksPerSeq: kv.MaxBlocksPerSeq, KVDtype: kv.KVDtype}
	}
	return a
}

// Launch is the kernel's grid, block and dynamic shared memory.
func (c GemmCopyConfig) Launch() ops.Launch {
	a := c.Attrs()
	return ops.Launch{Grid: [3]int{a.Grid, 1, 1}, Block: [3]int{a.Block, 1, 1}, Shared: a.Shared}
}

// copyGemmShape is a GEMM shape (K inputs, N outputs) given copy-engine kernels in decode
// buckets of at most MaxRows rows (and of the build's row counts, copyRows). A build that
// names its shapes or row counts (xmixc build --copy-gemms, --copy-gemm-rows) puts no bound.
type copyGemmShape struct{ K, N, MaxRows int }

// copyGemmShapes are the GEMMs a bundle carries copy-engine kernels for by default, each in
// the buckets where it was measured faster inside the decode step than cuBLASLt's, on the H200
// but where an H100 is named (testsuite/gpu/RESULTS.md):
//   - Llama-3.1-8B's o (4096 x 4096), q/k/v (4096 x 6144) and down (14336 x 4096), at 8 and
//     16 rows (session 35, with x through its tensor map) and at 32 and 64 (sessions 41-42, in
//     the warpgroup form, all three together, not one by one); o and down at 128 rows too,
//     measured one by one there (session 53: o -0.3..-0.5%, down -0.3..-0.5%, both -0.6..-1.1%
//     of the 128-row step at contexts 80-2112; q/k/v +0.5..+0.8%). Its gate/up (28672
//     columns: enough CTAs for the library's kernel to stream W at full speed) made the 8- and
//     16-row steps 2-4% longer, and its LM head changed nothing (session 36).
//   - Llama-3.2-1B's o (2048 x 2048), q/k/v (2048 x 3072) and down (8192 x 2048), at up to 32
//     rows. At 8 rows its step 0.6-2.0% shorter; at 16 and 32 rows, before q/k/v's kernel
//     took RoPE and the KV write, +2.2..+2.6% and +1.1% / -0.9% at contexts 80 / 2112
//     (session 52, H200). With that kernel all three made the 16- and 32-row steps 1.2-2.4%
//     shorter at contexts 80-2112 on an H100, where cuBLASLt's o, q/k/v and down took 2-3x
//     their weights' read time (session 82). At 64 and 128 rows they made the step 0.3-19%
//     longer, in either form (sessions 52-53 and 82).
//
// Other shapes (a tensor-parallel rank's, Qwen3's down) were not measured.
var copyGemmShapes = []copyGemmShape{
	{4096, 4096, 128}, {4096, 6144, 64}, {14336, 4096, 128},
	{2048, 2048, 32}, {2048, 3072, 32}, {8192, 2048, 32},
}

// copyShape says whether the build gives the GEMM (k, n) of a decode bucket of rows rows a
// copy-engine kernel (where its row counts hold the bucket, copyRows).
func (g *gen) copyShape(k, n, rows int) bool {
	return slices.ContainsFunc(g.copyShapes, func(s copyGemmShape) bool { return s.K == k && s.N == n && rows <= s.MaxRows })
}

// copyRows is the fewest of rows (the row counts a build makes kernels for, fewest first)
// that hold m rows, or 0 if none does.
func copyRows(rows []int, m int) int {
	for _, r := range rows {
		if m <= r {
			return r
		}
	}
	return 0
}

// copyGemms adds to the bundle a copy-engine GEMM for each GEMM that a decode bucket runs on
// tensor cores (a node a backend may give a library) whose shape the build names (by default
// copyGemmShapes), in the fewest rows of gcLayouts' that hold the bucket's; guarded GEMMs
// (heavy apps') are left alone; then those with an epilogue (ropeCopies, gatedCopies).
func (g *gen) copyGemms(templates []bundle.Template) error {
	rope, err := g.ropeCopies(templates)
	if err != nil {
		return err
	}
	// A layer whose q/k/v an app's op at attn.q, attn.k or attn.v parts from its rope_kv runs
	// the plain kernel and rope_kv one by one, and rows without the op keep the fused
	// kernel's bits only if the plain kernel sums as it does: so the plain kernel of a shape
	// and rows given one with rope_kv is that one's twin (plainTwin), whatever the build asks
	// of the others.
	twins := map[[3]int]GemmCopyConfig{}
	for _, k := range rope {
		twins[[3]int{k.config.K, k.config.N, k.config.Rows}] = k.config.plainTwin()
	}
	seen := map[[3]int]bool{}
	for _, t := range templates {
		if t.Kind != bundle.Decode || copyRows(g.copyRows, t.Tokens) == 0 {
			continue
		}
		for _, n := range slices.Concat(t.NodeLists()...) {
			k := g.kernels[n.Kernel]
			if k == nil {
				continue
			}
			m, ok, err := bundle.GemmOf(n, k.bundleKernel())
			if err != nil {
				return fmt.Errorf("template %s: %w", t.Name, err)
			}
			key := [3]int{m.K, m.N, copyRows(g.copyRows, m.M)}
			if !ok || m.Guard != 0 || key[2] == 0 || seen[key] || !g.copyShape(m.K, m.N, m.M) {
				continue
			}
			seen[key] = true
			c, twin := twins[key]
			if !twin {
				if c, err = g.plainCopyFor(m.K, m.N, key[2]); err != nil {
					return fmt.Errorf("template %s: node %s: %w", t.Name, n.Label, err)
				}
			}
			if err := g.addCopyKernel(copyKernel{fmt.Sprintf("gemm_copy_k%d_n%d_r%d", m.K, m.N, c.Rows), c}); err != nil {
				return err
			}
		}
	}
	gated, err := g.gatedCopies(templates)
	if err != nil {
		return err
	}
	for _, k := range append(rope, gated...) {
		if err := g.addCopyKernel(k); err != nil {
			return err
		}
	}
	return nil
}

// copyKernel is a copy-engine kernel the build adds: its name and configuration.
type copyKernel struct {
	name   string
	config GemmCopyConfig
}

func (g *gen) addCopyKernel(k copyKernel) error {
	_, err := g.kernel(k.name, func() (*Kernel, error) { return GemmCopy(k.name, k.config) })
	return err
}

// plainCopyFor is the build's plain copy-engine GEMM of K x N for rows rows: the wide form
// where the build asks for it and the rows have one (WideCopyFor), else GemmCopyFor's; with
// the build's ring slots and next-grid launch (withNextAtAsk).
func (g *gen) plainCopyFor(k, n, rows int) (GemmCopyConfig, error) {
	form := GemmCopyFor
	if g.copyWide && gcLayoutOf(rows).Wide {
		form = WideCopyFor
	}
	c, err := form(k, n, rows, g.copySlots)
	return g.withNextAtAsk(c), err
}

// withNextAtAsk is c with the build's next-grid launch (BuildInfo.CopyGemmNextAtAsk) where
// its form takes one: the wide form's producer warp lets the next grid launch as it exits.
func (g *gen) withNextAtAsk(c GemmCopyConfig) GemmCopyConfig {
	c.NextAtAsk = g.copyNextAtAsk && c.Wide == 0
	return c
}

// MaxRopeCopyRows bounds BuildInfo.RopeCopyRows: the most rows of a warpgroup layout.
const MaxRopeCopyRows = wgMaxN

// DefaultRopeCopyRows is the largest decode bucket given a copy-engine kernel for the q/k/v
// GEMM and its rope_kv together unless a build says otherwise. On the H200 (session 49,
// testsuite/gpu/RESULTS.md) it made the 8B's 32-row step 0.36-0.85% shorter at contexts
// 80-2112, and its 64-row step 5.5% / 11.9% longer at 576 / 2112 (0.1% shorter at 80): traced,
// the attention after it read its K/V 30% slower, why not yet found. On an H100 (session 75)
// the 64-row step was 2.5-6.1% longer with it, and the 128-row step, whose q/k/v takes a
// copy-engine kernel only where a build names its shape (--copy-gemms), 4.5-10.7% longer.
const DefaultRopeCopyRows = 32

// CheckRopeCopyRows checks a build's largest bucket given the copy-engine kernel with rope_kv
// (BuildInfo.RopeCopyRows, xmixc build --rope-copy-rows): 0 (none) to MaxRopeCopyRows.
func CheckRopeCopyRows(n int) error {
	return checkEpilogueRows("copy-engine kernels with rope_kv", n)
}

// ropeCopies are the copy-engine GEMMs with the rotation and KV write in their epilogue
// (RopeCopyFor) for each GEMM and rope_kv after it (bundle.RopePairAt: the q/k/v projection
// where no kernel of the bundle's fuses them) of a decode bucket of at most ropeCopyRows rows
// whose row count takes the warpgroup form, where the build makes copy-engine kernels for the
// GEMM's shape.
func (g *gen) ropeCopies(templates []bundle.Template) ([]copyKernel, error) {
	return g.epilogueCopies(templates, g.ropeCopyRows, func(nodes []bundle.Node, i int, kernel func(string) bundle.Kernel) (*copyPair, error) {
		m, rope, ok, err := bundle.RopePairAt(nodes, i, kernel)
		if err != nil || !ok || !g.copyShape(m.K, m.N, m.M) {
			return nil, err
		}
		kv, ok := dtypeOf(rope.Shape.KVDtype)
		if !ok {
			return nil, fmt.Errorf("node %s: kv dtype %q", nodes[i+1].Label, rope.Shape.KVDtype)
		}
		rc := RopeConfig{Heads: rope.Shape.Heads, KVHeads: rope.Shape.KVHeads, HeadDim: rope.Shape.HeadDim, BlockSize: rope.Shape.BlockSize,
			MaxBlocksPerSeq: rope.Shape.MaxBlocksPerSeq, KVDtype: kv}
		return &copyPair{gemm: m, epilogue: bundle.OpRopeKV,
			name:   fmt.Sprintf("_rope_kv_h%d_kv%d_d%d_%s", rc.Heads, rc.KVHeads, rc.HeadDim, rope.Shape.KVDtype),
			config: func(rows int) (GemmCopyConfig, error) { return RopeCopyFor(m.K, m.N, rows, g.copySlots, rc) }}, nil
	})
}

// copyPair is a GEMM node and the node after it that one copy-engine kernel with an epilogue
// may serve: the GEMM, the epilogue's op (bundle.GemmCopyShape.Act), the kernel's name past
// its shape and rows, and the kernel's configuration for a row count.
type copyPair struct {
	gemm     bundle.GEMM
	epilogue string
	name     string
	config   func(rows int) (GemmCopyConfig, error)
}

// epilogueCopies are a copy-engine kernel for each pair of nodes (pairAt: nil where nodes[i]
// starts none) of the decode buckets of at most maxRows rows whose row count takes the
// warpgroup form, once per shape and row count; a shape the kernel cannot take is left to the
// two nodes one by one.
func (g *gen) epilogueCopies(templates []bundle.Template, maxRows int, pairAt func(nodes []bundle.Node, i int, kernel func(string) bundle.Kernel) (*copyPair, error)) ([]copyKernel, error) {
	kernel := func(name string) bundle.Kernel {
		if k := g.kernels[name]; k != nil {
			return k.bundleKernel()
		}
		return bundle.Kernel{}
	}
	var out []copyKernel
	seen := map[bundle.GemmCopyShape]map[int]bool{}
	for _, t := range templates {
		if !g.epilogueCopyAt(t.Kind, t.Tokens, maxRows) {
			continue
		}
		for _, nodes := range t.NodeLists() {
			for i, n := range nodes {
				p, err := pairAt(nodes, i, kernel)
				if err != nil {
					return nil, fmt.Errorf("template %s: node %s: %w", t.Name, n.Label, err)
				}
				if p == nil {
					continue
				}
				r := copyRows(g.copyRows, p.gemm.M)
				key := bundle.GemmCopyShape{K: p.gemm.K, N: p.gemm.N, Act: p.epilogue}
				if r == 0 || seen[key][r] {
					continue
				}
				if seen[key] == nil {
					seen[key] = map[int]bool{}
				}
				seen[key][r] = true
				c, err := p.config(r)
				if err != nil {
					continue // a shape the kernel cannot take (K not of whole stages): the two nodes run one by one
				}
				if c.Rows != r && seen[key][c.Rows] {
					continue // a layout of more rows serves this bucket, and one that bucket's kernel already
				}
				seen[key][c.Rows] = true
				c = g.withNextAtAsk(c)
				out = append(out, copyKernel{fmt.Sprintf("gemm_copy_k%d_n%d_r%d%s", p.gemm.K, p.gemm.N, c.Rows, p.name), c})
			}
		}
	}
	return out, nil
}

// MaxGatedCopyRows bounds BuildInfo.GatedCopyRows: the most rows of a warpgroup layout.
const MaxGatedCopyRows = wgMaxN

// DefaultGatedCopyRows is the largest decode bucket given a copy-engine kernel for the gate/up
// GEMM and its activation together unless a build says otherwise. On the H200 (session 47,
// testsuite/gpu/RESULTS.md) it made the 8B's 32-row step 0.7-1.3% shorter at contexts
// 80-2112 and the 1B's 2.5-3.9%. From 64 rows it takes the wide form (session 61), which on
// an H100 (session 64) made the 8B's 64- and 128-row steps 1.9-4.9% shorter at contexts 80
// and 2112 and the 1B's 0.3-2.3%; the one-tile form had made the 8B's 64-row step 2.5-3.1%
// longer.
const DefaultGatedCopyRows = 128

// CheckGatedCopyRows checks a build's largest bucket given the gated copy-engine kernel
// (BuildInfo.GatedCopyRows, xmixc build --gated-copy-rows): 0 (none) to MaxGatedCopyRows.
func CheckGatedCopyRows(n int) error { return checkEpilogueRows("gated copy-engine kernels", n) }

// checkEpilogueRows checks a build's largest bucket given copy-engine kernels with an
// epilogue (what): 0 (none) to the most rows of a warpgroup layout.
func checkEpilogueRows(what string, n int) error {
	if n < 0 || n > wgMaxN {
		return fmt.Errorf("%s up to %d rows: want 0 (none) to %d", what, n, wgMaxN)
	}
	return nil
}

// epilogueCopyAt says whether templates of kind and rows rows may get copy-engine kernels with
// an epilogue: decode buckets whose copy-engine row count takes the warpgroup form and is at
// most maxRows. The count, not the bucket's rows: the backend serves every bucket a kernel
// holds (the 128-row bucket too, had a 32-row bucket of a build with only 128-row kernels
// been given one).
func (g *gen) epilogueCopyAt(kind bundle.TemplateKind, rows, maxRows int) bool {
	r := copyRows(g.copyRows, rows)
	return kind == bundle.Decode && r > 0 && r <= maxRows && gcLayoutOf(r).Warpgroup
}

// gatedCopies are the copy-engine GEMMs with the activation in their epilogue (GatedCopyFor)
// for each GEMM and gated activation after it (bundle.GatedPairAt: the gate/up projection
// where no kernel of the bundle's fuses it) of a decode bucket of at most gatedCopyRows rows
// whose row count takes the warpgroup form.
func (g *gen) gatedCopies(templates []bundle.Template) ([]copyKernel, error) {
	return g.epilogueCopies(templates, g.gatedCopyRows, func(nodes []bundle.Node, i int, kernel func(string) bundle.Kernel) (*copyPair, error) {
		m, act, ok, err := bundle.GatedPairAt(nodes, i, kernel)
		if err != nil || !ok {
			return nil, err
		}
		return &copyPair{gemm: m, epilogue: act.Op, name: "_" + act.Op,
			config: func(rows int) (GemmCopyConfig, error) {
				return g.gatedCopyFor(m.K, m.N, rows, act.Op)
			}}, nil
	})
}

// The gated copy-engine kernels of buckets below the smallest wide layout's rows
// (BuildInfo.GatedCopyWide, xmixc build --gated-copy-wide): such a bucket may run that
// layout's wide kernel, x's rows past the bucket's zero-filled by the tensor map's bounds.
const (
	// GatedWideAuto, the default: the wide kernel where it runs more CTAs than the bucket's
	// own (the 8B's 32 rows: 128 against 112 on 132 SMs) or the bucket has none of its own
	// (the 8B's 16 rows). On an H100 (testsuite/gpu/RESULTS.md, session 73) it made the 8B's
	// 16- and 32-row steps 1.8-3.1% shorter at contexts 80-2112; the 1B's own kernels run 128
	// CTAs, as many, and stay: the wide one made its 32-row step 0.7-1.1% longer.
	GatedWideAuto = "auto"
	// GatedWideAll: the wide kernel in every such bucket.
	GatedWideAll = "all"
	// GatedWideOwn: every bucket its own layout's kernel (bundles built before the setting).
	GatedWideOwn = "own"
)

// GatedWideModes are the values of BuildInfo.GatedCopyWide ("" is GatedWideOwn).
var GatedWideModes = []string{GatedWideAuto, GatedWideAll, GatedWideOwn}

// CheckGatedCopyWide checks BuildInfo.GatedCopyWide.
func CheckGatedCopyWide(mode string) error {
	if mode != "" && !slices.Contains(GatedWideModes, mode) {
		return fmt.Errorf("gated copy-engine kernels' wide form %q: want one of %v", mode, GatedWideModes)
	}
	return nil
}

// gatedCopyFor is the gated copy-engine kernel of K x N (gate and up) with act for a decode
// bucket of rows rows: its own layout's, or by gatedCopyWide the smallest wide layout's that
// holds the rows, where that layout is among the build's row counts (copyRows) and within
// gatedCopyRows (the bound is on the kernels' rows).
func (g *gen) gatedCopyFor(k, n, rows int, act string) (GemmCopyConfig, error) {
	own, ownErr := GatedCopyFor(k, n, rows, g.copySlots, act)
	if g.gatedCopyWide == GatedWideOwn {
		return own, ownErr
	}
	wideRows := wideRowsFor(rows)
	if wideRows == rows || wideRows > g.gatedCopyRows || !slices.Contains(g.copyRows, wideRows) {
		return own, ownErr
	}
	wide, err := GatedCopyFor(k, n, wideRows, g.copySlots, act)
	if err != nil {
		return own, ownErr
	}
	if g.gatedCopyWide == GatedWideAll || ownErr != nil || wide.Attrs().Grid > own.Attrs().Grid {
		return wide, nil
	}
	return own, nil
}

// wideRowsFor is the rows of the smallest layout with the wide form that holds rows (the
// layout's own where it has one).
func wideRowsFor(rows int) int {
	for _, l := range gcLayouts {
		if l.Wide && l.Rows >= rows {
			return l.Rows
		}
	}
	return rows
}

// GemmCopy generates the copy-engine GEMM; parameters x_map (128 bytes by value: a tensor
// map of x, f32, with boxes of 256 x c.Rows, bundle.GemmXMap), w_map (the same of W, bf16,
// boxes of 64 x 64 under the 128-byte swizzle, bundle.GemmWMap), y (u64), rows (u32, at
// most c.Rows), and with Act y_bf16 (u64, bundle.GemmYBF16). Launch it with c.Launch().
func GemmCopy(name string, c GemmCopyConfig) (*Kernel, error) {
	wg := c.warpgroup()
	if c.layout().Rows == 0 || c.Split < 1 || c.Split > wgMaxSplit || c.K%(c.Split*c.stageK()) != 0 || c.N%c.wRows() != 0 || c.Stages < 1 ||
		c.Stages > c.ringStages() || c.Stages > gcBars/8 || c.shared() > bundle.MaxDynamicShared ||
		!wg && c.Stages*c.slotBytes() < c.parts()*c.partBytes() ||
		c.Share > 1 && (!wg || c.Split > 1 || c.N/c.wRows()%c.Share != 0 || c.Wide == 0 && c.stageK()/gcBoxK%c.Share != 0 || 2*c.Stages > gcBars/8 || c.cluster() > gcMaxCluster) ||
		c.Act != "" && (!wg || c.Share > 1 && c.Wide == 0 || !slices.Contains(bundle.GatedActOps, c.Act)) ||
		c.Tiles > 1 && (c.Act == "" || c.Split > 1 || c.N/gcCols%c.Tiles != 0) ||
		c.Rope != nil && (!wg || c.Split > 1 && c.Wide == 0 || c.Share > 1 || c.Act != "" || c.Tiles > 1 || ropeCopyErr(*c.Rope, c.N) != nil) ||
		c.Wide != 0 && wideErr(c) != nil {
		return nil, fmt.Errorf("copy-engine GEMM %s: bad configuration %+v (use GemmCopyFor, GatedCopyFor or RopeCopyFor)", name, c)
	}
	g := gcGen{emitter: newEmitter(name), c: c}
	g.emit()
	return finish(g.Kernel, bundle.OpGemmCopy, c.Attrs())
}

type gcGen struct {
	emitter
	c               GemmCopyConfig
	xmap, wmap      ptx.Reg // generic addresses of the tensor-map parameters
	y, rows         ptx.Reg
	yb, ybOn, yOn   ptx.Reg // with Act: where bf16(y) goes; whether it, and whether y, is not 0
	tid, warp, lane ptx.Reg
	gg, t, cg, q    ptx.Reg     // the lane's mma group and thread; the warp's column group and K part
	rank, col0, k0  ptx.Reg     // K part (the cluster rank with a split); the CTA's first column and first K
	xPart           ptx.Reg     // with a shared x: the CTA's place among the tiles sharing it (its cluster rank)
	bars, slot0     ptx.Reg     // shared addresses: mbarrier 0, slot 0
	frees           ptx.Reg     // with a producer warp: slot 0's free mbarrier, past the slots' own
	thread0         ptx.Reg     // thread 0 inits the mbarriers
	asker           ptx.Reg     // the thread that asks for W and x: thread 0, or the producer warp's first
	wgLead          ptx.Reg     // the thread of a warpgroup that frees its slots (freeSlot): its first
	wgBar           ptx.Operand // the named barrier of the thread's warpgroup (freeSlot)
	acc             [][]ptx.Reg
	rope            *gcRope // with Rope: its parameters and what wgPrepareRope read
}

func (g *gcGen) emit() {
	c := g.c
	wg, shared, produced := c.warpgroup(), c.shares() > 1, c.produced()
	g.MaxNTid = c.threads()
	if c.cluster() > 1 {
		g.ClusterX = c.cluster()
	}
	// The maps are parameters (as CUTLASS passes them), so the launch carries them and no
	// fence is needed before their first use; one in global memory needs
	// fence.proxy.tensormap, and that form made the step 0.7-1.2% longer (session 32).
	xm := g.ByteParam(bundle.GemmXMap, 64, bundle.TensorMapBytes)
	wm := g.ByteParam(bundle.GemmWMap, 64, bundle.TensorMapBytes)
	g.y = g.param(bundle.GemmY, ptx.U64)
	g.rows = g.param(bundle.GemmRows, ptx.U32)
	if c.Act != "" {
		g.yb = g.param(bundle.GemmYBF16, ptx.U64)
	}
	if c.Rope != nil {
		g.rope = &gcRope{params: map[string]ptx.Reg{}}
		for _, p := range bundle.RopeKVParams {
			g.rope.params[p.Name] = g.param(p.Name, ptx.U64)
		}
	}
	g.xmap, g.wmap = g.Reg(ptx.U64), g.Reg(ptx.U64)
	g.Emit("mov.u64", g.xmap, xm)
	g.Emit("cvta.param.u64", g.xmap, g.xmap)
	g.Emit("mov.u64", g.wmap, wm)
	g.Emit("cvta.param.u64", g.wmap, g.wmap)
	smem := g.DeclareDynamicShared("smem", 128)
	if c.Split > 1 && !wg {
		// Rank 0's shared memory must exist before rank 1 writes into it: this phase of the
		// cluster barrier ends, after the main loop, once every CTA of the cluster has begun.
		g.Emit("barrier.cluster.arrive")
	}
	g.tid = g.special(ptx.TidX)
	g.warp = g.op3("shr.u32", ptx.U32, g.tid, ptx.Imm(5))
	g.lane = g.op3("and.b32", ptx.U32, g.tid, ptx.Imm(31))
	g.gg = g.op3("shr.u32", ptx.U32, g.lane, ptx.Imm(2))
	g.t = g.op3("and.b32", ptx.U32, g.lane, ptx.Imm(3))
	if !wg {
		g.cg = g.op3("div.u32", ptx.U32, g.warp, ptx.Imm(int64(c.parts())))
		g.q = g.op3("rem.u32", ptx.U32, g.warp, ptx.Imm(int64(c.parts())))
	}
	g.rank = g.imm32(0)
	tile := g.special(ptx.CtaidX)
	switch {
	case shared:
		// The column tiles sharing x are a cluster's CTAs, in tile order.
		g.xPart = g.special(ptx.ClusterCtaRank)
	case c.Split > 1:
		g.Emit("mov.u32", g.rank, ptx.ClusterCtaRank)
		g.Emit("div.u32", tile, tile, ptx.Imm(int64(c.Split)))
	}
	if c.tiles() > 1 {
		g.Emit("mul.lo.u32", tile, tile, ptx.Imm(int64(c.tiles())))
	}
	g.col0 = g.op3("mul.lo.u32", ptx.U32, tile, ptx.Imm(int64(c.yCols())))
	g.k0 = g.op3("mul.lo.u32", ptx.U32, g.rank, ptx.Imm(int64(c.K/c.Split)))
	g.bars = g.Reg(ptx.U32)
	g.Emit("mov.u32", g.bars, smem)
	// slot0: the first gcAlign boundary past the mbarriers (the same offset in every CTA).
	g.slot0 = g.op3("add.u32", ptx.U32, g.bars, ptx.Imm(gcBars+gcAlign-1))
	g.Emit("and.b32", g.slot0, g.slot0, ptx.Imm(int64(^uint32(gcAlign-1))))
	g.thread0 = g.cmp("eq", ptx.U32, g.tid, ptx.Imm(0))
	if c.Act != "" {
		g.ybOn = g.cmp("ne", ptx.U64, g.yb, ptx.Imm(0))
		g.yOn = g.cmp("ne", ptx.U64, g.y, ptx.Imm(0))
	}
	g.asker, g.wgLead, g.wgBar = g.thread0, g.thread0, ptx.Operand(ptx.Imm(1))
	if produced {
		g.asker = g.cmp("eq", ptx.U32, g.tid, ptx.Imm(int64(c.consumers()*wgThreads)))
		g.frees = g.op3("add.u32", ptx.U32, g.bars, ptx.Imm(int64(8*c.Stages)))
	}
	if c.consumers() > 1 {
		// Each warpgroup frees a slot on its own: named barrier 1 + its index, its thread 0.
		g.wgLead = g.cmp("eq", ptx.U32, g.op3("rem.u32", ptx.U32, g.tid, ptx.Imm(wgThreads)), ptx.Imm(0))
		g.wgBar = g.op3("add.u32", ptx.U32, g.op3("div.u32", ptx.U32, g.tid, ptx.Imm(wgThreads)), ptx.Imm(1))
	}
	g.when(g.thread0, false, func() {
		for i := range c.Stages {
			g.Emit("mbarrier.init.shared::cta.b64", ptx.Addr{Base: g.bars, Offset: int64(8 * i)}, ptx.Imm(1))
		}
		if produced {
			// A slot is free once every CTA sharing its x, or every warpgroup, has read it.
			for i := range c.Stages {
				g.Emit("mbarrier.init.shared::cta.b64", ptx.Addr{Base: g.freeAddr(ptx.Imm(int64(i)))}, ptx.Imm(int64(c.shares()*c.consumers())))
			}
		}
		g.Emit("fence.mbarrier_init.release.cluster")
	})
	g.Emit("bar.sync", ptx.Imm(0))
	if shared {
		// Every CTA's mbarriers exist before another's copies complete on them.
		g.Emit("barrier.cluster.arrive.release")
	}
	for i := range c.Stages {
		g.when(g.asker, false, func() { g.askW(g.imm32(int64(i)), ptx.Imm(int64(i))) })
	}
	if c.NextAtAsk && c.Stages >= c.ringStages() {
		g.Emit(bundle.PriorGridLaunch) // every stage is asked for already
	}
	switch {
	case c.Rope != nil && c.Wide > 0:
		g.widePrepareRope()
	case c.Rope != nil:
		g.wgPrepareRope()
	}
	g.Emit(bundle.PriorGridWait)
	if shared {
		g.Emit("barrier.cluster.wait.acquire")
	}
	g.when(g.asker, false, func() {
		for i := range c.Stages {
			g.askX(g.imm32(int64(i)), ptx.Imm(int64(i)))
		}
	})
	if produced {
		// The warp past the warpgroups refills the ring; the warpgroups multiply.
		mma := g.NewLabel("mma")
		g.EmitIf(g.cmp("lt", ptx.U32, g.tid, ptx.Imm(int64(c.consumers()*wgThreads))), false, "bra", ptx.Sym(mma))
		g.produce()
		g.Label(mma)
	}
	switch {
	case c.Wide > 0:
		g.wideMainLoop()
	case wg:
		g.wgMainLoop()
	default:
		g.mainLoop()
	}
	// The grid after it may launch once W is read, not before (session 32: at the start it
	// made the mixed 8-row step 2.5-2.9% longer).
	g.Emit(bundle.PriorGridLaunch)
	switch {
	case c.Wide > 0 && c.Act != "":
		g.wideStoreGated(g.acc[0])
	case c.Wide > 0:
		g.wideStore(g.acc[0])
	case wg:
		g.wgReduce()
	default:
		g.reduce()
	}
}

// slotAddr is base + slot*slotBytes.
func (g *gcGen) slotAddr(base ptx.Reg, slot ptx.Operand) ptx.Reg {
	return g.scaled(base, slot, g.c.slotBytes())
}

// barAddr is the shared address of slot's mbarrier.
func (g *gcGen) barAddr(slot ptx.Operand) ptx.Reg { return g.scaled(g.bars, slot, 8) }

// freeAddr is the shared address of slot's "free" mbarrier (with a shared x).
func (g *gcGen) freeAddr(slot ptx.Operand) ptx.Reg { return g.scaled(g.frees, slot, 8) }

// scaled is base + i*size, i a register or an immediate (folded: a multiply's first source
// must be a register).
func (g *gcGen) scaled(base ptx.Reg, i ptx.Operand, size int) ptx.Reg {
	r := g.Reg(ptx.U32)
	if imm, ok := i.(ptx.Imm); ok {
		g.Emit("add.u32", r, base, ptx.Imm(int64(imm)*int64(size)))
		return r
	}
	g.Emit("mad.lo.u32", r, i, ptx.Imm(int64(size)), base)
	return r
}

// askW (thread 0) arms slot's mbarrier for a stage (its W boxes and its x box, rows past the
// tensor's filled with zeros and counted) and asks for the stage's W boxes.
func (g *gcGen) askW(stage ptx.Reg, slot ptx.Operand) {
	bar := g.barAddr(slot)
	state := g.Reg(ptx.B64)
	c := g.c
	g.Emit("mbarrier.arrive.expect_tx.shared::cta.b64", state, ptx.Addr{Base: bar}, g.imm32(int64(c.wBytes()+c.xBytes())))
	kc := g.firstK(stage)
	dst := g.slotAddr(g.slot0, slot)
	// Each box's first W row and its first row in the stage's W. With Act, a box of gate's
	// rows and one of up's (N/2 rows on) stacked: under the swizzle, whose pattern repeats
	// every 8 rows, the same layout as one box of both. With Rope, the boxes of the pairs'
	// first elements, then those of their second (half a head on).
	type box struct {
		row ptx.Reg
		at  int
	}
	col := g.tileCol(stage)
	boxes := []box{{col, 0}}
	switch {
	case c.Act != "":
		boxes = append(boxes, box{g.op3("add.u32", ptx.U32, col, ptx.Imm(int64(c.N/2))), c.yCols()})
	case c.Rope != nil:
		half := c.Rope.HeadDim / 2
		boxes = nil
		for b := 0; b < c.yCols(); b += c.wBoxRows() {
			u := col
			if b > 0 {
				u = g.op3("add.u32", ptx.U32, col, ptx.Imm(int64(b)))
			}
			first := g.ropeRow(u)
			boxes = append(boxes, box{first, b}, box{g.op3("add.u32", ptx.U32, first, ptx.Imm(int64(half))), c.yCols() + b})
		}
	}
	for b := range c.stageK() / gcBoxK {
		kb := g.op3("add.u32", ptx.U32, kc, ptx.Imm(int64(b*gcBoxK)))
		for _, x := range boxes {
			g.Emit("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes",
				ptx.Addr{Base: dst, Offset: int64(b*c.wRows()*2*gcBoxK + x.at*2*gcBoxK)}, ptx.TensorAddr{Map: g.wmap, Coords: ptx.Vec{kb, x.row}}, ptx.Addr{Base: bar})
		}
	}
}

// ropeRow is the W row of pair u's first element: element u % half of head u / half, so row
// u/half*HeadDim + u%half = u/half*half + u; its second element's is half a head on.
func (g *gcGen) ropeRow(u ptx.Reg) ptx.Reg {
	half := g.c.Rope.HeadDim / 2
	row := g.op3("div.u32", ptx.U32, u, ptx.Imm(int64(half)))
	g.Emit("mul.lo.u32", row, row, ptx.Imm(int64(half)))
	g.Emit("add.u32", row, row, u)
	return row
}

// askX (thread 0) asks for a stage's x, past its W (the stage's first K worked out again, as
// askW does: one multiply-add of one thread): in the mma.sync form one box of the stage's K
// by Rows rows, in the warpgroup form one box of gcBoxK by Rows rows per W box.
func (g *gcGen) askX(stage ptx.Reg, slot ptx.Operand) {
	c := g.c
	if !c.warpgroup() {
		g.Emit("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes",
			ptx.Addr{Base: g.slotAddr(g.slot0, slot), Offset: int64(c.wBytes())}, ptx.TensorAddr{Map: g.xmap, Coords: ptx.Vec{g.firstK(stage), g.imm32(0)}}, ptx.Addr{Base: g.barAddr(slot)})
		return
	}
	kc := g.firstK(stage)
	dst, bar := g.slotAddr(g.slot0, slot), g.barAddr(slot)
	if c.shares() > 1 {
		g.askSharedX(kc, dst, bar)
		return
	}
	for b := range c.stageK() / gcBoxK {
		kb := g.op3("add.u32", ptx.U32, kc, ptx.Imm(int64(b*gcBoxK)))
		g.Emit("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes",
			ptx.Addr{Base: dst, Offset: int64(c.wBytes() + b*c.Rows*2*gcBoxK)}, ptx.TensorAddr{Map: g.xmap, Coords: ptx.Vec{kb, g.imm32(0)}}, ptx.Addr{Base: bar})
	}
}

// askSharedX (the asker) asks for the CTA's part of a stage's x boxes, first K kc, into slot
// dst of every CTA of the cluster: boxes xPart, xPart+Share, ..., each multicast to all of
// them, completing each one's mbarrier bar. In the wide form a stage is one box, and the
// CTA's part is rows: its box (XBox: Rows/Share rows) starts at row xPart*Rows/Share.
func (g *gcGen) askSharedX(kc, dst, bar ptx.Reg) {
	c := g.c
	mask := g.Reg(ptx.U16)
	g.Emit("mov.u16", mask, ptx.Imm(1<<c.Share-1))
	if c.Wide > 0 {
		part := c.Rows / c.Share
		row := g.op3("mul.lo.u32", ptx.U32, g.xPart, ptx.Imm(int64(part)))
		at := g.Reg(ptx.U32)
		g.Emit("mad.lo.u32", at, g.xPart, ptx.Imm(int64(part*2*gcBoxK)), dst)
		g.Emit("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster",
			ptx.Addr{Base: at, Offset: int64(c.wBytes())}, ptx.TensorAddr{Map: g.xmap, Coords: ptx.Vec{kc, row}}, ptx.Addr{Base: bar}, mask)
		return
	}
	first := g.Reg(ptx.U32)
	g.Emit("mad.lo.u32", first, g.xPart, ptx.Imm(gcBoxK), kc)
	at := g.Reg(ptx.U32)
	g.Emit("mad.lo.u32", at, g.xPart, ptx.Imm(int64(c.Rows*2*gcBoxK)), dst)
	for j := range c.stageK() / gcBoxK / c.Share {
		b := j * c.Share // the box's place, past the CTA's own (xPart)
		kb := g.op3("add.u32", ptx.U32, first, ptx.Imm(int64(b*gcBoxK)))
		g.Emit("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster",
			ptx.Addr{Base: at, Offset: int64(c.wBytes() + b*c.Rows*2*gcBoxK)}, ptx.TensorAddr{Map: g.xmap, Coords: ptx.Vec{kb, g.imm32(0)}}, ptx.Addr{Base: bar}, mask)
	}
}

// firstK is the first K of a stage of the CTA's.
func (g *gcGen) firstK(stage ptx.Reg) ptx.Reg {
	if g.c.tiles() > 1 {
		stage = g.op3("rem.u32", ptx.U32, stage, ptx.Imm(int64(g.c.kStages())))
	}
	kc := g.Reg(ptx.U32)
	g.Emit("mad.lo.u32", kc, stage, ptx.Imm(int64(g.c.stageK())), g.k0)
	return kc
}

// tileCol is the first output column of the tile a stage of the CTA's belongs to: col0, or
// with Tiles that of tile stage / kStages of the CTA's.
func (g *gcGen) tileCol(stage ptx.Reg) ptx.Reg {
	if g.c.tiles() == 1 {
		return g.col0
	}
	col := g.op3("div.u32", ptx.U32, stage, ptx.Imm(int64(g.c.kStages())))
	g.Emit("mad.lo.u32", col, col, ptx.Imm(int64(g.c.yCols())), g.col0)
	return col
}

// mainLoop multiplies the CTA's stages in order, slot by slot, refilling each slot with the
// stage Stages ahead once every warp is past it.
func (g *gcGen) mainLoop() {
	c := g.c
	gg, t, cg, q := g.gg, g.t, g.cg, g.q
	kPart := gcStage / c.parts()
	// wLane[ch]: lane (g, t)'s W address in slot 0 for chunk ch of its part, row g of the
	// warp's first column tile: the chunk's box, the row, and 16-byte chunk (k/8 + t) of the
	// row's 128 bytes, moved to chunk (k/8 + t) ^ (row % 8) by the swizzle (row % 8 = g).
	rowOff := g.Reg(ptx.U32)
	g.Emit("mad.lo.u32", rowOff, cg, ptx.Imm(int64(c.colTiles()*gcColTile)), gg)
	g.Emit("mad.lo.u32", rowOff, rowOff, ptx.Imm(2*gcBoxK), g.slot0)
	wLane := make([]ptx.Reg, c.chunks())
	for ch := range wLane {
		ks := g.Reg(ptx.U32)
		g.Emit("mad.lo.u32", ks, q, ptx.Imm(int64(kPart)), ptx.Imm(int64(ch*gcChunk)))
		box := g.op3("shr.u32", ptx.U32, ks, ptx.Imm(6))
		chunk := g.op3("shr.u32", ptx.U32, ks, ptx.Imm(3))
		g.Emit("and.b32", chunk, chunk, ptx.Imm(7))
		g.Emit("or.b32", chunk, chunk, t)
		g.Emit("xor.b32", chunk, chunk, gg)
		wLane[ch] = g.Reg(ptx.U32)
		g.Emit("mad.lo.u32", wLane[ch], box, ptx.Imm(gcBoxBytes), rowOff)
		g.Emit("mad.lo.u32", wLane[ch], chunk, ptx.Imm(16), wLane[ch])
	}
	// xLane: lane (g, t)'s x address in slot 0: row g, elements q*kPart + 8t on.
	kx := g.Reg(ptx.U32)
	g.Emit("shl.b32", kx, t, ptx.Imm(3))
	g.Emit("mad.lo.u32", kx, q, ptx.Imm(int64(kPart)), kx)
	xLane := g.Reg(ptx.U32)
	g.Emit("mad.lo.u32", xLane, gg, ptx.Imm(gcXStride), g.slot0)
	g.Emit("mad.lo.u32", xLane, kx, ptx.Imm(4), xLane)
	g.Emit("add.u32", xLane, xLane, ptx.Imm(gcWBox))
	g.acc = make([][]ptx.Reg, c.colTiles()*c.rowTiles())
	for i := range g.acc {
		g.acc[i] = g.Regs(ptx.F32, 4)
		for _, a := range g.acc[i] {
			g.Emit("mov.f32", a, ptx.F32Imm(0))
		}
	}
	stage, slot, phase := g.imm32(0), g.imm32(0), g.imm32(0)
	top := g.NewLabel("stage")
	g.Label(top)
	g.wait(g.barAddr(slot), phase)
	xa := g.slotAddr(xLane, slot)
	a, b := make([][]ptx.Reg, c.colTiles()), make([][]ptx.Reg, c.colTiles())
	for ct := range a {
		a[ct], b[ct] = g.Regs(ptx.B32, 4), g.Regs(ptx.B32, 4)
	}
	xs := g.Regs(ptx.F32, 8)
	xb := g.Regs(ptx.B32, 4)
	for ch := range c.chunks() {
		wa := g.slotAddr(wLane[ch], slot)
		for ct := range a {
			row := int64(ct * gcColTile * 2 * gcBoxK)
			g.Emit("ld.shared.v4.b32", ptx.Vec(a[ct]), ptx.Addr{Base: wa, Offset: row})
			g.Emit("ld.shared.v4.b32", ptx.Vec(b[ct]), ptx.Addr{Base: wa, Offset: row + 8*2*gcBoxK})
		}
		for rt := range c.rowTiles() {
			at := int64(4*gcChunk*ch + rt*gcTile*gcXStride)
			g.Emit("ld.shared.v4.f32", ptx.Vec(xs[:4]), ptx.Addr{Base: xa, Offset: at})
			g.Emit("ld.shared.v4.f32", ptx.Vec(xs[4:]), ptx.Addr{Base: xa, Offset: at + 16})
			for i := range xb {
				g.Emit("cvt.rn.bf16x2.f32", xb[i], xs[2*i+1], xs[2*i])
			}
			for ct := range a {
				acc := ptx.Vec(g.acc[ct*c.rowTiles()+rt])
				g.Emit("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32", acc, ptx.Vec{a[ct][0], b[ct][0], a[ct][1], b[ct][1]}, ptx.Vec(xb[:2]), acc)
				g.Emit("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32", acc, ptx.Vec{a[ct][2], b[ct][2], a[ct][3], b[ct][3]}, ptx.Vec(xb[2:]), acc)
			}
		}
	}
	g.nextStage(stage, slot, phase, top)
}

// nextStage ends a stage of the main loop: once every thread is past the slot, thread 0
// refills it with the stage Stages ahead (with a shared x the producer warp does, freeSlot);
// then the loop advances.
func (g *gcGen) nextStage(stage, slot, phase ptx.Reg, top string) {
	if g.c.produced() {
		g.freeSlot(stage, slot)
	} else {
		g.refill(stage, slot)
	}
	g.advance(stage, slot, phase, top)
}

// refill: once every thread is past slot (stage's), thread 0 asks for the stage Stages ahead
// into it, if the CTA has one.
func (g *gcGen) refill(stage, slot ptx.Reg) {
	c := g.c
	g.Emit("bar.sync", ptx.Imm(0))
	next := g.op3("add.u32", ptx.U32, stage, ptx.Imm(int64(c.Stages)))
	more := g.cmp("lt", ptx.U32, next, ptx.Imm(int64(c.ringStages())))
	g.when(more, false, func() {
		g.when(g.thread0, false, func() {
			g.askW(next, slot)
			g.askX(next, slot)
			if c.NextAtAsk && c.Stages < c.ringStages() {
				// The CTA's last stage is on its way: the grid after it may launch (one thread
				// of a CTA is enough, PTX ISA: griddepcontrol). Where the ring holds every
				// stage, it may launch from before the wait.
				last := g.cmp("eq", ptx.U32, next, ptx.Imm(int64(c.ringStages()-1)))
				g.when(last, false, func() { g.Emit(bundle.PriorGridLaunch) })
			}
		})
	})
}

// advance ends a stage of a loop over the ring: the slot (and its phase at a wrap) and the
// stage advance, and the loop goes on to top while stages are left.
func (g *gcGen) advance(stage, slot, phase ptx.Reg, top string) {
	c := g.c
	g.Emit("add.u32", slot, slot, ptx.Imm(1))
	wrap := g.cmp("eq", ptx.U32, slot, ptx.Imm(int64(c.Stages)))
	g.EmitIf(wrap, false, "mov.u32", slot, ptx.Imm(0))
	g.EmitIf(wrap, false, "xor.b32", phase, phase, ptx.Imm(1))
	g.Emit("add.u32", stage, stage, ptx.Imm(1))
	g.EmitIf(g.cmp("lt", ptx.U32, stage, ptx.Imm(int64(c.ringStages()))), false, "bra", ptx.Sym(top))
}

// freeSlot ends stage s (slot slot) of a warpgroup whose ring a producer warp refills: once
// its four warps are past the slot (a named barrier of its own, without the producer warp and
// the other warpgroups), its thread 0 tells the free mbarrier of every CTA sharing the slot's
// x (this one, or each of the cluster's) that this warpgroup has read it; the producer warp
// refills the slot once every reader has. When thread 0, one of the warpgroup's threads,
// waited and refilled the slot itself, every stage waited for the partner: on the H200 the
// 8B's 128-row step took 8.1-11.0 ms against cuBLASLt's 6.0 (session 43,
// testsuite/gpu/RESULTS.md); with the producer warp, 7.0 (clusters of 4 for o and down,
// GemmCopyFor) and 5.94 against 5.89 (q/k/v alone).
func (g *gcGen) freeSlot(stage, slot ptx.Reg) {
	c := g.c
	g.Emit("bar.sync", g.wgBar, ptx.Imm(wgThreads))
	next := g.op3("add.u32", ptx.U32, stage, ptx.Imm(int64(c.Stages)))
	more := g.cmp("lt", ptx.U32, next, ptx.Imm(int64(c.ringStages())))
	g.Emit("and.pred", more, more, g.wgLead)
	g.when(more, false, func() {
		free := g.freeAddr(slot)
		if c.shares() == 1 {
			g.Emit("mbarrier.arrive.shared::cta.b64", g.Reg(ptx.B64), ptx.Addr{Base: free})
			return
		}
		for peer := range c.Share {
			remote := g.Reg(ptx.U32)
			g.Emit("mapa.shared::cluster.u32", remote, free, ptx.Imm(int64(peer)))
			g.Emit("mbarrier.arrive.shared::cluster.b64", ptx.Sink, ptx.Addr{Base: remote})
		}
	})
}

// produce is the producer warp of a CTA sharing x: its first thread refills each slot with
// the stage Stages ahead once every CTA sharing the slot's x has read it (its free mbarrier's
// phase), while the warpgroup multiplies. Then the warp exits. It never lets the next grid
// launch: a CTA does so at its first thread's griddepcontrol.launch_dependents, and the
// warp's other lanes, which ask for nothing, would reach one at the CTA's start, so the grid
// after it (Llama-3.1-8B's down projection behind the wide gate/up kernel) would be launched
// a whole kernel early; the warpgroups let it launch once they have read W, as every
// copy-engine kernel does.
func (g *gcGen) produce() {
	c := g.c
	g.when(g.asker, false, func() {
		if c.Stages >= c.ringStages() {
			return
		}
		stage, slot, phase := g.imm32(int64(c.Stages)), g.imm32(0), g.imm32(0)
		top := g.NewLabel("produce")
		g.Label(top)
		g.wait(g.freeAddr(slot), phase)
		g.askW(stage, slot)
		g.askX(stage, slot)
		g.advance(stage, slot, phase, top)
	})
	g.Emit("exit")
}

// rankPart is where this rank's (rank >= 1) sums go in rank 0's shared memory: part
// rank-1 of partBytes from base, as a shared::cluster address.
func (g *gcGen) rankPart(base ptx.Reg) ptx.Reg {
	at := g.Reg(ptx.U32)
	g.Emit("add.u32", at, g.rank, ptx.Imm(-1))
	g.Emit("mad.lo.u32", at, at, ptx.Imm(int64(g.c.partBytes())), base)
	remote := g.Reg(ptx.U32)
	g.Emit("mapa.shared::cluster.u32", remote, at, ptx.Imm(0))
	return remote
}

// wait polls bar until its phase of parity phase has completed; a stage that never lands
// (a bad tensor map) traps after gcPolls polls, so the launch fails instead of hanging.
func (g *gcGen) wait(bar, phase ptx.Reg) {
	top, done := g.NewLabel("wait"), g.NewLabel("waited")
	polls := g.imm32(0)
	ok := g.Reg(ptx.Pred)
	g.Label(top)
	g.Emit("mbarrier.try_wait.parity.shared::cta.b64", ok, ptx.Addr{Base: bar}, phase)
	g.EmitIf(ok, false, "bra", ptx.Sym(done))
	g.Emit("add.u32", polls, polls, ptx.Imm(1))
	g.EmitIf(g.cmp("lt", ptx.U32, polls, ptx.Imm(gcPolls)), false, "bra", ptx.Sym(top))
	g.Emit("trap")
	g.Label(done)
}

// reduce adds the warps' sums. Entry e = (column tile * rowTiles + row tile) * 32 + lane of
// K part p lies at slot0 + p*partBytes + 16e (the ring, free once the main loop ends); thread
// e adds the parts in order, then the cluster's ranks in rank order (rank r's at rank 0's
// recv + (r-1)*partBytes), and rank 0 stores y.
func (g *gcGen) reduce() {
	c := g.c
	for ct := range c.colTiles() {
		for rt := range c.rowTiles() {
			e := g.Reg(ptx.U32)
			g.Emit("mad.lo.u32", e, g.cg, ptx.Imm(int64(c.colTiles())), ptx.Imm(int64(ct)))
			g.Emit("mad.lo.u32", e, e, ptx.Imm(int64(c.rowTiles())), ptx.Imm(int64(rt)))
			g.Emit("mad.lo.u32", e, e, ptx.Imm(32), g.lane)
			at := g.Reg(ptx.U32)
			g.Emit("mad.lo.u32", at, g.q, ptx.Imm(int64(c.partBytes()/gcEntry)), e)
			g.Emit("mad.lo.u32", at, at, ptx.Imm(gcEntry), g.slot0)
			g.Emit("st.shared.v4.f32", ptx.Addr{Base: at}, ptx.Vec(g.acc[ct*c.rowTiles()+rt]))
		}
	}
	g.Emit("bar.sync", ptx.Imm(0))
	// From here thread tid < entries owns entry tid.
	owner := g.cmp("lt", ptx.U32, g.tid, ptx.Imm(int64(c.entries())))
	sum, part := g.Regs(ptx.F32, 4), g.Regs(ptx.F32, 4)
	mine := g.Reg(ptx.U32)
	g.Emit("mad.lo.u32", mine, g.tid, ptx.Imm(gcEntry), g.slot0)
	add := func(a ptx.Addr) {
		g.Emit("ld.shared.v4.f32", ptx.Vec(part), a)
		for i := range part {
			g.Emit("add.f32", sum[i], sum[i], part[i])
		}
	}
	g.when(owner, false, func() {
		g.Emit("ld.shared.v4.f32", ptx.Vec(sum), ptx.Addr{Base: mine})
		for p := 1; p < c.parts(); p++ {
			add(ptx.Addr{Base: mine, Offset: int64(p * c.partBytes())})
		}
	})
	recv := g.op3("add.u32", ptx.U32, mine, ptx.Imm(int64(c.Stages*c.slotBytes())))
	if c.Split > 1 {
		g.Emit("barrier.cluster.wait")
		sender := g.cmp("ne", ptx.U32, g.rank, ptx.Imm(0))
		send := g.Reg(ptx.Pred)
		g.Emit("and.pred", send, sender, owner)
		g.when(send, false, func() {
			g.Emit("st.shared::cluster.v4.f32", ptx.Addr{Base: g.rankPart(recv)}, ptx.Vec(sum))
		})
		g.Emit("barrier.cluster.arrive.release")
		g.Emit("barrier.cluster.wait.acquire")
		g.EmitIf(sender, false, "exit")
	}
	g.EmitIf(owner, true, "exit")
	for r := 1; r < c.Split; r++ {
		add(ptx.Addr{Base: recv, Offset: int64((r - 1) * c.partBytes())})
	}
	// Entry tid: column tile tid / (rowTiles*32), row tile tid / 32 % rowTiles, lane (g, t) =
	// tid % 32; its sums are (column g, tokens 2t, 2t+1), (column g+8, the same tokens).
	lane := g.op3("and.b32", ptx.U32, g.tid, ptx.Imm(31))
	gg := g.op3("shr.u32", ptx.U32, lane, ptx.Imm(2))
	tok := g.op3("and.b32", ptx.U32, lane, ptx.Imm(3))
	g.Emit("shl.b32", tok, tok, ptx.Imm(1))
	rt := g.op3("shr.u32", ptx.U32, g.tid, ptx.Imm(5))
	g.Emit("rem.u32", rt, rt, ptx.Imm(int64(c.rowTiles())))
	g.Emit("mad.lo.u32", tok, rt, ptx.Imm(gcTile), tok)
	col := g.op3("div.u32", ptx.U32, g.tid, ptx.Imm(int64(c.rowTiles()*32)))
	g.Emit("mad.lo.u32", col, col, ptx.Imm(gcColTile), gg)
	g.Emit("add.u32", col, col, g.col0)
	for i := range 2 {
		row := g.op3("add.u32", ptx.U32, tok, ptx.Imm(int64(i)))
		idx := g.Reg(ptx.U32)
		g.Emit("mad.lo.u32", idx, row, ptx.Imm(int64(c.N)), col)
		at := g.byteAddr(g.y, idx, 4)
		in := g.cmp("lt", ptx.U32, row, g.rows)
		g.EmitIf(in, false, "st.global.f32", ptx.Addr{Base: at}, sum[i])
		g.EmitIf(in, false, "st.global.f32", ptx.Addr{Base: at, Offset: 32}, sum[2+i])
	}
}
