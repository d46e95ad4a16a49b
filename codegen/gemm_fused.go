package codegen

import (
	"fmt"

	"xmix/ops"
	"xmix/ptx"
)

// Fused decode GEMVs (ops/gemm_fused.go, passes' fuse-qkv-rope and fuse-gate-act): the
// CUDA-core GEMV of gemm.go with the kernel that follows the projection in its epilogue. A
// warp computes a unit of two columns, the pair the next kernel combines (elements i and
// i+HeadDim/2 of a head, which RoPE rotates together; column j of gate and of up), each
// column's sum exactly as the plain GEMV computes it, so the pair is the plain GEMV's bits
// and the epilogue does the next kernel's arithmetic on them: the fused kernel writes what
// the two kernels wrote, bit for bit. The x loads of a K step serve both columns.
//
// After the K loop the warp's butterfly sums leave every lane the totals of every row of its
// tile; lane j writes row r0+j. What a row's epilogue reads beyond the sums (its position,
// cos and sin, its KV slot) is loaded before the K loop, so those loads wait behind the
// weight stream instead of after it.
//
// Per decode step this removes a launch and the round trip of the projection's output
// through memory: at batch 1 on Llama-3.1-8B, 32 rope_kv and 32 silu_mul launches (RATIONALE.md
// has the estimate).

// gemvEpilogue makes a GEMV a fused one.
type gemvEpilogue interface {
	// params declares the epilogue's parameters (after x, w, y and rows).
	params(g *gemmGen)
	// units is how many units the kernel computes, one per warp (Split warps in a split GEMV).
	units() int
	// columns emits the output columns (weight rows) of unit u, and what the epilogue needs
	// of the unit.
	columns(g *gemmGen, u ptx.Reg) []ptx.Reg
	// prepare emits, before the K loop of a tile of rows r0..r0+t-1, the loads of lane j's
	// row r0+j.
	prepare(g *gemmGen, r0 ptx.Reg, t int)
	// store emits the tile's writes from acc[column][row], the lanes' partial sums.
	store(g *gemmGen, r0 ptx.Reg, t int, acc [][]ptx.Reg)
}

// fusedGemv generates the fused GEMV of c with epilogue epi, bound to reference op op.
func fusedGemv(name string, c GemmConfig, epi gemvEpilogue, op string, attrs any) (*Kernel, error) {
	if c.Guard != 0 {
		return nil, fmt.Errorf("%s %s: guard %#x: a fused GEMV is no heavy app's", op, name, c.Guard)
	}
	g := gemmGen{emitter: newEmitter(name), c: c, epi: epi}
	if err := g.emit(); err != nil {
		return nil, fmt.Errorf("%s %s: %w", op, name, err)
	}
	return finish(g.Kernel, op, attrs)
}

// laneRow is lane j's row of a tile at r0 of t rows, r0+j, and whether the lane has one
// (lanes from t on take row r0+t-1, so that their loads stay inside the rows).
func (g *gemmGen) laneRow(r0 ptx.Reg, t int) (ptx.Reg, ptx.Reg) {
	row := g.op3("min.u32", ptx.U32, g.lane, ptx.Imm(int64(t-1)))
	g.Emit("add.u32", row, row, r0)
	return row, g.cmp("lt", ptx.U32, g.lane, ptx.Imm(int64(t)))
}

// rowSums reduces every partial sum over the warp (a split GEMV's are totals already:
// sumParts) and returns, per column, the total of the lane's row (laneRow's; lanes past the
// tile get row r0's).
func (g *gemmGen) rowSums(acc [][]ptx.Reg) []ptx.Reg {
	if g.c.splitWarps() == 1 {
		for _, col := range acc {
			for _, a := range col {
				g.warpReduce(a, "add")
			}
		}
	}
	is := make([]ptx.Reg, len(acc[0]))
	for j := 1; j < len(is); j++ {
		is[j] = g.cmp("eq", ptx.U32, g.lane, ptx.Imm(int64(j)))
	}
	out := make([]ptx.Reg, len(acc))
	for ci, col := range acc {
		out[ci] = g.Reg(ptx.F32)
		g.Emit("mov.f32", out[ci], col[0])
		for j := 1; j < len(col); j++ {
			g.Emit("selp.f32", out[ci], col[j], out[ci], is[j])
		}
	}
	return out
}

// GemmRopeConfig is the q/k/v projection's GEMV (Gemm, N the q/k/v row's width) with
// RopeKV (Rope, no QK-norm) in its epilogue.
type GemmRopeConfig struct {
	Gemm GemmConfig
	Rope RopeConfig
}

func (c GemmRopeConfig) units() int { return (c.Rope.Heads + 2*c.Rope.KVHeads) * c.Rope.HeadDim / 2 }

// Launch is the grid for rows rows.
func (c GemmRopeConfig) Launch(rows int) ops.Launch {
	return c.Gemm.gemvLaunch(c.units())
}

