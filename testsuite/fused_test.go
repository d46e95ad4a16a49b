package testsuite

import (
	"bytes"
	"fmt"
	"strings"
	"testing"

	"xmix/bundle"
	"xmix/compile"
	"xmix/loader"
	"xmix/loader/cpu"
)

// stepBuffers runs a CPU backend and keeps what every step left in the activations, the KV
// cache and the outputs.
type stepBuffers struct {
	*cpu.Backend
	b     *bundle.Bundle
	steps []map[string][]byte
}

func (s *stepBuffers) Step(ti int) error {
	if err := s.Backend.Step(ti); err != nil {
		return err
	}
	m := map[string][]byte{}
	for _, buf := range s.b.Manifest.Buffers {
		switch buf.Kind {
		case bundle.KindActivation, bundle.KindKV, bundle.KindOutput:
			m[buf.Name] = bytes.Clone(s.Buffer(buf.Name))
		}
	}
	s.steps = append(s.steps, m)
	return nil
}

// TestFusedBundlesComputeTheUnfusedBits: on the CPU backend a bundle built with every fusion
// leaves, after every step, the bits the unfused bundle leaves in every activation, cache and
// output (prefill chunks, which keep their kernels apart, and decode buckets of 1, 2 and 4
// rows, which fuse), for each family the fusions touch; only the gate/up rows differ, which
// a fused GEMV keeps to itself. Its decode templates launch two kernels a layer fewer (one
// where the family cannot fuse the rotation).
func TestFusedBundlesComputeTheUnfusedBits(t *testing.T) {
	reqs := []loader.Request{{Prompt: []int{3, 1, 4, 1, 5, 9, 2, 6}, MaxTokens: 6}, {Prompt: []int{2, 7}, MaxTokens: 4},
		{Prompt: []int{1, 8, 2, 8}, MaxTokens: 5}, {Prompt: []int{6}, MaxTokens: 3}}
	for _, c := range []struct {
		name, spec string
		perLayer   int // kernels a decode step's layer loses
	}{
		{"llama", SmallModel, 2},
		{"qwen2", SmallQwen2, 2},
		{"qwen3", SmallQwen3, 1}, // QK-norm keeps the rotation apart
		{"gemma2", SmallGemma2, 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			plain := CompileWith(t, compile.Options{Fuse: []string{"none"}}, c.spec)
			fused := CompileWith(t, compile.Options{Fuse: []string{"all"}}, c.spec)
			layers := plain.Manifest.Model.Layers
			for i, tp := range plain.Templates {
				tf := fused.Templates[i]
				want := len(tp.Nodes)
				if tp.Kind == bundle.Decode {
					want -= c.perLayer * layers
				}
				if len(tf.Nodes) != want {
					t.Errorf("%s: %d nodes fused, %d unfused; want %d", tp.Name, len(tf.Nodes), len(tp.Nodes), want)
				}
			}
			run := func(b *bundle.Bundle) *stepBuffers {
				s := &stepBuffers{Backend: NewCPU(t, b).(*cpu.Backend), b: b}
				defer s.Close()
				eng, err := loader.NewEngine(b, s)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := eng.Generate(reqs); err != nil {
					t.Fatal(err)
				}
				return s
			}
			a, f := run(plain), run(fused)
			if len(a.steps) != len(f.steps) || len(a.steps) < 6 {
				t.Fatalf("%d steps unfused, %d fused", len(a.steps), len(f.steps))
			}
			for i := range a.steps {
				for name, want := range a.steps[i] {
					if name != "act.gu" && !bytes.Equal(f.steps[i][name], want) {
						t.Fatalf("step %d: %s differs from the unfused bundle's", i, name)
					}
				}
			}
		})
	}
}

// TestWideGateUpKeepsItsActivationKernel: the tensor-core gate/up kernel with its activation
// finds a gate row's up row an immediate offset away (32 bits), so a model whose up half
// starts past 2 GiB (hidden 16384, intermediate 65536: 2 GiB of gate) builds with the GEMM
// and the activation kernel after it in its 8-row bucket, where it used to fail to build; a
// narrower one still gets the fused kernel.
func TestWideGateUpKeepsItsActivationKernel(t *testing.T) {
	for _, c := range []struct {
		inter int
		fused bool
	}{{57344, true}, {65536, false}} {
		b := Compile(t, fmt.Sprintf(`model: wide
family: llama
dims: {hidden: 16384, intermediate: %d, layers: 1, heads: 128, kv_heads: 8, head_dim: 128, vocab: 300}
weights: {synthetic: {seed: 1, std: 0.02}}
tokenizer: bytes
bos: 256
serving: {decode_buckets: [8], prefill_chunks: [16], max_seq_len: 64, max_seqs: 8, kv_block_size: 16}
`, c.inter))
		kernels := map[string]string{}
		for _, tm := range b.Templates {
			if tm.Name == "decode_b8" {
				for _, n := range tm.Nodes {
					kernels[n.Label] = n.Kernel
				}
			}
		}
		gated := strings.HasPrefix(kernels["L0.gate_up"], "gemm_tcg_")
		if _, act := kernels["L0.silu_mul"]; gated != c.fused || act == c.fused {
			t.Errorf("intermediate %d: gate/up %q, activation kernel %v; want the fused kernel %v", c.inter, kernels["L0.gate_up"], act, c.fused)
		}
	}
}
