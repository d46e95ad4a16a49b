package codegen

import (
	"math"
	"math/rand/v2"
	"testing"

	"xmix/bundle"
	"xmix/ir"
	"xmix/mi"
	"xmix/ops"
)

func TestSampleKernel(t *testing.T) {
	r := rand.New(rand.NewPCG(41, 42))
	// 36000 and 36003: the greedy and max passes' whole groups of quads, then one by one, and
	// (36003) the scalar pass of a vocabulary not a multiple of 4.
	for _, vocab := range []int{1, 100, 333, 2500, 9000, 36000, 36003} {
		c := SampleConfig{Vocab: vocab}
		k, err := Sample("sample_test", c)
		if err != nil {
			t.Fatal(err)
		}
		// Greedy, greedy with ties, keep-all, and nuclei of several widths and temperatures.
		temp := []float32{0, -1, 1, 0.7, 1, 1.5, 0.3, 1, 1}
		topP := []float32{1, 0.5, 1, 0.9, 0.5, 0.95, 0.8, 0, 0.999}
		n := len(temp)
		logits := randF32(r, n*vocab, 4)
		if vocab > 3 {
			logits[vocab+1], logits[vocab+2] = 10, 10 // a tie for sample 1
			logits[vocab-2], logits[5] = 11, 11       // sample 0's: its threads' last and first quads
		}
		rng := make([]uint32, n)
		for i := range rng {
			rng[i] = r.Uint32()
		}
		rng[2], rng[7] = 0xFFFFFFFF, 0 // the ends of the draw
		checkKernel(t, k, c.Launch(n), []targ{
			{name: "logits", f32: logits}, {name: "temperature", f32: temp}, {name: "top_p", f32: topP},
			{name: "rng", u32: rng}, {name: "out", out: n, dtype: "u32"},
		})
	}
}

// TestSampleNonFinite: a sample with a NaN or an infinite logit anywhere gets bundle.NonFinite,
// greedy or sampled, in the emulated kernel as in the reference op; its neighbours are
// sampled as ever, and an override enabled on the flagged sample does not hide it.
func TestSampleNonFinite(t *testing.T) {
	nan, inf := float32(math.NaN()), float32(math.Inf(1))
	r := rand.New(rand.NewPCG(47, 48))
	for _, vocab := range []int{1, 100, 2500} {
		// One sample per case: a bad value at the start, middle or end of the row.
		cases := []struct {
			temp, topP float32
			bad        float32
			at         int
		}{
			{0, 1, nan, vocab - 1}, {0, 1, inf, 0}, {0, 1, 0, 0}, {0, 1, -inf, vocab / 2},
			{1, 1, nan, vocab / 3}, {0.7, 0.9, inf, vocab - 1}, {0.7, 0.9, 0, 0}, {1, 0.5, -inf, 0},
		}
		n := len(cases)
		logits := randF32(r, n*vocab, 4)
		temp, topP, rng := make([]float32, n), make([]float32, n), make([]uint32, n)
		for i, c := range cases {
			temp[i], topP[i], rng[i] = c.temp, c.topP, r.Uint32()
			if c.bad != 0 {
				logits[i*vocab+c.at] = c.bad
			}
		}
		ovr := ir.MI{Op: mi.Op{Template: "token_override", Bit: 0, Width: 1, Alpha: 0, Bias: -1, ScalStride: 1, ScalRows: 1}, Scal: "s"}
		for _, sc := range []SampleConfig{{Vocab: vocab}, {Vocab: vocab, Overrides: []ir.MI{ovr}}} {
			k, err := Sample("sample_nonfinite", sc)
			if err != nil {
				t.Fatal(err)
			}
			args := []targ{
				{name: "logits", f32: logits}, {name: "temperature", f32: temp}, {name: "top_p", f32: topP},
				{name: "rng", u32: rng}, {name: "out", out: n, dtype: "u32"},
			}
			if len(sc.Overrides) > 0 { // every sample's row enables the override, token 5
				sRow, ones, zeros := make([]uint32, n), make([]uint32, n), make([]uint32, n)
				for i := range sRow {
					sRow[i], ones[i] = uint32(i), 1
				}
				args = append(args, targ{name: "s_row", u32: sRow}, targ{name: "ctl_mask", u32: ones},
					targ{name: "ctl_seq", u32: zeros}, targ{name: "ovr0_scal", f32: []float32{5}})
			}
			checkKernel(t, k, sc.Launch(n), args)
			got := emulate(t, k, sc.Launch(n), args)[4]
			for i, c := range cases {
				tok := math.Float32bits(got[i])
				switch {
				case c.bad != 0 && tok != bundle.NonFinite:
					t.Errorf("vocab %d sample %d (%v at %d): token %d, want bundle.NonFinite", vocab, i, c.bad, c.at, tok)
				case c.bad == 0 && (tok >= uint32(vocab)) && len(sc.Overrides) == 0:
					t.Errorf("vocab %d sample %d (finite): token %d", vocab, i, tok)
				case c.bad == 0 && len(sc.Overrides) > 0 && tok != 5:
					t.Errorf("vocab %d sample %d (finite, override): token %d, want 5", vocab, i, tok)
				}
			}
		}
	}
}

