package passes

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	"xmix/ir"
)

// The graph passes, wazero pass_test style: the IR text of a one-layer model before and after
// each pass, written out here, so that a change in what a pass does shows as a changed line.

const oneLayer = `model: t
family: llama
dims: {hidden: 8, intermediate: 16, layers: 1, heads: 2, kv_heads: 2, head_dim: 4, vocab: 300}
weights: {synthetic: {seed: 1, std: 0.02}}
tokenizer: bytes
bos: 256
eos: [257]
serving: {decode_buckets: [1], prefill_chunks: [8], max_seq_len: 16, max_seqs: 1}
`

// graphApp puts an op in each kind of host: fused as a delta (attn_out) and in the residual
// (resid_post), standalone (attn.z), and a heavy read with its own node.
const graphApp = `app: a
params: {v: {random: 1}}
buffers: {p: {shape: [1]}, top: {shape: [2]}}
ops:
  - write: {at: {layers: [0], hook: attn_out}, kernel: steer_add, args: {vector: v}}
  - read: {at: {layers: [0], hook: resid_post}, kernel: probe_linear, args: {w: v}, into: p}
  - write: {at: {layers: [0], hook: attn.z}, kernel: head_ablate, args: {head: 1, alpha: 0}}
  - read: {at: {layers: [0], hook: resid_post}, kernel: logit_lens, args: {k: 1}, into: top}
`

// irAfter is irOf over oneLayer.
func irAfter(t *testing.T, tp int, pass string, weights bool, apps ...string) string {
	t.Helper()
	return irOf(t, oneLayer, tp, pass, weights, apps...)
}

// irOf runs the passes over model and apps at tensor-parallel degree tp and returns the
// graph's text after pass, without its weight lines unless weights; without the decode
// fusions (their own tests name them).
func irOf(t *testing.T, model string, tp int, pass string, weights bool, apps ...string) string {
	t.Helper()
	return irWith(t, model, Options{TP: tp, Fuse: []string{"none"}}, pass, weights, apps...)[0]
}

// irWith is irOf with options: the text of the graph and of the app-free graph after pass.
func irWith(t *testing.T, model string, opt Options, pass string, weights bool, apps ...string) [2]string {
	t.Helper()
	m, as, err := parseSpecs(t, model, apps...)
	if err != nil {
		t.Fatal(err)
	}
	var text [2]string
	opt.Verify = true
	opt.Trace = func(name string, p *Program) {
		if name == pass {
			text[0] = p.Graph.String()
			if p.Plain != nil {
				text[1] = p.Plain.String()
			}
		}
	}
	if _, err = Run(m, as, opt); err != nil {
		t.Fatal(err)
	}
	return [2]string{withoutWeights(text[0], weights), withoutWeights(text[1], weights)}
}

// withoutWeights is a graph's text without its weight lines unless weights.
func withoutWeights(text string, weights bool) string {
	var keep []string
	for _, line := range strings.Split(text, "\n") {
		if weights || !strings.HasPrefix(line, "  weight ") {
			keep = append(keep, line)
		}
	}
	return strings.Join(keep, "\n")
}

// sameIR fails with the first line where got and want differ.
func sameIR(t *testing.T, what, got, want string) {
	t.Helper()
	g, w := strings.Split(got, "\n"), strings.Split(want, "\n")
	for i := range max(len(g), len(w)) {
		var gl, wl string
		if i < len(g) {
			gl = g[i]
		}
		if i < len(w) {
			wl = w[i]
		}
		if gl != wl {
			t.Fatalf("%s: line %d:\n got %s\nwant %s\n\nwhole IR:\n%s", what, i+1, gl, wl, got)
		}
	}
}

// The builder writes the family's forward from primitive ops; fuse-rows puts each norm in the
// row kernel of the embedding or residual add it follows.
func TestFuseRows(t *testing.T) {
	sameIR(t, "after build-graph", irAfter(t, 1, "build-graph", false), builtIR)
	sameIR(t, "after fuse-rows", irAfter(t, 1, "fuse-rows", false), fusedIR)
}

