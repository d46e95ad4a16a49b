package codegen

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"xmix/bundle"

	"xmix/ptx"
)

// TestMIPerRequestControl runs, emulated and on the reference, a kernel whose ops read a
// per-sequence scalar table (alpha and an activation threshold per sequence slot) and test
// after_token latch bits, and checks exactly which rows each op changed and by how much.
func TestMIPerRequestControl(t *testing.T) {
	const w, stride, seqs = 200, 2, 2
	rng := rand.New(rand.NewPCG(31, 32))
	// Row r runs sequence seq[r]; slot 2 is the padding sequence.
	seq := []uint32{0, 0, 1, 2, 1}
	latch := []uint32{0b10, 0b11, 0b10, 0b10, 0b01}
	gate := []float32{0.8, 0.8, 0.95, 0.8, 0.8}
	table := []float32{1.5, 0.5, -3, 0.9, 7, 7} // per slot: alpha, threshold
	steer := MIOp{Template: "steer_add", Bit: testBit, Width: w, Vec: "v", Scal: "s", Alpha: 0, Bias: -1,
		ScalStride: stride, ScalRows: seqs + 1,
		Gates: []Gate{{Kind: "activation", Buf: "g", Width: 1, Cmp: ">", Thresh: 2}}}
	latched := MIOp{Template: "scale", Bit: testBit, Width: w, Vec: "s2", Scal: "s", Alpha: 0, Bias: -1,
		ScalStride: stride, ScalRows: seqs + 1, Gates: []Gate{{Kind: "after_token", Latch: 1}}}
	c := MIKernelConfig{Width: w, Stride: w, Ops: []MIOp{steer, latched}}
	k, err := MIKernel("per_request", c)
	if err != nil {
		t.Fatal(err)
	}
	names := paramNames(k)
	wantNames := []string{"x", "ctl_mask", "ctl_seq", "ctl_latch", "mi0_vec", "mi0_scal", "mi0_g0", "mi1_scal"}
	if len(names) != len(wantNames) {
		t.Fatalf("params %v, want %v", names, wantNames)
	}
	for i := range names {
		if names[i] != wantNames[i] {
			t.Fatalf("params %v, want %v", names, wantNames)
		}
	}
	x := randF32(rng, testRows*w, 1)
	v := randF32(rng, w, 1)
	args := []targ{{name: "x", f32: x, out: len(x)}, {name: "ctl_mask", u32: testMask},
		{name: "ctl_seq", u32: seq}, {name: "ctl_latch", u32: latch},
		{name: "mi0_vec", f32: v}, {name: "mi0_scal", f32: table}, {name: "mi0_g0", f32: gate},
		{name: "mi1_scal", f32: table}}
	l := c.Launch(testRows)
	checkKernel(t, k, l, args)
	got := emulate(t, k, l, args)[0]
	var changed int
	for r := range testRows {
		on := testMask[r]>>testBit&1 == 1
		alpha, thresh := table[seq[r]*stride], table[seq[r]*stride+1]
		steered := on && gate[r] > thresh
		scaled := on && latch[r]&0b10 != 0
		if steered || scaled {
			changed++
		}
		for i := range w {
			want := x[r*w+i]
			if steered {
				want += float32(alpha * v[i]) // rounded apart, as the kernel promises
			}
			if scaled {
				want *= alpha
			}
			if math.Float32bits(got[r*w+i]) != math.Float32bits(want) {
				t.Fatalf("row %d [%d] (seq %d, steered %v, scaled %v): %v, want %v", r, i, seq[r], steered, scaled, got[r*w+i], want)
			}
		}
	}
	if changed != 2 {
		t.Fatalf("%d rows changed, want 2: the test covers less than it should", changed)
	}
}

