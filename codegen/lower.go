package codegen

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	"xmix/bundle"
	"xmix/ir"
	"xmix/ops"
	"xmix/ptx"
)

// Lowering: each node of a graph becomes kernel launches (or a collective) of one template.
// The table below says, for each IR op, what lowers it and the reference ops its kernels are
// bound to; init checks that every op has an entry and every reference op exists.

// lowering is what one IR op becomes.
type lowering struct {
	// refs are the reference ops (package ops) of the kernels it emits.
	refs []string
	emit func(t *tb, n *ir.Node)
}

// lowerings is set at init: a fused node's lowering lowers its parts through it.
var lowerings map[ir.Op]lowering

func loweringTable() map[ir.Op]lowering {
	return map[ir.Op]lowering{
		ir.OpEmbed:      {nil, (*tb).unfused},
		ir.OpNorm:       {nil, (*tb).unfused},
		ir.OpAdd:        {nil, (*tb).unfused},
		ir.OpEmbedNorm:  {[]string{bundle.OpRowNorm}, (*tb).embedNorm},
		ir.OpAddNorm:    {[]string{bundle.OpRowNorm}, (*tb).addNorm},
		ir.OpMatmul:     {[]string{"gemm", bundle.OpGemmTC}, (*tb).matmul},
		ir.OpRope:       {[]string{"rope_kv"}, (*tb).rope},
		ir.OpAttention:  {[]string{bundle.OpAttention}, (*tb).attention},
		ir.OpActivation: {[]string{"silu_mul", "gelu_tanh_mul"}, (*tb).activation},
		ir.OpRouter:     {[]string{"moe_router"}, (*tb).router},
		ir.OpExperts:    {[]string{"moe_gate_up", "moe_down", "gemm", bundle.OpGemmTC, "silu_mul", "moe_combine"}, (*tb).experts},
		ir.OpSample:     {[]string{"sample"}, (*tb).sample},
		ir.OpSoftcap:    {[]string{"softcap"}, (*tb).softcap},
		ir.OpCollective: {nil, (*tb).collective},
		ir.OpMI:         {[]string{"mi", "mi_samples"}, (*tb).mi},
		ir.OpCustom:     {[]string{customOp}, (*tb).custom},
		ir.OpRenorm:     {[]string{"row_renorm"}, (*tb).renorm},
		ir.OpLens:       {[]string{"lens_norm", "gemm", bundle.OpGemmTC, "lens_topk_part", "lens_topk"}, (*tb).lens},
		// A fused node's parts lower by their own entries where it does not fuse.
		ir.OpMatmulRope:  {[]string{"gemm_rope_kv"}, (*tb).matmulRope},
		ir.OpMatmulGated: {[]string{"gemm_gated"}, (*tb).matmulGated},
	}
}

func init() {
	lowerings = loweringTable()
	known := ops.Names()
	for i := range ir.Ops {
		op := ir.Op(i)
		if op == ir.OpInvalid {
			continue
		}
		l, ok := lowerings[op]
		if !ok || l.emit == nil {
			panic(fmt.Sprintf("codegen: IR op %s has no lowering", op)) // a programming error
		}
		for _, r := range l.refs {
			if !slices.Contains(known, r) {
				panic(fmt.Sprintf("codegen: IR op %s lowers to reference op %s, which package ops does not register", op, r))
			}
		}
	}
}

// slots maps kernel parameter names to what they are bound to in one node.
type slots map[string]bundle.Slot

func buf(name string) bundle.Slot { return bundle.Slot{Buffer: name} }
func konst(v uint64) bundle.Slot  { return bundle.Slot{Const: v} }

// ctlSlots are the control-block parameters every MI-carrying kernel may take.
var ctlSlots = slots{"ctl_mask": buf(bundle.CtlMask), "ctl_tokens": buf(bundle.CtlTokens), "ctl_gen": buf(bundle.CtlGen), "ctl_seq": buf(bundle.CtlSeq),
	"ctl_latch": buf(bundle.CtlLatch), "ctl_vslot": buf(bundle.CtlVSlot)}

// node binds k's parameters by name and makes a launch.
func node(label string, k *Kernel, l ops.Launch, s slots, mi []ir.MI) (bundle.Node, error) {
	all := slots{}
	for n, v := range ctlSlots {
		all[n] = v
	}
	for n, b := range miSlots(mi) {
		all[n] = b
	}
	for n, v := range s {
		all[n] = v
	}
	n := bundle.Node{Label: label, Kernel: k.Name, Grid: l.Grid, Block: l.Block, Shared: l.Shared}
	var missing []string
	for _, q := range k.Params {
		v, ok := all[q.Name]
		if !ok {
			missing = append(missing, q.Name)
			continue
		}
		n.Args = append(n.Args, v)
	}
	if len(missing) > 0 {
		return n, fmt.Errorf("%s: kernel %s: no binding for parameters %s", label, k.Name, strings.Join(missing, ", "))
	}
	return n, nil
}

// tb accumulates one template's nodes.
type tb struct {
	g       *gen
	kind    bundle.TemplateKind
	rows    int // token rows
	samples int // sampled rows
	nodes   []bundle.Node
	err     error
	// addNorms counts the graph's add+norm nodes lowered so far: they are named by it
	// ("slot3.add_norm", "add_norm_h4096_mi_s3").
	addNorms int
	// next is the graph's node after the one being lowered (nil at the end).
	next *ir.Node
	// ropeInAttn is the rotation a q/k/v node left to the attention after it
	// (ropeToAttention), until that attention takes it.
	ropeInAttn *ir.Node
}

func (t *tb) add(label string, k *Kernel, err error, l ops.Launch, s slots, mi []ir.MI) {
	if t.err != nil {
		return
	}
	if err != nil {
		t.err = fmt.Errorf("%s: %w", label, err)
		return
	}
	n, err := node(label, k, l, s, mi)
	if err != nil {
		t.err = err
		return
	}
	t.nodes = append(t.nodes, n)
}

// fail records the template's first error.
func (t *tb) fail(err error) {
	if t.err == nil {
		t.err = err
	}
}

// rowsOf is how many rows v has in this template.
func (t *tb) rowsOf(v *ir.Value) int {
	if v.Rows == ir.Samples {
		return t.samples
	}
	return t.rows
}

// template lowers graph gr for one bucket: `rows` token rows, `samples` sampled rows.
func (g *gen) template(gr *ir.Graph, name string, kind bundle.TemplateKind, rows, samples int) (bundle.Template, error) {
	t := &tb{g: g, kind: kind, rows: rows, samples: samples}
	for i, n := range gr.Nodes {
		t.next = nil
		if i+1 < len(gr.Nodes) {
			t.next = gr.Nodes[i+1]
		}
		lowerings[n.Op].emit(t, n)
		if t.err != nil {
			break
		}
	}
	if t.err == nil && t.ropeInAttn != nil {
		t.err = fmt.Errorf("node %s: its rotation was left to an attention that did not take it", t.ropeInAttn.Name)
	}
	if t.err != nil {
		return bundle.Template{}, fmt.Errorf("template %s: %w", name, t.err)
	}
	tmpl := bundle.Template{Name: name, Kind: kind, Tokens: rows, Samples: samples, Nodes: t.nodes}
	if splits := g.attnSplits(rows); kind == bundle.Decode && splits > 1 {
		tmpl.AttnSplit = g.decodeAttn(g.attnConfig(g.attn), rows).splitPlan(splits)
	}
	return tmpl, nil
}

