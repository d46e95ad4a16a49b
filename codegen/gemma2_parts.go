package codegen

import (
	"fmt"

	"xmix/bundle"
	"xmix/frontend"
)

// The parts of Gemma 2's forward (family gemma2): the Hugging Face tensor names, and what
// each kernel of the Llama forward takes on for Gemma. The template applies them to every
// family (each setter leaves other families' configs as they are); a per-family builder
// composes the same. The forward is the Llama one with these changes, in forward order:
//
//	embed:       RowNorm Load embed, EmbedScale sqrt(hidden) (GemmaRow)
//	per layer:   input_layernorm (the previous add+norm, (1 + w))
//	             qkv GEMM, RopeKV as Llama's (head dim 256)
//	             attention: Scale query_pre_attn_scalar^-1/2, Softcap 50, Window 4096 on
//	               layers 0, 2, 4, ... (GemmaAttention; name kernels with AttnKernelSuffix)
//	             o GEMM
//	             add+norm: delta post-normed (post_attention_layernorm, DeltaNorm), then
//	               pre_feedforward_layernorm as the norm (GemmaRow)
//	             gate_up GEMM, SiluMul with Act ActGeluTanh (GemmaSilu; mlp.act ops fuse
//	               as for SiLU), down GEMM
//	             add+norm: delta post-normed (post_feedforward_layernorm), then the next
//	               layer's input_layernorm, or the final norm
//	LM head:     the embedding (tied), then Softcap (GemmaFinalSoftcap) over the logits
//	             before the logits hook's ops and the sampler.
//
// Hook meanings follow transformers' hidden states: resid_post is the layer's output,
// attn_out and mlp_out the post-normed deltas added to the residual (TransformerLens'
// hook_attn_out, hook_mlp_out for Gemma 2), embed the scaled embedding.

// Gemma2LayerTensors are the Hugging Face tensors of layer N (after "model.layers.N.") by
// the buffer they fill (layerBuf(N, buffer)); stacked buffers list theirs in row order.
var Gemma2LayerTensors = []struct {
	Buffer  string
	Tensors []string
}{
	{"attn_norm", []string{"input_layernorm.weight"}},
	{"wqkv", []string{"self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"}},
	{"wo", []string{"self_attn.o_proj.weight"}},
	{"attn_post_norm", []string{"post_attention_layernorm.weight"}},
	{"mlp_norm", []string{"pre_feedforward_layernorm.weight"}},
	{"wgu", []string{"mlp.gate_proj.weight", "mlp.up_proj.weight"}},
	{"wdown", []string{"mlp.down_proj.weight"}},
	{"mlp_post_norm", []string{"post_feedforward_layernorm.weight"}},
}

// Gemma2ModelTensors are the whole-model tensors by buffer. The LM head is the embedding
// (Gemma2Config's tie_word_embeddings); an untied checkpoint adds lm_head.weight as the
// Llama builder does.
var Gemma2ModelTensors = []struct {
	Buffer  string
	Tensors []string
}{
	{"embed", []string{"model.embed_tokens.weight"}},
	{"final_norm", []string{"model.norm.weight"}},
}

// Gemma2Tensors maps every weight buffer of a layers-deep Gemma 2 to its tensors.
func Gemma2Tensors(layers int) map[string][]string {
	out := map[string][]string{}
	for _, t := range Gemma2ModelTensors {
		out[t.Buffer] = t.Tensors
	}
	for l := range layers {
		for _, t := range Gemma2LayerTensors {
			names := make([]string, len(t.Tensors))
			for i, n := range t.Tensors {
				names[i] = fmt.Sprintf("model.layers.%d.%s", l, n)
			}
			out[layerBuf(l, t.Buffer)] = names
		}
	}
	return out
}

// gemma2LayerWeights declares layer l's weight buffers with their tensors
// (Gemma2LayerTensors): the Llama layer's, sharded alike, plus the two post-norms.
func (g *gen) gemma2LayerWeights(l int) {
	m, wd := g.m, g.wdt.String()
	H, D, I := m.Hidden, m.HeadDim, m.Intermediate
	tensors := Gemma2Tensors(l + 1)
	names := func(b string) []string { return tensors[layerBuf(l, b)] }
	qkvExt := []int{m.Heads * D, m.KVHeads * D, m.KVHeads * D}
	for _, norm := range []string{"attn_norm", "attn_post_norm", "mlp_norm", "mlp_post_norm"} {
		g.buf(layerBuf(l, norm), bundle.KindWeight, wd, []int{H}, names(norm)...)
	}
	g.sharded(layerBuf(l, "wqkv"), bundle.KindWeight, []int{(m.Heads + 2*m.KVHeads) * D, H}, 0, qkvExt, names("wqkv")...)
	g.sharded(layerBuf(l, "wo"), bundle.KindWeight, []int{H, m.Heads * D}, 1, []int{m.Heads * D}, names("wo")...)
	g.sharded(layerBuf(l, "wgu"), bundle.KindWeight, []int{2 * I, H}, 0, []int{I, I}, names("wgu")...)
	g.sharded(layerBuf(l, "wdown"), bundle.KindWeight, []int{H, I}, 1, []int{I}, names("wdown")...)
}

