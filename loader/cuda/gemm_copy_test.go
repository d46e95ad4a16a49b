package cuda

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"xmix/bundle"
	"xmix/compile"
)

// TestGatedCopyFor: a gated pair takes the kernel of the fewest rows that takes its own, and
// none of twice its rows or more, unless that kernel is in the wide form.
func TestGatedCopyFor(t *testing.T) {
	kernels := []bundle.GemmCopy{{Kernel: "r32", Attrs: bundle.GemmCopyAttrs{Rows: 32}}, {Kernel: "r64", Attrs: bundle.GemmCopyAttrs{Rows: 64}}}
	wide := []bundle.GemmCopy{{Kernel: "w64", Attrs: bundle.GemmCopyAttrs{Rows: 64, Wide: 112}}, {Kernel: "w128", Attrs: bundle.GemmCopyAttrs{Rows: 128, Wide: 112}}}
	for _, c := range []struct {
		kernels []bundle.GemmCopy
		rows    int
		want    string
	}{{kernels, 8, ""}, {kernels, 16, ""}, {kernels, 17, "r32"}, {kernels, 32, "r32"}, {kernels, 33, "r64"}, {kernels, 64, "r64"}, {kernels, 65, ""},
		{wide, 8, "w64"}, {wide, 32, "w64"}, {wide, 65, "w128"}, {wide, 129, ""}} {
		got, ok := gatedCopyFor(c.kernels, c.rows)
		if ok != (c.want != "") || ok && got.Kernel != c.want {
			t.Errorf("%d rows: %q %v, want %q", c.rows, got.Kernel, ok, c.want)
		}
	}
}

// TestPlainCopyFor: a plain GEMM takes the kernel of the fewest rows that takes its own, but a
// q/k/v projection whose kernels with rope_kv take its rows takes the plain kernel of that
// one's rows (its twin), as a layer whose rope_kv an app's op parts from the GEMM must.
func TestPlainCopyFor(t *testing.T) {
	plain := []bundle.GemmCopy{{Kernel: "r8", Attrs: bundle.GemmCopyAttrs{Rows: 8}}, {Kernel: "r16", Attrs: bundle.GemmCopyAttrs{Rows: 16}},
		{Kernel: "r32", Attrs: bundle.GemmCopyAttrs{Rows: 32}}, {Kernel: "r64", Attrs: bundle.GemmCopyAttrs{Rows: 64}}}
	rope := []bundle.GemmCopy{{Kernel: "r32_rope_kv", Attrs: bundle.GemmCopyAttrs{Rows: 32}}}
	for _, c := range []struct {
		rope []bundle.GemmCopy
		rows int
		want string
	}{{nil, 8, "r8"}, {nil, 9, "r16"}, {nil, 32, "r32"}, {nil, 64, "r64"}, {nil, 65, ""},
		{rope, 1, "r32"}, {rope, 8, "r32"}, {rope, 16, "r32"}, {rope, 32, "r32"}, {rope, 33, "r64"}, {rope, 65, ""}} {
		got, ok := plainCopyFor(plain, c.rope, c.rows)
		if ok != (c.want != "") || ok && got.Kernel != c.want {
			t.Errorf("rope kernels %d, %d rows: %q %v, want %q", len(c.rope), c.rows, got.Kernel, ok, c.want)
		}
	}
}

