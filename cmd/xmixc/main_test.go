package main

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"xmix/bundle"
	"xmix/codegen"
)

const model = `model: m
family: llama
dims: {hidden: 64, intermediate: 96, layers: 2, heads: 2, kv_heads: 1, head_dim: 32, vocab: 260}
weights: {synthetic: {seed: 1, std: 0.02}}
tokenizer: bytes
bos: 256
eos: [257]
serving: {decode_buckets: [1, 2], prefill_chunks: [8], max_seq_len: 64}
`

// xmixc runs the CLI in-process and returns its stdout and error.
func xmixc(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := rootCmd()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(args)
	err := cmd.Execute()
	return out.String(), err
}

func write(t *testing.T, dir, name, text string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestBuildRejectsBadSpecs(t *testing.T) {
	dir := t.TempDir()
	m := write(t, dir, "m.yaml", model)
	cases := []struct{ name, app, want string }{
		{"malformed yaml", "app: a\nops: [\n", "a.yaml:"},
		{"unknown key", "app: a\nops:\n  - write: {at: {layers: [0], hook: resid_post}, kernal: steer_add}\n", `did you mean "kernel"`},
		{"unknown hook", "app: a\nops:\n  - write: {at: {layers: [0], hook: resid_psot}, kernel: steer_add}\n", "resid_post"},
		{"layer out of range", "app: a\nops:\n  - write: {at: {layers: [7], hook: resid_post}, kernel: steer_add}\n", "layers 0-1"},
		{"wrong vector length", "app: a\nparams: {v: {values: [1, 2]}}\nops:\n  - write: {at: {layers: [0], hook: resid_post}, kernel: steer_add, args: {vector: v}}\n", "param v has 2 elements, hook resid_post needs 64"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			a := write(t, dir, "a.yaml", c.app)
			_, err := xmixc(t, "build", m, a, "-q", "-o", filepath.Join(dir, "out.xmb"))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want %q", err, c.want)
			}
			if _, statErr := os.Stat(filepath.Join(dir, "out.xmb")); statErr == nil {
				t.Fatal("a failed build left a bundle behind")
			}
		})
	}
}

// TestBuildRejectsHeadDims: a head_dim the attention kernels cannot split over a warp's
// lanes fails the build at the spec's head_dim, or at heads where head_dim is hidden/heads;
// the frontend and the passes take any.
func TestBuildRejectsHeadDims(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct{ name, dims, want string }{
		{"given", "kv_heads: 1, head_dim: 48,", "m.yaml:3:83: head_dim 48 is not a multiple of 32 (the attention kernels split a head evenly over a warp's 32 lanes)"},
		{"hidden/heads", "kv_heads: 1,", "m.yaml:3:57: head_dim 80 is not a multiple of 32"},
	} {
		t.Run(c.name, func(t *testing.T) {
			spec := strings.Replace(strings.Replace(model, "kv_heads: 1, head_dim: 32,", c.dims, 1), "hidden: 64", "hidden: 160", 1)
			m := write(t, dir, "m.yaml", spec)
			if _, err := xmixc(t, "build", m, "-q", "-o", filepath.Join(dir, "out.xmb")); err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want %q", err, c.want)
			}
		})
	}
}

func TestInspectRejectsDamagedBundles(t *testing.T) {
	dir := t.TempDir()
	m := write(t, dir, "m.yaml", model)
	good := filepath.Join(dir, "good.xmb")
	if _, err := xmixc(t, "build", m, "-q", "-o", good); err != nil {
		t.Fatal(err)
	}
	out, err := xmixc(t, "inspect", good)
	if err != nil || !strings.Contains(out, "templates 3") {
		t.Fatalf("inspect: %v\n%s", err, out)
	}
	data, _ := os.ReadFile(good)
	flipped := append([]byte(nil), data...)
	flipped[len(flipped)/2] ^= 0x40
	version := append([]byte(nil), data...)
	binary.LittleEndian.PutUint32(version[8:], 99)
	cases := []struct {
		name string
		data []byte
		want string
	}{
		{"truncated", data[:len(data)*2/3], "truncated"},
		{"flipped byte", flipped, "checksum"},
		{"wrong version", version, "version 99"},
		{"not a bundle", []byte("hello"), "not an xmix bundle"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := write(t, dir, "bad.xmb", string(c.data))
			_, err := xmixc(t, "inspect", p)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want %q", err, c.want)
			}
		})
	}
}

func TestBuildIsDeterministic(t *testing.T) {
	dir := t.TempDir()
	m := write(t, dir, "m.yaml", model)
	a := write(t, dir, "a.yaml", "app: a\nparams: {v: {values: [1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3, 4, 5, 6, 7, 8]}}\nops:\n  - write: {at: {layers: [1], hook: resid_post}, kernel: steer_add, args: {vector: v}}\n")
	var outs [][]byte
	for i := range 2 {
		p := filepath.Join(dir, "b"+string(rune('0'+i))+".xmb")
		if _, err := xmixc(t, "build", m, a, "-q", "-o", p); err != nil {
			t.Fatal(err)
		}
		data, _ := os.ReadFile(p)
		outs = append(outs, data)
	}
	if !bytes.Equal(outs[0], outs[1]) {
		t.Fatal("two builds of the same inputs differ")
	}
	out, err := xmixc(t, "check", m, a)
	if err != nil || !strings.Contains(out, "fused into the residual-add + RMSNorm kernel") ||
		!strings.Contains(out, "resid_post   #1  steer_add   a.op0") || !strings.Contains(out, "apps in build-line order, then each app's ops in spec order") {
		t.Fatalf("check: %v\n%s", err, out)
	}
}

