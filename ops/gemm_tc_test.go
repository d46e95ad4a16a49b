package ops

import (
	"math"
	"math/rand/v2"
	"testing"

	"xmix/bundle"
)

func TestGemmTCReference(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	const rows, k, n = 5, 48, 7
	x := make([]float32, rows*k)
	for i := range x {
		x[i] = r.Float32()*2 - 1
	}
	wf := make([]float32, n*k)
	wArg := Arg{Mem: make([]byte, 2*n*k)}
	for i := range wf {
		wArg.U16()[i] = F32ToBF16(r.Float32()*2 - 1)
		wf[i] = BF16ToF32(wArg.U16()[i])
	}
	xArg, yArg := Arg{Mem: make([]byte, 4*rows*k)}, Arg{Mem: make([]byte, 4*rows*n)}
	copy(xArg.F32(), x)
	run, err := Build("gemm_tc", EncodeAttrs(bundle.GemmTCAttrs{K: k, N: n}))
	if err != nil {
		t.Fatal(err)
	}
	if err := run.Run([]Arg{xArg, wArg, yArg, {Bits: rows}}, Launch{}); err != nil {
		t.Fatal(err)
	}
	for rr := range rows {
		for j := range n {
			// Written out independently: split x into bf16 hi and lo by hand; the result must
			// be within 1e-5 of the f32-x product (one bf16 part alone is ~1e-3 off).
			want, wantF32x := 0.0, 0.0
			for i := range k {
				v := x[rr*k+i]
				b := math.Float32bits(v)
				hi := math.Float32frombits((b + 0x7fff + (b>>16)&1) &^ 0xffff)
				rb := math.Float32bits(v - hi)
				lo := math.Float32frombits((rb + 0x7fff + (rb>>16)&1) &^ 0xffff)
				want += (float64(hi) + float64(lo)) * float64(wf[j*k+i])
				wantF32x += float64(v) * float64(wf[j*k+i])
			}
			got := float64(yArg.F32()[rr*n+j])
			if math.Abs(got-want) > 1e-6*math.Max(1, math.Abs(want)) {
				t.Fatalf("y[%d,%d] = %g, want %g", rr, j, got, want)
			}
			if math.Abs(got-wantF32x) > 1e-5*math.Max(1, math.Abs(wantF32x)) {
				t.Fatalf("y[%d,%d] = %g, f32-x product %g: the hi/lo split lost precision", rr, j, got, wantF32x)
			}
		}
	}
	if _, err := Build("gemm_tc", []byte(`{"k":0,"n":4}`)); err == nil {
		t.Error("K=0 accepted")
	}
	if err := run.Run([]Arg{xArg, wArg, {Mem: make([]byte, 4)}, {Bits: rows}}, Launch{}); err == nil {
		t.Error("short y accepted")
	}
}
