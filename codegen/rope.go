package codegen

import (
	"fmt"
	"math"

	"xmix/bundle"
	"xmix/ops"
	"xmix/ptx"
)

// RopeConfig describes the QKV rows RopeKV rotates and the paged KV cache it writes (see
// ops.KVAttrs for the layouts). BlockSize must be a power of two.
type RopeConfig struct {
	Heads, KVHeads, HeadDim, BlockSize, MaxBlocksPerSeq int
	KVDtype                                             ptx.Type
	// Bias adds a [(Heads+2*KVHeads)*HeadDim] bias to the row first (Qwen2's q/k/v
	// projection biases; parameter "bias").
	Bias bool
	// QKNorm RMS-normalises each q and k head (eps Eps) before rotating it (Qwen3;
	// parameters "q_norm", "k_norm", [HeadDim] each).
	QKNorm bool
	Eps    float32
	// WDtype stores bias, q_norm and k_norm (F32 or BF16); unused without the options.
	WDtype ptx.Type
	// Groups, when not 0, is how many blocks share a row's heads, 1 to headGroups: fewer
	// than headGroups leave each thread more than one of the row's q, k and v heads, which
	// it rotates one after another, with the same results (BuildInfo.RopeOneWave).
	Groups int
}

// ropeThreads is the block size RopeKV aims for (1024; 128 took 10 us a layer on an H200):
// HeadDim/2 lanes per head, as many heads side by side as fill it.
const ropeThreads = 1024

func (c RopeConfig) headsPerBlock() int { return max(1, ropeThreads/(c.HeadDim/2)) }

// headGroups is how many blocks share a row: enough that each thread has at most one of the
// row's q, k and v heads, so a row's loads are issued at once rather than one group of heads
// after another (Llama-3.1-8B: 48 heads, three blocks of 16).
func (c RopeConfig) headGroups() int {
	hpb := c.headsPerBlock()
	return (c.Heads + 2*c.KVHeads + hpb - 1) / hpb
}

// groups is how many blocks share a row: Groups, or headGroups.
func (c RopeConfig) groups() int {
	if c.Groups > 0 {
		return c.Groups
	}
	return c.headGroups()
}

// Launch is the grid for rows rows: groups blocks per row, threads (HeadDim/2, heads in
// flight).
func (c RopeConfig) Launch(rows int) ops.Launch {
	return ops.Launch{Grid: [3]int{rows, c.groups(), 1}, Block: [3]int{c.HeadDim / 2, c.headsPerBlock(), 1}}
}

// OneWaveGroups is Groups for a grid of rows rows in waveBlocks blocks: the most blocks a row
// that keep rows x groups within waveBlocks; 0 (headGroups) where that already holds or
// where even one block a row takes more than a wave.
func (c RopeConfig) OneWaveGroups(rows, waveBlocks int) int {
	if rows*c.headGroups() <= waveBlocks || rows > waveBlocks {
		return 0
	}
	return waveBlocks / rows
}

// kvAttrs checks the shape shared by RopeKV and Attention and returns its ops attributes.
func kvAttrs(c RopeConfig) (ops.KVAttrs, error) {
	dt, ok := dtypeName(c.KVDtype)
	if !ok {
		return ops.KVAttrs{}, fmt.Errorf("kv dtype %s: want f32 or bf16", c.KVDtype)
	}
	if c.Heads <= 0 || c.KVHeads <= 0 || c.Heads%c.KVHeads != 0 {
		return ops.KVAttrs{}, fmt.Errorf("heads %d, kv heads %d: want heads a positive multiple of kv heads", c.Heads, c.KVHeads)
	}
	if c.HeadDim <= 0 || c.HeadDim%2 != 0 || c.HeadDim > 2048 {
		return ops.KVAttrs{}, fmt.Errorf("head dim %d: want even, at most 2048", c.HeadDim)
	}
	if _, ok := log2(c.BlockSize); !ok {
		return ops.KVAttrs{}, fmt.Errorf("kv block size %d: want a power of two", c.BlockSize)
	}
	if c.MaxBlocksPerSeq <= 0 {
		return ops.KVAttrs{}, fmt.Errorf("max blocks per sequence %d: want positive", c.MaxBlocksPerSeq)
	}
	return ops.KVAttrs{Heads: c.Heads, KVHeads: c.KVHeads, HeadDim: c.HeadDim, BlockSize: c.BlockSize,
		MaxBlocksPerSeq: c.MaxBlocksPerSeq, KVDtype: dt}, nil
}