// TestBuildGemvFlags: --prefetch N goes into the build info (and only GEMVs change, as
// testsuite's TestPrefetchBundle checks); 0 builds none; --tc-chunks, --attn-warps,
// --attn-unroll, --attn-prefetch, --attn-prefetch-one-row, --attn-tc=false, --gemv-split, --gemv-warps and --tensor-core-rows go into it too, and inspect says what they are, but only
// where they differ from the defaults; a negative size, GEMV columns per warp or chunks
// outside 1-8, a chunk list that is not two counts, warps or loads a step out of range and a
// split or block of warps that is not a power of two up to 8 are refused.
func TestBuildGemvFlags(t *testing.T) {
	dir := t.TempDir()
	m := write(t, dir, "m.yaml", model)
	for _, c := range []struct {
		flag string
		want int
	}{{"4096", 4096}, {"0", 0}} {
		out := filepath.Join(dir, "p"+c.flag+".xmb")
		if _, err := xmixc(t, "build", m, "-q", "--prefetch", c.flag, "-o", out); err != nil {
			t.Fatal(err)
		}
		b, err := bundle.ReadFile(out)
		if err != nil {
			t.Fatal(err)
		}
		if b.Manifest.Build.Prefetch != c.want {
			t.Fatalf("--prefetch %s: build info prefetch %d", c.flag, b.Manifest.Build.Prefetch)
		}
		text, err := xmixc(t, "inspect", out)
		if want := fmt.Sprintf("GEMVs and tensor-core GEMMs prefetch %d bytes of each weight row; GEMVs in blocks of 2 warps, at 2-7 rows 2 columns per warp and the K loop unrolled 4x", c.want); err != nil || !strings.Contains(text, want) {
			t.Fatalf("inspect: %v; output lacks %q:\n%s", err, want, text)
		}
	}
	for _, c := range []struct {
		flags  []string
		chunks []int
		attn   string // a decode attention kernel's name has it; "" for the default kernels
		text   string // inspect's line; "" where there should be none
		split  int    // the build info's GEMV split, and the split of the GEMVs of the model's o projection (a block holds its warps)
	}{
		{nil, nil, "", "", 0},
		{[]string{"--tc-chunks", "4,3"}, nil, "", "", 0},
		{[]string{"--tc-chunks", "6,4"}, []int{6, 4}, "", "tensor-core GEMMs: 6 / 4 K chunks in flight at up to 8 / 9-32 rows", 0},
		{[]string{"--tc-chunks", "2,2"}, []int{2, 2}, "", "tensor-core GEMMs: 2 / 2 K chunks in flight", 0},
		{[]string{"--attn-warps", "16"}, nil, "_warps16", "decode attention: 16 warps a block, default loads a step", 0},
		{[]string{"--attn-unroll", "8"}, nil, "_u8", "decode attention: default warps a block, 8 loads a step", 0},
		// Head dim 32 keeps the CUDA-core step anyway (codegen's TestAttentionTCFallback): no
		// _tc kernel either way, only the build info says.
		{[]string{"--attn-tc=false"}, nil, "", "decode attention on CUDA cores", 0},
		{[]string{"--gemv-split", "1"}, nil, "", "", 0},
		{[]string{"--gemv-split", "4"}, nil, "", "GEMVs of few columns split each column over up to 4 warps", 4},
		{[]string{"--attn-prefetch", "2"}, nil, "", "decode attention: 2 passes of K and V asked of L2 before the wait", 0},
		{[]string{"--attn-prefetch-one-row", "0"}, nil, "", "decode attention at one row: 0 passes of K and V asked of L2 before the wait", 0},
		{[]string{"--gemv-warps", "4"}, nil, "", "GEMVs in blocks of 4 warps", 0},
		{[]string{"--gemv-split", "8"}, nil, "", "GEMVs in blocks of 8 warps", 8},
		{[]string{"--tensor-core-rows", "4"}, nil, "", "at 2-3 rows 2 columns per warp and the K loop unrolled 4x, tensor cores from 4 rows", 0},
		{[]string{"--tensor-core-rows", "2"}, nil, "", "GEMVs in blocks of 2 warps, tensor cores from 2 rows", 0},
	} {
		out := filepath.Join(dir, "tc.xmb")
		if _, err := xmixc(t, append([]string{"build", m, "-q", "-o", out}, c.flags...)...); err != nil {
			t.Fatal(err)
		}
		b, err := bundle.ReadFile(out)
		if err != nil {
			t.Fatal(err)
		}
		if bi := b.Manifest.Build; !slices.Equal(bi.TCChunks, c.chunks) {
			t.Fatalf("%v: build info chunks %v", c.flags, bi.TCChunks)
		}
		attnNamed := func(part string) bool {
			return slices.ContainsFunc(b.Kernels, func(k bundle.Kernel) bool {
				return strings.HasPrefix(k.Name, "attention") && strings.Contains(k.Name, part)
			})
		}
		if other := attnNamed("_warps16") || attnNamed("_u8") || attnNamed("_tc"); other != (c.attn != "") || c.attn != "" && !attnNamed(c.attn) {
			t.Fatalf("%v: decode attention kernels of other warps or loads %v, want %q", c.flags, other, c.attn)
		}
		tcAt2 := slices.ContainsFunc(b.Templates, func(tp bundle.Template) bool {
			return tp.Name == "decode_b2" && slices.ContainsFunc(tp.Nodes, func(n bundle.Node) bool { return strings.HasPrefix(n.Kernel, "gemm_tc") })
		})
		if want := slices.Contains(c.flags, "--tensor-core-rows") && c.flags[1] == "2"; tcAt2 != want || (b.Manifest.Build.TensorCoreRows != 0) != slices.Contains(c.flags, "--tensor-core-rows") {
			t.Fatalf("%v: tensor-core GEMMs at 2 rows %v, want %v (build info %d)", c.flags, tcAt2, want, b.Manifest.Build.TensorCoreRows)
		}
		splitOver := func(n int) bool {
			return slices.ContainsFunc(b.Kernels, func(k bundle.Kernel) bool { return strings.Contains(k.Name, fmt.Sprintf("_s%d", n)) })
		}
		if b.Manifest.Build.GemvSplit != c.split || splitOver(4) != (c.split == 4) || splitOver(8) != (c.split == 8) {
			t.Fatalf("%v: build info split %d, GEMVs split over 4 warps %v, over 8 %v", c.flags, b.Manifest.Build.GemvSplit, splitOver(4), splitOver(8))
		}
		blockGemvs := slices.ContainsFunc(b.Kernels, func(k bundle.Kernel) bool {
			return strings.HasPrefix(k.Name, "gemm_") && strings.Contains(k.Name, "_w4")
		})
		if want := slices.Contains(c.flags, "--gemv-warps") || c.split == 4; blockGemvs != want || (b.Manifest.Build.GemvWarps == 4) != want {
			t.Fatalf("%v: GEMVs in blocks of 4 warps %v (build info %d), want %v", c.flags, blockGemvs, b.Manifest.Build.GemvWarps, want)
		}
		// Every decode attention prefetches 2 passes with --attn-prefetch 2; by default only the
		// one-row bucket's, 1 pass; with --attn-prefetch-one-row 0 none.
		prefetching := func(suffix string) bool {
			return slices.ContainsFunc(b.Kernels, func(k bundle.Kernel) bool {
				return strings.HasPrefix(k.Name, "attention") && strings.Contains(k.PTX, "prefetch.global.L2") && strings.Contains(k.Name, suffix)
			})
		}
		all := slices.Contains(c.flags, "--attn-prefetch")
		oneRow := !all && !slices.Contains(c.flags, "--attn-prefetch-one-row")
		if bi := b.Manifest.Build; prefetching("_pf2") != all || prefetching("_pf1") != oneRow || prefetching("") != (all || oneRow) ||
			(bi.AttnPrefetch == 2) != all || (bi.AttnPrefetchOneRow == 1) != (c.flags == nil || c.flags[0] != "--attn-prefetch-one-row") {
			t.Fatalf("%v: decode attention prefetching 2 passes %v, 1 pass %v (build info %d, one row %d)", c.flags, prefetching("_pf2"), prefetching("_pf1"), bi.AttnPrefetch, bi.AttnPrefetchOneRow)
		}
		if b.Manifest.Build.AttnTC == slices.Contains(c.flags, "--attn-tc=false") {
			t.Fatalf("%v: build info attn_tc %v", c.flags, b.Manifest.Build.AttnTC)
		}
		text, err := xmixc(t, "inspect", out)
		if err != nil || c.text != "" && !strings.Contains(text, c.text) || c.text == "" && (strings.Contains(text, "tensor-core GEMMs:") || strings.Contains(text, "decode attention") || strings.Contains(text, "split each column")) {
			t.Fatalf("%v: inspect: %v; want %q in:\n%s", c.flags, err, c.text, text)
		}
	}
	for _, c := range []struct{ flag, value, want string }{
		{"--prefetch", "-1", "--prefetch -1: want a byte count"},
		{"--vector-slots", "-1", "--vector-slots -1: want a count of requests, or 0 for the spec's serving.vector_slots"},
		{"--gemv-cols", "0", "--gemv-cols 0: want 1 to 8"},
		{"--attn-warps", "17", "--attn-warps: 17 warps a block: want 1 to 16, or 0 for the default"},
		{"--attn-unroll", "-1", "--attn-unroll: -1 loads a step: want 1 to 8, or 0 for the default"},
		{"--attn-prefetch", "-1", "--attn-prefetch: K/V prefetch of -1 passes: want 0 (none) to 8"},
		{"--attn-prefetch", "9", "--attn-prefetch: K/V prefetch of 9 passes: want 0 (none) to 8"},
		{"--attn-prefetch-one-row", "9", "--attn-prefetch-one-row: K/V prefetch of 9 passes: want 0 (none) to 8"},
		{"--gemv-cols", "9", "--gemv-cols 9: want 1 to 8"},
		{"--gemv-split", "3", "--gemv-split: GEMV split 3: want 1, 2, 4 or 8 warps a column"},
		{"--gemv-split", "16", "--gemv-split: GEMV split 16"},
		{"--gemv-warps", "3", "--gemv-warps: GEMV block of 3 warps: want 1, 2, 4 or 8"},
		{"--gemv-warps", "16", "--gemv-warps: GEMV block of 16 warps: want 1, 2, 4 or 8"},
		{"--tensor-core-rows", "1", "--tensor-core-rows: tensor cores from 1 rows: want 2 to 8"},
		{"--tensor-core-rows", "16", "--tensor-core-rows: tensor cores from 16 rows: want 2 to 8"},
		{"--gemv-unroll", "0", "--gemv-unroll 0: want 1 to 8"},
		{"--gemv-unroll", "9", "--gemv-unroll 9: want 1 to 8"},
		{"--tc-chunks", "4", "--tc-chunks [4]: want two counts of 1 to 8"},
		{"--tc-chunks", "0,3", "--tc-chunks [0,3]: want two counts of 1 to 8"},
		{"--tc-chunks", "4,9", "--tc-chunks [4,9]: want two counts of 1 to 8"},
		{"--tc-chunks", "4,3,2", "--tc-chunks [4,3,2]: want two counts"},
		{"--tc-chunks", "four", `invalid argument "four" for "--tc-chunks"`},
	} {
		_, err := xmixc(t, "build", m, "-q", c.flag, c.value, "-o", filepath.Join(dir, "bad.xmb"))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Fatalf("%s %s: %v", c.flag, c.value, err)
		}
		if _, statErr := os.Stat(filepath.Join(dir, "bad.xmb")); statErr == nil {
			t.Fatalf("%s %s: a refused build left a bundle behind", c.flag, c.value)
		}
	}
	for _, c := range []struct {
		flags []string
		want  string
	}{
		{[]string{"--gemm", "cuda-core", "--tc-chunks", "4,3"}, "which --gemm cuda-core does not build"},
	} {
		_, err := xmixc(t, append([]string{"build", m, "-q", "-o", filepath.Join(dir, "bad.xmb")}, c.flags...)...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Fatalf("%v: %v", c.flags, err)
		}
	}
}

