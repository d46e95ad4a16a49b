package bundle

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"xmix/safetensors"
)

// dtypeSizes are the element types device buffers can hold.
var dtypeSizes = map[string]int{"f32": 4, "bf16": 2, "u32": 4}

// DtypeSize returns the byte size of one element of a buffer dtype ("f32", "bf16", "u32").
func DtypeSize(dtype string) (int, bool) {
	n, ok := dtypeSizes[dtype]
	return n, ok
}

// PrefillChunks lists the rows of the bundle's prefill templates, ascending.
func (b *Bundle) PrefillChunks() []int {
	var chunks []int
	for _, t := range b.Templates {
		if t.Kind == Prefill {
			chunks = append(chunks, t.Tokens)
		}
	}
	slices.Sort(chunks)
	return chunks
}

// CheckMaxBatchedTokens checks a step's token budget against the prefill chunks (ascending)
// and max_seqs: a step's rows run in a chunk at least as large, and the budget must hold one
// decode row of every resident sequence (where a chunk can), so that decoding never waits
// behind prompts.
func CheckMaxBatchedTokens(n int, chunks []int, maxSeqs int) error {
	if len(chunks) == 0 {
		return fmt.Errorf("max_batched_tokens %d: there are no prefill chunks", n)
	}
	largest := chunks[len(chunks)-1]
	if n > largest {
		return fmt.Errorf("max_batched_tokens %d is more than the largest prefill chunk %d: no template holds a step that large (add a chunk of %d to prefill_chunks, or lower the budget)", n, largest, n)
	}
	if low := min(maxSeqs, largest); n < low {
		return fmt.Errorf("max_batched_tokens %d is below max_seqs %d: a step must hold one decode row of every running sequence (raise it to at least %d)", n, maxSeqs, low)
	}
	return nil
}

// paramSizes are the byte sizes of the PTX parameter types a kernel may declare.
var paramSizes = map[string]int{
	"u8": 1, "s8": 1, "b8": 1,
	"u16": 2, "s16": 2, "b16": 2, "f16": 2, "bf16": 2,
	"u32": 4, "s32": 4, "b32": 4, "f32": 4,
	"u64": 8, "s64": 8, "b64": 8, "f64": 8,
	TensorMapParam: TensorMapBytes,
}

var bufferKinds = map[BufferKind]bool{
	KindWeight: true, KindActivation: true, KindKV: true,
	KindControl: true, KindOutput: true, KindParam: true, KindSlots: true,
}

// maxBufferBytes bounds one buffer (1 TiB): beyond it a shape is certainly wrong, and the
// bound keeps size arithmetic far from overflow.
const maxBufferBytes = 1 << 40

