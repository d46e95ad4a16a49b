package ops

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"unsafe"

	"xmix/bundle"
)

func miArgF32(v []float32) Arg {
	return Arg{Mem: append([]byte(nil), unsafe.Slice((*byte)(unsafe.Pointer(&v[0])), 4*len(v))...)}
}

func miArgU32(v []uint32) Arg {
	return Arg{Mem: append([]byte(nil), unsafe.Slice((*byte)(unsafe.Pointer(&v[0])), 4*len(v))...)}
}

func miRand(r *rand.Rand, n int) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = r.Float32()*2 - 1
	}
	return v
}

func miUnit(v []float32) []float32 {
	n := math.Sqrt(dot64(v, v))
	u := make([]float32, len(v))
	for i := range v {
		u[i] = float32(float64(v[i]) / n)
	}
	return u
}

func runMI(t *testing.T, a MIKernelAttrs, rows int, args []Arg) {
	t.Helper()
	r, err := Build("mi", EncodeAttrs(a))
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Run(args, Launch{Grid: [3]int{rows, 1, 1}, Block: [3]int{128, 1, 1}}); err != nil {
		t.Fatal(err)
	}
}

func TestMISteerAddExact(t *testing.T) {
	const rows, w = 4, 300
	rng := rand.New(rand.NewPCG(1, 2))
	x := miRand(rng, rows*w)
	v := miRand(rng, w)
	alpha := float32(3.7)
	mask := []uint32{1 << 5, 0, 1<<5 | 1, 1}
	op := MIOp{Template: "steer_add", Bit: 5, Width: w, Alpha: 1, Bias: -1}
	args := []Arg{miArgF32(x), miArgU32(mask), miArgF32(v), miArgF32([]float32{9, alpha})}
	runMI(t, MIKernelAttrs{Width: w, Stride: w, Offset: 0, Ops: []MIOp{op}}, rows, args)
	got := args[0].F32()
	for r := range rows {
		on := mask[r]>>5&1 == 1
		for i := range w {
			want := x[r*w+i]
			if on {
				want = x[r*w+i] + float32(alpha*v[i])
			}
			if math.Float32bits(got[r*w+i]) != math.Float32bits(want) {
				t.Fatalf("row %d col %d: %v, want %v (enabled %v)", r, i, got[r*w+i], want, on)
			}
		}
	}
}

func TestMIProjectOutProbeCapture(t *testing.T) {
	const rows, w, stride, off = 3, 257, 400, 100
	rng := rand.New(rand.NewPCG(3, 4))
	x := miRand(rng, rows*stride)
	orig := append([]float32(nil), x...)
	d := miUnit(miRand(rng, w))
	pw := miRand(rng, w)
	mask := []uint32{1, 1, 0}
	ops := []MIOp{
		{Template: "capture", Bit: 0, Width: w, Alpha: -1, Bias: -1, OutCol: 2, OutWidth: w + 3},
		{Template: "project_out", Bit: 0, Width: w, Alpha: -1, Bias: -1},
		{Template: "probe_linear", Bit: 0, Width: w, Alpha: -1, Bias: 0, Activation: "sigmoid", OutCol: 1, OutWidth: 2},
	}
	capt := make([]float32, rows*(w+3))
	probe := make([]float32, rows*2)
	args := []Arg{miArgF32(x), miArgU32(mask), miArgF32(capt), miArgF32(d), miArgF32(pw), miArgF32([]float32{0.25}), miArgF32(probe)}
	runMI(t, MIKernelAttrs{Width: w, Stride: stride, Offset: off, Ops: ops}, rows, args)
	got, gotCapt, gotProbe := args[0].F32(), args[2].F32(), args[6].F32()
	for r := range rows {
		row := got[r*stride+off : r*stride+off+w]
		in := orig[r*stride+off : r*stride+off+w]
		if mask[r] == 0 {
			for i := range row {
				if row[i] != in[i] || gotCapt[r*(w+3)+2+i] != 0 {
					t.Fatalf("row %d without the bit changed", r)
				}
			}
			if gotProbe[2*r+1] != 0 {
				t.Fatalf("row %d without the bit probed", r)
			}
			continue
		}
		for i := range row {
			if gotCapt[r*(w+3)+2+i] != in[i] {
				t.Fatalf("row %d: capture[%d] = %v, want %v", r, i, gotCapt[r*(w+3)+2+i], in[i])
			}
		}
		if p := math.Abs(dot64(row, d)); p > 1e-5*math.Sqrt(dot64(row, row)) {
			t.Fatalf("row %d: |x.d| = %g after project_out", r, p)
		}
		want := 1 / (1 + math.Exp(-(dot64(row, pw) + 0.25)))
		if math.Abs(float64(gotProbe[2*r+1])-want) > 1e-6 {
			t.Fatalf("row %d: probe %v, want %v", r, gotProbe[2*r+1], want)
		}
	}
	// Columns outside [off, off+w) are never touched.
	for r := range rows {
		for i := range stride {
			if (i < off || i >= off+w) && got[r*stride+i] != orig[r*stride+i] {
				t.Fatalf("row %d col %d outside the hooked row changed", r, i)
			}
		}
	}
}

