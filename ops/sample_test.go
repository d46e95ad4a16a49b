package ops

import (
	"math"
	"math/rand/v2"
	"sort"
	"testing"
)

func runSample(t *testing.T, vocab, nt int, logits, temp, topP []float32, rng []uint32) []uint32 {
	t.Helper()
	run, err := Build("sample", EncodeAttrs(SampleAttrs{Vocab: vocab}))
	if err != nil {
		t.Fatal(err)
	}
	out := fwdU32Arg(make([]uint32, len(temp)))
	args := []Arg{fwdF32Arg(logits), fwdF32Arg(temp), fwdF32Arg(topP), fwdU32Arg(rng), out}
	if err := run.Run(args, Launch{Grid: [3]int{len(temp), 1, 1}, Block: [3]int{nt, 1, 1}}); err != nil {
		t.Fatal(err)
	}
	return out.U32()
}

func TestSampleGreedyLowestIndexWins(t *testing.T) {
	logits := []float32{1, 5, 2, 5, -1, 0, 5, 3}
	got := runSample(t, 8, 32, logits, []float32{0}, []float32{0.5}, []uint32{12345})
	if got[0] != 1 {
		t.Errorf("argmax = %d, want 1", got[0])
	}
}

// sortNucleus is the textbook sampler: sort by probability, keep the smallest prefix whose
// mass reaches topP, renormalise. It returns each token's probability of being drawn.
func sortNucleus(logits []float32, temp, topP float64) []float64 {
	m := math.Inf(-1)
	for _, l := range logits {
		m = math.Max(m, float64(l))
	}
	p := make([]float64, len(logits))
	var z float64
	for i, l := range logits {
		p[i] = math.Exp((float64(l) - m) / temp)
		z += p[i]
	}
	idx := make([]int, len(p))
	for i := range idx {
		idx[i] = i
		p[i] /= z
	}
	sort.SliceStable(idx, func(a, b int) bool { return p[idx[a]] > p[idx[b]] })
	out := make([]float64, len(p))
	var mass float64
	for _, i := range idx {
		out[i] = p[i]
		mass += p[i]
		if topP > 0 && topP < 1 && mass >= topP {
			break
		}
	}
	for i := range out {
		out[i] /= mass
	}
	return out
}

// TestSampleMatchesSortedNucleus draws with evenly spaced rng values, so the frequency of
// each token must match the sort-based sampler's probability to within about 1/draws.
func TestSampleMatchesSortedNucleus(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	const vocab, draws = 300, 4000
	logits := make([]float32, vocab)
	for i := range logits {
		logits[i] = float32(r.NormFloat64() * 2)
	}
	// Clear gaps around the nucleus boundary: the top tokens stand well apart.
	for i, l := range []float32{9, 8, 7.2, 6.5} {
		logits[40*i+3] = l
	}
	for _, c := range []struct{ temp, topP float32 }{{1, 0.9}, {0.7, 0.5}, {1.3, 1}, {1, 0}} {
		want := sortNucleus(logits, float64(c.temp), float64(c.topP))
		temp, topP, rng := make([]float32, draws), make([]float32, draws), make([]uint32, draws)
		all := make([]float32, 0, draws*vocab)
		for i := range draws {
			temp[i], topP[i] = c.temp, c.topP
			rng[i] = uint32((uint64(i)<<32 + 1<<31) / draws)
			all = append(all, logits...)
		}
		got := runSample(t, vocab, 64, all, temp, topP, rng)
		freq := make([]float64, vocab)
		for _, tok := range got {
			freq[tok] += 1.0 / draws
		}
		var dev float64
		kept := 0
		for i := range freq {
			if want[i] > 0 {
				kept++
			}
			if want[i] == 0 && freq[i] > 0 {
				t.Errorf("%+v: token %d (outside the nucleus) drawn", c, i)
			}
			dev += math.Abs(freq[i] - want[i])
		}
		// Stratified draws put each kept token's frequency within one draw of its
		// probability; the threshold search's resolution adds far less here.
		if dev > float64(kept+1)/draws {
			t.Errorf("%+v: total variation %g from the sort-based sampler", c, dev/2)
		}
	}
}

func TestSampleRejectsBadBlock(t *testing.T) {
	run, err := Build("sample", EncodeAttrs(SampleAttrs{Vocab: 4}))
	if err != nil {
		t.Fatal(err)
	}
	args := []Arg{fwdF32Arg(make([]float32, 4)), fwdF32Arg([]float32{1}), fwdF32Arg([]float32{1}), fwdU32Arg([]uint32{0}), fwdU32Arg([]uint32{0})}
	if err := run.Run(args, Launch{Grid: [3]int{1, 1, 1}, Block: [3]int{48, 1, 1}}); err == nil {
		t.Error("block of 48 threads accepted")
	}
}

// TestSampleLogprobsRefuses: attributes out of range and a sample asking more top tokens
// than the kernel reports are refused.
func TestSampleLogprobsRefuses(t *testing.T) {
	for _, a := range []SampleAttrs{{Vocab: 4, Logprobs: 5}, {Vocab: 100, Logprobs: MaxLogprobs + 1}, {Vocab: 4, EOS: []int{4}}, {Vocab: 1 << 24}} {
		if _, err := Build("sample", EncodeAttrs(a)); err == nil {
			t.Errorf("%+v accepted", a)
		}
	}
	run, err := Build("sample", EncodeAttrs(SampleAttrs{Vocab: 8, Logprobs: 2}))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		k  uint32
		ok bool
	}{{3, true}, {4, false}} {
		args := []Arg{fwdF32Arg(make([]float32, 8)), fwdF32Arg([]float32{0}), fwdF32Arg([]float32{1}), fwdU32Arg([]uint32{0}),
			fwdU32Arg([]uint32{0}), fwdU32Arg([]uint32{c.k}), fwdF32Arg(make([]float32, 5))}
		if err := run.Run(args, Launch{Grid: [3]int{1, 1, 1}, Block: [3]int{32, 1, 1}}); (err == nil) != c.ok {
			t.Errorf("lp_k %d: %v", c.k, err)
		}
	}
}