// Verify cross-checks a bundle's content: what the loader will trust without looking again.
// Kernel, buffer and template names are unique; every template node names an existing kernel
// and binds exactly its parameters; every slot names an existing buffer through a 64-bit
// pointer parameter at an offset inside that buffer; constants fit their parameter; buffer
// dtypes, kinds and shapes are valid; app exports name existing buffers.
func Verify(b *Bundle) error {
	if b == nil {
		return fmt.Errorf("bundle is nil")
	}
	tp := b.Manifest.TP
	if tp < 0 || tp > MaxTP {
		return fmt.Errorf("manifest: tensor-parallel degree %d is outside 0..%d", tp, MaxTP)
	}
	if c := b.Manifest.Build.TCChunks; len(c) != 0 && (len(c) != 2 || min(c[0], c[1]) < 1) {
		// Only a record of how the kernels were built, but tools print it.
		return fmt.Errorf("manifest: build tc_chunks %v: want none or two positive counts; rebuild the bundle", c)
	}
	if bi := b.Manifest.Build; bi.AttnEarlyKV && !bi.PDL {
		return fmt.Errorf("manifest: build attn_early_kv without pdl: early K/V loads need kernels launched early; rebuild the bundle")
	}
	if bi := b.Manifest.Build; bi.AttnWarps < 0 || bi.AttnUnroll < 0 || bi.GemvSplit < 0 || bi.AttnPrefetch < 0 || bi.AttnPrefetchOneRow < 0 || bi.GemvWarps < 0 {
		return fmt.Errorf("manifest: build attn_warps %d, attn_unroll %d, gemv_split %d, attn_prefetch %d (%d at one row), gemv_warps %d: want counts of at least 0 (0: the default, or none); rebuild the bundle", bi.AttnWarps, bi.AttnUnroll, bi.GemvSplit, bi.AttnPrefetch, bi.AttnPrefetchOneRow, bi.GemvWarps)
	}
	if _, err := ParseGemmShapes(b.Manifest.Build.CopyGemms); err != nil {
		return fmt.Errorf("manifest: build copy_gemms: %w; rebuild the bundle", err)
	}
	for _, n := range b.Manifest.Build.CopyGemmRows {
		if n < 1 {
			return fmt.Errorf("manifest: build copy_gemm_rows %v: want row counts of at least 1; rebuild the bundle", b.Manifest.Build.CopyGemmRows)
		}
	}
	bi := b.Manifest.Build
	for _, c := range []struct {
		field string
		n     int
		want  string
	}{
		{"gated_tc_rows", bi.GatedTCRows, "a row count, or 0 for none"},
		{"gated_copy_rows", bi.GatedCopyRows, "a row count, or 0 for none"},
		{"rope_copy_rows", bi.RopeCopyRows, "a row count, or 0 for none"},
		{"mi_preload_regs", bi.MIPreloadRegs, "registers a thread, or 0 for no bound"},
		{"mi_preload_regs_multi_wave", bi.MIPreloadRegsMultiWave, "registers a thread, or 0 for mi_preload_regs's bound"},
		{"copy_gemm_slots", bi.CopyGemmSlots, "a count, or 0 for the default"},
		{"tensor_core_rows", bi.TensorCoreRows, "a bucket size, or 0 for the default"},
	} {
		if c.n < 0 {
			return fmt.Errorf("manifest: build %s %d: want %s; rebuild the bundle", c.field, c.n, c.want)
		}
	}
	bufBytes, err := verifyBuffers(b.Manifest.Buffers)
	if err != nil {
		return err
	}
	if err := verifyShards(b.Manifest.Buffers, tp); err != nil {
		return err
	}
	if err := verifySources(b); err != nil {
		return err
	}
	kernels := map[string]*Kernel{}
	for i := range b.Kernels {
		k := &b.Kernels[i]
		if err := verifyKernel(k); err != nil {
			return fmt.Errorf("kernel %d (%q): %w", i, k.Name, err)
		}
		if kernels[k.Name] != nil {
			return fmt.Errorf("kernel %d: the name %q is used by two kernels; kernel names must be unique", i, k.Name)
		}
		kernels[k.Name] = k
	}
	if _, err := GemmCopyKernels(b.Kernels); err != nil {
		return err
	}
	templates := map[string]bool{}
	for i := range b.Templates {
		t := &b.Templates[i]
		if err := verifyTemplate(t, kernels, bufBytes, b.Manifest.Buffers, tp, b.Manifest.Apps); err != nil {
			return fmt.Errorf("template %d (%q): %w", i, t.Name, err)
		}
		if templates[t.Name] {
			return fmt.Errorf("template %d: the name %q is used by two templates; template names must be unique", i, t.Name)
		}
		templates[t.Name] = true
	}
	if n := b.Manifest.Model.MaxBatchedTokens; n != 0 {
		if err := CheckMaxBatchedTokens(n, b.PrefillChunks(), b.Manifest.Model.MaxSeqs); err != nil {
			return fmt.Errorf("manifest: %w", err)
		}
	}
	return verifyApps(b.Manifest.Apps, bufBytes)
}