// group is n's MI ops of group i, as the kernel generators take them.
func group(n *ir.Node, i int) []ir.MI {
	if i >= len(n.MI) {
		return nil
	}
	out := make([]ir.MI, len(n.MI[i]))
	for j, m := range n.MI[i] {
		out[j] = *m
	}
	return out
}

// site records the kernel that runs n's MI ops (for the manifest's sites).
func (g *gen) site(n *ir.Node, kernel string) {
	for _, m := range n.AllMI() {
		if _, ok := g.siteKernels[m]; !ok {
			g.siteKernels[m] = kernel
		}
	}
}

// miName names a kernel: shared by every layer when it carries no MI ops, specific to its
// site (and, in a Solo node list, to its app) when it does.
func (g *gen) miName(base string, mi []ir.MI, site string) string {
	if len(mi) == 0 {
		return base
	}
	return base + "_mi_" + site + g.soloTag
}

// preloadMinRows is the fewest rows of a template whose row kernels, launched early, load
// their MI ops' compiled vectors into registers before they wait (RowConfig.PreloadVectors).
// On the H200 (session 40 call 1, Llama-3.1-8B, apps 1-6, each app on every row, graph
// replay per decode step against the bundle with none enabled): preloading cut the apps'
// cost from +0.51..+0.93% to +0.09..+0.46% at 128 rows and from +0.59..+0.90% to
// +0.30..+0.58% at 256, and at 8 rows it was the same or less (refusal ablation +0.52% ->
// +0.22%); at 1 row it cost 0.002-0.013 ms more (seal +0.16% -> +0.49%). Not profiled; we
// think that at 1 row the kernel reaches its wait soon after it starts, so the mask's load
// and the vector loads that depend on it come before the residual add, where the L2
// prefetch they replace waits on nothing.
const preloadMinRows = 8

// miPreloadRegsMin and miPreloadRegsMax bound xmixc build --mi-preload-regs: a thread has
// at most 255 registers, and under 16 even a row kernel without ops would spill.
const miPreloadRegsMin, miPreloadRegsMax = 16, 255

// DefaultMIPreloadRegs is the preloading row kernels' bound on a thread's registers
// (BuildInfo.MIPreloadRegs) when a build names none. Launched early, such a kernel's block of
// 1024 threads fits an SM beside the CTA of the GEMM ahead only within what that CTA leaves
// of the SM's 65,536 registers: 48 a thread beside the 8-row copy-engine GEMM's (512 threads
// at 32), which the 8B's o and down place on 128 of 132 SMs, and beside the 128-row one's
// (128 threads at 90). Unbounded, the apps' add+norm kernels took 52-64 (ptxas 12.4). On an
// H100 (session 70, testsuite/gpu/RESULTS.md) the bound cut five of apps 1-6's cost at 8 rows
// from +0.22..+0.24% to +0.11..+0.16% of the step and at 128 rows by up to 0.08 points;
// side-effect-free's rose 0.04 points at 16 and 32 rows.
const DefaultMIPreloadRegs = 48

// MIPreloadWaveRows is the most token rows of a template whose preloading row kernels take
// the build's bound on registers (BuildInfo.MIPreloadRegs); larger templates' kernels take
// BuildInfo.MIPreloadRegsMultiWave. A row kernel runs a block a row, of 1024 threads at the
// Llamas' widths, so up to 128 rows are one wave of blocks at one an SM on the H100 and H200
// (132 SMs), where the bound only has to let each block sit beside the GEMM ahead's CTA; a
// larger grid takes waves, and a block of at most 32 registers a thread fits an SM twice,
// halving them.
const MIPreloadWaveRows = 128

// DefaultMIPreloadRegsMultiWave is the preloading row kernels' bound on a thread's registers
// in templates of more than MIPreloadWaveRows rows (BuildInfo.MIPreloadRegsMultiWave) when a
// build names none. On an H100 (session 75, testsuite/gpu/RESULTS.md), with the bound at 32
// in every template: refusal-ablation's and side-effect-free's 256-row step cost +0.44% /
// +0.35% against +0.59% / +0.48% with 48 (traced at 48, the second wave's blocks began as
// the first's ended), refusal-ablation's prefill of 32 prompts of 1000 tokens +0.52% against
// +0.74..+0.76%; but their 32- and 128-row steps cost 0.11 and 0.28 points more, so those
// keep DefaultMIPreloadRegs. At 32 ptxas 12.4 spills 16-40 bytes of apps 3-6's kernels
// (side-effect-free's 32, timed above) and none of refusal-ablation's.
const DefaultMIPreloadRegsMultiWave = 32

// CheckMIPreloadRegs says whether n is a bound on the preloading row kernels' registers a
// build may ask for (BuildInfo.MIPreloadRegs): 0 (none) or miPreloadRegsMin..Max.
func CheckMIPreloadRegs(n int) error {
	return checkPreloadRegs("preloading row kernels", n, "no bound")
}

// CheckMIPreloadRegsMultiWave says whether n is a bound on the preloading row kernels'
// registers in templates of more than MIPreloadWaveRows rows a build may ask for
// (BuildInfo.MIPreloadRegsMultiWave): 0 (MIPreloadRegs's) or miPreloadRegsMin..Max.
func CheckMIPreloadRegsMultiWave(n int) error {
	return checkPreloadRegs(fmt.Sprintf("preloading row kernels (templates of more than %d rows)", MIPreloadWaveRows), n, "the bound of smaller templates")
}

func checkPreloadRegs(what string, n int, zero string) error {
	if n != 0 && (n < miPreloadRegsMin || n > miPreloadRegsMax) {
		return fmt.Errorf("%s of at most %d registers a thread: want 0 (%s) or %d to %d", what, n, zero, miPreloadRegsMin, miPreloadRegsMax)
	}
	return nil
}

// preload sets c.PreloadVectors (and PreloadCoherent and PreloadMaxRegs as the build says,
// the latter by MIPreloadWaveRows) for a template of t.rows rows and returns the kernel's
// name for it: name, or name_pv (_pvc coherent, then _nr<N> with a bound on registers) for a
// kernel that preloads (one that comes out the same as without is kept once, under the name
// built first).
func (t *tb) preload(c *RowConfig, name string) string {
	if !c.EarlyLaunch || t.rows < preloadMinRows || len(c.MIOps()) == 0 {
		return name
	}
	c.PreloadVectors, c.PreloadCoherent, c.PreloadMaxRegs = true, t.g.miPreloadCoherent, t.g.miPreloadRegs
	if t.rows > MIPreloadWaveRows && t.g.miPreloadRegsMultiWave > 0 {
		c.PreloadMaxRegs = t.g.miPreloadRegsMultiWave
	}
	name += "_pv"
	if c.PreloadCoherent {
		name += "c"
	}
	if c.PreloadMaxRegs > 0 {
		name += fmt.Sprintf("_nr%d", c.PreloadMaxRegs)
	}
	return name
}

