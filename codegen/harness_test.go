package codegen

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"testing"

	"xmix/ops"
	"xmix/ptx"
	"xmix/ptx/emu"
)

// targ is one argument of a kernel under test.
type targ struct {
	name  string    // parameter name, for messages
	f32   []float32 // input data (f32 buffer)
	bf16  []float32 // input data stored as bf16
	u32   []uint32  // input data (u32 buffer)
	out   int       // >0: an output (or in/out when data is also given) of this many elements
	dtype string    // output element type: f32, bf16, u32 (default f32)
	bits  uint64    // scalar parameter
	isVal bool      // scalar parameter marker
	tol   float64   // relative L2 tolerance for this output (default 1e-5)
}

// paramNames lists k's parameter names in order.
func paramNames(k *Kernel) []string {
	var names []string
	for _, p := range k.Params {
		names = append(names, p.Name)
	}
	return names
}

// must returns a function that fails t on a generator's error and otherwise returns its
// kernel: k := must(t)(Gemm(name, c)).
func must(t *testing.T) func(*Kernel, error) *Kernel {
	return func(k *Kernel, err error) *Kernel {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
}

func scalarU32(name string, v uint32) targ { return targ{name: name, bits: uint64(v), isVal: true} }

// nullPtr is a pointer parameter passed 0: an optional output the kernel must not write.
func nullPtr(name string) targ { return targ{name: name, isVal: true} }

func randF32(r *rand.Rand, n int, scale float32) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = (r.Float32()*2 - 1) * scale
	}
	return v
}

// bytesOf lays out one argument's initial contents; outputs without data are poisoned with
// 0xFF bytes (NaN for floats, 0xFFFFFFFF for u32) so that unwritten elements fail the check.
func (a targ) bytesOf() []byte {
	var b []byte
	switch {
	case a.f32 != nil:
		b = make([]byte, 4*len(a.f32))
		for i, v := range a.f32 {
			binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(v))
		}
	case a.bf16 != nil:
		b = make([]byte, 2*len(a.bf16))
		for i, v := range a.bf16 {
			binary.LittleEndian.PutUint16(b[2*i:], ops.F32ToBF16(v))
		}
	case a.u32 != nil:
		b = make([]byte, 4*len(a.u32))
		for i, v := range a.u32 {
			binary.LittleEndian.PutUint32(b[4*i:], v)
		}
	}
	if a.out > 0 && b == nil {
		b = make([]byte, a.out*a.elemSize())
		for i := range b {
			b[i] = 0xFF
		}
	}
	return b
}

func (a targ) elemSize() int {
	if a.dtype == "bf16" {
		return 2
	}
	return 4
}

// checkKernel runs k's PTX in the emulator and its reference op on identical inputs and
// compares every output: floats by relative L2 error, u32 exactly.
func checkKernel(t *testing.T, k *Kernel, l ops.Launch, args []targ) {
	t.Helper()
	mod, err := ptx.Parse(k.PTX)
	if err != nil {
		t.Fatalf("%s: parse: %v\n%s", k.Name, err, k.PTX)
	}
	if len(args) != len(k.Params) {
		t.Fatalf("%s: test passes %d args, kernel has %d params", k.Name, len(args), len(k.Params))
	}
	mem := emu.NewMemory()
	params := make([]uint64, len(args))
	refArgs := make([]ops.Arg, len(args))
	addrs := make([]uint64, len(args))
	for i, a := range args {
		if a.isVal {
			params[i] = a.bits
			refArgs[i] = ops.Arg{Bits: a.bits}
			continue
		}
		init := a.bytesOf()
		addrs[i] = mem.Alloc(len(init))
		copy(mem.Bytes(addrs[i]), init)
		params[i] = addrs[i]
		refArgs[i] = ops.Arg{Mem: append([]byte(nil), init...)}
	}
	if err := emu.Run(mod, k.Name, emu.Launch{Grid: l.Grid, Block: l.Block}, mem, params); err != nil {
		t.Fatalf("%s: emulate: %v", k.Name, err)
	}
	ref, err := ops.Build(k.Op, k.Attrs)
	if err != nil {
		t.Fatalf("%s: %v", k.Name, err)
	}
	if err := ref.Run(refArgs, l); err != nil {
		t.Fatalf("%s: reference: %v", k.Name, err)
	}
	for i, a := range args {
		if a.out == 0 {
			continue
		}
		got := mem.Bytes(addrs[i])[:a.out*a.elemSize()]
		want := refArgs[i].Mem[:a.out*a.elemSize()]
		if a.dtype == "u32" {
			g, w := ops.Arg{Mem: got}.U32(), ops.Arg{Mem: want}.U32()
			for j := range w {
				if g[j] != w[j] {
					t.Fatalf("%s: output %s[%d] = %d, reference %d", k.Name, a.name, j, g[j], w[j])
				}
			}
			continue
		}
		g, w := floats(got, a.dtype), floats(want, a.dtype)
		tol := a.tol
		if tol == 0 {
			tol = 1e-5
			if a.dtype == "bf16" {
				tol = 1e-2
			}
		}
		if e := relL2(g, w); !(e <= tol) {
			t.Fatalf("%s: output %s: relative L2 error %.3g > %.3g (first values got %v want %v)",
				k.Name, a.name, e, tol, head(g), head(w))
		}
	}
}

func floats(b []byte, dtype string) []float64 {
	if dtype == "bf16" {
		h := ops.Arg{Mem: b}.U16()
		out := make([]float64, len(h))
		for i, v := range h {
			out[i] = float64(ops.BF16ToF32(v))
		}
		return out
	}
	f := ops.Arg{Mem: b}.F32()
	out := make([]float64, len(f))
	for i, v := range f {
		out[i] = float64(v)
	}
	return out
}

// relL2 is |g-w|/|w|; NaN anywhere (an unwritten, poisoned element) makes it NaN.
func relL2(g, w []float64) float64 {
	var num, den float64
	for i := range w {
		d := g[i] - w[i]
		num += d * d
		den += w[i] * w[i]
	}
	if den == 0 {
		return math.Sqrt(num)
	}
	return math.Sqrt(num / den)
}

func head(v []float64) []float64 { return v[:min(4, len(v))] }
