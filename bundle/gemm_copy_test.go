package bundle

import (
	"fmt"
	"reflect"
	"slices"
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
	if err != nil || len(got) != 1 || len(got[GemmCopyShape{K: 4096, N: 4096}]) != 2 {
		t.Fatalf("%v, %v", got, err)
	}
	// A cluster of 2 may share x, each CTA asking for its half of the rows.
	if _, err := GemmCopyKernels([]Kernel{kern("a", strings.Replace(rows32, `"x_box":[256,32]`, `"x_box":[256,16]`, 1), params)}); err != nil {
		t.Errorf("x boxes of 16 rows for 32 over a cluster of 2: %v", err)
	}
	for _, c := range []struct {
		m    int
		want string
	}{{1, "a"}, {8, "a"}, {9, "a32"}, {32, "a32"}, {33, ""}} {
		k, ok := GemmCopyFor(got[GemmCopyShape{K: 4096, N: 4096}], c.m)
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
		{"negative tiles", []Kernel{kern("a", strings.Replace(good, `"shared":166528`, `"shared":166528,"tiles":-1`, 1), params)}, "tiles not negative"},
		{"zero rows", []Kernel{kern("a", strings.Replace(good, `"rows":8`, `"rows":0`, 1), params)}, "want positive"},
		{"swizzle of 64 bytes", []Kernel{kern("a", strings.Replace(good, `"swizzle":128`, `"swizzle":64`, 1), params)}, "swizzle 64 over box rows of 128 bytes"},
		{"swizzled rows too long", []Kernel{kern("a", strings.Replace(good, `"box":[64,64]`, `"box":[256,64]`, 1), params)}, "swizzle 128 over box rows of 512 bytes"},
		{"x swizzled over f32 rows of 256 K", []Kernel{kern("a", strings.Replace(good, `"x_box":[256,32]`, `"x_box":[256,32],"x_swizzle":128`, 1), params)}, "x swizzle 128 over box rows of 1024 bytes"},
		{"x box of fewer rows", []Kernel{kern("a", strings.Replace(rows32, `"x_box":[256,32]`, `"x_box":[256,8]`, 1), params)}, "x_box (of at least rows rows over the cluster's CTAs)"},
		{"map as a pointer", []Kernel{kern("a", good, []Param{{GemmXMap, TensorMapParam}, {GemmWMap, "u64"}, {GemmY, "u64"}, {GemmRows, "u32"}})}, "takes parameters"},
		{"two for one shape and rows", []Kernel{kern("a", good, params), kern("b", good, params)}, "kernel b: a second copy-engine GEMM"},
	} {
		if _, err := GemmCopyKernels(c.ks); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", c.name, err, c.want)
		}
	}
}

