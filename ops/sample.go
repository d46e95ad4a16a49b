package ops

import (
	"fmt"
	"math"
)

func init() { Register("sample", buildSample) }

// SampleAttrs configures op "sample": one token per sample from logits [samples, Vocab]
// (parameters logits, temperature, top_p, rng, out). Samples come from Grid[0] and the block
// size (Block[0], a multiple of 32) fixes the summation order, as in the kernel.
type SampleAttrs struct {
	Vocab int `json:"vocab"`
}

// The nucleus threshold is searched on y = (logit-max)/T*log2(e), the log2 of a token's
// probability relative to the most likely one: SampleIters bisection steps over
// [SampleFloor, 0]. Tokens below SampleFloor (relative probability under 2^-48) are outside
// every nucleus narrower than the whole vocabulary.
const (
	SampleIters = 20
	SampleFloor = -48
	Log2E       = float32(math.Log2E)
)

// Exp2 is the f32 2^x that the sampler's probabilities use (ex2.approx in the kernel).
func Exp2(x float32) float32 { return float32(math.Exp2(float64(x))) }

func buildSample(attrs []byte) (Runner, error) {
	var a SampleAttrs
	if err := DecodeAttrs(attrs, &a); err != nil {
		return nil, err
	}
	if a.Vocab <= 0 {
		return nil, fmt.Errorf("sample: vocab %d must be positive", a.Vocab)
	}
	return RunnerFunc(func(args []Arg, l Launch) error {
		n, nt := l.Grid[0], l.Block[0]
		if nt <= 0 || nt%32 != 0 || nt > 1024 {
			return fmt.Errorf("sample: block of %d threads, want a multiple of 32 up to 1024", nt)
		}
		if err := CheckArgs("sample", args, 4*n*a.Vocab, 4*n, 4*n, 4*n, 4*n); err != nil {
			return err
		}
		logits, temp, topP, rng, out := args[0].F32(), args[1].F32(), args[2].F32(), args[3].U32(), args[4].U32()
		ParallelFor(n, func(lo, hi int) {
			s := newSampler(a.Vocab, nt)
			for i := lo; i < hi; i++ {
				out[i] = uint32(s.sample(logits[i*a.Vocab:(i+1)*a.Vocab], temp[i], topP[i], rng[i]))
			}
		})
		return nil
	}), nil
}

// sampler holds the scratch of one worker. Every f32 sum is formed in exactly the order the
// kernel forms it (per-thread strided sums, warp butterfly, warps in order), so that the CPU
// and the emulated kernel pick the same token, not merely statistically similar ones.
type sampler struct {
	nt     int
	y, q   []float32
	part   []float32
	cand   []int
	vocab  int
	segLen int
}

func newSampler(vocab, nt int) *sampler {
	return &sampler{nt: nt, y: make([]float32, vocab), q: make([]float32, vocab),
		part: make([]float32, nt), vocab: vocab, segLen: (vocab + nt - 1) / nt}
}

func (s *sampler) sample(logits []float32, temp, topP float32, rng uint32) int {
	if !(temp > 0) {
		return argmax(logits)
	}
	m := float32(math.Inf(-1))
	for _, v := range logits {
		m = max(m, v)
	}
	c := float32(float32(1/temp) * Log2E)
	s.cand = s.cand[:0]
	for i, v := range logits {
		s.y[i] = float32(v-m) * c
		s.q[i] = Exp2(s.y[i])
		s.cand = append(s.cand, i)
	}
	thr := float32(math.Inf(-1))
	if topP > 0 && topP < 1 {
		target := topP * s.blockSum(math.Inf(-1))
		lo, hi := float32(SampleFloor), float32(0)
		s.keepAbove(lo)
		for range SampleIters {
			mid := (lo + hi) * 0.5
			if s.blockSum(float64(mid)) >= target {
				lo = mid
				s.keepAbove(lo)
			} else {
				hi = mid
			}
		}
		thr = lo
	}
	return s.pick(thr, rng)
}

// keepAbove drops candidates below thr: they add nothing to any later sum (adding +0 leaves
// an f32 sum unchanged), so skipping them keeps the kernel's order and result.
func (s *sampler) keepAbove(thr float32) {
	k := s.cand[:0]
	for _, i := range s.cand {
		if s.y[i] >= thr {
			k = append(k, i)
		}
	}
	s.cand = k
}

// blockSum is the kernel's block reduction of q over the candidates with y >= thr.
func (s *sampler) blockSum(thr float64) float32 {
	clear(s.part)
	for _, i := range s.cand {
		if float64(s.y[i]) >= thr {
			s.part[i%s.nt] += s.q[i]
		}
	}
	var acc float32
	for w := 0; w < s.nt; w += 32 {
		v := s.part[w : w+32]
		for off := 16; off > 0; off /= 2 {
			var next [32]float32
			for l := range next {
				next[l] = v[l] + v[l^off]
			}
			copy(v, next[:])
		}
		if w == 0 {
			acc = v[0]
		} else {
			acc += v[0]
		}
	}
	return acc
}

// pick draws u = rng/2^32 * kept mass and returns the first kept token whose inclusive
// prefix sum exceeds u. Like the kernel, it sums contiguous segments (one per thread), scans
// the segment sums serially, then walks the chosen segment; rounding that leaves no prefix
// above u falls back to the last token with mass.
func (s *sampler) pick(thr float32, rng uint32) int {
	kept := func(i int) float32 {
		if s.y[i] >= thr {
			return s.q[i]
		}
		return 0
	}
	var total float32
	for j := range s.nt {
		var sum float32
		for i := j * s.segLen; i < min(s.vocab, (j+1)*s.segLen); i++ {
			sum += kept(i)
		}
		s.part[j] = sum
		total += sum
	}
	u := float32(float32(rng)*0x1p-32) * total
	seg, base := 0, float32(0) // segment 0 and token 0 when nothing has mass (NaN logits)
	var run float32
	for j := range s.nt {
		prev := run
		run += s.part[j]
		if s.part[j] > 0 {
			seg, base = j, prev
		}
		if run > u {
			break
		}
	}
	if !(run > u) {
		u = float32(math.Inf(1))
	}
	last := 0
	for i := seg * s.segLen; i < min(s.vocab, (seg+1)*s.segLen); i++ {
		if w := kept(i); w > 0 {
			last = i
			base += w
			if base > u {
				return i
			}
		}
	}
	return last
}

// argmax returns the lowest index of the largest logit.
func argmax(v []float32) int {
	best := 0
	for i, x := range v {
		if x > v[best] {
			best = i
		}
	}
	return best
}