// TestSampleOverride: token_override replaces exactly the samples whose token row enables the
// app and passes the step window, with the token of the row's sequence; an unused sample
// (s_row NoRow) keeps what was sampled.
func TestSampleOverride(t *testing.T) {
	const vocab, n = 333, 5
	r := rand.New(rand.NewPCG(43, 44))
	ovr := ir.MI{Op: mi.Op{Template: "token_override", Bit: 2, Width: 1, Alpha: 1, Bias: -1, ScalStride: 2, ScalRows: 3, Gates: []mi.Gate{{Kind: "steps", From: 2, To: 4}}}, Scal: "s"}
	c := SampleConfig{Vocab: vocab, Overrides: []ir.MI{ovr}}
	k, err := Sample("sample_ovr", c)
	if err != nil {
		t.Fatal(err)
	}
	logits := randF32(r, n*vocab, 4)
	temp := []float32{0, 0.8, 0, 1, 0}
	topP := []float32{1, 0.9, 1, 1, 1}
	rng := []uint32{r.Uint32(), r.Uint32(), r.Uint32(), r.Uint32(), r.Uint32()}
	// Token rows: mask, generation step (-1: prompt) and sequence slot of each.
	mask := []uint32{1 << 2, 1 << 2, 0, 1<<2 | 1, 1 << 2, 1 << 2}
	gen := []uint32{2, 3, 2, 0xFFFFFFFF, 1, 4}
	seq := []uint32{0, 1, 2, 0, 1, 2}
	sRow := []uint32{1, 0, 2, bundle.NoRow, 4}
	table := []float32{0, 7, 0, 42, 0, 99} // per slot: (unused, token)
	args := []targ{
		{name: "logits", f32: logits}, {name: "temperature", f32: temp}, {name: "top_p", f32: topP},
		{name: "rng", u32: rng}, {name: "out", out: n, dtype: "u32"}, {name: "s_row", u32: sRow},
		{name: "ctl_mask", u32: mask}, {name: "ctl_gen", u32: gen}, {name: "ctl_seq", u32: seq}, {name: "ovr0_scal", f32: table},
	}
	checkKernel(t, k, c.Launch(n), args)
	got := emulate(t, k, c.Launch(n), args)[4]
	bare, err := Sample("sample_bare", SampleConfig{Vocab: vocab})
	if err != nil {
		t.Fatal(err)
	}
	want := emulate(t, bare, c.Launch(n), args[:5])[4]
	want[0], want[1] = math.Float32frombits(42), math.Float32frombits(7) // rows 1 (slot 1) and 0 (slot 0)
	for i := range want {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			t.Fatalf("sample %d: token %d, want %d", i, math.Float32bits(got[i]), math.Float32bits(want[i]))
		}
	}
}