// oneGemmaLayer is a one-layer Gemma 2: scaled embedding, four norms by (1 + w), GeGLU,
// soft-capped and windowed attention, soft-capped logits.
const oneGemmaLayer = `model: g
family: gemma2
dims: {hidden: 8, intermediate: 16, layers: 1, heads: 2, kv_heads: 1, head_dim: 4, vocab: 300,
       query_pre_attn_scalar: 8, attn_logit_softcapping: 2.0, final_logit_softcapping: 3.0, sliding_window: 5}
weights: {synthetic: {seed: 1, std: 0.02}}
tokenizer: bytes
bos: 256
eos: [257]
serving: {decode_buckets: [1], prefill_chunks: [8], max_seq_len: 16, max_seqs: 1}
`

// fuse-rows takes a norm of the delta right before its add into the add+norm kernel (Gemma
// 2's post-norms): the normalised delta, where hooks attn_out and mlp_out are, becomes a value
// of that kernel's.
func TestFuseRowsGemma2(t *testing.T) {
	sameIR(t, "after build-graph", irOf(t, oneGemmaLayer, 1, "build-graph", false), gemmaBuiltIR)
	sameIR(t, "after fuse-rows", irOf(t, oneGemmaLayer, 1, "fuse-rows", false), gemmaFusedIR)
}

// shard-tp halves the column-parallel widths (q, k, v heads; gate and up; the vocabulary),
// records each weight's cut and the extents of its tensors, and inserts an all-reduce after
// each row-parallel projection and an all-gather after the LM head; the hooks move to the
// collectives' outputs.
func TestShardTP(t *testing.T) {
	sameIR(t, "after shard-tp", irAfter(t, 2, "shard-tp", true), shardedIR)
}

// attach-mi puts each op at its hook value; place-mi moves it into the kernel that hosts it:
// attn_out's into the add+norm kernel as its delta, resid_post's into the add+norm that
// defines it, attn.z's into a standalone MI node after attention, the logit lens into a node
// of its own; plan-buffers puts every value in its class's buffer.
func TestPlaceMI(t *testing.T) {
	sameIR(t, "after attach-mi", irAfter(t, 1, "attach-mi", false, graphApp), attachedIR)
	sameIR(t, "after place-mi", irAfter(t, 1, "place-mi", false, graphApp), placedIR)
	sameIR(t, "after plan-buffers", irAfter(t, 1, "plan-buffers", false, graphApp), plannedIR)
}

const builtIR = `graph t (llama), tp 1
  embed: %embed:T8 = embed table=embed vocab=300   # embed L0.resid_pre
  L0.attn_norm: %L0.attn_in:T8 = norm %embed w=L0.attn_norm eps=1e-05
  L0.qkv: %L0.qkv:T24 = matmul %L0.attn_in w=L0.wqkv split=column   # %L0.attn.q:T8=%L0.qkv[0:8] %L0.attn.k:T8=%L0.qkv[8:16] %L0.attn.v:T8=%L0.qkv[16:24]
  L0.rope_kv: rope %L0.qkv cos=rope.cos sin=rope.sin cache=L0.kcache cache=L0.vcache heads=2/2 dim=4
  L0.attention: %L0.attn.z:T8 = attention %L0.qkv cache=L0.kcache cache=L0.vcache heads=2/2 dim=4 scale=0.5   # L0.attn.z
  L0.o: %L0.attn_o:T8 = matmul %L0.attn.z w=L0.wo split=row reduce=L0.o.all_reduce   # L0.attn_out
  L0.attn_residual: %L0.resid_mid:T8 = add %embed, %L0.attn_o   # L0.resid_mid
  L0.mlp_norm: %L0.mlp_in:T8 = norm %L0.resid_mid w=L0.mlp_norm eps=1e-05
  L0.gate_up: %L0.gate_up:T32 = matmul %L0.mlp_in w=L0.wgu split=column
  L0.silu_mul: %L0.mlp.act:T16 = activation %L0.gate_up fn=silu inter=16   # L0.mlp.act
  L0.down: %L0.mlp_down:T8 = matmul %L0.mlp.act w=L0.wdown split=row reduce=L0.mlp.all_reduce   # L0.mlp_out
  L0.mlp_residual: %L0.resid_post:T8 = add %L0.resid_mid, %L0.mlp_down   # L0.resid_post
  final_norm: %final_norm:S8 = norm %L0.resid_post w=final_norm eps=1e-05   # final_norm
  lm_head: %logits:S300 = matmul %final_norm w=lm_head split=vocab   # logits
  sample: %sampled:S1u32 = sample %logits vocab=300 eos=[257] logprobs=20   # sampled
`