func TestVersion(t *testing.T) {
	out, err := xmixc(t, "--version")
	if err != nil || !strings.HasPrefix(out, "xmixc version 0.1") || !strings.Contains(out, "go1.") {
		t.Fatalf("%v: %q", err, out)
	}
}

// TestBuildIntoADirectoryLeavesNothing: -o naming a directory is refused before the build,
// with the fix, and leaves no .tmp file behind (it used to write OUT.tmp, then fail to rename
// it over the directory).
func TestBuildIntoADirectoryLeavesNothing(t *testing.T) {
	dir := t.TempDir()
	m := write(t, dir, "m.yaml", model)
	out := filepath.Join(dir, "out")
	if err := os.Mkdir(out, 0o755); err != nil {
		t.Fatal(err)
	}
	_, err := xmixc(t, "build", m, "-q", "-o", out)
	if err == nil || !strings.Contains(err.Error(), "-o "+out+" is a directory: give the bundle's file name, e.g. -o "+filepath.Join(out, "model.xmb")) {
		t.Fatalf("build -o DIR: %v", err)
	}
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".tmp") {
			t.Fatalf("left behind: %s", e.Name())
		}
	}
}

// check --dump-ir prints the forward as the passes leave it, --dump-after PASS as one pass
// left it; a pass that does not exist is refused with the list.
func TestCheckDumpsTheIR(t *testing.T) {
	dir := t.TempDir()
	m := write(t, dir, "m.yaml", model)
	a := write(t, dir, "a.yaml", "app: a\nops:\n  - write: {at: {layers: [1], hook: resid_post}, kernel: scale, args: {alpha: 2}}\n")
	out, err := xmixc(t, "check", m, a, "--dump-ir")
	if err != nil || !strings.Contains(out, "L1.mlp_residual: %L1.resid_post:") || !strings.Contains(out, "mi[resid] a.op0 scale bit=0 at=L1.resid_post") ||
		!strings.Contains(out, "@act.resid") {
		t.Fatalf("--dump-ir: %v\n%s", err, out)
	}
	out, err = xmixc(t, "check", m, a, "--dump-after", "attach-mi")
	if err != nil || !strings.HasPrefix(out, "after attach-mi:\n") || !strings.Contains(out, "mi@L1.resid_post a.op0 scale") || strings.Contains(out, "@act.") {
		t.Fatalf("--dump-after attach-mi: %v\n%s", err, out)
	}
	if out, err = xmixc(t, "check", m, "--dump-after", "fusion"); err == nil || !strings.Contains(out, "--dump-after fusion: no such pass (passes: build-graph, resolve-hooks,") {
		t.Fatalf("unknown pass: %v\n%s", err, out)
	}
}

