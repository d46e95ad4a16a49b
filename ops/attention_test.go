package ops

import (
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

func TestAttentionMatchesFloat64(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for _, c := range []struct {
		heads, kvHeads int
		dt             string
	}{{4, 1, "f32"}, {2, 2, "bf16"}} {
		a := AttnAttrs{KVAttrs: KVAttrs{Heads: c.heads, KVHeads: c.kvHeads, HeadDim: 16, BlockSize: 4,
			MaxBlocksPerSeq: 5, KVDtype: c.dt}, Scale: 0.25}
		const rows, seqs = 4, 2
		d, w := a.HeadDim, a.rowWidth()
		qkv := fwdRand(r, rows*w)
		pos, seq := []uint32{0, 19, 6, 13}, []uint32{1, 0, 1, 1}
		table := fwdTable(r, seqs, a.MaxBlocksPerSeq)
		cacheLen := seqs * a.MaxBlocksPerSeq * a.BlockSize * a.KVHeads * d
		k, v := fwdRand(r, cacheLen), fwdRand(r, cacheLen)
		ka, va := fwdF32Arg(k), fwdF32Arg(v)
		if c.dt == "bf16" {
			ka, va = fwdBF16Arg(k), fwdBF16Arg(v)
			for i := range k {
				k[i], v[i] = BF16ToF32(F32ToBF16(k[i])), BF16ToF32(F32ToBF16(v[i]))
			}
		}
		z := fwdF32Arg(make([]float32, rows*a.Heads*d))
		run, err := Build("attention", EncodeAttrs(a))
		if err != nil {
			t.Fatal(err)
		}
		zb := Arg{Mem: make([]byte, 2*rows*a.Heads*d)} // z_bf16: bf16 of z, as the cast rounds it
		args := []Arg{fwdF32Arg(qkv), fwdU32Arg(pos), fwdU32Arg(seq), fwdU32Arg(table), ka, va, z, zb}
		if err := run.Run(args, Launch{Grid: [3]int{rows, a.Heads, 1}}); err != nil {
			t.Fatal(err)
		}
		want := make([]float64, rows*a.Heads*d)
		for row := range rows {
			for h := range a.Heads {
				kvh := h / (a.Heads / a.KVHeads)
				n := int(pos[row]) + 1
				sc := make([]float64, n)
				m := math.Inf(-1)
				for p := range n {
					slot := int(table[int(seq[row])*a.MaxBlocksPerSeq+p/a.BlockSize])*a.BlockSize + p%a.BlockSize
					for i := range d {
						sc[p] += float64(qkv[row*w+h*d+i]) * float64(k[(slot*a.KVHeads+kvh)*d+i])
					}
					sc[p] *= float64(a.Scale)
					m = math.Max(m, sc[p])
				}
				var sum float64
				for p := range sc {
					sc[p] = math.Exp(sc[p] - m)
					sum += sc[p]
				}
				for p := range n {
					slot := int(table[int(seq[row])*a.MaxBlocksPerSeq+p/a.BlockSize])*a.BlockSize + p%a.BlockSize
					for i := range d {
						want[(row*a.Heads+h)*d+i] += sc[p] / sum * float64(v[(slot*a.KVHeads+kvh)*d+i])
					}
				}
			}
		}
		if e := fwdRelErr(z.F32(), want); e > 1e-5 {
			t.Errorf("%+v: relative error %g", c, e)
		}
		for i, x := range z.F32() {
			if got := zb.U16()[i]; got != F32ToBF16(x) {
				t.Fatalf("%+v: z_bf16[%d] = %#04x, want bf16(z) = %#04x", c, i, got, F32ToBF16(x))
			}
		}
		short := append([]Arg(nil), args...)
		short[7] = Arg{Mem: zb.Mem[:len(zb.Mem)-2]}
		if run.Run(short, Launch{Grid: [3]int{rows, a.Heads, 1}}) == nil {
			t.Errorf("%+v: a z_bf16 a value short accepted", c)
		}
		// With out_optional, a z of 0 leaves z_bf16 alone to write, the same bits; not both,
		// and not without the attribute.
		opt := a
		opt.OutOptional = true
		orun, err := Build("attention", EncodeAttrs(opt))
		if err != nil {
			t.Fatal(err)
		}
		alone := append([]Arg(nil), args...)
		alone[6], alone[7] = Arg{}, Arg{Mem: make([]byte, len(zb.Mem))}
		if err := orun.Run(alone, Launch{Grid: [3]int{rows, a.Heads, 1}}); err != nil || !slices.Equal(alone[7].U16(), zb.U16()) {
			t.Errorf("%+v: z_bf16 alone (%v) differs from z_bf16 beside z", c, err)
		}
		if run.Run(alone, Launch{Grid: [3]int{rows, a.Heads, 1}}) == nil {
			t.Errorf("%+v: a z of 0 accepted without out_optional", c)
		}
		alone[7] = Arg{}
		if orun.Run(alone, Launch{Grid: [3]int{rows, a.Heads, 1}}) == nil {
			t.Errorf("%+v: z and z_bf16 both 0 accepted", c)
		}
		opt.Rows = AttnRowsSingle
		if _, err := Build("attention", EncodeAttrs(opt)); err == nil {
			t.Errorf("%+v: out_optional over the single rows accepted", c)
		}
	}
}

// TestAttentionRowSelections: the single and runs selections together compute what the op over
// every row computes, each leaving the other's rows alone.
func TestAttentionRowSelections(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	a := AttnAttrs{KVAttrs: KVAttrs{Heads: 4, KVHeads: 2, HeadDim: 8, BlockSize: 4, MaxBlocksPerSeq: 5, KVDtype: "f32"}, Scale: 0.3}
	pos, seq := []uint32{7, 0, 1, 2, 3, 5, 9, 4}, []uint32{0, 1, 1, 1, 2, 3, 3, 0}
	rows := len(pos)
	table := fwdTable(r, 4, a.MaxBlocksPerSeq)
	cacheLen := 4 * a.MaxBlocksPerSeq * a.BlockSize * a.KVHeads * a.HeadDim
	qkv := fwdRand(r, rows*a.rowWidth())
	k, v := fwdF32Arg(fwdRand(r, cacheLen)), fwdF32Arg(fwdRand(r, cacheLen))
	run := func(sel string, z Arg, extra ...Arg) {
		t.Helper()
		b := a
		b.Rows = sel
		op, err := Build("attention", EncodeAttrs(b))
		if err != nil {
			t.Fatal(err)
		}
		args := append([]Arg{fwdF32Arg(qkv), fwdU32Arg(pos), fwdU32Arg(seq), fwdU32Arg(table), k, v, z}, extra...)
		if err := op.Run(args, Launch{Grid: [3]int{rows, 1, 1}}); err != nil {
			t.Fatal(err)
		}
	}
	all := fwdF32Arg(make([]float32, rows*a.Heads*a.HeadDim))
	run("", all, Arg{}) // z_bf16: none
	parts := fwdF32Arg(make([]float32, rows*a.Heads*a.HeadDim))
	run(AttnRowsSingle, parts, Arg{})
	for i, x := range parts.F32() {
		if single := AttnRowSingle(seq, i/(a.Heads*a.HeadDim)); (x == 0) == single {
			t.Fatalf("element %d: %v after the singles (row single: %v)", i, x, single)
		}
	}
	run(AttnRowsRuns, parts, Arg{Bits: uint64(rows)})
	for i, x := range parts.F32() {
		if x != all.F32()[i] {
			t.Fatalf("element %d: %v by parts, %v whole", i, x, all.F32()[i])
		}
	}
	if _, err := Build("attention", EncodeAttrs(AttnAttrs{KVAttrs: a.KVAttrs, Scale: 1, Rows: "some"})); err == nil {
		t.Fatal("rows \"some\" accepted")
	}
	// A cluster kernel's grid: 3 blocks a row along x, the same rows.
	b := a
	b.Splits = 3
	op, err := Build("attention", EncodeAttrs(b))
	if err != nil {
		t.Fatal(err)
	}
	z := fwdF32Arg(make([]float32, rows*a.Heads*a.HeadDim))
	args := []Arg{fwdF32Arg(qkv), fwdU32Arg(pos), fwdU32Arg(seq), fwdU32Arg(table), k, v, z, {}}
	if err := op.Run(args, Launch{Grid: [3]int{3 * rows, 1, 1}}); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(z.F32(), all.F32()) {
		t.Fatal("3 blocks a row: other z than one block a row")
	}
	if err := op.Run(args, Launch{Grid: [3]int{3*rows + 1, 1, 1}}); err == nil || !strings.Contains(err.Error(), "not whole rows of 3 blocks") {
		t.Fatalf("grid x past whole rows: %v", err)
	}
	for _, bad := range []AttnAttrs{{KVAttrs: a.KVAttrs, Scale: 1, Splits: -1}, {KVAttrs: a.KVAttrs, Scale: 1, Splits: 2, Rows: AttnRowsSingle}} {
		if _, err := Build("attention", EncodeAttrs(bad)); err == nil {
			t.Fatalf("splits %d over rows %q accepted", bad.Splits, bad.Rows)
		}
	}
}

func TestAttentionRejectsBadPage(t *testing.T) {
	a := AttnAttrs{KVAttrs: KVAttrs{Heads: 1, KVHeads: 1, HeadDim: 2, BlockSize: 2, MaxBlocksPerSeq: 2, KVDtype: "f32"}, Scale: 1}
	run, err := Build("attention", EncodeAttrs(a))
	if err != nil {
		t.Fatal(err)
	}
	cache := fwdF32Arg(make([]float32, 2*2*2)) // 2 pages
	args := []Arg{fwdF32Arg(make([]float32, 6)), fwdU32Arg([]uint32{3}), fwdU32Arg([]uint32{0}),
		fwdU32Arg([]uint32{0, 7}), cache, cache, fwdF32Arg(make([]float32, 2)), {}}
	if err := run.Run(args, Launch{Grid: [3]int{1, 1, 1}}); err == nil || !strings.Contains(err.Error(), "7") {
		t.Errorf("page 7 of a 2-page pool: %v", err)
	}
}

// TestAttentionRopeRejects: an attention with Rope is refused over a selection of rows or in
// splits, and run without its cos and sin (arguments 8 and 9) it says so.
func TestAttentionRopeRejects(t *testing.T) {
	kv := KVAttrs{Heads: 1, KVHeads: 1, HeadDim: 2, BlockSize: 2, MaxBlocksPerSeq: 2, KVDtype: "f32"}
	for _, a := range []AttnAttrs{{KVAttrs: kv, Scale: 1, Rope: true, Rows: AttnRowsSingle}, {KVAttrs: kv, Scale: 1, Rope: true, Splits: 2}} {
		if _, err := Build("attention", EncodeAttrs(a)); err == nil || !strings.Contains(err.Error(), "rope over rows") {
			t.Errorf("%+v: err %v, want a refusal", a, err)
		}
	}
	run, err := Build("attention", EncodeAttrs(AttnAttrs{KVAttrs: kv, Scale: 1, Rope: true}))
	if err != nil {
		t.Fatal(err)
	}
	cache := fwdF32Arg(make([]float32, 2*2*2))
	args := []Arg{fwdF32Arg(make([]float32, 6)), fwdU32Arg([]uint32{1}), fwdU32Arg([]uint32{0}),
		fwdU32Arg([]uint32{0, 1}), cache, cache, fwdF32Arg(make([]float32, 2)), {}}
	if err := run.Run(args, Launch{Grid: [3]int{1, 1, 1}}); err == nil || !strings.Contains(err.Error(), "want 10 (cos and sin") {
		t.Errorf("without cos and sin: %v", err)
	}
}