func TestMIGates(t *testing.T) {
	const rows, w = 6, 8
	gen := []int32{-1, 0, 3, 5, 9, -1}
	tokens := []uint32{7, 8, 7, 9, 7, 9}
	act := []float32{0.9, 0.1, 0.6, 0.5, 0.2, float32(math.NaN())}
	ug := make([]uint32, rows)
	for i, g := range gen {
		ug[i] = uint32(g)
	}
	cases := []struct {
		gate MIGate
		want []bool
	}{
		{MIGate{Kind: "token_in", Tokens: []int{9, 7}}, []bool{true, false, true, true, true, true}},
		{MIGate{Kind: "steps", From: 3, To: 9}, []bool{false, false, true, true, false, false}},
		{MIGate{Kind: "steps", From: 0}, []bool{false, true, true, true, true, false}},
		{MIGate{Kind: "positions", Positions: "prompt"}, []bool{true, false, false, false, false, true}},
		{MIGate{Kind: "positions", Positions: "generated"}, []bool{false, true, true, true, true, false}},
		{MIGate{Kind: "positions", Positions: "all"}, []bool{true, true, true, true, true, true}},
		{MIGate{Kind: "activation", Width: 1, Cmp: ">", Value: 0.5}, []bool{true, false, true, false, false, false}},
		{MIGate{Kind: "activation", Width: 1, Cmp: "<=", Value: 0.5}, []bool{false, true, false, true, true, false}},
		{MIGate{Kind: "activation", Width: 1, Cmp: "!=", Value: 0.5}, []bool{true, true, true, false, true, true}},
	}
	for _, c := range cases {
		x := make([]float32, rows*w)
		op := MIOp{Template: "steer_add", Bit: 2, Width: w, Alpha: 0, Bias: -1, Gates: []MIGate{c.gate}}
		mask := []uint32{4, 4, 4, 4, 4, 4}
		args := []Arg{miArgF32(x), miArgU32(mask)}
		tok, g := MIControl([]MIOp{op})
		if tok {
			args = append(args, miArgU32(tokens))
		}
		if g {
			args = append(args, miArgU32(ug))
		}
		args = append(args, miArgF32(make([]float32, w)), miArgF32([]float32{1}))
		vec := args[len(args)-2].F32()
		for i := range vec {
			vec[i] = 1
		}
		if c.gate.Kind == "activation" {
			args = append(args, miArgF32(act))
		}
		runMI(t, MIKernelAttrs{Width: w, Stride: w, Ops: []MIOp{op}}, rows, args)
		for r := range rows {
			if on := args[0].F32()[r*w] == 1; on != c.want[r] {
				t.Errorf("gate %+v row %d: enabled %v, want %v", c.gate, r, on, c.want[r])
			}
		}
	}
}