// TestMIPerRequestVectors runs, emulated and on the reference, kernels whose ops read a
// per-request vector: a row whose ctl_vslot names a slot reads that slot of the pool, a row
// with bundle.NoRow reads the compiled vector, bit for bit as a kernel without a pool does;
// the steer also has a per-request layer mask, a bit of its row's scalar table row.
func TestMIPerRequestVectors(t *testing.T) {
	const w, slots = 200, 2
	rng := rand.New(rand.NewPCG(41, 42))
	vslot := []uint32{1, bundle.NoRow, bundle.NoRow, 0, 0}
	seq := []uint32{0, 0, 2, 1, 1}
	on, off := math.Float32frombits(1<<5), math.Float32frombits(1<<4)
	table := []float32{1.5, on, -2, off, 0.5, on} // per slot: alpha, layer-mask word
	steer := MIOp{Template: "steer_add", Bit: testBit, Width: w, Vec: "v", Pool: "vp", PoolSlots: slots, Scal: "s",
		Alpha: 0, Bias: -1, ScalStride: 2, ScalRows: 3, Gates: []Gate{{Kind: "layers", Word: 1, Bit: 5}}}
	proj := MIOp{Template: "project_out", Bit: testBit, Width: w, Vec: "d", Pool: "dp", PoolSlots: slots, Alpha: -1, Bias: -1}
	plain := MIOp{Template: "steer_add", Bit: testBit, Width: w, Vec: "v", Scal: "s", Alpha: 0, Bias: -1, ScalStride: 2, ScalRows: 3}
	x := randF32(rng, testRows*w, 1)
	v, vPool := randF32(rng, w, 1), randF32(rng, slots*w, 1)
	d := unitF32(randF32(rng, w, 1))
	dPool := append(unitF32(randF32(rng, w, 1)), unitF32(randF32(rng, w, 1))...)

	c := MIKernelConfig{Width: w, Stride: w, Ops: []MIOp{steer, proj}}
	k := must(t)(MIKernel("per_request_vectors", c))
	wantNames := []string{"x", "ctl_mask", "ctl_seq", "ctl_vslot", "mi0_vec", "mi0_pool", "mi0_scal", "mi1_vec", "mi1_pool"}
	if names := paramNames(k); fmt.Sprint(names) != fmt.Sprint(wantNames) {
		t.Fatalf("params %v, want %v", names, wantNames)
	}
	args := []targ{{name: "x", f32: x, out: len(x)}, {name: "ctl_mask", u32: testMask}, {name: "ctl_seq", u32: seq},
		{name: "ctl_vslot", u32: vslot}, {name: "mi0_vec", f32: v}, {name: "mi0_pool", f32: vPool}, {name: "mi0_scal", f32: table},
		{name: "mi1_vec", f32: d}, {name: "mi1_pool", f32: dPool}}
	l := c.Launch(testRows)
	checkKernel(t, k, l, args)
	got := emulate(t, k, l, args)[0]
	for r := range testRows {
		row := x[r*w : (r+1)*w]
		want := append([]float32(nil), row...)
		if testMask[r]>>testBit&1 == 1 {
			sv, sd := v, d
			if vslot[r] != bundle.NoRow {
				sv, sd = vPool[vslot[r]*w:(vslot[r]+1)*w], dPool[vslot[r]*w:(vslot[r]+1)*w]
			}
			if s := seq[r]; math.Float32bits(table[2*s+1])&(1<<5) != 0 {
				for i := range want {
					want[i] += float32(table[2*s] * sv[i])
				}
			}
			var p float64
			for i := range want {
				p += float64(want[i]) * float64(sd[i])
			}
			for i := range want {
				want[i] -= float32(float32(p) * sd[i])
			}
		}
		if e := relL2(f64s(got[r*w:(r+1)*w]), f64s(want)); e > 1e-6 {
			t.Fatalf("row %d (slot %d, seq %d): relative error %g", r, vslot[r], seq[r], e)
		}
	}

	// A row without a slot gets exactly the bits of the same op compiled without a pool.
	bare := MIKernelConfig{Width: w, Stride: w, Ops: []MIOp{plain}}
	bk := must(t)(MIKernel("compiled_vector", bare))
	one := MIKernelConfig{Width: w, Stride: w, Ops: []MIOp{func() MIOp { o := steer; o.Gates = nil; return o }()}}
	pk := must(t)(MIKernel("pooled_vector", one))
	gotBare := emulate(t, bk, l, []targ{{name: "x", f32: x, out: len(x)}, {name: "ctl_mask", u32: testMask}, {name: "ctl_seq", u32: seq},
		{name: "mi0_vec", f32: v}, {name: "mi0_scal", f32: table}})[0]
	gotPool := emulate(t, pk, l, []targ{{name: "x", f32: x, out: len(x)}, {name: "ctl_mask", u32: testMask}, {name: "ctl_seq", u32: seq},
		{name: "ctl_vslot", u32: vslot}, {name: "mi0_vec", f32: v}, {name: "mi0_pool", f32: vPool}, {name: "mi0_scal", f32: table}})[0]
	for i := 2 * w; i < 3*w; i++ { // row 2: the app, no slot
		if math.Float32bits(gotPool[i]) != math.Float32bits(gotBare[i]) {
			t.Fatalf("row without a slot, element %d: %v, compiled-vector kernel %v", i-2*w, gotPool[i], gotBare[i])
		}
	}
}