// storeRopePair stores the pair (x0, x1), elements i and i+half of a q, k or v head's row, as
// rope_kv does, instruction for instruction: a v head's (isV) as it is into y (y0, y1) and
// the V cache (element i at va()), a q or k head's rotated by (cs, sn) into y and, a k
// head's (neither isQ nor isV), into the K cache (ka()). Each cache address is worked out
// on its branch only.
func (e emitter) storeRopePair(kvDtype ptx.Type, half int, x0, x1, cs, sn ptx.Reg, y0, y1 ptx.Addr, ka, va func() ptx.Reg, isQ, isV ptx.Reg) {
	kvs := kvDtype.Bytes()
	rotated := e.NewLabel("rotated")
	e.when(isV, false, func() {
		e.Emit("st.global.f32", y0, x0)
		e.Emit("st.global.f32", y1, x1)
		a := va()
		e.storeAt(ptx.Addr{Base: a}, x0, kvDtype)
		e.storeAt(ptx.Addr{Base: a, Offset: int64(half * kvs)}, x1, kvDtype)
		e.Emit("bra", ptx.Sym(rotated))
	})
	o0, o1 := e.ropeRotate(x0, x1, cs, sn)
	e.Emit("st.global.f32", y0, o0)
	e.Emit("st.global.f32", y1, o1)
	e.when(isQ, true, func() {
		a := ka()
		e.storeAt(ptx.Addr{Base: a}, o0, kvDtype)
		e.storeAt(ptx.Addr{Base: a, Offset: int64(half * kvs)}, o1, kvDtype)
	})
	e.Label(rotated)
}

// ropeRotate is RopeKV's rotation of the pair (x0, x1) by (cs, sn): rounded products (.rn),
// so that ptxas contracts nothing and every kernel that rotates gives the reference's bits.
func (e emitter) ropeRotate(x0, x1, cs, sn ptx.Reg) (o0, o1 ptx.Reg) {
	o0 = e.op3("sub.rn.f32", ptx.F32, e.op3("mul.rn.f32", ptx.F32, x0, cs), e.op3("mul.rn.f32", ptx.F32, x1, sn))
	o1 = e.op3("add.rn.f32", ptx.F32, e.op3("mul.rn.f32", ptx.F32, x1, cs), e.op3("mul.rn.f32", ptx.F32, x0, sn))
	return o0, o1
}

// kvSlot emits the cache token slot of position p in sequence slot s:
// block_table[s][p/BlockSize]*BlockSize + p%BlockSize.
func (e emitter) kvSlot(c RopeConfig, table, s, p ptx.Reg) ptx.Reg {
	shift, _ := log2(c.BlockSize)
	blk := e.op3("shr.u32", ptx.U32, p, ptx.Imm(int64(shift)))
	idx := e.Reg(ptx.U32)
	e.Emit("mad.lo.u32", idx, s, ptx.Imm(int64(c.MaxBlocksPerSeq)), blk)
	page := e.Reg(ptx.U32)
	e.Emit("ld.global.u32", page, ptx.Addr{Base: e.byteAddr(table, idx, 4)})
	off := e.op3("and.b32", ptx.U32, p, ptx.Imm(int64(c.BlockSize-1)))
	slot := e.Reg(ptx.U32)
	e.Emit("mad.lo.u32", slot, page, ptx.Imm(int64(c.BlockSize)), off)
	return slot
}

// ropeAttrs checks c and returns the reference op's attributes.
func ropeAttrs(c RopeConfig) (ops.RopeKVAttrs, error) {
	kv, err := kvAttrs(c)
	if err != nil {
		return ops.RopeKVAttrs{}, err
	}
	a := ops.RopeKVAttrs{KVAttrs: kv, Bias: c.Bias, QKNorm: c.QKNorm}
	if !c.Bias && !c.QKNorm {
		return a, nil
	}
	wd, ok := dtypeName(c.WDtype)
	if !ok {
		return a, fmt.Errorf("bias/qk-norm weight dtype %s: want f32 or bf16", c.WDtype)
	}
	a.WDtype = wd
	if c.QKNorm {
		if !(c.Eps > 0) {
			return a, fmt.Errorf("qk-norm eps %g: want positive", c.Eps)
		}
		a.Eps = c.Eps
	}
	return a, nil
}

