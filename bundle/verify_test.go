package bundle

import (
	"slices"
	"strings"
	"testing"

	"xmix/safetensors"
)

func TestVerifyAcceptsTestBundle(t *testing.T) {
	if err := Verify(testBundle()); err != nil {
		t.Fatal(err)
	}
}

func TestVerifyFailures(t *testing.T) {
	cases := []struct {
		name   string
		mutate func(b *Bundle)
		want   string
	}{
		{"missing kernel", func(b *Bundle) { b.Templates[0].Nodes[1].Kernel = "gone" },
			`template 0 ("decode_4"): node 1 ("steer"): kernel "gone" does not exist in the bundle`},
		{"arg count", func(b *Bundle) { b.Templates[0].Nodes[0].Args = b.Templates[0].Nodes[0].Args[:3] },
			`kernel "embed" has 4 params but the node binds 3 args`},
		{"missing buffer", func(b *Bundle) { b.Templates[0].Nodes[0].Args[2].Buffer = "y" },
			`arg 2 (out): buffer "y" does not exist in the manifest`},
		{"buffer in scalar param", func(b *Bundle) { b.Templates[0].Nodes[0].Args[3] = Slot{Buffer: "x"} },
			`binds buffer "x" to a u32 param; pointers are u64`},
		{"offset past buffer", func(b *Bundle) { b.Templates[0].Nodes[1].Args[0].Offset = 128 },
			`offset 128 is outside buffer "x" of 128 bytes`},
		{"offset without buffer", func(b *Bundle) { b.Templates[0].Nodes[0].Args[3].Offset = 4 }, "offset 4 without a buffer"},
		{"constant too wide", func(b *Bundle) { b.Templates[0].Nodes[0].Args[3].Const = 1 << 32 },
			"constant 0x100000000 does not fit its u32 param"},
		{"buffer and constant", func(b *Bundle) { b.Templates[0].Nodes[0].Args[0].Const = 1 }, "binds both buffer"},
		{"a bf16 copy's address", func(b *Bundle) { b.Kernels[0].Params[2].Name = NormOutBF16 },
			"arg 2 (out_bf16): the backend points it at a scratch of its own; a bundle passes the constant 0"},
		{"duplicate kernel", func(b *Bundle) { b.Kernels[1].Name = "embed" }, `kernel 1: the name "embed" is used by two kernels`},
		{"duplicate buffer", func(b *Bundle) { b.Manifest.Buffers[2].Name = "x" }, `buffer 2 ("x"): the name is used by two buffers`},
		{"duplicate template", func(b *Bundle) { b.Templates = append(b.Templates, b.Templates[0]) }, `template 1: the name "decode_4" is used by two templates`},
		{"unknown dtype", func(b *Bundle) { b.Manifest.Buffers[1].Dtype = "f16" }, `buffer 1 ("x"): unknown dtype "f16"`},
		{"unknown kind", func(b *Bundle) { b.Manifest.Buffers[1].Kind = "scratch" }, `unknown kind "scratch"`},
		{"zero dim", func(b *Bundle) { b.Manifest.Buffers[1].Shape = []int{4, 0} }, "shape [4 0] has a dimension that is not positive"},
		{"empty shape", func(b *Bundle) { b.Manifest.Buffers[1].Shape = nil }, "empty shape"},
		{"huge shape", func(b *Bundle) { b.Manifest.Buffers[1].Shape = []int{1 << 30, 1 << 30, 1 << 30} }, "exceeds 1099511627776 bytes"},
		{"unknown param type", func(b *Bundle) { b.Kernels[0].Params[3].Type = "int" }, `param 3 ("n"): unknown PTX type "int"`},
		{"no PTX", func(b *Bundle) { b.Kernels[0].PTX = "" }, "no PTX text"},
		{"early launch without a wait", func(b *Bundle) { b.Kernels[0].EarlyLaunch = true }, "early_launch is set but the PTX never waits for the grid ahead (griddepcontrol.wait)"},
		{"template kind", func(b *Bundle) { b.Templates[0].Kind = "train" }, `kind "train" is neither decode nor prefill`},
		{"samples", func(b *Bundle) { b.Templates[0].Samples = 5 }, "tokens 4, samples 5"},
		{"zero grid", func(b *Bundle) { b.Templates[0].Nodes[0].Grid[2] = 0 }, "every dimension must be at least 1"},
		{"big block", func(b *Bundle) { b.Templates[0].Nodes[0].Block = [3]int{64, 32, 1} }, "more than 1024 threads"},
		{"negative shared", func(b *Bundle) { b.Templates[0].Nodes[0].Shared = -1 }, "-1 bytes of dynamic shared memory"},
		{"too much shared", func(b *Bundle) { b.Templates[0].Nodes[0].Shared = MaxDynamicShared + 1 }, "want 0 to 232448"},
		{"export buffer", func(b *Bundle) { b.Manifest.Apps[0].Exports[0].Buffer = "nope" }, `export "probe" reads buffer "nope"`},
		{"app bit", func(b *Bundle) {
			b.Manifest.Apps = append(b.Manifest.Apps, App{Name: "other", Bit: 0})
		}, `app 1 ("other"): mask bit 0 is also app "steer"'s`},
		{"param without tensors", func(b *Bundle) { b.Manifest.Buffers[4].Tensors = nil }, "a param buffer must name the tensors"},
		{"param tensor missing", func(b *Bundle) { b.Manifest.Buffers[4].Tensors = []string{"steer.other"} },
			`buffer 4 ("steer_vec"): tensor "steer.other" is not in the params section`},
		{"param tensor size", func(b *Bundle) { b.Manifest.Buffers[4].Shape = []int{9} },
			"shape [9] holds 9 elements but tensors [steer.vec] hold 8"},
		{"params not safetensors", func(b *Bundle) { b.Params = []byte("junk") }, "section params: safetensors file is truncated"},
		{"params missing", func(b *Bundle) { b.Params = nil }, "is loaded from the params section, which is empty"},
		{"skip without any_mask", func(b *Bundle) { b.Templates[0].Nodes[1].SkipUnless = 1 },
			`node 1 ("steer"): skip_unless 0x1 without a ctl.any_mask buffer to decide it`},
		{"solo without any_mask", func(b *Bundle) { b.Templates[0].Solo = []AppNodes{{Bit: 0, Nodes: b.Templates[0].Nodes}} },
			"solo nodes without a ctl.any_mask buffer to choose them"},
		{"solo of no app", func(b *Bundle) {
			withAnyMask(b)
			b.Templates[0].Solo = []AppNodes{{Bit: 3, Nodes: b.Templates[0].Nodes}}
		}, "solo 0: bit 3 is no deployed app's"},
		{"solo twice", func(b *Bundle) {
			withAnyMask(b)
			b.Templates[0].Solo = []AppNodes{{Bit: 0, Nodes: b.Templates[0].Nodes}, {Bit: 0, Nodes: b.Templates[0].Nodes}}
		}, "solo 1: a second list for bit 0"},
		{"solo node", func(b *Bundle) {
			withAnyMask(b)
			nodes := slices.Clone(b.Templates[0].Nodes)
			nodes[1].Kernel = "gone"
			b.Templates[0].Solo = []AppNodes{{Bit: 0, Nodes: nodes}}
		}, `solo of bit 0: node 1 ("steer"): kernel "gone" does not exist in the bundle`},
		{"attention split buffer", func(b *Bundle) {
			b.Templates[0].AttnSplit = &AttnSplit{Buffer: "x", MaxSplits: 4, MinChunk: 64, Step: 32, RowBlocks: 8, WaveBlocks: 528}
		}, `attention split: buffer "x" is not a u32 control buffer`},
		{"attention split size", func(b *Bundle) {
			b.Templates[0].AttnSplit = &AttnSplit{Buffer: "tokens", MaxSplits: 0, MinChunk: 64, Step: 32, RowBlocks: 8, WaveBlocks: 528}
		}, "max_splits 0, step 32, min_chunk 64, row_blocks 8, wave_blocks 528: want each at least 1"},
		{"attention split step", func(b *Bundle) {
			b.Templates[0].AttnSplit = &AttnSplit{Buffer: "tokens", MaxSplits: 4, MinChunk: 48, Step: 32, RowBlocks: 8, WaveBlocks: 528}
		}, "min_chunk a multiple of step"},
		{"attention split waves (an old bundle)", func(b *Bundle) {
			b.Templates[0].AttnSplit = &AttnSplit{Buffer: "tokens", MaxSplits: 4, MinChunk: 64}
		}, "rebuild it"},
		{"build tc_chunks", func(b *Bundle) { b.Manifest.Build.TCChunks = []int{5} }, "build tc_chunks [5]: want none or two positive counts"},
		{"build tc_chunks zero", func(b *Bundle) { b.Manifest.Build.TCChunks = []int{4, 0} }, "build tc_chunks [4 0]"},
		{"build attn_warps", func(b *Bundle) { b.Manifest.Build.AttnWarps = -2 }, "build attn_warps -2, attn_unroll 0, gemv_split 0, attn_prefetch 0 (0 at one row), gemv_warps 0: want counts of at least 0"},
		{"build gemv_split", func(b *Bundle) { b.Manifest.Build.GemvSplit = -4 }, "gemv_split -4, attn_prefetch 0 (0 at one row), gemv_warps 0: want counts of at least 0"},
		{"build attn_prefetch", func(b *Bundle) { b.Manifest.Build.AttnPrefetch = -1 }, "attn_prefetch -1 (0 at one row), gemv_warps 0: want counts of at least 0"},
		{"build attn_prefetch_one_row", func(b *Bundle) { b.Manifest.Build.AttnPrefetchOneRow = -1 }, "attn_prefetch 0 (-1 at one row), gemv_warps 0: want counts of at least 0"},
		{"build gemv_warps", func(b *Bundle) { b.Manifest.Build.GemvWarps = -2 }, "gemv_warps -2: want counts of at least 0"},
		{"build attn_early_kv without pdl", func(b *Bundle) { b.Manifest.Build.AttnEarlyKV, b.Manifest.Build.PDL = true, false }, "build attn_early_kv without pdl"},
		{"build tensor_core_rows", func(b *Bundle) { b.Manifest.Build.TensorCoreRows = -8 }, "build tensor_core_rows -8: want a bucket size, or 0 for the default"},
		{"build copy_gemms", func(b *Bundle) { b.Manifest.Build.CopyGemms = []string{"4096"} }, `build copy_gemms: GEMM shape "4096": want KxN`},
		{"build copy_gemm_slots", func(b *Bundle) { b.Manifest.Build.CopyGemmSlots = -1 }, "build copy_gemm_slots -1: want a count"},
		{"build copy_gemm_rows", func(b *Bundle) { b.Manifest.Build.CopyGemmRows = []int{8, 0} }, "build copy_gemm_rows [8 0]: want row counts of at least 1"},
		{"build gated_tc_rows", func(b *Bundle) { b.Manifest.Build.GatedTCRows = -8 }, "build gated_tc_rows -8: want a row count, or 0 for none"},
		{"build gated_copy_rows", func(b *Bundle) { b.Manifest.Build.GatedCopyRows = -32 }, "build gated_copy_rows -32: want a row count, or 0 for none"},
		{"build rope_copy_rows", func(b *Bundle) { b.Manifest.Build.RopeCopyRows = -1 }, "build rope_copy_rows -1: want a row count, or 0 for none"},
		{"build mi_preload_regs", func(b *Bundle) { b.Manifest.Build.MIPreloadRegs = -48 }, "build mi_preload_regs -48: want registers a thread, or 0 for no bound"},
		{"build mi_preload_regs_multi_wave", func(b *Bundle) { b.Manifest.Build.MIPreloadRegsMultiWave = -32 }, "build mi_preload_regs_multi_wave -32: want registers a thread, or 0 for mi_preload_regs's bound"},
		{"embedded weight missing", func(b *Bundle) {
			b.Weights = safetensorsFile(safetensors.Tensor{Name: "other", Dtype: "F32", Shape: []int{1}, Data: make([]byte, 4)})
		}, `tensor "model.embed_tokens.weight" is not in the weights section`},
	}
	for _, c := range cases {
		b := testBundle()
		c.mutate(b)
		err := Verify(b)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want it to contain %q", c.name, err, c.want)
		}
	}
}

