package loader

import (
	"fmt"
	"math"

	"xmix/bundle"
)

// Sampler features a request sets through the control block: logprobs of the sampled
// token and its top alternatives (computed on the device by the sampler, only for samples
// that ask: ctl.logprobs), min_tokens (the sampler may not pick an EOS id before then:
// ctl.eos_ban) and ignore_eos (the engine does not stop at an EOS; as vLLM, it is sampled
// and fed back like any token).

// TokenLogprob is the log-probability of a generated token and, when asked, of the most
// likely tokens at its position, from the log-softmax of the logits the sampler saw
// (temperature 1; after logits-hook apps, before the min_tokens ban), as vLLM's default
// raw logprobs.
type TokenLogprob struct {
	Token   int          `json:"token"`
	Logprob float32      `json:"logprob"`
	Top     []TopLogprob `json:"top_logprobs,omitempty"`
}

// TopLogprob is one of a position's most likely tokens, by logprob descending (ties: the
// lower id).
type TopLogprob struct {
	Token   int     `json:"token"`
	Logprob float32 `json:"logprob"`
}

// initSampling checks the sampler's control and output buffers.
func (e *Engine) initSampling(bufs map[string]bundle.Buffer) error {
	k := e.cfg.Logprobs
	if k < 0 {
		return fmt.Errorf("bundle reports %d top logprobs", k)
	}
	if k > 0 {
		lk, lo := bufs[bundle.CtlLogprobs], bufs[bundle.OutLogprobs]
		if lk.Kind != bundle.KindControl || lk.Dtype != "u32" || len(lk.Shape) != 1 || lk.Shape[0] < e.maxS ||
			lo.Kind != bundle.KindOutput || lo.Dtype != "f32" || len(lo.Shape) != 2 || lo.Shape[0] < e.maxS || lo.Shape[1] != 1+2*k {
			return fmt.Errorf("bundle reports %d top logprobs but has no u32 control buffer %s and f32 output %s of [%d, %d]", k, bundle.CtlLogprobs, bundle.OutLogprobs, e.maxS, 1+2*k)
		}
	}
	if b, ok := bufs[bundle.CtlEOSBan]; ok {
		if b.Kind != bundle.KindControl || b.Dtype != "u32" || len(b.Shape) != 1 || b.Shape[0] < e.maxS {
			return fmt.Errorf("%s is not a u32 control buffer of %d samples", bundle.CtlEOSBan, e.maxS)
		}
		e.hasBan = true
	}
	return nil
}

// checkSampling validates a request's sampler fields.
func (e *Engine) checkSampling(r *Request) error {
	k := e.cfg.Logprobs
	switch {
	case r.TopLogprobs < 0 || r.TopLogprobs > k && k > 0:
		return invalid("top_logprobs", "top_logprobs %d: want 0 to %d", r.TopLogprobs, k)
	case (r.Logprobs || r.TopLogprobs > 0) && k == 0:
		return invalid("logprobs", "logprobs: this bundle was built without them (serving.max_logprobs: 0)")
	case r.MinTokens < 0 || r.MinTokens > max(0, r.MaxTokens):
		return invalid("min_tokens", "min_tokens %d: want 0 to max_tokens (%d)", r.MinTokens, r.MaxTokens)
	}
	return nil
}

// wantsLogprobs is a sample's ctl.logprobs word: 0, or 1 + how many top tokens.
func wantsLogprobs(r *Request) uint32 {
	if !r.Logprobs && r.TopLogprobs == 0 {
		return 0
	}
	return uint32(1 + r.TopLogprobs)
}

// readLogprobs reads the step's logprob rows (those of samples that asked hold this step's).
func (e *Engine) readLogprobs(ns int) ([]float32, error) {
	row := 1 + 2*e.cfg.Logprobs
	raw := e.scratch.lpBytes(4 * ns * row)
	if err := e.Be.Read(bundle.OutLogprobs, raw); err != nil {
		return nil, err
	}
	v := e.scratch.lpFloats(ns * row)
	decodeF32s(v, raw)
	return v, nil
}

// tokenLogprob builds the entry of the token sampled at sample i from the step's rows.
func (e *Engine) tokenLogprob(rows []float32, i, tok int, r *Request) TokenLogprob {
	k := e.cfg.Logprobs
	row := rows[i*(1+2*k) : (i+1)*(1+2*k)]
	lp := TokenLogprob{Token: tok, Logprob: row[0]}
	for j := range r.TopLogprobs {
		id := row[1+j]
		if !(id >= 0 && id < float32(e.cfg.Vocab)) || math.IsInf(float64(row[1+k+j]), -1) {
			break // fewer tokens than asked have any probability
		}
		lp.Top = append(lp.Top, TopLogprob{Token: int(id), Logprob: row[1+k+j]})
	}
	return lp
}
