package ops

import (
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"unsafe"

	"xmix/bundle"
	"xmix/mi"
)

func miArgBF16(v []float32) Arg {
	h := make([]uint16, len(v))
	for i, f := range v {
		h[i] = F32ToBF16(f)
	}
	return Arg{Mem: append([]byte(nil), unsafe.Slice((*byte)(unsafe.Pointer(&h[0])), 2*len(h))...)}
}

func runRowOp(t *testing.T, name string, attrs any, rows int, args []Arg) {
	t.Helper()
	r, err := Build(name, EncodeAttrs(attrs))
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Run(args, Launch{Grid: [3]int{rows, 1, 1}, Block: [3]int{128, 1, 1}}); err != nil {
		t.Fatal(err)
	}
}

// rowNaiveNorm is RMSNorm written straight from its definition, in float64.
func rowNaiveNorm(x []float32, w []float32, eps float32) []float64 {
	var ss float64
	for _, v := range x {
		ss += float64(v) * float64(v)
	}
	r := 1 / math.Sqrt(ss/float64(len(x))+float64(eps))
	out := make([]float64, len(x))
	for i, v := range x {
		out[i] = float64(v) * r * float64(w[i])
	}
	return out
}

func rowClose(t *testing.T, what string, got []float32, want []float64, tol float64) {
	t.Helper()
	for i := range want {
		if d := math.Abs(float64(got[i]) - want[i]); !(d <= tol*(1+math.Abs(want[i]))) {
			t.Fatalf("%s[%d] = %v, want %v", what, i, got[i], want[i])
		}
	}
}

func TestRowNormAdd(t *testing.T) {
	const rows, h = 3, 200
	rng := rand.New(rand.NewPCG(5, 6))
	resid, delta, w := miRand(rng, rows*h), miRand(rng, rows*h), miRand(rng, h)
	v := miRand(rng, h)
	mask := []uint32{2, 0, 2}
	steer := mi.Op{Template: "steer_add", Bit: 1, Width: h, Alpha: 0, Bias: -1}
	a := RowNormAttrs{Hidden: h, Eps: 1e-5, WDtype: "f32", Load: "add", DeltaOps: []mi.Op{steer}}
	outB := make([]byte, 2*rows*h) // out_bf16: bf16 of out, as the cast rounds it
	args := []Arg{miArgF32(resid), miArgF32(delta), miArgF32(w), miArgF32(make([]float32, rows*h)), {Mem: outB}, miArgU32(mask),
		miArgF32(v), miArgF32([]float32{2})}
	runRowOp(t, "row_norm", a, rows, args)
	for i, v := range args[3].F32() {
		if got := args[4].U16()[i]; got != F32ToBF16(v) {
			t.Fatalf("out_bf16[%d] = %#04x, want bf16(out) = %#04x", i, got, F32ToBF16(v))
		}
	}
	short := append([]Arg(nil), args...)
	short[4] = Arg{Mem: outB[:2*rows*h-2]}
	if r, _ := Build(bundle.OpRowNorm, EncodeAttrs(a)); r.Run(short, Launch{Grid: [3]int{rows, 1, 1}}) == nil {
		t.Error("an out_bf16 a value short accepted")
	}
	// With out_optional, an out of 0 leaves out_bf16 alone to write, the same bits; not both,
	// and not without the attribute.
	noOut := append([]Arg(nil), args...)
	noOut[0], noOut[3], noOut[4] = miArgF32(resid), Arg{}, Arg{Mem: make([]byte, 2*rows*h)}
	opt := a
	opt.OutOptional = true
	runRowOp(t, "row_norm", opt, rows, noOut)
	for i, v := range args[4].U16() {
		if got := noOut[4].U16()[i]; got != v {
			t.Fatalf("out_bf16 alone [%d] = %#04x, want %#04x as beside out", i, got, v)
		}
	}
	for _, c := range []struct {
		name string
		a    RowNormAttrs
		outB Arg
	}{{"out 0 without out_optional", a, noOut[4]}, {"out and out_bf16 both 0", opt, Arg{}}} {
		bad := append([]Arg(nil), noOut...)
		bad[4] = c.outB
		if r, _ := Build(bundle.OpRowNorm, EncodeAttrs(c.a)); r.Run(bad, Launch{Grid: [3]int{rows, 1, 1}}) == nil {
			t.Errorf("%s: accepted", c.name)
		}
	}
	gather := opt
	gather.Gather = true
	if _, err := Build(bundle.OpRowNorm, EncodeAttrs(gather)); err == nil {
		t.Error("out_optional with gather accepted")
	}
	for r := range rows {
		x := make([]float32, h)
		for i := range x {
			d := delta[r*h+i]
			if mask[r] != 0 {
				d += float32(2 * v[i])
			}
			x[i] = resid[r*h+i] + d
		}
		for i := range x {
			if args[0].F32()[r*h+i] != x[i] {
				t.Fatalf("row %d: resid[%d] = %v, want %v", r, i, args[0].F32()[r*h+i], x[i])
			}
		}
		rowClose(t, "out", args[3].F32()[r*h:(r+1)*h], rowNaiveNorm(x, w, 1e-5), 1e-6)
	}
}