const fusedIR = `graph t (llama), tp 1
  embed: %embed:T8, %L0.attn_in:T8 = embed_norm table=embed w=L0.attn_norm eps=1e-05 vocab=300   # embed L0.resid_pre
  L0.qkv: %L0.qkv:T24 = matmul %L0.attn_in w=L0.wqkv split=column   # %L0.attn.q:T8=%L0.qkv[0:8] %L0.attn.k:T8=%L0.qkv[8:16] %L0.attn.v:T8=%L0.qkv[16:24]
  L0.rope_kv: rope %L0.qkv cos=rope.cos sin=rope.sin cache=L0.kcache cache=L0.vcache heads=2/2 dim=4
  L0.attention: %L0.attn.z:T8 = attention %L0.qkv cache=L0.kcache cache=L0.vcache heads=2/2 dim=4 scale=0.5   # L0.attn.z
  L0.o: %L0.attn_o:T8 = matmul %L0.attn.z w=L0.wo split=row reduce=L0.o.all_reduce   # L0.attn_out
  L0.attn_residual: %L0.resid_mid:T8, %L0.mlp_in:T8 = add_norm %embed, %L0.attn_o w=L0.mlp_norm eps=1e-05   # L0.resid_mid
  L0.gate_up: %L0.gate_up:T32 = matmul %L0.mlp_in w=L0.wgu split=column
  L0.silu_mul: %L0.mlp.act:T16 = activation %L0.gate_up fn=silu inter=16   # L0.mlp.act
  L0.down: %L0.mlp_down:T8 = matmul %L0.mlp.act w=L0.wdown split=row reduce=L0.mlp.all_reduce   # L0.mlp_out
  L0.mlp_residual: %L0.resid_post:T8, %final_norm:S8 = add_norm %L0.resid_mid, %L0.mlp_down w=final_norm eps=1e-05   # L0.resid_post final_norm
  lm_head: %logits:S300 = matmul %final_norm w=lm_head split=vocab   # logits
  sample: %sampled:S1u32 = sample %logits vocab=300 eos=[257] logprobs=20   # sampled
`

const shardedIR = `graph t (llama), tp 2
  weight embed [300 8] bf16 <- model.embed_tokens.weight
  weight L0.attn_norm [8] bf16 <- model.layers.0.input_layernorm.weight
  weight L0.wqkv [24 8] bf16 split=column extents=[8 8 8] <- model.layers.0.self_attn.q_proj.weight, model.layers.0.self_attn.k_proj.weight, model.layers.0.self_attn.v_proj.weight
  weight L0.wo [8 8] bf16 split=row extents=[8] <- model.layers.0.self_attn.o_proj.weight
  weight L0.mlp_norm [8] bf16 <- model.layers.0.post_attention_layernorm.weight
  weight L0.wgu [32 8] bf16 split=column extents=[16 16] <- model.layers.0.mlp.gate_proj.weight, model.layers.0.mlp.up_proj.weight
  weight L0.wdown [8 16] bf16 split=row extents=[16] <- model.layers.0.mlp.down_proj.weight
  weight final_norm [8] bf16 <- model.norm.weight
  weight lm_head [300 8] bf16 split=vocab extents=[300] <- lm_head.weight
  weight rope.cos [16 2] f32 computed
  weight rope.sin [16 2] f32 computed
  embed: %embed:T8, %L0.attn_in:T8 = embed_norm table=embed w=L0.attn_norm eps=1e-05 vocab=300   # embed L0.resid_pre
  L0.qkv: %L0.qkv:T12 = matmul %L0.attn_in w=L0.wqkv split=column   # %L0.attn.q:T4=%L0.qkv[0:4] %L0.attn.k:T4=%L0.qkv[4:8] %L0.attn.v:T4=%L0.qkv[8:12]
  L0.rope_kv: rope %L0.qkv cos=rope.cos sin=rope.sin cache=L0.kcache cache=L0.vcache heads=1/1 dim=4
  L0.attention: %L0.attn.z:T4 = attention %L0.qkv cache=L0.kcache cache=L0.vcache heads=1/1 dim=4 scale=0.5   # L0.attn.z
  L0.o: %L0.attn_o.part:T8 = matmul %L0.attn.z w=L0.wo split=row reduce=L0.o.all_reduce
  L0.o.all_reduce: %L0.attn_o:T8 = collective %L0.attn_o.part all_reduce_sum   # L0.attn_out
  L0.attn_residual: %L0.resid_mid:T8, %L0.mlp_in:T8 = add_norm %embed, %L0.attn_o w=L0.mlp_norm eps=1e-05   # L0.resid_mid
  L0.gate_up: %L0.gate_up:T16 = matmul %L0.mlp_in w=L0.wgu split=column
  L0.silu_mul: %L0.mlp.act:T8 = activation %L0.gate_up fn=silu inter=8   # L0.mlp.act
  L0.down: %L0.mlp_down.part:T8 = matmul %L0.mlp.act w=L0.wdown split=row reduce=L0.mlp.all_reduce
  L0.mlp.all_reduce: %L0.mlp_down:T8 = collective %L0.mlp_down.part all_reduce_sum   # L0.mlp_out
  L0.mlp_residual: %L0.resid_post:T8, %final_norm:S8 = add_norm %L0.resid_mid, %L0.mlp_down w=final_norm eps=1e-05   # L0.resid_post final_norm
  lm_head: %logits.part:S150 = matmul %final_norm w=lm_head split=vocab
  lm_head.all_gather: %logits:S300 = collective %logits.part all_gather_cols   # logits
  sample: %sampled:S1u32 = sample %logits vocab=300 eos=[257] logprobs=20   # sampled
`

