package codegen

import (
	"fmt"
	"math"

	"xmix/ops"
	"xmix/ptx"
)

// Split-K decode attention (flash-decoding): a second kernel for op "attention" (the reference
// in ops/attention.go) for long contexts and few rows.
//
// Why. Attention runs one block per (row, query head): one decode row of Llama-3.1-8B is 32
// blocks on a 132-SM H200, each walking all 8192 positions (243 us per layer at position
// 8191), and the 4 query heads of a GQA group each read the same K/V rows again.
//
// Work split. One block per (row, kv head, split), grid (rows, KVHeads, S). Split s owns the
// positions [s*c, min(n, (s+1)*c)), n = pos+1, c = ceil(n/S); a split past n is empty. The
// block handles ALL Heads/KVHeads query heads of its kv head: every K and V element it loads
// feeds group dot products and group weighted sums, so K/V are read once per kv head, not
// once per query head. Inside the block the warps take positions round-robin, asUnroll at a
// time with all their K and V loads issued before any reduction, each warp keeping an online
// softmax per query head (running max m, sum l, weighted v acc with HeadDim/32 values per
// lane; lane l holds dims l, l+32, ...). Scores are kept in log2 units (q is pre-scaled by
// Scale*log2 e). The warps' states are merged through shared memory as in Attention.
//
// Split reduction (S > 1). Every block writes per query head its unnormalised (acc[D], m, l)
// to the workspace, fences, and draws a ticket from the counter of its (row, kv head). The
// block that draws ticket S-1 combines the S partials in split order 0..S-1, so z does not
// depend on which block finished last: M = max m_s, out = sum acc_s 2^(m_s-M) / sum l_s
// 2^(m_s-M). Split 0 always holds position 0, so M is finite; an empty split stores m = -inf,
// l = 0, acc = 0 and weighs nothing. That block then resets the counter to zero, so a
// replayed graph finds it clean. With S = 1 the block writes z directly and ws is not touched
// (it may be null).
//
// Workspace `ws` (u64, the last parameter), c.SplitWorkspaceBytes(rows, S): rows*KVHeads u32
// counters (rounded up to 16 bytes), then rows*Heads*S records of HeadDim+4 f32 (acc, m, l, two
// pad words keeping records 16-byte aligned), record (row, head, split) at index
// (row*Heads+head)*S+split. The counters must be zero before the first launch and stay zero
// between launches. The reference op takes no ws: Kernel.Params has one parameter more than
// ops "attention" expects, so a CPU run must drop the trailing ws argument.
//
// Bytes moved per layer, one row at position p (n = p+1 positions), kv bytes kb per element:
// K and V once per kv head, 2*n*KVHeads*HeadDim*kb from HBM (Attention: Heads/KVHeads times
// that, from L2 where it hits); block tables n*4 per warp-lane group (L1/L2); partials
// rows*Heads*S*(HeadDim+4)*4 written and read once (L2). Llama-3.1-8B at p = 8191, bf16 cache:
// K+V 32 MiB (~7 us at 4.8 TB/s); with S = 32, 256 blocks (two per SM), each 256 positions,
// partials 32*32*132*4 = 528 KiB. What to measure: time per layer against that floor at
// positions 1k/8k/32k and rows 1/8/32; whether the per-position score reductions (group warp
// butterflies of 5 shuffles per position) or K/V latency dominate, then: more positions per
// warp step, or lanes owning contiguous dims with vector loads.
const (
	asMaxWarps  = 8
	asUnroll    = 2
	asMaxShared = 48 << 10 // static shared memory a launch gets without an attribute
	asMaxSplits = 1024
	// group*HeadDim/32 q values and as many accumulators per lane: past 64 each the block
	// would spill; such shapes (wide MQA groups) belong to Attention.
	asMaxLaneValues = 64
)

// asWarps is the block's warp count for a group of query heads of dim d: as many as
// asMaxWarps whose merge buffers fit the static shared memory.
func asWarps(group, d int) int {
	w := asMaxWarps
	for w > 1 && w*group*(d+2)*4 > asMaxShared {
		w /= 2
	}
	return w
}