func (t *tb) unfused(n *ir.Node) {
	t.fail(fmt.Errorf("node %s: op %s has no kernel of its own (fuse-rows puts it in a row kernel)", n.Name, n.Op))
}

// embedNorm is the embedding gather with layer 0's input norm, and the MI ops of its
// residual (hooks embed, resid_pre of layer 0).
func (t *tb) embedNorm(n *ir.Node) {
	g := t.g
	a := n.Attrs.(ir.NormAttrs)
	mi := group(n, 0)
	c := RowConfig{Hidden: n.Out[0].Width, Vocab: a.Vocab, Eps: a.Eps, WDtype: g.wdt, Load: "embed", ResidOps: mi,
		WOffset: a.Offset, EmbedScale: a.EmbedScale, EarlyLaunch: g.pdl, OutOptional: g.optionalF32Out}
	name := t.preload(&c, g.miName("embed", mi, "embed"))
	k, err := g.kernel(name, func() (*Kernel, error) { return RowNorm(name, c) })
	g.site(n, name)
	t.add(n.Name, k, err, c.Launch(t.rows), slots{
		"tokens": buf(bundle.CtlTokens), "table": buf(n.Weight("table").Name), "resid": buf(n.Out[0].Buffer),
		"w": buf(n.Weight("w").Name), "out": buf(n.Out[1].Buffer), bundle.NormOutBF16: konst(0),
	}, mi)
}

// addNorm is a residual add + RMSNorm with the MI ops placed in it (delta, residual, norm
// groups; the delta's are on its normalised value when the kernel normalises it first). The
// norm of sampled rows is the final norm: it writes only those rows.
func (t *tb) addNorm(n *ir.Node) {
	g := t.g
	a := n.Attrs.(ir.NormAttrs)
	slot := t.addNorms
	t.addNorms++
	resid, delta, out := n.Out[0], n.In[1], n.Out[1]
	final := out.Rows == ir.Samples
	deltaW := n.Weight("delta_w")
	c := RowConfig{Hidden: resid.Width, Vocab: g.m.Vocab, Eps: a.Eps, WDtype: g.wdt, Load: "add", Gather: final,
		DeltaOps: append(group(n, 0), group(n, 3)...), ResidOps: group(n, 1), NormOps: group(n, 2),
		WOffset: a.Offset, DeltaNorm: deltaW != nil, EarlyLaunch: g.pdl, OutOptional: g.optionalF32Out && !final}
	all := c.MIOps()
	base := fmt.Sprintf("add_norm_h%d", resid.Width)
	if final {
		base = fmt.Sprintf("final_norm_h%d", resid.Width)
	}
	name := t.preload(&c, g.miName(base, all, fmt.Sprintf("s%d", slot)))
	k, err := g.kernel(name, func() (*Kernel, error) { return RowNorm(name, c) })
	g.site(n, name)
	s := slots{"resid": buf(resid.Buffer), "delta": buf(delta.Buffer), "w": buf(n.Weight("w").Name), "out": buf(out.Buffer)}
	if final {
		s["out_row"] = buf(bundle.CtlOutRow)
	} else {
		s[bundle.NormOutBF16] = konst(0)
	}
	if deltaW != nil {
		s["delta_w"] = buf(deltaW.Name)
	}
	t.add(fmt.Sprintf("slot%d.add_norm", slot), k, err, c.Launch(t.rows), s, all)
}

func (t *tb) matmul(n *ir.Node) {
	x, y := n.In[0], n.Out[0]
	t.gemm(n.Name, x.Buffer, buf(n.Weight("w").Name), y.Buffer, x.Width, y.Width, t.rowsOf(x))
}

// parts lowers a fused node as the nodes it fuses.
func (t *tb) parts(n *ir.Node) {
	for _, p := range n.Parts {
		lowerings[p.Op].emit(t, p)
	}
}

// fusedGemv is what a fused node's GEMV needs (its matmul part mm): its configuration, its
// rows in this template, and its x, w and y slots; ok false where this bucket runs the GEMM
// on tensor cores, which take no epilogue (nor does cuBLASLt, which serves them on the GPU).
func (t *tb) fusedGemv(mm *ir.Node, y *ir.Value) (c GemmConfig, rows int, s slots, ok bool) {
	x := mm.In[0]
	rows = t.rowsOf(x)
	c = t.g.gemvSettings(GemmConfig{K: x.Width, N: mm.Out[0].Width, WDtype: t.g.wdt}, rows, false)
	s = slots{"x": buf(x.Buffer), "w": buf(mm.Weight("w").Name), "y": buf(y.Buffer), "rows": konst(uint64(rows))}
	return c, rows, s, !t.g.tensorCores(c, rows)
}

// gemvName is the name of the plain GEMV of c (a fused one adds its epilogue's).
func (g *gen) gemvName(c GemmConfig) string {
	name := fmt.Sprintf("gemm_k%d_n%d_%s", c.K, c.N, g.wdt)
	if n := c.colsPerWarp(); n > 1 {
		name += fmt.Sprintf("_c%d", n)
	}
	if c.Unroll > 1 {
		name += fmt.Sprintf("_u%d", c.Unroll)
	}
	if s := c.splitWarps(); s > 1 {
		name += fmt.Sprintf("_s%d", s)
	}
	if w := c.blockWarps(); w != gemmWarps {
		name += fmt.Sprintf("_w%d", w)
	}
	return name
}

// gemvSettings is c, a CUDA-core GEMV over rows rows, with the build's GEMV settings: the
// prefetch, the warps of a block and the split of its weight's columns; from two rows, the unroll, and for a plain
// GEMV (not a fused one, whose warps compute the column pairs of its epilogue) the columns
// per warp; at one row, for a plain GEMV, the columns per warp that fit it in one wave
// (oneWaveCols).
func (g *gen) gemvSettings(c GemmConfig, rows int, plain bool) GemmConfig {
	c.Prefetch = g.prefetch
	c.Split = g.splitFor(c.N)
	c.Warps = g.gemvWarps
	switch {
	case rows > 1:
		c.Unroll = g.unroll
		if plain {
			c.Cols = g.gemvCols
		}
	case plain:
		c.Cols = oneWaveCols(c.N)
	}
	return c
}

// gemvResidentWarps is how many warps of the one-row GEMV an H200 holds at once: 132 SMs, 24
// warps of 80 registers each (three blocks of eight warps, or twelve of two).
const gemvResidentWarps = targetSMs * 24

