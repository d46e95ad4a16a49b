package codegen

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"xmix/bundle"
	"xmix/ir"
	"xmix/mi"
	"xmix/ops"
	"xmix/ptx"
	"xmix/ptx/emu"
)

// Row-kernel tests run five rows whose control block covers every gate outcome: prompt rows
// (gen -1) and generated ones, three distinct tokens, and a mask where rows 0, 2 and 4 enable
// the app under test (bit testBit) and rows 1 and 3 enable another one.
const (
	testRows = 5
	testBit  = 3
)

var (
	testMask   = []uint32{1 << testBit, 1 << (testBit + 1), 1<<testBit | 1, 0, 1 << testBit}
	testTokens = []uint32{7, 8, 9, 7, 8}
	testGen    = []uint32{math.MaxUint32, 1, 2, math.MaxUint32, 4} // int32 -1 on prompt rows
	testGate   = []float32{0.8, 0.8, 0.2, 0.8, 0.8}                // activation gate column 1
)

// testOps returns the MI op sets the kernel tests place at a hook of width w: each template
// alone under a gate of a different kind, and all of them chained, where the steer is gated
// on the probe the same kernel has just written.
func testOps(w int) map[string][]ir.MI {
	capture := ir.MI{Op: mi.Op{Template: "capture", Bit: testBit, Width: w, Alpha: -1, Bias: -1, OutCol: 3, OutWidth: w + 5, Gates: []mi.Gate{{Kind: "positions", Positions: "generated"}}}, Out: "cap"}
	probe := ir.MI{Op: mi.Op{Template: "probe_linear", Bit: testBit, Width: w, Alpha: -1, Bias: 1, Activation: "sigmoid", OutCol: 1, OutWidth: 2, Gates: []mi.Gate{{Kind: "token_in", Tokens: []int{7, 9}}}}, Vec: "probe_w", Scal: "scal", Out: "probe"}
	steer := ir.MI{Op: mi.Op{Template: "steer_add", Bit: testBit, Width: w, Alpha: 0, Bias: -1, Gates: []mi.Gate{{Kind: "steps", From: 1, To: 3}}}, Vec: "steer_v", Scal: "scal"}
	project := ir.MI{Op: mi.Op{Template: "project_out", Bit: testBit, Width: w, Alpha: -1, Bias: -1, Gates: []mi.Gate{{Kind: "activation", Buf: "gate", Col: 1, Width: 2, Cmp: ">", Value: 0.5}}}, Vec: "dir"}
	gatedSteer := steer
	gatedSteer.Gates = []mi.Gate{{Kind: "activation", Buf: "probe", Col: 1, Width: 2, Cmp: ">", Value: 0}}
	return map[string][]ir.MI{
		"capture": {capture},
		"probe":   {probe},
		"steer":   {steer},
		"project": {project},
		"chain":   {probe, gatedSteer, project, capture},
	}
}

// miTargs builds the control and MI arguments of a kernel whose MI ops are miops. Buffers an
// op writes start with data, so rows it skips must come back unchanged.
func miTargs(rng *rand.Rand, miops []ir.MI) []targ {
	args := []targ{{name: "ctl_mask", u32: testMask}}
	refs := make([]mi.Op, len(miops))
	for i, o := range miops {
		refs[i] = o.Op
	}
	if tok, gen := mi.Control(refs); tok || gen {
		if tok {
			args = append(args, targ{name: "ctl_tokens", u32: testTokens})
		}
		if gen {
			args = append(args, targ{name: "ctl_gen", u32: testGen})
		}
	}
	for i, o := range miops {
		for _, p := range refs[i].Params() {
			a := targ{name: fmt.Sprintf("mi%d_%s", i, p.Suffix)}
			switch p.Suffix {
			case "vec":
				a.f32 = randF32(rng, o.Width, 1)
				t, _ := mi.Lookup(o.Template)
				for _, arg := range t.Args { // the vector as the compiler binds it
					switch {
					case arg.Kind == mi.Vector && arg.Unit:
						a.f32 = unitF32(a.f32)
					case arg.Kind == mi.Head:
						a.f32 = headMask(o.Width)
					}
				}
			case "scal":
				a.f32 = []float32{2.5, -0.125, 0.25}
			case "out":
				a.f32 = randF32(rng, testRows*o.OutWidth, 1)
				a.out = len(a.f32)
			case "fired":
				a = firedArg(a.name, testRows, o.FiredWidth)
			default:
				g := o.Gates[p.Gate]
				a.f32 = make([]float32, testRows*g.Width)
				for r := range testRows {
					a.f32[r*g.Width+g.Col] = testGate[r]
				}
			}
			args = append(args, a)
		}
	}
	return args
}

// headMask is head_ablate's mask for the last quarter of a row of w columns: an odd slice
// that ends at the row's end, so it meets the tail.
func headMask(w int) []float32 {
	m := make([]float32, w)
	for i := w - w/4; i < w; i++ {
		m[i] = 1
	}
	return m
}

func unitF32(v []float32) []float32 {
	var n float64
	for _, x := range v {
		n += float64(x) * float64(x)
	}
	u := make([]float32, len(v))
	for i, x := range v {
		u[i] = float32(float64(x) / math.Sqrt(n))
	}
	return u
}

// weightArg stores data as dt.
func weightArg(name string, data []float32, dt ptx.Type) targ {
	if dt == ptx.BF16 {
		return targ{name: name, bf16: data}
	}
	return targ{name: name, f32: data}
}

// rowNormArgs builds RowNorm's arguments for c. Outputs are poisoned unless gathered (a
// skipped row keeps its initial data then).
func rowNormArgs(rng *rand.Rand, c RowConfig, rows int) []targ {
	h := c.Hidden
	var args []targ
	if c.Load == "embed" {
		tokens := make([]uint32, rows)
		for r := range tokens {
			tokens[r] = uint32(rng.IntN(c.Vocab))
		}
		tokens[rows-1] = uint32(c.Vocab) + 3 // out of the vocabulary: embeds as zeros
		args = append(args, targ{name: "tokens", u32: tokens}, weightArg("table", randF32(rng, c.Vocab*h, 1), c.WDtype),
			targ{name: "resid", out: rows * h})
	} else {
		args = append(args, targ{name: "resid", f32: randF32(rng, rows*h, 2), out: rows * h},
			targ{name: "delta", f32: randF32(rng, rows*h, 1)})
	}
	args = append(args, weightArg("w", randF32(rng, h, 1.5), c.WDtype))
	if c.Gather {
		outRow := make([]uint32, rows)
		for r := range outRow {
			outRow[r] = bundle.NoRow
		}
		outRow[1], outRow[rows-1] = 0, 1
		args = append(args, targ{name: "out", f32: randF32(rng, 2*h, 1), out: 2 * h}, targ{name: "out_row", u32: outRow})
	} else {
		args = append(args, targ{name: "out", out: rows * h}, targ{name: bundle.NormOutBF16, out: rows * h, dtype: "bf16"})
	}
	return append(args, miTargs(rng, c.MIOps())...)
}