func TestMIValidate(t *testing.T) {
	bad := []struct {
		op   MIOp
		want string
	}{
		{MIOp{Template: "nope", Width: 4, Alpha: -1, Bias: -1}, "unknown MI template"},
		{MIOp{Template: "steer_add", Width: 4, Alpha: -1, Bias: -1}, "no alpha"},
		{MIOp{Template: "capture", Width: 4, Alpha: -1, Bias: -1, OutCol: 2, OutWidth: 5}, "do not fit"},
		{MIOp{Template: "capture", Width: 3, Alpha: -1, Bias: -1, OutWidth: 5}, "hooked row has 4"},
		{MIOp{Template: "project_out", Bit: 32, Width: 4, Alpha: -1, Bias: -1}, "app bit"},
		{MIOp{Template: "project_out", Width: 4, Alpha: -1, Bias: -1, Gates: []MIGate{{Kind: "token_in"}}}, "no tokens"},
		{MIOp{Template: "project_out", Width: 4, Alpha: -1, Bias: -1, Gates: []MIGate{{Kind: "steps", From: 5, To: 5}}}, "step window"},
		{MIOp{Template: "project_out", Width: 4, Alpha: -1, Bias: -1, Gates: []MIGate{{Kind: "activation", Cmp: "=~", Width: 1}}}, "comparison"},
		{MIOp{Template: "steer_add", Width: 4, Alpha: 0, Bias: -1, Activation: "sigmoid"}, "activation"},
		{MIOp{Template: "steer_set", Width: 4, Alpha: -1, Bias: -1}, "no alpha"},
		{MIOp{Template: "clamp_projection", Width: 4, Alpha: -2, Bias: -1}, "alpha index -2"},
		{MIOp{Template: "patch", Width: 4, Alpha: 0, Bias: -1}, "takes no alpha"},
		{MIOp{Template: "head_ablate", Width: 4, Alpha: 0, Bias: 1}, "takes no bias"},
	}
	for _, b := range bad {
		err := b.op.Validate(4)
		if err == nil || !strings.Contains(err.Error(), b.want) {
			t.Errorf("%+v: error %v, want %q", b.op, err, b.want)
		}
	}
}

func TestMIArgErrors(t *testing.T) {
	op := MIOp{Template: "steer_add", Width: 4, Alpha: 0, Bias: -1}
	r, err := Build("mi", EncodeAttrs(MIKernelAttrs{Width: 4, Stride: 4, Ops: []MIOp{op}}))
	if err != nil {
		t.Fatal(err)
	}
	l := Launch{Grid: [3]int{2, 1, 1}}
	x := miArgF32(make([]float32, 8))
	mask := miArgU32([]uint32{1, 1})
	if err := r.Run([]Arg{x, mask, miArgF32(make([]float32, 4))}, l); err == nil || !strings.Contains(err.Error(), "mi0_scal") {
		t.Errorf("missing scal: %v", err)
	}
	if err := r.Run([]Arg{x, mask, miArgF32(make([]float32, 3)), miArgF32([]float32{1})}, l); err == nil || !strings.Contains(err.Error(), "mi0_vec") {
		t.Errorf("short vec: %v", err)
	}
	if err := r.Run([]Arg{x, mask, miArgF32(make([]float32, 4)), miArgF32([]float32{1}), x}, l); err == nil {
		t.Error("extra argument accepted")
	}
	if _, err := Build("mi", EncodeAttrs(MIKernelAttrs{Width: 4, Stride: 4, Offset: 1, Ops: []MIOp{op}})); err == nil {
		t.Error("row past the stride accepted")
	}
}