// RopeKV generates the kernel that rotates a row's q and k heads in place (Hugging Face's
// rotate_half convention) and writes its k and v heads to the paged cache. Parameters: qkv,
// cos, sin, pos, seq, block_table, kcache, vcache (all u64), then bias when c.Bias, then
// q_norm and k_norm when c.QKNorm. With the bias the row ends up holding the biased v too.
func RopeKV(name string, c RopeConfig) (*Kernel, error) {
	attrs, err := ropeAttrs(c)
	if err != nil {
		return nil, fmt.Errorf("rope_kv %s: %w", name, err)
	}
	if c.Groups < 0 || c.Groups > c.headGroups() {
		return nil, fmt.Errorf("rope_kv %s: %d blocks a row: want 1 to %d (0: %d)", name, c.Groups, c.headGroups(), c.headGroups())
	}
	e := newEmitter(name)
	qkv := e.param("qkv", ptx.U64)
	cosT := e.param("cos", ptx.U64)
	sinT := e.param("sin", ptx.U64)
	posP := e.param("pos", ptx.U64)
	seqP := e.param("seq", ptx.U64)
	table := e.param("block_table", ptx.U64)
	kc := e.param("kcache", ptx.U64)
	vc := e.param("vcache", ptx.U64)
	var biasP, qnP, knP ptx.Reg
	if c.Bias {
		biasP = e.param("bias", ptx.U64)
	}
	if c.QKNorm {
		qnP = e.param("q_norm", ptx.U64)
		knP = e.param("k_norm", ptx.U64)
	}

	d, half, kvs, ws := c.HeadDim, c.HeadDim/2, c.KVDtype.Bytes(), 0
	if c.Bias || c.QKNorm {
		ws = c.WDtype.Bytes()
	}
	hpb := c.headsPerBlock()
	row := e.special(ptx.CtaidX)
	i := e.special(ptx.TidX)
	// Heads are numbered q, then k, then v: block y of the row starts at head y*hpb, each
	// thread of it at its own tid.y, and strides the whole grid's heads.
	first := e.Reg(ptx.U32)
	e.Emit("mad.lo.u32", first, e.special(ptx.CtaidY), ptx.Imm(int64(hpb)), e.special(ptx.TidY))
	stride := ptx.Imm(int64(hpb * c.groups()))
	p := e.Reg(ptx.U32)
	e.Emit("ld.global.u32", p, ptx.Addr{Base: e.byteAddr(posP, row, 4)})
	s := e.Reg(ptx.U32)
	e.Emit("ld.global.u32", s, ptx.Addr{Base: e.byteAddr(seqP, row, 4)})
	ti := e.Reg(ptx.U32)
	e.Emit("mad.lo.u32", ti, p, ptx.Imm(int64(half)), i)
	cs := e.Reg(ptx.F32)
	e.Emit("ld.global.f32", cs, ptx.Addr{Base: e.byteAddr(cosT, ti, 4)})
	sn := e.Reg(ptx.F32)
	e.Emit("ld.global.f32", sn, ptx.Addr{Base: e.byteAddr(sinT, ti, 4)})
	slot := e.kvSlot(c, table, s, p)
	// This thread's element i of kv head 0 at the row's slot; head h adds h*HeadDim.
	elem := e.Reg(ptx.U32)
	e.Emit("mad.lo.u32", elem, slot, ptx.Imm(int64(c.KVHeads*d)), i)
	kbase := e.byteAddr(kc, elem, kvs)
	vbase := e.byteAddr(vc, elem, kvs)
	rowBase := e.byteAddr(qkv, row, 4*(c.Heads+2*c.KVHeads)*d)
	xbase := e.byteAddr(rowBase, i, 4)
	var bbase ptx.Reg
	if c.Bias {
		bbase = e.byteAddr(biasP, i, ws)
	}

	// load reads elements i and i+half of head h (biased when c.Bias).
	load := func(h ptx.Reg, x0, x1 ptx.Reg) ptx.Addr {
		a := e.byteAddr(xbase, h, 4*d)
		e.Emit("ld.global.f32", x0, ptx.Addr{Base: a})
		e.Emit("ld.global.f32", x1, ptx.Addr{Base: a, Offset: int64(4 * half)})
		if c.Bias {
			ba := e.byteAddr(bbase, h, ws*d)
			e.Emit("add.rn.f32", x0, x0, e.loadAt(ptx.Addr{Base: ba}, c.WDtype))
			e.Emit("add.rn.f32", x1, x1, e.loadAt(ptx.Addr{Base: ba, Offset: int64(ws * half)}, c.WDtype))
		}
		return ptx.Addr{Base: a}
	}
	// rotate rotates (x0, x1) of q/k head h, stores it back and, for a k head, to the cache.
	rotate := func(h ptx.Reg, a ptx.Addr, x0, x1 ptx.Reg) {
		o0, o1 := e.ropeRotate(x0, x1, cs, sn)
		e.Emit("st.global.f32", a, o0)
		e.Emit("st.global.f32", ptx.Addr{Base: a.Base, Offset: int64(4 * half)}, o1)
		e.when(e.cmp("ge", ptx.U32, h, ptx.Imm(int64(c.Heads))), false, func() {
			kh := e.op3("sub.u32", ptx.U32, h, ptx.Imm(int64(c.Heads)))
			ka := e.byteAddr(kbase, kh, d*kvs)
			e.storeAt(ptx.Addr{Base: ka}, o0, c.KVDtype)
			e.storeAt(ptx.Addr{Base: ka, Offset: int64(half * kvs)}, o1, c.KVDtype)
		})
	}

	h := e.Reg(ptx.U32)
	qk := c.Heads + c.KVHeads
	if c.QKNorm {
		e.qkNormLoop(c, h, first, stride, i, qnP, knP, load, rotate)
	} else {
		e.forLoop(h, first, ptx.Imm(int64(qk)), stride, func() {
			x0, x1 := e.Reg(ptx.F32), e.Reg(ptx.F32)
			a := load(h, x0, x1)
			rotate(h, a, x0, x1)
		})
	}
	e.forLoop(h, first, ptx.Imm(int64(qk+c.KVHeads)), stride, func() {
		e.when(e.cmp("ge", ptx.U32, h, ptx.Imm(int64(qk))), false, func() {
			v0, v1 := e.Reg(ptx.F32), e.Reg(ptx.F32)
			a := load(h, v0, v1)
			if c.Bias {
				e.Emit("st.global.f32", a, v0)
				e.Emit("st.global.f32", ptx.Addr{Base: a.Base, Offset: int64(4 * half)}, v1)
			}
			va := e.byteAddr(vbase, e.op3("sub.u32", ptx.U32, h, ptx.Imm(int64(qk))), d*kvs)
			e.storeAt(ptx.Addr{Base: va}, v0, c.KVDtype)
			e.storeAt(ptx.Addr{Base: va, Offset: int64(half * kvs)}, v1, c.KVDtype)
		})
	})
	return finish(e.Kernel, bundle.OpRopeKV, attrs)
}

