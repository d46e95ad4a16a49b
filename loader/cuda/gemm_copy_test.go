package cuda

import (
	"regexp"
	"slices"
	"strings"
	"testing"

	"xmix/bundle"
	"xmix/compile"
	"xmix/testsuite"
)

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

// TestAppOpsKeepTheServers: on bundles xmixc builds, an app's op at any hook of layer 1 leaves
// every node of the decode and prefill templates (in the graphs that may run the op, and in
// the plain list of steps without apps) with the kernel and the server it has in the bundle
// without the app (the same kernel with an epilogue, planPair, or the same plain one,
// copyGemmOf), but for the op's host and where the op parts a q/k/v GEMM from its rope_kv
// (attn.q, attn.k, attn.v): there the GEMM's plain kernel is the twin of the kernel with
// rope_kv that serves it without the app (the same rows, K split and columns a CTA), and an
// attention that does rope_kv's work without the app (from 128 rows) runs after rope_kv in its
// plain form, so rows without the op keep their bits. Bundles: the defaults of the 8B (its 32-row kernel with
// rope_kv serves the 8-, 16- and 32-row buckets), the 1B, Qwen3-8B, Gemma-2-2B and Mixtral
// (router_logits in place of mlp.act); the 8B's 64- and 128-row buckets with the wide kernels
// with rope_kv and gate/up (without --copy-gemm-wide), and its small buckets served by 64-row
// wide kernels (copy_gemm.sh's w32); the 1B's 32-row bucket given copy-engine kernels for
// q/k/v (whose plain kernel splits K over 2 where no kernel with rope_kv is beside it).
func TestAppOpsKeepTheServers(t *testing.T) {
	hooks := []string{"resid_pre", "attn.q", "attn.k", "attn.v", "attn.z", "attn_out", "resid_mid", "mlp.act", "mlp_out", "resid_post"}
	wide8B := compile.Options{RopeCopyRows: 128, GatedCopyRows: 128, CopyGemms: []string{"4096x4096", "4096x6144", "14336x4096"}}
	w32 := wide8B // copy_gemm.sh's w32: 64-row wide kernels in the smaller buckets
	w32.CopyGemmRows, w32.CopyGemmWide = []int{8, 16, 64, 128}, true
	small, all := []int{8, 16, 32}, []int{8, 16, 32, 64, 128}
	for _, c := range []struct {
		name, model string
		buckets     []int
		opt         compile.Options
	}{
		{"8b-small", "llama-3.1-8b", small, compile.Options{}},
		{"8b-large", "llama-3.1-8b", []int{64, 128}, compile.Options{}},
		{"8b-large-wide", "llama-3.1-8b", []int{64, 128}, wide8B},
		{"8b-small-w32", "llama-3.1-8b", small, w32},
		{"1b", "llama-3.2-1b", all, compile.Options{}},
		{"1b-qkv-copy", "llama-3.2-1b", []int{32}, compile.Options{CopyGemms: []string{"2048x3072"}}},
		{"qwen3-8b", "qwen3-8b", all, compile.Options{}},
		{"gemma-2-2b", "gemma-2-2b", all, compile.Options{}},
		{"mixtral", "mixtral-8x7b", all, compile.Options{}},
	} {
		t.Run(c.name, func(t *testing.T) {
			model := testsuite.SpecCut(t, c.model, testsuite.CutServing(c.buckets...))
			bare := servedNodes(t, testsuite.CompileWith(t, c.opt, model))[0]
			ropePairs := false // whether the bundle serves q/k/v with its rope_kv
			for _, b := range bare {
				ropePairs = ropePairs || b.pair && b.attrs.RopeKV != nil
			}
			gemvRope := regexp.MustCompile(`^gemm_k\d+_n\d+_.*_rope_kv_`)
			hooks := hooks
			if strings.HasPrefix(c.model, "mixtral") { // experts' activations have no hook; the router's logits do
				hooks = append(slices.DeleteFunc(slices.Clone(hooks), func(h string) bool { return h == "mlp.act" }), "router_logits")
			}
			for _, hook := range hooks {
				app := "app: scale-" + strings.ReplaceAll(hook, ".", "-") + "\nparams: {s: {random: 29}}\nops:\n  - write: {at: {layers: [1], hook: " + hook + "}, kernel: scale, args: {vector: s}}\n"
				split := 0
				rope := strings.HasPrefix(hook, "attn.") && hook != "attn.z" // an op between q/k/v and its rotation
				graphs := servedNodes(t, testsuite.CompileWith(t, c.opt, model, app))
				if len(graphs[1]) == 0 {
					t.Fatalf("%s: no template has a plain list beside the app's graphs", hook)
				}
				for key, s := range graphs[1] { // the plain lists: the bare bundle's
					if b := bare[key]; s.node != b.node || s.kernel != b.kernel || s.pair != b.pair || s.gu != b.gu {
						t.Errorf("%s: %s in steps without apps: %+v, without the app %+v", hook, key, s, b)
					}
				}
				for key, s := range graphs[0] {
					b, ok := bare[key]
					if ok && s.node != b.node && !strings.Contains(s.node, "_mi") && !(rope && (gemvRope.MatchString(b.node) || s.node+"_rope" == b.node)) {
						// Not the op's host, nor a q/k/v GEMV parted from its rope_kv (the
						// fused GEMV sums as the plain one: codegen's TestGemmRopeKernel), nor
						// the attention that takes rope_kv's work without the app, which runs
						// after rope_kv in the plain form (the same bits: codegen's
						// TestAttentionRope).
						t.Errorf("%s: %s: kernel %s, %s without the app", hook, key, s.node, b.node)
					}
					if ok && s.gu != b.gu {
						t.Errorf("%s: %s: gu in bf16 %v, %v without the app", hook, key, s.gu, b.gu)
					}
					switch {
					case !ok || s.kernel == b.kernel:
					case b.pair && b.attrs.RopeKV != nil && !s.pair:
						split++
						if s.attrs.Rows != b.attrs.Rows || s.attrs.Cluster != b.attrs.Cluster || s.attrs.Wide != 2*b.attrs.Wide || s.attrs.Block != b.attrs.Block {
							t.Errorf("%s: %s: plain kernel %s %+v, want the twin of %s %+v", hook, key, s.kernel, s.attrs, b.kernel, b.attrs)
						}
					default:
						t.Errorf("%s: %s: served by %q, by %q without the app", hook, key, s.kernel, b.kernel)
					}
				}
				if ropePairs && rope != (split > 0) {
					t.Errorf("%s: %d q/k/v GEMMs parted from their rope_kv", hook, split)
				}
			}
		})
	}
}

