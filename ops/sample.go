package ops

import (
	"fmt"
	"math"

	"xmix/bundle"
)

func init() {
	Register("sample", buildSample)
	Register("mi_samples", buildMISamples)
}

// SampleAttrs configures op "sample": one token per sample from logits [samples, Vocab]
// (parameters logits, temperature, top_p, rng, out). Samples come from Grid[0] and the block
// size (Block[0], a multiple of 32) fixes the summation order, as in the kernel. A sample
// whose logits are not all finite gets NonFinite instead of a token, greedy or not, and no
// override replaces it.
type SampleAttrs struct {
	Vocab int `json:"vocab"`
	// Logprobs > 0: after out come lp_k ([samples] u32: 0, or 1 + how many top tokens the
	// sample wants, at most Logprobs) and lp_out ([samples, LogprobRow()] f32). A sample
	// with lp_k > 0 gets, from the log-softmax of its logits as given (temperature 1, before
	// the EOS ban): its final token's logprob at column 0, then its lp_k-1 most likely
	// tokens by logit descending (ties: lower id; NaN never) as ids (f32) from column 1 and
	// their logprobs from column 1+Logprobs. Other samples' rows are left alone.
	Logprobs int `json:"logprobs,omitempty"`
	// EOS, when set, is the end-of-sequence ids: the kernel then takes eos_ban ([samples]
	// u32, after lp_out) and samples with those logits at -MaxFloat32 (the lowest finite value, which the non-finite check passes) where it is not 0 (a request
	// under min_tokens), leaving the logits as it found them.
	EOS []int `json:"eos,omitempty"`
	// Overrides are the token_override ops fused into the sampler (hook sampled). With any,
	// the kernel takes after out: s_row (each sample's token row, NoRow for unused samples),
	// ctl_mask, [ctl_tokens], [ctl_gen] (as MIControl says for their gates), ctl_seq,
	// [ctl_latch], then ovr<i>_scal (and ovr<i>_fired) per op; the control arrays are
	// indexed by token row.
	// Enabled ops replace the sample's token in order, so the last one wins.
	Overrides []TokenOverride `json:"overrides,omitempty"`
}

// TokenOverride replaces a sample's token by its app's scalar Scal[seq*ScalStride+Token]
// when the token row's mask has Bit and every gate holds. Fired > 0: the sampler also takes
// ovr<i>_fired after ovr<i>_scal and writes, on the token row of each sample whose row has
// Bit, 1 there when the override replaced the token and 0 when its gates failed (rows of
// Fired bytes, as MIOp.Fired).
type TokenOverride struct {
	Bit        int      `json:"bit"`
	Token      int      `json:"token"`
	ScalStride int      `json:"scal_stride"`
	ScalRows   int      `json:"scal_rows"`
	Gates      []MIGate `json:"gates,omitempty"`
	Fired      int      `json:"fired,omitempty"`
}

// Validate checks what the kernel relies on; activation gates would need the token row's
// reads and are not supported in the sampler.
func (o TokenOverride) Validate() error {
	if o.Bit < 0 || o.Bit > 31 {
		return fmt.Errorf("app bit %d outside 0..31", o.Bit)
	}
	if o.Token < 0 || o.ScalStride <= o.Token || o.ScalRows <= 0 {
		return fmt.Errorf("token scalar %d in a table of %d rows of %d", o.Token, o.ScalRows, o.ScalStride)
	}
	if o.Fired < 0 {
		return fmt.Errorf("fired rows of %d", o.Fired)
	}
	for j, g := range o.Gates {
		if g.Kind == "activation" {
			return fmt.Errorf("gate %d: activation gates are not supported in the sampler", j)
		}
		if err := g.validate(); err != nil {
			return fmt.Errorf("gate %d: %w", j, err)
		}
	}
	return nil
}

// OverrideControl says which optional control arrays a sampler with these overrides takes.
func OverrideControl(ovs []TokenOverride) (tokens, gen, latch bool) {
	shells := make([]MIOp, len(ovs))
	for i, o := range ovs {
		shells[i] = MIOp{Gates: o.Gates}
	}
	tokens, gen = MIControl(shells)
	_, latch, _ = MIRequestControl(shells)
	return tokens, gen, latch
}