const attachedIR = `graph t (llama), tp 1
  embed: %embed:T8, %L0.attn_in:T8 = embed_norm table=embed w=L0.attn_norm eps=1e-05 vocab=300   # embed L0.resid_pre
  L0.qkv: %L0.qkv:T24 = matmul %L0.attn_in w=L0.wqkv split=column   # %L0.attn.q:T8=%L0.qkv[0:8] %L0.attn.k:T8=%L0.qkv[8:16] %L0.attn.v:T8=%L0.qkv[16:24]
  L0.rope_kv: rope %L0.qkv cos=rope.cos sin=rope.sin cache=L0.kcache cache=L0.vcache heads=2/2 dim=4
  L0.attention: %L0.attn.z:T8 = attention %L0.qkv cache=L0.kcache cache=L0.vcache heads=2/2 dim=4 scale=0.5   # L0.attn.z
      mi@L0.attn.z a.op2 head_ablate bit=0 at=L0.attn.z width=8 vec=app.a.param.head1.mask alpha=scal[1]
  L0.o: %L0.attn_o:T8 = matmul %L0.attn.z w=L0.wo split=row reduce=L0.o.all_reduce   # L0.attn_out
      mi@L0.attn_o a.op0 steer_add bit=0 at=L0.attn_out width=8 vec=app.a.param.v alpha=scal[0]
  L0.attn_residual: %L0.resid_mid:T8, %L0.mlp_in:T8 = add_norm %embed, %L0.attn_o w=L0.mlp_norm eps=1e-05   # L0.resid_mid
  L0.gate_up: %L0.gate_up:T32 = matmul %L0.mlp_in w=L0.wgu split=column
  L0.silu_mul: %L0.mlp.act:T16 = activation %L0.gate_up fn=silu inter=16   # L0.mlp.act
  L0.down: %L0.mlp_down:T8 = matmul %L0.mlp.act w=L0.wdown split=row reduce=L0.mlp.all_reduce   # L0.mlp_out
  L0.mlp_residual: %L0.resid_post:T8, %final_norm:S8 = add_norm %L0.resid_mid, %L0.mlp_down w=final_norm eps=1e-05   # L0.resid_post final_norm
      mi@L0.resid_post a.op1 probe_linear bit=0 at=L0.resid_post width=8 vec=app.a.param.v out=app.a.buffer.p@0
      mi@L0.resid_post a.op3 logit_lens bit=0 at=L0.resid_post width=8 out=app.a.buffer.top@0
  lm_head: %logits:S300 = matmul %final_norm w=lm_head split=vocab   # logits
  sample: %sampled:S1u32 = sample %logits vocab=300 eos=[257] logprobs=20   # sampled
`