// TestSplitRopePairTakesTheTwin: on bundles xmixc builds, wherever an app's op at attn.q
// parts a layer's q/k/v GEMM from its rope_kv, the plain kernel the backend gives that GEMM
// (copyGemmOf) is the twin of the kernel with rope_kv that serves the same layer in the graph
// of steps without apps (planPair): the same rows, K split and columns a CTA, so rows without
// the op keep their bits. The 8B's buckets of 8, 16 and 32 rows (the 32-row kernel with
// rope_kv serves all three), its 64- and 128-row buckets with the wide kernel with rope_kv
// (without --copy-gemm-wide), and the 1B's 32-row bucket given copy-engine kernels for q/k/v
// (whose plain kernel splits K over 2 where no kernel with rope_kv is beside it).
func TestSplitRopePairTakesTheTwin(t *testing.T) {
	const app = "app: q-scale\nparams: {s: {random: 29}}\nops:\n  - write: {at: {layers: [1], hook: attn.q}, kernel: scale, args: {vector: s}}\n"
	for _, c := range []struct {
		model   string
		buckets string
		opt     compile.Options
	}{
		{"llama-3.1-8b", "8, 16, 32", compile.Options{}},
		{"llama-3.1-8b", "64, 128", compile.Options{RopeCopyRows: 128, CopyGemms: []string{"4096x4096", "4096x6144", "14336x4096"}}},
		{"llama-3.2-1b", "32", compile.Options{CopyGemms: []string{"2048x3072"}}},
	} {
		t.Run(c.model+"-"+strings.ReplaceAll(c.buckets, ", ", "-"), func(t *testing.T) {
			spec, err := os.ReadFile(filepath.Join("..", "..", "specs", "models", c.model+".yaml"))
			if err != nil {
				t.Fatal(err)
			}
			cut := regexp.MustCompile(`layers: \d+`).ReplaceAllString(string(spec), "layers: 2")
			cut = regexp.MustCompile(`(?s)serving:.*`).ReplaceAllString(cut, "serving: {decode_buckets: ["+c.buckets+"], prefill_chunks: [64], max_seq_len: 256, max_seqs: 128, kv_block_size: 16}\n")
			dir := t.TempDir()
			model, appPath := filepath.Join(dir, "m.yaml"), filepath.Join(dir, "a.yaml")
			if err := os.WriteFile(model, []byte(cut), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(appPath, []byte(app), 0o644); err != nil {
				t.Fatal(err)
			}
			backend := func(apps []string) (*Backend, *bundle.Bundle) {
				b, err := compile.Build(model, apps, c.opt)
				if err != nil {
					t.Fatal(err)
				}
				kernels, err := bundle.GemmCopyKernels(b.Kernels)
				if err != nil {
					t.Fatal(err)
				}
				be := &Backend{kernels: map[string]bundle.Kernel{}, copy: &copyServer{kernels: kernels}}
				for _, k := range b.Kernels {
					be.kernels[k.Name] = k
				}
				return be, b
			}
			bareBe, bare := backend(nil)
			withBe, with := backend([]string{appPath})
			// The kernel with rope_kv that serves each q/k/v GEMM of the bare bundle, by
			// template and label.
			fused := map[string]bundle.GemmCopyAttrs{}
			for _, tm := range bare.Templates {
				for i, n := range tm.Nodes {
					if p, ok, err := bareBe.planPair(tm.Nodes, i); err != nil {
						t.Fatal(err)
					} else if ok && !p.gated {
						fused[tm.Name+"/"+n.Label] = p.c.Attrs
					}
				}
			}
			split := 0
			for _, tm := range with.Templates {
				if tm.Kind != bundle.Decode {
					continue
				}
				for i, n := range tm.Nodes {
					f, ok := fused[tm.Name+"/"+n.Label]
					if !ok {
						continue
					}
					if _, ok, err := withBe.planPair(tm.Nodes, i); err != nil || ok {
						continue // served as in the bare bundle
					}
					split++
					_, p, ok, err := withBe.copyGemmOf(n)
					if err != nil || !ok {
						t.Fatalf("%s %s: no plain copy-engine kernel (%v) beside %+v", tm.Name, n.Label, err, f)
					}
					if p.Attrs.Rows != f.Rows || p.Attrs.Cluster != f.Cluster || p.Attrs.Wide != 2*f.Wide || p.Attrs.Block != f.Block {
						t.Errorf("%s %s: plain kernel %s %+v, want the twin of %+v", tm.Name, n.Label, p.Kernel, p.Attrs, f)
					}
				}
			}
			if split == 0 {
				t.Fatal("no layer's q/k/v GEMM parted from its rope_kv: the app's op did not split a pair")
			}
		})
	}
}