// TestGatedCopyFor: a gated pair takes the kernel of the fewest rows that takes its own, and
// none of twice its rows or more, unless that kernel is in the wide form.
func TestGatedCopyFor(t *testing.T) {
	kernels := []GemmCopy{{Kernel: "r32", Attrs: GemmCopyAttrs{Rows: 32}}, {Kernel: "r64", Attrs: GemmCopyAttrs{Rows: 64}}}
	wide := []GemmCopy{{Kernel: "w64", Attrs: GemmCopyAttrs{Rows: 64, Wide: 112}}, {Kernel: "w128", Attrs: GemmCopyAttrs{Rows: 128, Wide: 112}}}
	for _, c := range []struct {
		kernels []GemmCopy
		rows    int
		want    string
	}{{kernels, 8, ""}, {kernels, 16, ""}, {kernels, 17, "r32"}, {kernels, 32, "r32"}, {kernels, 33, "r64"}, {kernels, 64, "r64"}, {kernels, 65, ""},
		{wide, 8, "w64"}, {wide, 32, "w64"}, {wide, 65, "w128"}, {wide, 129, ""}} {
		got, ok := GatedCopyFor(c.kernels, c.rows)
		if ok != (c.want != "") || ok && got.Kernel != c.want {
			t.Errorf("%d rows: %q %v, want %q", c.rows, got.Kernel, ok, c.want)
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

// TestGemmCopyKernelsWithActivation: a copy-engine GEMM with an activation is indexed apart
// from the plain one of its K and N; an unknown activation or an odd width is an error.
func TestGemmCopyKernelsWithActivation(t *testing.T) {
	params := []Param{{GemmXMap, TensorMapParam}, {GemmWMap, TensorMapParam}, {GemmY, "u64"}, {GemmRows, "u32"}}
	plain := `{"k":4096,"n":28672,"rows":32,"box":[64,64],"swizzle":128,"x_box":[64,32],"x_bf16":true,"x_swizzle":128,"grid":448,"cluster":1,"block":128,"shared":148480}`
	gated := strings.Replace(strings.Replace(plain, `"box":[64,64]`, `"box":[64,32]`, 1), `"shared"`, `"act":"silu_mul","shared"`, 1)
	kern := func(name, attrs string) Kernel {
		return Kernel{Name: name, Op: OpGemmCopy, Attrs: []byte(attrs), Params: params}
	}
	got, err := GemmCopyKernels([]Kernel{kern("plain", plain), kern("gated", gated)})
	if err != nil {
		t.Fatal(err)
	}
	if k := got[GemmCopyShape{K: 4096, N: 28672}]; len(k) != 1 || k[0].Kernel != "plain" {
		t.Errorf("plain: %v", k)
	}
	if k := got[GemmCopyShape{K: 4096, N: 28672, Act: "silu_mul"}]; len(k) != 1 || k[0].Kernel != "gated" || k[0].Attrs.Box != [2]int{64, 32} {
		t.Errorf("gated: %v", k)
	}
	for _, c := range []struct{ name, attrs, want string }{
		{"unknown activation", strings.Replace(gated, "silu_mul", "relu", 1), `activation "relu" over 28672 columns`},
		{"odd width", strings.Replace(gated, `"n":28672`, `"n":28673`, 1), `activation "silu_mul" over 28673 columns`},
	} {
		if _, err := GemmCopyKernels([]Kernel{kern("a", c.attrs)}); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", c.name, err, c.want)
		}
	}
	if _, err := GemmCopyKernels([]Kernel{kern("a", gated), kern("b", gated)}); err == nil || !strings.Contains(err.Error(), "kernel b: a second copy-engine GEMM for k 4096, n 28672 with silu_mul, 32 rows") {
		t.Errorf("two gated for one shape: %v", err)
	}
	// y_bf16: a parameter more, after rows, and only with an activation.
	withYB := strings.Replace(gated, `"shared"`, `"y_bf16":true,"shared"`, 1)
	ybParams := append(slices.Clone(params), Param{GemmYBF16, "u64"})
	got, err = GemmCopyKernels([]Kernel{{Name: "yb", Op: OpGemmCopy, Attrs: []byte(withYB), Params: ybParams}})
	if k := got[GemmCopyShape{K: 4096, N: 28672, Act: "silu_mul"}]; err != nil || len(k) != 1 || !k[0].Attrs.YBF16 {
		t.Errorf("y_bf16: %v %v", k, err)
	}
	for _, c := range []struct {
		name, attrs string
		params      []Param
		want        string
	}{
		{"y_bf16 without its parameter", withYB, params, "takes parameters"},
		{"its parameter without y_bf16", gated, ybParams, "takes parameters"},
		{"y_bf16 without an activation", strings.Replace(plain, `"shared"`, `"y_bf16":true,"shared"`, 1), ybParams, "y_bf16 without an activation"},
	} {
		if _, err := GemmCopyKernels([]Kernel{{Name: "a", Op: OpGemmCopy, Attrs: []byte(c.attrs), Params: c.params}}); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", c.name, err, c.want)
		}
	}
}

// TestGatedPairAt: a GEMM node and the plain gated activation of its y are a pair; an
// activation with MI ops, another y, other rows, a guarded GEMM, a skipping node, the last
// node of the list, a third node naming the GEMM's y, or an activation whose node passes
// act_bf16 or gu_bf16 anything but the constant 0 (the backend's to set) are not.
func TestGatedPairAt(t *testing.T) {
	kernels := map[string]Kernel{
		"gemm": {Name: "gemm", Op: OpGemmTC, Attrs: []byte(`{"k":64,"n":256}`), Params: []Param{{GemmX, "u64"}, {GemmW, "u64"}, {GemmY, "u64"}, {GemmRows, "u32"}}},
		"act":  {Name: "act", Op: "silu_mul", Attrs: []byte(`{"inter":128,"chunked":true}`), Params: gatedActParams},
		"actmi": {Name: "actmi", Op: "silu_mul", Attrs: []byte(`{"inter":128,"chunked":true,"ops":[{"kind":"steer"}]}`),
			Params: gatedActParams},
		"norm": {Name: "norm", Op: "rms_norm", Params: []Param{{"x", "u64"}}},
	}
	kernel := func(name string) Kernel { return kernels[name] }
	gemm := func(y string, rows uint64) Node {
		return Node{Label: "gate_up", Kernel: "gemm", Args: []Slot{{Buffer: "x"}, {Buffer: "w"}, {Buffer: y}, {Const: rows}}}
	}
	act := func(kernel, gu string, rows int) Node {
		return Node{Label: "act", Kernel: kernel, Grid: [3]int{1, rows, 1}, Args: []Slot{{Buffer: gu}, {Buffer: "a"}, {}, {}}}
	}
	g, a, ok, err := GatedPairAt([]Node{gemm("gu", 32), act("act", "gu", 32)}, 0, kernel)
	if err != nil || !ok || g.M != 32 || g.N != 256 || a.Op != "silu_mul" || a.Inter != 128 || a.Act != (Slot{Buffer: "a"}) {
		t.Fatalf("pair: %+v %+v %v %v", g, a, ok, err)
	}
	guarded := gemm("gu", 32)
	kernels["gemmg"] = Kernel{Name: "gemmg", Op: OpGemmTC, Attrs: []byte(`{"k":64,"n":256,"guard":1}`), Params: kernels["gemm"].Params}
	guarded.Kernel = "gemmg"
	skipping := act("act", "gu", 32)
	skipping.SkipUnless = 1
	reader := Node{Label: "norm", Kernel: "norm", Args: []Slot{{Buffer: "gu"}}}
	bf16Set := act("act", "gu", 32)
	bf16Set.Args[2] = Slot{Buffer: "ab"}
	guSet := act("act", "gu", 32)
	guSet.Args[3] = Slot{Buffer: "gu"}
	for _, c := range []struct {
		name  string
		nodes []Node
		i     int
	}{
		{"MI ops", []Node{gemm("gu", 32), act("actmi", "gu", 32)}, 0},
		{"another y", []Node{gemm("gu", 32), act("act", "other", 32)}, 0},
		{"other rows", []Node{gemm("gu", 32), act("act", "gu", 16)}, 0},
		{"guarded", []Node{guarded, act("act", "gu", 32)}, 0},
		{"skipping", []Node{gemm("gu", 32), skipping}, 0},
		{"last node", []Node{act("act", "gu", 32), gemm("gu", 32)}, 1},
		{"the activation first", []Node{act("act", "gu", 32), gemm("gu", 32)}, 0},
		{"another reader of y", []Node{gemm("gu", 32), act("act", "gu", 32), reader}, 0},
		{"act_bf16 set", []Node{gemm("gu", 32), bf16Set}, 0},
		{"gu_bf16 set", []Node{gemm("gu", 32), guSet}, 0},
	} {
		if _, _, ok, err := GatedPairAt(c.nodes, c.i, kernel); ok || err != nil {
			t.Errorf("%s: a pair (%v, %v)", c.name, ok, err)
		}
	}
	bad := gemm("gu", 32)
	bad.Args = bad.Args[:3]
	if _, _, _, err := GatedPairAt([]Node{bad, act("act", "gu", 32)}, 0, kernel); err == nil || !strings.Contains(err.Error(), "node gate_up: kernel gemm") {
		t.Errorf("malformed GEMM: %v", err)
	}

	// GatedPairs, asked of every node of one list, answers as GatedPairAt does: two layers'
	// pairs on one gu buffer, and the same list with a reader of gu after them (no pair then).
	layers := []Node{gemm("gu", 32), act("act", "gu", 32), reader, gemm("gu", 32), act("act", "gu", 32)}
	for _, nodes := range [][]Node{slices.Delete(slices.Clone(layers), 2, 3), layers} {
		pairs := NewGatedPairs(nodes, kernel)
		for i := range nodes {
			g, a, ok, err := pairs.At(i)
			wg, wa, wok, werr := GatedPairAt(nodes, i, kernel)
			if g != wg || a != wa || ok != wok || err != werr || ok != (len(nodes) == 4 && i%2 == 0) {
				t.Errorf("%d nodes, node %d: GatedPairs %v %v, GatedPairAt %v %v", len(nodes), i, ok, err, wok, werr)
			}
		}
		if !pairs.Of(nodes) || pairs.Of(slices.Clone(nodes)) || pairs.Of(nodes[:2]) {
			t.Errorf("%d nodes: Of takes a list other than its own, or not its own", len(nodes))
		}
	}
}

// TestGemmCopyKernelsWithRope: a copy-engine GEMM with rope_kv takes RopeKVParams after its
// own four and is indexed under Act OpRopeKV (boxes of 32 rows, or in the wide form of up to
// half a head); a rope whose row is not N wide, whose head's half is not a multiple of 32
// rows or not whole boxes of a multiple of 8 rows, or that carries an activation too, and one
// without the rope's parameters, are refused.
func TestGemmCopyKernelsWithRope(t *testing.T) {
	params := append([]Param{{GemmXMap, TensorMapParam}, {GemmWMap, TensorMapParam}, {GemmY, "u64"}, {GemmRows, "u32"}}, RopeKVParams...)
	rope := `{"k":4096,"n":6144,"rows":32,"box":[64,32],"swizzle":128,"x_box":[64,32],"x_bf16":true,"x_swizzle":128,"grid":96,"cluster":1,"block":128,"shared":148480,` +
		`"rope_kv":{"heads":32,"kv_heads":8,"head_dim":128,"block_size":16,"max_blocks_per_seq":8,"kv_dtype":"bf16"}}`
	kern := func(attrs string, params []Param) Kernel {
		return Kernel{Name: "r", Op: OpGemmCopy, Attrs: []byte(attrs), Params: params}
	}
	got, err := GemmCopyKernels([]Kernel{kern(rope, params)})
	if err != nil {
		t.Fatal(err)
	}
	if k := got[GemmCopyShape{K: 4096, N: 6144, Act: OpRopeKV}]; len(k) != 1 || k[0].Attrs.RopeKV == nil || k[0].Attrs.RopeKV.KVHeads != 8 {
		t.Errorf("rope: %v", got)
	}
	if _, err := GemmCopyKernels([]Kernel{kern(strings.Replace(rope, `"box":[64,32]`, `"box":[64,64]`, 1), params)}); err != nil {
		t.Errorf("boxes of half a head: %v", err)
	}
	for _, c := range []struct {
		name, attrs string
		params      []Param
		want        string
	}{
		{"row not n wide", strings.Replace(rope, `"kv_heads":8`, `"kv_heads":4`, 1), params, "want no activation, heads a positive multiple of kv_heads"},
		{"half of 32 rows", strings.Replace(rope, `"head_dim":128`, `"head_dim":96`, 1), params, "head_dim a multiple of 64"},
		{"an activation too", strings.Replace(rope, `"shared"`, `"act":"silu_mul","shared"`, 1), params, "want no activation"},
		{"boxes across a head's half", strings.Replace(rope, `"box":[64,32]`, `"box":[64,48]`, 1), params, "box rows a multiple of 8 dividing head_dim/2"},
		{"boxes of 4 rows", strings.Replace(rope, `"box":[64,32]`, `"box":[64,4]`, 1), params, "box rows a multiple of 8"},
		{"no rope parameters", rope, params[:4], "a copy-engine GEMM takes parameters"},
	} {
		if _, err := GemmCopyKernels([]Kernel{kern(c.attrs, c.params)}); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", c.name, err, c.want)
		}
	}
}

