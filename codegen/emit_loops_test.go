package codegen

import (
	"math"
	"math/rand/v2"
	"testing"

	"xmix/ops"
	"xmix/ptx"
)

// TestUnrolled: the loop with its loads run ahead visits i = start, start+step, ... below end
// in order, one use at a time, through whole groups and a tail, empty ranges included, and a
// use can leave it: a sequential f32 sum has the plain loop's bits, and the first index where
// the running sum passes a bound is the plain loop's.
func TestUnrolled(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	x := randF32(r, 700, 1)
	for i := range x {
		x[i] = float32(math.Abs(float64(x[i]))) // running sums that grow, so a bound is passed once
	}
	for _, c := range []struct{ start, end, step, u int }{
		{0, 700, 1, 16}, {0, 16, 1, 16}, {0, 15, 1, 16}, {3, 700, 7, 4}, {5, 5, 1, 16}, {9, 2, 1, 8}, {0, 700, 33, 16}, {1, 700, 1, 1},
	} {
		var sum float32
		var n uint32
		passed, bound := uint32(math.MaxUint32), float32(20)
		for i := c.start; i < c.end; i += c.step {
			sum += x[i]
			n++
			if passed == math.MaxUint32 && sum > bound {
				passed = uint32(i)
			}
		}
		got := runUnrolled(t, x, c.start, c.end, c.step, c.u, bound)
		if math.Float32frombits(got[0]) != sum || got[1] != n || got[2] != passed {
			t.Errorf("%+v: sum %v, %d uses, bound passed at %d; want %v, %d, %d", c, math.Float32frombits(got[0]), got[1], got[2], sum, n, passed)
		}
	}
}

// runUnrolled emulates one thread that sums x[i] over the loop into out[0] and counts its uses
// into out[1], then runs the loop again and leaves it at the first i where the running sum
// passes bound, storing i into out[2] (MaxUint32 if none).
func runUnrolled(t *testing.T, x []float32, start, end, step, u int, bound float32) [3]uint32 {
	t.Helper()
	e := newEmitter("unrolled_test")
	xp, out := e.param("x", ptx.U64), e.param("out", ptx.U64)
	load := func(i ptx.Reg, j int) ptx.Reg {
		v := e.Reg(ptx.F32)
		e.Emit("ld.global.f32", v, ptx.Addr{Base: e.byteAddr(xp, i, 4), Offset: int64(4 * j * step)})
		return v
	}
	sum, n, i := e.f32(0), e.imm32(0), e.Reg(ptx.U32)
	e.unrolled(i, ptx.Imm(int64(start)), ptx.Imm(int64(end)), step, u, load, func(_, v ptx.Reg) {
		e.Emit("add.rn.f32", sum, sum, v)
		e.Emit("add.u32", n, n, ptx.Imm(1))
	})
	e.Emit("st.global.f32", ptx.Addr{Base: out}, sum)
	e.Emit("st.global.u32", ptx.Addr{Base: out, Offset: 4}, n)
	run, found := e.f32(0), e.NewLabel("found")
	e.Emit("st.global.u32", ptx.Addr{Base: out, Offset: 8}, e.imm32(math.MaxUint32))
	e.unrolled(i, ptx.Imm(int64(start)), ptx.Imm(int64(end)), step, u, load, func(i, v ptx.Reg) {
		e.Emit("add.rn.f32", run, run, v)
		over := e.cmp("gt", ptx.F32, run, ptx.F32Imm(bound))
		e.EmitIf(over, false, "st.global.u32", ptx.Addr{Base: out, Offset: 8}, i)
		e.EmitIf(over, false, "bra", ptx.Sym(found))
	})
	e.Label(found)
	k, err := finish(e.Kernel, "none", nil)
	if err != nil {
		t.Fatal(err)
	}
	b := newEmuBufs()
	b.run(t, k, ops.Launch{Grid: [3]int{1, 1, 1}, Block: [3]int{1, 1, 1}}, []targ{{name: "x", f32: x}, {name: "out", out: 3, dtype: "u32"}})
	o := ops.Arg{Mem: b.mem.Bytes(b.addr["out"])[:12]}.U32()
	return [3]uint32{o[0], o[1], o[2]}
}