// oneWaveCols is GemmConfig.Cols of a plain one-row GEMV over a weight of n columns: two
// where one warp a column needs more warps than the card holds and two fit them, else one.
// One warp a column, Llama-3.1-8B's o and down (4096 columns) fill 1.3 waves, and the last
// 0.3 streams from one block an SM, too few loads in flight for the card's bandwidth; two
// columns a warp keep 80 registers (ptxas 11.8) and take 2048 warps, one wave. On the H200
// that shortened the 8B's batch-1 step from 4.214 to 4.073 ms, the down projection inside the
// graph from 1.051 to 0.929 ms (session 16, testsuite/gpu/RESULTS.md "One wave"). Four
// columns a warp (146 registers, one block an SM) lose, and where one column a warp already
// fits one wave two lose too: 0.859 to 0.960 ms on Llama-3.2-1B (2048 columns). The columns
// keep the one-column GEMV's bits (TestGemmColumnsPerWarp), so the choice changes no result.
func oneWaveCols(n int) int {
	if n > gemvResidentWarps && n <= 2*gemvResidentWarps && n%2 == 0 {
		return 2
	}
	return 1
}

// splitColumns is the column count times warps a column that splitFor aims a GEMV's weight
// at: about five waves of the batch-1 GEMV's resident warps (gemvResidentWarps), so the last
// wave is at most a fifth of the kernel.
const splitColumns = 16384

// splitFor is GemmConfig.Split of every GEMV of a weight of n columns, whatever its bucket,
// so that a row's result does not depend on the bucket: the fewest warps a column, up to the
// build's most (BuildInfo.GemvSplit), that give n*split at least splitColumns. A weight
// whose columns do not fill blocks at every columns per warp (n not a multiple of 64) keeps
// one warp a column.
func (g *gen) splitFor(n int) int {
	if g.split <= 1 || n%(gemmWarps*MaxGemvCols) != 0 {
		return 1
	}
	s := 1
	for s < g.split && n*s < splitColumns {
		s *= 2
	}
	return s
}

// matmulRope is the q/k/v projection with the rotation and the KV write in its epilogue
// (fuse-qkv-rope), or the GEMM and the rotation kernel where the GEMM runs on tensor cores.
func (t *tb) matmulRope(n *ir.Node) {
	mm, rope := n.Parts[0], n.Parts[1]
	gc, rows, s, ok := t.fusedGemv(mm, mm.Out[0])
	if !ok && t.ropeToAttention(n) {
		lowerings[mm.Op].emit(t, mm)
		t.ropeInAttn = rope
		return
	}
	if !ok {
		t.parts(n)
		return
	}
	rc, rname, rs := t.g.ropeKernel(rope)
	c := GemmRopeConfig{Gemm: gc, Rope: rc}
	name := t.g.gemvName(gc) + "_" + rname
	k, err := t.g.kernel(name, func() (*Kernel, error) { return GemmRope(name, c) })
	t.add(n.Name, k, err, c.Launch(rows), merge(merge(kvSlots(rope, mm.Out[0].Buffer), rs), s), nil)
}

// matmulGated is the gate/up projection with the gated activation in its epilogue
// (fuse-gate-act), or the GEMM and the activation kernel where the GEMM runs on tensor cores.
func (t *tb) matmulGated(n *ir.Node) {
	mm, act := n.Parts[0], n.Parts[1]
	gc, rows, s, ok := t.fusedGemv(mm, act.Out[0])
	sc, err := activationConfig(act)
	if err != nil {
		t.fail(err)
		return
	}
	op, err := sc.op()
	if err != nil {
		t.fail(err)
		return
	}
	if !ok && !t.gatedTC(gc, op, rows) {
		t.parts(n)
		return
	}
	if !ok {
		t.matmulGatedTC(n.Name, gc, sc, rows, s)
		return
	}
	c := GemmGatedConfig{Gemm: gc, Act: sc.Act}
	name := t.g.gemvName(gc) + "_" + GatedKernelName(sc)
	k, err := t.g.kernel(name, func() (*Kernel, error) { return GemmGated(name, c) })
	t.add(n.Name, k, err, c.Launch(rows), s, nil)
}

// gatedTC says whether the gate/up projection c with activation op of a tensor-core template
// over rows rows runs as one kernel (matmulGatedTC): in decode buckets of at most
// BuildInfo.GatedTCRows rows (the only ones measured), unless the build names its shape for
// copy-engine kernels (xmixc build --copy-gemms), which serve GEMM nodes, or a gated
// copy-engine kernel of the bundle serves the bucket (gatedCopyServes), or the kernel cannot
// reach its up half (past 2 GiB).
func (t *tb) gatedTC(c GemmConfig, op string, rows int) bool {
	return t.kind == bundle.Decode && rows <= t.g.gatedTCRows && c.N%tcGatedWidth == 0 && !t.g.copyShape(c.K, c.N, rows) &&
		!t.g.gatedCopyServes(c.K, c.N, rows, op) && gatedTCReaches(c)
}

// gatedCopyServes says whether the loader serves a decode bucket's gate/up GEMM of K x N over
// rows rows and its activation op (bundle.GatedActOps) with one of the bundle's gated
// copy-engine kernels: it asks bundle.GatedCopyFor, as the loader does, over the kernels
// gatedCopies gives the decode buckets whose gate/up runs on tensor cores. Where it does,
// that kernel is the bucket's gate/up, not GemmTCGated: on the 8B the 32-row bucket's 64-row
// wide kernel made the 8-row step 2.0-2.4% shorter than GemmTCGated on an H100
// (testsuite/gpu/RESULTS.md, session 90), x's rows past the bucket's zero-filled and left out
// of the epilogue. On the 1B no such kernel serves 8 rows (its 32-row bucket keeps its own,
// which is not wide), so its 8-row bucket keeps GemmTCGated, and cuBLASLt's gate/up with the
// activation kernel made that step 0.7-1.0% longer.
func (g *gen) gatedCopyServes(k, n, rows int, op string) bool {
	var kernels []bundle.GemmCopy
	for _, b := range g.decodeBuckets {
		if !g.epilogueCopyAt(bundle.Decode, b, g.gatedCopyRows) || !g.tensorCores(GemmConfig{K: k, N: n, WDtype: g.wdt}, b) {
			continue
		}
		if c, err := g.gatedCopyFor(k, n, copyRows(g.copyRows, b), op); err == nil {
			kernels = append(kernels, bundle.GemmCopy{Attrs: c.Attrs()})
		}
	}
	slices.SortFunc(kernels, func(a, b bundle.GemmCopy) int { return cmp.Compare(a.Attrs.Rows, b.Attrs.Rows) })
	_, ok := bundle.GatedCopyFor(kernels, rows)
	return ok
}