// verifyBuffers checks each buffer and returns the byte size of each by name.
func verifyBuffers(bufs []Buffer) (map[string]int64, error) {
	sizes := map[string]int64{}
	for i, buf := range bufs {
		where := fmt.Sprintf("buffer %d (%q)", i, buf.Name)
		if buf.Name == "" {
			return nil, fmt.Errorf("%s: empty name", where)
		}
		if _, dup := sizes[buf.Name]; dup {
			return nil, fmt.Errorf("%s: the name is used by two buffers; buffer names must be unique", where)
		}
		if !bufferKinds[buf.Kind] {
			return nil, fmt.Errorf("%s: unknown kind %q (want weight, activation, kv, control, output or param)", where, buf.Kind)
		}
		elem, ok := dtypeSizes[buf.Dtype]
		if !ok {
			return nil, fmt.Errorf("%s: unknown dtype %q (want f32, bf16 or u32)", where, buf.Dtype)
		}
		if len(buf.Shape) == 0 {
			return nil, fmt.Errorf("%s: empty shape; a buffer has at least one dimension", where)
		}
		n := int64(elem)
		for _, d := range buf.Shape {
			if d <= 0 {
				return nil, fmt.Errorf("%s: shape %v has a dimension that is not positive", where, buf.Shape)
			}
			if int64(d) > maxBufferBytes/n {
				return nil, fmt.Errorf("%s: shape %v of %s exceeds %d bytes", where, buf.Shape, buf.Dtype, int64(maxBufferBytes))
			}
			n *= int64(d)
		}
		if (buf.Kind == KindWeight || buf.Kind == KindParam) && len(buf.Tensors) == 0 {
			return nil, fmt.Errorf("%s: a %s buffer must name the tensors it is loaded from", where, buf.Kind)
		}
		sizes[buf.Name] = n
	}
	return sizes, nil
}

func verifyKernel(k *Kernel) error {
	if k.Name == "" {
		return fmt.Errorf("empty name")
	}
	if k.PTX == "" {
		return fmt.Errorf("no PTX text")
	}
	for j, p := range k.Params {
		if _, ok := paramSizes[p.Type]; !ok {
			return fmt.Errorf("param %d (%q): unknown PTX type %q", j, p.Name, p.Type)
		}
	}
	if len(k.Attrs) > 0 && !json.Valid(k.Attrs) {
		return fmt.Errorf("attrs are not valid JSON")
	}
	if k.EarlyLaunch && !strings.Contains(k.PTX, PriorGridWait+";") {
		return fmt.Errorf("early_launch is set but the PTX never waits for the grid ahead (%s): launched early it would read what that grid has not written yet; rebuild the bundle", PriorGridWait)
	}
	return nil
}

func verifyTemplate(t *Template, kernels map[string]*Kernel, bufBytes map[string]int64, bufs []Buffer, tp int, apps []App) error {
	if t.Name == "" {
		return fmt.Errorf("empty name")
	}
	if t.Kind != Decode && t.Kind != Prefill {
		return fmt.Errorf("kind %q is neither decode nor prefill", t.Kind)
	}
	if t.Tokens <= 0 || t.Samples < 0 || t.Samples > t.Tokens {
		return fmt.Errorf("tokens %d, samples %d: want tokens >= 1 and 0 <= samples <= tokens", t.Tokens, t.Samples)
	}
	if len(t.Plain) > 0 && bufBytes[CtlAnyMask] == 0 {
		return fmt.Errorf("plain nodes without a %s buffer to choose them", CtlAnyMask)
	}
	if a := t.AttnSplit; a != nil {
		if a.MaxSplits < 1 || a.Step < 1 || a.MinChunk < 1 || a.MinChunk%a.Step != 0 || a.RowBlocks < 1 || a.WaveBlocks < 1 {
			return fmt.Errorf("attention split: max_splits %d, step %d, min_chunk %d, row_blocks %d, wave_blocks %d: want each at least 1 and min_chunk a multiple of step (a bundle from before they were written: rebuild it)",
				a.MaxSplits, a.Step, a.MinChunk, a.RowBlocks, a.WaveBlocks)
		}
		if !controlU32(bufs, a.Buffer) {
			return fmt.Errorf("attention split: buffer %q is not a u32 control buffer", a.Buffer)
		}
	}
	if err := verifyNodes(t.Nodes, t.Tokens, kernels, bufBytes, bufs, tp); err != nil {
		return err
	}
	if err := verifyNodes(t.Plain, t.Tokens, kernels, bufBytes, bufs, tp); err != nil {
		return fmt.Errorf("plain: %w", err)
	}
	return verifySolo(t, kernels, bufBytes, bufs, tp, apps)
}