// LaunchSplit is the grid of AttentionSplit for rows rows and splits splits.
func (c AttnConfig) LaunchSplit(rows, splits int) ops.Launch {
	group := max(1, c.Heads/max(1, c.KVHeads))
	return ops.Launch{Grid: [3]int{rows, c.KVHeads, max(1, splits)}, Block: [3]int{32 * asWarps(group, c.HeadDim), 1, 1}}
}

// SplitWorkspaceBytes is the size of AttentionSplit's ws buffer for a call over rows rows with
// splits splits (0: the kernel does not use ws).
func (c AttnConfig) SplitWorkspaceBytes(rows, splits int) int {
	if splits <= 1 || rows <= 0 {
		return 0
	}
	return asCounterBytes(rows, c.KVHeads) + rows*c.Heads*splits*(c.HeadDim+4)*4
}

func asCounterBytes(rows, kvHeads int) int { return (rows*kvHeads + 3) / 4 * 16 }

// AttentionSplit generates the split-K kernel for op "attention"; parameters: qkv, pos, seq,
// block_table, kcache, vcache, z, ws (all u64; ws c.SplitWorkspaceBytes(rows, splits) bytes,
// zero before the first launch). Launch it with c.LaunchSplit(rows, splits).
func AttentionSplit(name string, c AttnConfig, splits int) (*Kernel, error) {
	rc := RopeConfig{Heads: c.Heads, KVHeads: c.KVHeads, HeadDim: c.HeadDim, BlockSize: c.BlockSize,
		MaxBlocksPerSeq: c.MaxBlocksPerSeq, KVDtype: c.KVDtype}
	attrs, err := kvAttrs(rc)
	if err != nil {
		return nil, fmt.Errorf("attention_split %s: %w", name, err)
	}
	if c.HeadDim%32 != 0 || c.HeadDim > 256 {
		return nil, fmt.Errorf("attention_split %s: head dim %d: want a multiple of 32, at most 256", name, c.HeadDim)
	}
	if !(c.Scale > 0) || math.IsInf(float64(c.Scale), 0) {
		return nil, fmt.Errorf("attention_split %s: scale %g: want positive and finite", name, c.Scale)
	}
	if splits < 1 || splits > asMaxSplits {
		return nil, fmt.Errorf("attention_split %s: %d splits: want 1..%d", name, splits, asMaxSplits)
	}
	group := c.Heads / c.KVHeads
	if v := group * c.HeadDim / 32; v > asMaxLaneValues {
		return nil, fmt.Errorf("attention_split %s: %d query heads per kv head of dim %d need %d q values per lane, at most %d",
			name, group, c.HeadDim, v, asMaxLaneValues)
	}
	g := asGen{emitter: newEmitter(name), c: c, rc: rc, splits: splits, group: group,
		per: c.HeadDim / 32, warps: asWarps(group, c.HeadDim)}
	g.MaxNTid = 32 * g.warps
	g.emit()
	return finish(g.Kernel, "attention", ops.AttnAttrs{KVAttrs: attrs, Scale: c.Scale})
}

type asGen struct {
	emitter
	c                        AttnConfig
	rc                       RopeConfig
	splits, group, per       int
	warps                    int
	z, ws                    ptx.Reg
	row, kvh, split          ptx.Reg
	tid, lane, warp          ptx.Reg
	m, l                     []ptx.Reg   // per query head of the group
	acc                      [][]ptx.Reg // [head][j]: dims lane+32j
	sm, sl, sacc, ticketFlag ptx.Sym
}

