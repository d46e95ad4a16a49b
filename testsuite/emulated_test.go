package testsuite

import (
	"fmt"
	"math"
	"testing"

	"xmix/bundle"
	"xmix/compile"
	"xmix/loader"
	"xmix/loader/cpu"
	"xmix/ops"
	"xmix/ptx"
	"xmix/ptx/emu"
)

// emuShadow runs every step twice: the CPU backend on its reference ops, and the same
// template's nodes as the bundle's PTX in the emulator, over a copy of every buffer as the
// step found it. It then compares what both left in the activations, the KV cache and the
// outputs. The engine goes on with the CPU's results, so the two never drift apart: each
// step is checked on its own. This is the bundle as a GPU would run it (launch grids,
// parameter bindings, workspaces and all) short of the GPU.
type emuShadow struct {
	*cpu.Backend
	b     *bundle.Bundle
	t     testing.TB
	mods  map[string]*ptx.Module
	steps int
	// worst is the largest relative L2 difference seen per buffer.
	worst map[string]float64
}

func newEmuShadow(t testing.TB, b *bundle.Bundle) *emuShadow {
	return &emuShadow{Backend: NewCPU(t, b).(*cpu.Backend), b: b, t: t, mods: map[string]*ptx.Module{}, worst: map[string]float64{}}
}

func (s *emuShadow) Step(ti int) error {
	mem := emu.NewMemory()
	addr := map[string]uint64{}
	for _, buf := range s.b.Manifest.Buffers {
		raw := s.Buffer(buf.Name)
		a := mem.Alloc(max(len(raw), 4))
		copy(mem.Bytes(a), raw)
		addr[buf.Name] = a
	}
	tmpl := s.b.Templates[ti]
	nodes := tmpl.Nodes
	if m, ok := addr[bundle.CtlAnyMask]; ok {
		nodes = tmpl.NodeLists()[tmpl.ListFor((ops.Arg{Mem: mem.Bytes(m)}).U32()[0])] // what the CPU runs too
	}
	if err := s.Backend.Step(ti); err != nil {
		return err
	}
	kernels := map[string]bundle.Kernel{}
	for _, k := range s.b.Kernels {
		kernels[k.Name] = k
	}
	for _, n := range nodes {
		if n.Collective != nil {
			return fmt.Errorf("node %s: collectives are not emulated", n.Label)
		}
		k := kernels[n.Kernel]
		mod, ok := s.mods[k.Name]
		if !ok {
			var err error
			if mod, err = ptx.Parse(k.PTX); err != nil {
				return fmt.Errorf("kernel %s: %w", k.Name, err)
			}
			s.mods[k.Name] = mod
		}
		params := make([]uint64, len(n.Args))
		for i, a := range n.Args {
			params[i] = a.Const
			if a.Buffer != "" {
				params[i] = addr[a.Buffer] + uint64(a.Offset)
			}
		}
		if err := emu.Run(mod, k.Name, emu.Launch{Grid: n.Grid, Block: n.Block}, mem, params); err != nil {
			return fmt.Errorf("%s node %s (kernel %s) emulated: %w", tmpl.Name, n.Label, k.Name, err)
		}
	}
	s.steps++
	for _, buf := range s.b.Manifest.Buffers {
		switch {
		case buf.Kind != bundle.KindActivation && buf.Kind != bundle.KindKV && buf.Kind != bundle.KindOutput:
			continue
		case buf.Name == "act.gemm_ws":
			// The staged GEMMs' split-K partials, which the reference never writes (its
			// counters' return to zero is TestGemmTCStagedReplay's).
			continue
		}
		got, want := mem.Bytes(addr[buf.Name])[:len(s.Buffer(buf.Name))], s.Buffer(buf.Name)
		var d float64
		switch {
		case buf.Name == bundle.OutSampled || buf.Dtype == "u32":
			for i := 0; i+4 <= len(want); i += 4 {
				if (ops.Arg{Mem: got[i : i+4]}).U32()[0] != (ops.Arg{Mem: want[i : i+4]}).U32()[0] {
					d = math.Inf(1)
				}
			}
		case buf.Dtype == "bf16":
			d = relBytes(got, want, 2)
		default:
			d = relBytes(got, want, 4)
		}
		s.worst[buf.Name] = math.Max(s.worst[buf.Name], d)
	}
	return nil
}

// relBytes is the relative L2 difference of two f32 (size 4) or bf16 (size 2) arrays,
// skipping elements that are NaN in both (poisoned, never written).
func relBytes(got, want []byte, size int) float64 {
	at := func(b []byte, i int) float64 {
		if size == 2 {
			return float64(ops.BF16ToF32((ops.Arg{Mem: b[i : i+2]}).U16()[0]))
		}
		return float64((ops.Arg{Mem: b[i : i+4]}).F32()[0])
	}
	var num, den float64
	for i := 0; i+size <= len(want); i += size {
		g, w := at(got, i), at(want, i)
		if g == w || math.IsNaN(g) && math.IsNaN(w) { // equal infinities too (inf - inf is NaN)
			continue
		}
		num += (g - w) * (g - w)
		den += w * w
	}
	if den == 0 {
		return math.Sqrt(num)
	}
	return math.Sqrt(num / den)
}