// GemmRope generates the fused kernel (op gemm_rope_kv); parameters: x, w, y (the q/k/v
// rows), rows, then RopeKV's after its qkv: cos, sin, pos, seq, block_table, kcache, vcache,
// [bias]. Unit u is element i = u % (HeadDim/2) of head h = u / (HeadDim/2): columns
// h*HeadDim + i and that + HeadDim/2. A q head is rotated into y; a k head rotated into y and
// the cache; a v head stored to the cache (and to y, biased, with a bias).
func GemmRope(name string, c GemmRopeConfig) (*Kernel, error) {
	ga, err := gemmAttrs(c.Gemm)
	if err != nil {
		return nil, fmt.Errorf("gemm_rope_kv %s: %w", name, err)
	}
	ra, err := ropeAttrs(c.Rope)
	if err != nil || c.Rope.QKNorm || c.Gemm.N != (c.Rope.Heads+2*c.Rope.KVHeads)*c.Rope.HeadDim {
		return nil, fmt.Errorf("gemm_rope_kv %s: rope %+v (%v) of %d columns: want its q/k/v row's width, no QK-norm", name, c.Rope, err, c.Gemm.N)
	}
	return fusedGemv(name, c.Gemm, &ropeEpilogue{c: c.Rope, n: c.Gemm.N}, "gemm_rope_kv", ops.GemmRopeKVAttrs{Gemm: ga, Rope: ra})
}

// ropeEpilogue is RopeKV over a unit's pair (RopeKV's arithmetic, instruction for
// instruction).
type ropeEpilogue struct {
	c RopeConfig
	n int // the q/k/v row's width
	// Parameters.
	cosT, sinT, posP, seqP, table, kc, vc, bias ptx.Reg
	// The unit: element i of head h, its columns, head kind, the head's offset in a KV slot.
	i, h, kvOff    ptx.Reg
	cols           []ptx.Reg
	isQ, isV       ptx.Reg
	bias0, bias1   ptx.Reg
	row, mine      ptx.Reg // the lane's row (prepare)
	cs, sn, kvElem ptx.Reg
}

func (e *ropeEpilogue) params(g *gemmGen) {
	e.cosT, e.sinT = g.param("cos", ptx.U64), g.param("sin", ptx.U64)
	e.posP, e.seqP = g.param("pos", ptx.U64), g.param("seq", ptx.U64)
	e.table = g.param("block_table", ptx.U64)
	e.kc, e.vc = g.param("kcache", ptx.U64), g.param("vcache", ptx.U64)
	if e.c.Bias {
		e.bias = g.param("bias", ptx.U64)
	}
}

func (e *ropeEpilogue) units() int { return e.n / 2 }

func (e *ropeEpilogue) columns(g *gemmGen, u ptx.Reg) []ptx.Reg {
	c := e.c
	d, half := c.HeadDim, c.HeadDim/2
	e.h = g.op3("div.u32", ptx.U32, u, ptx.Imm(int64(half)))
	e.i = g.op3("rem.u32", ptx.U32, u, ptx.Imm(int64(half)))
	c0 := g.Reg(ptx.U32)
	g.Emit("mad.lo.u32", c0, e.h, ptx.Imm(int64(d)), e.i)
	e.cols = []ptx.Reg{c0, g.op3("add.u32", ptx.U32, c0, ptx.Imm(int64(half)))}
	e.isQ = g.cmp("lt", ptx.U32, e.h, ptx.Imm(int64(c.Heads)))
	e.isV = g.cmp("ge", ptx.U32, e.h, ptx.Imm(int64(c.Heads+c.KVHeads)))
	// A k or v head's element i within a slot's KVHeads*HeadDim values.
	kvh := g.op3("sub.u32", ptx.U32, e.h, ptx.Imm(int64(c.Heads)))
	vh := g.op3("sub.u32", ptx.U32, kvh, ptx.Imm(int64(c.KVHeads)))
	g.Emit("selp.b32", kvh, vh, kvh, e.isV)
	e.kvOff = g.Reg(ptx.U32)
	g.Emit("mad.lo.u32", e.kvOff, kvh, ptx.Imm(int64(d)), e.i)
	if c.Bias {
		ws := c.WDtype.Bytes()
		e.bias0 = g.loadAt(ptx.Addr{Base: g.byteAddr(e.bias, e.cols[0], ws)}, c.WDtype)
		e.bias1 = g.loadAt(ptx.Addr{Base: g.byteAddr(e.bias, e.cols[1], ws)}, c.WDtype)
	}
	return e.cols
}