// TestRowNormBF16Out: out_bf16 gets, bit for bit, the cast's rounding of the kernel's own
// out, with MI ops on the norm or without, embedding or adding; passed 0 it is left alone (a
// store there would fault) and out keeps the same bits. Built with OutOptional, the kernel
// passed an out of 0 writes the same out_bf16 alone, as its reference op does.
func TestRowNormBF16Out(t *testing.T) {
	rng := rand.New(rand.NewPCG(41, 42))
	for _, w := range []int{160, 1000, 4096} {
		for _, c := range []RowConfig{
			{Hidden: w, Eps: 1e-5, WDtype: ptx.BF16, Load: "add"},
			{Hidden: w, Eps: 1e-5, WDtype: ptx.BF16, Load: "add", NormOps: testOps(w)["steer"]},
			{Hidden: w, Vocab: 50, Eps: 1e-5, WDtype: ptx.F32, Load: "embed"},
		} {
			k := must(t)(RowNorm(fmt.Sprintf("row_norm_bf16_%d_%s_%d", w, c.Load, len(c.NormOps)), c))
			args := rowNormArgs(rng, c, testRows)
			out := slices.IndexFunc(args, func(a targ) bool { return a.name == "out" })
			if args[out+1].name != bundle.NormOutBF16 {
				t.Fatalf("%s: argument %d is %s", k.Name, out+1, args[out+1].name)
			}
			with, without := newEmuBufs(), newEmuBufs()
			with.run(t, k, c.Launch(testRows), args)
			none := slices.Clone(args)
			none[out+1] = nullPtr(bundle.NormOutBF16)
			without.run(t, k, c.Launch(testRows), none)
			y := with.f32("out")
			sameBits(t, k.Name+": out with and without out_bf16", y, without.f32("out"))
			got := ops.Arg{Mem: with.mem.Bytes(with.addr[bundle.NormOutBF16])}.U16()
			for i, v := range y[:testRows*w] {
				if got[i] != ops.F32ToBF16(v) {
					t.Fatalf("%s: out_bf16[%d] = %#04x, want bf16(out) = %#04x", k.Name, i, got[i], ops.F32ToBF16(v))
				}
			}

			c.OutOptional = true
			opt := must(t)(RowNorm(k.Name+"_opt", c))
			alone := slices.Clone(args)
			alone[out] = nullPtr("out")
			checkKernel(t, opt, c.Launch(testRows), alone)
			checkKernel(t, opt, c.Launch(testRows), args)
			b := newEmuBufs()
			b.run(t, opt, c.Launch(testRows), alone)
			if !slices.Equal(ops.Arg{Mem: b.mem.Bytes(b.addr[bundle.NormOutBF16])}.U16()[:testRows*w], got[:testRows*w]) {
				t.Fatalf("%s: out_bf16 alone differs from out_bf16 beside out", opt.Name)
			}
		}
	}
	if _, err := RowNorm("gather_opt", RowConfig{Hidden: 256, Eps: 1e-5, WDtype: ptx.BF16, Load: "add", Gather: true, OutOptional: true}); err == nil {
		t.Error("a gathering norm built with an optional out")
	}
}

func TestRowNormMatchesReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	for _, w := range []int{160, 256, 1000} {
		for _, load := range []string{"embed", "add"} {
			for _, dt := range []ptx.Type{ptx.F32, ptx.BF16} {
				sets := testOps(w)
				for _, name := range []string{"none", "capture", "probe", "steer", "project", "chain"} {
					c := RowConfig{Hidden: w, Vocab: 50, Eps: 1e-5, WDtype: dt, Load: load}
					switch {
					case name == "none":
					case load == "add" && name == "steer":
						c.DeltaOps = sets[name]
					case name == "probe" || name == "capture":
						c.NormOps = sets[name]
					default:
						c.ResidOps = sets[name]
					}
					if load == "add" && (name == "chain" || name == "none" || name == "capture") {
						c.Gather = true
					}
					kname := fmt.Sprintf("row_norm_%s_%s_%d_%s", load, dt, w, name)
					k, err := RowNorm(kname, c)
					if err != nil {
						t.Fatal(err)
					}
					checkKernel(t, k, c.Launch(testRows), rowNormArgs(rng, c, testRows))
				}
			}
		}
	}
}

func TestSiluMulMatchesReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(13, 14))
	for _, w := range []int{160, 1000, 1300} {
		sets := testOps(w)
		// Without ops the kernel is the chunked one (TestSiluMulChunkedMatchesReference).
		for _, name := range []string{"capture", "probe", "steer", "project", "chain"} {
			c := SiluConfig{Inter: w, Ops: sets[name]}
			k, err := SiluMul(fmt.Sprintf("silu_%d_%s", w, name), c)
			if err != nil {
				t.Fatal(err)
			}
			args := []targ{{name: "gu", f32: randF32(rng, testRows*2*w, 6)}, {name: "act", out: testRows * w}}
			checkKernel(t, k, c.Launch(testRows), append(args, miTargs(rng, c.Ops)...))
		}
	}
}

func TestMIKernelMatchesReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(15, 16))
	for _, w := range []int{160, 256, 1000} {
		sets := testOps(w)
		for _, name := range []string{"capture", "probe", "steer", "project", "chain"} {
			c := MIKernelConfig{Width: w, Stride: w + 64, Offset: 32, Ops: sets[name]}
			k, err := MIKernel(fmt.Sprintf("mi_%d_%s", w, name), c)
			if err != nil {
				t.Fatal(err)
			}
			x := targ{name: "x", f32: randF32(rng, testRows*c.Stride, 1), out: testRows * c.Stride}
			checkKernel(t, k, c.Launch(testRows), append([]targ{x}, miTargs(rng, c.Ops)...))
		}
	}
}

// TestRowKernelsWide runs the widest rows the kernels promise: 16384 hidden, 14336 SiLU.
func TestRowKernelsWide(t *testing.T) {
	if testing.Short() {
		t.Skip("wide rows take a few seconds in the emulator")
	}
	rng := rand.New(rand.NewPCG(17, 18))
	c := RowConfig{Hidden: 16384, Eps: 1e-6, WDtype: ptx.BF16, Load: "add", ResidOps: testOps(16384)["chain"]}
	k, err := RowNorm("row_norm_wide", c)
	if err != nil {
		t.Fatal(err)
	}
	checkKernel(t, k, c.Launch(testRows), rowNormArgs(rng, c, testRows))
	s := SiluConfig{Inter: 14336, Ops: testOps(14336)["steer"]}
	if k, err = SiluMul("silu_wide", s); err != nil {
		t.Fatal(err)
	}
	args := []targ{{name: "gu", f32: randF32(rng, testRows*2*s.Inter, 6)}, {name: "act", out: testRows * s.Inter}}
	checkKernel(t, k, s.Launch(testRows), append(args, miTargs(rng, s.Ops)...))
}

// emulate runs k on args and returns every pointer argument's final contents as f32.
func emulate(t *testing.T, k *Kernel, l ops.Launch, args []targ) [][]float32 {
	t.Helper()
	return emulateAliased(t, k, l, args, nil)
}

// emulateAliased is emulate where parameter i points at argument alias[i]'s buffer.
func emulateAliased(t *testing.T, k *Kernel, l ops.Launch, args []targ, alias map[int]int) [][]float32 {
	t.Helper()
	mod, err := ptx.Parse(k.PTX)
	if err != nil {
		t.Fatalf("%s: parse: %v", k.Name, err)
	}
	mem := emu.NewMemory()
	params := make([]uint64, len(args))
	for i, a := range args {
		if a.isVal {
			params[i] = a.bits
			continue
		}
		init := a.bytesOf()
		params[i] = mem.Alloc(len(init))
		copy(mem.Bytes(params[i]), init)
	}
	for i, j := range alias {
		params[i] = params[j]
	}
	if err := emu.Run(mod, k.Name, emu.Launch{Grid: l.Grid, Block: l.Block}, mem, params); err != nil {
		t.Fatalf("%s: emulate: %v", k.Name, err)
	}
	outs := make([][]float32, len(args))
	for i, a := range args {
		if !a.isVal {
			outs[i] = append([]float32(nil), ops.Arg{Mem: mem.Bytes(params[i])}.F32()...)
		}
	}
	return outs
}