// TestEmulatedBundleMatchesReferenceOps: Gemma 2 (prefill with the sliding window binding,
// decode, a split decode attention at batch 1, the apps of the hooks check) and a Llama run
// with every node's PTX emulated beside the reference ops; then with every fusion (the fused
// GEMVs of the decode buckets): a Llama whose app's ops at attn.q (layer 1) and mlp.act
// (layer 2) keep those layers' kernels apart, in a batch with a row without the app, Gemma 2
// (GeGLU) and Qwen2 (the q/k/v bias in the fused rotation). Tensor-core prefill attention
// rounds Q and P to bf16, the rest is f32 math: every buffer within 1e-2, the sampled tokens
// equal.
func TestEmulatedBundleMatchesReferenceOps(t *testing.T) {
	if testing.Short() {
		t.Skip("emulates every kernel of every step")
	}
	hello := []int{72, 101, 108, 108, 111, 32, 119, 111, 114, 108, 100}
	lens := "app: lens\nbuffers: {top: {shape: [10], export: true}}\nops:\n" +
		"  - read: {at: {layers: [1], hook: resid_post}, kernel: logit_lens, args: {k: 5}, into: top}\n"
	split := `app: split
buffers: {q: {shape: [128]}, act: {shape: [192]}}
ops:
  - read: {at: {layers: [1], hook: attn.q}, kernel: capture, into: q}
  - write: {at: {layers: [2], hook: mlp.act}, kernel: scale, args: {alpha: 0.5}}
`
	for _, c := range []struct {
		name, spec string
		apps       []string
		reqs       []loader.Request
		opt        compile.Options
	}{
		// Two requests (decode bucket 2), one with the hooks' captures and the lens.
		{"gemma2", SmallGemma2, []string{gemma2HooksApp, lens}, []loader.Request{
			{Prompt: hello, MaxTokens: 5, Apps: []string{"hooks", "lens"}}, {Prompt: hello[:4], MaxTokens: 6}}, compile.Options{}},
		{"gemma2-bf16-kv", SmallGemma2 + "kv_dtype: bf16\n", nil, []loader.Request{{Prompt: hello, MaxTokens: 4}}, compile.Options{}},
		{"llama", SmallModel, nil, []loader.Request{{Prompt: []int{3, 1, 4, 1, 5, 9, 2, 6}, MaxTokens: 4}}, compile.Options{}},
		{"llama-fused", SmallModel, []string{split}, []loader.Request{
			{Prompt: []int{3, 1, 4, 1, 5, 9, 2, 6}, MaxTokens: 4, Apps: []string{"split"}}, {Prompt: []int{2, 7, 1}, MaxTokens: 5}}, compile.Options{Fuse: []string{"all"}}},
		{"gemma2-fused", SmallGemma2, nil, []loader.Request{{Prompt: hello, MaxTokens: 4}}, compile.Options{Fuse: []string{"all"}}},
		{"qwen2-fused", SmallQwen2, nil, []loader.Request{{Prompt: hello, MaxTokens: 4}}, compile.Options{Fuse: []string{"all"}}},
		// Built without programmatic dependent launch (the others are built for it: the
		// grid-dependency instructions at the head of every kernel leave every buffer as it was).
		{"llama-serial", SmallModel, nil, []loader.Request{{Prompt: []int{3, 1, 4, 1, 5, 9, 2, 6}, MaxTokens: 4}}, compile.Options{SerialLaunch: true}},
		// GEMVs that prefetch their weights and then wait (fused ones too), in blocks of two
		// warps, and (decode bucket 2) warps of four columns.
		{"llama-gemv", SmallModel, []string{split}, []loader.Request{
			{Prompt: []int{3, 1, 4, 1, 5, 9, 2, 6}, MaxTokens: 4, Apps: []string{"split"}}, {Prompt: []int{2, 7, 1}, MaxTokens: 5}},
			compile.Options{Fuse: []string{"all"}, Prefetch: 1 << 20, GemvCols: 4, GemvWarps: 2}},
		// GEMVs whose columns' K is split over eight warps (--gemv-split 8: every weight of
		// this model but the LM head), fused ones too, at decode buckets 1 and 2.
		{"llama-split", SmallModel, []string{split}, []loader.Request{
			{Prompt: []int{3, 1, 4, 1, 5, 9, 2, 6}, MaxTokens: 4, Apps: []string{"split"}}, {Prompt: []int{2, 7, 1}, MaxTokens: 5}},
			compile.Options{Fuse: []string{"all"}, GemvSplit: 8}},
		// Tensor cores from 4 rows (--tensor-core-rows 4, --gated-tc-rows 0): three requests
		// decode in bucket 4 on tensor cores, unfused, and then in bucket 2 on fused GEMVs.
		{"llama-tc4", SmallModel, []string{split}, []loader.Request{
			{Prompt: []int{3, 1, 4, 1, 5, 9, 2, 6}, MaxTokens: 4, Apps: []string{"split"}}, {Prompt: []int{2, 7, 1}, MaxTokens: 5}, {Prompt: []int{8, 2}, MaxTokens: 2}},
			compile.Options{TensorCoreRows: 4, GatedTCRows: -1}},
		// The same with the gate/up projection and its activation as one tensor-core kernel in
		// bucket 4 (the default up to 8 rows), the split app's write at mlp.act in the same step.
		{"llama-gated-tc", SmallModel, []string{split}, []loader.Request{
			{Prompt: []int{3, 1, 4, 1, 5, 9, 2, 6}, MaxTokens: 4, Apps: []string{"split"}}, {Prompt: []int{2, 7, 1}, MaxTokens: 5}, {Prompt: []int{8, 2}, MaxTokens: 2}},
			compile.Options{TensorCoreRows: 4}},
		// The q/k/v rotation and KV write in the attention (--rope-in-attention, the default)
		// of the 40-row bucket, whose attention runs one block a row on tensor cores (16 kv
		// heads of 64 dims in bf16: 640 blocks), three requests in it; the 2-row bucket keeps
		// the fused GEMV with the rotation.
		{"llama-rope-in-attention", smallRopeAttn, nil, []loader.Request{
			{Prompt: []int{3, 1, 4, 1, 5, 9, 2, 6}, MaxTokens: 4}, {Prompt: []int{2, 7, 1}, MaxTokens: 5}, {Prompt: []int{8, 2, 8}, MaxTokens: 3}},
			compile.Options{}},
		// The staged tensor-core GEMMs (--gemm tc-staged, bucket kernels with a ring of W
		// stages, preloaded before the wait) in the prefill chunks.
		{"llama-staged", SmallModel, nil, []loader.Request{
			{Prompt: []int{3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7}, MaxTokens: 4}, {Prompt: []int{2, 7, 1, 8, 2, 8, 1, 8, 2}, MaxTokens: 3}},
			compile.Options{GEMM: "tc-staged", TCChunks: []int{8, 6}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			b := CompileWith(t, c.opt, c.spec, c.apps...)
			s := newEmuShadow(t, b)
			defer s.Close()
			eng, err := loader.NewEngine(b, s)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := eng.Generate(c.reqs); err != nil {
				t.Fatal(err)
			}
			if s.steps < 3 {
				t.Fatalf("%d steps emulated", s.steps)
			}
			for name, d := range s.worst {
				if !(d <= 1e-2) {
					t.Errorf("%s: emulated PTX differs from the reference ops by %.3g", name, d)
				}
			}
			t.Logf("%d steps; worst differences: %v", s.steps, s.worst)
		})
	}
}

