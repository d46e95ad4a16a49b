package models

import (
	"xmix/frontend"
	"xmix/ir"
)

// llama is LlamaForCausalLM (and MistralForCausalLM, the same forward): pre-norm layers of
// attention and a SwiGLU MLP, each added to the residual stream.
//
//	x = embed_tokens(tokens)                                         hooks embed, L0.resid_pre
//	per layer l (model.layers.l.):
//	  x = x + o_proj(attention(rope(qkv_proj(input_layernorm(x)))))  attn.q/k/v, attn.z, attn_out, resid_mid
//	  x = x + down_proj(silu(gate_proj(h)) * up_proj(h)),
//	      h = post_attention_layernorm(x)                            mlp.act, mlp_out, resid_post (= L(l+1).resid_pre)
//	logits = lm_head(norm(x))                                        final_norm, logits; sampled
func llama(b *ir.Builder, m *frontend.Model) *ir.Graph {
	return decoder(b, m, attnOptions{}, swiGLU)
}

// swiGLU is the SiLU-gated MLP.
func swiGLU(b *ir.Builder, m *frontend.Model, l int, h *ir.Value) *ir.Value {
	return gatedMLP(b, m, l, h, "silu")
}

// decoder is the pre-norm decoder every family here shares, with the family's attention
// options and MLP block.
func decoder(b *ir.Builder, m *frontend.Model, o attnOptions, mlp func(*ir.Builder, *frontend.Model, int, *ir.Value) *ir.Value) *ir.Graph {
	rope := ropeTables(b, m)
	x := embed(b, m, 0)
	for l := range m.Layers {
		b.Layer(l)
		t := layerTensor(l)
		h := norm(b, m, "attn_norm", "attn_in", x, t+"input_layernorm.weight", "act.xn")
		x = residual(b, "attn_residual", "resid_mid", x, b.Hook(attention(b, m, l, h, rope, o), "attn_out"))
		h = norm(b, m, "mlp_norm", "mlp_in", x, t+"post_attention_layernorm.weight", "act.xn")
		x = residual(b, "mlp_residual", "resid_post", x, b.Hook(mlp(b, m, l, h), "mlp_out"))
		if l+1 < m.Layers {
			b.HookAt(x, "resid_pre", l+1)
		}
	}
	head(b, m, x)
	return b.G
}