const placedIR = `graph t (llama), tp 1
  embed: %embed:T8, %L0.attn_in:T8 = embed_norm table=embed w=L0.attn_norm eps=1e-05 vocab=300   # embed L0.resid_pre
  L0.qkv: %L0.qkv:T24 = matmul %L0.attn_in w=L0.wqkv split=column   # %L0.attn.q:T8=%L0.qkv[0:8] %L0.attn.k:T8=%L0.qkv[8:16] %L0.attn.v:T8=%L0.qkv[16:24]
  L0.rope_kv: rope %L0.qkv cos=rope.cos sin=rope.sin cache=L0.kcache cache=L0.vcache heads=2/2 dim=4
  L0.attention: %L0.attn.z:T8 = attention %L0.qkv cache=L0.kcache cache=L0.vcache heads=2/2 dim=4 scale=0.5   # L0.attn.z
  L0.attn.z: mi %L0.attn.z
      mi[x] a.op2 head_ablate bit=0 at=L0.attn.z width=8 vec=app.a.param.head1.mask alpha=scal[1]
  L0.o: %L0.attn_o:T8 = matmul %L0.attn.z w=L0.wo split=row reduce=L0.o.all_reduce   # L0.attn_out
  L0.attn_residual: %L0.resid_mid:T8, %L0.mlp_in:T8 = add_norm %embed, %L0.attn_o w=L0.mlp_norm eps=1e-05   # L0.resid_mid
      mi[delta] a.op0 steer_add bit=0 at=L0.attn_out width=8 vec=app.a.param.v alpha=scal[0]
  L0.gate_up: %L0.gate_up:T32 = matmul %L0.mlp_in w=L0.wgu split=column
  L0.silu_mul: %L0.mlp.act:T16 = activation %L0.gate_up fn=silu inter=16   # L0.mlp.act
  L0.down: %L0.mlp_down:T8 = matmul %L0.mlp.act w=L0.wdown split=row reduce=L0.mlp.all_reduce   # L0.mlp_out
  L0.mlp_residual: %L0.resid_post:T8, %final_norm:S8 = add_norm %L0.resid_mid, %L0.mlp_down w=final_norm eps=1e-05   # L0.resid_post final_norm
      mi[resid] a.op1 probe_linear bit=0 at=L0.resid_post width=8 vec=app.a.param.v out=app.a.buffer.p@0
  L0.resid_post.a.op3: lens %L0.resid_post a.op3 logit_lens bit=0 at=L0.resid_post width=8 out=app.a.buffer.top@0
  lm_head: %logits:S300 = matmul %final_norm w=lm_head split=vocab   # logits
  sample: %sampled:S1u32 = sample %logits vocab=300 eos=[257] logprobs=20   # sampled
`

const plannedIR = `graph t (llama), tp 1
  embed: %embed:T8@act.resid, %L0.attn_in:T8@act.xn = embed_norm table=embed w=L0.attn_norm eps=1e-05 vocab=300   # embed L0.resid_pre
  L0.qkv: %L0.qkv:T24@act.qkv = matmul %L0.attn_in w=L0.wqkv split=column   # %L0.attn.q:T8@act.qkv=%L0.qkv[0:8] %L0.attn.k:T8@act.qkv=%L0.qkv[8:16] %L0.attn.v:T8@act.qkv=%L0.qkv[16:24]
  L0.rope_kv: rope %L0.qkv cos=rope.cos sin=rope.sin cache=L0.kcache cache=L0.vcache heads=2/2 dim=4
  L0.attention: %L0.attn.z:T8@act.z = attention %L0.qkv cache=L0.kcache cache=L0.vcache heads=2/2 dim=4 scale=0.5   # L0.attn.z
  L0.attn.z: mi %L0.attn.z
      mi[x] a.op2 head_ablate bit=0 at=L0.attn.z width=8 vec=app.a.param.head1.mask alpha=scal[1]
  L0.o: %L0.attn_o:T8@act.delta = matmul %L0.attn.z w=L0.wo split=row reduce=L0.o.all_reduce   # L0.attn_out
  L0.attn_residual: %L0.resid_mid:T8@act.resid, %L0.mlp_in:T8@act.xn = add_norm %embed, %L0.attn_o w=L0.mlp_norm eps=1e-05   # L0.resid_mid
      mi[delta] a.op0 steer_add bit=0 at=L0.attn_out width=8 vec=app.a.param.v alpha=scal[0]
  L0.gate_up: %L0.gate_up:T32@act.gu = matmul %L0.mlp_in w=L0.wgu split=column
  L0.silu_mul: %L0.mlp.act:T16@act.mlp = activation %L0.gate_up fn=silu inter=16   # L0.mlp.act
  L0.down: %L0.mlp_down:T8@act.delta = matmul %L0.mlp.act w=L0.wdown split=row reduce=L0.mlp.all_reduce   # L0.mlp_out
  L0.mlp_residual: %L0.resid_post:T8@act.resid, %final_norm:S8@act.final = add_norm %L0.resid_mid, %L0.mlp_down w=final_norm eps=1e-05   # L0.resid_post final_norm
      mi[resid] a.op1 probe_linear bit=0 at=L0.resid_post width=8 vec=app.a.param.v out=app.a.buffer.p@0
  L0.resid_post.a.op3: lens %L0.resid_post a.op3 logit_lens bit=0 at=L0.resid_post width=8 out=app.a.buffer.top@0 skip_unless=0x1
  lm_head: %logits:S300@act.logits = matmul %final_norm w=lm_head split=vocab   # logits
  sample: %sampled:S1u32@out.sampled = sample %logits vocab=300 eos=[257] logprobs=20   # sampled
`