// withAnyMask gives b the ctl.any_mask buffer that chooses a template's node lists.
func withAnyMask(b *Bundle) {
	b.Manifest.Buffers = append(b.Manifest.Buffers, Buffer{Name: CtlAnyMask, Kind: KindControl, Dtype: "u32", Shape: []int{1}})
}

func TestAttnSplitChunk(t *testing.T) {
	// Llama-3.1-8B's split decode buckets on an H200: 8 head groups a row, 528 blocks a wave.
	split := func(maxSplits int) *AttnSplit {
		return &AttnSplit{MaxSplits: maxSplits, MinChunk: 64, Step: 32, RowBlocks: 8, WaveBlocks: 528}
	}
	for _, c := range []struct {
		rows, maxSplits, maxN, want int
	}{
		{1, 66, 0, 64}, {1, 66, 1, 64}, {1, 66, 64, 64}, // never below MinChunk
		{1, 66, 65, 96},     // one split of three passes: two would cost a merge for one position
		{1, 66, 192, 192},   // one split: three of 64 and their merge cost as much, a tie
		{1, 66, 224, 64},    // four splits of 64 and their merge, against one of 224
		{1, 66, 2112, 64},   // 33 of the 66 splits: every one gets MinChunk
		{1, 66, 8192, 128},  // 64 splits of 128
		{32, 3, 2112, 1056}, // 2 splits, one wave of 512 blocks, not 3 in two waves
		{32, 3, 100, 128},   // one split: two in one wave would add a merge for 36 positions
		{8, 9, 2112, 288},   // 8 splits (512 blocks), not 9 (576: two waves)
		{4, 17, 2112, 160},  // 14 splits (448 blocks), not 17 (544)
		{20, 3, 2112, 704},  // 20 rows: 3 splits are 480 blocks, one wave
	} {
		a := split(c.maxSplits)
		got := a.Chunk(c.maxN, c.rows)
		if got != c.want {
			t.Errorf("%d rows, %d splits at most, longest context %d: chunk %d, want %d", c.rows, c.maxSplits, c.maxN, got, c.want)
		}
		if got%a.Step != 0 || got < a.MinChunk || (max(c.maxN, 1)+got-1)/got > c.maxSplits {
			t.Errorf("%d rows, longest context %d: chunk %d is not a multiple of the step, or too short, or needs more splits than the grid has", c.rows, c.maxN, got)
		}
	}
	// The choices measured on the H200 in buckets of up to 32 rows (8-warp blocks, 264 a
	// wave, 8 head groups a row; Llama-3.1-8B's 64 positions a pass, Llama-3.2-1B's 128): at
	// context 80 one split, at 576 and 2112 the counts that were the fastest.
	for _, c := range []struct{ step, rows, maxN, want int }{
		{64, 1, 80, 128}, {64, 8, 80, 128}, {64, 1, 576, 64}, {64, 8, 576, 192}, {64, 1, 2112, 64}, {64, 8, 2112, 576},
		{128, 1, 576, 128}, {128, 8, 576, 256}, {128, 1, 2112, 128}, {128, 8, 2112, 640},
	} {
		wide := &AttnSplit{MaxSplits: 66, MinChunk: c.step, Step: c.step, RowBlocks: 8, WaveBlocks: 264}
		if got := wide.Chunk(c.maxN, c.rows); got != c.want {
			t.Errorf("%d positions a pass, %d rows at context %d: chunk %d, want %d", c.step, c.rows, c.maxN, got, c.want)
		}
	}
}

