package loader_test

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
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
// the six shipped apps deployed, for requests that enable none, one app that exports a value
// per token, or all six; 64 requests of 200 prompt tokens and 128 generated ones (prefill
// chunks and full decode batches). Reported as host microseconds per step.
func BenchmarkEngineHostStep(b *testing.B) {
	read := func(p string) string {
		s, err := os.ReadFile(filepath.Join("..", p))
		if err != nil {
			b.Fatal(err)
		}
		return string(s)
	}
	apps, err := filepath.Glob("../specs/apps/app[1-6]-*.yaml")
	if err != nil || len(apps) != 6 {
		b.Fatalf("apps %v: %v", apps, err)
	}
	var specs []string
	for _, a := range apps {
		specs = append(specs, read(a[3:]))
	}
	bun := testsuite.Compile(b, read("specs/models/llama-3.1-8b.yaml"), specs...)
	for _, c := range []struct {
		name string
		apps []string
	}{
		{"none", nil},
		{"hallucination-probe", []string{"hallucination-probe"}},
		{"all-six", []string{"refusal-ablation", "seal", "conditional-refusal", "hallucination-probe", "sake", "side-effect-free"}},
	} {
		b.Run(c.name, func(b *testing.B) {
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
				rng := rand.New(rand.NewPCG(1, 2))
				var reqs []loader.Request
				for range 64 {
					p := make([]int, 200)
					for i := range p {
						p[i] = rng.IntN(1000) + 1000
					}
					reqs = append(reqs, loader.Request{Prompt: p, Apps: c.apps, MaxTokens: 128})
				}
				runtime.GC() // the last iteration's garbage is not this one's cost
				start := time.Now()
				if _, err := eng.Generate(reqs); err != nil {
					b.Fatal(err)
				}
				host += time.Since(start)
				steps += eng.Stats.Steps
			}
			b.ReportMetric(float64(host.Microseconds())/float64(steps), "us/step")
		})
	}
}