// gemma2PostNorm is the post-norm weight of add+norm slot s: 2L ends layer L's attention
// (attn_post_norm), 2L+1 its MLP (mlp_post_norm).
func gemma2PostNorm(slot int) string {
	if slot%2 == 0 {
		return layerBuf(slot/2, "attn_post_norm")
	}
	return layerBuf(slot/2, "mlp_post_norm")
}

// finalSoftcap caps the logits of the sampled rows in place, after the LM head (and its
// all-gather) and before the logits hook's ops and the sampler, when the model caps them.
func (t *tb) finalSoftcap(samples int) {
	c, ok := GemmaFinalSoftcap(t.g.m)
	if !ok {
		return
	}
	name := fmt.Sprintf("softcap_v%d", c.Width)
	k, err := t.g.kernel(name, func() (*Kernel, error) { return Softcap(name, c) })
	t.add("logits.softcap", k, err, c.Launch(samples), slots{"x": buf(bundle.ActLogits)}, nil)
}

// gemma2ModelConfig records what Gemma 2 adds in the manifest (nothing for other families).
func gemma2ModelConfig(m *frontend.Model, c *bundle.ModelConfig) {
	c.Activation, c.NormOffset, c.PostNorms, c.EmbedScale = m.Activation, m.NormOffset, m.PostNorms, m.EmbedScale()
	c.QueryPreAttnScalar, c.AttnSoftcap, c.FinalSoftcap = m.QueryPreAttnScalar, m.AttnSoftcap, m.FinalSoftcap
	c.SlidingWindow, c.SlidingLayers = m.SlidingWindow, m.SlidingLayers
}

// GemmaRow sets c's Gemma fields: norms by (NormOffset + w); for Load add the delta's
// post-norm (parameter delta_w: the layer's attn_post_norm or mlp_post_norm); for Load
// embed the embedding scale. Other families' configs come back as they were.
func GemmaRow(m *frontend.Model, c RowConfig) RowConfig {
	c.WOffset = float32(m.NormOffset)
	switch c.Load {
	case "add":
		c.DeltaNorm = m.PostNorms
	case "embed":
		c.EmbedScale = m.EmbedScale()
	}
	return c
}

// GemmaAttention sets layer l's scale (query_pre_attn_scalar^-1/2, or head_dim's),
// soft-cap and sliding window on c. A window no sequence can outgrow (max_seq_len at most
// the window) is left out: the layer's kernels are the full ones.
func GemmaAttention(m *frontend.Model, l int, c AttnConfig) AttnConfig {
	c.Scale = float32(m.AttnScale())
	c.Softcap = float32(m.AttnSoftcap)
	if w := m.AttnWindow(l); w < m.MaxSeqLen {
		c.Window = w
	}
	return c
}

// AttnKernelSuffix names what GemmaAttention set beyond a Llama kernel, so that layers with
// and without the window get kernels of their own: "" for none.
func AttnKernelSuffix(c AttnConfig) string {
	s := ""
	if c.Softcap > 0 {
		s += fmt.Sprintf("_cap%g", c.Softcap)
	}
	if c.Window > 0 {
		s += fmt.Sprintf("_w%d", c.Window)
	}
	return s
}

// GemmaSilu sets the gated MLP's activation: ActGeluTanh for GeGLU.
func GemmaSilu(m *frontend.Model, c SiluConfig) SiluConfig {
	if m.Activation == frontend.ActGeluTanh {
		c.Act = ActGeluTanh
	}
	return c
}

// GatedKernelName is the gated-MLP kernel's base name at inter columns: silu_mul_i.. or
// gelu_tanh_mul_i.. (its op's name).
func GatedKernelName(c SiluConfig) string {
	op, err := c.op()
	if err != nil {
		op = "gated_mul"
	}
	return fmt.Sprintf("%s_i%d", op, c.Inter)
}

// GemmaFinalSoftcap is the soft-cap of the logits ([samples, vocab], in place, after the LM
// head and its all-gather) when the model caps them.
func GemmaFinalSoftcap(m *frontend.Model) (SoftcapConfig, bool) {
	return SoftcapConfig{Width: m.Vocab, Cap: float32(m.FinalSoftcap)}, m.FinalSoftcap > 0
}