func (g *asGen) emit() {
	c := g.c
	qkv := g.param("qkv", ptx.U64)
	posP := g.param("pos", ptx.U64)
	seqP := g.param("seq", ptx.U64)
	table := g.param("block_table", ptx.U64)
	kc := g.param("kcache", ptx.U64)
	vc := g.param("vcache", ptx.U64)
	g.z = g.param("z", ptx.U64)
	g.ws = g.param("ws", ptx.U64)

	g.row = g.special(ptx.CtaidX)
	g.kvh = g.special(ptx.CtaidY)
	g.split = g.special(ptx.CtaidZ)
	g.tid = g.special(ptx.TidX)
	g.lane = g.op3("and.b32", ptx.U32, g.tid, ptx.Imm(31))
	g.warp = g.op3("shr.u32", ptx.U32, g.tid, ptx.Imm(5))
	p := g.Reg(ptx.U32)
	g.Emit("ld.global.u32", p, ptx.Addr{Base: g.byteAddr(posP, g.row, 4)})
	s := g.Reg(ptx.U32)
	g.Emit("ld.global.u32", s, ptx.Addr{Base: g.byteAddr(seqP, g.row, 4)})

	// This split's positions [start, end).
	n := g.op3("add.u32", ptx.U32, p, ptx.Imm(1))
	chunk := g.op3("add.u32", ptx.U32, n, ptx.Imm(int64(g.splits-1)))
	g.Emit("div.u32", chunk, chunk, ptx.Imm(int64(g.splits)))
	start := g.op3("mul.lo.u32", ptx.U32, g.split, chunk)
	end := g.op3("add.u32", ptx.U32, start, chunk)
	g.Emit("min.u32", end, end, n)

	// q of the group's heads, lane l holding dims l, l+32, ...
	d := c.HeadDim
	qrow := g.Reg(ptx.U32)
	g.Emit("mad.lo.u32", qrow, g.row, ptx.Imm(int64(c.Heads+2*c.KVHeads)), g.op3("mul.lo.u32", ptx.U32, g.kvh, ptx.Imm(int64(g.group))))
	qa := g.byteAddr(g.byteAddr(qkv, qrow, 4*d), g.lane, 4)
	qs := g.f32(c.Scale * float32(math.Log2E))
	q := make([][]ptx.Reg, g.group)
	g.m, g.l, g.acc = make([]ptx.Reg, g.group), make([]ptx.Reg, g.group), make([][]ptx.Reg, g.group)
	for h := range q {
		q[h] = g.Regs(ptx.F32, g.per)
		for j, r := range q[h] {
			g.Emit("ld.global.f32", r, ptx.Addr{Base: qa, Offset: int64(4 * (h*d + 32*j))})
			g.Emit("mul.f32", r, r, qs)
		}
		g.m[h] = g.f32(float32(math.Inf(-1)))
		g.l[h] = g.f32(0)
		g.acc[h] = make([]ptx.Reg, g.per)
		for j := range g.acc[h] {
			g.acc[h][j] = g.f32(0)
		}
	}
	g.scan(q, table, kc, vc, s, start, end)
	g.mergeWarps()
}