// TestMIWriteTemplates runs the writing templates beyond steer_add and project_out on a
// strided row: each changes only rows with its bit and only the hooked columns.
func TestMIWriteTemplates(t *testing.T) {
	const rows, w, stride, off = 3, 130, 150, 7
	rng := rand.New(rand.NewPCG(5, 6))
	d := miUnit(miRand(rng, w))
	vec := miRand(rng, w)
	mask := make([]float32, w)
	for i := 32; i < 64; i++ {
		mask[i] = 1
	}
	bits := []uint32{2, 0, 2}
	scal := []float32{0.5, -0.2, 0.3}
	cases := []struct {
		op   MIOp
		v    []float32
		want func(in []float32, i int) float32 // nil: check the projection on d instead
		proj func(p float32) float32
	}{
		{MIOp{Template: "scale", Alpha: 0, Bias: -1}, nil, func(in []float32, i int) float32 { return in[i] * 0.5 }, nil},
		{MIOp{Template: "scale", Alpha: -1, Bias: -1}, vec, func(in []float32, i int) float32 { return in[i] * vec[i] }, nil},
		{MIOp{Template: "head_ablate", Alpha: 0, Bias: -1}, mask, func(in []float32, i int) float32 {
			if i >= 32 && i < 64 {
				return in[i] * 0.5
			}
			return in[i]
		}, nil},
		{MIOp{Template: "patch", Alpha: -1, Bias: -1}, vec, func(_ []float32, i int) float32 { return vec[i] }, nil},
		{MIOp{Template: "steer_set", Alpha: 1, Bias: -1}, d, nil, func(float32) float32 { return -0.2 }},
		{MIOp{Template: "clamp_projection", Alpha: 1, Bias: 2}, d, nil, func(p float32) float32 { return min(max(p, -0.2), 0.3) }},
		{MIOp{Template: "clamp_projection", Alpha: -1, Bias: 2}, d, nil, func(p float32) float32 { return min(p, 0.3) }},
	}
	for _, c := range cases {
		op := c.op
		op.Bit, op.Width = 1, w
		x := miRand(rng, rows*stride)
		orig := append([]float32(nil), x...)
		args := []Arg{miArgF32(x), miArgU32(bits)}
		for _, p := range op.Params() {
			if p.Suffix == "vec" {
				args = append(args, miArgF32(c.v))
			} else {
				args = append(args, miArgF32(scal))
			}
		}
		runMI(t, MIKernelAttrs{Width: w, Stride: stride, Offset: off, Ops: []MIOp{op}}, rows, args)
		got := args[0].F32()
		for r := range rows {
			for i := range stride {
				k := r*stride + i
				inRow := i >= off && i < off+w
				if (bits[r] == 0 || !inRow) && got[k] != orig[k] {
					t.Fatalf("%s: row %d col %d changed outside the enabled row", op.Template, r, i)
				}
			}
			if bits[r] == 0 {
				continue
			}
			in, out := orig[r*stride+off:r*stride+off+w], got[r*stride+off:r*stride+off+w]
			if c.want != nil {
				for i := range w {
					if math.Float32bits(out[i]) != math.Float32bits(c.want(in, i)) {
						t.Fatalf("%s: row %d [%d] = %v, want %v", op.Template, r, i, out[i], c.want(in, i))
					}
				}
				continue
			}
			before, after := dot64(in, d), dot64(out, d)
			if want := float64(c.proj(float32(before))); math.Abs(after-want) > 1e-5 {
				t.Fatalf("%s: row %d: projection %v -> %v, want %v", op.Template, r, before, after, want)
			}
		}
	}
}

// TestMIScaleParams: scale reads its vector or its alpha, never both.
func TestMIScaleParams(t *testing.T) {
	for _, c := range []struct {
		alpha int
		want  string
	}{{0, "[{scal -1}]"}, {-1, "[{vec -1}]"}} {
		op := MIOp{Template: "scale", Width: 4, Alpha: c.alpha, Bias: -1}
		if got := fmt.Sprint(op.Params()); got != c.want {
			t.Errorf("alpha %d: params %s, want %s", c.alpha, got, c.want)
		}
	}
}

// TestMIClampNaN: the reference clamp follows PTX max/min, where a NaN operand loses.
func TestMIClampNaN(t *testing.T) {
	nan := float32(math.NaN())
	b := miBound{MIOp: MIOp{Template: "clamp_projection", Alpha: 0, Bias: 1}}
	if got := b.target(nan, []float32{-1, 1}); got != -1 {
		t.Errorf("clamp(NaN, -1, 1) = %v, want -1 (max.f32 picks the number)", got)
	}
	if got := b.target(0.5, []float32{nan, 1}); got != 0.5 {
		t.Errorf("clamp(0.5, NaN, 1) = %v, want 0.5", got)
	}
}

