package testsuite

import (
	"cmp"
	"reflect"
	"slices"
	"strings"
	"testing"

	"xmix/bundle"
	"xmix/codegen"
	"xmix/compile"
)

// TestCopyGemmKernels: the Llama-3.1-8B bundle carries copy-engine GEMMs (bundle.OpGemmCopy)
// for exactly the GEMMs they were measured faster on, o, q/k/v and down of its buckets of 8
// to 64 rows and o and down of its 128-row bucket (the 1, 2 and 4 rows buckets' GEMMs are
// GEMVs; 8 and 16 rows in the mma.sync form, 32 to 128 in the warpgroup form; 256 keeps the
// library), each well-formed;
// Llama-3.2-1B's for its o, q/k/v and down in its buckets of 8 to 32 rows, where they were
// faster (codegen's copyGemmShapes); built with row counts named (--copy-gemm-rows 16), only
// the 1B's buckets of those rows get them. By default (--gated-copy-rows 128) both also carry
// one for the gate/up GEMM and SiLU at 64 and 128 rows, and the 1B at 32 too (the 8-row
// bucket's gate/up is the bundle's own gated kernel; the 16-row bucket, which has no gated
// kernel of its own, runs the 64-row one, and so does the 8B's 32-row bucket, where it runs
// 128 CTAs against its own kernel's 112: --gated-copy-wide auto); built with
// --gated-copy-rows 0, neither does. By default (--rope-copy-rows 32) both also carry
// one for q/k/v with its rope_kv at 32 rows; with --rope-copy-rows 0, none. Those bounds are on
// the kernels' rows: a build of 128-row kernels alone carries gated ones only with
// --gated-copy-rows 128 (the default), in the wide form (a CTA's 112 columns of gate and of up).
// With --gated-copy-wide own the 8B carries its 32-row gated kernel too, with all the 1B its
// wide ones alone.
func TestCopyGemmKernels(t *testing.T) {
	type kernel struct {
		k, n, rows int
		act        string
	}
	plain8B := []kernel{
		{4096, 4096, 8, ""}, {4096, 4096, 16, ""}, {4096, 4096, 32, ""}, {4096, 4096, 64, ""},
		{4096, 6144, 8, ""}, {4096, 6144, 16, ""}, {4096, 6144, 32, ""}, {4096, 6144, 64, ""},
		{14336, 4096, 8, ""}, {14336, 4096, 16, ""}, {14336, 4096, 32, ""}, {14336, 4096, 64, ""},
		{4096, 4096, 128, ""}, {14336, 4096, 128, ""},
	}
	plain8B128 := []kernel{{4096, 4096, 128, ""}, {4096, 6144, 128, ""}, {14336, 4096, 128, ""}}
	plain1B := []kernel{
		{2048, 2048, 8, ""}, {2048, 2048, 16, ""}, {2048, 2048, 32, ""},
		{2048, 3072, 8, ""}, {2048, 3072, 16, ""}, {2048, 3072, 32, ""},
		{8192, 2048, 8, ""}, {8192, 2048, 16, ""}, {8192, 2048, 32, ""},
	}
	// Each model's q/k/v with its rope_kv at 32 rows (--rope-copy-rows 32, the default).
	rope8B, rope1B := []kernel{{4096, 6144, 32, "rope_kv"}}, []kernel{{2048, 3072, 32, "rope_kv"}}
	gated8B := []kernel{{4096, 28672, 32, "silu_mul"}, {4096, 28672, 64, "silu_mul"}, {4096, 28672, 128, "silu_mul"}}
	gated1B := []kernel{{2048, 16384, 32, "silu_mul"}, {2048, 16384, 64, "silu_mul"}, {2048, 16384, 128, "silu_mul"}}
	for _, c := range []struct {
		model string
		opt   compile.Options
		want  []kernel
	}{
		{"../specs/models/llama-3.1-8b.yaml", compile.Options{GatedCopyRows: -1, RopeCopyRows: -1}, plain8B},
		{"../specs/models/llama-3.1-8b.yaml", compile.Options{RopeCopyRows: -1}, slices.Concat(plain8B, gated8B[1:])},
		{"../specs/models/llama-3.1-8b.yaml", compile.Options{GatedCopyRows: -1}, slices.Concat(plain8B, rope8B)},
		{"../specs/models/llama-3.1-8b.yaml", compile.Options{}, slices.Concat(plain8B, gated8B[1:], rope8B)},
		// The wide form (--copy-gemm-wide) serves the same GEMMs at 64 and 128 rows.
		{"../specs/models/llama-3.1-8b.yaml", compile.Options{CopyGemmWide: true}, slices.Concat(plain8B, gated8B[1:], rope8B)},
		{"../specs/models/llama-3.1-8b.yaml", compile.Options{GatedCopyWide: codegen.GatedWideOwn}, slices.Concat(plain8B, gated8B, rope8B)},
		{"../specs/models/llama-3.2-1b.yaml", compile.Options{GatedCopyRows: -1, RopeCopyRows: -1}, plain1B},
		{"../specs/models/llama-3.2-1b.yaml", compile.Options{}, slices.Concat(plain1B, gated1B, rope1B)},
		{"../specs/models/llama-3.2-1b.yaml", compile.Options{GatedCopyWide: codegen.GatedWideAll}, slices.Concat(plain1B, gated1B[1:], rope1B)},
		// Row counts a build names go to every default shape, past the buckets measured.
		{"../specs/models/llama-3.2-1b.yaml", compile.Options{CopyGemmRows: []int{16}, GatedCopyRows: -1}, []kernel{{2048, 2048, 16, ""}, {2048, 3072, 16, ""}, {8192, 2048, 16, ""}}},
		// The epilogues' row bounds hold for the kernels' rows, not the buckets': with 128-row
		// kernels alone the 32-row bucket gets no gated or rope kernel (the backend would serve
		// the 128-row bucket with it), unless --gated-copy-rows reaches 128.
		{"../specs/models/llama-3.1-8b.yaml", compile.Options{CopyGemmRows: []int{128}, GatedCopyRows: 64}, plain8B128},
		{"../specs/models/llama-3.1-8b.yaml", compile.Options{CopyGemmRows: []int{128}}, append(slices.Clone(plain8B128), kernel{4096, 28672, 128, "silu_mul"})},
	} {
		b, err := compile.Build(c.model, nil, c.opt)
		if err != nil {
			t.Fatal(err)
		}
		kernels, err := bundle.GemmCopyKernels(b.Kernels)
		if err != nil {
			t.Fatalf("%s: %v", c.model, err)
		}
		var got []kernel
		for kn, ks := range kernels {
			for _, k := range ks {
				got = append(got, kernel{kn.K, kn.N, k.Attrs.Rows, kn.Act})
				// A cluster splits K (its CTAs on the same columns) or, in the 128-row layout,
				// shares x (each CTA on its own columns). A CTA's W rows are its boxes' rows, two
				// boxes (gate's and up's, or a head's two halves) with an epilogue: 64, or in the
				// gated kernel's wide form (64 and 128 rows) 224.
				wRows := k.Attrs.Box[1]
				if kn.Act != "" {
					wRows *= 2
				}
				if cols := k.Attrs.Grid * max(k.Attrs.Tiles, 1) * wRows; cols != kn.N*k.Attrs.Cluster && (cols != kn.N || k.Attrs.Rows != 128) {
					t.Errorf("%s: %s: attributes %+v", c.model, k.Kernel, k.Attrs)
				}
			}
		}
		order := func(a, b kernel) int {
			return cmp.Or((a.k-b.k)*1e6+(a.n-b.n)*100+a.rows-b.rows, strings.Compare(a.act, b.act))
		}
		slices.SortFunc(got, order)
		slices.SortFunc(c.want, order)
		if !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s, gated copy rows %d, rope copy rows %d: copy-engine GEMMs %v, want %v", c.model, c.opt.GatedCopyRows, c.opt.RopeCopyRows, got, c.want)
		}
	}
}