// scan runs the warps' online softmax over positions [start, end) of sequence slot s.
func (g *asGen) scan(q [][]ptx.Reg, table, kc, vc, s, start, end ptx.Reg) {
	c := g.c
	kvs := c.KVDtype.Bytes()
	last := g.op3("sub.u32", ptx.U32, end, ptx.Imm(1))
	negInf := ptx.F32Imm(float32(math.Inf(-1)))
	t0 := g.op3("add.u32", ptx.U32, start, g.warp)
	t := g.Reg(ptx.U32)
	g.forLoop(t, t0, end, ptx.Imm(int64(g.warps*asUnroll)), func() {
		// All K and V loads of the step first; a position past the end reads the last one
		// (valid memory) and scores -inf.
		var valid [asUnroll]ptx.Reg
		var k, v [asUnroll][]ptx.Reg
		for u := range asUnroll {
			tu := g.op3("add.u32", ptx.U32, t, ptx.Imm(int64(u*g.warps)))
			valid[u] = g.cmp("lt", ptx.U32, tu, end)
			g.Emit("min.u32", tu, tu, last)
			slot := g.kvSlot(g.rc, table, s, tu)
			kvRow := g.Reg(ptx.U32)
			g.Emit("mad.lo.u32", kvRow, slot, ptx.Imm(int64(c.KVHeads)), g.kvh)
			elem := g.Reg(ptx.U32)
			g.Emit("mad.lo.u32", elem, kvRow, ptx.Imm(int64(c.HeadDim)), g.lane)
			ka, va := g.byteAddr(kc, elem, kvs), g.byteAddr(vc, elem, kvs)
			for j := range g.per {
				k[u] = append(k[u], g.loadAt(ptx.Addr{Base: ka, Offset: int64(32 * j * kvs)}, c.KVDtype))
			}
			for j := range g.per {
				v[u] = append(v[u], g.loadAt(ptx.Addr{Base: va, Offset: int64(32 * j * kvs)}, c.KVDtype))
			}
		}
		for h := range g.group {
			var score [asUnroll]ptx.Reg
			mNew := g.Reg(ptx.F32)
			g.Emit("mov.f32", mNew, g.m[h])
			for u := range asUnroll {
				score[u] = g.f32(0)
				for j, kj := range k[u] {
					g.Emit("fma.rn.f32", score[u], q[h][j], kj, score[u])
				}
				g.warpReduce(score[u], "add")
				g.Emit("selp.f32", score[u], score[u], negInf, valid[u])
				g.Emit("max.f32", mNew, mNew, score[u])
			}
			alpha := g.exp2(g.op3("sub.f32", ptx.F32, g.m[h], mNew))
			g.Emit("mul.f32", g.l[h], g.l[h], alpha)
			for _, a := range g.acc[h] {
				g.Emit("mul.f32", a, a, alpha)
			}
			for u := range asUnroll {
				w := g.exp2(g.op3("sub.f32", ptx.F32, score[u], mNew))
				g.Emit("add.f32", g.l[h], g.l[h], w)
				for j, a := range g.acc[h] {
					g.Emit("fma.rn.f32", a, w, v[u][j], a)
				}
			}
			g.Emit("mov.f32", g.m[h], mNew)
		}
	})
}

