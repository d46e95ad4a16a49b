package cuda

import (
	"testing"

	"xmix/bundle"
)

// feedKernels are a gated activation without MI ops, a GEMM (K 128, N 64), an add+norm of
// width 128 and an MI kernel, as a bundle declares them.
func feedKernels() map[string]bundle.Kernel {
	return map[string]bundle.Kernel{
		"act": {Name: "act", Op: "silu_mul", Attrs: []byte(`{"inter":128,"chunked":true}`),
			Params: []bundle.Param{{Name: "gu", Type: "u64"}, {Name: "act", Type: "u64"}, {Name: bundle.GatedActBF16, Type: "u64"}, {Name: bundle.GatedGuBF16, Type: "u64"}}},
		"down": {Name: "down", Op: bundle.OpGemmTC, Attrs: []byte(`{"k":128,"n":64}`),
			Params: []bundle.Param{{Name: bundle.GemmX, Type: "u64"}, {Name: bundle.GemmW, Type: "u64"}, {Name: bundle.GemmY, Type: "u64"}, {Name: bundle.GemmRows, Type: "u32"}}},
		"norm": {Name: "norm", Op: bundle.OpRowNorm, Attrs: []byte(`{"hidden":128}`),
			Params: []bundle.Param{{Name: "resid", Type: "u64"}, {Name: "delta", Type: "u64"}, {Name: "w", Type: "u64"}, {Name: "out", Type: "u64"}, {Name: bundle.NormOutBF16, Type: "u64"}}},
		"mi": {Name: "mi", Op: "mi"},
	}
}

func feedAct(rows int) bundle.Node {
	return bundle.Node{Label: "act", Kernel: "act", Grid: [3]int{1, rows, 1}, Args: []bundle.Slot{{Buffer: "gu"}, {Buffer: "a"}, {}, {}}}
}

func feedDown(rows uint64) bundle.Node {
	return bundle.Node{Label: "down", Kernel: "down", Args: []bundle.Slot{{Buffer: "a"}, {Buffer: "w"}, {Buffer: "d"}, {Const: rows}}}
}