// reference runs k's reference op on args and returns the arguments' final contents as f32.
func reference(t *testing.T, k *Kernel, l ops.Launch, args []targ) [][]float32 {
	t.Helper()
	return referenceAliased(t, k, l, args, nil)
}

func referenceAliased(t *testing.T, k *Kernel, l ops.Launch, args []targ, alias map[int]int) [][]float32 {
	t.Helper()
	ref, err := ops.Build(k.Op, k.Attrs)
	if err != nil {
		t.Fatal(err)
	}
	ra := make([]ops.Arg, len(args))
	for i, a := range args {
		ra[i] = ops.Arg{Mem: a.bytesOf()}
	}
	for i, j := range alias {
		ra[i] = ra[j]
	}
	if err := ref.Run(ra, l); err != nil {
		t.Fatal(err)
	}
	outs := make([][]float32, len(args))
	for i := range ra {
		outs[i] = ra[i].F32()
	}
	return outs
}

// TestMIGateReadsEarlierOp gates a steer on a probe written by the same kernel into the same
// buffer (CAST-style conditional steering at one hook): the steer must see this forward's
// probe value, which takes the barrier the emitter places between them.
func TestMIGateReadsEarlierOp(t *testing.T) {
	const w = 512
	rng := rand.New(rand.NewPCG(21, 22))
	probe := ir.MI{Op: mi.Op{Template: "probe_linear", Bit: testBit, Width: w, Alpha: -1, Bias: -1, Activation: "sigmoid", OutWidth: 1}, Vec: "p", Out: "harm"}
	steer := ir.MI{Op: mi.Op{Template: "steer_add", Bit: testBit, Width: w, Alpha: 0, Bias: -1, Gates: []mi.Gate{{Kind: "activation", Buf: "harm", Width: 1, Cmp: ">", Value: 0.5}}}, Vec: "v", Scal: "s"}
	c := MIKernelConfig{Width: w, Stride: w, Ops: []ir.MI{probe, steer}}
	k, err := MIKernel("cast", c)
	if err != nil {
		t.Fatal(err)
	}
	pw := randF32(rng, w, 1)
	x := randF32(rng, testRows*w, 0.01)
	along := []bool{true, false, false, true, true} // row 2 has the app bit but a low probe
	for r := range testRows {
		sign := float32(-1)
		if along[r] {
			sign = 1
		}
		for i := range w {
			x[r*w+i] += sign * pw[i]
		}
	}
	// Stale values in the buffer the gate reads: the steer must not act on them.
	harm := []float32{0, 1, 1, 1, 0}
	args := []targ{{name: "x", f32: x, out: len(x)}, {name: "ctl_mask", u32: testMask},
		{name: "mi0_vec", f32: pw}, {name: "mi0_out", f32: harm, out: testRows},
		{name: "mi1_vec", f32: randF32(rng, w, 1)}, {name: "mi1_scal", f32: []float32{1.5}},
		{name: "mi1_g0", f32: harm}}
	alias := map[int]int{6: 3}
	l := c.Launch(testRows)
	got, want := emulateAliased(t, k, l, args, alias), referenceAliased(t, k, l, args, alias)
	for r := range testRows {
		steered := testMask[r]>>testBit&1 == 1 && along[r]
		for i := range w {
			if math.Float32bits(want[0][r*w+i]) != math.Float32bits(x[r*w+i]) != steered {
				t.Fatalf("reference: row %d steered %v, want %v", r, !steered, steered)
			}
			if d := math.Abs(float64(got[0][r*w+i] - want[0][r*w+i])); d > 1e-5*(1+math.Abs(float64(want[0][r*w+i]))) {
				t.Fatalf("row %d [%d]: emulator %v, reference %v", r, i, got[0][r*w+i], want[0][r*w+i])
			}
		}
	}
}

// TestMIExact checks the MI promises on the emulated PTX and on the reference alike: steer_add
// adds exactly fl(alpha*v), rows without the app bit come out bit-identical to the same
// kernel without MI ops, project_out leaves no component along its direction, and
// probe_linear is the float64 dot product (+ bias, sigmoid).
func TestMIExact(t *testing.T) {
	const w = 1000
	rng := rand.New(rand.NewPCG(19, 20))
	steer := ir.MI{Op: mi.Op{Template: "steer_add", Bit: testBit, Width: w, Alpha: 0, Bias: -1}, Vec: "v", Scal: "s"}
	project := ir.MI{Op: mi.Op{Template: "project_out", Bit: testBit, Width: w, Alpha: -1, Bias: -1}, Vec: "d"}
	probe := ir.MI{Op: mi.Op{Template: "probe_linear", Bit: testBit, Width: w, Alpha: -1, Bias: 1, Activation: "sigmoid", OutWidth: 1}, Vec: "p", Scal: "s", Out: "o"}
	plain := RowConfig{Hidden: w, Eps: 1e-5, WDtype: ptx.BF16, Load: "add"}
	withMI := plain
	withMI.ResidOps = []ir.MI{steer, project}
	withMI.NormOps = []ir.MI{probe}
	kPlain, err := RowNorm("plain", plain)
	if err != nil {
		t.Fatal(err)
	}
	kMI, err := RowNorm("with_mi", withMI)
	if err != nil {
		t.Fatal(err)
	}
	l := plain.Launch(testRows)
	args := rowNormArgs(rng, withMI, testRows)
	nPlain := len(rowNormArgs(rng, plain, testRows))
	plainArgs := append(args[:nPlain-1:nPlain-1], targ{name: "ctl_mask", u32: testMask})
	resid, delta := args[0].f32, args[1].f32
	alpha, bias := args[nPlain+1].f32[0], args[nPlain+1].f32[1]
	v, d, pw := args[nPlain].f32, args[nPlain+2].f32, args[nPlain+3].f32

	for _, run := range []struct {
		name string
		fn   func(*testing.T, *Kernel, ops.Launch, []targ) [][]float32
	}{{"emulator", emulate}, {"reference", reference}} {
		got, base := run.fn(t, kMI, l, args), run.fn(t, kPlain, l, plainArgs)
		for r := range testRows {
			row := func(b []float32) []float32 { return b[r*w : (r+1)*w] }
			if testMask[r]>>testBit&1 == 0 {
				for i := range w {
					if math.Float32bits(row(got[0])[i]) != math.Float32bits(row(base[0])[i]) ||
						math.Float32bits(row(got[3])[i]) != math.Float32bits(row(base[3])[i]) {
						t.Fatalf("%s: row %d without the app differs from the plain kernel at %d", run.name, r, i)
					}
				}
				continue
			}
			// resid = project_out(x + fl(alpha*v)); undo nothing, but check the steer alone
			// through the projection's linearity: the kernel's input to project_out must be
			// exactly x + fl(alpha*v), so rebuild it and project in float64.
			x := make([]float64, w)
			var xd float64
			for i := range w {
				s := (resid[r*w+i] + delta[r*w+i]) + float32(alpha*v[i])
				x[i] = float64(s)
				xd += x[i] * float64(d[i])
			}
			var norm, resDot float64
			for i := range w {
				want := x[i] - xd*float64(d[i])
				if diff := math.Abs(float64(row(got[0])[i]) - want); diff > 1e-5*(1+math.Abs(want)) {
					t.Fatalf("%s: row %d resid[%d] = %v, want %v", run.name, r, i, row(got[0])[i], want)
				}
				norm += float64(row(got[0])[i]) * float64(row(got[0])[i])
				resDot += float64(row(got[0])[i]) * float64(d[i])
			}
			if math.Abs(resDot) >= 1e-5*math.Sqrt(norm) {
				t.Fatalf("%s: row %d: |x.d| = %g after project_out, |x| = %g", run.name, r, resDot, math.Sqrt(norm))
			}
			var s float64
			for i := range w {
				s += float64(row(got[3])[i]) * float64(pw[i])
			}
			want := 1 / (1 + math.Exp(-(s + float64(bias))))
			if p := got[len(got)-1][r]; math.Abs(float64(p)-want) > 1e-5 {
				t.Fatalf("%s: row %d probe %v, want %v", run.name, r, p, want)
			}
		}
	}

	// The steer alone is bit-exact: an MI kernel adds exactly fl(alpha*v).
	c := MIKernelConfig{Width: w, Stride: w, Ops: []ir.MI{steer}}
	k, err := MIKernel("steer_exact", c)
	if err != nil {
		t.Fatal(err)
	}
	x := randF32(rng, testRows*w, 3)
	margs := []targ{{name: "x", f32: x, out: len(x)}, {name: "ctl_mask", u32: testMask},
		{name: "mi0_vec", f32: v}, {name: "mi0_scal", f32: []float32{alpha}}}
	for _, run := range []struct {
		name string
		fn   func(*testing.T, *Kernel, ops.Launch, []targ) [][]float32
	}{{"emulator", emulate}, {"reference", reference}} {
		got := run.fn(t, k, c.Launch(testRows), margs)[0]
		for r := range testRows {
			on := testMask[r]>>testBit&1 == 1
			for i := range w {
				want := x[r*w+i]
				if on {
					want += float32(alpha * v[i])
				}
				if math.Float32bits(got[r*w+i]) != math.Float32bits(want) {
					t.Fatalf("%s: row %d [%d] = %v, want %v (enabled %v)", run.name, r, i, got[r*w+i], want, on)
				}
			}
		}
	}
}