// matmulGatedTC is the gate/up projection of a decode bucket on tensor cores of at most
// BuildInfo.GatedTCRows rows with the gated activation in its epilogue (GemmTCGated), in
// place of a GEMM node (which a backend may give a library) and the activation kernel. Its
// warps stream a tile of gate and one of up, twice a plain tile's weights, so a step takes
// half the chunks of the plain kernel's (the same W registers).
func (t *tb) matmulGatedTC(label string, gc GemmConfig, sc SiluConfig, rows int, s slots) {
	gc = t.g.tcSettings(GemmConfig{K: gc.K, N: gc.N, WDtype: gc.WDtype}, rows)
	gc.Unroll = max(1, gc.Unroll/2)
	c := GemmGatedConfig{Gemm: gc, Act: sc.Act}
	name := fmt.Sprintf("gemm_tcg_k%d_n%d%s_%s", gc.K, gc.N, tcSuffix(gc), GatedKernelName(sc))
	k, err := t.g.kernel(name, func() (*Kernel, error) { return GemmTCGated(name, c) })
	t.add(label, k, err, c.LaunchTC(rows), s, nil)
}

// TensorCoreRows is the default bucket size from which GEMMs run on tensor cores (bf16
// activations, f32 accumulation; cuBLASLt on the GPU; a build may choose another,
// BuildInfo.TensorCoreRows): the CUDA-core GEMM's cost grows with rows (on an H200, 4.5x at
// 8 rows), mma's is flat up to 128. Below it, the CUDA-core GEMM keeps f32 activations, and
// every bucket computes a row's bits the same, so a batch of up to TensorCoreRows-1 rows
// gives each request what it gets alone (batch_equals_solo, per_request_vectors). From 4
// rows tensor cores are faster on the H200 (Llama-3.1-8B 4.66 ms a step against 5.80,
// testsuite/gpu/RESULTS.md session 19), at the price of that.
const TensorCoreRows = 8

// CheckTensorCoreRows checks a build's bucket size from which GEMMs run on tensor cores
// (BuildInfo.TensorCoreRows, xmixc build --tensor-core-rows): 0 (TensorCoreRows) or 2 to
// TensorCoreRows. A batch of one row always runs the CUDA-core GEMV, and buckets past the
// default would run it at more rows than it was measured at.
func CheckTensorCoreRows(n int) error {
	if n != 0 && (n < 2 || n > TensorCoreRows) {
		return fmt.Errorf("tensor cores from %d rows: want 2 to %d", n, TensorCoreRows)
	}
	return nil
}

func (t *tb) gemm(label, x string, w bundle.Slot, y string, k, n, rows int) {
	t.gemmAt(label, buf(x), w, buf(y), GemmConfig{K: k, N: n, WDtype: t.g.wdt}, rows)
}

// gemmAt is gemm with x and y given as slots, which may start inside their buffers, and the
// whole configuration (a guarded GEMM takes ctl.any_mask too).
func (t *tb) gemmAt(label string, x, w, y bundle.Slot, c GemmConfig, rows int) {
	g := t.g
	k, n := c.K, c.N
	s := slots{"x": x, "w": w, "y": y, "rows": konst(uint64(rows))}
	guard := ""
	if c.Guard != 0 {
		s["any_mask"] = buf(bundle.CtlAnyMask)
		guard = fmt.Sprintf("_g%x", c.Guard)
	}
	if t.g.tensorCores(c, rows) {
		if g.gemmKind == "tc-staged" {
			// The staged kernel's W is a ring of stages already; its chunks in flight come
			// from the same settings.
			c = g.tcSettings(c, rows)
			c.Tickets = g.gemmTickets
			name := fmt.Sprintf("gemm_tcs_k%d_n%d%s%s", k, n, tcSuffix(c), guard)
			kern, err := g.kernel(name, func() (*Kernel, error) { return GemmTCStaged(name, c) })
			s["ws"] = buf("act.gemm_ws")
			t.add(label, kern, err, c.LaunchTCStaged(rows), s, nil)
			return
		}
		c = g.tcSettings(c, rows)
		name := fmt.Sprintf("gemm_tc_k%d_n%d%s%s", k, n, tcSuffix(c), guard)
		kern, err := g.kernel(name, func() (*Kernel, error) { return GemmTC(name, c) })
		t.add(label, kern, err, c.LaunchTC(rows), s, nil)
		return
	}
	c = g.gemvSettings(c, rows, true)
	name := g.gemvName(c) + guard
	kern, err := g.kernel(name, func() (*Kernel, error) { return Gemm(name, c) })
	t.add(label, kern, err, c.Launch(rows), s, nil)
}

// tcBucketRows is the largest template (decode bucket or prefill chunk) whose tensor-core
// GEMMs are built for its row count (GemmConfig.Rows); larger ones (batch 128, prefill chunks
// of 128 rows and more) keep the kernel for any row count, whose 16 row tiles they fill.
const tcBucketRows = 64

// tcSettings gives a tensor-core GEMM over rows rows the build's weight prefetch, as every
// decode GEMV has it, and, in a template of at most tcBucketRows rows, its row count and its
// K chunks in flight (gemm_tc.go, "Loads in flight"): the build's TCChunks (by default
// DefaultTCChunks) at up to 8 and at 9-32 rows; past 32 one.
func (g *gen) tcSettings(c GemmConfig, rows int) GemmConfig {
	c.Prefetch = g.prefetch
	if rows > tcBucketRows {
		return c
	}
	c.Rows = rows
	switch {
	case rows <= 8:
		c.Unroll = g.tcChunks[0]
	case rows <= 32:
		c.Unroll = g.tcChunks[1]
	}
	return c
}

// DefaultTCChunks are the K chunks in flight of the tensor-core GEMMs of buckets of up to 8
// and of 9-32 rows, measured on the H200 at Llama-3.1-8B and -3.2-1B dims (session 11): at 8
// rows four beat one, two and three; at 9-32 three beat two and four (two row tiles or more
// leave fewer registers for W).
var DefaultTCChunks = [2]int{4, 3}

// CheckTCChunks checks chunk counts for the tensor-core GEMMs (bundle.BuildInfo.TCChunks,
// xmixc build --tc-chunks): two, of 1 to MaxTCChunks.
func CheckTCChunks(n []int) error {
	if len(n) != 2 || min(n[0], n[1]) < 1 || max(n[0], n[1]) > MaxTCChunks {
		return fmt.Errorf("want two counts of 1 to %d, for buckets of up to 8 rows and of 9-32 rows", MaxTCChunks)
	}
	return nil
}

// tcChunks checks a build's TCChunks (empty: DefaultTCChunks).
func tcChunks(n []int) ([2]int, error) {
	if len(n) == 0 {
		return DefaultTCChunks, nil
	}
	if err := CheckTCChunks(n); err != nil {
		return [2]int{}, fmt.Errorf("tensor-core GEMM chunks %v: %w", n, err)
	}
	return [2]int{n[0], n[1]}, nil
}

// tcSuffix names a tensor-core GEMM's bucket settings in its kernel's name.
func tcSuffix(c GemmConfig) string {
	if c.Rows == 0 {
		return ""
	}
	return fmt.Sprintf("_r%du%d", c.Rows, max(1, c.Unroll))
}

// MaxGatedTCRows bounds BuildInfo.GatedTCRows: the gated kernel keeps two tiles of
// accumulators a row tile, and past 32 rows its steps would take one chunk.
const MaxGatedTCRows = 32

