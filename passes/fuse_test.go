package passes

import (
	"slices"
	"strings"
	"testing"
)

// fuseApp puts ops at the two values the fusions keep inside their kernels, attn.k and
// mlp.act, and one in the residual, which no fusion touches.
const fuseApp = `app: a
params: {v: {random: 1}}
buffers: {k: {shape: [8]}}
ops:
  - read: {at: {layers: [0], hook: attn.k}, kernel: capture, into: k}
  - write: {at: {layers: [0], hook: mlp.act}, kernel: scale, args: {alpha: 0.5}}
  - write: {at: {layers: [0], hook: resid_post}, kernel: steer_add, args: {vector: v}}
`

// fuse-qkv-rope and fuse-gate-act fold the rotation into the q/k/v projection and the gated
// activation into the gate/up projection (each fused node keeps its parts).
func TestFuseDecode(t *testing.T) {
	got := irWith(t, oneLayer, Options{Fuse: []string{"all"}}, "fuse-gate-act", false)
	sameIR(t, "after fuse-gate-act", got[0], fusedDecodeIR)
	sameIR(t, "the app-free graph after fuse-gate-act", got[1], fusedDecodeIR)
	// One fusion alone.
	got = irWith(t, oneLayer, Options{Fuse: []string{"gate-act"}}, "fuse-gate-act", false)
	if strings.Contains(got[0], "matmul+rope") || !strings.Contains(got[0], "matmul+activation") {
		t.Errorf("--fuse gate-act:\n%s", got[0])
	}
}

// A layer whose app ops sit at attn.k keeps q/k/v and the rotation apart, and says why; ops at
// mlp.act run in an MI kernel of their own after the fused gate/up kernel (foldGateAct); the
// app-free graph fuses both, and ops elsewhere (resid_post) do not stop a fusion.
func TestFuseKeepsMIHostsApart(t *testing.T) {
	got := irWith(t, oneLayer, Options{Fuse: []string{"all"}}, "place-mi", false, fuseApp)
	sameIR(t, "after place-mi", got[0], keptApartIR)
	sameIR(t, "the app-free graph after place-mi", got[1], fusedDecodeIR)
	// The ops at layer 0 leave layer 1 fused.
	two := strings.Replace(oneLayer, "layers: 1", "layers: 2", 1)
	ir := irWith(t, two, Options{Fuse: []string{"all"}}, "place-mi", false, fuseApp)[0]
	for _, want := range []string{"L0.qkv: %L0.qkv:T24 = matmul ", "L0.rope_kv: rope", "L1.qkv: %L1.qkv:T24 = matmul+rope",
		"L0.gate_up: %L0.mlp.act:T16, %L0.gate_up:T32 = matmul+activation", "L0.mlp.act: mi %L0.mlp.act",
		"L1.gate_up: %L1.mlp.act:T16, %L1.gate_up:T32 = matmul+activation"} {
		if !strings.Contains(ir, want) {
			t.Errorf("two layers, ops at layer 0: no %q in\n%s", want, ir)
		}
	}
}

// Qwen3's QK-norm keeps the rotation apart, with the reason; its MLP fuses.
func TestFuseQwen3(t *testing.T) {
	qwen3 := strings.Replace(oneLayer, "family: llama", "family: qwen3", 1)
	ir := irWith(t, qwen3, Options{Fuse: []string{"all"}}, "fuse-gate-act", false)[0]
	for _, want := range []string{"L0.rope_kv: rope", "unfused qkv-rope: QK-norm sums each head over columns", "= matmul+activation"} {
		if !strings.Contains(ir, want) {
			t.Errorf("no %q in\n%s", want, ir)
		}
	}
}

func TestFuseRefusesUnknown(t *testing.T) {
	m, as, err := parseSpecs(t, oneLayer)
	if err != nil {
		t.Fatal(err)
	}
	_, err = Run(m, as, Options{Fuse: []string{"qkv-rope", "rope-qkv"}})
	if err == nil || !strings.Contains(err.Error(), `--fuse "rope-qkv": no such fusion (fusions: qkv-rope, gate-act; or all, or none alone)`) {
		t.Fatalf("got %v", err)
	}
}

