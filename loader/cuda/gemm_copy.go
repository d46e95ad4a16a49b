package cuda

import (
	"fmt"
	"slices"
	"unsafe"

	"xmix/bundle"
)

// The copy-engine GEMMs (bundle.OpGemmCopy, codegen/gemm_copy.go): under GemmAuto a GEMM node
// of at most a few rows whose K and N the bundle carries such a kernel for runs it instead of
// cuBLASLt. Its x and W arrive through tensor maps, which the driver encodes here
// (cuTensorMapEncodeTiled) once per buffer and the launch passes by value.

// copyServer holds the bundle's copy-engine GEMMs and what serving them needs.
type copyServer struct {
	kernels map[bundle.GemmCopyShape][]bundle.GemmCopy
	checked map[string]bool           // kernels whose shared-memory limit is raised and whose first launch ran
	maps    map[copyMapKey]*tensorMap // encoded tensor maps by buffer and shape
	served  map[copyLaunchKey]*launch // one launch per node shape and buffers, as cuBLASLt's
	nodes   int
	// yb is device scratch of ybBytes where a kernel with YBF16 writes bf16(y) for the GEMM
	// after it (apart from the cast's scratch, which that kernel's own x is read from while
	// it writes).
	yb      uintptr
	ybBytes int64
}

// copyMapKey is a 2-D tensor map: n rows of k elements at addr (bf16 when bf16, else f32),
// boxes of box[0] x box[1] elements under the swizzle (bytes: 0 or 128).
type copyMapKey struct {
	addr          uintptr
	bf16          bool
	k, n, swizzle int
	box           [2]int
}

type copyLaunchKey struct {
	g       bundle.GEMM
	x, w, y uintptr
	kernel  string  // the plain GEMM's, or one with an epilogue (an activation, rope_kv)
	xb, yb  uintptr // bf16(x) written by the launch ahead (0: the cast makes it); where bf16(y) goes (YBF16)
}

// initCopyGemms indexes the bundle's copy-engine GEMMs; mode GemmAuto only serves with them.
func (be *Backend) initCopyGemms(b *bundle.Bundle, mode string) error {
	if mode != GemmAuto {
		return nil
	}
	kernels, err := bundle.GemmCopyKernels(b.Kernels)
	if err != nil || len(kernels) == 0 {
		return err
	}
	be.copy = &copyServer{kernels: kernels, checked: map[string]bool{}, maps: map[copyMapKey]*tensorMap{}, served: map[copyLaunchKey]*launch{}}
	for _, ks := range kernels {
		for _, c := range ks {
			if c.Attrs.YBF16 {
				be.copy.ybBytes = max(be.copy.ybBytes, int64(c.Attrs.Rows)*int64(c.Attrs.N/2)*2)
			}
		}
	}
	if be.lt == nil || be.copy.ybBytes == 0 {
		return nil // without the library's cast no GEMM reads bf16(x)
	}
	if err := be.d.call("cuMemAlloc_v2", uintptr(unsafe.Pointer(&be.copy.yb)), uintptr(be.copy.ybBytes)); err != nil {
		return fmt.Errorf("allocating %d bytes for the copy-engine GEMMs' bf16 activations: %w", be.copy.ybBytes, err)
	}
	be.allocs = append(be.allocs, be.copy.yb)
	return nil
}

// copyNode serves GEMM node n (vals: its arguments' device addresses and constants) with the
// bundle's copy-engine GEMM of its shape, or says no (ok false): none for its K and N, more
// rows than it takes, a heavy app's GEMM, x or W not 16-byte aligned, or, for a kernel that
// reads bf16(x), no cuBLASLt cast and scratch to make it. xb, if not 0, is bf16(x) as the
// launch ahead wrote it (feedable said so), which the kernel reads without a cast.
func (be *Backend) copyNode(n bundle.Node, vals []uint64, xb uintptr) (*launch, bool, error) {
	g, c, ok, err := be.copyGemmOf(n)
	if err != nil || !ok {
		return nil, false, err
	}
	return be.copyLaunch(n, g, c, vals, uintptr(vals[g.Y]), nil, xb)
}

// copyGemmOf is GEMM node n and the bundle's plain copy-engine GEMM for it (plainCopyFor), if
// it has one that takes n's rows and n is no heavy app's.
func (be *Backend) copyGemmOf(n bundle.Node) (bundle.GEMM, bundle.GemmCopy, bool, error) {
	g, ok, err := bundle.GemmOf(n, be.kernels[n.Kernel])
	if err != nil || !ok || g.Guard != 0 || g.M < 1 {
		return bundle.GEMM{}, bundle.GemmCopy{}, false, nil
	}
	c, ok := plainCopyFor(be.copy.kernels[bundle.GemmCopyShape{K: g.K, N: g.N}], be.copy.kernels[bundle.GemmCopyShape{K: g.K, N: g.N, Act: bundle.OpRopeKV}], g.M)
	return g, c, ok, nil
}

