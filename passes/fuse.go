package passes

import (
	"fmt"
	"slices"
	"strings"

	"xmix/ir"
)

// The fuse passes fold a node into the one before it, so that a decode step launches fewer
// kernels (issue 14; `xmixc build --fuse`, off by default until measured on the GPU). They run
// after attach-mi, when every MI op sits at its hook value: an op at a value that the fused
// kernel would keep to itself (attn.q/k/v between the projection and the rotation, mlp.act
// between the projection and the down projection) keeps its layer's kernels apart, so the
// op's host kernel stays what it is, and the node says why (ir.Node.Unfused, printed by
// `xmixc check --dump-ir`). They fuse the app-free graph (Plain) everywhere: a step in which
// no row enables an app runs every fusion. Fused kernels compute the bits of the pair they
// replace (codegen's tests check it), so rows without an app are the app-free bundle's bits
// whichever layers fused.

// Fusion is one fuse pass: the name `--fuse` takes and what it folds.
type Fusion struct {
	Name, What string
	// fold returns the fused node of a and b (b right after a), or nil; and, when it does not
	// fold a pair it would, why (a note on a).
	fold func(a, b *ir.Node) (*ir.Node, string)
}

// Fusions are the fuse passes, in pass order.
var Fusions = []Fusion{
	{"qkv-rope", "RoPE and the KV-cache write in the q/k/v projection's GEMV epilogue (buckets under 8 rows)", foldQKVRope},
	{"gate-act", "SiLU(gate)*up (GeGLU's GELU) in the gate/up projection's GEMV epilogue (buckets under 8 rows), or its tensor-core kernel's (decode buckets of up to --gated-tc-rows rows)", foldGateAct},
}

// DefaultFusions are the fusions a build applies when it names none (Options.Fuse nil),
// measured on the H200 with the kernels launched early. qkv-rope (testsuite/gpu/FUSE_AB.md,
// session 7 call 6) shortens the batch-1 step by 0.8% on Llama-3.1-8B and 3.1% on
// Llama-3.2-1B. gate-act lengthened it by 1.6% on the 8B as long as GEMV blocks had eight
// warps (its warps stream a column pair each, so its blocks took twice as long and the
// kernel's tail grew); with the default two-warp blocks (compile.DefaultGemvWarps) it
// shortens the step by 0.7-0.9% more on the 8B and 1.6-1.7% on the 1B at batch 1, and by
// 2.5% and 5.3% at batch 2 (testsuite/gpu/RESULTS.md, session 19).
var DefaultFusions = []string{"qkv-rope", "gate-act"}

// FusionNames lists the fusions' names in pass order.
func FusionNames() []string {
	var out []string
	for _, f := range Fusions {
		out = append(out, f.Name)
	}
	return out
}

// Fused lists the fusions p applies, in pass order.
func (p *Program) Fused() []string {
	var out []string
	for _, f := range Fusions {
		if p.Fuse[f.Name] {
			out = append(out, f.Name)
		}
	}
	return out
}

func init() {
	for _, n := range DefaultFusions {
		if !slices.Contains(FusionNames(), n) {
			panic("passes: DefaultFusions names " + n + ", which is no fusion")
		}
	}
}

// fusionSet checks names (each a fusion, "all", or "none" alone; nil: DefaultFusions) and
// returns the set they turn on.
func fusionSet(names []string) (map[string]bool, error) {
	if names == nil {
		names = DefaultFusions
	}
	set := map[string]bool{}
	for _, n := range names {
		switch {
		case n == "none" && len(names) == 1:
		case n == "all":
			for _, f := range Fusions {
				set[f.Name] = true
			}
		case slices.Contains(FusionNames(), n):
			set[n] = true
		default:
			return nil, fmt.Errorf("--fuse %q: no such fusion (fusions: %s; or all, or none alone)", n, strings.Join(FusionNames(), ", "))
		}
	}
	return set, nil
}

// fusePass is the pass of the fusion named name: every graph's pairs folded, when p turns it
// on.
func fusePass(name string) func(*Program) error {
	i := slices.IndexFunc(Fusions, func(f Fusion) bool { return f.Name == name })
	if i < 0 {
		panic("passes: no fusion " + name) // a programming error
	}
	f := Fusions[i]
	return func(p *Program) error {
		if !p.Fuse[f.Name] {
			return nil
		}
		for _, g := range p.graphs() {
			var nodes []*ir.Node
			for i := 0; i < len(g.Nodes); i++ {
				a := g.Nodes[i]
				if i+1 < len(g.Nodes) {
					fused, why := f.fold(a, g.Nodes[i+1])
					if fused != nil {
						nodes = append(nodes, fused)
						i++
						continue
					}
					if why != "" {
						a.Unfused = append(a.Unfused, f.Name+": "+why)
					}
				}
				nodes = append(nodes, a)
			}
			g.Nodes = nodes
		}
		return nil
	}
}

// fused makes the node of op that runs a, then b: a's name, inputs and layer, the outputs
// out, the parts' weights and caches.
func fused(op ir.Op, a, b *ir.Node, out ...*ir.Value) *ir.Node {
	n := &ir.Node{Op: op, Name: a.Name, Layer: a.Layer, In: a.In, Out: out, Parts: []*ir.Node{a, b},
		W: append(append([]ir.Use(nil), a.W...), b.W...), State: append(append([]*ir.State(nil), a.State...), b.State...)}
	for _, v := range out {
		v.Def = n
		for _, w := range v.Views {
			w.Def = n
		}
	}
	return n
}

// withMI names the first of vs (or of their views) that carries MI ops, "" when none does.
func withMI(vs ...*ir.Value) string {
	for _, v := range vs {
		for _, w := range append([]*ir.Value{v}, v.Views...) {
			if len(w.MI) > 0 {
				return fmt.Sprintf("MI ops at %%%s run between the two kernels", w.Name)
			}
		}
	}
	return ""
}

// foldQKVRope folds the rotation into the projection of the q, k and v heads it rotates.
// Qwen3's QK-norm stays apart: it sums each head over columns the GEMV's warps compute apart.
func foldQKVRope(a, b *ir.Node) (*ir.Node, string) {
	if a.Op != ir.OpMatmul || b.Op != ir.OpRope || b.In[0] != a.Out[0] {
		return nil, ""
	}
	if b.Attrs.(ir.RopeAttrs).QKNorm {
		return nil, "QK-norm sums each head over columns that the GEMV's warps compute apart"
	}
	if why := withMI(a.Out[0]); why != "" {
		return nil, why
	}
	return fused(ir.OpMatmulRope, a, b, a.Out[0]), ""
}

// foldGateAct folds the gated activation into the projection of its gate and up halves. Ops
// at mlp.act, the fused kernel's output, do not keep the two apart: place-mi gives them an MI
// kernel of their own right after it (the fused node hosts none), which computes on act's
// f32 values the bits the activation kernel with them would. Kept apart, a layer with such an
// op ran the gate/up GEMM where the bundle without the app ran the fused kernel, and a
// tensor-core bucket's GEMM (the library's on the GPU) sums otherwise than its gated kernel
// (GemmTCGated): rows without the op lost the app-free bundle's bits there.
func foldGateAct(a, b *ir.Node) (*ir.Node, string) {
	if a.Op != ir.OpMatmul || b.Op != ir.OpActivation || b.In[0] != a.Out[0] {
		return nil, ""
	}
	if why := withMI(a.Out[0]); why != "" {
		return nil, why
	}
	return fused(ir.OpMatmulGated, a, b, b.Out[0], a.Out[0]), ""
}
