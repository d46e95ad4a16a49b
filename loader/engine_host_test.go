package loader_test

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"testing"
	"time"

	"xmix/bundle"
	"xmix/loader"
	"xmix/testsuite"
)

// nullBackend runs nothing: with it the engine's own work per step (batch assembly, control
// writes, sampled tokens, exports) is all that a benchmark times.
type nullBackend struct{ sizes map[string]int64 }

func newNullBackend(b *bundle.Bundle) (*nullBackend, error) {
	be := &nullBackend{sizes: map[string]int64{}}
	for _, buf := range b.Manifest.Buffers {
		n, err := loader.BufferBytes(buf)
		if err != nil {
			return nil, err
		}
		be.sizes[buf.Name] = n
	}
	return be, nil
}

func (be *nullBackend) Name() string { return "null" }
func (be *nullBackend) Write(name string, off int64, data []byte) error {
	if off+int64(len(data)) > be.sizes[name] {
		return fmt.Errorf("write past %s", name)
	}
	return nil
}
func (be *nullBackend) Read(name string, dst []byte) error {
	if int64(len(dst)) > be.sizes[name] {
		return fmt.Errorf("read past %s", name)
	}
	clear(dst)
	return nil
}
func (be *nullBackend) Step(int) error { return nil }
func (be *nullBackend) Close() error   { return nil }

// BenchmarkEngineHostStep: the decode loop's host work per step on Llama-3.1-8B's shape with
// the six shipped apps deployed, for requests that enable none, one of the two apps that
// export a value per row (hallucination-probe also keeping its generated tokens' reads only,
// as xmix serve asks by default), or all six; 64 requests of 200 prompt tokens and 128
// generated ones (prefill chunks and full decode batches). Reported as host microseconds per step.
func BenchmarkEngineHostStep(b *testing.B) { benchShippedApps(b, 64) }

// BenchmarkEngineHostStepBurst: the same for 256 requests, the size of apps.sh's online burst
// (250 requests at once), where every decode step runs the largest bucket.
func BenchmarkEngineHostStepBurst(b *testing.B) { benchShippedApps(b, 256) }

func benchShippedApps(b *testing.B, requests int) {
	bun := compileWithApps(b, "specs/apps/app[1-6]-*.yaml", 6)
	reqs := func(apps []string) []loader.Request {
		rng := rand.New(rand.NewPCG(1, 2))
		var reqs []loader.Request
		for range requests {
			p := make([]int, 200)
			for i := range p {
				p[i] = rng.IntN(1000) + 1000
			}
			reqs = append(reqs, loader.Request{Prompt: p, Apps: apps, MaxTokens: 128})
		}
		return reqs
	}
	benchHostSteps(b, bun, reqs, map[string]hostCase{
		"none":                       {},
		"hallucination-probe":        {apps: []string{"hallucination-probe"}},
		"hallucination-probe-tokens": {apps: []string{"hallucination-probe"}, tokenExportsOnly: true},
		"conditional-refusal":        {apps: []string{"conditional-refusal"}},
		"all-six":                    {apps: []string{"refusal-ablation", "seal", "conditional-refusal", "hallucination-probe", "sake", "side-effect-free"}},
	})
}

// BenchmarkEngineHostStepWideExport: the same for the nnsight grid bundle (specs/apps/grid)
// with nothing enabled and with "capture every layer" (32 x 4096 floats per token), on 8
// requests of 512 prompt tokens and 32 generated ones: the grid rows' shape in
// testsuite/gpu/apps.sh; capture-all-tokens keeps the generated tokens' reads only
// (Request.TokenExportsOnly, as xmix serve asks unless a request wants prompt_exports).
func BenchmarkEngineHostStepWideExport(b *testing.B) {
	bun := compileWithApps(b, "specs/apps/grid/*.yaml", 8)
	reqs := func(apps []string) []loader.Request {
		var reqs []loader.Request
		for i := range 8 {
			p := make([]int, 512)
			for j := range p {
				p[j] = 1000 + (i*512+j)%1000
			}
			reqs = append(reqs, loader.Request{Prompt: p, Apps: apps, MaxTokens: 32})
		}
		return reqs
	}
	capture := []string{"grid-capture-all"}
	benchHostSteps(b, bun, reqs, map[string]hostCase{"none": {}, "capture-all": {apps: capture},
		"capture-all-tokens": {apps: capture, tokenExportsOnly: true}})
}

// compileWithApps compiles Llama-3.1-8B's spec with the app specs that glob (relative to the
// repository root) names; want is how many it must find.
func compileWithApps(b *testing.B, glob string, want int) *bundle.Bundle {
	read := func(p string) string {
		s, err := os.ReadFile(filepath.Join("..", p))
		if err != nil {
			b.Fatal(err)
		}
		return string(s)
	}
	apps, err := filepath.Glob(filepath.Join("..", glob))
	if err != nil || len(apps) != want {
		b.Fatalf("%s: %v (%v), want %d specs", glob, apps, err, want)
	}
	var specs []string
	for _, a := range apps {
		specs = append(specs, read(a[3:]))
	}
	return testsuite.Compile(b, read("specs/models/llama-3.1-8b.yaml"), specs...)
}

// hostCase is one case of benchHostSteps: the apps its requests enable, and whether they
// keep their generated tokens' reads only.
type hostCase struct {
	apps             []string
	tokenExportsOnly bool
}

// benchHostSteps runs one sub-benchmark per case: Generate on a fresh engine over the null
// backend, reported as host microseconds per step.
func benchHostSteps(b *testing.B, bun *bundle.Bundle, reqs func(apps []string) []loader.Request, cases map[string]hostCase) {
	names := make([]string, 0, len(cases))
	for name := range cases {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		b.Run(name, func(b *testing.B) {
			var steps int
			var host time.Duration
			for b.Loop() {
				be, err := newNullBackend(bun)
				if err != nil {
					b.Fatal(err)
				}
				eng, err := loader.NewEngine(bun, be)
				if err != nil {
					b.Fatal(err)
				}
				rs := reqs(cases[name].apps)
				for i := range rs {
					rs[i].TokenExportsOnly = cases[name].tokenExportsOnly
				}
				runtime.GC() // the last iteration's garbage is not this one's cost
				start := time.Now()
				if _, err := eng.Generate(rs); err != nil {
					b.Fatal(err)
				}
				host += time.Since(start)
				steps += eng.Stats.Steps
			}
			b.ReportMetric(float64(host.Microseconds())/float64(steps), "us/step")
		})
	}
}