func TestRowKernelErrors(t *testing.T) {
	w := 256
	steer := testOps(w)["steer"][0]
	noVec := steer
	noVec.Vec = ""
	narrow := steer
	narrow.Width = 128
	for _, c := range []struct {
		name string
		err  func() error
	}{
		{"width 0", func() error { _, err := RowNorm("k", RowConfig{WDtype: ptx.F32, Load: "add"}); return err }},
		{"width too large", func() error { _, err := SiluMul("k", SiluConfig{Inter: 40000, Ops: []ir.MI{steer}}); return err }},
		{"f16 weights", func() error { _, err := RowNorm("k", RowConfig{Hidden: w, WDtype: ptx.F16, Load: "add"}); return err }},
		{"embed without vocab", func() error { _, err := RowNorm("k", RowConfig{Hidden: w, WDtype: ptx.F32, Load: "embed"}); return err }},
		{"bad load", func() error {
			_, err := RowNorm("k", RowConfig{Hidden: w, WDtype: ptx.F32, Load: "gather"})
			return err
		}},
		{"missing buffer", func() error { _, err := SiluMul("k", SiluConfig{Inter: w, Ops: []ir.MI{noVec}}); return err }},
		{"width mismatch", func() error { _, err := SiluMul("k", SiluConfig{Inter: w, Ops: []ir.MI{narrow}}); return err }},
		{"no ops", func() error { _, err := MIKernel("k", MIKernelConfig{Width: w, Stride: w}); return err }},
		{"past stride", func() error {
			_, err := MIKernel("k", MIKernelConfig{Width: w, Stride: w, Offset: 1, Ops: []ir.MI{steer}})
			return err
		}},
	} {
		if err := c.err(); err == nil {
			t.Errorf("%s: no error", c.name)
		}
	}
}

func TestMIBindings(t *testing.T) {
	c := RowConfig{Hidden: 64, Load: "add", WDtype: ptx.F32, DeltaOps: testOps(64)["steer"], NormOps: testOps(64)["chain"]}
	got := MIBindings(c.MIOps())
	want := map[string]string{
		"mi0_vec": "steer_v", "mi0_scal": "scal",
		"mi1_vec": "probe_w", "mi1_scal": "scal", "mi1_out": "probe",
		"mi2_vec": "steer_v", "mi2_scal": "scal", "mi2_g0": "probe",
		"mi3_vec": "dir", "mi3_g0": "gate",
		"mi4_out": "cap",
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("bindings %v, want %v", got, want)
	}
	k, err := RowNorm("bind", c)
	if err != nil {
		t.Fatal(err)
	}
	names := paramNames(k)
	wantParams := "[resid delta w out out_bf16 ctl_mask ctl_tokens ctl_gen mi0_vec mi0_scal mi1_vec mi1_scal mi1_out " +
		"mi2_vec mi2_scal mi2_g0 mi3_vec mi3_g0 mi4_out]"
	if fmt.Sprint(names) != wantParams {
		t.Fatalf("params %v, want %s", names, wantParams)
	}
	for _, n := range names {
		if _, ok := got[n]; !ok && len(n) > 2 && n[:2] == "mi" {
			t.Errorf("param %s has no binding", n)
		}
	}
}

// writeOps returns the op sets for the writing templates beyond steer_add and project_out at
// a hook of width w: each alone under a gate (or, for one set, none), and a chain where
// steer_set is gated on a probe the same kernel has just written. Scalars index miTargs'
// table {2.5, -0.125, 0.25}.
func writeOps(w int) map[string][]ir.MI {
	set := ir.MI{Op: mi.Op{Template: "steer_set", Bit: testBit, Width: w, Alpha: 1, Bias: -1, Gates: []mi.Gate{{Kind: "positions", Positions: "prompt"}}}, Vec: "set_d", Scal: "scal"}
	clamp := ir.MI{Op: mi.Op{Template: "clamp_projection", Bit: testBit, Width: w, Alpha: 1, Bias: 2, Gates: []mi.Gate{{Kind: "activation", Buf: "gate", Col: 1, Width: 2, Cmp: ">", Value: 0.5}}}, Vec: "clamp_d", Scal: "scal"}
	clampMax := clamp
	clampMax.Alpha, clampMax.Gates = -1, nil
	scale := ir.MI{Op: mi.Op{Template: "scale", Bit: testBit, Width: w, Alpha: 0, Bias: -1, Gates: []mi.Gate{{Kind: "steps", From: 1, To: 3}}}, Scal: "scal"}
	scaleVec := ir.MI{Op: mi.Op{Template: "scale", Bit: testBit, Width: w, Alpha: -1, Bias: -1, Gates: []mi.Gate{{Kind: "token_in", Tokens: []int{7, 9}}}}, Vec: "factors"}
	head := ir.MI{Op: mi.Op{Template: "head_ablate", Bit: testBit, Width: w, Alpha: 1, Bias: -1, Gates: []mi.Gate{{Kind: "positions", Positions: "generated"}}}, Vec: "mask", Scal: "scal"}
	patch := ir.MI{Op: mi.Op{Template: "patch", Bit: testBit, Width: w, Alpha: -1, Bias: -1, Gates: []mi.Gate{{Kind: "token_in", Tokens: []int{8}}}}, Vec: "saved"}
	gatedSet := set
	gatedSet.Gates = []mi.Gate{{Kind: "activation", Buf: "probe", Col: 1, Width: 2, Cmp: ">", Value: 0}}
	old := testOps(w)
	return map[string][]ir.MI{
		"steer_set": {set}, "clamp": {clamp}, "clamp_max": {clampMax}, "scale": {scale}, "scale_vec": {scaleVec},
		"head_ablate": {head}, "patch": {patch},
		"chain": {patch, old["probe"][0], gatedSet, clampMax, scaleVec, head, old["capture"][0]},
	}
}

var writeNames = []string{"steer_set", "clamp", "clamp_max", "scale", "scale_vec", "head_ablate", "patch", "chain"}