// DefaultGatedTCRows is the largest tensor-core bucket given the gate/up kernel with its
// activation (GemmTCGated) unless a build says otherwise, measured on the H200 at
// Llama-3.1-8B dims inside the decode step under --gemm auto (testsuite/gpu/RESULTS.md,
// session 44): at 8 rows the step is 2.3-2.6% shorter than with cuBLASLt's gate/up and the
// SiLU kernel (contexts 80, 576, 2112), but at 16 and 32 rows its gate/up costs 1.8x and 2.9x
// the library's, since each warp's x loads and splits grow with the rows (gemm_tc.go). A
// bucket that a gated copy-engine kernel serves takes that one instead (gatedCopyServes).
const DefaultGatedTCRows = 8

// CheckGatedTCRows checks a build's largest bucket given the tensor-core gate/up kernel
// (BuildInfo.GatedTCRows, xmixc build --gated-tc-rows): 0 (none) to MaxGatedTCRows.
func CheckGatedTCRows(n int) error {
	if n < 0 || n > MaxGatedTCRows {
		return fmt.Errorf("tensor-core gate/up kernels up to %d rows: want 0 (none) to %d", n, MaxGatedTCRows)
	}
	return nil
}

// tensorCores says whether a GEMM of c over rows rows runs on tensor cores here.
func (g *gen) tensorCores(c GemmConfig, rows int) bool {
	return rows >= g.tcRows && g.wdt == ptx.BF16 && c.K%16 == 0 && c.N%16 == 0 && g.gemmKind != "cuda-core"
}

// kvSlots are the KV cache and page table parameters of the rotation and attention kernels.
func kvSlots(n *ir.Node, qkv string) slots {
	return slots{"pos": buf(bundle.CtlPos), "seq": buf(bundle.CtlSeq), "block_table": buf(bundle.KVBlockTable),
		"kcache": buf(n.State[0].Name), "vcache": buf(n.State[1].Name), "qkv": buf(qkv)}
}

// ropeWaveBlocks is how many rope_kv blocks (1024 threads of few registers) the card holds at
// once: two an SM of the H100's and H200's 132.
const ropeWaveBlocks = 2 * targetSMs

func (t *tb) rope(n *ir.Node) {
	rc, kname, rs := t.g.ropeKernel(n)
	if t.g.ropeOneWave {
		if rc.Groups = rc.OneWaveGroups(t.rows, ropeWaveBlocks); rc.Groups > 0 {
			kname += fmt.Sprintf("_g%d", rc.Groups)
		}
	}
	k, err := t.g.kernel(kname, func() (*Kernel, error) { return RopeKV(kname, rc) })
	t.add(n.Name, k, err, rc.Launch(t.rows), merge(kvSlots(n, n.In[0].Buffer), rs), nil)
}

// ropeKernel is rope node n's kernel: its configuration, name and weight slots.
func (g *gen) ropeKernel(n *ir.Node) (RopeConfig, string, slots) {
	a := n.Attrs.(ir.RopeAttrs)
	rc := RopeConfig{Heads: a.Heads, KVHeads: a.KVHeads, HeadDim: a.HeadDim, BlockSize: g.m.KVBlockSize, MaxBlocksPerSeq: g.blocks,
		KVDtype: g.kvdt, Bias: a.Bias, QKNorm: a.QKNorm, WDtype: g.wdt}
	kname := fmt.Sprintf("rope_kv_h%d_kv%d_d%d_%s", a.Heads, a.KVHeads, a.HeadDim, g.kvdt)
	rs := slots{"cos": buf(n.Weight("cos").Name), "sin": buf(n.Weight("sin").Name)}
	if a.Bias {
		kname += "_bias"
		rs["bias"] = buf(n.Weight("bias").Name)
	}
	if a.QKNorm {
		kname += "_qknorm"
		rc.Eps = a.Eps
		rs["q_norm"], rs["k_norm"] = buf(n.Weight("q_norm").Name), buf(n.Weight("k_norm").Name)
	}
	return rc, kname, rs
}

// attnConfig is an attention node's shape.
func (g *gen) attnConfig(a ir.AttentionAttrs) AttnConfig {
	return AttnConfig{Heads: a.Heads, KVHeads: a.KVHeads, HeadDim: a.HeadDim, BlockSize: g.m.KVBlockSize,
		MaxBlocksPerSeq: g.blocks, KVDtype: g.kvdt, Scale: a.Scale, Softcap: a.Softcap, Window: a.Window, EarlyLaunch: g.pdl,
		Prefetch: g.attnPrefetch, TensorCores: g.attnTC, ZOptional: g.optionalF32Out, EarlyKV: g.attnEarlyKV}
}

// decodeAttn is attention kernel c in a decode bucket of rows rows: the build's warps a block
// (BuildInfo.AttnWarps), else DecodeWarps(rows), and the build's loads a step; in the bucket
// of one row the prefetch of BuildInfo.AttnPrefetchOneRow where it is more; with
// BuildInfo.AttnCluster, the cluster its splits merge in where ClusterSplits gives one.
func (g *gen) decodeAttn(c AttnConfig, rows int) AttnConfig {
	c.Warps, c.Unroll = cmp.Or(g.attnWarps, c.DecodeWarps(rows)), g.attnUnroll
	if rows == 1 {
		c.Prefetch = max(c.Prefetch, g.attnPrefetchOneRow)
	}
	if g.attnCluster {
		c.Cluster = c.ClusterSplits(rows)
	}
	return c
}

// ropeToAttention says whether q/k/v node n (fuse-qkv-rope's pair, whose GEMM runs on tensor
// cores here) leaves its rotation and KV write to the attention right after it
// (BuildInfo.RopeInAttention): in a decode bucket whose attention runs one block a row on
// tensor cores with whole GQA groups (AttnConfig.RopeOK), for a rotation without bias or
// QK-norm, where no copy-engine kernel with rope_kv takes the pair (a build's
// --rope-copy-rows reaching the bucket: ropeCopies).
func (t *tb) ropeToAttention(n *ir.Node) bool {
	g, next, mm := t.g, t.next, n.Parts[0]
	if !g.ropeInAttention || t.kind != bundle.Decode || next == nil || next.Op != ir.OpAttention || next.In[0] != n.Out[0] {
		return false
	}
	if g.epilogueCopyAt(t.kind, t.rows, g.ropeCopyRows) && g.copyShape(mm.In[0].Width, mm.Out[0].Width, t.rows) {
		return false
	}
	if a := n.Parts[1].Attrs.(ir.RopeAttrs); a.Bias || a.QKNorm {
		return false
	}
	ac := g.decodeAttn(g.attnConfig(next.Attrs.(ir.AttentionAttrs)), t.rows)
	ac.Split = g.attnSplits(t.rows) > 1
	return ac.RopeOK()
}