// buildBundle runs xmixc build on model with flags into out and reads the bundle back.
func buildBundle(t *testing.T, model, out string, flags []string) *bundle.Bundle {
	t.Helper()
	if _, err := xmixc(t, append([]string{"build", model, "-q", "-o", out}, flags...)...); err != nil {
		t.Fatalf("%v: %v", flags, err)
	}
	b, err := bundle.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestBuildAttnSplitFlags: --attn-cluster gives the decode buckets whose attention splits
// fit in one wave (8 kv heads: 4 and 8 rows, clusters of 8 and 4) cluster kernels, records it
// in the build info and says so in inspect; the buckets of 1 and 32 rows keep the workspace
// merge, and without the flag every bucket does. By default every split kernel has its early
// first loads (named _ekv; --attn-early-kv, left out with --pdl=false), in the build info,
// and inspect says where --attn-early-kv=false left them out.
func TestBuildAttnSplitFlags(t *testing.T) {
	dir := t.TempDir()
	m := write(t, dir, "m.yaml", `model: m
family: llama
dims: {hidden: 512, intermediate: 1024, layers: 2, heads: 8, kv_heads: 8, head_dim: 64, vocab: 260}
weights: {synthetic: {seed: 1, std: 0.02}}
tokenizer: bytes
bos: 256
eos: [257]
kv_dtype: bf16
serving: {decode_buckets: [1, 4, 8, 32], prefill_chunks: [8], max_seq_len: 1024}
`)
	for _, c := range []struct {
		flags []string
		want  []string // the split attention kernels
		early bool     // the build info's attn_early_kv
	}{
		{nil, []string{"attention_h8_kv8_d64_bf16_warps8_tc_pf1_split_ekv", "attention_h8_kv8_d64_bf16_warps8_tc_split_ekv"}, true},
		{[]string{"--attn-early-kv=false"}, []string{"attention_h8_kv8_d64_bf16_warps8_tc_pf1_split", "attention_h8_kv8_d64_bf16_warps8_tc_split"}, false},
		{[]string{"--attn-cluster", "--attn-early-kv=false"}, []string{"attention_h8_kv8_d64_bf16_warps8_tc_cl4_split", "attention_h8_kv8_d64_bf16_warps8_tc_cl8_split",
			"attention_h8_kv8_d64_bf16_warps8_tc_pf1_split", "attention_h8_kv8_d64_bf16_warps8_tc_split"}, false},
		// Without early launch there is nothing to overlap: the default leaves the loads out.
		{[]string{"--pdl=false"}, []string{"attention_h8_kv8_d64_bf16_warps8_tc_split"}, false},
	} {
		out := filepath.Join(dir, "a.xmb")
		b := buildBundle(t, m, out, c.flags)
		var split []string
		for _, k := range b.Kernels {
			if strings.Contains(k.Name, "_split") {
				split = append(split, k.Name)
			}
		}
		slices.Sort(split)
		cluster, early := slices.Contains(c.flags, "--attn-cluster"), c.early
		if bi := b.Manifest.Build; !slices.Equal(split, c.want) || bi.AttnCluster != cluster || bi.AttnEarlyKV != early {
			t.Fatalf("%v: split attention kernels %v (want %v), build info attn_cluster %v, attn_early_kv %v", c.flags, split, c.want, bi.AttnCluster, bi.AttnEarlyKV)
		}
		text, err := xmixc(t, "inspect", out)
		if err != nil || strings.Contains(text, "thread-block clusters") != cluster || strings.Contains(text, "K/V only after the wait") != slices.Contains(c.flags, "--attn-early-kv=false") {
			t.Fatalf("%v: inspect: %v\n%s", c.flags, err, text)
		}
	}
}

// gemmSpec writes a 2-layer Llama of hidden x heads (head dim 128, one kv head, intermediate
// 1024) with decode buckets of 1, 8 and 16 rows into dir as name and returns its path.
func gemmSpec(t *testing.T, dir, name string, hidden, heads int) string {
	return gemmSpecBuckets(t, dir, name, hidden, heads, "1, 8, 16")
}

// gemmSpecBuckets is gemmSpec with the decode buckets buckets ("1, 8, 16, 32").
func gemmSpecBuckets(t *testing.T, dir, name string, hidden, heads int, buckets string) string {
	return write(t, dir, name, fmt.Sprintf(`model: m
family: llama
dims: {hidden: %d, intermediate: 1024, layers: 2, heads: %d, kv_heads: 1, head_dim: 128, vocab: 260}
weights: {synthetic: {seed: 1, std: 0.02}}
tokenizer: bytes
bos: 256
eos: [257]
serving: {decode_buckets: [%s], prefill_chunks: [8], max_seq_len: 64}
`, hidden, heads, buckets))
}

// TestBuildCopyGemmFlags: --copy-gemms gives copy-engine kernels to the GEMM shapes it names
// (in the decode buckets of 8 and 16 rows), none to others, and none at all with "none";
// --copy-gemm-slots shortens their rings; both go into the build info and inspect's output.
// A malformed shape, "none" beside a shape, slots out of range and a named shape the kernel
// cannot take are refused, and no bundle is written.
func TestBuildCopyGemmFlags(t *testing.T) {
	dir := t.TempDir()
	spec := func(name string, hidden, heads int) string { return gemmSpec(t, dir, name, hidden, heads) }
	m := spec("m.yaml", 512, 4)
	gateUp := []string{"gemm_copy_k512_n2048_r16", "gemm_copy_k512_n2048_r8"}
	both := append([]string{"gemm_copy_k1024_n512_r16", "gemm_copy_k1024_n512_r8"}, gateUp...)
	shared := map[string][]int{} // by kernel: its shared memory in each build that has it
	for _, c := range []struct {
		flags   []string
		kernels []string // the bundle's copy-engine kernels
		text    string   // inspect's line; "" where there should be none
	}{
		{nil, nil, ""},
		{[]string{"--copy-gemms", "512x2048"}, gateUp, "copy-engine GEMMs: 512x2048, slots: the default"},
		{[]string{"--copy-gemms", "512x2048,1024x512"}, both, "copy-engine GEMMs: 512x2048, 1024x512, slots: the default"},
		{[]string{"--copy-gemms", "512x2048,1024x512", "--copy-gemm-slots", "1"}, both, "copy-engine GEMMs: 512x2048, 1024x512, slots: 1"},
		{[]string{"--copy-gemms", "none"}, nil, "copy-engine GEMMs: none, slots: the default"},
		// The 16-row bucket takes the warpgroup form of 32 rows, the fewest named that hold it.
		// ... and so gate/up with SiLU gets one too (--gated-copy-rows: 32 by default).
		{[]string{"--copy-gemms", "512x2048", "--copy-gemm-rows", "32,8"}, []string{"gemm_copy_k512_n2048_r32", "gemm_copy_k512_n2048_r32_silu_mul", "gemm_copy_k512_n2048_r8"}, "copy-engine GEMMs: 512x2048, slots: the default, rows: [32 8]"},
		{[]string{"--copy-gemms", "512x2048", "--copy-gemm-rows", "32,8", "--copy-gemm-slots", "1"}, []string{"gemm_copy_k512_n2048_r32", "gemm_copy_k512_n2048_r32_silu_mul", "gemm_copy_k512_n2048_r8"}, "copy-engine GEMMs: 512x2048, slots: 1, rows: [32 8]"},
	} {
		out := filepath.Join(dir, "c.xmb")
		b := buildBundle(t, m, out, c.flags)
		kernels, err := bundle.GemmCopyKernels(b.Kernels)
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, ks := range kernels {
			for _, k := range ks {
				names = append(names, k.Kernel)
				shared[k.Kernel] = append(shared[k.Kernel], k.Attrs.Shared)
			}
		}
		slices.Sort(names)
		if !slices.Equal(names, c.kernels) {
			t.Fatalf("%v: copy-engine kernels %v, want %v", c.flags, names, c.kernels)
		}
		if bi := b.Manifest.Build; !slices.Equal(bi.CopyGemms, flagValue(c.flags, "--copy-gemms")) || (bi.CopyGemmSlots == 1) != slices.Contains(c.flags, "--copy-gemm-slots") ||
			(len(bi.CopyGemmRows) > 0) != slices.Contains(c.flags, "--copy-gemm-rows") {
			t.Fatalf("%v: build info %v, %d slots, rows %v", c.flags, bi.CopyGemms, bi.CopyGemmSlots, bi.CopyGemmRows)
		}
		text, err := xmixc(t, "inspect", out)
		if err != nil || c.text != "" && !strings.Contains(text, c.text) || c.text == "" && strings.Contains(text, "copy-engine GEMMs") {
			t.Fatalf("%v: inspect: %v; want %q in:\n%s", c.flags, err, c.text, text)
		}
	}
	// Over a cluster of 2, gate/up's K of 512 is one stage a CTA, which one slot holds; down's
	// 1024 is two, and one slot takes less shared memory than the default two.
	for name, s := range shared {
		if oneSlot := s[len(s)-1]; strings.Contains(name, "_k1024_") != (oneSlot < s[0]) || oneSlot > s[0] {
			t.Errorf("%s: shared memory %v in the builds that have it, the last with --copy-gemm-slots 1", name, s)
		}
	}
	m384 := spec("m384.yaml", 384, 3) // o: K 384, split over a cluster of 2 (6 column tiles), not a multiple of 512
	for _, c := range []struct {
		model string
		flags []string
		want  string
	}{
		{m, []string{"--copy-gemms", "4096"}, `--copy-gemms: GEMM shape "4096": want KxN with K and N positive (e.g. 4096x28672), or none alone`},
		{m, []string{"--copy-gemms", "0x512"}, `GEMM shape "0x512": want KxN`},
		{m, []string{"--copy-gemms", "512x2048x8"}, `GEMM shape "512x2048x8": want KxN`},
		{m, []string{"--copy-gemms", "none,512x2048"}, `GEMM shape "none": want KxN`},
		{m, []string{"--copy-gemm-slots", "5"}, "--copy-gemm-slots: copy-engine GEMM ring of 5 slots: want 1 to 4, or 0 for the default (3)"},
		{m, []string{"--copy-gemm-slots", "-1"}, "--copy-gemm-slots: copy-engine GEMM ring of -1 slots"},
		{m384, []string{"--copy-gemms", "384x384"}, "copy-engine GEMM: K=384 must be a positive multiple of 512"},
		{m, []string{"--copy-gemm-rows", "24"}, "--copy-gemm-rows: copy-engine GEMMs of 24 rows: want rows among [8 16 32 64 128]"},
		{m, []string{"--copy-gemm-rows", "8,32,8"}, "--copy-gemm-rows: copy-engine GEMMs of 8 rows named twice"},
		{m, []string{"--copy-gemm-rows", "x"}, `invalid argument "x" for "--copy-gemm-rows"`},
		{m, []string{"--gated-tc-rows", "33"}, "--gated-tc-rows: tensor-core gate/up kernels up to 33 rows: want 0 (none) to 32"},
		{m, []string{"--gated-tc-rows", "-1"}, "--gated-tc-rows: tensor-core gate/up kernels up to -1 rows: want 0 (none) to 32"},
		{m, []string{"--gated-copy-rows", "257"}, "--gated-copy-rows: gated copy-engine kernels up to 257 rows: want 0 (none) to 256"},
		{m, []string{"--gated-copy-rows", "-1"}, "--gated-copy-rows: gated copy-engine kernels up to -1 rows: want 0 (none) to 256"},
		{m, []string{"--rope-copy-rows", "257"}, "--rope-copy-rows: copy-engine kernels with rope_kv up to 257 rows: want 0 (none) to 256"},
		{m, []string{"--rope-copy-rows", "-1"}, "--rope-copy-rows: copy-engine kernels with rope_kv up to -1 rows: want 0 (none) to 256"},
		{m, []string{"--mi-preload-regs", "256"}, "--mi-preload-regs: preloading row kernels of at most 256 registers a thread: want 0 (no bound) or 16 to 255"},
		{m, []string{"--mi-preload-regs", "8"}, "--mi-preload-regs: preloading row kernels of at most 8 registers a thread: want 0 (no bound) or 16 to 255"},
		{m, []string{"--mi-preload-regs", "-1"}, "--mi-preload-regs: preloading row kernels of at most -1 registers a thread"},
		{m, []string{"--mi-preload-regs-multi-wave", "8"}, "--mi-preload-regs-multi-wave: preloading row kernels (templates of more than 128 rows) of at most 8 registers a thread: want 0 (the bound of smaller templates) or 16 to 255"},
		{m, []string{"--mi-preload-regs-multi-wave", "256"}, "--mi-preload-regs-multi-wave: preloading row kernels (templates of more than 128 rows) of at most 256 registers a thread"},
		{m, []string{"--mi-preload-regs-multi-wave", "-1"}, "--mi-preload-regs-multi-wave: preloading row kernels (templates of more than 128 rows) of at most -1 registers a thread"},
		{m, []string{"--attn-early-kv", "--pdl=false"}, "--attn-early-kv: early K/V loads need early launch (--pdl)"},
	} {
		bad := filepath.Join(dir, "bad.xmb")
		_, err := xmixc(t, append([]string{"build", c.model, "-q", "-o", bad}, c.flags...)...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Fatalf("%v: %v, want %q", c.flags, err, c.want)
		}
		if _, statErr := os.Stat(bad); statErr == nil {
			t.Fatalf("%v: a bundle was written", c.flags)
		}
	}
}

// TestBuildGatedTCRows: by default the 8-row decode bucket runs gate/up and SiLU·up as one
// tensor-core kernel and the 16-row bucket cuBLASLt's GEMM node and the SiLU kernel;
// --gated-tc-rows 16 gives both the kernel, 0 neither; the build info and inspect's output say
// which.
func TestBuildGatedTCRows(t *testing.T) {
	m := gemmSpec(t, t.TempDir(), "m.yaml", 512, 4)
	dir := t.TempDir()
	for _, c := range []struct {
		flags []string
		rows  int             // the build info's
		fused map[string]bool // by decode bucket: gate/up and SiLU in one tensor-core kernel
	}{
		{nil, 8, map[string]bool{"decode_b8": true, "decode_b16": false}},
		{[]string{"--gated-tc-rows", "16"}, 16, map[string]bool{"decode_b8": true, "decode_b16": true}},
		{[]string{"--gated-tc-rows", "0"}, 0, map[string]bool{"decode_b8": false, "decode_b16": false}},
	} {
		out := filepath.Join(dir, "g.xmb")
		b := buildBundle(t, m, out, c.flags)
		if b.Manifest.Build.GatedTCRows != c.rows {
			t.Fatalf("%v: build info gated_tc_rows %d, want %d", c.flags, b.Manifest.Build.GatedTCRows, c.rows)
		}
		for _, tm := range b.Templates {
			want, ok := c.fused[tm.Name]
			if !ok {
				continue
			}
			gated, silu := 0, 0
			for _, n := range tm.Nodes {
				gated += strings.Count(n.Kernel, "gemm_tcg_k512_n2048_")
				silu += strings.Count(n.Kernel, "silu_mul")
			}
			if fused := gated == 2 && silu == 2; fused != want || !want && (gated != 0 || silu != 2) {
				t.Fatalf("%v: %s: %d tensor-core gate/up kernels, %d SiLU kernels or kernels with SiLU; want fused %v", c.flags, tm.Name, gated, silu, want)
			}
		}
		text, err := xmixc(t, "inspect", out)
		line := fmt.Sprintf("gate/up and its activation in one tensor-core kernel at up to %d rows", c.rows)
		if err != nil || (c.rows > 0) != strings.Contains(text, line) || c.rows == 0 && strings.Contains(text, "gate/up and its activation in one tensor-core kernel") {
			t.Fatalf("%v: inspect: %v; want %q (%v) in:\n%s", c.flags, err, line, c.rows > 0, text)
		}
	}
}

// TestBuildGatedCopyRows: --gated-copy-rows N (by default 128; 0: none) gives a copy-engine
// kernel for gate/up with its activation to each decode bucket of at most N rows whose GEMMs
// take the warpgroup form (32 rows and more; the 16-row bucket's kernels are mma.sync), and
// the build info and inspect's output say so (and where the setting gives no bucket one, that
// none is carried). The templates keep the GEMM node and the SiLU kernel, which a backend
// without the kernel runs. Under --gated-copy-wide auto (the default) the 32-row bucket runs
// the 64-row wide kernel, which runs 128 CTAs against its own kernel's 64 on this spec's
// shapes; own keeps its own; anything else is an error naming the values. The 8-row bucket's
// gate/up is the gated tensor-core kernel unless a wide kernel serves it (the loader's
// bundle.GatedCopyFor): then it keeps the GEMM node and the SiLU kernel too.
func TestBuildGatedCopyRows(t *testing.T) {
	dir := t.TempDir()
	m := gemmSpecBuckets(t, dir, "m32.yaml", 512, 4, "1, 8, 16, 32, 64")
	r32, r64 := "gemm_copy_k512_n2048_r32_silu_mul", "gemm_copy_k512_n2048_r64_silu_mul"
	for _, c := range []struct {
		flags   []string
		rows    int
		wide    string
		kernels []string
		tc8     bool // the 8-row bucket's gate/up is the gated tensor-core kernel
	}{
		{nil, 128, codegen.GatedWideAuto, []string{r64}, false},
		{[]string{"--gated-copy-rows", "0"}, 0, codegen.GatedWideAuto, nil, true},
		{[]string{"--gated-copy-rows", "16"}, 16, codegen.GatedWideAuto, nil, true},
		{[]string{"--gated-copy-rows", "32"}, 32, codegen.GatedWideAuto, []string{r32}, true},
		{[]string{"--gated-copy-rows", "64"}, 64, codegen.GatedWideAuto, []string{r64}, false},
		{[]string{"--gated-copy-wide", "own"}, 128, codegen.GatedWideOwn, []string{r32, r64}, true},
		{[]string{"--gated-copy-wide", "all", "--gated-copy-rows", "32"}, 32, codegen.GatedWideAll, []string{r32}, true},
	} {
		out := filepath.Join(dir, "g.xmb")
		b := buildBundle(t, m, out, c.flags)
		if b.Manifest.Build.GatedCopyRows != c.rows || b.Manifest.Build.GatedCopyWide != c.wide {
			t.Fatalf("%v: build info gated_copy_rows %d, gated_copy_wide %q, want %d, %q", c.flags, b.Manifest.Build.GatedCopyRows, b.Manifest.Build.GatedCopyWide, c.rows, c.wide)
		}
		names := copyKernelNames(t, b, func(s bundle.GemmCopyShape) bool { return slices.Contains(bundle.GatedActOps, s.Act) })
		if !slices.Equal(names, c.kernels) {
			t.Fatalf("%v: gated copy-engine kernels %v, want %v", c.flags, names, c.kernels)
		}
		for _, tm := range b.Templates {
			if tm.Name != "decode_b32" && tm.Name != "decode_b8" {
				continue
			}
			silu, tc := 0, 0
			for _, n := range tm.Nodes {
				silu += strings.Count(n.Kernel, "silu_mul")
				tc += strings.Count(n.Kernel, "gemm_tcg_")
			}
			if tm.Name == "decode_b8" && c.tc8 {
				if tc != 2 || silu != 2 {
					t.Fatalf("%v: %s: %d gated tensor-core kernels, %d kernels with SiLU; want the gated kernel in each layer", c.flags, tm.Name, tc, silu)
				}
			} else if silu != 2 || tc != 0 {
				t.Fatalf("%v: %s: %d SiLU kernels, %d gated tensor-core kernels; want one SiLU kernel a layer", c.flags, tm.Name, silu, tc)
			}
		}
		wantEpilogueLine(t, c.flags, out, "gate/up and its activation", "gate/up", c.rows, len(c.kernels) > 0)
	}
	if _, err := xmixc(t, "build", m, "--gated-copy-wide", "wide", "-o", filepath.Join(dir, "bad.xmb")); err == nil || !strings.Contains(err.Error(), "--gated-copy-wide") || !strings.Contains(err.Error(), "auto") {
		t.Fatalf("--gated-copy-wide wide: %v, want an error naming the flag and its values", err)
	}
}

// wantEpilogueLine checks inspect's line on bundle out (built with flags) for copy-engine
// kernels with an epilogue, what ("gate/up and its activation") up to rows rows: there where
// rows > 0, saying none of the GEMMs (gemm) takes one where none is carried.
func wantEpilogueLine(t *testing.T, flags []string, out, what, gemm string, rows int, carried bool) {
	t.Helper()
	text, err := xmixc(t, "inspect", out)
	line := fmt.Sprintf("%s in one warpgroup copy-engine kernel at up to %d rows", what, rows)
	if carried {
		line += "\n"
	} else {
		line += fmt.Sprintf(" (none carried: no such bucket's %s takes one)", gemm)
	}
	if err != nil || (rows > 0) != strings.Contains(text, line) {
		t.Fatalf("%v: inspect: %v; want %q (%v) in:\n%s", flags, err, line, rows > 0, text)
	}
}

// TestBuildRopeCopyRows: --rope-copy-rows N (by default 32; 0: none) gives a copy-engine
// kernel for the q/k/v GEMM with its rope_kv to each decode bucket of at most N rows whose
// q/k/v the warpgroup copy-engine kernels serve (--copy-gemms names its shape; 32 rows and
// more), and the build info and inspect's output say so (and where the setting gives no
// bucket one, that none is carried); from 64 rows the kernel is the wide form (a producer warp
// past a warpgroup per 64 rows, pairs in boxes within a head's half, K split over a
// cluster). The templates keep the GEMM node and the rope_kv kernel, which a backend without
// the kernel runs.
func TestBuildRopeCopyRows(t *testing.T) {
	dir := t.TempDir()
	m := gemmSpecBuckets(t, dir, "m32.yaml", 512, 4, "1, 8, 16, 32, 64")
	const qkv = "--copy-gemms=512x768" // 4 q heads and 2 kv heads of 128
	r32, r64 := "gemm_copy_k512_n768_r32_rope_kv_h4_kv1_d128_f32", "gemm_copy_k512_n768_r64_rope_kv_h4_kv1_d128_f32"
	for _, c := range []struct {
		flags   []string
		rows    int
		kernels []string
	}{
		{[]string{qkv}, 32, []string{r32}},
		{[]string{qkv, "--rope-copy-rows", "0"}, 0, nil},
		{[]string{qkv, "--rope-copy-rows", "16"}, 16, nil},
		{[]string{qkv, "--rope-copy-rows", "64"}, 64, []string{r32, r64}},
		{nil, 32, nil}, // q/k/v keeps the library: no copy-engine kernel serves it
	} {
		out := filepath.Join(dir, "r.xmb")
		b := buildBundle(t, m, out, c.flags)
		if b.Manifest.Build.RopeCopyRows != c.rows {
			t.Fatalf("%v: build info rope_copy_rows %d, want %d", c.flags, b.Manifest.Build.RopeCopyRows, c.rows)
		}
		names := copyKernelNames(t, b, func(s bundle.GemmCopyShape) bool {
			return s == bundle.GemmCopyShape{K: 512, N: 768, Act: bundle.OpRopeKV}
		})
		if !slices.Equal(names, c.kernels) {
			t.Fatalf("%v: copy-engine kernels with rope_kv %v, want %v", c.flags, names, c.kernels)
		}
		ks, err := bundle.GemmCopyKernels(b.Kernels)
		if err != nil {
			t.Fatal(err)
		}
		plain := map[int]bundle.GemmCopyAttrs{}
		for _, k := range ks[bundle.GemmCopyShape{K: 512, N: 768}] {
			plain[k.Attrs.Rows] = k.Attrs
		}
		if p, ok := plain[32]; c.rows == 0 && (!ok || p.Cluster != 2) {
			t.Errorf("%v: the plain 32-row kernel %+v, want K split over 2 (so that the twin below is not what GemmCopyFor gives anyway)", c.flags, p)
		}
		for _, k := range ks[bundle.GemmCopyShape{K: 512, N: 768, Act: bundle.OpRopeKV}] {
			// 32 rows: 32 pairs a CTA, 12 CTAs; 64: 32 pairs (half a head of 128) over 4 ranks, 48.
			want := map[int][4]int{32: {128, 12, 1, 32}, 64: {160, 48, 4, 32}}[k.Attrs.Rows]
			if got := [4]int{k.Attrs.Block, k.Attrs.Grid, k.Attrs.Cluster, k.Attrs.Box[1]}; got != want {
				t.Errorf("%v: %s: block, grid, cluster and box rows %v, want %v", c.flags, k.Kernel, got, want)
			}
			// The plain kernel of its rows, which serves a layer whose q/k/v an app's op at
			// attn.q parts from rope_kv, sums as it does (without --copy-gemm-wide too): the
			// same form, the same K split (at 32 rows none, where this shape's plain kernel
			// splits K over 2 in a build without rope_kv), as many columns a CTA as its pairs'
			// elements.
			p, ok := plain[k.Attrs.Rows]
			if !ok || p.Cluster != k.Attrs.Cluster || p.Wide != 2*k.Attrs.Wide {
				t.Errorf("%v: %s (cluster %d, wide %d): the plain kernel of its rows %+v, want the same form and split", c.flags, k.Kernel, k.Attrs.Cluster, k.Attrs.Wide, p)
			}
		}
		for _, tm := range b.Templates {
			rope := 0
			for _, n := range tm.Nodes {
				rope += strings.Count(n.Kernel, "rope_kv_")
			}
			if tm.Kind == bundle.Decode && tm.Tokens >= 8 && rope != 2 {
				t.Fatalf("%v: %s: %d rope_kv kernels, want one a layer", c.flags, tm.Name, rope)
			}
		}
		wantEpilogueLine(t, c.flags, out, "q/k/v with RoPE and the KV write", "q/k/v", c.rows, len(c.kernels) > 0)
	}
}

// TestBuildCopyGemmNext: --copy-gemm-next asked records itself in the build info and in
// inspect, and gives every copy-engine kernel (the gated one too) one more launch of the grid
// after it, where its last stage is asked for; read is the default, byte for byte; anything
// else is an error naming the values.
func TestBuildCopyGemmNext(t *testing.T) {
	dir := t.TempDir()
	m := gemmSpecBuckets(t, dir, "m32.yaml", 512, 4, "1, 8, 16, 32")
	launches := func(b *bundle.Bundle) map[string]int {
		n := map[string]int{}
		for _, k := range b.Kernels {
			if k.Op == bundle.OpGemmCopy {
				n[k.Name] = strings.Count(k.PTX, bundle.PriorGridLaunch)
			}
		}
		return n
	}
	// The 32-row bucket's own gated kernel: the wide one it runs by default takes no NextAtAsk.
	own := []string{"--gated-copy-wide", "own"}
	def := buildBundle(t, m, filepath.Join(dir, "d.xmb"), own)
	read := buildBundle(t, m, filepath.Join(dir, "r.xmb"), append([]string{"--copy-gemm-next", "read"}, own...))
	out := filepath.Join(dir, "a.xmb")
	asked := buildBundle(t, m, out, append([]string{"--copy-gemm-next", "asked"}, own...))
	if def.Manifest.Build.CopyGemmNextAtAsk || read.Manifest.Build.CopyGemmNextAtAsk || !asked.Manifest.Build.CopyGemmNextAtAsk {
		t.Fatalf("build info copy_gemm_next_at_ask: default %v, read %v, asked %v", def.Manifest.Build.CopyGemmNextAtAsk, read.Manifest.Build.CopyGemmNextAtAsk, asked.Manifest.Build.CopyGemmNextAtAsk)
	}
	if !reflect.DeepEqual(def.Kernels, read.Kernels) {
		t.Fatal("--copy-gemm-next read changed the default's kernels")
	}
	before, after := launches(def), launches(asked)
	if len(before) == 0 || !slices.Contains(slices.Collect(maps.Keys(before)), "gemm_copy_k512_n2048_r32_silu_mul") {
		t.Fatalf("copy-engine kernels %v: want the gated one among them", before)
	}
	for name, n := range before {
		if after[name] != n+1 {
			t.Errorf("%s: %d launches of the grid after it with asked, %d without; want one more", name, after[name], n)
		}
	}
	if text, err := xmixc(t, "inspect", out); err != nil || !strings.Contains(text, "the next kernel launched once the last stage is asked for") {
		t.Fatalf("inspect: %v\n%s", err, text)
	}
	if text, err := xmixc(t, "build", m, "-q", "-o", filepath.Join(dir, "x.xmb"), "--copy-gemm-next", "soon"); err == nil || !strings.Contains(text, `--copy-gemm-next "soon": want read`) {
		t.Fatalf("--copy-gemm-next soon: %v\n%s", err, text)
	}
}

// TestBuildCopyGemmWide: --copy-gemm-wide records itself in the build info and in inspect,
// and gives the plain copy-engine kernels of 64 and 128 rows the wide form: a CTA's columns
// of W over every row of x (a warpgroup per 64 rows and the producer warp: 160 and 288
// threads), K split over a cluster (512 x 2048: 64 columns over 4 CTAs, 128 of them), where
// the default form has one warpgroup of 64 columns (K over 4 CTAs too: 32 column tiles). The
// kernels of fewer rows stay byte for byte.
func TestBuildCopyGemmWide(t *testing.T) {
	dir := t.TempDir()
	m := gemmSpecBuckets(t, dir, "m128.yaml", 512, 4, "1, 8, 16, 32, 64, 128")
	flags := []string{"--copy-gemms", "512x2048", "--gated-copy-rows", "0", "--rope-copy-rows", "0"}
	def := buildBundle(t, m, filepath.Join(dir, "d.xmb"), flags)
	out := filepath.Join(dir, "w.xmb")
	wide := buildBundle(t, m, out, append(flags, "--copy-gemm-wide"))
	if def.Manifest.Build.CopyGemmWide || !wide.Manifest.Build.CopyGemmWide {
		t.Fatalf("build info copy_gemm_wide: default %v, wide %v", def.Manifest.Build.CopyGemmWide, wide.Manifest.Build.CopyGemmWide)
	}
	kernels := func(b *bundle.Bundle) map[int]bundle.GemmCopy {
		ks, err := bundle.GemmCopyKernels(b.Kernels)
		if err != nil {
			t.Fatal(err)
		}
		byRows := map[int]bundle.GemmCopy{}
		for _, k := range ks[bundle.GemmCopyShape{K: 512, N: 2048}] {
			byRows[k.Attrs.Rows] = k
		}
		return byRows
	}
	ptxOf := func(b *bundle.Bundle, name string) string {
		i := slices.IndexFunc(b.Kernels, func(k bundle.Kernel) bool { return k.Name == name })
		return b.Kernels[i].PTX
	}
	d, w := kernels(def), kernels(wide)
	for _, rows := range []int{8, 16, 32, 64, 128} {
		dk, wk := d[rows], w[rows]
		if dk.Kernel == "" || wk.Kernel == "" {
			t.Fatalf("%d rows: kernels %q and %q, want one in each build", rows, dk.Kernel, wk.Kernel)
		}
		same := ptxOf(def, dk.Kernel) == ptxOf(wide, wk.Kernel)
		switch want := map[int][4]int{64: {128, 160, 128, 4}, 128: {128, 288, 128, 4}}[rows]; {
		case want == [4]int{}:
			if !same {
				t.Errorf("%d rows: --copy-gemm-wide changed %s", rows, wk.Kernel)
			}
		case same || dk.Attrs.Block != want[0] || wk.Attrs.Block != want[1] || wk.Attrs.Grid != want[2] || wk.Attrs.Cluster != want[3] || wk.Attrs.Box != [2]int{64, 64}:
			t.Errorf("%d rows: default %+v, wide %+v; want blocks %d and %d, the wide one's grid %d in clusters of %d, boxes of 64 x 64", rows, dk.Attrs, wk.Attrs, want[0], want[1], want[2], want[3])
		}
	}
	if text, err := xmixc(t, "inspect", out); err != nil || !strings.Contains(text, "the wide form at 64 and 128 rows") {
		t.Fatalf("inspect: %v\n%s", err, text)
	}
}

// flagValue is the comma-separated list after flag in flags, nil if flag is not there.
func flagValue(flags []string, flag string) []string {
	if i := slices.Index(flags, flag); i >= 0 && i+1 < len(flags) {
		return strings.Split(flags[i+1], ",")
	}
	return nil
}

// copyKernelNames lists b's copy-engine kernels of the shapes keep takes, in name order.
func copyKernelNames(t *testing.T, b *bundle.Bundle, keep func(bundle.GemmCopyShape) bool) []string {
	t.Helper()
	kernels, err := bundle.GemmCopyKernels(b.Kernels)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for shape, ks := range kernels {
		if keep(shape) {
			for _, k := range ks {
				names = append(names, k.Kernel)
			}
		}
	}
	slices.Sort(names)
	return names
}

// TestBuildKVCacheTokens: --kv-cache-tokens N gives the bundle a KV page pool of N tokens in
// place of the spec's (N/16 pages besides the padding sequence's), and a count the spec's
// serving.kv_cache_tokens could not hold is refused with what would fit, no bundle written.
func TestBuildKVCacheTokens(t *testing.T) {
	dir := t.TempDir()
	m := write(t, dir, "m.yaml", `model: m
family: llama
dims: {hidden: 64, intermediate: 128, layers: 1, heads: 2, kv_heads: 2, head_dim: 32, vocab: 260}
weights: {synthetic: {seed: 1, std: 0.02}}
tokenizer: bytes
bos: 256
eos: [257]
serving: {decode_buckets: [1, 4], prefill_chunks: [8], max_seq_len: 256, max_seqs: 4, kv_block_size: 16}
`)
	spec := buildBundle(t, m, filepath.Join(dir, "spec.xmb"), nil).Manifest.Model
	small := buildBundle(t, m, filepath.Join(dir, "small.xmb"), []string{"--kv-cache-tokens", "512"}).Manifest.Model
	if spec.KVBlocks-spec.KVPadPages != 64 || small.KVBlocks-small.KVPadPages != 32 || small.KVPadPages != spec.KVPadPages {
		t.Fatalf("pool pages: %d (+%d padding) by the spec, %d (+%d) with --kv-cache-tokens 512; want 64 and 32", spec.KVBlocks-spec.KVPadPages, spec.KVPadPages, small.KVBlocks-small.KVPadPages, small.KVPadPages)
	}
	for _, c := range []struct {
		tokens, want string
	}{
		{"-1", "--kv-cache-tokens -1: want a count of tokens, or 0 for the spec's serving.kv_cache_tokens"},
		{"300", "a KV pool of 300 tokens is not a whole number of 16-token pages: want a multiple of kv_block_size: 304"},
		{"128", "a KV pool of 128 tokens is less than max_seq_len: want at least max_seq_len (256)"},
		{"2048", "a KV pool of 2048 tokens is more than every resident sequence can hold: want at most max_seqs x max_seq_len = 1024"},
	} {
		bad := filepath.Join(dir, "bad.xmb")
		_, err := xmixc(t, "build", m, "-q", "-o", bad, "--kv-cache-tokens", c.tokens)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Fatalf("--kv-cache-tokens %s: %v, want %q", c.tokens, err, c.want)
		}
		if _, statErr := os.Stat(bad); statErr == nil {
			t.Fatalf("--kv-cache-tokens %s: a bundle was written", c.tokens)
		}
	}
}