const fusedDecodeIR = `graph t (llama), tp 1
  embed: %embed:T8, %L0.attn_in:T8 = embed_norm table=embed w=L0.attn_norm eps=1e-05 vocab=300   # embed L0.resid_pre
  L0.qkv: %L0.qkv:T24 = matmul+rope %L0.attn_in w=L0.wqkv cos=rope.cos sin=rope.sin cache=L0.kcache cache=L0.vcache split=column heads=2/2 dim=4   # %L0.attn.q:T8=%L0.qkv[0:8] %L0.attn.k:T8=%L0.qkv[8:16] %L0.attn.v:T8=%L0.qkv[16:24]
  L0.attention: %L0.attn.z:T8 = attention %L0.qkv cache=L0.kcache cache=L0.vcache heads=2/2 dim=4 scale=0.5   # L0.attn.z
  L0.o: %L0.attn_o:T8 = matmul %L0.attn.z w=L0.wo split=row reduce=L0.o.all_reduce   # L0.attn_out
  L0.attn_residual: %L0.resid_mid:T8, %L0.mlp_in:T8 = add_norm %embed, %L0.attn_o w=L0.mlp_norm eps=1e-05   # L0.resid_mid
  L0.gate_up: %L0.mlp.act:T16, %L0.gate_up:T32 = matmul+activation %L0.mlp_in w=L0.wgu split=column fn=silu inter=16   # L0.mlp.act
  L0.down: %L0.mlp_down:T8 = matmul %L0.mlp.act w=L0.wdown split=row reduce=L0.mlp.all_reduce   # L0.mlp_out
  L0.mlp_residual: %L0.resid_post:T8, %final_norm:S8 = add_norm %L0.resid_mid, %L0.mlp_down w=final_norm eps=1e-05   # L0.resid_post final_norm
  lm_head: %logits:S300 = matmul %final_norm w=lm_head split=vocab   # logits
  sample: %sampled:S1u32 = sample %logits vocab=300 eos=[257] logprobs=20   # sampled
`

const keptApartIR = `graph t (llama), tp 1
  embed: %embed:T8, %L0.attn_in:T8 = embed_norm table=embed w=L0.attn_norm eps=1e-05 vocab=300   # embed L0.resid_pre
  L0.qkv: %L0.qkv:T24 = matmul %L0.attn_in w=L0.wqkv split=column   # %L0.attn.q:T8=%L0.qkv[0:8] %L0.attn.k:T8=%L0.qkv[8:16] %L0.attn.v:T8=%L0.qkv[16:24]
      unfused qkv-rope: MI ops at %L0.attn.k run between the two kernels
  L0.attn.k: mi %L0.attn.k
      mi[x] a.op0 capture bit=0 at=L0.attn.k width=8 out=app.a.buffer.k@0
  L0.rope_kv: rope %L0.qkv cos=rope.cos sin=rope.sin cache=L0.kcache cache=L0.vcache heads=2/2 dim=4
  L0.attention: %L0.attn.z:T8 = attention %L0.qkv cache=L0.kcache cache=L0.vcache heads=2/2 dim=4 scale=0.5   # L0.attn.z
  L0.o: %L0.attn_o:T8 = matmul %L0.attn.z w=L0.wo split=row reduce=L0.o.all_reduce   # L0.attn_out
  L0.attn_residual: %L0.resid_mid:T8, %L0.mlp_in:T8 = add_norm %embed, %L0.attn_o w=L0.mlp_norm eps=1e-05   # L0.resid_mid
  L0.gate_up: %L0.mlp.act:T16, %L0.gate_up:T32 = matmul+activation %L0.mlp_in w=L0.wgu split=column fn=silu inter=16   # L0.mlp.act
  L0.mlp.act: mi %L0.mlp.act
      mi[x] a.op1 scale bit=0 at=L0.mlp.act width=16 alpha=scal[0]
  L0.down: %L0.mlp_down:T8 = matmul %L0.mlp.act w=L0.wdown split=row reduce=L0.mlp.all_reduce   # L0.mlp_out
  L0.mlp_residual: %L0.resid_post:T8, %final_norm:S8 = add_norm %L0.resid_mid, %L0.mlp_down w=final_norm eps=1e-05   # L0.resid_post final_norm
      mi[resid] a.op2 steer_add bit=0 at=L0.resid_post width=8 vec=app.a.param.v alpha=scal[1]
  lm_head: %logits:S300 = matmul %final_norm w=lm_head split=vocab   # logits
  sample: %sampled:S1u32 = sample %logits vocab=300 eos=[257] logprobs=20   # sampled
`

// TestFusionSetDefaults: no list applies DefaultFusions, none alone applies nothing, none with
// another name is refused.
func TestFusionSetDefaults(t *testing.T) {
	for _, c := range []struct {
		names []string
		want  []string
		err   string
	}{
		{nil, DefaultFusions, ""},
		{[]string{"none"}, nil, ""},
		{[]string{}, nil, ""},
		{[]string{"all"}, FusionNames(), ""},
		{[]string{"none", "qkv-rope"}, nil, `--fuse "none": no such fusion`},
	} {
		set, err := fusionSet(c.names)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%v: got %v, want %q", c.names, err, c.err)
			}
			continue
		}
		var got []string
		for _, n := range FusionNames() {
			if set[n] {
				got = append(got, n)
			}
		}
		if err != nil || !slices.Equal(got, c.want) {
			t.Errorf("%v: got %v %v, want %v", c.names, got, err, c.want)
		}
	}
}