// TestLogitsMIPerRequestVector: the logits kernel spreads a row over blocks and addresses
// the pool slot from each block's first column like the compiled vector.
func TestLogitsMIPerRequestVector(t *testing.T) {
	const vocab, n, rows, slots = 3000, 3, 4, 3
	r := rand.New(rand.NewPCG(47, 48))
	steer := MIOp{Template: "steer_add", Bit: 1, Width: vocab, Vec: "v", Pool: "vp", PoolSlots: slots, Scal: "s",
		Alpha: 0, Bias: -1, ScalStride: 1, ScalRows: 2}
	c := LogitsMIConfig{Vocab: vocab, Ops: []MIOp{steer}}
	k := must(t)(LogitsMI("logits_mi_pool", c))
	x := randF32(r, n*vocab, 3)
	v, pool := randF32(r, vocab, 1), randF32(r, slots*vocab, 1)
	args := []targ{{name: "x", f32: x, out: len(x)}, {name: "s_row", u32: []uint32{3, 0, 2}},
		{name: "ctl_mask", u32: []uint32{0, 0, 2, 2}}, {name: "ctl_seq", u32: []uint32{0, 1, 1, 0}},
		{name: "ctl_vslot", u32: []uint32{bundle.NoRow, 0, bundle.NoRow, 2}},
		{name: "mi0_vec", f32: v}, {name: "mi0_pool", f32: pool}, {name: "mi0_scal", f32: []float32{0.5, 2}}}
	checkKernel(t, k, c.Launch(n), args)
	gx := emulate(t, k, c.Launch(n), args)[0]
	for i := range vocab {
		if want := x[i] + float32(0.5*pool[2*vocab+i]); gx[i] != want { // sample 0: row 3, slot 2
			t.Fatalf("sample 0 logit %d: %v, want exactly %v", i, gx[i], want)
		}
		if want := x[2*vocab+i] + float32(2*v[i]); gx[2*vocab+i] != want { // sample 2: row 2, no slot
			t.Fatalf("sample 2 logit %d: %v, want exactly %v", i, gx[2*vocab+i], want)
		}
		if gx[vocab+i] != x[vocab+i] {
			t.Fatalf("sample 1 (row 0, app off) logit %d changed", i)
		}
	}
}

// TestRouterPerRequestBias: router_bias reads its request's slot too (and counts where it
// fired).
func TestRouterPerRequestBias(t *testing.T) {
	const hidden, E, topK, slots = 64, 8, 2, 2
	rng := rand.New(rand.NewPCG(49, 50))
	x := randF32(rng, testRows*hidden, 1)
	w := randF32(rng, E*hidden, 0.5)
	bias, pool := make([]float32, E), make([]float32, slots*E)
	bias[E-1], pool[0], pool[E+1] = 100, 100, 100 // default: expert E-1; slot 0: expert 0; slot 1: expert 1
	op := MIOp{Template: "router_bias", Bit: testBit, Width: E, Vec: "b", Pool: "bp", PoolSlots: slots, Scal: "s", Alpha: 0, Bias: -1,
		Fired: "f", FiredWidth: 4}
	rc := RouterConfig{Hidden: hidden, Experts: E, TopK: topK, WDtype: ptx.F32, Ops: []MIOp{op}}
	k := must(t)(Router("router_pool", rc))
	vslot := testVSlot
	args := routerArgs(t, k, x, w, ptx.F32, testRows, topK, map[string][]float32{"mi0_vec": bias, "mi0_pool": pool, "mi0_scal": {1}})
	l := rc.Launch(testRows)
	checkKernel(t, k, l, args)
	idx := emulate(t, k, l, args)[2]
	for r, want := range map[int]uint32{0: 1, 2: uint32(E - 1), 4: 0} { // rows with the app
		if got := math.Float32bits(idx[r*topK]); got != want {
			t.Fatalf("row %d (slot %d): first expert %d, want %d", r, vslot[r], got, want)
		}
	}
}

