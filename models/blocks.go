package models

import (
	"fmt"
	"math"

	"xmix/bundle"
	"xmix/frontend"
	"xmix/ir"
)

// The blocks every family is made of. Values are named after their hooks where they are
// one; a value's class is the buffer it lives in (plan-buffers).

// layerTensor is layer l's tensor name prefix in a Hugging Face checkpoint.
func layerTensor(l int) string { return fmt.Sprintf("model.layers.%d.", l) }

// kvDtype is the KV cache's element type.
func kvDtype(m *frontend.Model) ir.Dtype {
	if m.KVDtype == "bf16" {
		return ir.BF16
	}
	return ir.F32
}

// ropeTables declares the RoPE frequency tables every layer's rotation reads.
func ropeTables(b *ir.Builder, m *frontend.Model) [2]*ir.Weight {
	return [2]*ir.Weight{b.Table("rope.cos", m.MaxSeqLen, m.HeadDim/2), b.Table("rope.sin", m.MaxSeqLen, m.HeadDim/2)}
}

// embed looks the step's tokens up in the embedding, times scale (0: not scaled): the rows
// are hooks embed and layer 0's resid_pre.
func embed(b *ir.Builder, m *frontend.Model, scale float32) *ir.Value {
	b.Layer(-1)
	x := b.Embed("embed", b.Weight("embed", []int{m.Vocab, m.Hidden}, "model.embed_tokens.weight"), scale, ir.Residual)
	b.Hook(x, "embed")
	return b.HookAt(x, "resid_pre", 0)
}

// norm is an RMSNorm of x with the current layer's weight of the same name, into value of
// class (the input of the block that follows: the normalised rows, act.xn).
func norm(b *ir.Builder, m *frontend.Model, node, value string, x *ir.Value, tensor, class string) *ir.Value {
	a := ir.NormAttrs{Eps: float32(m.RMSEps), Offset: float32(m.NormOffset)}
	return b.Norm(node, value, x, b.Weight(node, []int{m.Hidden}, tensor), a, ir.Tokens, class)
}

// residual adds a block's output delta to the residual stream x: the sum is hook name.
func residual(b *ir.Builder, node, name string, x, delta *ir.Value) *ir.Value {
	return b.Hook(b.Add(node, name, x, delta), name)
}

// attnOptions are what a family adds to the attention block.
type attnOptions struct {
	bias   bool // q, k and v projections with biases (added in the rotation kernel)
	qkNorm bool // each q and k head RMS-normalised before the rotation
	// scale of the scores (0: 1/sqrt(head_dim)), their soft-cap (0: none), the sliding
	// window of the layer (0: every position).
	scale, softcap float32
	window         int
}

// attention is the self-attention of the current layer over h, the normalised residual: q,
// k and v in one projection (hooks attn.q, attn.k, attn.v: its column ranges), the rotation
// and the KV cache, attention (attn.z, heads side by side), the output projection. Under
// tensor parallelism each rank holds its heads; the output projection is row-parallel.
func attention(b *ir.Builder, m *frontend.Model, l int, h *ir.Value, rope [2]*ir.Weight, o attnOptions) *ir.Value {
	t := layerTensor(l)
	H, D := m.Hidden, m.HeadDim
	qw, kvw := m.Heads*D, m.KVHeads*D
	wqkv := b.Stacked("wqkv", []int{qw, kvw, kvw}, H, t+"self_attn.q_proj.weight", t+"self_attn.k_proj.weight", t+"self_attn.v_proj.weight")
	qkv := b.Matmul("qkv", "qkv", h, wqkv, ir.MatmulAttrs{Split: ir.Column}, "act.qkv")
	for _, v := range []struct {
		hook          string
		offset, width int
	}{{"attn.q", 0, qw}, {"attn.k", qw, kvw}, {"attn.v", qw + kvw, kvw}} {
		b.Hook(b.View(qkv, v.hook, v.offset, v.width), v.hook)
	}
	uses := []ir.Use{{Role: "cos", Weight: rope[0]}, {Role: "sin", Weight: rope[1]}}
	if o.bias {
		uses = append(uses, ir.Use{Role: "bias", Weight: b.Stacked("qkv_bias", []int{qw, kvw, kvw}, 0,
			t+"self_attn.q_proj.bias", t+"self_attn.k_proj.bias", t+"self_attn.v_proj.bias")})
	}
	if o.qkNorm {
		uses = append(uses, ir.Use{Role: "q_norm", Weight: b.Weight("q_norm", []int{D}, t+"self_attn.q_norm.weight")},
			ir.Use{Role: "k_norm", Weight: b.Weight("k_norm", []int{D}, t+"self_attn.k_norm.weight")})
	}
	cache := b.Cache(m.KVHeads, D, kvDtype(m))
	b.Rope("rope_kv", qkv, ir.RopeAttrs{Heads: m.Heads, KVHeads: m.KVHeads, HeadDim: D, Bias: o.bias, QKNorm: o.qkNorm, Eps: float32(m.RMSEps)}, cache, uses...)
	scale := o.scale
	if scale == 0 {
		scale = float32(1 / math.Sqrt(float64(D)))
	}
	z := b.Attention("attention", "attn.z", qkv, cache, ir.AttentionAttrs{Heads: m.Heads, KVHeads: m.KVHeads, HeadDim: D,
		Scale: scale, Softcap: o.softcap, Window: o.window}, "act.z")
	b.Hook(z, "attn.z")
	wo := b.Weight("wo", []int{H, qw}, t+"self_attn.o_proj.weight")
	return b.Matmul("o", "attn_o", z, wo, ir.MatmulAttrs{Split: ir.Row, Reduce: fmt.Sprintf("L%d.o.all_reduce", l)}, ir.Delta)
}