// TestRopePairAt: a GEMM node and the rope_kv of its y (no bias, no QK-norm) are a pair, read
// with the rope's shape and arguments; a rope with a bias, of another y, of other rows, not
// the q/k/v row's width, after a guarded GEMM, skipping, or the last node, is not.
func TestRopePairAt(t *testing.T) {
	ropeAttrs := `{"heads":4,"kv_heads":1,"head_dim":64,"block_size":16,"max_blocks_per_seq":4,"kv_dtype":"bf16"}`
	ropeParams := append([]Param{{"qkv", "u64"}}, RopeKVParams...)
	kernels := map[string]Kernel{
		"gemm":     {Name: "gemm", Op: OpGemmTC, Attrs: []byte(`{"k":64,"n":384}`), Params: []Param{{GemmX, "u64"}, {GemmW, "u64"}, {GemmY, "u64"}, {GemmRows, "u32"}}},
		"gemm512":  {Name: "gemm512", Op: OpGemmTC, Attrs: []byte(`{"k":64,"n":512}`), Params: []Param{{GemmX, "u64"}, {GemmW, "u64"}, {GemmY, "u64"}, {GemmRows, "u32"}}},
		"gemmg":    {Name: "gemmg", Op: OpGemmTC, Attrs: []byte(`{"k":64,"n":384,"guard":1}`), Params: []Param{{GemmX, "u64"}, {GemmW, "u64"}, {GemmY, "u64"}, {GemmRows, "u32"}}},
		"rope":     {Name: "rope", Op: OpRopeKV, Attrs: []byte(ropeAttrs), Params: ropeParams},
		"ropebias": {Name: "ropebias", Op: OpRopeKV, Attrs: []byte(strings.Replace(ropeAttrs, "}", `,"bias":true,"w_dtype":"bf16"}`, 1)), Params: append(slices.Clone(ropeParams), Param{"bias", "u64"})},
	}
	kernel := func(name string) Kernel { return kernels[name] }
	gemm := func(kernel, y string, rows uint64) Node {
		return Node{Label: "qkv", Kernel: kernel, Args: []Slot{{Buffer: "x"}, {Buffer: "w"}, {Buffer: y}, {Const: rows}}}
	}
	rope := func(kernel, qkv string, rows int) Node {
		args := []Slot{{Buffer: qkv}}
		for _, p := range kernels[kernel].Params[1:] {
			args = append(args, Slot{Buffer: p.Name})
		}
		return Node{Label: "rope", Kernel: kernel, Grid: [3]int{rows, 1, 1}, Args: args}
	}
	g, r, ok, err := RopePairAt([]Node{gemm("gemm", "qkv", 32), rope("rope", "qkv", 32)}, 0, kernel)
	if err != nil || !ok || g.M != 32 || g.N != 384 || r.Shape.Heads != 4 || r.Shape.KVDtype != "bf16" || len(r.Args) != len(RopeKVParams) || r.Args[6] != (Slot{Buffer: "vcache"}) {
		t.Fatalf("pair: %+v %+v %v %v", g, r, ok, err)
	}
	skipping := rope("rope", "qkv", 32)
	skipping.SkipUnless = 1
	for _, c := range []struct {
		name  string
		nodes []Node
		i     int
	}{
		{"a bias", []Node{gemm("gemm", "qkv", 32), rope("ropebias", "qkv", 32)}, 0},
		{"another y", []Node{gemm("gemm", "qkv", 32), rope("rope", "other", 32)}, 0},
		{"other rows", []Node{gemm("gemm", "qkv", 32), rope("rope", "qkv", 16)}, 0},
		{"not the row's width", []Node{gemm("gemm512", "qkv", 32), rope("rope", "qkv", 32)}, 0},
		{"guarded", []Node{gemm("gemmg", "qkv", 32), rope("rope", "qkv", 32)}, 0},
		{"skipping", []Node{gemm("gemm", "qkv", 32), skipping}, 0},
		{"last node", []Node{rope("rope", "qkv", 32), gemm("gemm", "qkv", 32)}, 1},
	} {
		if _, _, ok, err := RopePairAt(c.nodes, c.i, kernel); ok || err != nil {
			t.Errorf("%s: a pair (%v, %v)", c.name, ok, err)
		}
	}
}