// qkNormLoop is the q/k head loop with a per-head RMSNorm before the rotation. The norm sums
// over the HeadDim/2 threads of a head through shared memory, so every thread runs the same
// number of iterations (heads past the last are idle) and meets the same barriers. Each thread
// stores x0²+x1² and then adds its head's HeadDim/2 partial sums in order: the reference
// op's exact order, for every head dim (a warp shuffle would need the head to fill whole warps).
func (e emitter) qkNormLoop(c RopeConfig, h, first ptx.Reg, stride ptx.Operand, i, qn, kn ptx.Reg,
	load func(h, x0, x1 ptx.Reg) ptx.Addr, rotate func(h ptx.Reg, a ptx.Addr, x0, x1 ptx.Reg)) {
	d, half, hpb, ws := c.HeadDim, c.HeadDim/2, c.headsPerBlock(), c.WDtype.Bytes()
	red := e.DeclareShared("qk_ss", ptx.F32, hpb*half)
	hy := e.special(ptx.TidY)
	seg := e.Reg(ptx.U32) // this thread's head's partial sums
	e.Emit("mul.lo.u32", seg, hy, ptx.Imm(int64(half)))
	segAddr := e.sharedAddr(red, seg, 4)
	mine := e.sharedAddr(red, e.op3("add.u32", ptx.U32, seg, i), 4)
	b := e.Reg(ptx.U32)
	x0, x1 := e.Reg(ptx.F32), e.Reg(ptx.F32)
	var a ptx.Addr
	// b, the block's first head of the iteration, is the same for all its threads, so every
	// thread meets the same barriers.
	e.Emit("sub.u32", b, first, hy)
	e.forLoop(b, b, ptx.Imm(int64(c.Heads+c.KVHeads)), stride, func() {
		e.Emit("add.u32", h, b, hy)
		active := e.cmp("lt", ptx.U32, h, ptx.Imm(int64(c.Heads+c.KVHeads)))
		e.when(active, false, func() {
			a = load(h, x0, x1)
			sq := e.op3("add.rn.f32", ptx.F32, e.op3("mul.rn.f32", ptx.F32, x0, x0), e.op3("mul.rn.f32", ptx.F32, x1, x1))
			e.Emit("st.shared.f32", ptx.Addr{Base: mine}, sq)
		})
		e.Emit("bar.sync", ptx.Imm(0))
		e.when(active, false, func() {
			ss := e.f32(0)
			j := e.Reg(ptx.U32)
			e.forLoop(j, ptx.Imm(0), ptx.Imm(int64(half)), ptx.Imm(1), func() {
				at := e.Reg(ptx.U32)
				e.Emit("mad.lo.u32", at, j, ptx.Imm(4), segAddr)
				t := e.Reg(ptx.F32)
				e.Emit("ld.shared.f32", t, ptx.Addr{Base: at})
				e.Emit("add.rn.f32", ss, ss, t)
			})
			e.Emit("mul.rn.f32", ss, ss, ptx.F32Imm(1/float32(d)))
			e.Emit("add.rn.f32", ss, ss, ptx.F32Imm(c.Eps))
			rs := e.Reg(ptx.F32)
			e.Emit("rsqrt.approx.f32", rs, ss)
			isK := e.cmp("ge", ptx.U32, h, ptx.Imm(int64(c.Heads)))
			w := e.Reg(ptx.U64)
			e.Emit("selp.b64", w, kn, qn, isK)
			wa := e.byteAddr(w, i, ws)
			for _, x := range []struct {
				r   ptx.Reg
				off int
			}{{x0, 0}, {x1, half * ws}} {
				e.Emit("mul.rn.f32", x.r, x.r, rs)
				e.Emit("mul.rn.f32", x.r, x.r, e.loadAt(ptx.Addr{Base: wa, Offset: int64(x.off)}, c.WDtype))
			}
			rotate(h, a, x0, x1)
		})
		// The next iteration overwrites the partial sums.
		e.Emit("bar.sync", ptx.Imm(0))
	})
}

