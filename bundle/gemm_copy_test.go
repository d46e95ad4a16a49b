package bundle

import (
	"fmt"
	"reflect"
	"strings"
	"testing"
)

// TestGemmCopyKernels: well-formed copy-engine GEMMs are indexed by K and N, fewest rows
// first, and a node of m rows gets the one of the fewest rows that takes m; a malformed one
// is an error naming the kernel and what is wrong.
func TestGemmCopyKernels(t *testing.T) {
	params := []Param{{GemmXMap, TensorMapParam}, {GemmWMap, TensorMapParam}, {GemmY, "u64"}, {GemmRows, "u32"}}
	good := `{"k":4096,"n":4096,"rows":8,"box":[64,64],"swizzle":128,"x_box":[256,32],"grid":128,"cluster":2,"block":512,"shared":166528}`
	kern := func(name, attrs string, p []Param) Kernel {
		return Kernel{Name: name, Op: OpGemmCopy, Attrs: []byte(attrs), Params: p}
	}
	rows32 := strings.Replace(good, `"rows":8`, `"rows":32`, 1)
	got, err := GemmCopyKernels([]Kernel{kern("a32", rows32, params), kern("a", good, params), {Name: "other", Op: OpGemmTC}})
	if err != nil || len(got) != 1 || len(got[[2]int{4096, 4096}]) != 2 {
		t.Fatalf("%v, %v", got, err)
	}
	for _, c := range []struct {
		m    int
		want string
	}{{1, "a"}, {8, "a"}, {9, "a32"}, {32, "a32"}, {33, ""}} {
		k, ok := GemmCopyFor(got[[2]int{4096, 4096}], c.m)
		if k.Kernel != c.want || ok != (c.want != "") {
			t.Errorf("%d rows: kernel %q (%v), want %q", c.m, k.Kernel, ok, c.want)
		}
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
		{"swizzle of 64 bytes", []Kernel{kern("a", strings.Replace(good, `"swizzle":128`, `"swizzle":64`, 1), params)}, "swizzle 64 over box rows of 128 bytes"},
		{"swizzled rows too long", []Kernel{kern("a", strings.Replace(good, `"box":[64,64]`, `"box":[256,64]`, 1), params)}, "swizzle 128 over box rows of 512 bytes"},
		{"x swizzled over f32 rows of 256 K", []Kernel{kern("a", strings.Replace(good, `"x_box":[256,32]`, `"x_box":[256,32],"x_swizzle":128`, 1), params)}, "x swizzle 128 over box rows of 1024 bytes"},
		{"x box of fewer rows", []Kernel{kern("a", strings.Replace(rows32, `"x_box":[256,32]`, `"x_box":[256,16]`, 1), params)}, "x_box (of at least rows rows)"},
		{"map as a pointer", []Kernel{kern("a", good, []Param{{GemmXMap, TensorMapParam}, {GemmWMap, "u64"}, {GemmY, "u64"}, {GemmRows, "u32"}})}, "takes parameters"},
		{"two for one shape and rows", []Kernel{kern("a", good, params), kern("b", good, params)}, "kernel b: a second copy-engine GEMM"},
	} {
		if _, err := GemmCopyKernels(c.ks); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", c.name, err, c.want)
		}
	}
}

// TestParseGemmShapes: "KxN" entries in order, "none" alone as no shapes; anything else is
// an error naming the entry.
func TestParseGemmShapes(t *testing.T) {
	got, err := ParseGemmShapes([]string{"4096x28672", "14336x4096"})
	if err != nil || !reflect.DeepEqual(got, [][2]int{{4096, 28672}, {14336, 4096}}) {
		t.Fatalf("%v, %v", got, err)
	}
	if got, err := ParseGemmShapes([]string{"none"}); err != nil || got == nil || len(got) != 0 {
		t.Fatalf("none: %v, %v", got, err)
	}
	for _, bad := range []string{"4096", "x4096", "4096x", "-1x64", "64x0", "64x64x8", "64 x64", "064x64", "none"} {
		list := []string{bad}
		if bad == "none" {
			list = []string{"64x64", "none"}
		}
		if _, err := ParseGemmShapes(list); err == nil || !strings.Contains(err.Error(), fmt.Sprintf("GEMM shape %q", bad)) {
			t.Errorf("%v: %v", list, err)
		}
	}
}
