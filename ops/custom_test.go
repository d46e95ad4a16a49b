package ops

import (
	"encoding/binary"
	"math"
	"strings"
	"testing"

	"xmix/bundle"
)

// doublePTX doubles x[i] for the block's thread i.
const doublePTX = `.version 8.0
.target sm_90
.address_size 64

.visible .entry double(.param .u64 x)
{
	.reg .b32 %r<2>;
	.reg .b64 %rd<4>;
	.reg .f32 %f<2>;
	ld.param.u64 %rd1, [x];
	mov.u32 %r1, %tid.x;
	mul.wide.u32 %rd2, %r1, 4;
	add.u64 %rd3, %rd1, %rd2;
	ld.global.f32 %f1, [%rd3];
	add.f32 %f1, %f1, %f1;
	st.global.f32 [%rd3], %f1;
	ret;
}
`

// custom_ptx runs its PTX in the emulator, on the arguments' own memory, and refuses PTX it
// cannot run.
func TestCustomPTXRunsInTheEmulator(t *testing.T) {
	r, err := Build("custom_ptx", EncodeAttrs(CustomPTXAttrs{PTX: doublePTX, Entry: "double"}))
	if err != nil {
		t.Fatal(err)
	}
	x := []float32{1, -2.5, 3}
	mem := make([]byte, 4*len(x))
	for i, v := range x {
		binary.LittleEndian.PutUint32(mem[4*i:], math.Float32bits(v))
	}
	if err := r.Run([]Arg{{Mem: mem}}, Launch{Grid: [3]int{1, 1, 1}, Block: [3]int{3, 1, 1}}); err != nil {
		t.Fatal(err)
	}
	if got := (Arg{Mem: mem}).F32(); got[0] != 2 || got[1] != -5 || got[2] != 6 {
		t.Fatalf("doubled: %v", got)
	}
	if err := r.Run(nil, Launch{}); err == nil || err.Error() != "custom double: 0 arguments, want 1" {
		t.Fatalf("no arguments: %v", err)
	}
	for _, c := range []struct {
		attrs CustomPTXAttrs
		want  string
	}{
		{CustomPTXAttrs{Entry: "k"}, "custom kernel without PTX text or entry"},
		{CustomPTXAttrs{PTX: doublePTX, Entry: "triple"}, "entry triple: no .entry triple"},
		{CustomPTXAttrs{PTX: "not ptx", Entry: "k"}, "entry k: "},
	} {
		if _, err := Build("custom_ptx", EncodeAttrs(c.attrs)); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want %q", c.attrs, err, c.want)
		}
	}
}

// row_renorm gives row_norm's normed rows (of the residual it stored) bit for bit, gathered
// or not.
func TestRenormMatchesRowNorm(t *testing.T) {
	const rows, h = 3, 24
	resid := make([]float32, rows*h)
	w := make([]float32, h)
	for i := range resid {
		resid[i] = float32(math.Sin(float64(i))) * 3
	}
	for i := range w {
		w[i] = 1 + float32(i)/10
	}
	for _, gather := range []bool{false, true} {
		outRow := []uint32{2, bundle.NoRow, 0}
		norm, err := Build("row_norm", EncodeAttrs(RowNormAttrs{Hidden: h, Eps: 1e-5, WDtype: "f32", Load: "add", Gather: gather}))
		if err != nil {
			t.Fatal(err)
		}
		args := []Arg{{Mem: f32b(resid)}, {Mem: f32b(make([]float32, rows*h))}, {Mem: f32b(w)}, {Mem: f32b(make([]float32, rows*h))}}
		if gather {
			args = append(args, Arg{Mem: u32b(outRow)})
		} else {
			args = append(args, Arg{}) // out_bf16: none
		}
		args = append(args, Arg{Mem: u32b(make([]uint32, rows))})
		l := Launch{Grid: [3]int{rows, 1, 1}}
		if err := norm.Run(args, l); err != nil {
			t.Fatal(err)
		}
		re, err := Build("row_renorm", EncodeAttrs(RenormAttrs{Hidden: h, Eps: 1e-5, WDtype: "f32", Gather: gather}))
		if err != nil {
			t.Fatal(err)
		}
		out := make([]float32, rows*h)
		rargs := []Arg{{Mem: f32b(resid)}, {Mem: f32b(w)}, {Mem: f32b(out)}}
		if gather {
			rargs = append(rargs, Arg{Mem: u32b(outRow)})
		}
		if err := re.Run(rargs, l); err != nil {
			t.Fatal(err)
		}
		got, want := rargs[2].F32(), args[3].F32()
		for i := range want {
			if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
				t.Fatalf("gather %v: out[%d] = %v, row_norm %v", gather, i, got[i], want[i])
			}
		}
	}
}

func f32b(v []float32) []byte {
	b := make([]byte, 4*len(v))
	copy(Arg{Mem: b}.F32(), v)
	return b
}

func u32b(v []uint32) []byte {
	b := make([]byte, 4*len(v))
	copy(Arg{Mem: b}.U32(), v)
	return b
}
