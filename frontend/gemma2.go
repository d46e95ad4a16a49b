package frontend

import (
	"encoding/json"
	"fmt"
	"math"
)

// Gemma 2 (family gemma2, Hugging Face Gemma2ForCausalLM) is the Llama forward with
// GeGLU (tanh GELU) for SwiGLU, RMSNorm by (1 + w), post-attention and post-feedforward
// norms on the deltas, embeddings times sqrt(hidden), scores scaled by
// query_pre_attn_scalar^-1/2 and soft-capped, a sliding window on every other layer, and
// soft-capped final logits. The keys below are transformers' Gemma2Config names; a
// config.json without them gets Gemma2Config's defaults, as transformers would.

// gemma2DimsKeys are the dims: keys only family gemma2 takes.
var gemma2DimsKeys = []string{"query_pre_attn_scalar", "attn_logit_softcapping", "final_logit_softcapping", "sliding_window"}

// Gemma2Config's defaults (transformers configuration_gemma2.py).
const (
	gemma2QueryPreAttnScalar = 256
	gemma2AttnSoftcap        = 50
	gemma2FinalSoftcap       = 30
	gemma2SlidingWindow      = 4096
	gemma2RMSEps             = 1e-6
)

// gemma2Activations are the hidden_activation values that are GELU's tanh approximation
// (transformers' ACT2FN: gelu_pytorch_tanh, and gelu_new, the same formula).
var gemma2Activations = []string{"gelu_pytorch_tanh", "gelu_new"}

// Layer kinds of config.json's layer_types.
const (
	slidingAttention = "sliding_attention"
	fullAttention    = "full_attention"
)

// gemma2 sets what family gemma2 adds to the forward, from dims: (YAML) over config.json
// over Gemma2Config's defaults, and refuses gemma2's keys in other families' dims:.
func (p *parser) gemma2(top *mapping, m *Model, src *configSource) {
	if m.Family != "gemma2" {
		for _, k := range gemma2DimsKeys {
			if n := p.dimsEntry(top, k); n != nil && m.Family != "" {
				p.errorf(n, "only family gemma2 takes it", "dims.%s: family %s has no %s", k, m.Family, k)
			}
		}
		return
	}
	cfg, cfgPos := src.cfg, src.keyAt
	if cfg == nil {
		cfg = &HFConfig{}
	}
	m.Activation = ActGeluTanh
	m.NormOffset = 1
	m.PostNorms = true
	m.QueryPreAttnScalar = gemma2QueryPreAttnScalar
	m.AttnSoftcap, m.FinalSoftcap = gemma2AttnSoftcap, gemma2FinalSoftcap
	m.SlidingWindow = gemma2SlidingWindow
	if p.dimsEntry(top, "rms_eps") == nil && cfg.RMSNormEps == nil {
		m.RMSEps = gemma2RMSEps
	}
	// Gemma shares its embedding with the LM head unless a source says otherwise.
	if p.dimsEntry(top, "tie_embeddings") == nil && cfg.TieWordEmbeddings == nil {
		m.TieEmbeddings = true
	}

	if a := cfg.HiddenActivation; a != nil && !contains(gemma2Activations, *a) {
		p.errorAt(cfgPos, "Gemma 2's MLP is GeGLU with GELU's tanh approximation, gelu_pytorch_tanh",
			"config.json hidden_activation %q is not supported for family gemma2", *a)
	}
	if b := cfg.UseBidirectionalAttention; b != nil && *b {
		p.errorAt(cfgPos, "the forward is causal", "config.json use_bidirectional_attention: bidirectional attention is not supported")
	}
	if v := cfg.QueryPreAttnScalar; v != nil {
		if !(*v > 0) || *v > maxFloat32 {
			p.errorAt(cfgPos, "", "config.json query_pre_attn_scalar: must be positive, got %g", *v)
		} else {
			m.QueryPreAttnScalar = *v
		}
	}
	for _, c := range []struct {
		v    *float64
		key  string
		dest *float64
	}{{cfg.AttnSoftcap, "attn_logit_softcapping", &m.AttnSoftcap}, {cfg.FinalSoftcap, "final_logit_softcapping", &m.FinalSoftcap}} {
		switch {
		case c.v == nil:
		case !(*c.v >= 0) || *c.v > maxFloat32:
			p.errorAt(cfgPos, "null (no capping) or a positive number", "config.json %s: %g is not a cap", c.key, *c.v)
		default:
			*c.dest = *c.v
		}
	}
	if cfg.SlidingWindowGiven {
		m.SlidingWindow = 0 // null: no window
		if w := cfg.SlidingWindow; w != nil {
			if *w < 1 {
				p.errorAt(cfgPos, "null (no window) or a positive number of positions", "config.json sliding_window: %d", *w)
			} else {
				m.SlidingWindow = *w
			}
		}
	}

	// dims: keys, for specs without a config.json (or overriding it).
	if n := p.dimsEntry(top, "query_pre_attn_scalar"); n != nil {
		if v, ok := p.float32Number(n, "dims.query_pre_attn_scalar"); ok && !(v > 0) {
			p.errorf(n, "", "dims.query_pre_attn_scalar: must be positive, got %g", v)
		} else if ok {
			m.QueryPreAttnScalar = v
		}
	}
	for _, c := range []struct {
		key  string
		dest *float64
	}{{"attn_logit_softcapping", &m.AttnSoftcap}, {"final_logit_softcapping", &m.FinalSoftcap}} {
		n := p.dimsEntry(top, c.key)
		switch {
		case n == nil:
		case isNull(n):
			*c.dest = 0
		default:
			if v, ok := p.float32Number(n, "dims."+c.key); ok && !(v > 0) {
				p.errorf(n, "null for no capping", "dims.%s: must be positive, got %g", c.key, v)
			} else if ok {
				*c.dest = v
			}
		}
	}
	if n := p.dimsEntry(top, "sliding_window"); n != nil {
		if isNull(n) {
			m.SlidingWindow = 0
		} else if v, ok := p.positive(n, "dims.sliding_window"); ok {
			m.SlidingWindow = v
		}
	}

	m.SlidingLayers = nil
	if m.SlidingWindow == 0 || m.Layers < 1 || m.Layers > maxLayers {
		return
	}
	// Which layers slide: config.json's layer_types, else Gemma 2's alternation (layers 0,
	// 2, 4, ... slide; transformers' is_sliding = not layer_idx % 2).
	m.SlidingLayers = make([]bool, m.Layers)
	if lt := cfg.LayerTypes; lt != nil {
		if len(lt) != m.Layers {
			p.errorAt(cfgPos, "one entry per layer", "config.json layer_types has %d entries for %d layers", len(lt), m.Layers)
			return
		}
		for i, t := range lt {
			switch t {
			case slidingAttention:
				m.SlidingLayers[i] = true
			case fullAttention:
			default:
				p.errorAt(cfgPos, "use "+slidingAttention+" or "+fullAttention,
					"config.json layer_types[%d] %q is not supported for family gemma2", i, t)
			}
		}
		return
	}
	for i := range m.SlidingLayers {
		m.SlidingLayers[i] = i%2 == 0
	}
}