// TestWriteTemplatesMatchReference runs every writing template in every host kernel kind:
// the delta and residual roles of an add+norm kernel, the embedding kernel, SiLU*up and the
// standalone MI kernel.
func TestWriteTemplatesMatchReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(23, 24))
	for _, w := range []int{160, 1000} {
		sets := writeOps(w)
		for _, name := range writeNames {
			mi := sets[name]
			for _, role := range []string{"delta", "resid", "embed"} {
				c := RowConfig{Hidden: w, Vocab: 50, Eps: 1e-5, WDtype: ptx.F32, Load: "add"}
				switch role {
				case "delta":
					c.DeltaOps = mi
				case "resid":
					c.ResidOps = mi
				default:
					c.Load, c.ResidOps = "embed", mi
				}
				k, err := RowNorm(fmt.Sprintf("row_norm_%s_%d_%s", role, w, name), c)
				if err != nil {
					t.Fatal(err)
				}
				checkKernel(t, k, c.Launch(testRows), rowNormArgs(rng, c, testRows))
			}
			s := SiluConfig{Inter: w, Ops: mi}
			k, err := SiluMul(fmt.Sprintf("silu_%d_%s", w, name), s)
			if err != nil {
				t.Fatal(err)
			}
			args := []targ{{name: "gu", f32: randF32(rng, testRows*2*w, 6)}, {name: "act", out: testRows * w}}
			checkKernel(t, k, s.Launch(testRows), append(args, miTargs(rng, mi)...))
			m := MIKernelConfig{Width: w, Stride: w + 64, Offset: 32, Ops: mi}
			if k, err = MIKernel(fmt.Sprintf("mi_%d_%s", w, name), m); err != nil {
				t.Fatal(err)
			}
			x := targ{name: "x", f32: randF32(rng, testRows*m.Stride, 1), out: testRows * m.Stride}
			checkKernel(t, k, m.Launch(testRows), append([]targ{x}, miTargs(rng, mi)...))
		}
	}
}

// TestActivationThenMIKeepsBits: an app's ops at mlp.act give act the same bits in the
// activation kernel (SiluMul with them) and in an MI kernel of their own after the plain
// activation (activationThenMI, the form of every bucket whose gate/up the backend may serve
// in one launch or write in bf16), in the emulator and the reference alike, for every writing
// template and a chain of them with reads and gates.
func TestActivationThenMIKeepsBits(t *testing.T) {
	const w = 1000
	rng := rand.New(rand.NewPCG(29, 30))
	sets := writeOps(w)
	for _, name := range writeNames {
		ops := sets[name]
		fusedCfg, plainCfg := SiluConfig{Inter: w, Ops: ops}, SiluConfig{Inter: w}
		fused := must(t)(SiluMul("silu_ops_"+name, fusedCfg))
		plain := must(t)(SiluMul("silu_plain", plainCfg))
		mc := MIKernelConfig{Width: w, Stride: w, Ops: ops}
		after := must(t)(MIKernel("mi_after_"+name, mc))
		gu := targ{name: "gu", f32: randF32(rng, testRows*2*w, 6)}
		act := targ{name: "act", out: testRows * w}
		miArgs := miTargs(rng, ops)
		for _, run := range bothRuns {
			want := run.fn(t, fused, fusedCfg.Launch(testRows), append([]targ{gu, act}, miArgs...))[1]
			base := run.fn(t, plain, plainCfg.Launch(testRows), []targ{gu, act, nullPtr(bundle.GatedActBF16), nullPtr(bundle.GatedGuBF16)})[1]
			got := run.fn(t, after, mc.Launch(testRows), append([]targ{{name: "x", f32: base, out: testRows * w}}, miArgs...))[0]
			if slices.Equal(want, base) {
				t.Fatalf("%s %s: the ops changed no value: the check would not see them lost", run.name, name)
			}
			for i := range want {
				if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
					t.Fatalf("%s %s: act[%d] = %v after the plain activation, %v in it", run.name, name, i, got[i], want[i])
				}
			}
		}
	}
}

// bothRuns runs a kernel in the emulator and through its reference op.
var bothRuns = []struct {
	name string
	fn   func(*testing.T, *Kernel, ops.Launch, []targ) [][]float32
}{{"emulator", emulate}, {"reference", reference}}

// TestMIWriteExact checks each writing template's promise on the emulated PTX and on the
// reference alike, in an MI kernel whose rows 1 and 3 lack the app bit: scale, head_ablate
// and patch are exact (one mul.rn per element, or a copy); steer_set and clamp_projection
// leave the projection on d at the value or the clamped projection, moving the row along d
// only. Rows without the bit come back bit-identical.
func TestMIWriteExact(t *testing.T) {
	const w = 1000
	rng := rand.New(rand.NewPCG(25, 26))
	d := unitF32(randF32(rng, w, 1))
	// Rows are noise plus a known component along d: below min, above max and inside.
	along := []float32{-1, 0.1, 1, 0.05, 0.2}
	x := randF32(rng, testRows*w, 0.01)
	for r := range testRows {
		for i := range w {
			x[r*w+i] += along[r] * d[i]
		}
	}
	factors, saved, mask := randF32(rng, w, 2), randF32(rng, w, 1), headMask(w)
	scal := []float32{2.5, -0.125, 0.25}
	alpha, lo, hi := scal[0], scal[1], scal[2]
	type exact func(i int, xi float32) float32
	projected := func(target func(p float64) float64) func([]float32, []float32) []float64 {
		return func(in, out []float32) []float64 {
			var p float64
			for i := range w {
				p += float64(in[i]) * float64(d[i])
			}
			want := make([]float64, w)
			for i := range w {
				want[i] = float64(in[i]) + (target(p)-p)*float64(d[i])
			}
			return want
		}
	}
	for _, c := range []struct {
		op    ir.MI
		vec   []float32
		exact exact
		near  func(in, out []float32) []float64
	}{
		{ir.MI{Op: mi.Op{Template: "scale", Alpha: 0}}, nil, func(_ int, v float32) float32 { return v * alpha }, nil},
		{ir.MI{Op: mi.Op{Template: "scale", Alpha: -1}, Vec: "f"}, factors, func(i int, v float32) float32 { return v * factors[i] }, nil},
		{ir.MI{Op: mi.Op{Template: "head_ablate", Alpha: 1}, Vec: "m"}, mask, func(i int, v float32) float32 {
			if mask[i] != 0 {
				return v * lo
			}
			return v
		}, nil},
		{ir.MI{Op: mi.Op{Template: "patch", Alpha: -1}, Vec: "s"}, saved, func(i int, _ float32) float32 { return saved[i] }, nil},
		{ir.MI{Op: mi.Op{Template: "steer_set", Alpha: 2}, Vec: "d"}, d, nil, projected(func(float64) float64 { return float64(hi) })},
		{ir.MI{Op: mi.Op{Template: "clamp_projection", Alpha: 1, Bias: 2}, Vec: "d"}, d, nil,
			projected(func(p float64) float64 { return math.Min(math.Max(p, float64(lo)), float64(hi)) })},
	} {
		op := c.op
		op.Bit, op.Width, op.Scal = testBit, w, "s"
		if op.Template != "clamp_projection" {
			op.Bias = -1
		}
		mc := MIKernelConfig{Width: w, Stride: w, Ops: []ir.MI{op}}
		k, err := MIKernel("exact_"+op.Template, mc)
		if err != nil {
			t.Fatal(err)
		}
		args := []targ{{name: "x", f32: x, out: len(x)}, {name: "ctl_mask", u32: testMask}}
		if op.Op.Params()[0].Suffix == "vec" {
			args = append(args, targ{name: "mi0_vec", f32: c.vec})
		}
		if op.Alpha >= 0 {
			args = append(args, targ{name: "mi0_scal", f32: scal})
		}
		if len(args) != len(k.Params) {
			t.Fatalf("%s: %d args for params %v", op.Template, len(args), k.Params)
		}
		for _, run := range bothRuns {
			got := run.fn(t, k, mc.Launch(testRows), args)[0]
			for r := range testRows {
				in, out := x[r*w:(r+1)*w], got[r*w:(r+1)*w]
				if testMask[r]>>testBit&1 == 0 {
					for i := range w {
						if math.Float32bits(out[i]) != math.Float32bits(in[i]) {
							t.Fatalf("%s %s: row %d without the app changed at %d", run.name, op.Template, r, i)
						}
					}
					continue
				}
				if c.exact != nil {
					for i := range w {
						if want := c.exact(i, in[i]); math.Float32bits(out[i]) != math.Float32bits(want) {
							t.Fatalf("%s %s: row %d [%d] = %v, want exactly %v", run.name, op.Template, r, i, out[i], want)
						}
					}
					continue
				}
				want := c.near(in, out)
				var wantP, gotP float64
				for i := range w {
					if diff := math.Abs(float64(out[i]) - want[i]); diff > 1e-5*(1+math.Abs(want[i])) {
						t.Fatalf("%s %s: row %d [%d] = %v, want %v", run.name, op.Template, r, i, out[i], want[i])
					}
					wantP += want[i] * float64(d[i])
					gotP += float64(out[i]) * float64(d[i])
				}
				if math.Abs(gotP-wantP) > 1e-5 {
					t.Fatalf("%s %s: row %d: projection %v, want %v", run.name, op.Template, r, gotP, wantP)
				}
			}
		}
	}
}