// TokenID converts an override's f32 token to the u32 the sampler stores, as PTX
// cvt.rzi.u32.f32 does: toward zero, saturating, NaN to 0.
func TokenID(v float32) uint32 {
	switch {
	case !(v > 0):
		return 0
	case v >= 0x1p32:
		return math.MaxUint32
	}
	return uint32(v)
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
	if err := a.Check(); err != nil {
		return nil, err
	}
	return RunnerFunc(func(args []Arg, l Launch) error {
		n, nt := l.Grid[0], l.Block[0]
		if nt <= 0 || nt%32 != 0 || nt > 1024 {
			return fmt.Errorf("sample: block of %d threads, want a multiple of 32 up to 1024", nt)
		}
		sizes := []int{4 * n * a.Vocab, 4 * n, 4 * n, 4 * n, 4 * n}
		if a.Logprobs > 0 {
			sizes = append(sizes, 4*n, 4*n*a.LogprobRow())
		}
		if len(a.EOS) > 0 {
			sizes = append(sizes, 4*n)
		}
		if err := CheckArgs("sample", args[:min(len(sizes), len(args))], sizes...); err != nil {
			return err
		}
		override, err := a.bindOverrides(args[len(sizes):], n)
		if err != nil {
			return fmt.Errorf("sample: %w", err)
		}
		logits, temp, topP, rng, out := args[0].F32(), args[1].F32(), args[2].F32(), args[3].U32(), args[4].U32()
		var lpK, ban []uint32
		var lpOut []float32
		if a.Logprobs > 0 {
			lpK, lpOut = args[5].U32(), args[6].F32()
			for i, k := range lpK[:n] {
				if int64(k) > int64(a.Logprobs)+1 {
					return fmt.Errorf("sample: lp_k[%d] = %d, the kernel reports at most %d top tokens", i, k, a.Logprobs)
				}
			}
		}
		if len(a.EOS) > 0 {
			ban = args[len(sizes)-1].U32()
		}
		stats := make([]logprobStats, n)
		ParallelFor(n, func(lo, hi int) {
			s := newSampler(a.Vocab, nt)
			var banned []float32
			for i := lo; i < hi; i++ {
				row := logits[i*a.Vocab : (i+1)*a.Vocab]
				if lpK != nil && lpK[i] > 0 {
					stats[i] = a.logprobs(row, int(lpK[i])-1, nt, lpOut[i*a.LogprobRow():(i+1)*a.LogprobRow()])
				}
				if ban != nil && ban[i] != 0 {
					banned = append(banned[:0], row...)
					for _, e := range a.EOS {
						banned[e] = -math.MaxFloat32
					}
					row = banned
				}
				out[i] = s.sample(row, temp[i], topP[i], rng[i])
			}
		})
		override(out)
		for i := range lpK[:min(n, len(lpK))] {
			if lpK[i] > 0 {
				x := float32(math.Inf(-1))
				if int(out[i]) < a.Vocab {
					x = logits[i*a.Vocab+int(out[i])]
				}
				lpOut[i*a.LogprobRow()] = stats[i].logprob(x)
			}
		}
		return nil
	}), nil
}

// MaxLogprobs bounds SampleAttrs.Logprobs: the top tokens are picked in that many block-wide
// rounds over the vocabulary.
const MaxLogprobs = 64

// Ln2 is the f32 ln 2 the sampler turns log2 sums into natural logs with.
const Ln2 = float32(math.Ln2)

// Check validates the attributes.
func (a SampleAttrs) Check() error {
	if a.Vocab <= 0 || a.Vocab >= 1<<24 {
		return fmt.Errorf("sample: vocab %d: want 1 to 2^24-1 (ids are reported as f32)", a.Vocab)
	}
	if a.Logprobs < 0 || a.Logprobs > MaxLogprobs || a.Logprobs > a.Vocab {
		return fmt.Errorf("sample: %d top logprobs: want 0 to %d, at most the vocabulary", a.Logprobs, MaxLogprobs)
	}
	for _, e := range a.EOS {
		if e < 0 || e >= a.Vocab {
			return fmt.Errorf("sample: eos id %d outside the vocabulary of %d", e, a.Vocab)
		}
	}
	return nil
}

