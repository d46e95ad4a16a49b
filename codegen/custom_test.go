package codegen

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"xmix/ops"
	"xmix/passes"
	"xmix/ptx"
)

// scale2PTX is a custom kernel under passes.CustomABI: x *= 2 on rows whose app bit is set.
const scale2PTX = `
.version 8.0
.target sm_90
.address_size 64

// x[row*stride+offset+i] *= 2 on rows whose app bit is set.
.visible .entry scale2(
	.param .u64 x,
	.param .u32 stride,
	.param .u32 offset,
	.param .u32 width,
	.param .u64 ctl_mask,
	.param .u32 bit
)
{
	.reg .pred %p<3>;
	.reg .b32 %r<12>;
	.reg .b64 %rd<6>;
	.reg .f32 %f<3>;

	ld.param.u64 %rd1, [x];
	ld.param.u32 %r1, [stride];
	ld.param.u32 %r2, [offset];
	ld.param.u32 %r3, [width];
	ld.param.u64 %rd2, [ctl_mask];
	ld.param.u32 %r4, [bit];
	mov.u32 %r5, %ctaid.x;
	mov.u32 %r6, %tid.x;
	mov.u32 %r10, %ntid.x;
	mul.wide.u32 %rd3, %r5, 4;
	add.u64 %rd3, %rd2, %rd3;
	ld.global.u32 %r7, [%rd3];
	shr.u32 %r7, %r7, %r4;
	and.b32 %r7, %r7, 1;
	setp.eq.u32 %p1, %r7, 0;
	@%p1 bra.uni DONE;
	mad.lo.u32 %r8, %r5, %r1, %r2;
LOOP:
	setp.ge.u32 %p2, %r6, %r3;
	@%p2 bra DONE;
	add.u32 %r9, %r8, %r6;
	mul.wide.u32 %rd4, %r9, 4;
	add.u64 %rd4, %rd1, %rd4;
	ld.global.f32 %f1, [%rd4];
	mul.rn.f32 %f1, %f1, 0f40000000;
	st.global.f32 [%rd4], %f1;
	add.u32 %r6, %r6, %r10;
	bra LOOP;
DONE:
	ret;
}
`

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
					targ{name: "out_row", u32: []uint32{1, ops.NoRow, 0}})
			} else {
				args = append(args, targ{name: "out", out: rows * h})
			}
			checkKernel(t, k, c.Launch(rows), args)
		}
	}
}
