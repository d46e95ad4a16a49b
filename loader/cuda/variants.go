package cuda

import (
	"fmt"
	"math/bits"

	"xmix/bundle"
)

// Heavy nodes (bundle.Node.SkipUnless: a logit lens over the whole vocabulary) check
// ctl.any_mask and exit early when no row enables their app, but even an early exit costs a
// launch inside the graph (about 3 us each; 64 of them for a lens at every layer of an 8B
// model, 2% of a batch-1 step). So each template is captured once per subset of its heavy
// apps, and Step replays the graph whose subset matches the step's ctl.any_mask, which the
// host has just written: a deployed but unused heavy app is not in the replayed graph at all.
// A template of a bundle with apps also carries Plain, the same bucket compiled without them;
// it is one more variant, replayed when no row of the step enables any app (any_mask == 0),
// so deployed but unused apps cost nothing at all. No graph is rebuilt or updated between
// steps; every variant is instantiated at load.
//
// A template of a bundle of two to passes.MaxSoloApps apps also carries Solo, the bucket
// compiled with each app's ops alone: a row kernel that hosts several apps' ops is compiled
// with all of them, so with Nodes a step that enables one app runs every deployed app's ops
// (the rows test their masks and skip them). Each Solo list is one more variant, replayed
// when ctl.any_mask is exactly that app's bit; a step whose rows enable two apps or more
// runs Nodes.

// maxVariantBits caps the heavy apps a template gets variants for (2^4 = 16 graphs); nodes of
// further heavy apps stay in every variant and rely on their early exit.
const maxVariantBits = 4

// stepGraphs is one template's graph variants. Variant v < 2^len(bits) includes the heavy
// nodes of the apps bits[i] for every i set in v (and every node of the other apps); the
// template's other node lists (Plain, then Solo: bundle.Template.NodeLists) follow.
type stepGraphs struct {
	tmpl bundle.Template
	bits []uint32 // one app bit mask per variant bit
	// listVariant[i] is the variant that replays the template's node list i+1, or -1 where
	// none does (the Solo lists under Options.NoSolo).
	listVariant []int
	execs       []uintptr  // instantiated graph per variant
	nodes       [][]launch // each variant's launches, for profiling
}

// variantBits lists the first maxVariantBits app bits that mark heavy nodes of t.
func variantBits(t bundle.Template) []uint32 {
	var all uint32
	for _, n := range t.Nodes {
		all |= n.SkipUnless
	}
	var out []uint32
	for all != 0 && len(out) < maxVariantBits {
		b := uint32(1) << bits.TrailingZeros32(all)
		out = append(out, b)
		all &^= b
	}
	return out
}

// variantNodes is the launches of variant v: every node but the heavy nodes of the variant
// bits that v leaves out.
func variantNodes(all []launch, vbits []uint32, v int) []launch {
	var off uint32
	for i, b := range vbits {
		if v&(1<<i) == 0 {
			off |= b
		}
	}
	var out []launch
	for _, l := range all {
		if l.skipUnless == 0 || l.skipUnless&^off != 0 {
			out = append(out, l)
		}
	}
	return out
}

// variant picks the graph of template t for the step's app union in the control arena.
func (be *Backend) variant(t int) int {
	g := &be.steps[t]
	if _, ok := be.ctl.offset[bundle.CtlAnyMask]; !ok {
		return 0 // no apps: one variant
	}
	any := be.anyMask()
	if l := g.tmpl.ListFor(any); l > 0 && g.listVariant[l-1] >= 0 {
		return g.listVariant[l-1] // no app enabled, or one alone
	}
	v := 0
	for i, b := range g.bits {
		if any&b != 0 {
			v |= 1 << i
		}
	}
	return v
}