// ActGeluTanh is Model.Activation of a GeGLU MLP with GELU's tanh approximation.
const ActGeluTanh = "gelu_tanh"

// AttnScale is what attention scores are multiplied by: query_pre_attn_scalar^-1/2 (Gemma
// 2), else head_dim^-1/2.
func (m *Model) AttnScale() float64 {
	if m.QueryPreAttnScalar > 0 {
		return 1 / math.Sqrt(m.QueryPreAttnScalar)
	}
	return 1 / math.Sqrt(float64(m.HeadDim))
}

// AttnWindow is layer l's sliding window: how many of the last positions a row attends to,
// 0 for all of them.
func (m *Model) AttnWindow(l int) int {
	if l < len(m.SlidingLayers) && m.SlidingLayers[l] {
		return m.SlidingWindow
	}
	return 0
}

// EmbedScale is what the embedded rows are multiplied by (0: nothing): Gemma's sqrt(hidden),
// rounded to the model's dtype as transformers rounds its normalizer to the hidden states'
// dtype (sqrt(3584) = 59.87 becomes 59.75 in bf16; sqrt(2304) = 48 is exact).
func (m *Model) EmbedScale() float32 {
	if m.Family != "gemma2" {
		return 0
	}
	s := float32(math.Sqrt(float64(m.Hidden)))
	if m.Dtype == "bf16" {
		b := math.Float32bits(s)
		b = (b + 0x7fff + (b>>16)&1) &^ 0xffff // round to nearest even bf16
		s = math.Float32frombits(b)
	}
	return s
}

// softcapJSON decodes a soft-capping value of config.json: absent (nil: the default), null
// (0: no capping) or a number.
func softcapJSON(raw json.RawMessage) (*float64, error) {
	if len(raw) == 0 {
		return nil, nil
	}
	var v *float64
	if err := json.Unmarshal(raw, &v); err != nil {
		return nil, fmt.Errorf("%s is not a number or null", raw)
	}
	if v == nil {
		v = new(float64)
	}
	return v, nil
}