// verifySolo checks a template's Solo lists: chosen by ctl.any_mask, each of a deployed
// app's bit, one a bit, and their nodes as sound as Nodes'.
func verifySolo(t *Template, kernels map[string]*Kernel, bufBytes map[string]int64, bufs []Buffer, tp int, apps []App) error {
	if len(t.Solo) > 0 && bufBytes[CtlAnyMask] == 0 {
		return fmt.Errorf("solo nodes without a %s buffer to choose them", CtlAnyMask)
	}
	deployed := map[int]bool{}
	for _, a := range apps {
		deployed[a.Bit] = true
	}
	seen := map[int]bool{}
	for i, s := range t.Solo {
		switch {
		case !deployed[s.Bit]:
			return fmt.Errorf("solo %d: bit %d is no deployed app's", i, s.Bit)
		case seen[s.Bit]:
			return fmt.Errorf("solo %d: a second list for bit %d", i, s.Bit)
		}
		seen[s.Bit] = true
		if err := verifyNodes(s.Nodes, t.Tokens, kernels, bufBytes, bufs, tp); err != nil {
			return fmt.Errorf("solo of bit %d: %w", s.Bit, err)
		}
	}
	return nil
}

// controlU32 reports whether bufs has a u32 control buffer named name.
func controlU32(bufs []Buffer, name string) bool {
	for _, b := range bufs {
		if b.Name == name {
			return b.Kind == KindControl && b.Dtype == "u32"
		}
	}
	return false
}

func verifyNodes(nodes []Node, tokens int, kernels map[string]*Kernel, bufBytes map[string]int64, bufs []Buffer, tp int) error {
	for i := range nodes {
		n := &nodes[i]
		var err error
		if n.Collective != nil {
			err = verifyCollective(n, tokens, bufs, tp)
		} else {
			err = verifyNode(n, kernels, bufBytes)
		}
		if err == nil && n.SkipUnless != 0 && n.Collective != nil {
			err = fmt.Errorf("a collective cannot be skipped (skip_unless %#x)", n.SkipUnless)
		}
		if err == nil && n.SkipUnless != 0 && bufBytes[CtlAnyMask] == 0 {
			err = fmt.Errorf("skip_unless %#x without a %s buffer to decide it", n.SkipUnless, CtlAnyMask)
		}
		if err != nil {
			return fmt.Errorf("node %d (%q): %w", i, n.Label, err)
		}
	}
	return nil
}

func verifyNode(n *Node, kernels map[string]*Kernel, bufBytes map[string]int64) error {
	k := kernels[n.Kernel]
	if k == nil {
		return fmt.Errorf("kernel %q does not exist in the bundle", n.Kernel)
	}
	threads := 1
	for d := range 3 {
		if n.Grid[d] <= 0 || n.Block[d] <= 0 {
			return fmt.Errorf("grid %v block %v: every dimension must be at least 1", n.Grid, n.Block)
		}
		threads *= min(n.Block[d], 1<<11)
	}
	if threads > 1024 {
		return fmt.Errorf("block %v has more than 1024 threads", n.Block)
	}
	if n.Shared < 0 || n.Shared > MaxDynamicShared {
		return fmt.Errorf("%d bytes of dynamic shared memory: want 0 to %d (rebuild the bundle)", n.Shared, MaxDynamicShared)
	}
	if len(n.Args) != len(k.Params) {
		return fmt.Errorf("kernel %q has %d params but the node binds %d args", k.Name, len(k.Params), len(n.Args))
	}
	for j, s := range n.Args {
		p := k.Params[j]
		if slices.Contains(backendParams, p.Name) && s != (Slot{}) {
			return fmt.Errorf("arg %d (%s): the backend points it at a scratch of its own; a bundle passes the constant 0", j, p.Name)
		}
		if s.Buffer == "" {
			if s.Offset != 0 {
				return fmt.Errorf("arg %d (%s): offset %d without a buffer", j, p.Name, s.Offset)
			}
			if size := paramSizes[p.Type]; size < 8 && s.Const>>(8*size) != 0 {
				return fmt.Errorf("arg %d (%s): constant %#x does not fit its %s param", j, p.Name, s.Const, p.Type)
			}
			continue
		}
		size, ok := bufBytes[s.Buffer]
		if !ok {
			return fmt.Errorf("arg %d (%s): buffer %q does not exist in the manifest", j, p.Name, s.Buffer)
		}
		if p.Type != "u64" {
			return fmt.Errorf("arg %d (%s): binds buffer %q to a %s param; pointers are u64", j, p.Name, s.Buffer, p.Type)
		}
		if s.Const != 0 {
			return fmt.Errorf("arg %d (%s): binds both buffer %q and a constant", j, p.Name, s.Buffer)
		}
		if s.Offset < 0 || s.Offset >= size {
			return fmt.Errorf("arg %d (%s): offset %d is outside buffer %q of %d bytes", j, p.Name, s.Offset, s.Buffer, size)
		}
	}
	_, _, err := GemmOf(*n, *k) // a GEMM node must read as one
	return err
}