const gemmaBuiltIR = `graph g (gemma2), tp 1
  embed: %embed:T8 = embed table=embed vocab=300 scale=2.828125   # embed L0.resid_pre
  L0.attn_norm: %L0.attn_in:T8 = norm %embed w=L0.attn_norm eps=1e-06 offset=1
  L0.qkv: %L0.qkv:T16 = matmul %L0.attn_in w=L0.wqkv split=column   # %L0.attn.q:T8=%L0.qkv[0:8] %L0.attn.k:T4=%L0.qkv[8:12] %L0.attn.v:T4=%L0.qkv[12:16]
  L0.rope_kv: rope %L0.qkv cos=rope.cos sin=rope.sin cache=L0.kcache cache=L0.vcache heads=2/1 dim=4
  L0.attention: %L0.attn.z:T8 = attention %L0.qkv cache=L0.kcache cache=L0.vcache heads=2/1 dim=4 scale=0.35355338 softcap=2 window=5   # L0.attn.z
  L0.o: %L0.attn_o:T8 = matmul %L0.attn.z w=L0.wo split=row reduce=L0.o.all_reduce
  L0.attn_post_norm: %L0.attn_out:T8 = norm %L0.attn_o w=L0.attn_post_norm eps=1e-06 offset=1   # L0.attn_out
  L0.attn_residual: %L0.resid_mid:T8 = add %embed, %L0.attn_out   # L0.resid_mid
  L0.mlp_norm: %L0.mlp_in:T8 = norm %L0.resid_mid w=L0.mlp_norm eps=1e-06 offset=1
  L0.gate_up: %L0.gate_up:T32 = matmul %L0.mlp_in w=L0.wgu split=column
  L0.silu_mul: %L0.mlp.act:T16 = activation %L0.gate_up fn=gelu_tanh inter=16   # L0.mlp.act
  L0.down: %L0.mlp_down:T8 = matmul %L0.mlp.act w=L0.wdown split=row reduce=L0.mlp.all_reduce
  L0.mlp_post_norm: %L0.mlp_out:T8 = norm %L0.mlp_down w=L0.mlp_post_norm eps=1e-06 offset=1   # L0.mlp_out
  L0.mlp_residual: %L0.resid_post:T8 = add %L0.resid_mid, %L0.mlp_out   # L0.resid_post
  final_norm: %final_norm:S8 = norm %L0.resid_post w=final_norm eps=1e-06 offset=1   # final_norm
  lm_head: %logits_uncapped:S300 = matmul %final_norm w=embed split=vocab
  logits.softcap: %logits:S300 = softcap %logits_uncapped cap=3   # logits
  sample: %sampled:S1u32 = sample %logits vocab=300 eos=[257] logprobs=20   # sampled
`