// plainCopyFor is the plain kernel of plain (one shape's) that serves a GEMM of m rows: the
// one of the fewest rows that takes m, but where rope (the shape's kernels with rope_kv: the
// GEMM is a q/k/v projection) has one that takes m, the plain one of that one's rows, which
// the build makes its twin (codegen's plainTwin: the same form and K split). A layer whose
// rope_kv an app's op parts from its GEMM then sums as the kernel with rope_kv does in the
// graphs without the op, so rows without it keep their bits: the 32-row kernel with rope_kv
// serves the 8- and 16-row buckets' pairs (planPair), whose own plain kernels add their sums
// in another order.
func plainCopyFor(plain, rope []bundle.GemmCopy, m int) (bundle.GemmCopy, bool) {
	if r, ok := bundle.GemmCopyFor(rope, m); ok {
		if i := slices.IndexFunc(plain, func(c bundle.GemmCopy) bool { return c.Attrs.Rows == r.Attrs.Rows }); i >= 0 {
			return plain[i], true
		}
	}
	return bundle.GemmCopyFor(plain, m)
}

// copyPair serves nodes[i] and nodes[i+1] with one launch of a copy-engine GEMM with an
// epilogue where the bundle carries one for them (planPair): the gated activation after the
// gate/up GEMM, or the rotation and KV write after the q/k/v GEMM. xb, if not 0, is bf16 of
// the GEMM's x as the launch ahead wrote it (feedable said so), read with no cast. fed, if not
// 0, is where the launch writes bf16 of nodes[i+2]'s x for that GEMM (a gated kernel with
// YBF16, where feedable says its server reads it there); then the activation's f32 output
// is written only where a node after nodes[i+2] reads it (readAfter). ok is false where the
// bundle has no kernel for them (or copyLaunch says no), and both nodes are then served one
// by one.
func (be *Backend) copyPair(nodes []bundle.Node, i int, xb uintptr) (l launch, fed uintptr, ok bool, err error) {
	p, ok, err := be.planPair(nodes, i)
	if err != nil || !ok {
		return launch{}, 0, false, err
	}
	y, extra := nodes[i].Args[p.g.Y], p.rope
	if p.gated {
		y = p.act.Act
	}
	if p.c.Attrs.YBF16 {
		j := fedAt(nodes, i+2, p.act.Act)
		feeds, err := be.feedable(nodes, j, p.act.Act, p.g.M, be.copy.yb, be.copy.ybBytes)
		if err != nil {
			return launch{}, 0, false, fmt.Errorf("node %s: %w", nodes[j].Label, err)
		}
		if feeds {
			fed = be.copy.yb
			if !be.readAfter(nodes, j, p.act.Act) {
				y = bundle.Slot{} // 0: bf16(y) alone
			}
		}
		extra = []bundle.Slot{{Const: uint64(fed)}}
	}
	vals, err := be.argValues(nodes[i])
	if err != nil {
		return launch{}, 0, false, err
	}
	ys, err := be.slotValue(y)
	if err != nil {
		return launch{}, 0, false, fmt.Errorf("node %s: %w", nodes[i+1].Label, err)
	}
	ev := make([]uint64, len(extra))
	for j, s := range extra {
		if ev[j], err = be.slotValue(s); err != nil {
			return launch{}, 0, false, fmt.Errorf("node %s: %w", nodes[i+1].Label, err)
		}
	}
	sl, ok, err := be.copyLaunch(nodes[i], p.g, p.c, vals, uintptr(ys), ev, xb)
	if err != nil || !ok {
		return launch{}, 0, false, err
	}
	l = *sl
	l.label = nodes[i].Label
	return l, fed, true, nil
}

// pairPlan is how copyPair serves a GEMM and the node after it: the GEMM, the copy-engine
// kernel, and either the gated activation (gated) or the rope_kv node's arguments that the
// kernel takes after rows (bundle.RopeKVParams).
type pairPlan struct {
	g     bundle.GEMM
	c     bundle.GemmCopy
	gated bool
	act   bundle.GatedAct
	rope  []bundle.Slot
}

// gatedPairs finds the gated pairs of nodes: be.gated where prepareAll prepares that list.
func (be *Backend) gatedPairs(nodes []bundle.Node) *bundle.GatedPairs {
	if be.gated != nil && be.gated.Of(nodes) {
		return be.gated
	}
	return bundle.NewGatedPairs(nodes, be.kernel)
}

