package codegen

import (
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

// TestGemma2KernelsAt2B: every kernel of Gemma-2-2B's forward, configured as its graph's
// lowering configures it at its real dimensions, generates, within the static shared memory
// a block may have.
func TestGemma2KernelsAt2B(t *testing.T) {
	m := loadSpec(t, "gemma-2-2b.yaml")
	eps, off := float32(m.RMSEps), float32(m.NormOffset)
	embed := RowConfig{Hidden: m.Hidden, Vocab: m.Vocab, Eps: eps, WDtype: ptx.BF16, Load: "embed", WOffset: off, EmbedScale: m.EmbedScale()}
	add := RowConfig{Hidden: m.Hidden, Eps: eps, WDtype: ptx.BF16, Load: "add", WOffset: off, DeltaNorm: true}
	if embed.EmbedScale != 48 || off != 1 {
		t.Fatalf("embed scale %g, norm offset %g", embed.EmbedScale, off)
	}
	must(t)(RowNorm("embed", embed))
	if k := must(t)(RowNorm("add_norm", add)); !slices.Equal(paramNames(k)[:5], []string{"resid", "delta", "delta_w", "w", "out"}) {
		t.Errorf("add+norm params %v", paramNames(k))
	}
	final := add
	final.Gather = true
	must(t)(RowNorm("final_norm", final))

	blocks := m.MaxSeqLen / m.KVBlockSize
	for l, want := range []struct {
		window int
		suffix string
	}{{4096, "_cap50_w4096"}, {0, "_cap50"}} {
		c := AttnConfig{Heads: m.Heads, KVHeads: m.KVHeads, HeadDim: m.HeadDim, BlockSize: m.KVBlockSize, MaxBlocksPerSeq: blocks,
			KVDtype: ptx.BF16, Scale: float32(m.AttnScale()), Softcap: float32(m.AttnSoftcap), Window: m.AttnWindow(l)}
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

	sc := SiluConfig{Inter: m.Intermediate, Act: ActGeluTanh}
	if GatedKernelName(sc) != "gelu_tanh_mul_i9216" || GatedKernelName(SiluConfig{Inter: 14336}) != "silu_mul_i14336" {
		t.Errorf("gated kernel names %s, %s", GatedKernelName(sc), GatedKernelName(SiluConfig{Inter: 14336}))
	}
	must(t)(SiluMul("g", sc))
	sc.Ops = testOps(m.Intermediate)["steer"] // mlp.act ops on GeGLU
	if k := must(t)(SiluMul("g_mi", sc)); k.Op != "gelu_tanh_mul" {
		t.Errorf("op %s", k.Op)
	}
	must(t)(Softcap("softcap_logits", SoftcapConfig{Width: m.Vocab, Cap: float32(m.FinalSoftcap)}))
	if AttnKernelSuffix(AttnConfig{Heads: 32, KVHeads: 8, HeadDim: 128}) != "" {
		t.Error("a Llama attention kernel is named apart")
	}
}
