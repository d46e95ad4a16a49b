package testsuite

import (
	"reflect"
	"slices"
	"testing"

	"xmix/bundle"
	"xmix/compile"
)

// TestCopyGemmKernels: the Llama-3.1-8B bundle carries copy-engine GEMMs (bundle.OpGemmCopy)
// for exactly the GEMMs they were measured faster on, o, q/k/v and down of its 8-row bucket,
// each well-formed; Llama-3.2-1B's (narrower, not measured) carries none.
func TestCopyGemmKernels(t *testing.T) {
	for _, c := range []struct {
		model string
		want  [][2]int // K, N
	}{
		{"../specs/models/llama-3.1-8b.yaml", [][2]int{{4096, 4096}, {4096, 6144}, {14336, 4096}}},
		{"../specs/models/llama-3.2-1b.yaml", nil},
	} {
		b, err := compile.Build(c.model, nil, compile.Options{})
		if err != nil {
			t.Fatal(err)
		}
		kernels, err := bundle.GemmCopyKernels(b.Kernels)
		if err != nil {
			t.Fatalf("%s: %v", c.model, err)
		}
		var got [][2]int
		for kn, k := range kernels {
			got = append(got, kn)
			if k.Attrs.Rows != 8 || k.Attrs.Grid*64/k.Attrs.Cluster != kn[1] {
				t.Errorf("%s: %s: attributes %+v", c.model, k.Kernel, k.Attrs)
			}
		}
		slices.SortFunc(got, func(a, b [2]int) int { return a[0]*1e6 + a[1] - b[0]*1e6 - b[1] })
		if !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s: copy-engine GEMMs for (K, N) %v, want %v", c.model, got, c.want)
		}
	}
}
