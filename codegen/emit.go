package codegen

import (
	"fmt"

	"xmix/bundle"
	"xmix/ops"
	"xmix/ptx"
)

// Kernel is one generated kernel: its PTX module text, its parameter list, and the reference
// op (ops registry name + JSON attributes) that defines what it computes.
type Kernel struct {
	Name   string
	PTX    string
	Params []ptx.Param
	Op     string
	Attrs  []byte
	// EarlyLaunch: rewritten by earlyLaunch (bundle.Kernel.EarlyLaunch).
	EarlyLaunch bool
}

// bundleKernel is k as a bundle holds it.
func (k *Kernel) bundleKernel() bundle.Kernel {
	bp := make([]bundle.Param, len(k.Params))
	for i, q := range k.Params {
		bp[i] = bundle.Param{Name: q.Name, Type: q.T.String()}
		if q.Len > 0 {
			bp[i].Type = fmt.Sprintf("%s[%d]", q.T, q.Len)
		}
	}
	return bundle.Kernel{Name: k.Name, PTX: k.PTX, Params: bp, Op: k.Op, Attrs: k.Attrs, EarlyLaunch: k.EarlyLaunch}
}

// named runs a kernel generator and prefixes its error with the kernel's kind and name, so
// that the generators themselves say only what is wrong.
func named[C any](kind, name string, c C, gen func(string, C) (*Kernel, error)) (*Kernel, error) {
	k, err := gen(name, c)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", kind, name, err)
	}
	return k, nil
}

// finish prints k as its own module and binds it to reference op `op` with attrs.
func finish(k *ptx.Kernel, op string, attrs any) (*Kernel, error) {
	k.Emit("ret")
	text, err := ptx.NewModule(k).Print()
	if err != nil {
		return nil, err
	}
	return &Kernel{Name: k.Name, PTX: text, Params: k.Params, Op: op, Attrs: ops.EncodeAttrs(attrs)}, nil
}

// emitter wraps a kernel under construction with the idioms every generator needs.
type emitter struct{ *ptx.Kernel }

func newEmitter(name string) emitter { return emitter{ptx.NewKernel(name)} }

// maxStaticShared is the static shared memory a kernel may declare: what a launch gets
// without a function attribute (the runtime sets none). It bounds the decode attention's
// merge states and the staged GEMM's x stages.
const maxStaticShared = 48 << 10

// param declares a parameter and loads it into a register.
func (e emitter) param(name string, t ptx.Type) ptx.Reg {
	s := e.Param(name, t)
	r := e.Reg(t)
	e.Emit("ld.param."+t.String(), r, ptx.Addr{Base: s})
	return r
}

// guard makes a kernel a heavy app's (GemmConfig.Guard): a last parameter any_mask, the
// step's ctl.any_mask, and an exit unless it has a bit of mask. The whole grid leaves
// together, before any barrier, having read one word. Declared after the kernel's own
// parameters, so that theirs keep their positions; mask 0 emits nothing.
func (e emitter) guard(mask uint32) {
	if mask == 0 {
		return
	}
	w := loadU32(e, ptx.Addr{Base: e.param("any_mask", ptx.U64)})
	b := e.op3("and.b32", ptx.U32, w, ptx.Imm(int64(mask)))
	e.EmitIf(e.cmp("eq", ptx.U32, b, ptx.Imm(0)), false, "exit")
}

// special reads a special register into a u32 register.
func (e emitter) special(s ptx.Special) ptx.Reg {
	r := e.Reg(ptx.U32)
	e.Emit("mov.u32", r, s)
	return r
}

// imm32 materialises a u32 constant.
func (e emitter) imm32(v int64) ptx.Reg {
	r := e.Reg(ptx.U32)
	e.Emit("mov.u32", r, ptx.Imm(v))
	return r
}

// f32 materialises an f32 constant.
func (e emitter) f32(v float32) ptx.Reg {
	r := e.Reg(ptx.F32)
	e.Emit("mov.f32", r, ptx.F32Imm(v))
	return r
}

// elemAddr returns base + idx*size as a 64-bit address (idx is u32).
func (e emitter) elemAddr(base, idx ptx.Reg, size int) ptx.Reg {
	off := e.Reg(ptx.U64)
	e.Emit("mul.wide.u32", off, idx, ptx.Imm(size))
	a := e.Reg(ptx.U64)
	e.Emit("add.u64", a, base, off)
	return a
}

// loadF32 loads base[idx] as f32 where the array stores dt (F32 or BF16).
func (e emitter) loadF32(base, idx ptx.Reg, dt ptx.Type) ptx.Reg {
	r := e.Reg(ptx.F32)
	switch dt {
	case ptx.F32:
		e.Emit("ld.global.f32", r, ptx.Addr{Base: e.elemAddr(base, idx, 4)})
	case ptx.BF16:
		h := e.Reg(ptx.B16)
		e.Emit("ld.global.b16", h, ptx.Addr{Base: e.elemAddr(base, idx, 2)})
		e.Emit("cvt.f32.bf16", r, h)
	default:
		panic(fmt.Sprintf("codegen: loadF32 of %s", dt)) // generator bug, not input
	}
	return r
}

