package testsuite

import (
	"reflect"
	"slices"
	"testing"

	"xmix/bundle"
	"xmix/compile"
)

// TestCopyGemmKernels: the Llama-3.1-8B bundle carries copy-engine GEMMs (bundle.OpGemmCopy)
// for exactly the GEMMs they were measured faster on, o, q/k/v and down of its buckets of 8
// to 64 rows (the 1, 2 and 4 rows buckets' GEMMs are GEMVs; 8 and 16 rows in the mma.sync
// form, 32 and 64 in the warpgroup form; 128 and more keep the library), each well-formed;
// Llama-3.2-1B's (narrower, not measured) carries none.
func TestCopyGemmKernels(t *testing.T) {
	for _, c := range []struct {
		model string
		want  [][3]int // K, N, rows
	}{
		{"../specs/models/llama-3.1-8b.yaml", [][3]int{
			{4096, 4096, 8}, {4096, 4096, 16}, {4096, 4096, 32}, {4096, 4096, 64},
			{4096, 6144, 8}, {4096, 6144, 16}, {4096, 6144, 32}, {4096, 6144, 64},
			{14336, 4096, 8}, {14336, 4096, 16}, {14336, 4096, 32}, {14336, 4096, 64},
		}},
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
		var got [][3]int
		for kn, ks := range kernels {
			for _, k := range ks {
				got = append(got, [3]int{kn[0], kn[1], k.Attrs.Rows})
				if k.Attrs.Grid*64/k.Attrs.Cluster != kn[1] {
					t.Errorf("%s: %s: attributes %+v", c.model, k.Kernel, k.Attrs)
				}
			}
		}
		slices.SortFunc(got, func(a, b [3]int) int { return (a[0]-b[0])*1e6 + (a[1]-b[1])*100 + a[2] - b[2] })
		if !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s: copy-engine GEMMs for (K, N, rows) %v, want %v", c.model, got, c.want)
		}
	}
}