// TestBuildMIPreloadRegs: --mi-preload-regs N (by default codegen.DefaultMIPreloadRegs; 0:
// none) and --mi-preload-regs-multi-wave M (by default
// codegen.DefaultMIPreloadRegsMultiWave; 0: N's) are the build info's bounds on the
// preloading row kernels' registers, and inspect names each where there is one.
func TestBuildMIPreloadRegs(t *testing.T) {
	dir := t.TempDir()
	m := gemmSpecBuckets(t, dir, "m.yaml", 512, 4, "1, 8")
	for _, c := range []struct {
		flags       []string
		regs, multi int
	}{
		{nil, codegen.DefaultMIPreloadRegs, codegen.DefaultMIPreloadRegsMultiWave},
		{[]string{"--mi-preload-regs", "0"}, 0, codegen.DefaultMIPreloadRegsMultiWave},
		{[]string{"--mi-preload-regs", "40"}, 40, codegen.DefaultMIPreloadRegsMultiWave},
		{[]string{"--mi-preload-regs-multi-wave", "0"}, codegen.DefaultMIPreloadRegs, 0},
		{[]string{"--mi-preload-regs-multi-wave", "24"}, codegen.DefaultMIPreloadRegs, 24},
	} {
		out := filepath.Join(dir, "p.xmb")
		b := buildBundle(t, m, out, c.flags)
		if b.Manifest.Build.MIPreloadRegs != c.regs || b.Manifest.Build.MIPreloadRegsMultiWave != c.multi {
			t.Fatalf("%v: build info mi_preload_regs %d, mi_preload_regs_multi_wave %d, want %d, %d", c.flags, b.Manifest.Build.MIPreloadRegs, b.Manifest.Build.MIPreloadRegsMultiWave, c.regs, c.multi)
		}
		text, err := xmixc(t, "inspect", out)
		line := fmt.Sprintf("take at most %d registers a thread (kernels *_nr%d)", c.regs, c.regs)
		if err != nil || (c.regs > 0) != strings.Contains(text, line) || c.regs == 0 && strings.Contains(text, "registers a thread") {
			t.Fatalf("%v: inspect: %v; want %q (%v) in:\n%s", c.flags, err, line, c.regs > 0, text)
		}
		multi := fmt.Sprintf("in templates of more than 128 rows at most %d (kernels *_nr%d)", c.multi, c.multi)
		if (c.multi > 0) != strings.Contains(text, multi) || c.multi == 0 && strings.Contains(text, "templates of more than 128 rows") {
			t.Fatalf("%v: inspect: want %q (%v) in:\n%s", c.flags, multi, c.multi > 0, text)
		}
	}
}