// TestGatedTCYieldsToServedCopies: the compiler gives a decode bucket's gate/up the gated
// tensor-core kernel only where this backend serves no gated copy-engine kernel for it
// (codegen's gatedCopyServes against bundle.GatedCopyFor here), so no bucket falls back to the
// library and the activation kernel: on the 8B the 32-row bucket's 64-row wide kernel serves
// the 8-row bucket's gate/up and SiLU as one launch; on the 1B the 32-row bucket keeps its own
// kernel, which is not wide and serves no 8 rows, so the 8-row bucket keeps the tensor-core
// kernel; a build without gated copy-engine kernels keeps it on the 8B too.
func TestGatedTCYieldsToServedCopies(t *testing.T) {
	for _, c := range []struct {
		name, model string
		opt         compile.Options
		want        string // the 8-row bucket's gate/up: its copy-engine kernel, or the node's kernel
	}{
		{"8b", "llama-3.1-8b", compile.Options{}, "gemm_copy_k4096_n28672_r64_silu_mul"},
		{"8b-no-gated-copies", "llama-3.1-8b", compile.Options{GatedCopyRows: -1}, "gemm_tcg_k4096_n28672_r8u2_silu_mul_i14336"},
		{"1b", "llama-3.2-1b", compile.Options{}, "gemm_tcg_k2048_n16384_r8u2_silu_mul_i8192"},
	} {
		t.Run(c.name, func(t *testing.T) {
			served := servedNodes(t, testsuite.CompileWith(t, c.opt, testsuite.SpecCut(t, c.model, testsuite.CutServing(8, 32))))[0]
			for _, layer := range []string{"L0", "L1"} {
				s, ok := served["decode_b8 "+layer+".gate_up"]
				got := s.node
				if s.pair {
					got = s.kernel
				}
				if !ok || got != c.want || s.pair != strings.HasPrefix(c.want, "gemm_copy_") {
					t.Errorf("decode_b8 %s.gate_up: %+v (found %v), want %s", layer, s, ok, c.want)
				}
			}
		})
	}
}

// servedNode is a node's kernel and, for a GEMM node, how the backend serves it: the
// copy-engine kernel (none: the library) and its attributes, whether it takes the node after
// it too (pair), and whether, served by the library, it writes gu in bf16 for the activation
// after it (guBF16At's pair; the activation's bits follow).
type servedNode struct {
	node, kernel string
	attrs        bundle.GemmCopyAttrs
	pair, gu     bool
}

// servedNodes says how a backend of mode GemmAuto serves each node of b's templates
// (servedNode), by template and label: in the graphs of the templates' nodes, and in their
// plain lists (steps without apps, where the bundle has any).
func servedNodes(t *testing.T, b *bundle.Bundle) [2]map[string]servedNode {
	t.Helper()
	kernels, err := bundle.GemmCopyKernels(b.Kernels)
	if err != nil {
		t.Fatal(err)
	}
	be := &Backend{kernels: map[string]bundle.Kernel{}, copy: &copyServer{kernels: kernels}}
	for _, k := range b.Kernels {
		be.kernels[k.Name] = k
	}
	out := [2]map[string]servedNode{{}, {}}
	for _, tm := range b.Templates {
		for list, nodes := range [][]bundle.Node{tm.Nodes, tm.Plain} {
			for i := 0; i < len(nodes); i++ {
				n := nodes[i]
				key := tm.Name + " " + n.Label
				p, ok, err := be.planPair(nodes, i)
				if err != nil {
					t.Fatal(err)
				}
				if ok {
					out[list][key] = servedNode{n.Kernel, p.c.Kernel, p.c.Attrs, true, false}
					i++ // the node after it is served too
					continue
				}
				_, _, gu, err := bundle.GatedPairAt(nodes, i, func(name string) bundle.Kernel { return be.kernels[name] })
				if err != nil {
					t.Fatal(err)
				}
				out[list][key] = servedNode{node: n.Kernel, gu: gu}
				if _, c, ok, err := be.copyGemmOf(n); err != nil {
					t.Fatal(err)
				} else if ok {
					out[list][key] = servedNode{n.Kernel, c.Kernel, c.Attrs, false, false}
				}
			}
		}
	}
	return out
}