// mergeWarps folds the warps' states per query head and writes z (one split) or this split's
// partial record, then combines the splits in the block that finishes the (row, kv head).
func (g *asGen) mergeWarps() {
	c := g.c
	d := c.HeadDim
	nst := g.warps * g.group
	g.sm = g.DeclareShared("as_m", ptx.F32, nst)
	g.sl = g.DeclareShared("as_l", ptx.F32, nst)
	g.sacc = g.DeclareShared("as_acc", ptx.F32, nst*d)
	// State (warp, head) at index warp*group + head.
	st := g.Reg(ptx.U32)
	g.Emit("mul.lo.u32", st, g.warp, ptx.Imm(int64(g.group)))
	lane0 := g.cmp("eq", ptx.U32, g.lane, ptx.Imm(0))
	mAddr, lAddr := g.sharedAddr(g.sm, st, 4), g.sharedAddr(g.sl, st, 4)
	accIdx := g.Reg(ptx.U32)
	g.Emit("mad.lo.u32", accIdx, st, ptx.Imm(int64(d)), g.lane)
	accAddr := g.sharedAddr(g.sacc, accIdx, 4)
	for h := range g.group {
		g.EmitIf(lane0, false, "st.shared.f32", ptx.Addr{Base: mAddr, Offset: int64(4 * h)}, g.m[h])
		g.EmitIf(lane0, false, "st.shared.f32", ptx.Addr{Base: lAddr, Offset: int64(4 * h)}, g.l[h])
		for j, a := range g.acc[h] {
			g.Emit("st.shared.f32", ptx.Addr{Base: accAddr, Offset: int64(4 * (h*d + 32*j))}, a)
		}
	}
	g.Emit("bar.sync", ptx.Imm(0))

	// Head h0 of the group is query head kvh*group + h0; its z row and its records.
	head0 := g.op3("mul.lo.u32", ptx.U32, g.kvh, ptx.Imm(int64(g.group)))
	zrow := g.Reg(ptx.U32)
	g.Emit("mad.lo.u32", zrow, g.row, ptx.Imm(int64(c.Heads)), head0)
	zbase := g.byteAddr(g.z, zrow, 4*d)
	var recs, mine ptx.Reg
	if g.splits > 1 {
		// Records follow the counters, whose size depends on rows = %nctaid.x.
		cnt := g.op3("mul.lo.u32", ptx.U32, g.special(ptx.NCtaidX), ptx.Imm(int64(c.KVHeads)))
		g.Emit("add.u32", cnt, cnt, ptx.Imm(3))
		g.Emit("shr.u32", cnt, cnt, ptx.Imm(2))
		recs = g.byteAddr(g.ws, cnt, 16)
		ri := g.op3("mul.lo.u32", ptx.U32, zrow, ptx.Imm(int64(g.splits)))
		g.Emit("add.u32", ri, ri, g.split)
		mine = g.byteAddr(recs, ri, 4*(d+4))
	}
	first := g.cmp("eq", ptx.U32, g.tid, ptx.Imm(0))
	for h := range g.group {
		mw := g.Regs(ptx.F32, g.warps)
		big := g.f32(float32(math.Inf(-1)))
		for w, r := range mw {
			g.Emit("ld.shared.f32", r, ptx.Addr{Base: g.sm, Offset: int64(4 * (w*g.group + h))})
			g.Emit("max.f32", big, big, r)
		}
		// An empty split has every m_w = -inf; scale by 2^(m_w-0) = 0 rather than 2^NaN, but
		// publish the -inf so that the split weighs nothing in the combine.
		safe := g.Reg(ptx.F32)
		g.Emit("selp.f32", safe, ptx.F32Imm(0), big, g.cmp("eq", ptx.F32, big, ptx.F32Imm(float32(math.Inf(-1)))))
		sum := g.f32(0)
		scale := make([]ptx.Reg, g.warps)
		for w := range mw {
			scale[w] = g.exp2(g.op3("sub.f32", ptx.F32, mw[w], safe))
			lw := g.Reg(ptx.F32)
			g.Emit("ld.shared.f32", lw, ptx.Addr{Base: g.sl, Offset: int64(4 * (w*g.group + h))})
			g.Emit("fma.rn.f32", sum, lw, scale[w], sum)
		}
		var inv ptx.Reg
		if g.splits == 1 {
			inv = g.Reg(ptx.F32)
			g.Emit("rcp.rn.f32", inv, sum)
		} else {
			rec := int64(h * g.splits * 4 * (d + 4))
			g.EmitIf(first, false, "st.global.f32", ptx.Addr{Base: mine, Offset: rec + int64(4*d)}, big)
			g.EmitIf(first, false, "st.global.f32", ptx.Addr{Base: mine, Offset: rec + int64(4*d+4)}, sum)
		}
		di := g.Reg(ptx.U32)
		g.forLoop(di, g.tid, ptx.Imm(int64(d)), ptx.Imm(int64(32*g.warps)), func() {
			a := g.sharedAddr(g.sacc, di, 4)
			o := g.f32(0)
			for w := range scale {
				x := g.Reg(ptx.F32)
				g.Emit("ld.shared.f32", x, ptx.Addr{Base: a, Offset: int64(4 * d * (w*g.group + h))})
				g.Emit("fma.rn.f32", o, x, scale[w], o)
			}
			if g.splits == 1 {
				g.Emit("mul.f32", o, o, inv)
				g.Emit("st.global.f32", ptx.Addr{Base: g.byteAddr(zbase, di, 4), Offset: int64(4 * d * h)}, o)
				return
			}
			g.Emit("st.global.f32", ptx.Addr{Base: g.byteAddr(mine, di, 4), Offset: int64(h * g.splits * 4 * (d + 4))}, o)
		})
	}
	if g.splits > 1 {
		g.combine(recs, zrow, zbase, first)
	}
}