// TestBuildRopeOneWave: with rope_kv apart (--rope-in-attention=false), --rope-one-wave (the
// default) shares a row's heads among fewer rope_kv blocks where the old grid (Llama-3.1-8B:
// three blocks of 16 heads a row) would take more than the card's wave of 264 blocks and one
// block a row still fits one: two blocks a row at 128 rows, one at 256, the old grid at 64
// rows and in the prefill chunks of 512 rows and more; the build records it, and inspect
// says where it is off. With --rope-one-wave=false every template keeps three a row.
func TestBuildRopeOneWave(t *testing.T) {
	dir := t.TempDir()
	for _, on := range []bool{false, true} {
		flags := []string{"--rope-in-attention=false", fmt.Sprintf("--rope-one-wave=%v", on)}
		out := filepath.Join(dir, "r.xmb")
		b := buildBundle(t, "../../specs/models/llama-3.1-8b.yaml", out, flags)
		if b.Manifest.Build.RopeOneWave != on {
			t.Fatalf("%v: build info rope_one_wave %v", flags, b.Manifest.Build.RopeOneWave)
		}
		for _, tm := range b.Templates {
			want := 3
			if on && tm.Tokens == 128 {
				want = 2
			} else if on && tm.Tokens == 256 {
				want = 1
			}
			for _, n := range tm.Nodes {
				if strings.HasPrefix(n.Kernel, "rope_kv_") && n.Grid != [3]int{tm.Tokens, want, 1} {
					t.Errorf("%v: %s %s: kernel %s grid %v, want %d blocks a row", flags, tm.Name, n.Label, n.Kernel, n.Grid, want)
				}
			}
		}
		text, err := xmixc(t, "inspect", out)
		if err != nil || strings.Contains(text, "--rope-one-wave=false") == on || !strings.Contains(text, "--rope-in-attention=false") {
			t.Errorf("%v: inspect: %v\n%s", flags, err, text)
		}
	}
}