// gatedMLP is the gated MLP of the current layer over h: gate and up in one projection,
// fn(gate) * up (hook mlp.act; fn silu: SwiGLU, gelu_tanh: GeGLU), the down projection.
// Column-parallel, then row-parallel under tensor parallelism.
func gatedMLP(b *ir.Builder, m *frontend.Model, l int, h *ir.Value, fn string) *ir.Value {
	t := layerTensor(l)
	H, I := m.Hidden, m.Intermediate
	wgu := b.Weight("wgu", []int{2 * I, H}, t+"mlp.gate_proj.weight", t+"mlp.up_proj.weight")
	gu := b.Matmul("gate_up", "gate_up", h, wgu, ir.MatmulAttrs{Split: ir.Column}, "act.gu")
	act := b.Hook(b.Activation("silu_mul", "mlp.act", gu, fn, "act.mlp"), "mlp.act")
	wdown := b.Weight("wdown", []int{H, I}, t+"mlp.down_proj.weight")
	return b.Matmul("down", "mlp_down", act, wdown, ir.MatmulAttrs{Split: ir.Row, Reduce: fmt.Sprintf("L%d.mlp.all_reduce", l)}, ir.Delta)
}

// moeBlock is a mixture of SwiGLU experts over h: the router's logits (hook router_logits)
// pick TopK experts per token, whose outputs are summed by the router's weights. Each
// expert is cut under tensor parallelism as the dense MLP is; the router stays whole on
// every rank.
func moeBlock(b *ir.Builder, m *frontend.Model, l int, h *ir.Value) *ir.Value {
	t := layerTensor(l) + "block_sparse_moe."
	H, I, E := m.Hidden, m.Intermediate, m.Experts
	logits, idx, wts := b.Router("router", h, b.Weight("router", []int{E, H}, t+"gate.weight"), ir.RouterAttrs{Experts: E, TopK: m.TopK})
	b.Hook(logits, "router_logits")
	var gu, down []string
	for e := range E {
		x := fmt.Sprintf("%sexperts.%d.", t, e)
		gu = append(gu, x+"w1.weight", x+"w3.weight")
		down = append(down, x+"w2.weight")
	}
	return b.Experts("experts", "mlp_down", h, idx, wts,
		b.Weight("experts_gu", []int{E * 2 * I, H}, gu...), b.Weight("experts_down", []int{E * H, I}, down...),
		ir.ExpertsAttrs{Experts: E, TopK: m.TopK, Inter: I, Reduce: fmt.Sprintf("L%d.mlp.all_reduce", l)}, ir.Delta)
}

// head is the model's end over the last layer's output x: the final norm of the sampled
// rows (hook final_norm), the LM head (the embedding when they are tied, vocab-parallel
// under tensor parallelism), the logits' soft-cap when the model has one (hook logits after
// it), the sampler (hook sampled).
func head(b *ir.Builder, m *frontend.Model, x *ir.Value) {
	b.Layer(-1)
	a := ir.NormAttrs{Eps: float32(m.RMSEps), Offset: float32(m.NormOffset)}
	fin := b.Norm("final_norm", "final_norm", x, b.Weight("final_norm", []int{m.Hidden}, "model.norm.weight"), a, ir.Samples, "act.final")
	b.Hook(fin, "final_norm")
	lm := b.Weight("embed", []int{m.Vocab, m.Hidden}, "model.embed_tokens.weight")
	if !m.TieEmbeddings {
		lm = b.Weight("lm_head", []int{m.Vocab, m.Hidden}, "lm_head.weight")
	}
	logits := b.Matmul("lm_head", "logits", fin, lm, ir.MatmulAttrs{Split: ir.Vocab, Gather: "lm_head.all_gather", Shard: "act.logits_shard"}, bundle.ActLogits)
	if m.FinalSoftcap > 0 {
		logits.Name = "logits_uncapped"
		logits = b.Softcap("logits.softcap", "logits", logits, float32(m.FinalSoftcap))
	}
	b.Hook(logits, "logits")
	b.Hook(b.Sample("sample", logits, ir.SampleAttrs{Vocab: m.Vocab, EOS: m.EOS, Logprobs: m.MaxLogprobs}, bundle.OutSampled), "sampled")
}
