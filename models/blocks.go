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

// embed looks the step's tokens up in the embedding: the rows are hooks embed and layer 0's
// resid_pre.
func embed(b *ir.Builder, m *frontend.Model) *ir.Value {
	b.Layer(-1)
	x := b.Embed("embed", b.Weight("embed", []int{m.Vocab, m.Hidden}, "model.embed_tokens.weight"), ir.Residual)
	b.Hook(x, "embed")
	return b.HookAt(x, "resid_pre", 0)
}

// norm is an RMSNorm of the residual x with the current layer's weight of the same name: the
// input of the block that follows (value).
func norm(b *ir.Builder, m *frontend.Model, node, value string, x *ir.Value, tensor string) *ir.Value {
	return b.Norm(node, value, x, b.Weight(node, []int{m.Hidden}, tensor), float32(m.RMSEps), ir.Tokens, "act.xn")
}

// residual adds a block's output delta to the residual stream x: the sum is hook name.
func residual(b *ir.Builder, node, name string, x, delta *ir.Value) *ir.Value {
	return b.Hook(b.Add(node, name, x, delta), name)
}

// attnOptions are what a family adds to the attention block.
type attnOptions struct {
	bias   bool // q, k and v projections with biases (added in the rotation kernel)
	qkNorm bool // each q and k head RMS-normalised before the rotation
}

// attention is the self-attention of the current layer over h, the normalised residual: q,
// k and v in one projection (hooks attn.q, attn.k, attn.v: its column ranges), the rotation
// and the KV cache, attention (attn.z, heads side by side), the output projection (hook
// attn_out). Under tensor parallelism each rank holds its heads; the output projection is
// row-parallel.
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
	z := b.Attention("attention", "attn.z", qkv, cache, ir.AttentionAttrs{Heads: m.Heads, KVHeads: m.KVHeads, HeadDim: D,
		Scale: float32(1 / math.Sqrt(float64(D)))}, "act.z")
	b.Hook(z, "attn.z")
	wo := b.Weight("wo", []int{H, qw}, t+"self_attn.o_proj.weight")
	out := b.Matmul("o", "attn_out", z, wo, ir.MatmulAttrs{Split: ir.Row, Reduce: fmt.Sprintf("L%d.o.all_reduce", l)}, ir.Delta)
	return b.Hook(out, "attn_out")
}

// gatedMLP is the SwiGLU MLP of the current layer over h: gate and up in one projection,
// silu(gate) * up (hook mlp.act), the down projection (hook mlp_out). Column-parallel, then
// row-parallel under tensor parallelism.
func gatedMLP(b *ir.Builder, m *frontend.Model, l int, h *ir.Value) *ir.Value {
	t := layerTensor(l)
	H, I := m.Hidden, m.Intermediate
	wgu := b.Weight("wgu", []int{2 * I, H}, t+"mlp.gate_proj.weight", t+"mlp.up_proj.weight")
	gu := b.Matmul("gate_up", "gate_up", h, wgu, ir.MatmulAttrs{Split: ir.Column}, "act.gu")
	act := b.Hook(b.Activation("silu_mul", "mlp.act", gu, "silu", "act.mlp"), "mlp.act")
	wdown := b.Weight("wdown", []int{H, I}, t+"mlp.down_proj.weight")
	out := b.Matmul("down", "mlp_out", act, wdown, ir.MatmulAttrs{Split: ir.Row, Reduce: fmt.Sprintf("L%d.mlp.all_reduce", l)}, ir.Delta)
	return b.Hook(out, "mlp_out")
}

// moeBlock is a mixture of SwiGLU experts over h: the router's logits (hook router_logits)
// pick TopK experts per token, whose outputs are summed by the router's weights (hook
// mlp_out). Each expert is cut under tensor parallelism as the dense MLP is; the router
// stays whole on every rank.
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
	out := b.Experts("experts", "mlp_out", h, idx, wts,
		b.Weight("experts_gu", []int{E * 2 * I, H}, gu...), b.Weight("experts_down", []int{E * H, I}, down...),
		ir.ExpertsAttrs{Experts: E, TopK: m.TopK, Inter: I, Reduce: fmt.Sprintf("L%d.mlp.all_reduce", l)}, ir.Delta)
	return b.Hook(out, "mlp_out")
}

// head is the model's end over the last layer's output x: the final norm of the sampled
// rows (hook final_norm), the LM head (hook logits; the embedding when they are tied,
// vocab-parallel under tensor parallelism) and the sampler (hook sampled).
func head(b *ir.Builder, m *frontend.Model, x *ir.Value) {
	b.Layer(-1)
	fin := b.Norm("final_norm", "final_norm", x, b.Weight("final_norm", []int{m.Hidden}, "model.norm.weight"), float32(m.RMSEps), ir.Samples, "act.final")
	b.Hook(fin, "final_norm")
	lm := b.Weight("embed", []int{m.Vocab, m.Hidden}, "model.embed_tokens.weight")
	if !m.TieEmbeddings {
		lm = b.Weight("lm_head", []int{m.Vocab, m.Hidden}, "lm_head.weight")
	}
	logits := b.Matmul("lm_head", "logits", fin, lm, ir.MatmulAttrs{Split: ir.Vocab, Gather: "lm_head.all_gather", Shard: "act.logits_shard"}, bundle.ActLogits)
	b.Hook(logits, "logits")
	b.Hook(b.Sample("sample", logits, ir.SampleAttrs{Vocab: m.Vocab, EOS: m.EOS, Logprobs: m.MaxLogprobs}, bundle.OutSampled), "sampled")
}