// attention emits layer l's attention over the KV cache into z. A decode bucket runs the
// flash-decoding kernel, its context split per step when the bucket's rows alone do not fill
// the GPU (the host writes the step's chunk, bundle.AttnSplit). A prefill chunk runs the
// tensor-core kernel over its prompt rows and the decode kernel over the rows alone of their
// sequence (the decode rows mixed into the step); with a cache the tensor cores cannot read
// (f32, or head dim past 128), the decode kernel takes every row.
func (t *tb) attention(n *ir.Node) {
	g := t.g
	ac := g.attnConfig(n.Attrs.(ir.AttentionAttrs))
	if t.kind == bundle.Decode {
		ac = g.decodeAttn(ac, t.rows)
	}
	base := fmt.Sprintf("attention_h%d_kv%d_d%d_%s", ac.Heads, ac.KVHeads, ac.HeadDim, g.kvdt) + AttnKernelSuffix(ac)
	s := merge(kvSlots(n, n.In[0].Buffer), slots{"z": buf(n.Out[0].Buffer), bundle.AttnZBF16: konst(0)})
	decode := func(name string, c AttnConfig, splits int, s slots) {
		k, err := g.kernel(name, func() (*Kernel, error) { return Attention(name, c) })
		t.add(n.Name, k, err, c.Launch(t.rows, splits), s, nil)
	}
	switch splits := g.attnSplits(t.rows); {
	case t.kind == bundle.Decode && splits > 1:
		ac.Split = true
		ss := slots{"chunk": buf(bundle.CtlAttnChunk)}
		if !ac.clustered() {
			ss["ws"] = buf("act.attn_ws")
		}
		name := base + "_split"
		if ac.earlyKV() {
			name += "_ekv" // the kernels EarlyKV changes
		}
		decode(name, ac, splits, merge(s, ss))
	case t.ropeInAttn != nil:
		// The q/k/v node ahead left its rotation and KV write here (ropeToAttention).
		rope := t.ropeInAttn
		t.ropeInAttn = nil
		ac.Rope, ac.PadSeq = true, g.m.MaxSeqs // the engine's padding rows' sequence slot
		decode(base+"_rope", ac, 1, merge(s, slots{"cos": buf(rope.Weight("cos").Name), "sin": buf(rope.Weight("sin").Name)}))
	case t.kind == bundle.Decode || !ac.PrefillOK():
		decode(base, ac, 1, s)
	default:
		// The chunk's kernels write z whole: z optional is a decode kernel's (one row a block).
		ac.ZOptional = false
		singles := ac
		singles.Singles = true
		decode(base+"_singles", singles, 1, s)
		name := base + "_prefill"
		k, err := g.kernel(name, func() (*Kernel, error) { return AttentionPrefill(name, ac) })
		t.add(n.Name+"_prefill", k, err, ac.LaunchPrefill(t.rows), merge(s, slots{"rows": konst(uint64(t.rows))}), nil)
	}
}

// activations are the gated MLP's functions, by ir.ActivationAttrs.Fn, as SiluConfig.Act.
var activations = map[string]string{"silu": "", "gelu_tanh": ActGeluTanh}

// activationConfig is activation node n's kernel configuration (without its MI ops).
func activationConfig(n *ir.Node) (SiluConfig, error) {
	fn := n.Attrs.(ir.ActivationAttrs).Fn
	act, ok := activations[fn]
	if !ok {
		return SiluConfig{}, fmt.Errorf("node %s: activation %q has no kernel", n.Name, fn)
	}
	return SiluConfig{Inter: n.Out[0].Width, Act: act}, nil
}

// activation is the gated MLP's fn(gate) * up, with the mlp.act ops fused.
func (t *tb) activation(n *ir.Node) {
	g := t.g
	mi := group(n, 0)
	sc, err := activationConfig(n)
	if err != nil {
		t.fail(err)
		return
	}
	if len(mi) > 0 && len(n.Out[0].Hooks) > 0 && g.tensorCores(GemmConfig{K: g.m.Hidden, N: 2 * sc.Inter, WDtype: g.wdt}, t.rows) {
		// Where the gate/up GEMM runs on tensor cores the backend may serve it and this kernel
		// as one launch (gatedCopies) or have the GEMM write gu in bf16 for this kernel alone
		// (bundle.GatedGuBF16), which only a kernel without MI ops allows: the ops run in a
		// kernel of their own over act, so that a row without the apps gets the bits of a
		// bundle without them.
		t.activationThenMI(n, sc, mi)
		return
	}
	sc.Ops = mi
	name := g.miName(GatedKernelName(sc), mi, fmt.Sprintf("L%d", n.Layer))
	k, err := g.kernel(name, func() (*Kernel, error) { return SiluMul(name, sc) })
	g.site(n, name)
	t.add(n.Name, k, err, sc.Launch(t.rows), slots{"gu": buf(n.In[0].Buffer), "act": buf(n.Out[0].Buffer), bundle.GatedActBF16: konst(0), bundle.GatedGuBF16: konst(0)}, mi)
}

// activationThenMI is the activation without ops, then mlp.act's ops mi in place over act in
// a standalone MI kernel: on the same f32 values, the same bits as SiluMul with them.
func (t *tb) activationThenMI(n *ir.Node, sc SiluConfig, mi []ir.MI) {
	g := t.g
	name := GatedKernelName(sc)
	k, err := g.kernel(name, func() (*Kernel, error) { return SiluMul(name, sc) })
	t.add(n.Name, k, err, sc.Launch(t.rows), slots{"gu": buf(n.In[0].Buffer), "act": buf(n.Out[0].Buffer), bundle.GatedActBF16: konst(0), bundle.GatedGuBF16: konst(0)}, nil)
	t.miOver(n, n.Out[0], n.Name+".mi", mi)
}

// collective exchanges an activation between tensor-parallel ranks: an all-reduce sums a
// row-parallel projection's partial output in place, an all-gather assembles the LM head's
// vocabulary shards.
func (t *tb) collective(n *ir.Node) {
	in, out := n.In[0], n.Out[0]
	if t.err == nil {
		t.nodes = append(t.nodes, bundle.Node{Label: n.Name, Collective: &bundle.Collective{
			Op: n.Attrs.(ir.CollectiveAttrs).Op, In: in.Buffer, Out: out.Buffer, Rows: t.rowsOf(in), Cols: in.Width}})
	}
}

// softcap caps the logits of the sampled rows in place, after the LM head (and its
// all-gather) and before the logits hook's ops and the sampler.
func (t *tb) softcap(n *ir.Node) {
	c := SoftcapConfig{Width: n.In[0].Width, Cap: n.Attrs.(ir.SoftcapAttrs).Cap}
	name := fmt.Sprintf("softcap_v%d", c.Width)
	k, err := t.g.kernel(name, func() (*Kernel, error) { return Softcap(name, c) })
	t.add(n.Name, k, err, c.Launch(t.rowsOf(n.In[0])), slots{"x": buf(n.In[0].Buffer)}, nil)
}

// logitsKernel and sampleKernel name the kernels of the model's tail.
const logitsKernel = "mi_logits"

