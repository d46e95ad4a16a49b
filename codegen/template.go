package codegen

import (
	"fmt"
	"math"
	"strings"

	"xmix/bundle"
	"xmix/ops"
	"xmix/passes"
	"xmix/ptx"
)

// slots maps kernel parameter names to what they are bound to in one node.
type slots map[string]bundle.Slot

func buf(name string) bundle.Slot { return bundle.Slot{Buffer: name} }
func konst(v uint64) bundle.Slot  { return bundle.Slot{Const: v} }

// ctlSlots are the control-block parameters every MI-carrying kernel may take.
var ctlSlots = slots{"ctl_mask": buf(bundle.CtlMask), "ctl_tokens": buf(bundle.CtlTokens), "ctl_gen": buf(bundle.CtlGen), "ctl_seq": buf(bundle.CtlSeq),
	"ctl_latch": buf(bundle.CtlLatch), "ctl_vslot": buf(bundle.CtlVSlot)}

// node binds k's parameters by name and makes a launch.
func node(label string, k *Kernel, l ops.Launch, s slots, mi []MIOp) (bundle.Node, error) {
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
	g     *gen
	kind  bundle.TemplateKind
	rows  int
	nodes []bundle.Node
	err   error
}

func (t *tb) add(label string, k *Kernel, err error, l ops.Launch, s slots, mi []MIOp) {
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

// collective appends a node that exchanges an activation between tensor-parallel ranks.
func (t *tb) collective(label string, c bundle.Collective) {
	if t.err == nil {
		t.nodes = append(t.nodes, bundle.Node{Label: label, Collective: &c})
	}
}

// allReduce sums a row-parallel projection's partial output over the ranks, before the
// add+norm kernel that carries the residual hooks' MI ops: every rank then applies them
// to the same whole activation.
func (t *tb) allReduce(label, buffer string) {
	if t.g.tp > 1 {
		t.collective(label, bundle.Collective{Op: bundle.AllReduceSum, In: buffer, Out: buffer, Rows: t.rows, Cols: t.g.m.Hidden})
	}
}

// fail records the template's first error.
func (t *tb) fail(err error) {
	if t.err == nil {
		t.err = err
	}
}

// template emits the forward for one bucket: `rows` token rows, `samples` sampled rows.
func (g *gen) template(name string, kind bundle.TemplateKind, rows, samples int) (bundle.Template, error) {
	m := g.m
	t := &tb{g: g, kind: kind, rows: rows}
	H, D := m.Hidden, m.HeadDim
	r := g.rank()
	I := r.inter
	qkvW := (r.heads + 2*r.kvHeads) * D
	eps := float32(m.RMSEps)

	// Embedding + layer 0's input norm, with embed / resid_pre(0) ops fused.
	embedOps := g.miOps(passes.HostEmbed, -1, "", "")
	ec := GemmaRow(m, RowConfig{Hidden: H, Vocab: m.Vocab, Eps: eps, WDtype: g.wdt, Load: "embed", ResidOps: embedOps})
	k, err := g.kernel(miName("embed", embedOps, "embed"), func() (*Kernel, error) { return RowNorm(miName("embed", embedOps, "embed"), ec) })
	t.add("embed", k, err, ec.Launch(rows), slots{
		"tokens": buf(bundle.CtlTokens), "table": buf("embed"), "resid": buf("act.resid"),
		"w": buf(layerBuf(0, "attn_norm")), "out": buf("act.xn"),
	}, embedOps)

	for l := range m.Layers {
		lb := func(w string) bundle.Slot { return buf(layerBuf(l, w)) }
		t.gemm(fmt.Sprintf("L%d.qkv", l), "act.xn", lb("wqkv"), "act.qkv", H, qkvW, rows)
		for _, h := range []struct {
			hook          string
			width, offset int
		}{{"attn.q", r.heads * D, 0}, {"attn.k", r.kvHeads * D, r.heads * D}, {"attn.v", r.kvHeads * D, (r.heads + r.kvHeads) * D}} {
			t.miKernel(l, h.hook, "act.qkv", h.width, qkvW, h.offset)
		}
		rc := RopeConfig{Heads: r.heads, KVHeads: r.kvHeads, HeadDim: D, BlockSize: m.KVBlockSize, MaxBlocksPerSeq: g.blocks,
			KVDtype: g.kvdt, Bias: m.QKVBias, QKNorm: m.QKNorm, WDtype: g.wdt}
		kname := fmt.Sprintf("rope_kv_h%d_kv%d_d%d_%s", r.heads, r.kvHeads, D, g.kvdt)
		rs := slots{"cos": buf("rope.cos"), "sin": buf("rope.sin")}
		if m.QKVBias {
			kname += "_bias"
			rs["bias"] = lb("qkv_bias")
			// The bias lands in RopeKV, after the attn.q/k/v hooks: ops there would see
			// unbiased values.
			for _, hook := range []string{"attn.q", "attn.k", "attn.v"} {
				if len(g.miOps(passes.HostMI, l, "", hook)) > 0 {
					t.fail(fmt.Errorf("layer %d: hook %s on a model with q/k/v biases is not supported yet", l, hook))
				}
			}
		}
		if m.QKNorm {
			kname += "_qknorm"
			rc.Eps = eps
			rs["q_norm"], rs["k_norm"] = lb("q_norm"), lb("k_norm")
		}
		k, err := g.kernel(kname, func() (*Kernel, error) { return RopeKV(kname, rc) })
		kv := slots{"pos": buf(bundle.CtlPos), "seq": buf(bundle.CtlSeq), "block_table": buf(bundle.KVBlockTable),
			"kcache": lb("kcache"), "vcache": lb("vcache"), "qkv": buf("act.qkv")}
		t.add(fmt.Sprintf("L%d.rope_kv", l), k, err, rc.Launch(rows), merge(kv, rs), nil)

		t.attention(l, kv)
		t.miKernel(l, "attn.z", "act.z", r.heads*D, r.heads*D, 0)

		t.gemm(fmt.Sprintf("L%d.o", l), "act.z", lb("wo"), "act.delta", r.heads*D, H, rows)
		t.allReduce(fmt.Sprintf("L%d.o.all_reduce", l), "act.delta")
		t.addNorm(2*l, lb("mlp_norm"), "act.xn", false)
		if m.Experts > 0 {
			t.moe(l)
		} else {
			t.gemm(fmt.Sprintf("L%d.gate_up", l), "act.xn", lb("wgu"), "act.gu", H, 2*I, rows)

			siluOps := g.miOps(passes.HostSilu, l, "", "")
			sc := GemmaSilu(m, SiluConfig{Inter: I, Ops: siluOps})
			sname := miName(GatedKernelName(sc), siluOps, fmt.Sprintf("L%d", l))
			k, err = g.kernel(sname, func() (*Kernel, error) { return SiluMul(sname, sc) })
			t.add(fmt.Sprintf("L%d.silu_mul", l), k, err, sc.Launch(rows), slots{"gu": buf("act.gu"), "act": buf("act.mlp")}, siluOps)

			t.gemm(fmt.Sprintf("L%d.down", l), "act.mlp", lb("wdown"), "act.delta", I, H, rows)
		}
		t.allReduce(fmt.Sprintf("L%d.mlp.all_reduce", l), "act.delta")
		if l+1 < m.Layers {
			t.addNorm(2*l+1, buf(layerBuf(l+1, "attn_norm")), "act.xn", false)
		} else {
			t.addNorm(2*l+1, buf("final_norm"), "act.final", true)
		}
		t.custom(l)
		t.lens(l)
	}
	t.lmHead(samples)
	t.finalSoftcap(samples)
	t.sampleTail(samples)
	if t.err != nil {
		return bundle.Template{}, fmt.Errorf("template %s: %w", name, t.err)
	}
	tmpl := bundle.Template{Name: name, Kind: kind, Tokens: rows, Samples: samples, Nodes: t.nodes}
	if splits := g.attnSplits(rows); kind == bundle.Decode && splits > 1 {
		tmpl.AttnSplit = &bundle.AttnSplit{Buffer: bundle.CtlAttnChunk, MaxSplits: splits, MinChunk: AttnMinChunk}
	}
	return tmpl, nil
}

// lmHead emits the LM head: whole on one device; vocab-parallel at tp > 1, each rank
// computing its vocab/tp columns and an all-gather assembling whole logits rows on every
// rank, so the sampler and the logits hook's MI ops see the whole vocabulary.
func (t *tb) lmHead(samples int) {
	g := t.g
	if g.tp == 1 {
		t.gemm("lm_head", "act.final", buf(g.lmHead()), bundle.ActLogits, g.m.Hidden, g.m.Vocab, samples)
		return
	}
	cols := g.rank().vocab
	t.gemm("lm_head", "act.final", buf(g.lmHead()), "act.logits_shard", g.m.Hidden, cols, samples)
	t.collective("lm_head.all_gather", bundle.Collective{Op: bundle.AllGatherCols, In: "act.logits_shard", Out: bundle.ActLogits, Rows: samples, Cols: cols})
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

// miName names a kernel: shared by every layer when it carries no MI ops, specific to its
// site when it does.
func miName(base string, mi []MIOp, site string) string {
	if len(mi) == 0 {
		return base
	}
	return base + "_mi_" + site
}

// attnConfig is this model's (and rank's) attention shape.
func (g *gen) attnConfig() AttnConfig {
	r := g.rank()
	return AttnConfig{Heads: r.heads, KVHeads: r.kvHeads, HeadDim: g.m.HeadDim, BlockSize: g.m.KVBlockSize,
		MaxBlocksPerSeq: g.blocks, KVDtype: g.kvdt, Scale: float32(1 / math.Sqrt(float64(g.m.HeadDim)))}
}

// attention emits layer l's attention over the KV cache into act.z. A decode bucket runs the
// flash-decoding kernel, its context split per step when the bucket's rows alone do not fill
// the GPU (the host writes the step's chunk, bundle.AttnSplit). A prefill chunk runs the
// tensor-core kernel over its prompt rows and the decode kernel over the rows alone of their
// sequence (the decode rows mixed into the step); with a cache the tensor cores cannot read
// (f32), the decode kernel takes every row.
func (t *tb) attention(l int, kv slots) {
	g := t.g
	ac := GemmaAttention(g.m, l, g.attnConfig())
	base := fmt.Sprintf("attention_h%d_kv%d_d%d_%s", ac.Heads, ac.KVHeads, ac.HeadDim, g.kvdt) + AttnKernelSuffix(ac)
	label := fmt.Sprintf("L%d.attention", l)
	s := merge(kv, slots{"z": buf("act.z")})
	decode := func(name string, c AttnConfig, splits int, s slots) {
		k, err := g.kernel(name, func() (*Kernel, error) { return Attention(name, c) })
		t.add(label, k, err, c.Launch(t.rows, splits), s, nil)
	}
	switch {
	case t.kind == bundle.Decode && g.attnSplits(t.rows) > 1:
		ac.Split = true
		decode(base+"_split", ac, g.attnSplits(t.rows), merge(s, slots{"ws": buf("act.attn_ws"), "chunk": buf(bundle.CtlAttnChunk)}))
	case t.kind == bundle.Decode || !ac.PrefillOK():
		decode(base, ac, 1, s)
	default:
		ac.Singles = true
		decode(base+"_singles", ac, 1, s)
		ac.Singles = false
		name := base + "_prefill"
		k, err := g.kernel(name, func() (*Kernel, error) { return AttentionPrefill(name, ac) })
		t.add(fmt.Sprintf("L%d.attention_prefill", l), k, err, ac.LaunchPrefill(t.rows), merge(s, slots{"rows": konst(uint64(t.rows))}), nil)
	}
}

// attnSplits is the grid z of a decode bucket's attention (1: no split).
func (g *gen) attnSplits(rows int) int { return g.attnConfig().DecodeSplits(rows) }

// tensorCoreRows is the bucket size from which GEMMs run on tensor cores (bf16 activations,
// f32 accumulation): the CUDA-core GEMM's cost grows with rows (on an H200, 4.5x at 8 rows),
// mma's is flat up to 128. Below it, the CUDA-core GEMM keeps f32 activations.
const tensorCoreRows = 8

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
	if rows >= tensorCoreRows && g.wdt == ptx.BF16 && k%16 == 0 && n%16 == 0 && g.gemmKind != "cuda-core" {
		if g.gemmKind == "tc-staged" {
			name := fmt.Sprintf("gemm_tcs_k%d_n%d%s", k, n, guard)
			kern, err := g.kernel(name, func() (*Kernel, error) { return GemmTCStaged(name, c) })
			s["ws"] = buf("act.gemm_ws")
			t.add(label, kern, err, c.LaunchTCStaged(rows), s, nil)
			return
		}
		name := fmt.Sprintf("gemm_tc_k%d_n%d%s", k, n, guard)
		kern, err := g.kernel(name, func() (*Kernel, error) { return GemmTC(name, c) })
		t.add(label, kern, err, c.LaunchTC(rows), s, nil)
		return
	}
	name := fmt.Sprintf("gemm_k%d_n%d_%s%s", k, n, g.wdt, guard)
	kern, err := g.kernel(name, func() (*Kernel, error) { return Gemm(name, c) })
	t.add(label, kern, err, c.Launch(rows), s, nil)
}

// addNorm emits the residual add + RMSNorm that ends attention (slot 2L) or the MLP
// (slot 2L+1) of a layer, with the MI ops placed in it. The last one is the final norm and
// writes only the sampled rows.
func (t *tb) addNorm(slot int, w bundle.Slot, out string, final bool) {
	g := t.g
	m := g.m
	c := GemmaRow(m, RowConfig{Hidden: m.Hidden, Vocab: m.Vocab, Eps: float32(m.RMSEps), WDtype: g.wdt, Load: "add", Gather: final,
		DeltaOps: g.miOps(passes.HostAddNorm, slot, passes.RoleDelta, ""),
		ResidOps: g.miOps(passes.HostAddNorm, slot, passes.RoleResid, ""),
		NormOps:  g.miOps(passes.HostAddNorm, slot, passes.RoleNorm, "")})
	all := append(append(append([]MIOp(nil), c.DeltaOps...), c.ResidOps...), c.NormOps...)
	base := fmt.Sprintf("add_norm_h%d", m.Hidden)
	if final {
		base = fmt.Sprintf("final_norm_h%d", m.Hidden)
	}
	name := miName(base, all, fmt.Sprintf("s%d", slot))
	k, err := g.kernel(name, func() (*Kernel, error) { return RowNorm(name, c) })
	s := slots{"resid": buf("act.resid"), "delta": buf("act.delta"), "w": w, "out": buf(out)}
	if final {
		s["out_row"] = buf(bundle.CtlOutRow)
	}
	if c.DeltaNorm {
		s["delta_w"] = buf(gemma2PostNorm(slot))
	}
	t.add(fmt.Sprintf("slot%d.add_norm", slot), k, err, c.Launch(t.rows), s, all)
}

// miKernel emits a standalone MI kernel over x when ops sit at hook of layer l.
func (t *tb) miKernel(l int, hook, x string, width, stride, offset int) {
	g := t.g
	mi := g.miOps(passes.HostMI, l, "", hook)
	if len(mi) == 0 {
		return
	}
	c := MIKernelConfig{Width: width, Stride: stride, Offset: offset, Ops: mi}
	name := fmt.Sprintf("mi_L%d_%s", l, strings.ReplaceAll(hook, ".", "_"))
	k, err := g.kernel(name, func() (*Kernel, error) { return MIKernel(name, c) })
	t.add(fmt.Sprintf("L%d.%s", l, hook), k, err, c.Launch(t.rows), slots{"x": buf(x)}, mi)
}

// logitsKernel and sampleKernel name the kernels of the model's tail, as sites report them.
const logitsKernel = "mi_logits"

func (g *gen) sampleKernel(ovr []MIOp) string {
	return miName(fmt.Sprintf("sample_v%d", g.m.Vocab), ovr, "sampled")
}

// sampleTail emits the MI kernel of hook logits (when ops sit there) and the sampler with
// the token_override ops of hook sampled fused in. Both run over samples and find each
// sample's token row, for its control words, through ctl.s_row.
func (t *tb) sampleTail(samples int) {
	g := t.g
	m := g.m
	if lo := g.miOps(passes.HostLogits, -1, "", ""); len(lo) > 0 {
		c := LogitsMIConfig{Vocab: m.Vocab, Ops: lo}
		k, err := g.kernel(logitsKernel, func() (*Kernel, error) { return LogitsMI(logitsKernel, c) })
		t.add("logits.mi", k, err, c.Launch(samples), slots{"x": buf(bundle.ActLogits), "s_row": buf(bundle.CtlSRow)}, lo)
	}
	ovr := g.miOps(passes.HostSampler, -1, "", "")
	smc := SampleConfig{Vocab: m.Vocab, Logprobs: m.MaxLogprobs, EOS: m.EOS, Overrides: ovr}
	name := g.sampleKernel(ovr)
	k, err := g.kernel(name, func() (*Kernel, error) { return Sample(name, smc) })
	s := slots{
		"logits": buf(bundle.ActLogits), "temperature": buf(bundle.CtlTemperature), "top_p": buf(bundle.CtlTopP),
		"rng": buf(bundle.CtlRNG), "out": buf(bundle.OutSampled), "s_row": buf(bundle.CtlSRow),
		"lp_k": buf(bundle.CtlLogprobs), "lp_out": buf(bundle.OutLogprobs), "eos_ban": buf(bundle.CtlEOSBan),
	}
	for i, o := range ovr {
		s[fmt.Sprintf("ovr%d_scal", i)] = buf(o.Scal)
		if o.Fired != "" {
			s[fmt.Sprintf("ovr%d_fired", i)] = bundle.Slot{Buffer: o.Fired, Offset: int64(o.FiredCol)}
		}
	}
	t.add("sample", k, err, smc.Launch(samples), s, nil)
}

// lensName names op i's lens kernels: they depend on the app bit and the output columns.
func (g *gen) lensName(kind string, c LensConfig) string {
	return fmt.Sprintf("lens_%s_h%d_v%d_b%d_k%d_c%d_w%d", kind, c.Hidden, c.Vocab, c.Bit, c.K, c.OutCol, c.OutWidth)
}

// lensConfig is a logit-lens op's configuration.
func (g *gen) lensConfig(op *passes.MIOp) LensConfig {
	m := g.m
	return LensConfig{Hidden: m.Hidden, Vocab: m.Vocab, Eps: float32(m.RMSEps), WDtype: g.wdt, Bit: op.App.Bit,
		K: op.K, OutWidth: op.OutWidth, OutCol: op.OutCol, WOffset: float32(m.NormOffset), Softcap: float32(m.FinalSoftcap)}
}

// lens emits the heavy logit-lens nodes of the ops at resid_post of layer l: they read
// act.resid as the add+norm kernel just left it (after that kernel's resid_post writes).
func (t *tb) lens(l int) {
	g := t.g
	m := g.m
	for _, op := range g.p.Ops {
		if op.Host != passes.HostLens || op.HostLayer != l {
			continue
		}
		bit := uint32(1) << op.App.Bit
		c := g.lensConfig(op)
		label := func(kind string) string { return fmt.Sprintf("L%d.%s.%s", l, kind, op.App.Name) }
		name := func(kind string) string { return g.lensName(kind, c) }
		nn, pn, tn := name("norm"), name("topk_part"), name("topk")
		k, err := g.kernel(nn, func() (*Kernel, error) { return LensNorm(nn, c) })
		t.add(label("lens_norm"), k, err, c.RowsLaunch(t.rows), slots{
			"any_mask": buf(bundle.CtlAnyMask), "resid": buf("act.resid"), "w": buf("final_norm"), "out": buf("act.lens_x"),
		}, nil)
		t.skipUnless(bit)
		t.gemmAt(label("lens_logits"), buf("act.lens_x"), buf(g.lmHead()), buf("act.lens"),
			GemmConfig{K: m.Hidden, N: m.Vocab, WDtype: g.wdt, Guard: bit}, t.rows)
		t.skipUnless(bit)
		k, err = g.kernel(pn, func() (*Kernel, error) { return LensTopKPart(pn, c) })
		t.add(label("lens_topk_part"), k, err, c.PartLaunch(t.rows), slots{
			"any_mask": buf(bundle.CtlAnyMask), "logits": buf("act.lens"), "cand": buf("act.lens_cand"),
		}, nil)
		t.skipUnless(bit)
		k, err = g.kernel(tn, func() (*Kernel, error) { return LensTopK(tn, c) })
		t.add(label("lens_topk"), k, err, c.RowsLaunch(t.rows), slots{
			"any_mask": buf(bundle.CtlAnyMask), "cand": buf("act.lens_cand"), "out": buf(op.Out),
		}, nil)
		t.skipUnless(bit)
	}
}

// skipUnless marks the node just added as one that does nothing unless a row of the step
// enables an app of mask (its kernel exits early on ctl.any_mask), so that a backend may
// leave it out of the step (bundle.Node.SkipUnless).
func (t *tb) skipUnless(mask uint32) {
	if t.err == nil {
		t.nodes[len(t.nodes)-1].SkipUnless = mask
	}
}
