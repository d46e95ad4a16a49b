package testsuite

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"xmix/bundle"
	"xmix/compile"
)

// The acceptance of the compiler's redesign (issue 16): every bundle that shipped before it
// builds with the same content. TestBundleDigests builds each case below and compares its
// digest with testdata/bundle_digests.golden, which was written by this test at tag pre-ir
// (the last commit before the redesign; the cases added since, Gemma 2's, when they were
// added) and is rewritten only by -update-digests. Defaults changed after that, each
// measured on the GPU: programmatic dependent launch (session 7; xmixc build --pdl: two
// instructions at the head of every generated kernel, which is marked early_launch, nothing
// else; TestPDLBundle), the qkv-rope fusion (session 7; passes.DefaultFusions; the fused
// kernel computes the unfused pair's bits, TestEmulatedBundleMatchesReferenceOps and the
// GPU's TestCUDABuildKeepsBits), GEMVs that prefetch their weights before they wait (session
// 8, --prefetch, which needs --pdl; TestPrefetchBundle), and GEMVs of two columns per warp in
// buckets of 2-7 rows (session 8, --gemv-cols; the one-column bits, TestGemmColumnsPerWarp),
// unrolled four chunks a step (session 8, --gemv-unroll; TestGemmUnroll), the gate-act
// fusion and GEMV blocks of two warps (session 19; --gemv-warps; TestGemmGatedKernel,
// TestGemmBlockWarps), the decode attention's step on tensor cores (session 22; --attn-tc;
// TestAttentionDecodeTC) and the one-row bucket's attention asking L2 for its first pass
// (session 22; --attn-prefetch-one-row, which needs --pdl; TestAttentionPrefetchKV). Kernel changes that
// keep every bit rewrote the golden file instead, e.g. the tensor-core GEMMs of decode buckets
// built for their row count with chunks in flight (session 11; TestGemmTCBucket), the
// tensor-core GEMMs that load their first step's weights before the wait (session 12;
// TestGemmTCPrefetch), and the staged kernels of --gemm tc-staged built per bucket with a
// ring of W stages and their ticket counters at the workspace's head (session 12;
// TestGemmTCStagedBucket, TestEmulatedBundleMatchesReferenceOps). So the cases build
// with --pdl=false, --gemv-cols 1, --gemv-unroll 1, --gemv-warps 8, --attn-tc=false and, where they name no fusion, --fuse
// none, which is the bundle that shipped byte for byte; the -default cases hold the
// defaults' digests.
var (
	updateDigests = flag.Bool("update-digests", false, "rewrite testdata/bundle_digests.golden from this build")
	dumpBundles   = flag.String("dump-bundles", "", "write each case's bundle as indented JSON to DIR/NAME.json, to diff two builds")
)

const digestsGolden = "testdata/bundle_digests.golden"

// digestCase is one bundle: a model spec (a path under specs/, or a spec text), app specs
// (paths, or texts), and build options.
type digestCase struct {
	name  string
	model string
	apps  []string
	opt   compile.Options
	// defaults: build with today's defaults; otherwise --pdl=false and, where opt names no
	// fusion, --fuse none.
	defaults bool
}