// TestWriteTemplatesOffRowsUnchanged: in an add+norm kernel carrying every writing template
// (delta and residual roles), rows without the app bit come out bit-identical to the same
// kernel without MI ops, in the residual and in the normed output.
func TestWriteTemplatesOffRowsUnchanged(t *testing.T) {
	const w = 1000
	rng := rand.New(rand.NewPCG(27, 28))
	sets := writeOps(w)
	plain := RowConfig{Hidden: w, Eps: 1e-5, WDtype: ptx.BF16, Load: "add"}
	withMI := plain
	withMI.DeltaOps = sets["scale"]
	withMI.ResidOps = append(append([]ir.MI(nil), sets["chain"]...), sets["steer_set"]...)
	kPlain, err := RowNorm("plain", plain)
	if err != nil {
		t.Fatal(err)
	}
	kMI, err := RowNorm("with_writes", withMI)
	if err != nil {
		t.Fatal(err)
	}
	args := rowNormArgs(rng, withMI, testRows)
	plainArgs := append(args[:5:5], targ{name: "ctl_mask", u32: testMask})
	l := plain.Launch(testRows)
	for _, run := range bothRuns {
		got, base := run.fn(t, kMI, l, args), run.fn(t, kPlain, l, plainArgs)
		changed := false
		for r := range testRows {
			on := testMask[r]>>testBit&1 == 1
			for _, buf := range []int{0, 3} { // resid, out
				for i := range w {
					same := math.Float32bits(got[buf][r*w+i]) == math.Float32bits(base[buf][r*w+i])
					if !on && !same {
						t.Fatalf("%s: row %d without the app differs from the plain kernel in %s[%d]", run.name, r, args[buf].name, i)
					}
					changed = changed || !same
				}
			}
		}
		if !changed {
			t.Fatalf("%s: no enabled row changed", run.name)
		}
	}
}

// TestGateActZeroGate: a gate of ±0 gives ±0 / 2 times up, bit for bit (signed zeros
// included), under SiLU and GELU, beside gates that are not zero.
func TestGateActZeroGate(t *testing.T) {
	const inter = 1024
	r := rand.New(rand.NewPCG(21, 22))
	gu := randF32(r, 2*inter, 4)
	negZero := float32(math.Copysign(0, -1))
	for i := 0; i < inter; i += 3 {
		gu[i] = 0
		if i%2 == 1 {
			gu[i] = negZero
		}
	}
	for _, act := range []string{"", ActGeluTanh} {
		sc := SiluConfig{Inter: inter, Act: act}
		k, err := SiluMul("silu_zero_gate_"+act, sc)
		if err != nil {
			t.Fatal(err)
		}
		out := newEmuBufs()
		out.run(t, k, sc.Launch(1), []targ{{name: "gu", f32: gu}, {name: "act", out: inter}, nullPtr(bundle.GatedActBF16), nullPtr(bundle.GatedGuBF16)})
		got := out.f32("act")
		for i := 0; i < inter; i += 3 {
			if want := gu[i] * gu[inter+i]; math.Float32bits(got[i]) != math.Float32bits(want) {
				t.Fatalf("%s: act[%d] = %g (%#08x) for gate %g, want %g (%#08x)", k.Name, i, got[i], math.Float32bits(got[i]), gu[i], want, math.Float32bits(want))
			}
		}
		checkKernel(t, k, sc.Launch(1), []targ{{name: "gu", f32: gu}, {name: "act", out: inter}, nullPtr(bundle.GatedActBF16), nullPtr(bundle.GatedGuBF16)})
	}
}

// TestSiluMulChunkedMatchesReference: the chunked kernel against its reference with
// act_bf16 0 and with a buffer; there bf16(act) is, bit for bit, the cast's rounding of the
// kernel's own act, and the same again in a run with act 0 (the bf16 alone, where a store
// to act would fault). With gu_bf16 set the kernel reads gate and up there and not from gu
// (poisoned, so a read of it would show): its act is, bit for bit, that of a run over gu's
// values rounded to bf16.
func TestSiluMulChunkedMatchesReference(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 12))
	for _, c := range []struct{ inter, rows int }{{1000, 3}, {2048, 1}, {14336, 2}} {
		sc := SiluConfig{Inter: c.inter}
		k, err := SiluMul(fmt.Sprintf("silu_chunked_%d", c.inter), sc)
		if err != nil {
			t.Fatal(err)
		}
		n := c.rows * c.inter
		gu := targ{name: "gu", f32: randF32(r, 2*n, 4)}
		act, actB := targ{name: "act", out: n}, targ{name: bundle.GatedActBF16, out: n, dtype: "bf16"}
		noGuB := nullPtr(bundle.GatedGuBF16)
		checkKernel(t, k, sc.Launch(c.rows), []targ{gu, act, nullPtr(bundle.GatedActBF16), noGuB})
		checkKernel(t, k, sc.Launch(c.rows), []targ{gu, act, actB, noGuB})

		both, alone := newEmuBufs(), newEmuBufs()
		both.run(t, k, sc.Launch(c.rows), []targ{gu, act, actB, noGuB})
		alone.run(t, k, sc.Launch(c.rows), []targ{gu, nullPtr("act"), actB, noGuB})
		y := both.f32("act")
		for _, b := range []*emuBufs{both, alone} {
			got := ops.Arg{Mem: b.mem.Bytes(b.addr[actB.name])[:2*n]}.U16()
			for i, v := range y[:n] {
				if got[i] != ops.F32ToBF16(v) {
					t.Fatalf("%s: act_bf16[%d] = %#04x, want bf16(act) = %#04x", k.Name, i, got[i], ops.F32ToBF16(v))
				}
			}
		}

		rounded := make([]float32, 2*n)
		for i, v := range gu.f32 {
			rounded[i] = ops.BF16ToF32(ops.F32ToBF16(v))
		}
		guB := targ{name: bundle.GatedGuBF16, bf16: gu.f32}
		nans := make([]float32, 2*n)
		for i := range nans {
			nans[i] = float32(math.NaN())
		}
		poisoned := targ{name: "gu", f32: nans}
		checkKernel(t, k, sc.Launch(c.rows), []targ{poisoned, act, actB, guB})
		fromB, fromF32 := newEmuBufs(), newEmuBufs()
		fromB.run(t, k, sc.Launch(c.rows), []targ{poisoned, act, nullPtr(bundle.GatedActBF16), guB})
		fromF32.run(t, k, sc.Launch(c.rows), []targ{{name: "gu", f32: rounded}, act, nullPtr(bundle.GatedActBF16), noGuB})
		want, got := fromF32.f32("act"), fromB.f32("act")
		for i := range n {
			if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
				t.Fatalf("%s: act[%d] from gu_bf16 = %g, want %g (gu rounded to bf16)", k.Name, i, got[i], want[i])
			}
		}
	}
}

