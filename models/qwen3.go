package models

import (
	"xmix/frontend"
	"xmix/ir"
)

// qwen3 is Qwen3ForCausalLM: Llama's forward with every q and k head RMS-normalised before
// the rotation (model.layers.l.self_attn.{q,k}_norm.weight, eps rms_norm_eps). Hooks attn.q
// and attn.k are the projection's output, before that norm.
func qwen3(b *ir.Builder, m *frontend.Model) *ir.Graph {
	return decoder(b, m, attnOptions{qkNorm: true}, swiGLU)
}