func f64s(v []float32) []float64 {
	out := make([]float64, len(v))
	for i, x := range v {
		out[i] = float64(x)
	}
	return out
}

// firedArg is an op's fired bytes for rows rows of width bytes (a multiple of 4), all 7 at
// first (untouched bytes keep it); compared as words.
func firedArg(name string, rows, width int) targ {
	v := make([]uint32, rows*width/4)
	for i := range v {
		v[i] = 0x07070707
	}
	return targ{name: name, u32: v, out: len(v), dtype: "u32"}
}

// firedByte is byte i of an emulated fired buffer.
func firedByte(v []float32, i int) byte { return byte(math.Float32bits(v[i/4]) >> (8 * (i % 4))) }

// TestMIFiredWords: an op with a fired byte writes, on every row with its app bit, 1 where
// it fired and 0 where its gate failed or a clamp found the projection inside its bounds;
// rows without the bit keep what they had. Emulated and on the reference, in the MI kernel,
// the gathered final norm (rows nobody samples are skipped), the logits kernel (one block
// of a row's many writes) and the sampler's overrides.
func TestMIFiredWords(t *testing.T) {
	const w, fw = 200, 4
	rng := rand.New(rand.NewPCG(51, 52))
	steer := MIOp{Template: "steer_add", Bit: testBit, Width: w, Vec: "v", Scal: "s", Alpha: 0, Bias: -1,
		Gates: []Gate{{Kind: "token_in", Tokens: []int{7}}}, Fired: "f", FiredCol: 0, FiredWidth: fw}
	clamp := MIOp{Template: "clamp_projection", Bit: testBit, Width: w, Vec: "d", Scal: "s", Alpha: 1, Bias: 2, Fired: "f", FiredCol: 1, FiredWidth: fw}
	capt := MIOp{Template: "capture", Bit: testBit, Width: w, Alpha: -1, Bias: -1, Out: "o", OutWidth: w, Fired: "f", FiredCol: 2, FiredWidth: fw}
	c := MIKernelConfig{Width: w, Stride: w, Ops: []MIOp{steer, clamp, capt}}
	k := must(t)(MIKernel("fired", c))
	x := randF32(rng, testRows*w, 0.2)
	d := unitF32(randF32(rng, w, 1))
	for i := range w { // rows 0 and 4 project far outside [-0.5, 0.5], row 2 inside
		x[i] += 3 * d[i]
		x[4*w+i] -= 3 * d[i]
	}
	args := []targ{{name: "x", f32: x, out: len(x)}, {name: "ctl_mask", u32: testMask}, {name: "ctl_tokens", u32: testTokens},
		{name: "mi0_vec", f32: randF32(rng, w, 1)}, {name: "mi0_scal", f32: []float32{1, -0.5, 0.5}}, firedArg("mi0_fired", testRows, fw),
		{name: "mi1_vec", f32: d}, {name: "mi1_scal", f32: []float32{1, -0.5, 0.5}}, firedArg("mi1_fired", testRows, fw),
		{name: "mi2_out", f32: make([]float32, testRows*w), out: testRows * w}, firedArg("mi2_fired", testRows, fw)}
	if fmt.Sprint(paramNames(k)) != "[x ctl_mask ctl_tokens mi0_vec mi0_scal mi0_fired mi1_vec mi1_scal mi1_fired mi2_out mi2_fired]" {
		t.Fatalf("params %v", paramNames(k))
	}
	l := c.Launch(testRows)
	checkKernel(t, k, l, args)
	got := emulate(t, k, l, args)
	// Rows 0, 2 and 4 have the app; their tokens are 7, 9, 8; row 2's projection is inside.
	want := map[int][]uint32{5: {1, 7, 0, 7, 0}, 8: {1, 7, 0, 7, 1}, 10: {1, 7, 1, 7, 1}}
	for arg, rows := range want {
		for r, v := range rows {
			if g := firedByte(got[arg], r*fw); uint32(g) != v {
				t.Fatalf("%s row %d: fired word %d, want %d", args[arg].name, r, g, v)
			}
		}
	}

	// The final norm's ops run on the rows it gathers (sampled rows) only.
	rc := RowConfig{Hidden: w, Eps: 1e-5, WDtype: ptx.F32, Load: "add", Gather: true,
		NormOps: []MIOp{func() MIOp { o := capt; o.Out, o.OutWidth = "o", w; return o }()}}
	rk := must(t)(RowNorm("final_fired", rc))
	rargs := rowNormArgs(rng, rc, testRows) // gathers rows 1 and 4 (row 4 with the app)
	checkKernel(t, rk, rc.Launch(testRows), rargs)
	rf := emulate(t, rk, rc.Launch(testRows), rargs)[len(rargs)-1]
	for r, v := range []uint32{7, 7, 7, 7, 1} {
		if g := firedByte(rf, r*fw); uint32(g) != v {
			t.Fatalf("final norm row %d: fired word %d, want %d", r, g, v)
		}
	}

	// The logits kernel spreads a row over blocks; the sampler's override writes its
	// sample's token row.
	const vocab, n = 3000, 3
	lsteer := MIOp{Template: "steer_add", Bit: 1, Width: vocab, Vec: "v", Scal: "s", Alpha: 0, Bias: -1, ScalStride: 1, ScalRows: 2,
		Gates: []Gate{{Kind: "positions", Positions: "generated"}}, Fired: "f", FiredWidth: 4}
	lc := LogitsMIConfig{Vocab: vocab, Ops: []MIOp{lsteer}}
	lk := must(t)(LogitsMI("logits_fired", lc))
	lmask, lgen, lseq, sRow := []uint32{2, 0, 2, 2}, []uint32{0, 0, 0xFFFFFFFF, 5}, []uint32{0, 1, 1, 0}, []uint32{3, 1, 2}
	largs := []targ{{name: "x", f32: randF32(rng, n*vocab, 3), out: n * vocab}, {name: "s_row", u32: sRow}, {name: "ctl_mask", u32: lmask},
		{name: "ctl_gen", u32: lgen}, {name: "ctl_seq", u32: lseq}, {name: "mi0_vec", f32: randF32(rng, vocab, 1)},
		{name: "mi0_scal", f32: []float32{0.5, 2}}, firedArg("mi0_fired", 4, 4)}
	checkKernel(t, lk, lc.Launch(n), largs)
	lf := emulate(t, lk, lc.Launch(n), largs)[7]
	for r, v := range []uint32{7, 7, 0, 1} { // rows 3 (generated) and 2 (prompt) are sampled with the app
		if g := firedByte(lf, 4*r); uint32(g) != v {
			t.Fatalf("logits row %d: fired word %d, want %d", r, g, v)
		}
	}
	ovr := MIOp{Template: "token_override", Bit: 1, Width: 1, Scal: "s", Alpha: 0, Bias: -1, ScalStride: 1, ScalRows: 2,
		Gates: []Gate{{Kind: "steps", From: 1, To: 9}}, Fired: "f", FiredWidth: 4}
	sc := SampleConfig{Vocab: 333, Overrides: []MIOp{ovr}}
	sk := must(t)(Sample("sample_fired", sc))
	sargs := []targ{{name: "logits", f32: randF32(rng, n*333, 4)}, {name: "temperature", f32: []float32{0, 0, 0}},
		{name: "top_p", f32: []float32{1, 1, 1}}, {name: "rng", u32: []uint32{1, 2, 3}}, {name: "out", out: n, dtype: "u32"},
		{name: "s_row", u32: sRow}, {name: "ctl_mask", u32: lmask}, {name: "ctl_gen", u32: lgen}, {name: "ctl_seq", u32: lseq},
		{name: "ovr0_scal", f32: []float32{42, 43}}, firedArg("ovr0_fired", 4, 4)}
	checkKernel(t, sk, sc.Launch(n), sargs)
	sf := emulate(t, sk, sc.Launch(n), sargs)[10]
	for r, v := range []uint32{7, 7, 0, 1} { // row 3: step 5; row 2: a prompt row
		if g := firedByte(sf, 4*r); uint32(g) != v {
			t.Fatalf("override row %d: fired word %d, want %d", r, g, v)
		}
	}
}