const gemmaFusedIR = `graph g (gemma2), tp 1
  embed: %embed:T8, %L0.attn_in:T8 = embed_norm table=embed w=L0.attn_norm eps=1e-06 offset=1 vocab=300 scale=2.828125   # embed L0.resid_pre
  L0.qkv: %L0.qkv:T16 = matmul %L0.attn_in w=L0.wqkv split=column   # %L0.attn.q:T8=%L0.qkv[0:8] %L0.attn.k:T4=%L0.qkv[8:12] %L0.attn.v:T4=%L0.qkv[12:16]
  L0.rope_kv: rope %L0.qkv cos=rope.cos sin=rope.sin cache=L0.kcache cache=L0.vcache heads=2/1 dim=4
  L0.attention: %L0.attn.z:T8 = attention %L0.qkv cache=L0.kcache cache=L0.vcache heads=2/1 dim=4 scale=0.35355338 softcap=2 window=5   # L0.attn.z
  L0.o: %L0.attn_o:T8 = matmul %L0.attn.z w=L0.wo split=row reduce=L0.o.all_reduce
  L0.attn_residual: %L0.resid_mid:T8, %L0.mlp_in:T8, %L0.attn_out:T8(in kernel) = add_norm %embed, %L0.attn_o w=L0.mlp_norm delta_w=L0.attn_post_norm eps=1e-06 offset=1   # L0.resid_mid L0.attn_out
  L0.gate_up: %L0.gate_up:T32 = matmul %L0.mlp_in w=L0.wgu split=column
  L0.silu_mul: %L0.mlp.act:T16 = activation %L0.gate_up fn=gelu_tanh inter=16   # L0.mlp.act
  L0.down: %L0.mlp_down:T8 = matmul %L0.mlp.act w=L0.wdown split=row reduce=L0.mlp.all_reduce
  L0.mlp_residual: %L0.resid_post:T8, %final_norm:S8, %L0.mlp_out:T8(in kernel) = add_norm %L0.resid_mid, %L0.mlp_down w=final_norm delta_w=L0.mlp_post_norm eps=1e-06 offset=1   # L0.resid_post final_norm L0.mlp_out
  lm_head: %logits_uncapped:S300 = matmul %final_norm w=embed split=vocab
  logits.softcap: %logits:S300 = softcap %logits_uncapped cap=3   # logits
  sample: %sampled:S1u32 = sample %logits vocab=300 eos=[257] logprobs=20   # sampled
`

// TestAppSolo: a program of two apps has a Solo graph for each, in bit order, holding that
// app's ops alone (a lens's heavy node among them), while Graph holds both apps' and the
// ops' placement stays Graph's; a program of one app has none.
func TestAppSolo(t *testing.T) {
	steer := "app: s\nparams: {v: {random: 1}}\nops:\n  - write: {at: {layers: [0], hook: resid_post}, kernel: steer_add, args: {vector: v}}\n"
	probe := "app: p\nparams: {w: {random: 2}}\nbuffers: {x: {shape: [1]}, top: {shape: [2]}}\nops:\n" +
		"  - read: {at: {layers: [0], hook: resid_post}, kernel: probe_linear, args: {w: w}, into: x}\n" +
		"  - read: {at: {layers: [0], hook: resid_post}, kernel: logit_lens, args: {k: 1}, into: top}\n"
	apps := func(g *ir.Graph) map[string]int {
		n := map[string]int{}
		for _, nd := range g.Nodes {
			for _, m := range nd.AllMI() {
				n[m.App]++
			}
		}
		return n
	}
	p, err := plan(t, steer, probe)
	if err != nil {
		t.Fatal(err)
	}
	if got := apps(p.Graph); !maps.Equal(got, map[string]int{"s": 1, "p": 2}) {
		t.Fatalf("graph's ops by app: %v", got)
	}
	if len(p.Solo) != 2 || p.Solo[0].App.Name != "s" || p.Solo[1].App.Name != "p" {
		t.Fatalf("solo graphs: %d", len(p.Solo))
	}
	for _, s := range p.Solo {
		want := map[string]int{"s": 1}
		if s.App.Name == "p" {
			want = map[string]int{"p": 2}
		}
		if got := apps(s.Graph); !maps.Equal(got, want) {
			t.Errorf("solo graph of %s: ops by app %v, want %v", s.App.Name, got, want)
		}
	}
	for _, op := range p.Ops {
		if !slices.Contains(p.Graph.Nodes, op.Node) {
			t.Errorf("op %s of %s: placed outside Graph", op.Template, op.App.Name)
		}
	}
	one, err := plan(t, steer)
	if err != nil {
		t.Fatal(err)
	}
	if len(one.Solo) != 0 {
		t.Errorf("one app: %d solo graphs, want none", len(one.Solo))
	}
	var many []string
	for i := range MaxSoloApps + 1 {
		many = append(many, strings.Replace(steer, "app: s", fmt.Sprintf("app: s%d", i), 1))
	}
	over, err := plan(t, many...)
	if err != nil {
		t.Fatal(err)
	}
	if len(over.Solo) != 0 {
		t.Errorf("%d apps: %d solo graphs, want none", len(many), len(over.Solo))
	}
}