// TestBF16CopyOf: an add+norm with NormOutBF16 after out, a decode attention with AttnZBF16
// after z (its rows the grid's x over its splits) and a gated activation without MI ops, each
// passing the constant 0 there, read as nodes that can write a bf16 copy (the activation's
// output droppable, and the norm's and attention's where the kernel says out_optional); a
// gathering norm, the
// prefill step's attention kernels, a node passing
// something else there, a kernel without the parameter, or another op do not.
func TestBF16CopyOf(t *testing.T) {
	params := []Param{{"resid", "u64"}, {"delta", "u64"}, {"w", "u64"}, {"out", "u64"}, {NormOutBF16, "u64"}, {"ctl_mask", "u64"}}
	k := Kernel{Name: "norm", Op: OpRowNorm, Attrs: []byte(`{"hidden":4096,"load":"add"}`), Params: params}
	n := Node{Label: "norm", Kernel: "norm", Grid: [3]int{32, 1, 1}, Args: []Slot{{Buffer: "r"}, {Buffer: "d"}, {Buffer: "w"}, {Buffer: "x", Offset: 64}, {}, {Buffer: "m"}}}
	if got, ok := BF16CopyOf(n, k); !ok || got != (BF16Copy{Out: Slot{Buffer: "x", Offset: 64}, Rows: 32, OutArg: 3, CopyArg: 4}) {
		t.Fatalf("norm: %+v %v", got, ok)
	}
	optional := k
	optional.Attrs = []byte(`{"hidden":4096,"load":"add","out_optional":true}`)
	if got, ok := BF16CopyOf(n, optional); !ok || got != (BF16Copy{Out: Slot{Buffer: "x", Offset: 64}, Rows: 32, OutArg: 3, CopyArg: 4, Droppable: true}) {
		t.Fatalf("norm with an optional out: %+v %v", got, ok)
	}
	attnParams := []Param{{"qkv", "u64"}, {"pos", "u64"}, {"seq", "u64"}, {"block_table", "u64"}, {"kcache", "u64"}, {"vcache", "u64"}, {"z", "u64"}, {AttnZBF16, "u64"}, {"chunk", "u64"}}
	attn := Kernel{Name: "attn", Op: OpAttention, Attrs: []byte(`{"heads":32,"splits":4}`), Params: attnParams}
	an := Node{Label: "attn", Kernel: "attn", Grid: [3]int{64, 8, 1}, Args: []Slot{{Buffer: "qkv"}, {Buffer: "p"}, {Buffer: "s"}, {Buffer: "b"}, {Buffer: "k"}, {Buffer: "v"}, {Buffer: "z"}, {}, {Buffer: "c"}}}
	if got, ok := BF16CopyOf(an, attn); !ok || got != (BF16Copy{Out: Slot{Buffer: "z"}, Rows: 16, OutArg: 6, CopyArg: 7}) {
		t.Fatalf("attention: %+v %v", got, ok)
	}
	optAttn := attn
	optAttn.Attrs = []byte(`{"heads":32,"splits":4,"out_optional":true}`)
	if got, ok := BF16CopyOf(an, optAttn); !ok || !got.Droppable {
		t.Fatalf("attention with an optional z: %+v %v", got, ok)
	}
	act := Kernel{Name: "act", Op: "silu_mul", Attrs: []byte(`{"inter":128,"chunked":true}`), Params: gatedActParams}
	actNode := Node{Label: "act", Kernel: "act", Grid: [3]int{1, 8, 1}, Args: []Slot{{Buffer: "gu"}, {Buffer: "a"}, {}, {}}}
	if got, ok := BF16CopyOf(actNode, act); !ok || got != (BF16Copy{Out: Slot{Buffer: "a"}, Rows: 8, OutArg: 1, CopyArg: 2, Droppable: true}) {
		t.Fatalf("activation: %+v %v", got, ok)
	}
	gather := k
	gather.Attrs = []byte(`{"hidden":4096,"load":"add","gather":true}`)
	singles := attn
	singles.Attrs = []byte(`{"heads":32,"rows":"single"}`)
	set := n
	set.Args = slices.Clone(n.Args)
	set.Args[4] = Slot{Buffer: "xb"}
	without := k
	without.Params = slices.Delete(slices.Clone(params), 4, 5)
	short := n
	short.Args = slices.Delete(slices.Clone(n.Args), 4, 5)
	other := k
	other.Op = "row_renorm"
	for _, c := range []struct {
		name string
		n    Node
		k    Kernel
	}{{"gather", n, gather}, {"singles", an, singles}, {"out_bf16 set", set, k}, {"no out_bf16", short, without}, {"another op", n, other}} {
		if _, ok := BF16CopyOf(c.n, c.k); ok {
			t.Errorf("%s: read as a node with a bf16 copy", c.name)
		}
	}
}