// coverageApps put an op of every template at every hook the small models fire, and every
// kind of condition, so that each host kernel carries MI ops in some case below.
var coverageApps = []string{
	`app: cov-capture
buffers:
  e: {shape: [128]}
  q: {shape: [128]}
  k: {shape: [64]}
  v: {shape: [64]}
  z: {shape: [128]}
  ao: {shape: [128]}
  mid: {shape: [128]}
  act: {shape: [192]}
  mo: {shape: [128]}
  post: {shape: [128]}
  fin: {shape: [128]}
  pre: {shape: [128]}
ops:
  - read: {at: {hook: embed}, kernel: capture, into: e}
  - read: {at: {layers: [1], hook: resid_pre}, kernel: capture, into: pre}
  - read: {at: {layers: [0], hook: attn.q}, kernel: capture, into: q}
  - read: {at: {layers: [0], hook: attn.k}, kernel: capture, into: k}
  - read: {at: {layers: [0], hook: attn.v}, kernel: capture, into: v}
  - read: {at: {layers: [1], hook: attn.z}, kernel: capture, into: z}
  - read: {at: {layers: [1], hook: attn_out}, kernel: capture, into: ao}
  - read: {at: {layers: [2], hook: resid_mid}, kernel: capture, into: mid}
  - read: {at: {layers: [2], hook: mlp.act}, kernel: capture, into: act}
  - read: {at: {layers: [2], hook: mlp_out}, kernel: capture, into: mo}
  - read: {at: {layers: [2], hook: resid_post}, kernel: capture, into: post}
  - read: {at: {hook: final_norm}, kernel: capture, into: fin}
`, `app: cov-writes
params:
  v: {random: 31}
  d: {random: 32, per_request: true}
  w: {random: 33}
buffers:
  p: {shape: [2], export: true}
  lens: {shape: [6], export: true}
ops:
  - read: {at: {layers: [0], hook: resid_mid}, kernel: probe_linear, args: {w: w, bias: 0.25}, into: p}
  - write: {at: {layers: [1], hook: resid_post}, kernel: steer_set, args: {direction: v, value: 0.5},
            when: {activation: {buffer: p, op: ">=", value: 0.1}}}
  - read: {at: {layers: [1], hook: resid_post}, kernel: probe_linear, args: {w: v, activation: sigmoid}, into: p}
  - write: {at: {layers: "0-2", hook: resid_post, per_request: true}, kernel: steer_add, args: {vector: d, alpha: 2},
            when: {after_token: [65, 66]}}
  - write: {at: {layers: [1], hook: attn.z}, kernel: head_ablate, args: {head: 2, alpha: 0}, when: {steps: {from: 1, to: 9}}}
  - write: {at: {layers: [0], hook: mlp.act}, kernel: scale, args: {alpha: 0.5}, when: {positions: generated}}
  - write: {at: {layers: [2], hook: attn_out}, kernel: patch, args: {vector: v}, when: {token_in: [10, 11]}}
  - write: {at: {layers: [2], hook: mlp_out}, kernel: clamp_projection, args: {direction: w, max: 0.5}}
  - write: {at: {hook: final_norm}, kernel: project_out, args: {direction: v}}
  - read: {at: {layers: [1], hook: resid_post}, kernel: logit_lens, args: {k: 3}, into: lens}
`, `app: cov-logits
params: {bias: {random: 34}}
buffers: {lg: {shape: [300], export: true}}
ops:
  - write: {at: {hook: logits}, kernel: steer_add, args: {vector: bias, alpha: 0.5}, when: {positions: prompt}}
  - read: {at: {hook: logits}, kernel: capture, into: lg}
  - write: {at: {hook: sampled}, kernel: token_override, args: {token: 65}, when: {token_in: [66]}}
`}

// familyApps are apps that fit every small model (96 to 128 wide).
func familyApps(hidden int) []string {
	return []string{fmt.Sprintf(`app: fam
params: {v: {random: 41}, d: {random: 42}}
buffers: {p: {shape: [1], export: true}}
ops:
  - read: {at: {layers: [0], hook: resid_post}, kernel: probe_linear, args: {w: v}, into: p}
  - write: {at: {layers: all, hook: resid_post}, kernel: steer_add, args: {vector: v, alpha: 2}}
  - write: {at: {layers: all, hook: resid_mid}, kernel: project_out, args: {direction: d}}
  - write: {at: {layers: [1], hook: attn.z}, kernel: head_ablate, args: {head: 1, alpha: 0.5}}
# width %d
`, hidden)}
}

// fuseAll builds with every decode fusion.
var fuseAll = compile.Options{Fuse: []string{"all"}}

