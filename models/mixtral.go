package models

import (
	"xmix/frontend"
	"xmix/ir"
)

// mixtral is MixtralForCausalLM: Llama's attention; each layer's MLP a mixture of experts
// routed top-k per token (model.layers.l.block_sparse_moe.gate, .experts.e.{w1,w3,w2}).
// The experts' activations are TopK rows per token, so there is no mlp.act hook yet.
func mixtral(b *ir.Builder, m *frontend.Model) *ir.Graph {
	b.Refuse("mlp.act", "a mixture-of-experts layer's activations are top-k rows per token: hook mlp_out or router_logits instead")
	return decoder(b, m, attnOptions{}, moeBlock)
}
