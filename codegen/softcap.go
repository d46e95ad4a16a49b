package codegen

import (
	"fmt"
	"math"

	"xmix/ops"
	"xmix/ptx"
)

// Soft-capping (Gemma 2): x -> cap * tanh(x / cap), which bounds a logit to (-cap, cap)
// and leaves small ones nearly as they are. Gemma 2 caps its attention scores (cap 50,
// attention.go and attention_prefill.go, AttnConfig.Softcap) and its final logits (cap 30,
// Softcap below, between the LM head and the logits hook's ops and the sampler).

// capTanh replaces u by c - 2c / (2^u + 1), which is c * tanh(u / (2 log2 e)): callers
// scale their value by 2 log2 e / cap first (folded into a multiply they do anyway), so c
// is cap, or cap * log2 e for scores kept in log2 units. No tanh instruction
// (tanh.approx.f32 is 2^-11 relative); ex2.approx is within 2 ulp and the reciprocal exact,
// so the result is within a few ulp of c absolutely, and 2^u = inf or 0 at the ends gives
// exactly c or -c.
func (e emitter) capTanh(u ptx.Reg, c float32) {
	e.Emit("ex2.approx.f32", u, u)
	e.Emit("add.rn.f32", u, u, ptx.F32Imm(1))
	e.Emit("rcp.rn.f32", u, u)
	e.Emit("fma.rn.f32", u, u, ptx.F32Imm(-2*c), ptx.F32Imm(c))
}

// capScale is what a value is multiplied by before capTanh with a cap of limit.
func capScale(limit float32) float32 { return float32(2 * math.Log2E / float64(limit)) }

// SoftcapConfig configures Softcap: rows of Width values capped at Cap, in place.
type SoftcapConfig struct {
	Width int
	Cap   float32
}

// Softcap spreads each row over blocks of softcapChunk values, like the chunked SiLU: at
// one sampled row a block per row would leave the GPU idle over a 256000-wide row.
const (
	softcapThreads = 256
	softcapPer     = 4
	softcapChunk   = softcapThreads * softcapPer
)

// Launch is the grid for rows rows: (chunks of the row, rows).
func (c SoftcapConfig) Launch(rows int) ops.Launch {
	return ops.Launch{Grid: [3]int{(c.Width + softcapChunk - 1) / softcapChunk, rows, 1}, Block: [3]int{softcapThreads, 1, 1}}
}

// Softcap generates the kernel of op "softcap": x[r, i] = Cap * tanh(x[r, i] / Cap) for every
// row r of the launch (grid y) and column i < Width. Parameter: x (u64).
func Softcap(name string, c SoftcapConfig) (*Kernel, error) {
	return named("softcap", name, c, softcap)
}

func softcap(name string, c SoftcapConfig) (*Kernel, error) {
	if c.Width <= 0 || c.Width > math.MaxInt32/4 {
		return nil, fmt.Errorf("width %d", c.Width)
	}
	if !(c.Cap > 0) || !finite32(c.Cap) {
		return nil, fmt.Errorf("cap %g: want positive and finite", c.Cap)
	}
	e := newEmitter(name)
	x := e.param("x", ptx.U64)
	e.MaxNTid = softcapThreads
	tid, blk, row := e.special(ptx.TidX), e.special(ptx.CtaidX), e.special(ptx.CtaidY)
	base := e.Reg(ptx.U32)
	e.Emit("mad.lo.u32", base, blk, ptx.Imm(softcapChunk), tid)
	rowAddr := e.byteAddr(x, row, 4*c.Width) // 64-bit: rows x a vocabulary pass 2^32 bytes
	for j := range softcapPer {
		col := e.op3("add.u32", ptx.U32, base, ptx.Imm(int64(j*softcapThreads)))
		e.when(e.cmp("lt", ptx.U32, col, ptx.Imm(int64(c.Width))), false, func() {
			a := ptx.Addr{Base: e.byteAddr(rowAddr, col, 4)}
			v := e.Reg(ptx.F32)
			e.Emit("ld.global.f32", v, a)
			e.Emit("mul.rn.f32", v, v, ptx.F32Imm(capScale(c.Cap)))
			e.capTanh(v, c.Cap)
			e.Emit("st.global.f32", a, v)
		})
	}
	return finish(e.Kernel, "softcap", ops.SoftcapAttrs{Width: c.Width, Cap: c.Cap})
}