// planPair says how copyPair would serve nodes[i] and nodes[i+1]: a GEMM and the gated
// activation of its y (bundle.GatedPairAt) by the bundle's copy-engine GEMM with that
// activation (bundle.GatedCopyFor), or a GEMM and the rope_kv of its y (bundle.RopePairAt) by the
// one with rope_kv of that shape; ok is false where the bundle has no such kernel for them.
func (be *Backend) planPair(nodes []bundle.Node, i int) (pairPlan, bool, error) {
	if be.copy == nil {
		return pairPlan{}, false, nil
	}
	g, act, ok, err := be.gatedPairs(nodes).At(i)
	switch {
	case err != nil || ok && g.M < 1:
		return pairPlan{}, false, err
	case ok:
		c, ok := bundle.GatedCopyFor(be.copy.kernels[bundle.GemmCopyShape{K: g.K, N: g.N, Act: act.Op}], g.M)
		return pairPlan{g: g, c: c, gated: true, act: act}, ok, nil
	}
	g, rope, ok, err := bundle.RopePairAt(nodes, i, be.kernel)
	if err != nil || !ok || g.M < 1 {
		return pairPlan{}, false, err
	}
	// The kernel of the fewest rows that takes the GEMM's, as for the plain kernels: the
	// 32-row kernel serves the 8- and 16-row buckets' pairs too, whose plain GEMMs have kernels
	// of their own. On the H200 that made the 8B's 16-row step 0.9-1.1% shorter and its 8-row
	// step 0.1-0.2% longer than those kernels and rope_kv apart (session 49 call 8).
	c, ok := bundle.GemmCopyFor(be.copy.kernels[bundle.GemmCopyShape{K: g.K, N: g.N, Act: bundle.OpRopeKV}], g.M)
	if !ok || *c.Attrs.RopeKV != rope.Shape {
		return pairPlan{}, false, nil
	}
	return pairPlan{g: g, c: c, rope: rope.Args}, true, nil
}

// copyLaunch is the launch of copy-engine GEMM c for GEMM g of node n (vals: its arguments'
// values) writing y (the GEMM's y, or with an activation the activation's output), its
// parameters after rows extra (with rope_kv: bundle.RopeKVParams' values; with YBF16 where
// bf16(y) goes), made once per shape and buffers; ok is false where x or W is not 16-byte
// aligned or, for a kernel that reads bf16(x), no cuBLASLt cast and scratch can make it. xb,
// if not 0, is bf16(x) as the launch ahead wrote it, read without a cast.
func (be *Backend) copyLaunch(n bundle.Node, g bundle.GEMM, c bundle.GemmCopy, vals []uint64, y uintptr, extra []uint64, xb uintptr) (*launch, bool, error) {
	a := c.Attrs
	key := copyLaunchKey{g: g, x: uintptr(vals[g.X]), w: uintptr(vals[g.W]), y: y, kernel: c.Kernel, xb: xb}
	if a.YBF16 {
		key.yb = uintptr(extra[len(extra)-1])
	}
	if l, ok := be.copy.served[key]; ok {
		return l, true, nil
	}
	if xb != 0 && !a.XBF16 {
		return nil, false, fmt.Errorf("node %s: kernel %s reads x, not the bf16(x) the launch ahead wrote", n.Label, c.Kernel)
	}
	if key.x%16 != 0 && xb == 0 || key.w%16 != 0 {
		return nil, false, nil
	}
	// The warpgroup form reads bf16(x): the library's cast writes it into its scratch first,
	// unless the launch ahead wrote it (xb).
	xAddr := key.x
	if xb != 0 {
		xAddr = xb
		be.fed++
	} else if a.XBF16 {
		if be.lt == nil || int64(g.M)*int64(g.K)*2 > be.lt.xbBytes {
			return nil, false, nil
		}
		xAddr = be.lt.xb
	}
	xmap, err := be.tensorMap(copyMapKey{addr: xAddr, bf16: a.XBF16, k: g.K, n: g.M, box: a.XBox, swizzle: a.XSwizzle})
	if err != nil {
		return nil, false, fmt.Errorf("node %s: x: %w", n.Label, err)
	}
	wmap, err := be.tensorMap(copyMapKey{addr: key.w, bf16: true, k: g.K, n: g.N, box: a.Box, swizzle: a.Swizzle})
	if err != nil {
		return nil, false, fmt.Errorf("node %s: w: %w", n.Label, err)
	}
	// The launch's parameters: the maps' 128 bytes each, y, rows, then extra.
	args := append([]uint64{uint64(key.y), uint64(g.M)}, extra...)
	ptrs := []uintptr{xmap.addr(), wmap.addr()}
	for i := range args {
		ptrs = append(ptrs, uintptr(unsafe.Pointer(&args[i])))
	}
	be.params = append(be.params, args)
	be.paramP = append(be.paramP, ptrs)
	l := &launch{label: n.Label, kernel: c.Kernel, f: be.funcs[c.Kernel], grid: [3]int{a.Grid, 1, 1}, block: [3]int{a.Block, 1, 1},
		shared: a.Shared, params: uintptr(unsafe.Pointer(&ptrs[0])), early: be.kernels[c.Kernel].EarlyLaunch}
	if a.XBF16 && xb == 0 {
		// The cast goes first; the GEMM after it is launched early too, so that its W is on
		// its way while x is cast.
		gemm := l
		l = be.castNode(n, g, key.x, c.Kernel, true)
		l.then = gemm
	}
	if !be.copy.checked[c.Kernel] {
		// Raise the kernel's dynamic shared memory to what it takes, and run it once outside
		// any graph so that a failure surfaces here, not inside a capture.
		if err := be.d.call("cuFuncSetAttribute", be.funcs[c.Kernel], 8, uintptr(a.Shared)); err != nil { // CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
			return nil, false, fmt.Errorf("kernel %s: %d bytes of shared memory: %w", c.Kernel, a.Shared, err)
		}
		if err := be.runOnce(*l); err != nil {
			return nil, false, fmt.Errorf("kernel %s: %w", c.Kernel, err)
		}
		be.copy.checked[c.Kernel] = true
	}
	be.copy.served[key] = l
	be.copy.nodes++
	return l, true, nil
}