// TestMIPerRequestScalars: with a per-sequence scalar table, each row reads its sequence's
// alpha and threshold, and the latch gate tests the row's own bit.
func TestMIPerRequestScalars(t *testing.T) {
	const rows, w = 4, 8
	// Table rows (sequence slots 0..2): alpha, threshold.
	table := []float32{1, 0.5, 2, 0.5, 4, 0.95}
	seq := []uint32{1, 0, 2, 1}
	act := []float32{0.9, 0.9, 0.9, 0.9}
	latch := []uint32{0b10, 0b10, 0b10, 0b01}
	op := MIOp{Template: "steer_add", Bit: 0, Width: w, Alpha: 0, Bias: -1, ScalStride: 2, ScalRows: 3,
		Gates: []MIGate{{Kind: "activation", Width: 1, Cmp: ">", Thresh: 2}, {Kind: "after_token", Latch: 1}}}
	if seqOn, latchOn, vslotOn := MIRequestControl([]MIOp{op}); !seqOn || !latchOn || vslotOn {
		t.Fatalf("MIRequestControl = %v, %v, %v; want seq and latch", seqOn, latchOn, vslotOn)
	}
	ones := make([]float32, w)
	for i := range ones {
		ones[i] = 1
	}
	args := []Arg{miArgF32(make([]float32, rows*w)), miArgU32([]uint32{1, 1, 1, 1}), miArgU32(seq), miArgU32(latch),
		miArgF32(ones), miArgF32(table), miArgF32(act)}
	runMI(t, MIKernelAttrs{Width: w, Stride: w, Ops: []MIOp{op}}, rows, args)
	// Row 2's threshold (0.95) holds the gate off; row 3 lacks latch bit 1.
	want := []float32{2, 1, 0, 0}
	for r := range rows {
		if got := args[0].F32()[r*w]; got != want[r] {
			t.Errorf("row %d (seq %d): %v, want %v", r, seq[r], got, want[r])
		}
	}
	seq[3] = 3
	args[2] = miArgU32(seq)
	r, err := Build("mi", EncodeAttrs(MIKernelAttrs{Width: w, Stride: w, Ops: []MIOp{op}}))
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Run(args, Launch{Grid: [3]int{rows, 1, 1}}); err == nil || !strings.Contains(err.Error(), "ctl_seq[3] = 3") {
		t.Errorf("sequence outside the table: %v", err)
	}
	for _, bad := range []MIOp{
		{Template: "steer_add", Width: w, Alpha: 2, Bias: -1, ScalStride: 2, ScalRows: 3},
		{Template: "steer_add", Width: w, Alpha: 0, Bias: -1, ScalStride: 2},
		{Template: "steer_add", Width: w, Alpha: 0, Bias: -1, Gates: []MIGate{{Kind: "after_token", Latch: 32}}},
	} {
		if err := bad.Validate(w); err == nil {
			t.Errorf("%+v validated", bad)
		}
	}
}

// TestMIVectorSlotOutOfPool: a row naming a vector slot past the pool is refused, not read
// out of bounds; NoRow (no slot) is fine.
func TestMIVectorSlotOutOfPool(t *testing.T) {
	const rows, w = 2, 4
	op := MIOp{Template: "steer_add", Bit: 0, Width: w, Alpha: 0, Bias: -1, Pool: 2}
	r, err := Build("mi", EncodeAttrs(MIKernelAttrs{Width: w, Stride: w, Ops: []MIOp{op}}))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		vslot []uint32
		err   string
	}{{[]uint32{bundle.NoRow, 1}, ""}, {[]uint32{0, 2}, "ctl_vslot[1] = 2 outside a pool of 2 vector slots"}} {
		args := []Arg{miArgF32(make([]float32, rows*w)), miArgU32([]uint32{1, 1}), miArgU32(c.vslot),
			miArgF32(make([]float32, w)), miArgF32(make([]float32, 2*w)), miArgF32([]float32{1})}
		err := r.Run(args, Launch{Grid: [3]int{rows, 1, 1}, Block: [3]int{128, 1, 1}})
		if c.err == "" && err != nil || c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)) {
			t.Errorf("slots %v: %v, want %q", c.vslot, err, c.err)
		}
	}
}