func digestCases(t *testing.T) []digestCase {
	glob := func(pattern string) []string {
		fs, err := filepath.Glob(pattern)
		if err != nil || len(fs) == 0 {
			t.Fatalf("%s: %v %v", pattern, fs, err)
		}
		return fs
	}
	const m = "../specs/models/"
	const a = "../specs/apps/"
	tiny, l1, l8, q8, mx := m+"tiny.yaml", m+"llama-3.2-1b.yaml", m+"llama-3.1-8b.yaml", m+"qwen3-8b.yaml", m+"mixtral-8x7b.yaml"
	apps16 := glob(a + "app[1-6]-*.yaml")
	cases := []digestCase{
		{name: "tiny", model: tiny},
		{name: "tiny-steer-probe-embedded", model: tiny, apps: []string{a + "tiny-steer.yaml", a + "tiny-probe.yaml"}, opt: compile.Options{EmbedWeights: true}},
		{name: "tiny-apps", model: tiny, apps: glob(a + "tiny/*.yaml")},
		{name: "tiny-custom", model: tiny, apps: []string{a + "custom/custom-scale2.yaml"}},
		{name: "tiny-steer-tp2", model: tiny, apps: []string{a + "tiny-steer.yaml"}, opt: compile.Options{TP: 2}},
		{name: "llama-3.2-1b", model: l1},
		{name: "llama-3.1-8b", model: l8},
		{name: "qwen3-8b", model: q8},
		{name: "mixtral-8x7b", model: mx},
		{name: "llama-3.1-8b-apps1-6", model: l8, apps: apps16},
		{name: "mixtral-8x7b-app7", model: mx, apps: []string{a + "app7-steermoe.yaml"}},
		{name: "llama-3.1-8b-grid", model: l8, apps: glob(a + "grid/*.yaml")},
		{name: "llama-3.1-8b-per-request", model: l8, apps: []string{a + "per-request.yaml"}},
		{name: "llama-3.1-8b-per-request-slots3", model: l8, apps: []string{a + "per-request.yaml"}, opt: compile.Options{VectorSlots: 3}},
		{name: "llama-3.1-8b-tp2", model: l8, opt: compile.Options{TP: 2}},
		{name: "llama-3.1-8b-tp4", model: l8, opt: compile.Options{TP: 4}},
		{name: "llama-3.1-8b-apps1-6-tp2", model: l8, apps: apps16, opt: compile.Options{TP: 2}},
		{name: "mixtral-8x7b-app7-tp2", model: mx, apps: []string{a + "app7-steermoe.yaml"}, opt: compile.Options{TP: 2}},
		{name: "llama-3.1-8b-gemm-tc-staged", model: l8, opt: compile.Options{GEMM: "tc-staged"}},
		{name: "llama-3.1-8b-gemm-cuda-core", model: l8, opt: compile.Options{GEMM: "cuda-core"}},
		{name: "llama-3.1-8b-apps1-6-gemm-tc-staged", model: l8, apps: apps16, opt: compile.Options{GEMM: "tc-staged"}},
		{name: "mixtral-8x7b-moe-grouped", model: mx, opt: compile.Options{MoE: "grouped"}},
		{name: "mixtral-8x7b-app7-moe-grouped", model: mx, apps: []string{a + "app7-steermoe.yaml"}, opt: compile.Options{MoE: "grouped"}},
		{name: "small-coverage", model: SmallModel, apps: coverageApps},
		{name: "small-seven-apps", model: SmallModel, apps: smallSevenApps},
		{name: "small-seven-apps-tp2", model: SmallModel, apps: smallSevenApps, opt: compile.Options{TP: 2}},
		{name: "small-mixtral-steermoe", model: SmallMixtral, apps: []string{smallSteerMoE}},
		{name: "small-mixtral-steermoe-grouped", model: SmallMixtral, apps: []string{smallSteerMoE}, opt: compile.Options{MoE: "grouped"}},
		{name: "small-mixtral-tp2", model: SmallMixtral, apps: []string{smallSteerMoE}, opt: compile.Options{TP: 2}},
		{name: "small-qwen2", model: SmallQwen2, apps: familyApps(96)},
		{name: "small-qwen2-tp2", model: SmallQwen2, apps: familyApps(96), opt: compile.Options{TP: 2}},
		{name: "small-qwen3", model: SmallQwen3, apps: familyApps(128)},
		{name: "small-mistral", model: strings.Replace(SmallQwen3, "family: qwen3", "family: mistral", 1), apps: familyApps(128)},
		// Added after the redesign (no pre-ir digest): Gemma 2.
		{name: "gemma-2-2b", model: m + "gemma-2-2b.yaml"},
		{name: "gemma-2-9b", model: m + "gemma-2-9b.yaml"},
		{name: "gemma-2-2b-tp2", model: m + "gemma-2-2b.yaml", opt: compile.Options{TP: 2}},
		{name: "small-gemma2", model: SmallGemma2, apps: familyApps(96)},
		// Added with the decode fusions (xmixc build --fuse, issue 14): the bundles the GPU
		// A/B builds, and every family and host with them.
		{name: "llama-3.1-8b-fuse-all", model: l8, opt: fuseAll},
		{name: "llama-3.2-1b-fuse-all", model: l1, opt: fuseAll},
		{name: "llama-3.1-8b-apps1-6-fuse-all", model: l8, apps: apps16, opt: fuseAll},
		{name: "llama-3.1-8b-fuse-qkv-rope", model: l8, opt: compile.Options{Fuse: []string{"qkv-rope"}}},
		{name: "llama-3.1-8b-fuse-gate-act", model: l8, opt: compile.Options{Fuse: []string{"gate-act"}}},
		{name: "tiny-fuse-all", model: tiny, opt: fuseAll},
		{name: "small-coverage-fuse-all", model: SmallModel, apps: coverageApps, opt: fuseAll},
		{name: "small-qwen2-fuse-all", model: SmallQwen2, apps: familyApps(96), opt: fuseAll},
		{name: "small-qwen3-fuse-all", model: SmallQwen3, apps: familyApps(128), opt: fuseAll},
		{name: "small-gemma2-fuse-all", model: SmallGemma2, apps: familyApps(96), opt: fuseAll},
		{name: "small-mixtral-fuse-all", model: SmallMixtral, apps: []string{smallSteerMoE}, opt: fuseAll},
		{name: "small-seven-apps-tp2-fuse-all", model: SmallModel, apps: smallSevenApps, opt: compile.Options{TP: 2, Fuse: []string{"all"}}},
		// Added when programmatic dependent launch and qkv-rope became the defaults.
		{name: "tiny-default", model: tiny, defaults: true},
		{name: "tiny-custom-default", model: tiny, apps: []string{a + "custom/custom-scale2.yaml"}, defaults: true},
		{name: "llama-3.2-1b-default", model: l1, defaults: true},
		{name: "llama-3.1-8b-default", model: l8, defaults: true},
		{name: "llama-3.1-8b-apps1-6-default", model: l8, apps: apps16, defaults: true},
		{name: "llama-3.1-8b-fuse-all-default", model: l8, opt: fuseAll, defaults: true},
		{name: "small-coverage-default", model: SmallModel, apps: coverageApps, defaults: true},
		{name: "small-gemma2-default", model: SmallGemma2, apps: familyApps(96), defaults: true},
		{name: "small-mixtral-default", model: SmallMixtral, apps: []string{smallSteerMoE}, defaults: true},
	}
	for _, app := range apps16 {
		cases = append(cases, digestCase{name: "llama-3.1-8b-" + strings.TrimSuffix(filepath.Base(app), ".yaml"), model: l8, apps: []string{app}})
	}
	for _, app := range glob(a + "grid/*.yaml") {
		cases = append(cases, digestCase{name: "llama-3.1-8b-grid-" + strings.TrimSuffix(filepath.Base(app), ".yaml"), model: l8, apps: []string{app}})
	}
	return cases
}