// tensorMap is one encoded CUtensorMap: 128 bytes at a 64-byte boundary of buf, which the
// backend keeps (launches read it when they are issued or captured).
type tensorMap struct {
	buf [bundle.TensorMapBytes + 64]byte
}

func (m *tensorMap) addr() uintptr { return (uintptr(unsafe.Pointer(&m.buf[0])) + 63) &^ 63 }

// tensorMap is the tensor map key names, encoded by the driver on first use.
func (be *Backend) tensorMap(key copyMapKey) (*tensorMap, error) {
	if m, ok := be.copy.maps[key]; ok {
		return m, nil
	}
	var swizzle uintptr // CU_TENSOR_MAP_SWIZZLE_NONE
	switch key.swizzle {
	case 0:
	case 128:
		swizzle = 3 // CU_TENSOR_MAP_SWIZZLE_128B
	default:
		return nil, fmt.Errorf("tensor map of %d x %d: swizzle %d (want 0 or 128)", key.n, key.k, key.swizzle)
	}
	dtype, elem := uintptr(7), 4 // CU_TENSOR_MAP_DATA_TYPE_FLOAT32
	if key.bf16 {
		dtype, elem = 9, 2 // CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
	}
	m := &tensorMap{}
	dims := []uint64{uint64(key.k), uint64(key.n)}
	strides := []uint64{uint64(elem * key.k)}
	boxDims := []uint32{uint32(key.box[0]), uint32(key.box[1])}
	elemStrides := []uint32{1, 1}
	// Rank 2, no interleave, the swizzle, L2 promotion of 256 bytes (3), elements outside
	// the tensor read as zeros (CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE).
	if err := be.d.call("cuTensorMapEncodeTiled", m.addr(), dtype, 2, key.addr, uintptr(unsafe.Pointer(&dims[0])),
		uintptr(unsafe.Pointer(&strides[0])), uintptr(unsafe.Pointer(&boxDims[0])), uintptr(unsafe.Pointer(&elemStrides[0])),
		0, swizzle, 3, 0); err != nil {
		return nil, fmt.Errorf("tensor map of %d x %d: %w", key.n, key.k, err)
	}
	be.copy.maps[key] = m
	return m, nil
}

// CopyGemmNodes is how many GEMM nodes of the loaded templates the bundle's copy-engine
// kernels serve (0 unless --gemm auto and the bundle carries some).
func (be *Backend) CopyGemmNodes() int {
	if be.copy == nil {
		return 0
	}
	return be.copy.nodes
}

// CopyGemmKernels lists the copy-engine kernels that serve the backend's nodes, each once, in
// name order.
func (be *Backend) CopyGemmKernels() []string {
	if be.copy == nil {
		return nil
	}
	var names []string
	for _, l := range be.copy.served {
		if !slices.Contains(names, l.kernel) {
			names = append(names, l.kernel)
		}
	}
	slices.Sort(names)
	return names
}