// TestBuildRopeInAttention: by default (--rope-in-attention) Llama-3.1-8B's q/k/v rotation and
// KV write are the attention's in the decode buckets whose attention runs one block a row (128
// and 256 rows): no rope_kv node there, the attention's kernel the _rope form with the
// rotation tables bound after z_bf16; the 64-row bucket (two splits a row) and the prefill
// chunks keep rope_kv; the build records it. With --rope-in-attention=false no attention
// rotates, and inspect says so.
func TestBuildRopeInAttention(t *testing.T) {
	dir := t.TempDir()
	for _, on := range []bool{true, false} {
		flags := []string{fmt.Sprintf("--rope-in-attention=%v", on)}
		out := filepath.Join(dir, "r.xmb")
		b := buildBundle(t, "../../specs/models/llama-3.1-8b.yaml", out, flags)
		if b.Manifest.Build.RopeInAttention != on {
			t.Fatalf("%v: build info rope_in_attention %v", flags, b.Manifest.Build.RopeInAttention)
		}
		kernels := map[string]bundle.Kernel{}
		for _, k := range b.Kernels {
			kernels[k.Name] = k
		}
		for _, tm := range b.Templates {
			inAttn := on && tm.Kind == bundle.Decode && tm.Tokens >= 128
			ropes, fused := 0, 0
			for _, n := range tm.Nodes {
				k := kernels[n.Kernel]
				switch {
				case k.Op == bundle.OpRopeKV:
					ropes++
				case k.Op == bundle.OpAttention && strings.HasSuffix(k.Name, "_rope"):
					if names := []string{k.Params[8].Name, k.Params[9].Name}; names[0] != "cos" || names[1] != "sin" || n.Args[8].Buffer == "" || n.Args[9].Buffer == "" {
						t.Fatalf("%s %s: parameters 8-9 %v bound to %v", tm.Name, n.Label, names, n.Args[8:])
					}
					fused++
				}
			}
			if inAttn && (ropes != 0 || fused != 32) || !inAttn && fused != 0 {
				t.Errorf("%v: %s: %d rope_kv nodes and %d attentions with the rotation", flags, tm.Name, ropes, fused)
			}
		}
		text, err := xmixc(t, "inspect", out)
		if err != nil || strings.Contains(text, "rope_kv a kernel of its own") == on {
			t.Errorf("%v: inspect: %v\n%s", flags, err, text)
		}
	}
}
