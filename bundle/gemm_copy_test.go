package bundle

import (
	"strings"
	"testing"
)

// TestGemmCopyKernels: well-formed copy-engine GEMMs are indexed by K and N; a malformed one
// is an error naming the kernel and what is wrong.
func TestGemmCopyKernels(t *testing.T) {
	params := []Param{{GemmX, "u64"}, {GemmWMap, TensorMapParam}, {GemmY, "u64"}, {GemmRows, "u32"}}
	good := `{"k":4096,"n":4096,"rows":8,"box":[256,64],"grid":128,"cluster":2,"block":512,"shared":166528}`
	kern := func(name, attrs string, p []Param) Kernel {
		return Kernel{Name: name, Op: OpGemmCopy, Attrs: []byte(attrs), Params: p}
	}
	got, err := GemmCopyKernels([]Kernel{kern("a", good, params), {Name: "other", Op: OpGemmTC}})
	if err != nil || len(got) != 1 || got[[2]int{4096, 4096}].Kernel != "a" {
		t.Fatalf("%v, %v", got, err)
	}
	for _, c := range []struct {
		name string
		ks   []Kernel
		want string
	}{
		{"bad JSON", []Kernel{kern("a", `{"k":`, params)}, "kernel a: copy-engine GEMM attributes"},
		{"grid not a multiple of the cluster", []Kernel{kern("a", strings.Replace(good, `"grid":128`, `"grid":127`, 1), params)}, "a multiple of cluster"},
		{"too much shared memory", []Kernel{kern("a", strings.Replace(good, `"shared":166528`, `"shared":300000`, 1), params)}, "shared (at most"},
		{"zero rows", []Kernel{kern("a", strings.Replace(good, `"rows":8`, `"rows":0`, 1), params)}, "want positive"},
		{"map as a pointer", []Kernel{kern("a", good, []Param{{GemmX, "u64"}, {GemmWMap, "u64"}, {GemmY, "u64"}, {GemmRows, "u32"}})}, "takes parameters"},
		{"two for one shape", []Kernel{kern("a", good, params), kern("b", good, params)}, "kernel b: a second copy-engine GEMM"},
	} {
		if _, err := GemmCopyKernels(c.ks); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", c.name, err, c.want)
		}
	}
}