// LogprobRow is a row of lp_out: the final token's logprob, then Logprobs ids and logprobs.
func (a SampleAttrs) LogprobRow() int { return 1 + 2*a.Logprobs }

// logprobStats is what a sample's log-softmax needs: the max logit m (a NaN loses, as
// max.f32) and L = ln(sum of 2^((x-m) log2 e)), summed in the kernel's block order.
type logprobStats struct{ m, l float32 }

// logprob is x's log-probability, rounded as the kernel rounds it.
func (st logprobStats) logprob(x float32) float32 { return float32(x-st.m) - st.l }

// logprobs computes a sample's stats and writes its top k (ids, then logprobs) into lp.
func (a SampleAttrs) logprobs(row []float32, k, nt int, lp []float32) logprobStats {
	st := logprobStats{m: float32(math.Inf(-1))}
	for _, v := range row {
		if v > st.m {
			st.m = v
		}
	}
	part := make([]float32, nt)
	for i, v := range row {
		part[i%nt] += Exp2(float32(float32(v-st.m) * Log2E))
	}
	st.l = float32(float32(math.Log2(float64(blockTotal(part)))) * Ln2)
	ids, vals := TopK(row, k)
	for j := range k {
		lp[1+j], lp[1+a.Logprobs+j] = float32(ids[j]), st.logprob(vals[j])
	}
	return st
}