// smallRopeAttn is a random Llama whose 40-row decode bucket's attention runs one block a row
// on tensor cores (bf16 cache, head dim 64, KV blocks of 16, 40 rows x 16 kv heads past the
// 528 blocks a split aims for).
const smallRopeAttn = `model: small-rope-attn
family: llama
dims: {hidden: 128, intermediate: 192, layers: 2, heads: 32, kv_heads: 16, head_dim: 64, vocab: 300,
       rope_theta: 500000, rms_eps: 1.0e-5, tie_embeddings: false}
weights: {synthetic: {seed: 4, std: 0.08}}
tokenizer: bytes
bos: 256
eos: [257]
kv_dtype: bf16
serving: {decode_buckets: [1, 2, 40], prefill_chunks: [16], max_seq_len: 64, max_seqs: 40, kv_block_size: 16}
`

// TestEmulatedChecks runs the shared suite, as TestCPU does, on emuShadow: every step of
// every bundle the checks build, the bare ones they compare against too, also runs as the
// bundle's PTX in the emulator, and every buffer must stay within 1e-2 of the reference ops.
// The checks reach kernels TestEmulatedBundleMatchesReferenceOps does not: the row kernels of
// templates of 8 rows or more preload their MI ops' vectors and scalars before their
// grid-dependency wait, finding a per-request scalar row through the row's sequence slot
// (ctl_seq), and only the per-request checks' 16-row prefill chunks meet per-request rows
// there. Gates that read slot 0's scalar row passed every CPU test and failed only on the GPU,
// in threshold_override, per_request_layers and seven_apps_mixed: here they fail without one.
func TestEmulatedChecks(t *testing.T) {
	if testing.Short() {
		t.Skip("emulates every kernel of every step of every check")
	}
	newShadow := func(t testing.TB, b *bundle.Bundle) loader.Backend {
		s := newEmuShadow(t, b)
		t.Cleanup(func() {
			for name, d := range s.worst {
				if !(d <= 1e-2) {
					t.Errorf("%s: emulated PTX differs from the reference ops by %.3g", name, d)
				}
			}
		})
		return s
	}
	for _, c := range Checks {
		t.Run(c.Name, func(t *testing.T) { c.Run(t, newShadow) })
	}
}