// TestLogitsMI: the logits kernel over a row wider than a register-resident row allows
// steers exactly the samples whose token row enables the app, and captures into the token
// row's output row.
func TestLogitsMI(t *testing.T) {
	const vocab, n, rows = 40000, 3, 4
	r := rand.New(rand.NewPCG(45, 46))
	steer := ir.MI{Op: mi.Op{Template: "steer_add", Bit: 1, Width: vocab, Alpha: 0, Bias: -1, ScalStride: 1, ScalRows: 2}, Vec: "v", Scal: "s"}
	capt := ir.MI{Op: mi.Op{Template: "capture", Bit: 1, Width: vocab, Alpha: -1, Bias: -1, OutWidth: vocab, Gates: []mi.Gate{{Kind: "positions", Positions: "generated"}}}, Out: "o"}
	c := LogitsMIConfig{Vocab: vocab, Ops: []ir.MI{steer, capt}}
	k, err := LogitsMI("logits_mi", c)
	if err != nil {
		t.Fatal(err)
	}
	x := randF32(r, n*vocab, 3)
	v := randF32(r, vocab, 1)
	mask := []uint32{2, 0, 2, 2}
	gen := []uint32{0, 0, 0xFFFFFFFF, 5}
	seq := []uint32{0, 1, 1, 0}
	sRow := []uint32{3, 1, bundle.NoRow}
	out := make([]float32, rows*vocab)
	for i := range out {
		out[i] = -7 // untouched rows keep it
	}
	args := []targ{{name: "x", f32: x, out: len(x)}, {name: "s_row", u32: sRow}, {name: "ctl_mask", u32: mask},
		{name: "ctl_gen", u32: gen}, {name: "ctl_seq", u32: seq},
		{name: "mi0_vec", f32: v}, {name: "mi0_scal", f32: []float32{0.5, 2}}, {name: "mi1_out", f32: out, out: len(out)}}
	checkKernel(t, k, c.Launch(n), args)
	res := emulate(t, k, c.Launch(n), args)
	gx, gout := res[0], res[7]
	for i := range vocab {
		if want := x[i] + float32(0.5*v[i]); gx[i] != want { // sample 0: row 3, slot 0
			t.Fatalf("sample 0 logit %d: %v, want exactly %v", i, gx[i], want)
		}
		if gout[3*vocab+i] != gx[i] {
			t.Fatalf("row 3 capture %d: %v, want the steered %v", i, gout[3*vocab+i], gx[i])
		}
		for _, j := range []int{vocab + i, 2*vocab + i} {
			if gx[j] != x[j] {
				t.Fatalf("logit %d of a sample without the app changed", j)
			}
		}
		for _, row := range []int{0, 1, 2} {
			if gout[row*vocab+i] != -7 {
				t.Fatalf("capture wrote row %d", row)
			}
		}
	}
}