func TestRowNormEmbedGather(t *testing.T) {
	const rows, h, vocab = 4, 64, 10
	rng := rand.New(rand.NewPCG(7, 8))
	table, w := miRand(rng, vocab*h), miRand(rng, h)
	wide := func(v []float32) []float32 { // what bf16 storage holds
		o := make([]float32, len(v))
		for i, f := range v {
			o[i] = BF16ToF32(F32ToBF16(f))
		}
		return o
	}
	tokens := []uint32{3, 12, 0, 9} // 12 is outside the vocabulary: zeros
	outRow := []uint32{1, bundle.NoRow, 0, bundle.NoRow}
	a := RowNormAttrs{Hidden: h, Vocab: vocab, Eps: 1e-6, WDtype: "bf16", Load: "embed", Gather: true}
	out := make([]float32, 2*h)
	for i := range out {
		out[i] = -7
	}
	args := []Arg{miArgU32(tokens), miArgBF16(table), miArgF32(make([]float32, rows*h)), miArgBF16(w), miArgF32(out),
		miArgU32(outRow), miArgU32(make([]uint32, rows))}
	runRowOp(t, "row_norm", a, rows, args)
	tw, ww := wide(table), wide(w)
	for r, tok := range tokens {
		x := make([]float32, h)
		if tok < vocab {
			copy(x, tw[int(tok)*h:])
		}
		for i := range x {
			if args[2].F32()[r*h+i] != x[i] {
				t.Fatalf("row %d: resid[%d] = %v, want %v", r, i, args[2].F32()[r*h+i], x[i])
			}
		}
		if outRow[r] != bundle.NoRow {
			rowClose(t, "out", args[4].F32()[int(outRow[r])*h:], rowNaiveNorm(x, ww, 1e-6), 1e-6)
		}
	}
	bad := append([]Arg(nil), args...)
	bad[5] = miArgU32([]uint32{1, 2, 0, bundle.NoRow})
	r, _ := Build("row_norm", EncodeAttrs(a))
	if err := r.Run(bad, Launch{Grid: [3]int{rows, 1, 1}}); err == nil {
		t.Error("out_row past the end of out accepted")
	}
	// Two rows naming one out row would race for it; words past the step's rows are another
	// step's and are not read.
	bad[5] = miArgU32([]uint32{1, bundle.NoRow, 1, bundle.NoRow, 0, 0})
	if err := r.Run(bad, Launch{Grid: [3]int{rows, 1, 1}}); err == nil || !strings.Contains(err.Error(), "out_row[0] and out_row[2] are both 1") {
		t.Errorf("two rows into one out row: %v", err)
	}
	bad[5] = miArgU32(append(slices.Clone(outRow), 0, 0))
	if err := r.Run(bad, Launch{Grid: [3]int{rows, 1, 1}}); err != nil {
		t.Errorf("stale words past the step's rows: %v", err)
	}
}

func TestSiluMul(t *testing.T) {
	const rows, n = 2, 100
	rng := rand.New(rand.NewPCG(9, 10))
	gu := miRand(rng, rows*2*n)
	for i := range gu {
		gu[i] *= 8
	}
	mask := []uint32{0, 1}
	capt := mi.Op{Template: "capture", Bit: 0, Width: n, Alpha: -1, Bias: -1, OutWidth: n}
	args := []Arg{miArgF32(gu), miArgF32(make([]float32, rows*n)), miArgU32(mask), miArgF32(make([]float32, rows*n))}
	runRowOp(t, "silu_mul", SiluMulAttrs{Inter: n, Ops: []mi.Op{capt}}, rows, args)
	for r := range rows {
		want := make([]float64, n)
		for i := range want {
			g, u := float64(gu[r*2*n+i]), float64(gu[r*2*n+n+i])
			want[i] = g / (1 + math.Exp(-g)) * u
		}
		rowClose(t, "act", args[1].F32()[r*n:], want, 1e-6)
		for i, c := range args[3].F32()[r*n : (r+1)*n] {
			if wantC := args[1].F32()[r*n+i] * float32(mask[r]); c != wantC {
				t.Fatalf("row %d: capture[%d] = %v, want %v", r, i, c, wantC)
			}
		}
	}
}