func (e *ropeEpilogue) prepare(g *gemmGen, r0 ptx.Reg, t int) {
	c := e.c
	e.row, e.mine = g.laneRow(r0, t)
	p := loadU32(g.emitter, ptx.Addr{Base: g.byteAddr(e.posP, e.row, 4)})
	ti := g.Reg(ptx.U32)
	g.Emit("mad.lo.u32", ti, p, ptx.Imm(int64(c.HeadDim/2)), e.i)
	e.cs, e.sn = g.Reg(ptx.F32), g.Reg(ptx.F32)
	g.Emit("ld.global.f32", e.cs, ptx.Addr{Base: g.byteAddr(e.cosT, ti, 4)})
	g.Emit("ld.global.f32", e.sn, ptx.Addr{Base: g.byteAddr(e.sinT, ti, 4)})
	// Only k and v heads write the cache: q warps skip the block-table load.
	e.kvElem = g.Reg(ptx.U32)
	g.when(e.isQ, true, func() {
		s := loadU32(g.emitter, ptx.Addr{Base: g.byteAddr(e.seqP, e.row, 4)})
		slot := g.kvSlot(c, e.table, s, p)
		g.Emit("mad.lo.u32", e.kvElem, slot, ptx.Imm(int64(c.KVHeads*c.HeadDim)), e.kvOff)
	})
}

func (e *ropeEpilogue) store(g *gemmGen, r0 ptx.Reg, t int, acc [][]ptx.Reg) {
	c := e.c
	half, kvs := c.HeadDim/2, c.KVDtype.Bytes()
	x := g.rowSums(acc)
	x0, x1 := x[0], x[1]
	if c.Bias {
		g.Emit("add.rn.f32", x0, x0, e.bias0)
		g.Emit("add.rn.f32", x1, x1, e.bias1)
	}
	yrow := g.byteAddr(g.y, e.row, 4*e.n)
	y0, y1 := ptx.Addr{Base: g.byteAddr(yrow, e.cols[0], 4)}, ptx.Addr{Base: g.byteAddr(yrow, e.cols[1], 4)}
	ka := g.byteAddr(e.kc, e.kvElem, kvs)
	va := g.byteAddr(e.vc, e.kvElem, kvs)
	g.when(e.mine, false, func() {
		g.storeRopePair(c.KVDtype, half, x0, x1, e.cs, e.sn, y0, y1, func() ptx.Reg { return ka }, func() ptx.Reg { return va }, e.isQ, e.isV)
	})
}

// GemmGatedConfig is the gate/up projection's GEMV (Gemm, N = 2*Inter columns: gate, then
// up) with the gated activation Act (SiluConfig.Act) in its epilogue.
type GemmGatedConfig struct {
	Gemm GemmConfig
	Act  string
}

// Launch is the grid for rows rows.
func (c GemmGatedConfig) Launch(rows int) ops.Launch {
	return c.Gemm.gemvLaunch(c.Gemm.N / 2)
}

// GemmGated generates the fused kernel (op gemm_gated); parameters: x, w, y (the activation,
// rows of N/2), rows. Unit j is columns j of gate and of up: y[row, j] = act(gate) * up, with
// SiluMul's arithmetic.
func GemmGated(name string, c GemmGatedConfig) (*Kernel, error) {
	a, err := c.attrs(2)
	if err != nil {
		return nil, fmt.Errorf("gemm_gated %s: %w", name, err)
	}
	return fusedGemv(name, c.Gemm, &gatedEpilogue{act: c.Act, inter: c.Gemm.N / 2}, "gemm_gated", a)
}

// attrs checks c (its width a positive multiple of width: gate and up of equal width, and
// whole tiles of a kernel's) and returns op gemm_gated's attributes of it.
func (c GemmGatedConfig) attrs(width int) (ops.GemmGatedAttrs, error) {
	ga, err := gemmAttrs(c.Gemm)
	if err != nil {
		return ops.GemmGatedAttrs{}, err
	}
	op, err := SiluConfig{Act: c.Act}.op()
	if err != nil || c.Gemm.N%width != 0 {
		return ops.GemmGatedAttrs{}, fmt.Errorf("%d columns, %v: want a multiple of %d and a known activation", c.Gemm.N, err, width)
	}
	return ops.GemmGatedAttrs{Gemm: ga, Act: op}, nil
}

// gatedEpilogue is SiluMul over a unit's pair.
type gatedEpilogue struct {
	act       string
	inter     int
	unit, row ptx.Reg
	mine      ptx.Reg
}

func (e *gatedEpilogue) params(g *gemmGen) {}

func (e *gatedEpilogue) units() int { return e.inter }

func (e *gatedEpilogue) columns(g *gemmGen, u ptx.Reg) []ptx.Reg {
	e.unit = u
	return []ptx.Reg{u, g.op3("add.u32", ptx.U32, u, ptx.Imm(int64(e.inter)))}
}

func (e *gatedEpilogue) prepare(g *gemmGen, r0 ptx.Reg, t int) { e.row, e.mine = g.laneRow(r0, t) }

func (e *gatedEpilogue) store(g *gemmGen, r0 ptx.Reg, t int, acc [][]ptx.Reg) {
	x := g.rowSums(acc)
	a := gateAct(g.emitter, e.act, x[0], x[1])
	idx := g.Reg(ptx.U32)
	g.Emit("mad.lo.u32", idx, e.row, ptx.Imm(int64(e.inter)), e.unit)
	g.EmitIf(e.mine, false, "st.global.f32", ptx.Addr{Base: g.byteAddr(g.y, idx, 4)}, a)
}