// combine draws this block's ticket and, in the block that completes the (row, kv head), sums
// the splits' records in split order into z and resets the counter.
func (g *asGen) combine(recs, zrow, zbase, first ptx.Reg) {
	c := g.c
	d := c.HeadDim
	g.ticketFlag = g.DeclareShared("as_ticket", ptx.U32, 1)
	ci := g.Reg(ptx.U32)
	g.Emit("mad.lo.u32", ci, g.row, ptx.Imm(int64(c.KVHeads)), g.kvh)
	ctr := g.byteAddr(g.ws, ci, 4)
	// Classic last-block pattern: every thread fences its stores before the barrier, one
	// thread draws the ticket.
	g.Emit("membar.gl")
	g.Emit("bar.sync", ptx.Imm(0))
	ticket := g.Reg(ptx.U32)
	g.when(first, false, func() {
		g.Emit("atom.global.add.u32", ticket, ptx.Addr{Base: ctr}, ptx.Imm(1))
		g.Emit("st.shared.u32", ptx.Addr{Base: g.ticketFlag}, ticket)
	})
	g.Emit("bar.sync", ptx.Imm(0))
	g.Emit("ld.shared.u32", ticket, ptx.Addr{Base: g.ticketFlag})
	last := g.cmp("eq", ptx.U32, ticket, ptx.Imm(int64(g.splits-1)))
	g.when(last, false, func() {
		g.Emit("membar.gl")
		recBytes := int64(4 * (d + 4))
		ri := g.op3("mul.lo.u32", ptx.U32, zrow, ptx.Imm(int64(g.splits)))
		base := g.byteAddr(recs, ri, int(recBytes))
		sIdx := g.Reg(ptx.U32)
		ms := g.Reg(ptx.F32)
		for h := range g.group {
			h0 := int64(h*g.splits) * recBytes
			// M over the splits; split 0 holds position 0, so M is finite. .cg: other SMs
			// wrote these and L1 is not coherent.
			big := g.f32(float32(math.Inf(-1)))
			pa := g.Reg(ptx.U64)
			g.Emit("mov.u64", pa, base)
			g.forLoop(sIdx, ptx.Imm(0), ptx.Imm(int64(g.splits)), ptx.Imm(1), func() {
				g.Emit("ld.global.cg.f32", ms, ptx.Addr{Base: pa, Offset: h0 + int64(4*d)})
				g.Emit("max.f32", big, big, ms)
				g.Emit("add.u64", pa, pa, ptx.Imm(recBytes))
			})
			di := g.Reg(ptx.U32)
			g.forLoop(di, g.tid, ptx.Imm(int64(d)), ptx.Imm(int64(32*g.warps)), func() {
				sum, o := g.f32(0), g.f32(0)
				pr := g.Reg(ptx.U64)
				g.Emit("mov.u64", pr, base)
				pa := g.byteAddr(base, di, 4)
				ls, x := g.Reg(ptx.F32), g.Reg(ptx.F32)
				g.forLoop(sIdx, ptx.Imm(0), ptx.Imm(int64(g.splits)), ptx.Imm(1), func() {
					g.Emit("ld.global.cg.f32", ms, ptx.Addr{Base: pr, Offset: h0 + int64(4*d)})
					g.Emit("ld.global.cg.f32", ls, ptx.Addr{Base: pr, Offset: h0 + int64(4*d+4)})
					g.Emit("ld.global.cg.f32", x, ptx.Addr{Base: pa, Offset: h0})
					w := g.exp2(g.op3("sub.f32", ptx.F32, ms, big))
					g.Emit("fma.rn.f32", sum, ls, w, sum)
					g.Emit("fma.rn.f32", o, x, w, o)
					g.Emit("add.u64", pr, pr, ptx.Imm(recBytes))
					g.Emit("add.u64", pa, pa, ptx.Imm(recBytes))
				})
				inv := g.Reg(ptx.F32)
				g.Emit("rcp.rn.f32", inv, sum)
				g.Emit("mul.f32", o, o, inv)
				g.Emit("st.global.f32", ptx.Addr{Base: g.byteAddr(zbase, di, 4), Offset: int64(4 * d * h)}, o)
			})
		}
		g.when(first, false, func() { g.Emit("st.global.u32", ptx.Addr{Base: ctr}, ptx.Imm(0)) })
	})
}