// TestSampleLogprobsAndBan: samples that ask get, from the logits as given, their token's
// logprob and their top tokens (ids by logit descending, ties to the lower id, and
// logprobs), emulated as the reference computes them and as log-softmax says; samples that do
// not ask leave their row alone. A banned sample never picks an EOS id, even where it is
// the largest logit, and the sampler leaves the logits as it found them.
func TestSampleLogprobsAndBan(t *testing.T) {
	const vocab, k = 2500, 4
	r := rand.New(rand.NewPCG(53, 54))
	eos := []int{5, 2000}
	c := SampleConfig{Vocab: vocab, Logprobs: k, EOS: eos}
	kern := must(t)(Sample("sample_lp", c))
	if names := paramNames(kern); len(names) != 8 || names[5] != "lp_k" || names[6] != "lp_out" || names[7] != "eos_ban" {
		t.Fatalf("params %v", names)
	}
	// Samples: greedy top 4; nucleus with the token's logprob only; not asking, banned;
	// greedy top 2, banned, where EOS 2000 is the largest logit; greedy top 2 with a tie at the top.
	temp := []float32{0, 0.8, 1, 0, 0}
	topP := []float32{1, 0.9, 1, 1, 1}
	n := len(temp)
	logits := randF32(r, n*vocab, 4)
	logits[3*vocab+2000], logits[3*vocab+7] = 50, 40
	logits[4*vocab+11], logits[4*vocab+3] = 30, 30
	lpK := []uint32{5, 1, 0, 3, 3}
	ban := []uint32{0, 0, 1, 1, 0}
	lpOut := make([]float32, n*(1+2*k))
	for i := range lpOut {
		lpOut[i] = -7
	}
	rng := []uint32{r.Uint32(), r.Uint32(), r.Uint32(), r.Uint32(), r.Uint32()}
	args := []targ{{name: "logits", f32: logits, out: len(logits)}, {name: "temperature", f32: temp}, {name: "top_p", f32: topP},
		{name: "rng", u32: rng}, {name: "out", out: n, dtype: "u32"}, {name: "lp_k", u32: lpK},
		{name: "lp_out", f32: lpOut, out: len(lpOut)}, {name: "eos_ban", u32: ban}}
	checkKernel(t, kern, c.Launch(n), args)
	res := emulate(t, kern, c.Launch(n), args)
	got, lp := res[4], res[6]
	for i, v := range logits {
		if res[0][i] != v {
			t.Fatalf("logit %d changed: %v, was %v", i, res[0][i], v)
		}
	}
	for s := range n {
		tok := int(math.Float32bits(got[s]))
		row := logits[s*vocab : (s+1)*vocab]
		if ban[s] != 0 && (tok == eos[0] || tok == eos[1]) {
			t.Fatalf("sample %d picked EOS %d while banned", s, tok)
		}
		out := lp[s*(1+2*k) : (s+1)*(1+2*k)]
		if lpK[s] == 0 {
			for _, v := range out {
				if v != -7 {
					t.Fatalf("sample %d did not ask but its row was written: %v", s, out)
				}
			}
			continue
		}
		var m float64 = math.Inf(-1)
		for _, v := range row {
			m = math.Max(m, float64(v))
		}
		var sum float64
		for _, v := range row {
			sum += math.Exp(float64(v) - m)
		}
		logSoftmax := func(v float32) float64 { return float64(v) - m - math.Log(sum) }
		if d := math.Abs(float64(out[0]) - logSoftmax(row[tok])); d > 1e-4 {
			t.Fatalf("sample %d: token %d logprob %v, log-softmax %v", s, tok, out[0], logSoftmax(row[tok]))
		}
		ids, _ := ops.TopK(row, int(lpK[s])-1)
		for j, id := range ids {
			if int(out[1+j]) != id || math.Abs(float64(out[1+k+j])-logSoftmax(row[id])) > 1e-4 {
				t.Fatalf("sample %d top %d: id %v logprob %v, want %d and %v", s, j, out[1+j], out[1+k+j], id, logSoftmax(row[id]))
			}
		}
	}
	if tok := math.Float32bits(got[3]); tok != 7 {
		t.Fatalf("banned greedy sample picked %d, want 7 (the largest non-EOS logit)", tok)
	}
	if int(lp[3*(1+2*k)+1]) != 2000 {
		t.Fatalf("the banned sample's top token is %v: logprobs are of the logits before the ban", lp[3*(1+2*k)+1])
	}
	if int(lp[4*(1+2*k)+1]) != 3 || int(lp[4*(1+2*k)+2]) != 11 {
		t.Fatalf("tie at the top: ids %v, want 3 then 11", lp[4*(1+2*k)+1:4*(1+2*k)+3])
	}
}
