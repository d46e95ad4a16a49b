package models

import (
	"xmix/frontend"
	"xmix/ir"
)

// gemma2 is Gemma2ForCausalLM: four RMSNorms a layer, each by (1 + w) (norm_offset), the
// attention's and the MLP's outputs normalised again before they are added; the embedding
// scaled by sqrt(hidden); GeGLU (tanh GELU) MLPs; attention scores scaled by
// query_pre_attn_scalar^-1/2 and soft-capped, over a sliding window on alternating layers;
// the LM head the embedding, its logits soft-capped. Hooks carry transformers' hidden
// states: resid_post is the layer's output, attn_out and mlp_out the post-normed deltas the
// residual adds (TransformerLens' hook_attn_out, hook_mlp_out), embed the scaled embedding.
//
//	x = embed_tokens(tokens) * sqrt(hidden)                                  hooks embed, L0.resid_pre
//	per layer l (model.layers.l.):
//	  x = x + post_attention_layernorm(o_proj(attention(rope(qkv_proj(input_layernorm(x))))))
//	                                                                         attn.q/k/v, attn.z, attn_out, resid_mid
//	  x = x + post_feedforward_layernorm(down_proj(gelu_tanh(gate_proj(h)) * up_proj(h))),
//	      h = pre_feedforward_layernorm(x)                                   mlp.act, mlp_out, resid_post
//	logits = softcap(embed_tokens^T · norm(x))                               final_norm, logits; sampled
func gemma2(b *ir.Builder, m *frontend.Model) *ir.Graph {
	rope := ropeTables(b, m)
	x := embed(b, m, m.EmbedScale())
	for l := range m.Layers {
		b.Layer(l)
		t := layerTensor(l)
		o := attnOptions{scale: float32(m.AttnScale()), softcap: float32(m.AttnSoftcap)}
		if w := m.AttnWindow(l); w < m.MaxSeqLen { // a window no sequence outgrows is none
			o.window = w
		}
		h := norm(b, m, "attn_norm", "attn_in", x, t+"input_layernorm.weight", "act.xn")
		a := norm(b, m, "attn_post_norm", "attn_out", attention(b, m, l, h, rope, o), t+"post_attention_layernorm.weight", ir.Delta)
		x = residual(b, "attn_residual", "resid_mid", x, b.Hook(a, "attn_out"))
		h = norm(b, m, "mlp_norm", "mlp_in", x, t+"pre_feedforward_layernorm.weight", "act.xn")
		f := norm(b, m, "mlp_post_norm", "mlp_out", gatedMLP(b, m, l, h, frontend.ActGeluTanh), t+"post_feedforward_layernorm.weight", ir.Delta)
		x = residual(b, "mlp_residual", "resid_post", x, b.Hook(f, "mlp_out"))
		if l+1 < m.Layers {
			b.HookAt(x, "resid_pre", l+1)
		}
	}
	head(b, m, x)
	return b.G
}
