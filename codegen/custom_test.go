package codegen

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"xmix/bundle"
	"xmix/ops"
	"xmix/passes"
	"xmix/ptx"
	"xmix/specs"
)

// scale2PTX is the shipped example custom kernel (x *= 2 on rows whose app bit is set).
var scale2PTX = specs.ScaleTwoPTX

// bindByName lays out args for a kernel's parameters from a name -> Arg map.
func bindByName(t *testing.T, k *Kernel, m map[string]ops.Arg) []ops.Arg {
	t.Helper()
	out := make([]ops.Arg, len(k.Params))
	for i, q := range k.Params {
		a, ok := m[q.Name]
		if !ok {
			t.Fatalf("%s: no argument for parameter %s", k.Name, q.Name)
		}
		out[i] = a
	}
	return out
}

func f32Bytes(v []float32) []byte {
	b := make([]byte, 4*len(v))
	copy(ops.Arg{Mem: b}.F32(), v)
	return b
}

// A custom scale-by-2 kernel, run as the CPU backend runs it (op custom_ptx in the emulator),
// gives the built-in scale template's reference bits on enabled rows and leaves other rows
// and the columns outside the hooked slice alone.
func TestCustomScaleMatchesBuiltin(t *testing.T) {
	const rows, width, stride, offset, bit = 5, 40, 48, 4, 3
	r := rand.New(rand.NewPCG(1, 2))
	x := randF32(r, rows*stride, 3)
	mask := []uint32{1 << bit, 1, 1<<bit | 1<<5, 0, 1 << bit}

	bc := MIKernelConfig{Width: width, Stride: stride, Offset: offset,
		Ops: []MIOp{{Template: "scale", Bit: bit, Width: width, Scal: "scal", Alpha: 0, Bias: -1}}}
	builtin, err := MIKernel("mi_scale", bc)
	if err != nil {
		t.Fatal(err)
	}
	ref, err := ops.Build(builtin.Op, builtin.Attrs)
	if err != nil {
		t.Fatal(err)
	}
	want := f32Bytes(x)
	args := bindByName(t, builtin, map[string]ops.Arg{"x": {Mem: want}, "ctl_mask": {Mem: u32Bytes(mask)},
		"mi0_scal": {Mem: f32Bytes([]float32{2})}})
	if err := ref.Run(args, bc.Launch(rows)); err != nil {
		t.Fatal(err)
	}

	c := CustomConfig{PTX: scale2PTX, Entry: "scale2", Signature: passes.CustomABI}
	k, err := CustomKernel("custom_app_scale2", c)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(k.PTX, ".entry custom_app_scale2") {
		t.Fatalf("entry not renamed:\n%s", k.PTX)
	}
	run, err := ops.Build(k.Op, k.Attrs)
	if err != nil {
		t.Fatal(err)
	}
	got := f32Bytes(x)
	if err := run.Run(bindByName(t, k, map[string]ops.Arg{
		"x": {Mem: got}, "stride": {Bits: stride}, "offset": {Bits: offset}, "width": {Bits: width},
		"ctl_mask": {Mem: u32Bytes(mask)}, "bit": {Bits: bit},
	}), c.Launch(rows)); err != nil {
		t.Fatal(err)
	}
	g, w := ops.Arg{Mem: got}.F32(), ops.Arg{Mem: want}.F32()
	for i := range w {
		row, col := i/stride, i%stride
		on := mask[row]>>bit&1 == 1 && col >= offset && col < offset+width
		switch {
		case math.Float32bits(g[i]) != math.Float32bits(w[i]):
			t.Fatalf("x[%d] (row %d col %d) = %v, built-in scale gives %v", i, row, col, g[i], w[i])
		case !on && g[i] != x[i]:
			t.Fatalf("x[%d] (row %d col %d) changed from %v to %v", i, row, col, x[i], g[i])
		case on && g[i] != 2*x[i]:
			t.Fatalf("x[%d] = %v, want %v", i, g[i], 2*x[i])
		}
	}
}

func u32Bytes(v []uint32) []byte {
	b := make([]byte, 4*len(v))
	copy(ops.Arg{Mem: b}.U32(), v)
	return b
}

func TestCustomKernelRefusesBadPTX(t *testing.T) {
	for _, tc := range []struct {
		name, ptx, entry string
		sig              []ptx.Param
		want             string
	}{
		{"garbage", "not ptx at all", "scale2", passes.CustomABI, "does not parse"},
		{"entry", scale2PTX, "scale3", passes.CustomABI, "no .entry scale3"},
		{"target", strings.Replace(scale2PTX, "sm_90", "sm_100", 1), "scale2", passes.CustomABI, ".target sm_100"},
		{"version", strings.Replace(scale2PTX, ".version 8.0", ".version 9.0", 1), "scale2", passes.CustomABI, ".version 9.0"},
		{"signature", scale2PTX, "scale2", append(append([]ptx.Param(nil), passes.CustomABI...), ptx.Param{Name: "v", T: ptx.U64}),
			"has 6 parameters"},
		{"func", ".func helper()\n{\n\tret;\n}\n" + scale2PTX, "scale2", passes.CustomABI, "module-level .func"},
		{"global", ".global .f32 g;\n" + scale2PTX, "scale2", passes.CustomABI, "module-level .global"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := CustomKernel("k", CustomConfig{PTX: tc.ptx, Entry: tc.entry, Signature: tc.sig})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
}

// The renorm kernel matches its reference, gathered (final norm) or not.
func TestRenorm(t *testing.T) {
	const rows, h = 3, 160
	r := rand.New(rand.NewPCG(3, 4))
	for _, gather := range []bool{false, true} {
		for _, wdt := range []ptx.Type{ptx.F32, ptx.BF16} {
			c := RenormConfig{Hidden: h, Eps: 1e-5, WDtype: wdt, Gather: gather}
			k, err := Renorm("renorm", c)
			if err != nil {
				t.Fatal(err)
			}
			w := targ{name: "w", f32: randF32(r, h, 1)}
			if wdt == ptx.BF16 {
				w = targ{name: "w", bf16: w.f32}
			}
			args := []targ{{name: "resid", f32: randF32(r, rows*h, 2)}, w}
			if gather {
				args = append(args, targ{name: "out", f32: make([]float32, 2*h), out: 2 * h},
					targ{name: "out_row", u32: []uint32{1, bundle.NoRow, 0}})
			} else {
				args = append(args, targ{name: "out", out: rows * h})
			}
			checkKernel(t, k, c.Launch(rows), args)
		}
	}
}