// storeF32 stores an f32 value to base[idx] in storage type dt (F32 or BF16).
func (e emitter) storeF32(base, idx, v ptx.Reg, dt ptx.Type) {
	switch dt {
	case ptx.F32:
		e.Emit("st.global.f32", ptx.Addr{Base: e.elemAddr(base, idx, 4)}, v)
	case ptx.BF16:
		h := e.Reg(ptx.B16)
		e.Emit("cvt.rn.bf16.f32", h, v)
		e.Emit("st.global.b16", ptx.Addr{Base: e.elemAddr(base, idx, 2)}, h)
	default:
		panic(fmt.Sprintf("codegen: storeF32 of %s", dt))
	}
}

// warpReduce folds v across the 32 lanes of a warp with op ("add" or "max"); every lane gets
// the result.
func (e emitter) warpReduce(v ptx.Reg, op string) {
	t := e.Reg(ptx.F32)
	for off := 16; off > 0; off /= 2 {
		e.Emit("shfl.sync.bfly.b32", t, v, ptx.Imm(off), ptx.Imm(0x1f), ptx.Imm(-1))
		e.Emit(op+".f32", v, v, t)
	}
}

// blockReduce folds v across a block of nthreads (a multiple of 32, at most 1024) with op;
// every thread gets the result. scratch is a shared f32 array of at least nthreads/32
// elements; tid is %tid.x. It ends with a barrier, so scratch may be reused at once.
func (e emitter) blockReduce(v ptx.Reg, op string, scratch ptx.Sym, tid ptx.Reg, nthreads int) ptx.Reg {
	return e.blockReduceN([]ptx.Reg{v}, op, scratch, tid, nthreads)[0]
}

// blockReduce2 folds a and b as two blockReduce calls would (each value over the same tree,
// so each result has the same bits) through one pair of barriers; scratch holds at least
// 2*nthreads/32 f32.
func (e emitter) blockReduce2(a, b ptx.Reg, op string, scratch ptx.Sym, tid ptx.Reg, nthreads int) (ptx.Reg, ptx.Reg) {
	r := e.blockReduceN([]ptx.Reg{a, b}, op, scratch, tid, nthreads)
	return r[0], r[1]
}

// blockReduceN folds each of vs across the block: warp butterflies, then one shared-memory
// round (value i's warp totals at scratch[i*warps:]) summed in warp order.
func (e emitter) blockReduceN(vs []ptx.Reg, op string, scratch ptx.Sym, tid ptx.Reg, nthreads int) []ptx.Reg {
	for _, v := range vs {
		e.warpReduce(v, op)
	}
	if nthreads <= 32 {
		return vs
	}
	warps := nthreads / 32
	lane := e.Reg(ptx.U32)
	e.Emit("and.b32", lane, tid, ptx.Imm(31))
	warp := e.Reg(ptx.U32)
	e.Emit("shr.u32", warp, tid, ptx.Imm(5))
	base := e.Reg(ptx.U32)
	e.Emit("mov.u32", base, scratch)
	slot := e.Reg(ptx.U32)
	e.Emit("mad.lo.u32", slot, warp, ptx.Imm(4), base)
	p := e.Reg(ptx.Pred)
	e.Emit("setp.eq.u32", p, lane, ptx.Imm(0))
	for i, v := range vs {
		e.EmitIf(p, false, "st.shared.f32", ptx.Addr{Base: slot, Offset: int64(4 * warps * i)}, v)
	}
	e.Emit("bar.sync", ptx.Imm(0))
	accs := e.Regs(ptx.F32, len(vs))
	t := e.Reg(ptx.F32)
	for i, acc := range accs {
		off := int64(4 * warps * i)
		e.Emit("ld.shared.f32", acc, ptx.Addr{Base: scratch, Offset: off})
		for w := 1; w < warps; w++ {
			e.Emit("ld.shared.f32", t, ptx.Addr{Base: scratch, Offset: off + int64(4*w)})
			e.Emit(op+".f32", acc, acc, t)
		}
	}
	e.Emit("bar.sync", ptx.Imm(0))
	return accs
}

// loadChunk loads vec consecutive elements of storage type dt at a as f32 registers: one
// element, or 16-byte loads (vec 8 of bf16; vec 4 or 8 of f32).
func loadChunk(e emitter, a ptx.Addr, dt ptx.Type, vec int) []ptx.Reg {
	if vec == 1 {
		return []ptx.Reg{e.loadAt(a, dt)}
	}
	if dt == ptx.F32 {
		vs := e.Regs(ptx.F32, vec)
		for i := 0; i < vec; i += 4 {
			e.Emit("ld.global.v4.f32", ptx.Vec(vs[i:i+4]), ptx.Addr{Base: a.Base, Offset: a.Offset + int64(4*i)})
		}
		return vs
	}
	// Eight bf16 in four words.
	words := e.Regs(ptx.B32, 4)
	e.Emit("ld.global.v4.b32", ptx.Vec(words), a)
	return e.widenBF16(words)
}

// widenBF16 turns words of two bf16 each into their elements as f32, in memory order: the
// even element is the low half of its word, and a bf16 widens to f32 by standing in the high
// half of a word.
func (e emitter) widenBF16(words []ptx.Reg) []ptx.Reg {
	out := make([]ptx.Reg, 0, 2*len(words))
	for _, wd := range words {
		lo, hi := e.Reg(ptx.B32), e.Reg(ptx.B32)
		e.Emit("shl.b32", lo, wd, ptx.Imm(16))
		e.Emit("and.b32", hi, wd, ptx.Imm(-65536))
		flo, fhi := e.Reg(ptx.F32), e.Reg(ptx.F32)
		e.Emit("mov.b32", flo, lo)
		e.Emit("mov.b32", fhi, hi)
		out = append(out, flo, fhi)
	}
	return out
}