func TestDtypeSize(t *testing.T) {
	for dtype, want := range map[string]int{"f32": 4, "bf16": 2, "u32": 4} {
		if got, ok := DtypeSize(dtype); !ok || got != want {
			t.Errorf("DtypeSize(%q) = %d, %v", dtype, got, ok)
		}
	}
	if _, ok := DtypeSize("f64"); ok {
		t.Error("f64 is not a buffer dtype")
	}
}

// TestListFor: a step that enables no app runs Plain, one that enables a single app with a
// Solo list runs that list, any other runs Nodes; the indices are NodeLists'.
func TestListFor(t *testing.T) {
	n := []Node{{Label: "n"}}
	withBoth := Template{Nodes: n, Plain: []Node{{Label: "p"}}, Solo: []AppNodes{{Bit: 0, Nodes: n}, {Bit: 3, Nodes: n}}}
	soloOnly := Template{Nodes: n, Solo: []AppNodes{{Bit: 2, Nodes: n}}}
	for _, c := range []struct {
		t    Template
		mask uint32
		want int
	}{
		{withBoth, 0, 1}, {withBoth, 1, 2}, {withBoth, 1 << 3, 3}, {withBoth, 1<<3 | 1, 0}, {withBoth, 1 << 1, 0},
		{soloOnly, 0, 0}, {soloOnly, 1 << 2, 1}, {soloOnly, 1<<2 | 1<<5, 0},
		{Template{Nodes: n}, 0, 0}, {Template{Nodes: n}, 1, 0},
	} {
		if got := c.t.ListFor(c.mask); got != c.want || got >= len(c.t.NodeLists()) {
			t.Errorf("plain %v, %d solo lists, mask %#x: list %d of %d, want %d", c.t.Plain != nil, len(c.t.Solo), c.mask, got, len(c.t.NodeLists()), c.want)
		}
	}
}