func (g *gen) sampleKernel(ovr []ir.MI) string {
	return g.miName(fmt.Sprintf("sample_v%d", g.m.Vocab), ovr, "sampled")
}

// mi is a standalone MI kernel: over a view of a GEMM's or attention's output, or over the
// logits (one row per sample, each finding its token row's control words through ctl.s_row).
func (t *tb) mi(n *ir.Node) {
	g := t.g
	x := n.In[0]
	mi := group(n, 0)
	if x.Rows == ir.Samples {
		c := LogitsMIConfig{Vocab: x.Width, Ops: mi}
		name := logitsKernel + g.soloTag
		k, err := g.kernel(name, func() (*Kernel, error) { return LogitsMI(name, c) })
		g.site(n, name)
		t.add("logits.mi", k, err, c.Launch(t.samples), slots{"x": buf(x.Buffer), "s_row": buf(bundle.CtlSRow)}, mi)
		return
	}
	t.miOver(n, x, n.Name, mi)
}

// miOver is node n's MI kernel (label) running ops mi in place over the token rows of x, a
// view of a hooked value.
func (t *tb) miOver(n *ir.Node, x *ir.Value, label string, mi []ir.MI) {
	g := t.g
	c := MIKernelConfig{Width: x.Width, Stride: x.Base().Width, Offset: x.Offset, Ops: mi}
	name := fmt.Sprintf("mi_L%d_%s%s", n.Layer, strings.ReplaceAll(x.Hooks[0].Name, ".", "_"), g.soloTag)
	k, err := g.kernel(name, func() (*Kernel, error) { return MIKernel(name, c) })
	g.site(n, name)
	t.add(label, k, err, c.Launch(t.rows), slots{"x": buf(x.Buffer)}, mi)
}

// sample is the sampler with the token_override ops of hook sampled fused in.
func (t *tb) sample(n *ir.Node) {
	g := t.g
	a := n.Attrs.(ir.SampleAttrs)
	ovr := group(n, 0)
	smc := SampleConfig{Vocab: a.Vocab, Logprobs: a.Logprobs, EOS: a.EOS, Overrides: ovr}
	name := g.sampleKernel(ovr)
	k, err := g.kernel(name, func() (*Kernel, error) { return Sample(name, smc) })
	g.site(n, name)
	s := slots{
		"logits": buf(n.In[0].Buffer), "temperature": buf(bundle.CtlTemperature), "top_p": buf(bundle.CtlTopP),
		"rng": buf(bundle.CtlRNG), "out": buf(n.Out[0].Buffer), "s_row": buf(bundle.CtlSRow),
		"lp_k": buf(bundle.CtlLogprobs), "lp_out": buf(bundle.OutLogprobs), "eos_ban": buf(bundle.CtlEOSBan),
	}
	for i, o := range ovr {
		s[fmt.Sprintf("ovr%d_scal", i)] = buf(o.Scal)
		if o.Fired != "" {
			s[fmt.Sprintf("ovr%d_fired", i)] = bundle.Slot{Buffer: o.Fired, Offset: int64(o.FiredCol)}
		}
	}
	t.add(n.Name, k, err, smc.Launch(t.samples), s, nil)
}

// lensName names op i's lens kernels: they depend on the app bit and the output columns.
func (g *gen) lensName(kind string, c LensConfig) string {
	return fmt.Sprintf("lens_%s_h%d_v%d_b%d_k%d_c%d_w%d", kind, c.Hidden, c.Vocab, c.Bit, c.K, c.OutCol, c.OutWidth)
}

// lensConfig is a logit-lens op's configuration.
func (g *gen) lensConfig(op *ir.MI) LensConfig {
	m := g.m
	return LensConfig{Hidden: m.Hidden, Vocab: m.Vocab, Eps: float32(m.RMSEps), WDtype: g.wdt, Bit: op.Bit,
		K: op.K, OutWidth: op.OutWidth, OutCol: op.OutCol, WOffset: g.finalOffset, Softcap: g.finalSoftcap}
}

// lens is a logit lens's heavy nodes over the residual as the add+norm kernel (and any custom
// kernels) left it: the final norm, the LM head, a top-k in two rounds. Each is skipped
// unless a row of the step enables the app (guard-heavy).
func (t *tb) lens(n *ir.Node) {
	g := t.g
	m := g.m
	op := n.Attrs.(ir.LensAttrs).MI
	c := g.lensConfig(op)
	label := func(kind string) string { return fmt.Sprintf("L%d.%s.%s", n.Layer, kind, op.App) }
	nn, pn, tn := g.lensName("norm", c), g.lensName("topk_part", c), g.lensName("topk", c)
	g.site(n, tn) // the kernel that writes the op's buffer
	k, err := g.kernel(nn, func() (*Kernel, error) { return LensNorm(nn, c) })
	t.add(label("lens_norm"), k, err, c.RowsLaunch(t.rows), slots{
		"any_mask": buf(bundle.CtlAnyMask), "resid": buf(n.In[0].Buffer), "w": buf(g.finalNorm), "out": buf("act.lens_x"),
	}, nil)
	t.skipUnless(n.SkipUnless)
	t.gemmAt(label("lens_logits"), buf("act.lens_x"), buf(g.lmHead), buf("act.lens"),
		GemmConfig{K: m.Hidden, N: m.Vocab, WDtype: g.wdt, Guard: n.SkipUnless}, t.rows)
	t.skipUnless(n.SkipUnless)
	k, err = g.kernel(pn, func() (*Kernel, error) { return LensTopKPart(pn, c) })
	t.add(label("lens_topk_part"), k, err, c.PartLaunch(t.rows), slots{
		"any_mask": buf(bundle.CtlAnyMask), "logits": buf("act.lens"), "cand": buf("act.lens_cand"),
	}, nil)
	t.skipUnless(n.SkipUnless)
	k, err = g.kernel(tn, func() (*Kernel, error) { return LensTopK(tn, c) })
	t.add(label("lens_topk"), k, err, c.RowsLaunch(t.rows), slots{
		"any_mask": buf(bundle.CtlAnyMask), "cand": buf("act.lens_cand"), "out": buf(op.Out),
	}, nil)
	t.skipUnless(n.SkipUnless)
}

// skipUnless marks the node just added as one that does nothing unless a row of the step
// enables an app of mask (its kernel exits early on ctl.any_mask), so that a backend may
// leave it out of the step (bundle.Node.SkipUnless).
func (t *tb) skipUnless(mask uint32) {
	if t.err == nil {
		t.nodes[len(t.nodes)-1].SkipUnless = mask
	}
}

func merge(a, b slots) slots {
	out := slots{}
	for k, v := range a {
		out[k] = v
	}
	for k, v := range b {
		out[k] = v
	}
	return out
}

// attnSplits is the most splits of a row in a decode bucket's attention (1: no split): its
// cluster's blocks, else DecodeSplits.
func (g *gen) attnSplits(rows int) int {
	c := g.decodeAttn(g.attnConfig(g.attn), rows)
	return cmp.Or(c.Cluster, c.DecodeSplits(rows))
}