func verifyApps(apps []App, bufBytes map[string]int64) error {
	names := map[string]bool{}
	bits := map[int]string{}
	for i, a := range apps {
		where := fmt.Sprintf("app %d (%q)", i, a.Name)
		if a.Name == "" {
			return fmt.Errorf("%s: empty name", where)
		}
		if names[a.Name] {
			return fmt.Errorf("%s: the name is used by two apps", where)
		}
		names[a.Name] = true
		if a.Bit < 0 || a.Bit > 63 {
			return fmt.Errorf("%s: mask bit %d is outside 0..63", where, a.Bit)
		}
		if other, dup := bits[a.Bit]; dup {
			return fmt.Errorf("%s: mask bit %d is also app %q's", where, a.Bit, other)
		}
		bits[a.Bit] = a.Name
		for _, v := range a.Vectors {
			if _, ok := bufBytes[v.Slots]; v.Slots != "" && !ok {
				return fmt.Errorf("%s: vector %q keeps its per-request slots in buffer %q, which does not exist in the manifest", where, v.Param, v.Slots)
			}
		}
		if a.FiredBuffer != "" {
			n, ok := bufBytes[a.FiredBuffer]
			width := 0
			for _, f := range a.Fired {
				width = max(width, f.Column+1)
			}
			if row := int64((width + 3) / 4 * 4); !ok || width == 0 || n%row != 0 {
				return fmt.Errorf("%s: fired buffer %q does not hold rows of %d bytes", where, a.FiredBuffer, row)
			}
		}
		col := len(a.Scalars)
		for _, m := range a.LayerMasks {
			if m.Column != col || m.Words <= 0 || len(m.Layers) == 0 {
				return fmt.Errorf("%s: layer mask of op %d: %d words at column %d (want column %d) for layers %v", where, m.Op, m.Words, m.Column, col, m.Layers)
			}
			col += m.Words
		}
		for _, e := range a.Exports {
			if _, ok := bufBytes[e.Buffer]; !ok {
				return fmt.Errorf("%s: export %q reads buffer %q, which does not exist in the manifest", where, e.Name, e.Buffer)
			}
			if e.Width <= 0 {
				return fmt.Errorf("%s: export %q has width %d; want at least 1", where, e.Name, e.Width)
			}
		}
	}
	return nil
}

// verifySources checks that param buffers, and weight buffers when the weights are embedded,
// name tensors that exist and together hold as many elements as the buffer.
func verifySources(b *Bundle) error {
	check := func(section string, data []byte, kind BufferKind) error {
		var file *safetensors.File
		for i, buf := range b.Manifest.Buffers {
			if buf.Kind != kind {
				continue
			}
			if file == nil {
				if len(data) == 0 {
					return fmt.Errorf("buffer %d (%q) is loaded from the %s section, which is empty", i, buf.Name, section)
				}
				f, err := safetensors.Parse(data)
				if err != nil {
					return fmt.Errorf("section %s: %w", section, err)
				}
				file = f
			}
			want := 1
			for _, d := range buf.Shape {
				want *= d
			}
			if buf.Shard != nil {
				want *= b.Manifest.TP // the tensors hold every rank's part
			}
			got := 0
			for _, name := range buf.Tensors {
				t := file.Tensors[name]
				if t == nil {
					return fmt.Errorf("buffer %d (%q): tensor %q is not in the %s section", i, buf.Name, name, section)
				}
				got += t.Elements()
			}
			if got != want {
				return fmt.Errorf("buffer %d (%q): shape %v holds %d elements but tensors %v hold %d",
					i, buf.Name, buf.Shape, want, buf.Tensors, got)
			}
		}
		return nil
	}
	if err := check("params", b.Params, KindParam); err != nil {
		return err
	}
	if len(b.Weights) == 0 {
		return nil
	}
	return check("weights", b.Weights, KindWeight)
}