// TestBundleDigests builds every case and compares its content digests with the golden list.
func TestBundleDigests(t *testing.T) {
	want := map[string]string{}
	if !*updateDigests {
		data, err := os.ReadFile(digestsGolden)
		if err != nil {
			t.Fatalf("%v (write it with go test ./testsuite -run TestBundleDigests -update-digests)", err)
		}
		for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
			if name, rest, ok := strings.Cut(line, " "); ok && !strings.HasPrefix(line, "#") {
				want[name] = rest
			}
		}
	}
	var lines []string
	for _, c := range digestCases(t) {
		got := caseDigest(t, c)
		lines = append(lines, c.name+" "+got)
		if *updateDigests {
			continue
		}
		switch w, ok := want[c.name]; {
		case !ok:
			t.Errorf("%s: not in %s (add it with -update-digests)", c.name, digestsGolden)
		case w != got:
			t.Errorf("%s: bundle changed:\n got %s\nwant %s", c.name, got, w)
		}
		delete(want, c.name)
	}
	for name := range want {
		t.Errorf("%s: in %s but no case builds it", name, digestsGolden)
	}
	if *updateDigests {
		sort.Strings(lines)
		head := "# Content digests of the bundles TestBundleDigests builds (digests_test.go): whole, then per section.\n" +
			"# Written by go test ./testsuite -run TestBundleDigests -update-digests; never edit by hand.\n"
		if err := os.WriteFile(digestsGolden, []byte(head+strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// caseDigest builds c and returns its digests: the whole bundle, then each section.
func caseDigest(t *testing.T, c digestCase) string {
	t.Helper()
	model := c.model
	var apps []string
	if strings.Contains(model, "\n") { // a spec text
		model, apps = WriteSpecs(t, c.model, c.apps...)
	} else {
		apps = c.apps
	}
	opt := c.opt
	if !c.defaults {
		opt.SerialLaunch = true
		opt.GemvCols = cmp.Or(opt.GemvCols, 1)
		opt.GemvUnroll = cmp.Or(opt.GemvUnroll, 1)
		opt.GemvWarps = cmp.Or(opt.GemvWarps, 8)
		opt.AttnCUDACores = true
		opt.RopeApart, opt.RopeWaves = true, true
		if opt.Fuse == nil {
			opt.Fuse = []string{"none"}
		}
	}
	b, err := compile.Build(model, apps, opt)
	if err != nil {
		t.Fatalf("%s: %v", c.name, err)
	}
	normalizePaths(b)
	if *dumpBundles != "" {
		data, err := json.MarshalIndent(b, "", " ")
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(*dumpBundles, c.name+".json"), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	parts := []struct {
		name string
		v    any
	}{{"manifest", b.Manifest}, {"kernels", b.Kernels}, {"templates", b.Templates}, {"params", b.Params}, {"tokenizer", b.Tokenizer}, {"weights", b.Weights}}
	all := sha256.New()
	var out []string
	for _, p := range parts {
		data, ok := p.v.([]byte)
		if !ok {
			if data, err = json.Marshal(p.v); err != nil {
				t.Fatalf("%s: %s: %v", c.name, p.name, err)
			}
		}
		fmt.Fprintf(all, "%d\n", len(data))
		all.Write(data)
		out = append(out, fmt.Sprintf("%s=%s", p.name, short(data)))
	}
	return hex.EncodeToString(all.Sum(nil))[:16] + " " + strings.Join(out, " ")
}

func short(data []byte) string {
	s := sha256.Sum256(data)
	return hex.EncodeToString(s[:6])
}

// normalizePaths replaces the file paths a bundle records by what does not depend on where
// the checkout (or the test's temporary directory) is: their base names.
func normalizePaths(b *bundle.Bundle) {
	for i := range b.Manifest.Apps {
		b.Manifest.Apps[i].Source = filepath.Base(b.Manifest.Apps[i].Source)
	}
	if p := b.Manifest.Weights.Path; p != "" {
		b.Manifest.Weights.Path = filepath.Base(p)
	}
}
