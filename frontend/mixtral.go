package frontend

import (
	"fmt"

	"gopkg.in/yaml.v3"
)

// Mixture of experts (family mixtral, Hugging Face MixtralForCausalLM): every layer's MLP is
// Experts SwiGLU experts of Intermediate columns each, of which a router picks TopK per token.

// maxExperts bounds the experts a layer may have: the router kernel keeps a row's logits in
// one block and picks with one thread (ops.MaxExperts).
const maxExperts = 64

// defaultTopK is Mixtral's experts per token.
const defaultTopK = 2

// moe sets Experts and TopK: from dims.experts and dims.experts_per_token, else config.json's
// num_local_experts and num_experts_per_tok (cfg may be nil; cfgPos is where the spec names
// it). Only family mixtral has experts.
func (p *parser) moe(top *mapping, m *Model, cfg *HFConfig, cfgPos Pos) {
	experts, topK := p.dimsEntry(top, "experts"), p.dimsEntry(top, "experts_per_token")
	if m.Family != "mixtral" {
		for _, n := range []*yaml.Node{experts, topK} {
			if n != nil && m.Family != "" {
				p.errorf(n, "only family mixtral has experts", "dims: family %s has no experts", m.Family)
			}
		}
		return
	}
	var fromCfg struct{ Experts, TopK *int }
	if cfg != nil {
		fromCfg.Experts, fromCfg.TopK = cfg.NumLocalExperts, cfg.NumExpertsPerTok
	}
	m.TopK = defaultTopK
	expPos, topPos := cfgPos, cfgPos
	if fromCfg.Experts != nil {
		m.Experts = *fromCfg.Experts
	}
	if fromCfg.TopK != nil {
		m.TopK = *fromCfg.TopK
	}
	if experts != nil {
		expPos = p.pos(experts)
		if v, ok := p.positive(experts, "dims.experts"); ok {
			m.Experts = v
		}
	}
	if topK != nil {
		topPos = p.pos(topK)
		if v, ok := p.positive(topK, "dims.experts_per_token"); ok {
			m.TopK = v
		}
	}
	switch {
	case experts == nil && fromCfg.Experts == nil:
		at := p.pos(top.node)
		if d := top.get("dims"); d != nil {
			at = p.pos(p.owner(d))
		}
		p.errorAt(at, "add dims: {experts: 8}", "family mixtral: the number of experts is missing")
	case m.Experts < 1 || m.Experts > maxExperts:
		p.errorAt(expPos, fmt.Sprintf("at most %d experts per layer", maxExperts), "experts: %d is not supported", m.Experts)
	case m.TopK < 1 || m.TopK > m.Experts:
		p.errorAt(topPos, fmt.Sprintf("between 1 and the %d experts", m.Experts), "experts_per_token: %d is not supported", m.TopK)
	}
}

// dimsEntry returns the value of dims.<key>, or nil. dims: was checked by dims already.
func (p *parser) dimsEntry(top *mapping, key string) *yaml.Node {
	d := top.get("dims")
	if d == nil || d.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(d.Content); i += 2 {
		if d.Content[i].Value == key {
			return d.Content[i+1]
		}
	}
	return nil
}
