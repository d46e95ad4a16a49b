package codegen

import (
	"reflect"
	"slices"
	"testing"

	"xmix/frontend"
	"xmix/ptx"
)

func loadSpec(t *testing.T, name string) *frontend.Model {
	t.Helper()
	m, err := frontend.LoadModel("../specs/models/" + name)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func staticShared(t *testing.T, k *Kernel) int {
	t.Helper()
	mod, err := ptx.Parse(k.PTX)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, s := range mod.Kernels[0].Shared {
		n += s.Len * s.T.Bytes()
	}
	return n
}

// TestGemma2Parts: every kernel of Gemma-2-2B's forward, configured by the parts' setters at
// its real dimensions, generates (the builder's inputs), with the values transformers uses.
func TestGemma2Parts(t *testing.T) {
	m := loadSpec(t, "gemma-2-2b.yaml")
	eps := float32(m.RMSEps)
	embed := GemmaRow(m, RowConfig{Hidden: m.Hidden, Vocab: m.Vocab, Eps: eps, WDtype: ptx.BF16, Load: "embed"})
	add := GemmaRow(m, RowConfig{Hidden: m.Hidden, Eps: eps, WDtype: ptx.BF16, Load: "add"})
	if embed.EmbedScale != 48 || embed.WOffset != 1 || embed.DeltaNorm || add.EmbedScale != 0 || add.WOffset != 1 || !add.DeltaNorm {
		t.Fatalf("row configs %+v / %+v", embed, add)
	}
	must(t)(RowNorm("embed", embed))
	if k := must(t)(RowNorm("add_norm", add)); !slices.Equal(paramNames(k)[:5], []string{"resid", "delta", "delta_w", "w", "out"}) {
		t.Errorf("add+norm params %v", paramNames(k))
	}
	final := add
	final.Gather = true
	must(t)(RowNorm("final_norm", final))

	blocks := m.MaxSeqLen / m.KVBlockSize
	base := AttnConfig{Heads: m.Heads, KVHeads: m.KVHeads, HeadDim: m.HeadDim, BlockSize: m.KVBlockSize, MaxBlocksPerSeq: blocks, KVDtype: ptx.BF16}
	for l, want := range []struct {
		window int
		suffix string
	}{{4096, "_cap50_w4096"}, {0, "_cap50"}} {
		c := GemmaAttention(m, l, base)
		if c.Scale != 1.0/16 || c.Softcap != 50 || c.Window != want.window || AttnKernelSuffix(c) != want.suffix {
			t.Errorf("layer %d: %+v, suffix %q", l, c, AttnKernelSuffix(c))
		}
		for _, v := range []AttnConfig{c, {Split: true}, {Singles: true}} {
			cc := c
			cc.Split, cc.Singles = v.Split, v.Singles
			if s := staticShared(t, must(t)(Attention("a", cc))); s > 48<<10 {
				t.Errorf("layer %d decode %+v: %d bytes of static shared memory", l, v, s)
			}
		}
		if !c.PrefillOK() {
			t.Fatal("head dim 256 on a bf16 cache has no tensor-core prefill")
		}
		if s := staticShared(t, must(t)(AttentionPrefill("p", c))); s > 48<<10 {
			t.Errorf("layer %d prefill: %d bytes of static shared memory", l, s)
		}
	}

	short := *m
	short.MaxSeqLen = 4096 // no sequence outgrows the window: layer 0 runs the full kernels
	if c := GemmaAttention(&short, 0, base); c.Window != 0 || AttnKernelSuffix(c) != "_cap50" {
		t.Errorf("max_seq_len 4096: %+v", c)
	}

	sc := GemmaSilu(m, SiluConfig{Inter: m.Intermediate})
	if sc.Act != ActGeluTanh || GatedKernelName(sc) != "gelu_tanh_mul_i9216" {
		t.Errorf("gated config %+v, name %s", sc, GatedKernelName(sc))
	}
	must(t)(SiluMul("g", sc))
	sc.Ops = testOps(m.Intermediate)["steer"] // mlp.act ops on GeGLU
	if k := must(t)(SiluMul("g_mi", sc)); k.Op != "gelu_tanh_mul" {
		t.Errorf("op %s", k.Op)
	}
	fc, ok := GemmaFinalSoftcap(m)
	if !ok || fc != (SoftcapConfig{Width: 256000, Cap: 30}) {
		t.Errorf("final softcap %+v %v", fc, ok)
	}
	must(t)(Softcap("softcap_logits", fc))

	names := Gemma2Tensors(m.Layers)
	if len(names) != 2+8*m.Layers {
		t.Errorf("%d buffers", len(names))
	}
	if got := names[layerBuf(25, "mlp_norm")]; !slices.Equal(got, []string{"model.layers.25.pre_feedforward_layernorm.weight"}) {
		t.Errorf("L25.mlp_norm: %v", got)
	}
}

// TestGemma2PartsLeaveLlama: the setters change nothing of another family's kernels.
func TestGemma2PartsLeaveLlama(t *testing.T) {
	m := loadSpec(t, "llama-3.1-8b.yaml")
	for _, load := range []string{"embed", "add"} {
		c := RowConfig{Hidden: m.Hidden, Vocab: m.Vocab, Eps: 1e-5, WDtype: ptx.BF16, Load: load}
		if got := GemmaRow(m, c); !reflect.DeepEqual(got, c) {
			t.Errorf("%s: %+v", load, got)
		}
	}
	a := AttnConfig{Heads: 32, KVHeads: 8, HeadDim: 128, Scale: 0.08838834764831845}
	if got := GemmaAttention(m, 0, a); got != a || AttnKernelSuffix(got) != "" {
		t.Errorf("attention %+v", got)
	}
	if s := (SiluConfig{Inter: 14336}); GemmaSilu(m, s).Act != "" || GatedKernelName(s) != "silu_mul_i14336" {
		t.Errorf("silu")
	}
	if _, ok := GemmaFinalSoftcap(m); ok {
		t.Error("llama caps its logits")
	}
}