// TestRowNormFoldedProjection: with project_out among its residual ops, the add+norm kernel
// takes the norm's sum of squares from the projection's reduction (‖x‖² − (x·d)²); rows that
// lie almost along d, where that difference cancels, are summed again and still match the
// reference, as do rows without the app and ordinary rows. With a steer after the projection
// (another app's op, firing on some rows only), rows it changed sum their squares again.
func TestRowNormFoldedProjection(t *testing.T) {
	rng := rand.New(rand.NewPCG(23, 24))
	for _, w := range []int{256, 1000, 4096} {
		project := ir.MI{Op: mi.Op{Template: "project_out", Bit: testBit, Width: w, Alpha: -1, Bias: -1}, Vec: "d"}
		steer := ir.MI{Op: mi.Op{Template: "steer_add", Bit: 0, Width: w, Alpha: 0, Bias: -1, Gates: []mi.Gate{{Kind: "steps", From: 1, To: 3}}}, Vec: "steer_v", Scal: "scal"}
		for _, resid := range [][]ir.MI{{project}, {project, steer}} {
			foldedProjection(t, rng, w, resid)
		}
	}
}

func foldedProjection(t *testing.T, rng *rand.Rand, w int, residOps []ir.MI) {
	t.Helper()
	c := RowConfig{Hidden: w, Eps: 1e-5, WDtype: ptx.BF16, Load: "add", ResidOps: residOps}
	k, err := RowNorm(fmt.Sprintf("row_norm_fold_%d_%d", w, len(residOps)), c)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(k.PTX, "red2") {
		t.Fatalf("w=%d: the kernel does not fold the norm into the projection's reduction", w)
	}
	args := rowNormArgs(rng, c, testRows)
	var d []float32
	for _, a := range args {
		if a.name == "mi0_vec" {
			d = a.f32
		}
	}
	resid, delta := args[0].f32, args[1].f32
	for r := range testRows {
		if r%2 == 0 { // mostly along d: nearly all the energy goes with the projection
			for i := range w {
				resid[r*w+i] = 30*d[i] + 0.01*resid[r*w+i]
				delta[r*w+i] = 0
			}
		}
	}
	checkKernel(t, k, c.Launch(testRows), args)

	// Rows without the app sum their squares as the kernel without MI ops does: same bits.
	plain := RowConfig{Hidden: w, Eps: 1e-5, WDtype: ptx.BF16, Load: "add"}
	kp, err := RowNorm(fmt.Sprintf("row_norm_plain_%d", w), plain)
	if err != nil {
		t.Fatal(err)
	}
	got := emulate(t, k, c.Launch(testRows), args)
	base := emulate(t, kp, plain.Launch(testRows), append(args[:5:5], targ{name: "ctl_mask", u32: testMask}))
	for r := range testRows {
		if testMask[r]&(1<<testBit|1) != 0 {
			continue
		}
		for i := r * w; i < (r+1)*w; i++ {
			if math.Float32bits(got[3][i]) != math.Float32bits(base[3][i]) {
				t.Fatalf("w=%d row %d without the apps: out[%d] %v, plain kernel %v", w, r, i-r*w, got[3][i], base[3][i])
			}
		}
	}
}

// TestRowNormFoldedClamp: with clamp_projection among its residual ops (side-effect-free
// steering), the add+norm kernel takes the norm's sum of squares from the clamp's reduction.
// Rows it moves take ‖x‖² − p² + c² and match the reference; a row that lies almost along d,
// where that difference cancels, is summed again and matches too, alone and behind a steer
// (the app's own pair). Within bounds no row moves, and every row keeps the bits of the
// kernel without MI ops, the row along d included.
func TestRowNormFoldedClamp(t *testing.T) {
	rng := rand.New(rand.NewPCG(25, 26))
	for _, w := range []int{256, 1000, 4096} {
		clamp := ir.MI{Op: mi.Op{Template: "clamp_projection", Bit: testBit, Width: w, Alpha: 1, Bias: 2}, Vec: "d", Scal: "scal"}
		steer := ir.MI{Op: mi.Op{Template: "steer_add", Bit: testBit, Width: w, Alpha: 0, Bias: -1}, Vec: "steer_v", Scal: "scal"}
		for _, resid := range [][]ir.MI{{clamp}, {steer, clamp}} {
			c := RowConfig{Hidden: w, Eps: 1e-5, WDtype: ptx.BF16, Load: "add", ResidOps: resid}
			k := must(t)(RowNorm(fmt.Sprintf("row_norm_clamp_fold_%d_%d", w, len(resid)), c))
			if !strings.Contains(k.PTX, "red2") {
				t.Fatalf("%s: the kernel does not fold the norm into the clamp's reduction", k.Name)
			}
			args := rowNormArgs(rng, c, testRows)
			at := func(name string) []float32 {
				i := slices.IndexFunc(args, func(a targ) bool { return a.name == name })
				return args[i].f32
			}
			d := at(fmt.Sprintf("mi%d_vec", len(resid)-1))
			// Row 0 (with the app) lies almost along d: its projection carries nearly all of it.
			for i := range w {
				args[0].f32[i] = 30*d[i] + 0.01*args[0].f32[i]
				args[1].f32[i] = 0
			}
			checkKernel(t, k, c.Launch(testRows), args)
			if len(resid) > 1 {
				continue
			}
			copy(at("mi0_scal"), []float32{2.5, -1e6, 1e6})
			plain := RowConfig{Hidden: w, Eps: 1e-5, WDtype: ptx.BF16, Load: "add"}
			kp := must(t)(RowNorm(fmt.Sprintf("row_norm_plain_clamp_%d", w), plain))
			got := emulate(t, k, c.Launch(testRows), args)
			base := emulate(t, kp, plain.Launch(testRows), append(args[:5:5], targ{name: "ctl_mask", u32: testMask}))
			sameBits(t, k.Name+": resid within bounds", got[0], base[0])
			sameBits(t, k.Name+": out within bounds", got[3], base[3])
		}
	}
}

