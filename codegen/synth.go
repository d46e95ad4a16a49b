package codegen

import (
	"fmt"

	"xmix/ops"
	"xmix/ptx"
)

// Synth generates the synthetic-weights kernel (ops "synth"): one thread per element,
// out[i] = ops.SynthValue(key, scaleU, i) stored as dt. Parameters: out, n (u32), key (u64),
// scale (u64, the float64 bits of scaleU).
func Synth(name string, dt ptx.Type) (*Kernel, error) {
	if dt != ptx.F32 && dt != ptx.BF16 {
		return nil, fmt.Errorf("synth %s: storage type %s (want f32 or bf16)", name, dt)
	}
	e := newEmitter(name)
	out := e.param("out", ptx.U64)
	n := e.param("n", ptx.U32)
	key := e.param("key", ptx.U64)
	scaleBits := e.param("scale", ptx.U64)
	i := e.Reg(ptx.U32)
	e.Emit("mad.lo.u32", i, e.special(ptx.CtaidX), ptx.Imm(ops.SynthThreads), e.special(ptx.TidX))
	done := e.Reg(ptx.Pred)
	e.Emit("setp.ge.u32", done, i, n)
	end := e.NewLabel("end")
	e.EmitIf(done, false, "bra", ptx.Sym(end))
	// h = SplitMix64(key ^ i*golden)
	x := e.Reg(ptx.U64)
	e.Emit("cvt.u64.u32", x, i)
	e.Emit("mul.lo.u64", x, x, ptx.U64Imm(ops.SynthGolden))
	e.Emit("xor.b64", x, x, key)
	t := e.Reg(ptx.U64)
	e.Emit("add.u64", x, x, ptx.U64Imm(ops.SynthGolden))
	for _, step := range []struct {
		shift int
		mul   uint64
	}{{30, 0xBF58476D1CE4E5B9}, {27, 0x94D049BB133111EB}} {
		e.Emit("shr.u64", t, x, ptx.Imm(step.shift))
		e.Emit("xor.b64", x, x, t)
		e.Emit("mul.lo.u64", x, x, ptx.U64Imm(step.mul))
	}
	e.Emit("shr.u64", t, x, ptx.Imm(31))
	e.Emit("xor.b64", x, x, t)
	// t = 2*(h>>40) - 2^24, exact; v = float32(float64(t) * scaleU)
	e.Emit("shr.u64", x, x, ptx.Imm(40))
	e.Emit("shl.b64", x, x, ptx.Imm(1))
	e.Emit("sub.s64", x, x, ptx.Imm(1<<24))
	d := e.Reg(ptx.F64)
	e.Emit("cvt.rn.f64.s64", d, x)
	sc := e.Reg(ptx.F64)
	e.Emit("mov.b64", sc, scaleBits)
	e.Emit("mul.rn.f64", d, d, sc)
	v := e.Reg(ptx.F32)
	e.Emit("cvt.rn.f32.f64", v, d)
	e.storeF32(out, i, v, dt)
	e.Label(end)
	return finish(e.Kernel, synthOp, ops.SynthAttrs{Dtype: dt.String()})
}

// SynthLaunch covers n elements.
func SynthLaunch(n int) ops.Launch {
	return ops.Launch{Grid: [3]int{(n + ops.SynthThreads - 1) / ops.SynthThreads, 1, 1}, Block: [3]int{ops.SynthThreads, 1, 1}}
}
