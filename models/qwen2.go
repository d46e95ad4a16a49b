package models

import (
	"xmix/frontend"
	"xmix/ir"
)

// qwen2 is Qwen2ForCausalLM: Llama's forward with biases on the q, k and v projections
// (model.layers.l.self_attn.{q,k,v}_proj.bias). The biases are added in the rotation kernel,
// after the projection, so hooks attn.q, attn.k and attn.v would see unbiased values: they
// are refused.
func qwen2(b *ir.Builder, m *frontend.Model) *ir.Graph {
	const why = "the q/k/v biases are added after this hook, in the rotation kernel: hook attn.z or a residual hook instead"
	for _, h := range []string{"attn.q", "attn.k", "attn.v"} {
		b.Refuse(h, why)
	}
	return decoder(b, m, attnOptions{bias: true}, swiGLU)
}