// TestRowNormPrefetchEarly: launched early (RowConfig.EarlyLaunch), a row kernel whose MI
// ops read vectors or scalar tables gets them before it waits for the grid ahead. Without
// PreloadVectors it only asks L2 for them and reads nothing before the wait; with it, it also
// loads the row's mask, each op's scalars (and the row's sequence slot first where they are
// per request) and, for each op with a compiled vector up to maxPreloadedVec elements a
// thread, the vector into registers (preloadParams), and asks L2 for the rest (vectors past
// the budget or with per-request slots); with PreloadCoherent those vectors and scalars come
// by coherent loads (ld.global), else by read-only ones. An add+norm also asks L2 for its
// residual row (an add+norm without such ops only for that: one line a warp for each of a
// thread's elements). Nothing else is read before the wait (the other control words, the
// tokens, the residual, the delta and the norm weight all come after); only its activation
// gates' values, which the grid ahead may write, are asked for after it. Its results match
// the reference every way, with a table of one row and with one of a row per sequence slot,
// on rows with and without the ops' bit. An embedding kernel without such ops is the same
// kernel launched early or not (earlyLaunch adds its wait).
func TestRowNormPrefetchEarly(t *testing.T) {
	rng := rand.New(rand.NewPCG(13, 14))
	sets := testOps(300)
	perSeq := ir.MI{Op: mi.Op{Template: "steer_add", Bit: testBit, Width: 300, Alpha: 0, Bias: -1, ScalStride: 2, ScalRows: 3}, Vec: "v", Scal: "s"}
	// Its request's threshold (Scal[1]) and layer word (Scal[2]) gate it too.
	perSeqGated := perSeq
	perSeqGated.ScalStride = 3
	perSeqGated.Gates = []mi.Gate{{Kind: "activation", Buf: "gate", Col: 1, Width: 2, Cmp: ">", Thresh: 2}, {Kind: "layers", Word: 2}}
	wait := "\t" + bundle.PriorGridWait + ";\n"
	for _, c := range []RowConfig{
		{Hidden: 300, Vocab: 50, Eps: 1e-5, WDtype: ptx.BF16, Load: "embed", ResidOps: sets["steer"]},
		{Hidden: 300, Eps: 1e-5, WDtype: ptx.BF16, Load: "add", ResidOps: sets["project"], NormOps: sets["probe"], Gather: true},
		{Hidden: 300, Eps: 1e-6, WDtype: ptx.F32, Load: "add", DeltaOps: sets["steer"], DeltaNorm: true, WOffset: 1},
		{Hidden: 300, Eps: 1e-5, WDtype: ptx.BF16, Load: "add", ResidOps: []ir.MI{perSeq}},
		{Hidden: 300, Eps: 1e-5, WDtype: ptx.BF16, Load: "add", ResidOps: []ir.MI{perSeqGated}},
		// 3 elements a thread: the chains' five vectors fill the budget, the sixth is prefetched
		{Hidden: 300, Eps: 1e-5, WDtype: ptx.BF16, Load: "add", DeltaOps: sets["chain"], ResidOps: sets["chain"]},
	} {
		c.EarlyLaunch = true
		for _, preload := range []struct{ on, coherent bool }{{false, false}, {true, false}, {true, true}} {
			c.PreloadVectors, c.PreloadCoherent = preload.on, preload.coherent
			checkPrefetchEarly(t, rng, c, wait)
		}
	}
	for _, c := range []RowConfig{
		{Hidden: 300, Eps: 1e-5, WDtype: ptx.BF16, Load: "add"},
		{Hidden: 300, Eps: 1e-5, WDtype: ptx.BF16, Load: "add", NormOps: sets["capture"], Gather: true},
	} {
		c.EarlyLaunch, c.PreloadVectors = true, true
		checkPrefetchEarly(t, rng, c, wait)
		before, _, _ := strings.Cut(must(t)(RowNorm("row_early", c)).PTX, wait)
		if n, per := strings.Count(before, "prefetch.global.L2"), rowPer(c.Hidden); n != per {
			t.Errorf("%+v: %d prefetches before the wait, want the residual's %d", c.NormOps, n, per)
		}
	}
	c := RowConfig{Hidden: 300, Vocab: 50, Eps: 1e-5, WDtype: ptx.BF16, Load: "embed"}
	plain := must(t)(RowNorm("row_early", c))
	c.EarlyLaunch, c.PreloadVectors = true, true
	if early := must(t)(RowNorm("row_early", c)); early.PTX != plain.PTX {
		t.Error("an embedding kernel with nothing to ask for changed when launched early")
	}
}

// checkPrefetchEarly builds c (launched early) and checks what it reads before its wait and
// its results (TestRowNormPrefetchEarly).
func checkPrefetchEarly(t *testing.T, rng *rand.Rand, c RowConfig, wait string) {
	t.Helper()
	k := must(t)(RowNorm("row_early", c))
	before, after, ok := strings.Cut(k.PTX, wait)
	if !ok || strings.Contains(after, wait) {
		t.Fatalf("%s: want one wait for the grid ahead:\n%s", c.Load, k.PTX)
	}
	gates := 0 // the activation gates' values, written by the grid ahead, are asked for after it
	for _, o := range c.MIOps() {
		for _, g := range o.Gates {
			if g.Kind == "activation" {
				gates++
			}
		}
	}
	if !strings.Contains(before, "prefetch.global.L2") || strings.Count(after, "prefetch.global.L2") != gates {
		t.Fatalf("%s: the prefetches are not all before the wait, but for %d gates':\n%s", c.Load, gates, k.PTX)
	}
	// Preloading, the kernel reads the mask, the sequence slot where an op's scalars are per
	// request, each op's scalars and the vectors within the budget; nothing else.
	per, vecs, scalars, mask, seq := rowPer(c.Hidden), 0, 0, 0, 0
	for _, o := range c.MIOps() {
		if !c.PreloadVectors || o.Vec == "" && o.Scal == "" {
			continue
		}
		mask = 1
		if o.Vec != "" && o.Pool == "" && (vecs+1)*per <= maxPreloadedVec {
			vecs++
		}
		if o.Scal != "" {
			scalars += min(o.Alpha+1, 1) + min(o.Bias+1, 1)
			for _, g := range o.Gates {
				scalars += min(g.Thresh, 1)
			}
			seq = max(seq, min(o.ScalStride, 1))
		}
	}
	words, floats := 0, 0
	for _, line := range strings.Split(before, "\n") {
		op, _, _ := strings.Cut(strings.TrimSpace(line), " ")
		if strings.HasPrefix(op, "@") {
			_, op, _ = strings.Cut(strings.TrimSpace(line), " ")
			op, _, _ = strings.Cut(op, " ")
		}
		switch {
		case op == "ld.global.nc.u32":
			words++
		case op == "ld.global.nc.f32" && !c.PreloadCoherent, op == "ld.global.f32" && c.PreloadCoherent:
			floats++
		case strings.HasPrefix(op, "ld.global"):
			t.Fatalf("%s: %s before the wait:\n%s", c.Load, line, before)
		}
	}
	if words != mask+seq || floats != vecs*per+scalars {
		t.Fatalf("%s: %d control words and %d floats loaded before the wait, want %d + %d (mask, slot) and %d vectors of %d elements and %d scalars:\n%s",
			c.Load, words, floats, mask, seq, vecs, per, scalars, before)
	}
	args := gemmaRowArgs(rng, c, testRows)
	if len(c.ResidOps) > 0 && c.ResidOps[0].ScalStride > 0 {
		// The per-slot table (alpha of slots 0-2) and each row's slot. With the gates, each
		// slot's threshold and layer word follow its alpha: of the rows with the app, only
		// row 2 (slot 1: its gate value 0.2 above 0.1, the layer on) is steered, where slot
		// 0's threshold or layer word would leave it alone.
		table := []float32{1.5, 0, -2, 0, 0.5, 0}
		if c.ResidOps[0].ScalStride == 3 {
			on := math.Float32frombits(1)
			table = []float32{1.5, 0.5, 0, -2, 0.1, on, 0.5, 0.9, on}
		}
		byName := map[string]targ{"ctl_seq": {name: "ctl_seq", u32: []uint32{2, 0, 1, 1, 0}[:testRows]},
			"mi0_scal": {name: "mi0_scal", f32: table}}
		for _, a := range args {
			if _, set := byName[a.name]; !set {
				byName[a.name] = a
			}
		}
		args = args[:0]
		for _, name := range paramNames(k) {
			args = append(args, byName[name])
		}
	}
	checkKernel(t, k, c.Launch(testRows), args)
}