// RopeTables returns cos and sin of pos*inv_freq[i] as [maxPos, headDim/2] tables, with
// inv_freq as Hugging Face computes it: theta^(-2i/headDim) in float32, rescaled per
// frequency when s is Llama-3 scaling (rope_type "llama3"); other scaling types are the
// frontend's to reject. The angle is a float32 product, as in HF; cos and sin are taken in
// float64 and rounded.
func RopeTables(theta float64, headDim, maxPos int, s *bundle.RopeScaling) (cos, sin []float32) {
	inv := ropeInvFreq(theta, headDim, s)
	attn := 1.0
	if s != nil && s.AttentionFactor > 0 {
		attn = s.AttentionFactor
	}
	half := headDim / 2
	cos, sin = make([]float32, maxPos*half), make([]float32, maxPos*half)
	for p := range maxPos {
		for i, f := range inv {
			ang := float64(float32(p) * f)
			cos[p*half+i] = float32(math.Cos(ang) * attn)
			sin[p*half+i] = float32(math.Sin(ang) * attn)
		}
	}
	return cos, sin
}

// ropeInvFreq follows transformers' _compute_default_rope_parameters and
// _compute_llama3_parameters, in float32 like the torch tensors there.
func ropeInvFreq(theta float64, headDim int, s *bundle.RopeScaling) []float32 {
	inv := make([]float32, headDim/2)
	for i := range inv {
		e := float32(2*i) / float32(headDim)
		inv[i] = 1 / float32(math.Pow(theta, float64(e)))
	}
	if s == nil || s.Type != "llama3" {
		return inv
	}
	factor, low, high := float32(s.Factor), float32(s.LowFreqFactor), float32(s.HighFreqFactor)
	orig := float32(s.OriginalMaxPos)
	lowWavelen, highWavelen := orig/low, orig/high
	for i, f := range inv {
		wavelen := float32(2*math.Pi) / f
		switch {
		case wavelen > lowWavelen:
			inv[i] = f / factor
		case wavelen < highWavelen:
		default:
			smooth := (orig/wavelen - low) / (high - low)
			inv[i] = float32((1-smooth)*f/factor) + float32(smooth*f)
		}
	}
	return inv
}
