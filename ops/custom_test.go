package ops

import (
	"errors"
	"math"
	"strings"
	"testing"

	"xmix/bundle"
)

func TestCustomPTXNeedsAnExecutor(t *testing.T) {
	attrs := EncodeAttrs(CustomPTXAttrs{PTX: ".version 8.0", Entry: "k"})
	SetPTXExecutor(nil)
	if _, err := Build("custom_ptx", attrs); err == nil || !strings.Contains(err.Error(), "no CPU PTX executor") {
		t.Fatalf("without an executor: %v", err)
	}
	var gotText, gotEntry string
	SetPTXExecutor(func(text, entry string) (Runner, error) {
		gotText, gotEntry = text, entry
		return RunnerFunc(func([]Arg, Launch) error { return errors.New("ran") }), nil
	})
	defer SetPTXExecutor(nil)
	r, err := Build("custom_ptx", attrs)
	if err != nil || gotText != ".version 8.0" || gotEntry != "k" {
		t.Fatalf("build: %v (executor saw %q, %q)", err, gotText, gotEntry)
	}
	if err := r.Run(nil, Launch{}); err == nil || err.Error() != "ran" {
		t.Fatalf("run: %v", err)
	}
	if _, err := Build("custom_ptx", EncodeAttrs(CustomPTXAttrs{Entry: "k"})); err == nil {
		t.Fatal("a kernel without PTX text was accepted")
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