// prepareAll prepares a node list's launches (variants as prepare takes it).
func (be *Backend) prepareAll(nodes []bundle.Node, variants uint32) ([]launch, error) {
	be.gated = bundle.NewGatedPairs(nodes, be.kernel)
	var all []launch
	var fed uintptr // bf16 of this node's x, as the launch ahead wrote it (copyPair, feedAhead)
	var guB uintptr // bf16 of this activation's gu, as cuBLASLt's GEMM ahead wrote it (gu.go)
	prepare := func(n bundle.Node, fed uintptr, guBF16 bool) (launch, error) {
		l, err := be.prepare(n, variants, fed, guBF16)
		if err != nil {
			return launch{}, fmt.Errorf("node %s (kernel %s, grid %v, block %v): %w", n.Label, n.Kernel, n.Grid, n.Block, err)
		}
		return l, nil
	}
	for i := 0; i < len(nodes); i++ {
		n := nodes[i]
		if n.Collective != nil {
			return nil, fmt.Errorf("node %s: tensor-parallel collectives need NCCL, which the CUDA backend does not drive yet (run this bundle with --backend cpu, or build it without --tp)", n.Label)
		}
		if fed != 0 && n.SkipUnless != 0 {
			// A heavy node that the bf16 copy passes (fedAt): the GEMM after it reads the copy.
			l, err := prepare(n, 0, false)
			if err != nil {
				return nil, err
			}
			all = append(all, l)
			continue
		}
		l, feeds, ok, err := be.copyPair(nodes, i, fed)
		if err != nil {
			return nil, fmt.Errorf("node %s: %w", n.Label, err)
		}
		if ok {
			if guB != 0 {
				// guBF16At names a plain activation, which no pair starts with.
				return nil, fmt.Errorf("node %s: its gu was written in bf16 for it, and a copy-engine pair serves it", n.Label)
			}
			all = append(all, l)
			fed = feeds
			i++ // the activation or rope node after it is served by the same launch
			continue
		}
		n, feeds, err = be.feedAhead(nodes, i)
		if err != nil {
			return nil, fmt.Errorf("node %s: %w", n.Label, err)
		}
		if guB != 0 {
			n = withGuBF16(n, guB)
		}
		l, err = prepare(n, fed, be.guBF16At(nodes, i))
		fed, guB = feeds, 0
		if err != nil {
			return nil, err
		}
		if l.matmul != nil && l.matmul.yBF16 {
			guB = l.matmul.y
			be.guBF16++
		}
		all = append(all, l)
	}
	return all, nil
}

// prepareVariants prepares template t's launches for each of its graph variants (the Solo
// lists' too unless noSolo); captureGraphs instantiates them.
func (be *Backend) prepareVariants(t bundle.Template, noSolo bool) (stepGraphs, error) {
	g := stepGraphs{tmpl: t, bits: variantBits(t)}
	var covered uint32
	for _, b := range g.bits {
		covered |= b
	}
	all, err := be.prepareAll(t.Nodes, covered)
	if err != nil {
		return stepGraphs{}, err
	}
	g.nodes = make([][]launch, 0, 1<<len(g.bits)+1)
	for v := range 1 << len(g.bits) {
		g.nodes = append(g.nodes, variantNodes(all, g.bits, v))
	}
	others := t.NodeLists()[1:]
	for i, nodes := range others {
		if noSolo && i >= len(others)-len(t.Solo) {
			g.listVariant = append(g.listVariant, -1)
			continue
		}
		prepared, err := be.prepareAll(nodes, 0)
		if err != nil {
			return stepGraphs{}, fmt.Errorf("node list %d: %w", i+1, err)
		}
		g.listVariant = append(g.listVariant, len(g.nodes))
		g.nodes = append(g.nodes, prepared)
	}
	return g, nil
}

// GraphCasts is, for each template in order, how many launches of each of its graph variants
// cast x to bf16 for the GEMM after them (the heavy variants, then the template's other node
// lists: Plain, Solo).
func (be *Backend) GraphCasts() [][]int {
	var out [][]int
	for _, g := range be.steps {
		casts := make([]int, len(g.nodes))
		for v, nodes := range g.nodes {
			for _, l := range nodes {
				if be.lt != nil && l.f == be.lt.cast {
					casts[v]++
				}
			}
		}
		out = append(out, casts)
	}
	return out
}