// blockTotal adds per-thread partial sums as the kernels' block reduction does: a butterfly
// within each warp of 32, then the warps' totals in order.
func blockTotal(part []float32) float32 {
	var acc float32
	for w := 0; w < len(part); w += 32 {
		v := part[w : w+32]
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

// bindOverrides takes the override arguments and returns what applies them to the sampled
// tokens of n samples.
func (a SampleAttrs) bindOverrides(args []Arg, n int) (func(out []uint32), error) {
	if len(a.Overrides) == 0 {
		if len(args) > 0 {
			return nil, fmt.Errorf("%d arguments past out, want none", len(args))
		}
		return func([]uint32) {}, nil
	}
	for i, o := range a.Overrides {
		if err := o.Validate(); err != nil {
			return nil, fmt.Errorf("override %d: %w", i, err)
		}
	}
	c := &argCursor{args: args}
	sr, err := c.take("s_row", 4*n)
	if err != nil {
		return nil, err
	}
	if len(args) < 2 {
		return nil, fmt.Errorf("missing ctl_mask")
	}
	rows := len(args[1].Mem) / 4 // control arrays hold every token row
	var ctl miCtl
	tokens, gen, latch := OverrideControl(a.Overrides)
	for _, x := range []struct {
		name string
		on   bool
		dst  *[]uint32
	}{{"ctl_mask", true, &ctl.mask}, {"ctl_tokens", tokens, &ctl.tokens}, {"ctl_gen", gen, &ctl.gen},
		{"ctl_seq", true, &ctl.seq}, {"ctl_latch", latch, &ctl.latch}} {
		if !x.on {
			continue
		}
		arg, err := c.take(x.name, 4*rows)
		if err != nil {
			return nil, err
		}
		*x.dst = arg.U32()[:rows]
	}
	scal := make([][]float32, len(a.Overrides))
	fired := make([][]byte, len(a.Overrides))
	for i, o := range a.Overrides {
		arg, err := c.take(fmt.Sprintf("ovr%d_scal", i), 4*o.ScalStride*o.ScalRows)
		if err != nil {
			return nil, err
		}
		scal[i] = arg.F32()
		if o.Fired > 0 {
			if arg, err = c.take(fmt.Sprintf("ovr%d_fired", i), (rows-1)*o.Fired+1); err != nil {
				return nil, err
			}
			fired[i] = arg.Mem
		}
	}
	if err := c.done(); err != nil {
		return nil, err
	}
	sRow := sr.U32()
	for i := range n {
		r := sRow[i]
		if r == bundle.NoRow {
			continue
		}
		if int(r) >= rows {
			return nil, fmt.Errorf("s_row[%d] = %d outside %d token rows", i, r, rows)
		}
		for j, o := range a.Overrides {
			if int(ctl.seq[r]) >= o.ScalRows {
				return nil, fmt.Errorf("override %d: sequence slot %d of token row %d outside %d scalar rows", j, ctl.seq[r], r, o.ScalRows)
			}
		}
	}
	return func(out []uint32) {
		for i := range n {
			r := sRow[i]
			if r == bundle.NoRow || out[i] == bundle.NonFinite {
				continue
			}
			for j, o := range a.Overrides {
				if ctl.mask[r]>>o.Bit&1 == 0 {
					continue
				}
				on := true
				for _, g := range o.Gates {
					on = on && g.holds(int(r), ctl, nil, nil)
				}
				if on {
					out[i] = TokenID(scal[j][int(ctl.seq[r])*o.ScalStride+o.Token])
				}
				if o.Fired > 0 {
					fired[j][int(r)*o.Fired] = 0
					if on {
						fired[j][int(r)*o.Fired] = 1
					}
				}
			}
		}
	}, nil
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

func (s *sampler) sample(logits []float32, temp, topP float32, rng uint32) uint32 {
	// The kernel adds x-x over the row, which is NaN as soon as one x is NaN or infinite.
	var bad float32
	for _, x := range logits {
		bad += x - x
	}
	if bad != bad {
		return bundle.NonFinite
	}
	if !(temp > 0) {
		return uint32(argmax(logits))
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
	return uint32(s.pick(thr, rng))
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
	return blockTotal(s.part)
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

// MISamplesAttrs are the attributes of op "mi_samples": elementwise MI ops (the logits hook)
// applied in place to x[sample*Width : +Width] for every sample of the grid (Grid[1]).
// Parameters: x, s_row (each sample's token row, NoRow for unused samples), then the
// control arrays and MI parameters as op "mi" takes them, indexed by token row: gates,
// scalars and reads see the token row the sample came from, so exported reads land in that
// row of their buffer.
type MISamplesAttrs struct {
	Width int    `json:"width"`
	Ops   []MIOp `json:"ops"`
}

// MIElementwise are the templates op mi_samples runs: none reduces over the row, so its
// kernel may spread a row over many blocks.
var MIElementwise = map[string]bool{"capture": true, "steer_add": true, "scale": true, "patch": true}

func buildMISamples(attrs []byte) (Runner, error) {
	var a MISamplesAttrs
	if err := DecodeAttrs(attrs, &a); err != nil {
		return nil, err
	}
	if a.Width <= 0 {
		return nil, fmt.Errorf("mi_samples: width %d", a.Width)
	}
	for i, o := range a.Ops {
		if !MIElementwise[o.Template] {
			return nil, fmt.Errorf("mi_samples: op %d: template %s is not elementwise", i, o.Template)
		}
	}
	return RunnerFunc(a.run), nil
}

func (a MISamplesAttrs) run(args []Arg, l Launch) error {
	n := l.Grid[1]
	c := &argCursor{args: args}
	x, err := c.take("x", 4*n*a.Width)
	if err != nil {
		return fmt.Errorf("mi_samples: %w", err)
	}
	sr, err := c.take("s_row", 4*n)
	if err != nil {
		return fmt.Errorf("mi_samples: %w", err)
	}
	if c.next >= len(args) {
		return fmt.Errorf("mi_samples: missing ctl_mask")
	}
	rows := len(args[c.next].Mem) / 4
	ctl, err := bindCtl(c, rows, a.Ops)
	if err != nil {
		return fmt.Errorf("mi_samples: %w", err)
	}
	bound, err := bindMI(c, rows, a.Width, 0, a.Ops)
	if err != nil {
		return fmt.Errorf("mi_samples: %w", err)
	}
	if err := c.done(); err != nil {
		return fmt.Errorf("mi_samples: %w", err)
	}
	xs, sRow := x.F32(), sr.U32()
	for i := range n {
		if r := sRow[i]; r != bundle.NoRow && int(r) >= rows {
			return fmt.Errorf("mi_samples: s_row[%d] = %d outside %d token rows", i, r, rows)
		}
	}
	// Samples come from distinct token rows, so parallel samples never write the same
	// output row.
	ParallelFor(n, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			if r := sRow[i]; r != bundle.NoRow {
				applyMI(bound, int(r), ctl, xs[i*a.Width:(i+1)*a.Width])
			}
		}
	})
	return nil
}
