package ops

import (
	"math"
	"math/rand/v2"
	"testing"
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
	run, err := Build("gemm_tc", EncodeAttrs(GemmTCAttrs{K: k, N: n}))
	if err != nil {
		t.Fatal(err)
	}
	if err := run.Run([]Arg{xArg, wArg, yArg, {Bits: rows}}, Launch{}); err != nil {
		t.Fatal(err)
	}
	for rr := range rows {
		for j := range n {
			// Written out independently: round x through the bf16 bit pattern by hand.
			want, wantF32x := 0.0, 0.0
			for i := range k {
				b := math.Float32bits(x[rr*k+i])
				b = (b + 0x7fff + (b>>16)&1) &^ 0xffff
				want += float64(math.Float32frombits(b)) * float64(wf[j*k+i])
				wantF32x += float64(x[rr*k+i]) * float64(wf[j*k+i])
			}
			got := float64(yArg.F32()[rr*n+j])
			if math.Abs(got-want) > 1e-6*math.Max(1, math.Abs(want)) {
				t.Fatalf("y[%d,%d] = %g, want %g", rr, j, got, want)
			}
			if rr == 0 && j == 0 && got == float64(float32(wantF32x)) && want != wantF32x {
				t.Errorf("y[0,0] matches the unrounded-x product: x is not rounded to bf16")
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