// TestReadAfter: the f32 activation a GEMM reads as bf16 is dead unless a node after that
// GEMM names its buffer before the next gated activation writes it again; so is an add+norm's
// output before the next add+norm writes it, unless that one also reads the buffer.
func TestReadAfter(t *testing.T) {
	be := &Backend{kernels: feedKernels()}
	act, down := feedAct(8), feedDown(8)
	other := bundle.Node{Label: "norm", Kernel: "mi", Args: []bundle.Slot{{Buffer: "d"}}}
	reader := bundle.Node{Label: "mi", Kernel: "mi", Args: []bundle.Slot{{Buffer: "a", Offset: 64}}}
	s := bundle.Slot{Buffer: "a"}
	for _, c := range []struct {
		name  string
		nodes []bundle.Node
		want  bool
	}{
		{"the last layer's", []bundle.Node{act, down, other}, false},
		{"written again by the next layer's activation", []bundle.Node{act, down, other, act, reader, down}, false},
		{"read before the next activation", []bundle.Node{act, down, other, reader, act, down}, true},
		{"read by a second GEMM", []bundle.Node{act, down, down}, true},
	} {
		if got := be.readAfter(c.nodes, 1, s); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
	norm := bundle.Node{Label: "norm", Kernel: "norm", Grid: [3]int{8, 1, 1}, Args: []bundle.Slot{{Buffer: "r"}, {Buffer: "d"}, {Buffer: "nw"}, {Buffer: "a"}, {}}}
	readingNorm := norm
	readingNorm.Args = []bundle.Slot{{Buffer: "r"}, {Buffer: "a", Offset: 64}, {Buffer: "nw"}, {Buffer: "a"}, {}}
	otherRows := norm
	otherRows.Args = []bundle.Slot{{Buffer: "r"}, {Buffer: "d"}, {Buffer: "nw"}, {Buffer: "a", Offset: 64}, {}}
	for _, c := range []struct {
		name  string
		nodes []bundle.Node
		want  bool
	}{
		{"written again by the next add+norm", []bundle.Node{norm, down, other, norm, reader}, false},
		{"read before the next add+norm", []bundle.Node{norm, down, reader, norm}, true},
		{"the next add+norm reads it too", []bundle.Node{norm, down, readingNorm}, true},
		{"the next add+norm writes elsewhere in it", []bundle.Node{norm, down, otherRows}, true},
	} {
		if got := be.readAfter(c.nodes, 1, s); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}

// TestFeedAheadGatedAct: a gated activation right before cuBLASLt's GEMM of its output writes
// bf16 of it into the cast's scratch (and, with no reader after the GEMM, that alone), and
// the GEMM is fed from there; an MI node between, a GEMM of other rows, of another x or
// whose rows do not fit the scratch, a misaligned W, a heavy app's activation, no cuBLASLt,
// or a copy-engine kernel that reads x itself leave both as the bundle has them.
func TestFeedAheadGatedAct(t *testing.T) {
	const xb = 0x7000_0000
	newBackend := func() *Backend {
		return &Backend{kernels: feedKernels(), lt: &cublasLt{xb: xb, xbBytes: 8 * 128 * 2},
			bufs: map[string]uintptr{"gu": 0x1000_0000, "a": 0x2000_0000, "w": 0x3000_0000, "d": 0x4000_0000, "odd": 0x5000_0008}}
	}
	act, down := feedAct(8), feedDown(8)
	reader := bundle.Node{Label: "mi", Kernel: "mi", Args: []bundle.Slot{{Buffer: "a"}}}

	be := newBackend()
	n, fed, err := be.feedAhead([]bundle.Node{act, down}, 0)
	if err != nil || fed != xb || n.Args[2] != (bundle.Slot{Const: xb}) || n.Args[1] != (bundle.Slot{}) || n.Args[0] != act.Args[0] {
		t.Fatalf("fed, f32 dead: %+v %#x %v; want act_bf16 the scratch, act 0", n.Args, fed, err)
	}
	if act.Args[2] != (bundle.Slot{}) {
		t.Fatal("feedAhead changed the bundle's node")
	}
	n, fed, err = be.feedAhead([]bundle.Node{act, down, reader}, 0)
	if err != nil || fed != xb || n.Args[2] != (bundle.Slot{Const: xb}) || n.Args[1] != act.Args[1] {
		t.Fatalf("fed, f32 read after: %+v %#x %v; want both outputs", n.Args, fed, err)
	}

	skipping := feedAct(8)
	skipping.SkipUnless = 1
	otherX, oddW := feedDown(8), feedDown(8)
	otherX.Args[0] = bundle.Slot{Buffer: "d"}
	oddW.Args[1] = bundle.Slot{Buffer: "odd"}
	plainCopy := newBackend()
	plainCopy.copy = &copyServer{kernels: map[bundle.GemmCopyShape][]bundle.GemmCopy{{K: 128, N: 64}: {{Kernel: "c8", Attrs: bundle.GemmCopyAttrs{Rows: 8}}}}}
	noLt := newBackend()
	noLt.lt = nil
	small := newBackend()
	small.lt.xbBytes = 8*128*2 - 2
	for _, c := range []struct {
		name  string
		be    *Backend
		nodes []bundle.Node
	}{
		{"an MI node between", be, []bundle.Node{act, reader, down}},
		{"other rows", be, []bundle.Node{act, feedDown(16)}},
		{"another x", be, []bundle.Node{act, otherX}},
		{"a misaligned W", be, []bundle.Node{act, oddW}},
		{"a heavy app's activation", be, []bundle.Node{skipping, down}},
		{"the activation last", be, []bundle.Node{down, act}},
		{"no cuBLASLt", noLt, []bundle.Node{act, down}},
		{"a scratch too small", small, []bundle.Node{act, down}},
		{"a copy-engine kernel reading x", plainCopy, []bundle.Node{act, down}},
	} {
		i := 0
		if c.nodes[0].Kernel != "act" {
			i = 1
		}
		n, fed, err := c.be.feedAhead(c.nodes, i)
		if err != nil || fed != 0 || len(n.Args) != 4 || n.Args[2] != (bundle.Slot{}) || n.Args[1] != c.nodes[i].Args[1] {
			t.Errorf("%s: %+v %#x %v, want the node as it is", c.name, n.Args, fed, err)
		}
	}
	xbf16 := newBackend()
	xbf16.copy = &copyServer{kernels: map[bundle.GemmCopyShape][]bundle.GemmCopy{{K: 128, N: 64}: {{Kernel: "c8", Attrs: bundle.GemmCopyAttrs{Rows: 8, XBF16: true}}}}}
	if _, fed, err := xbf16.feedAhead([]bundle.Node{act, down}, 0); err != nil || fed != xb {
		t.Errorf("a copy-engine kernel reading bf16(x): %#x %v, want fed", fed, err)
	}
}

// TestFeedAheadNorm: an add+norm right before a GEMM of its output writes bf16 of it into
// the cast's scratch and keeps its f32 output; the GEMM starting a gated pair that copyPair
// serves with a kernel reading bf16(x) is fed too, and one whose pair kernel reads x is not,
// nor one fed from the copy server's scratch that its kernel writes (YBF16).
func TestFeedAheadNorm(t *testing.T) {
	const xb = 0x7000_0000
	be := &Backend{kernels: feedKernels(), lt: &cublasLt{xb: xb, xbBytes: 8 * 128 * 2},
		bufs: map[string]uintptr{"r": 0x1000_0000, "dl": 0x1100_0000, "nw": 0x1200_0000, "a": 0x2000_0000, "w": 0x3000_0000, "d": 0x4000_0000, "gu": 0x5000_0000}}
	norm := bundle.Node{Label: "norm", Kernel: "norm", Grid: [3]int{8, 1, 1}, Args: []bundle.Slot{{Buffer: "r"}, {Buffer: "dl"}, {Buffer: "nw"}, {Buffer: "a"}, {}}}
	down := feedDown(8)
	n, fed, err := be.feedAhead([]bundle.Node{norm, down}, 0)
	if err != nil || fed != xb || n.Args[4] != (bundle.Slot{Const: xb}) || n.Args[3] != norm.Args[3] {
		t.Fatalf("norm then cuBLASLt's GEMM: %+v %#x %v; want out kept and out_bf16 the scratch", n.Args, fed, err)
	}
	gateUp := down
	gateUp.Args = []bundle.Slot{{Buffer: "a"}, {Buffer: "w"}, {Buffer: "gu"}, {Const: 8}}
	act := bundle.Node{Label: "act", Kernel: "act", Grid: [3]int{1, 8, 1}, Args: []bundle.Slot{{Buffer: "gu"}, {Buffer: "d"}, {}, {}}}
	be.kernels["act"] = bundle.Kernel{Name: "act", Op: "silu_mul", Attrs: []byte(`{"inter":32,"chunked":true}`), Params: be.kernels["act"].Params}
	for _, xbf16 := range []bool{true, false} {
		be.copy = &copyServer{kernels: map[bundle.GemmCopyShape][]bundle.GemmCopy{{K: 128, N: 64, Act: "silu_mul"}: {{Kernel: "g8", Attrs: bundle.GemmCopyAttrs{Rows: 8, XBF16: xbf16}}}}}
		if _, fed, err := be.feedAhead([]bundle.Node{norm, gateUp, act}, 0); err != nil || (fed == xb) != xbf16 {
			t.Errorf("norm then a gated pair whose kernel reads bf16(x) %v: fed %#x, %v", xbf16, fed, err)
		}
	}
	const yb = 0x7100_0000
	for _, ybf16 := range []bool{false, true} {
		be.copy = &copyServer{yb: yb, ybBytes: 8 * 128 * 2,
			kernels: map[bundle.GemmCopyShape][]bundle.GemmCopy{{K: 128, N: 64, Act: "silu_mul"}: {{Kernel: "g8", Attrs: bundle.GemmCopyAttrs{Rows: 8, XBF16: true, YBF16: ybf16}}}}}
		if ok, err := be.feedable([]bundle.Node{gateUp, act}, 0, bundle.Slot{Buffer: "a"}, 8, yb, 8*128*2); err != nil || ok == ybf16 {
			t.Errorf("a gated pair with YBF16 %v fed from the copy server's scratch: %v, %v", ybf16, ok, err)
		}
	}
}

// TestFeedableFromCopyScratch: cuBLASLt's GEMM of the gated copy-engine kernel's output reads
// bf16 of it where that kernel writes it, the copy server's yb, as it does from the cast's
// scratch; not a heavy node's GEMM (which casts into a scratch of its own), nor from another
// address, nor where its rows do not fit.
func TestFeedableFromCopyScratch(t *testing.T) {
	const xb, yb = 0x7000_0000, 0x7100_0000
	be := &Backend{kernels: feedKernels(), lt: &cublasLt{xb: xb, xbBytes: 8 * 128 * 2},
		bufs: map[string]uintptr{"a": 0x2000_0000, "w": 0x3000_0000, "d": 0x4000_0000}}
	// A gated kernel's shape, none for down's: cuBLASLt serves down.
	be.copy = &copyServer{yb: yb, ybBytes: 8 * 128 * 2,
		kernels: map[bundle.GemmCopyShape][]bundle.GemmCopy{{K: 128, N: 512, Act: "silu_mul"}: {{Kernel: "g8", Attrs: bundle.GemmCopyAttrs{Rows: 8, XBF16: true, YBF16: true}}}}}
	down, heavy := feedDown(8), feedDown(8)
	heavy.SkipUnless = 1
	a := bundle.Slot{Buffer: "a"}
	for _, c := range []struct {
		name  string
		node  bundle.Node
		at    uintptr
		bytes int64
		want  bool
	}{
		{"the copy server's yb", down, yb, 8 * 128 * 2, true},
		{"the cast's scratch", down, xb, 8 * 128 * 2, true},
		{"a heavy node's GEMM", heavy, yb, 8 * 128 * 2, false},
		{"another address", down, yb + 0x100_0000, 8 * 128 * 2, false},
		{"rows past the scratch", down, yb, 8*128*2 - 2, false},
	} {
		if ok, err := be.feedable([]bundle.Node{c.node}, 0, a, 8, c.at, c.bytes); err != nil || ok != c.want {
			t.Errorf("%s: %v, %v; want %v", c.name, ok, err, c.want)
		}
	}
}

// optionalNormFeed is a backend with cuBLASLt's cast scratch at feedXB whose add+norm kernel
// may take an out of 0 (out_optional), and an 8-row add+norm node writing out to buffer a.
func optionalNormFeed() (*Backend, bundle.Node) {
	be := &Backend{kernels: feedKernels(), lt: &cublasLt{xb: feedXB, xbBytes: 8 * 128 * 2},
		bufs: map[string]uintptr{"r": 0x1000_0000, "dl": 0x1100_0000, "nw": 0x1200_0000, "a": 0x2000_0000, "w": 0x3000_0000, "d": 0x4000_0000}}
	k := be.kernels["norm"]
	k.Attrs = []byte(`{"hidden":128,"out_optional":true}`)
	be.kernels["norm"] = k
	return be, bundle.Node{Label: "norm", Kernel: "norm", Grid: [3]int{8, 1, 1}, Args: []bundle.Slot{{Buffer: "r"}, {Buffer: "dl"}, {Buffer: "nw"}, {Buffer: "a"}, {}}}
}

// feedXB is the cast scratch of optionalNormFeed's backend.
const feedXB = 0x7000_0000

// TestFeedAheadNormOutOptional: an add+norm whose kernel may take an out of 0
// (out_optional) right before a GEMM that it feeds writes the bf16 copy alone where no node
// after the GEMM reads out before the next add+norm writes it, and keeps out where one does.
func TestFeedAheadNormOutOptional(t *testing.T) {
	be, norm := optionalNormFeed()
	down := feedDown(8)
	reader := bundle.Node{Label: "mi", Kernel: "mi", Args: []bundle.Slot{{Buffer: "a"}}}
	checkCuts(t, be, feedXB, 3, []cutCase{
		{"the last", []bundle.Node{norm, down}, false},
		{"written again by the next add+norm", []bundle.Node{norm, down, norm, reader}, false},
		{"read after the GEMM", []bundle.Node{norm, down, reader, norm}, true},
	})
	if norm.Args[3] != (bundle.Slot{Buffer: "a"}) {
		t.Fatal("feedAhead changed the bundle's node")
	}
}

// cutCase is a node list whose first node feeds the GEMM after it, and whether its f32 output
// must stay (keep) or be cut.
type cutCase struct {
	name  string
	nodes []bundle.Node
	keep  bool
}

// checkCuts checks that feedAhead points each case's first node's copy (the argument after
// out, its f32 output) at the scratch xb and keeps out or passes 0 there, as the case says.
func checkCuts(t *testing.T, be *Backend, xb uintptr, out int, cases []cutCase) {
	t.Helper()
	for _, c := range cases {
		n, fed, err := be.feedAhead(c.nodes, 0)
		want := bundle.Slot{}
		if c.keep {
			want = c.nodes[0].Args[out]
		}
		if err != nil || fed != xb || n.Args[out+1] != (bundle.Slot{Const: uint64(xb)}) || n.Args[out] != want {
			t.Errorf("%s: %+v %#x %v; want the copy in the scratch and argument %d %+v", c.name, n.Args, fed, err, out, want)
		}
	}
}

// TestFeedAheadAttention: a decode attention right before the o projection writes bf16 of z
// into the cast's scratch and keeps z (but where its kernel says out_optional and no node
// reads z before the next attention writes it); the prefill step's singles kernel, which
// writes only some rows of z, does not.
func TestFeedAheadAttention(t *testing.T) {
	const xb = 0x7000_0000
	be := &Backend{kernels: feedKernels(), lt: &cublasLt{xb: xb, xbBytes: 8 * 128 * 2},
		bufs: map[string]uintptr{"qkv": 0x1000_0000, "t": 0x1100_0000, "a": 0x2000_0000, "w": 0x3000_0000, "d": 0x4000_0000}}
	params := []bundle.Param{{Name: "qkv", Type: "u64"}, {Name: "pos", Type: "u64"}, {Name: "seq", Type: "u64"}, {Name: "block_table", Type: "u64"},
		{Name: "kcache", Type: "u64"}, {Name: "vcache", Type: "u64"}, {Name: "z", Type: "u64"}, {Name: bundle.AttnZBF16, Type: "u64"}}
	be.kernels["attn"] = bundle.Kernel{Name: "attn", Op: bundle.OpAttention, Attrs: []byte(`{"heads":2,"head_dim":64}`), Params: params}
	be.kernels["singles"] = bundle.Kernel{Name: "singles", Op: bundle.OpAttention, Attrs: []byte(`{"heads":2,"head_dim":64,"rows":"single"}`), Params: params}
	attn := bundle.Node{Label: "attn", Kernel: "attn", Grid: [3]int{8, 1, 1},
		Args: []bundle.Slot{{Buffer: "qkv"}, {Buffer: "t"}, {Buffer: "t"}, {Buffer: "t"}, {Buffer: "t"}, {Buffer: "t"}, {Buffer: "a"}, {}}}
	n, fed, err := be.feedAhead([]bundle.Node{attn, feedDown(8)}, 0)
	if err != nil || fed != xb || n.Args[7] != (bundle.Slot{Const: xb}) || n.Args[6] != attn.Args[6] {
		t.Fatalf("attention then cuBLASLt's GEMM: %+v %#x %v; want z kept and z_bf16 the scratch", n.Args, fed, err)
	}
	singles := attn
	singles.Kernel = "singles"
	if n, fed, err := be.feedAhead([]bundle.Node{singles, feedDown(8)}, 0); err != nil || fed != 0 || n.Args[7] != (bundle.Slot{}) {
		t.Errorf("the singles kernel: %+v %#x %v, want the node as it is", n.Args, fed, err)
	}
	k := be.kernels["attn"]
	k.Attrs = []byte(`{"heads":2,"head_dim":64,"out_optional":true}`)
	be.kernels["attn"] = k
	reader := bundle.Node{Label: "mi", Kernel: "mi", Args: []bundle.Slot{{Buffer: "a"}}}
	checkCuts(t, be, xb, 6, []cutCase{
		{"z optional, written again by the next attention", []bundle.Node{attn, feedDown(8), attn, reader}, false},
		{"z optional, read after the GEMM", []bundle.Node{attn, feedDown(8), reader}, true},
	})
}

// TestFeedAheadPastHeavyNodes: an add+norm feeds the GEMM past a logit lens's heavy nodes
// (fedAt), which name buffers of their own, and drops its f32 output there as it would with
// the GEMM right after it (out_optional); a heavy node that names x's buffer, or a light one,
// keeps the GEMM its cast.
func TestFeedAheadPastHeavyNodes(t *testing.T) {
	be, norm := optionalNormFeed()
	down := feedDown(8)
	lensNorm := bundle.Node{Label: "lens_norm", Kernel: "mi", SkipUnless: 4, Args: []bundle.Slot{{Buffer: "r"}, {Buffer: "lens_x"}}}
	lensTopK := bundle.Node{Label: "lens_topk", Kernel: "mi", SkipUnless: 4, Args: []bundle.Slot{{Buffer: "lens"}, {Buffer: "top"}}}
	heavyReader := bundle.Node{Label: "heavy", Kernel: "mi", SkipUnless: 4, Args: []bundle.Slot{{Buffer: "a", Offset: 64}}}
	light := bundle.Node{Label: "mi", Kernel: "mi", Args: []bundle.Slot{{Buffer: "top"}}}
	x := bundle.Slot{Buffer: "a"}
	for _, c := range []struct {
		name  string
		nodes []bundle.Node
		at    int // fedAt from node 1
		fed   bool
	}{
		{"the GEMM right after", []bundle.Node{norm, down}, 1, true},
		{"past a lens's nodes", []bundle.Node{norm, lensNorm, lensTopK, down}, 3, true},
		{"a heavy node naming x's buffer", []bundle.Node{norm, lensNorm, heavyReader, down}, 2, false},
		{"a light node between", []bundle.Node{norm, lensNorm, light, down}, 2, false},
		{"heavy nodes last", []bundle.Node{norm, lensNorm, lensTopK}, 3, false},
	} {
		if got := fedAt(c.nodes, 1, x); got != c.at {
			t.Errorf("%s: fedAt %d, want %d", c.name, got, c.at)
		}
		n, fed, err := be.feedAhead(c.nodes, 0)
		if err != nil || (fed == feedXB) != c.fed || (n.Args[4] == (bundle.Slot{Const: feedXB})) != c.fed {
			t.Errorf("%s: %+v %#x %v, want fed %v", c.name, n.Args, fed, err, c.fed)
		}
		if c.fed && n.Args[3] != (bundle.Slot{}) {
			t.Errorf("%s: out %+v, want 0 (no node after the GEMM reads it)", c.name, n.Args[3])
		}
	}
}
