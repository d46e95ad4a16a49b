package cuda

import (
	"fmt"
	"runtime"
	"unsafe"

	"github.com/ebitengine/purego"

	"xmix/bundle"
)

// The bundle names every tensor-core GEMM as its own node kind (bundle.GemmOf: x f32 [M,K],
// w bf16 [N,K], y f32 [M,N]), so the backend may serve it with its PTX kernel or with
// cuBLASLt captured into the same step graph (DESIGN.md, "Backends"). cuBLASLt takes x as
// bf16: a cast kernel (castPTX, below) rounds x to bf16 into a scratch buffer, then one
// cublasLtMatmul computes y = bf16(x) . w^T with f32 accumulation. That is the precision of
// every bf16 serving stack; the PTX kernel carries 16 bits of x's mantissa (hi+lo, see
// ops/gemm_tc.go), so the two differ by about 2^-9 relative in x. Rows stay independent
// (row i of y depends only on row i of x and w), so rows without an app remain bit-identical
// to a bundle without it under either server.

// Gemm servers for Options.Gemm.
const (
	GemmAuto     = "auto"     // the bundle's copy-engine GEMMs where it has one, cuBLASLt for the other gemm_tc nodes when the library loads, else PTX
	GemmPTX      = "ptx"      // the bundle's kernels only
	GemmCublasLt = "cublaslt" // cuBLASLt for every gemm_tc node; an error when it cannot load
)

// ltWorkspaceBytes is cuBLASLt's scratch space; NVIDIA recommends 32 MiB on Hopper.
const ltWorkspaceBytes = 32 << 20

// cuBLASLt enum values (cublasLt.h, library_types.h, cublas_api.h).
const (
	cublasCompute32F     = 68
	cudaR32F             = 0
	cudaR16BF            = 14
	cublasOpN            = 0
	cublasOpT            = 1
	ltDescTransA         = 3
	ltDescTransB         = 4
	ltPrefMaxWorkspace   = 1
	ltPrefMinAlignmentA  = 5 // then B, C, D at 6, 7, 8
	ltHeuristicResultLen = 96
	// cublasLtMatmulAlgoConfigAttributes_t, and the heuristic result's fields past its algo.
	ltConfigID        = 0
	ltConfigTile      = 1
	ltConfigSplitK    = 2
	ltConfigReduction = 3
	ltConfigSwizzle   = 4
	ltConfigCustom    = 5
	ltConfigStages    = 6
	ltConfigInner     = 7
	ltConfigCluster   = 8
	ltResultWorkspace = 64 // size_t
	ltReductionNone   = 0
	ltReductionF32    = 2 // split-K partial sums in the compute type, in the workspace
	// ltCandidates is how many heuristic results ltNode asks for where a pick is to be found
	// among them, and how many tuning times.
	ltCandidates = 32
)

var ltSymbols = []string{
	"cublasLtCreate", "cublasLtDestroy", "cublasLtGetStatusName", "cublasLtMatmulDescCreate",
	"cublasLtMatmulDescDestroy", "cublasLtMatmulDescSetAttribute", "cublasLtMatrixLayoutCreate",
	"cublasLtMatrixLayoutDestroy", "cublasLtMatmulPreferenceCreate", "cublasLtMatmulPreferenceDestroy",
	"cublasLtMatmulPreferenceSetAttribute", "cublasLtMatmulAlgoGetHeuristic", "cublasLtMatmul",
	"cublasLtMatmulAlgoConfigGetAttribute", "cublasLtMatmulAlgoConfigSetAttribute", "cublasLtMatmulAlgoCheck",
	"cublasLtGetVersion",
}

// ltLibraryPaths: the soname first (ld.so.conf, LD_LIBRARY_PATH), then the CUDA toolkit's
// default place, which is often not on the loader's path.
var ltLibraryPaths = []string{
	"libcublasLt.so.13", "libcublasLt.so.12", "/usr/local/cuda/lib64/libcublasLt.so.13",
	"/usr/local/cuda/lib64/libcublasLt.so.12", "libcublasLt.so",
}

// castPTX rounds n f32 values (n even) to bf16. A thread converts four pairs an iteration
// (two 16-byte loads, one 16-byte store) over the quads of pairs, then the pairs past them one
// by one, both in grid-stride loops; with no quads every pair goes one by one. cvt.rn.bf16x2.f32
// puts its first source in the upper half, so each pair is stored in memory order. It waits for
// the grid ahead before reading x, so where the node's own kernel is built for programmatic
// dependent launch the cast is launched early as that kernel would be (its launch overlaps the
// tail of the kernel ahead); launched plainly, the wait is a no-op. It lets the grid after it
// launch at once: cuBLASLt's kernels are launched plainly, so the trigger changes nothing for
// them, while a copy-engine GEMM of bf16(x) launched early asks for its W while x is cast, and
// waits for the cast before it reads x.
const castPTX = `.version 8.0
.target sm_90
.address_size 64

.visible .entry xmix_cast_bf16(
	.param .u64 src,
	.param .u64 dst,
	.param .u32 pairs,
	.param .u32 quads
)
{
	.reg .pred %p1;
	.reg .b32 %r<14>;
	.reg .b64 %rd<8>;
	.reg .f32 %f<9>;
	ld.param.u64 %rd1, [src];
	ld.param.u64 %rd2, [dst];
	ld.param.u32 %r1, [pairs];
	ld.param.u32 %r8, [quads];
	griddepcontrol.launch_dependents;
	griddepcontrol.wait;
	mov.u32 %r2, %ctaid.x;
	mov.u32 %r3, %ntid.x;
	mov.u32 %r4, %tid.x;
	mad.lo.u32 %r5, %r2, %r3, %r4;
	mov.u32 %r6, %nctaid.x;
	mul.lo.u32 %r6, %r6, %r3;
	mov.u32 %r9, %r5;
QUADS:
	setp.ge.u32 %p1, %r9, %r8;
	@%p1 bra PAIRS;
	mul.wide.u32 %rd3, %r9, 32;
	add.u64 %rd4, %rd1, %rd3;
	ld.global.v4.f32 {%f1, %f2, %f3, %f4}, [%rd4];
	ld.global.v4.f32 {%f5, %f6, %f7, %f8}, [%rd4+16];
	cvt.rn.bf16x2.f32 %r10, %f2, %f1;
	cvt.rn.bf16x2.f32 %r11, %f4, %f3;
	cvt.rn.bf16x2.f32 %r12, %f6, %f5;
	cvt.rn.bf16x2.f32 %r13, %f8, %f7;
	mul.wide.u32 %rd5, %r9, 16;
	add.u64 %rd6, %rd2, %rd5;
	st.global.v4.b32 [%rd6], {%r10, %r11, %r12, %r13};
	add.u32 %r9, %r9, %r6;
	bra QUADS;
PAIRS:
	shl.b32 %r9, %r8, 2;
	add.u32 %r5, %r5, %r9;
LOOP:
	setp.ge.u32 %p1, %r5, %r1;
	@%p1 bra DONE;
	mul.wide.u32 %rd3, %r5, 8;
	add.u64 %rd4, %rd1, %rd3;
	ld.global.v2.f32 {%f1, %f2}, [%rd4];
	cvt.rn.bf16x2.f32 %r7, %f2, %f1;
	mul.wide.u32 %rd5, %r5, 4;
	add.u64 %rd6, %rd2, %rd5;
	st.global.b32 [%rd6], %r7;
	add.u32 %r5, %r5, %r6;
	bra LOOP;
DONE:
	ret;
}
`

const castEntry = "xmix_cast_bf16"

// castWork is castPTX's pairs and quads for n f32 values at x. Quads go to a cast ahead of a
// copy-engine GEMM (wide), whose launch waits for every CTA of the cast to begin: a quarter of
// the CTAs begin sooner (the 8B's down projection at 32 rows: 224, where one a pair took 896
// and 1.3 µs to begin), and the 8B's 32-row step was 0.4-1.3% shorter with them; quads in its
// down projection's cast alone gained nothing, and the 1B's step (whose only such GEMM at 32
// rows is gate/up) was 0.2-0.4% longer. Ahead of cuBLASLt, launched plainly after the cast has
// ended, the 1B's steps were 0.4-1.0% longer with quads (testsuite/gpu/RESULTS.md, session 48),
// so a cast there takes every pair one by one, as where x is not 16-byte aligned.
func castWork(n int, x uintptr, wide bool) (pairs, quads int) {
	pairs = n / 2
	if wide && x%16 == 0 {
		quads = pairs / 4
	}
	return pairs, quads
}

// castLaunch is the grid of castPTX for its pairs and quads: 256 threads, a thread for each
// quad and for each pair past them, at most 1024 blocks.
func castLaunch(pairs, quads int) (grid, block int) {
	threads := max(quads, pairs-4*quads)
	return max(1, min((threads+255)/256, 1024)), 256
}

// cublasLt is the loaded library and the state shared by every node it serves.
type cublasLt struct {
	fn         map[string]uintptr
	statusName func(int32) string
	handle     uintptr
	ws         uintptr // device workspace, ltWorkspaceBytes
	xb         uintptr // device scratch for bf16(x), xbBytes
	xbBytes    int64
	// heavyXB is the scratch of the GEMMs of heavy nodes (a logit lens's LM head), apart from
	// xb: a launch that feeds bf16(x) to a GEMM past heavy nodes writes it in xb (feed.go's
	// fedAt), and the graph variants that run those nodes must leave it there.
	heavyXB      uintptr
	heavyXBBytes int64
	castMod      uintptr
	cast         uintptr
	descs        []uintptr // matmul descriptors, destroyed at Close
	layouts      []uintptr
	one, zero    *float32
	// strict (--gemm cublaslt) makes a node cuBLASLt cannot serve an error; otherwise the
	// node keeps its PTX kernel and fallbacks counts it (the first error kept for the log).
	strict      bool
	fallbacks   int
	fallbackErr error
	// served holds each prepared matmul launch by its shape and pointers: a template's graph
	// variants and its app-free nodes share their GEMM nodes, prepared once.
	served  map[ltKey]*launch
	version int // cublasLtGetVersion
	// picks are the tuned algorithms for this GPU and version (gemm_picks.go); picked and
	// missed count the prepared GEMMs that found theirs and those whose pick the library no
	// longer offers (they take its first result).
	picks          gemmPicks
	picked, missed int
}

// ltResult is one cublasLtMatmulHeuristicResult_t: the algo (64 bytes), the workspace it
// needs, its status and the waves it fills.
type ltResult [ltHeuristicResultLen]byte

// ltKey identifies one GEMM call: the same shape on the same buffers is the same launch.
type ltKey struct {
	g       bundle.GEMM
	x, w, y uintptr
	heavy   bool    // a heavy node's GEMM: its cast writes heavyXB
	fed     uintptr // where the launch ahead wrote bf16(x) (0: the cast writes it in scratch)
	yBF16   bool    // y is written in bf16 (gu.go)
}

// ltMatmul is one GEMM node served by cuBLASLt: its descriptors, chosen algorithm and
// pointers, fixed for the life of the graph.
type ltMatmul struct {
	desc, a, b, c uintptr
	algo          ltResult // the heuristic result; its first 64 bytes are the algo
	x, w, y       uintptr  // x: where bf16(x) is read (the cast's xb or heavyXB, or the copy server's yb)
	yBF16         bool     // y (C and D) is bf16, not f32
}

func loadCublasLt() (*cublasLt, error) {
	var lib uintptr
	var err error
	for _, p := range ltLibraryPaths {
		if lib, err = purego.Dlopen(p, purego.RTLD_NOW|purego.RTLD_GLOBAL); err == nil {
			break
		}
	}
	if lib == 0 {
		return nil, fmt.Errorf("cuBLASLt not found (tried %v): %v", ltLibraryPaths, err)
	}
	lt := &cublasLt{fn: map[string]uintptr{}, one: new(float32), zero: new(float32), served: map[ltKey]*launch{}}
	*lt.one = 1
	for _, s := range ltSymbols {
		p, err := purego.Dlsym(lib, s)
		if err != nil || p == 0 {
			return nil, fmt.Errorf("cuBLASLt lacks %s (need cuBLAS 12 or newer)", s)
		}
		lt.fn[s] = p
	}
	purego.RegisterFunc(&lt.statusName, lt.fn["cublasLtGetStatusName"])
	v, _, _ := purego.SyscallN(lt.fn["cublasLtGetVersion"])
	lt.version = int(v)
	return lt, nil
}

// ProbeCublasLt says whether cuBLASLt can be loaded on this machine (no GPU work).
func ProbeCublasLt() error {
	_, err := loadCublasLt()
	return err
}

// call invokes a cuBLASLt function and turns a non-zero cublasStatus_t into an error.
//
// uintptrescapes: callers pass pointers converted to uintptr (out-parameters such as &p of
// cuMemAlloc, host buffers). Without it those may stay on a goroutine stack, which moves when
// it grows inside the call, and the library writes or reads the old address. The likely cause
// of one CUDA_ERROR_INVALID_VALUE from cuMemcpyHtoD seen on the H200 in 22 Mixtral loads: a
// cuMemAlloc that wrote its pointer to the old stack, leaving p zero.
//
//go:uintptrescapes
func (lt *cublasLt) call(name string, args ...uintptr) error {
	r, _, _ := purego.SyscallN(lt.fn[name], args...)
	if code := int32(r); code != 0 {
		return fmt.Errorf("%s: %s (%d)", name, lt.statusName(code), code)
	}
	return nil
}

// initCublasLt loads cuBLASLt for the bundle's gemm_tc nodes when the options ask for it:
// nil (and no error) when PTX serves every GEMM.
func (be *Backend) initCublasLt(b *bundle.Bundle, mode string, picks []GemmPick, progress Progress) error {
	var xbBytes, heavyBytes int64
	for _, t := range b.Templates {
		for _, n := range t.Nodes {
			if g, ok := be.gemm(n); ok {
				if n.SkipUnless != 0 {
					heavyBytes = max(heavyBytes, int64(g.M)*int64(g.K)*2)
				} else {
					xbBytes = max(xbBytes, int64(g.M)*int64(g.K)*2)
				}
			}
		}
	}
	if mode == GemmPTX || xbBytes+heavyBytes == 0 {
		return nil
	}
	lt, err := loadCublasLt()
	if err == nil {
		err = be.setupCublasLt(lt, xbBytes, heavyBytes)
	}
	if err != nil {
		if mode == GemmCublasLt {
			return fmt.Errorf("--gemm cublaslt: %w", err)
		}
		progress("cuda: GEMMs served by PTX kernels (cuBLASLt unavailable: %v)", err)
		return nil
	}
	lt.strict = mode == GemmCublasLt
	lt.picks = picksFor(picks, be.Dev.Name, lt.version)
	be.lt = lt
	progress("cuda: tensor-core GEMMs served by cuBLASLt %d (%d MiB scratch; %d tuned shapes for this GPU)",
		lt.version, (xbBytes+heavyBytes+ltWorkspaceBytes)>>20, len(lt.picks))
	return nil
}

func (be *Backend) setupCublasLt(lt *cublasLt, xbBytes, heavyBytes int64) error {
	d := be.d
	if err := lt.call("cublasLtCreate", uintptr(unsafe.Pointer(&lt.handle))); err != nil {
		return err
	}
	for _, a := range []struct {
		p *uintptr
		n int64
	}{{&lt.ws, ltWorkspaceBytes}, {&lt.xb, xbBytes}, {&lt.heavyXB, heavyBytes}} {
		if a.n == 0 {
			continue
		}
		if err := d.call("cuMemAlloc_v2", uintptr(unsafe.Pointer(a.p)), uintptr(a.n)); err != nil {
			return fmt.Errorf("allocating %d bytes for cuBLASLt: %w", a.n, err)
		}
		be.allocs = append(be.allocs, *a.p)
	}
	lt.xbBytes, lt.heavyXBBytes = xbBytes, heavyBytes
	// Traced, the cast's records follow the bundle's kernels' ids.
	castID := uint32(len(be.kernels))
	text, err := be.tracedPTX(castPTX, castEntry, castID)
	if err != nil {
		return fmt.Errorf("cast kernel: %w", err)
	}
	src := append([]byte(text), 0)
	err = d.call("cuModuleLoadDataEx", uintptr(unsafe.Pointer(&lt.castMod)), uintptr(unsafe.Pointer(&src[0])), 0, 0, 0)
	runtime.KeepAlive(src)
	if err != nil {
		return fmt.Errorf("cast kernel: %w", err)
	}
	be.modules = append(be.modules, lt.castMod)
	name := append([]byte(castEntry), 0)
	if err := d.call("cuModuleGetFunction", uintptr(unsafe.Pointer(&lt.cast)), lt.castMod, uintptr(unsafe.Pointer(&name[0]))); err != nil {
		return err
	}
	if be.trace != nil {
		be.trace.ids[lt.cast] = castID
	}
	return nil
}

// gemm reads node n as a GEMM cuBLASLt can serve: a GEMM node (bundle.GemmOf) with an even
// K. A guarded GEMM (a logit lens's LM head) is only taken when its node is skipped on the
// same bits: the library call has no early exit, so the graph variants must leave it out
// (prepare checks that they do).
func (be *Backend) gemm(n bundle.Node) (bundle.GEMM, bool) {
	k, ok := be.kernels[n.Kernel]
	if !ok {
		return bundle.GEMM{}, false
	}
	g, ok, err := bundle.GemmOf(n, k)
	if err != nil || !ok || g.K%2 != 0 || g.Guard != n.SkipUnless {
		return bundle.GEMM{}, false
	}
	return g, true
}

// ltNode prepares node n (vals: its arguments' device addresses and constants) for cuBLASLt: the cast
// launch and the matmul with its algorithm, run once outside any graph so that a
// failure surfaces here, not inside a capture. ok is false when cuBLASLt does not take it
// (the node then runs its PTX kernel). fed, if not 0, is where the launch ahead wrote
// bf16(x) (feedable's scratches: the cast's, or the copy server's yb that a gated copy-engine
// kernel writes): the matmul then reads it there and runs alone. yBF16: the matmul writes y
// in bf16.
func (be *Backend) ltNode(n bundle.Node, vals []uint64, fed uintptr, yBF16 bool) (*launch, bool, error) {
	g, ok := be.gemm(n)
	if !ok || be.lt == nil || g.M <= 0 {
		return nil, false, nil
	}
	lt := be.lt
	xb := lt.scratch(n)
	if fed != 0 {
		if !be.ltReads(n, fed) {
			return nil, false, fmt.Errorf("bf16(x) written at %#x, in no scratch that cuBLASLt reads", fed)
		}
		xb = fed
	}
	key := ltKey{g: g, x: uintptr(vals[g.X]), w: uintptr(vals[g.W]), y: uintptr(vals[g.Y]), heavy: n.SkipUnless != 0, fed: fed, yBF16: yBF16}
	if l, ok := lt.served[key]; ok {
		return l, true, nil
	}
	ptrs := []uintptr{key.w, key.y}
	if key.fed == 0 {
		ptrs = append(ptrs, key.x)
	}
	for _, p := range ptrs {
		if p%16 != 0 {
			return nil, false, nil
		}
	}
	m, err := lt.newMatmul(g, xb, key.w, key.y, yBF16)
	if err != nil {
		return nil, false, err
	}
	if m.algo, err = lt.algorithm(m, g); err != nil {
		return nil, false, err
	}
	l := &launch{label: n.Label, kernel: "cublasLt:" + n.Kernel}
	if key.fed != 0 {
		be.fed++
	} else {
		l = be.castNode(n, g, key.x, l.kernel, false)
	}
	l.matmul = m
	if err := be.runOnce(*l); err != nil {
		return nil, false, err
	}
	lt.served[key] = l
	return l, true, nil
}

// castNode is GEMM node n's cast of x (g's rows) to bf16 into the library's scratch for n
// (scratch), launched where n's own kernel would be and early as it would be; kernel names
// the launch in errors and profiles; wide: a copy-engine GEMM follows (castWork). What
// multiplies after it is the caller's (matmul or then).
func (be *Backend) castNode(n bundle.Node, g bundle.GEMM, x uintptr, kernel string, wide bool) *launch {
	pairs, quads := castWork(g.M*g.K, x, wide)
	grid, block := castLaunch(pairs, quads)
	return &launch{label: n.Label, kernel: kernel, f: be.lt.cast, grid: [3]int{grid, 1, 1}, block: [3]int{block, 1, 1},
		params: be.keepParams([]uint64{uint64(x), uint64(be.lt.scratch(n)), uint64(pairs), uint64(quads)}), early: be.kernels[n.Kernel].EarlyLaunch}
}

// ltReads says whether cuBLASLt's matmul for node n may read bf16(x) at xb as the launch
// ahead wrote it there: the cast's scratch for n, or the copy server's yb, where the gated
// copy-engine kernel writes it (not for a heavy node, whose GEMM reads heavyXB alone).
func (be *Backend) ltReads(n bundle.Node, xb uintptr) bool {
	return xb == be.lt.scratch(n) || be.copy != nil && xb == be.copy.yb && n.SkipUnless == 0
}

// scratch is where node n's GEMM reads bf16(x): heavyXB for a heavy node's, else xb.
func (lt *cublasLt) scratch(n bundle.Node) uintptr {
	if n.SkipUnless != 0 {
		return lt.heavyXB
	}
	return lt.xb
}

// newMatmul describes y = bf16(x) . w^T for g: its matmul descriptor and matrix layouts,
// destroyed at close. x is the cast's scratch (lt.scratch); y is f32, or bf16 where yBF16
// (the sums rounded to nearest even once, in the epilogue).
func (lt *cublasLt) newMatmul(g bundle.GEMM, x, w, y uintptr, yBF16 bool) (*ltMatmul, error) {
	m := &ltMatmul{x: x, w: w, y: y, yBF16: yBF16}
	yType := uintptr(cudaR32F)
	if yBF16 {
		yType = cudaR16BF
	}
	if err := lt.call("cublasLtMatmulDescCreate", uintptr(unsafe.Pointer(&m.desc)), cublasCompute32F, cudaR32F); err != nil {
		return nil, err
	}
	lt.descs = append(lt.descs, m.desc)
	transA, transB := int32(cublasOpT), int32(cublasOpN)
	if err := lt.call("cublasLtMatmulDescSetAttribute", m.desc, ltDescTransA, uintptr(unsafe.Pointer(&transA)), 4); err != nil {
		return nil, err
	}
	if err := lt.call("cublasLtMatmulDescSetAttribute", m.desc, ltDescTransB, uintptr(unsafe.Pointer(&transB)), 4); err != nil {
		return nil, err
	}
	// Column-major views of the row-major tensors: w [N,K] is a K x N matrix (op T gives
	// N x K), x [rows,K] is K x rows, y [rows,N] is N x rows.
	for _, l := range []struct {
		p          *uintptr
		dtype      uintptr
		rows, cols int
	}{{&m.a, cudaR16BF, g.K, g.N}, {&m.b, cudaR16BF, g.K, g.M}, {&m.c, yType, g.N, g.M}} {
		if err := lt.call("cublasLtMatrixLayoutCreate", uintptr(unsafe.Pointer(l.p)), l.dtype, uintptr(l.rows), uintptr(l.cols), uintptr(l.rows)); err != nil {
			return nil, err
		}
		lt.layouts = append(lt.layouts, *l.p)
	}
	return m, nil
}

// heuristics returns up to want of cuBLASLt's algorithms for m, best estimate first, for
// its pointers' alignments and the workspace it has.
func (lt *cublasLt) heuristics(m *ltMatmul, g bundle.GEMM, want int) ([]ltResult, error) {
	var pref uintptr
	if err := lt.call("cublasLtMatmulPreferenceCreate", uintptr(unsafe.Pointer(&pref))); err != nil {
		return nil, err
	}
	defer lt.call("cublasLtMatmulPreferenceDestroy", pref)
	wsBytes := uint64(ltWorkspaceBytes)
	if err := lt.call("cublasLtMatmulPreferenceSetAttribute", pref, ltPrefMaxWorkspace, uintptr(unsafe.Pointer(&wsBytes)), 8); err != nil {
		return nil, err
	}
	for i, p := range []uintptr{m.w, m.x, m.y, m.y} {
		align := uint32(min(256, p&-p))
		if err := lt.call("cublasLtMatmulPreferenceSetAttribute", pref, uintptr(ltPrefMinAlignmentA+i), uintptr(unsafe.Pointer(&align)), 4); err != nil {
			return nil, err
		}
	}
	res := make([]ltResult, want)
	var found int32
	if err := lt.call("cublasLtMatmulAlgoGetHeuristic", lt.handle, m.desc, m.a, m.b, m.c, m.c, pref, uintptr(want),
		uintptr(unsafe.Pointer(&res[0][0])), uintptr(unsafe.Pointer(&found))); err != nil {
		return nil, err
	}
	if found < 1 {
		return nil, fmt.Errorf("cuBLASLt has no algorithm for %dx%dx%d bf16", g.M, g.N, g.K)
	}
	return res[:found], nil
}

// configAttr reads one configuration attribute of a result's algo, of size bytes (4, or 2
// for the inner and cluster shapes).
func (lt *cublasLt) configAttr(r *ltResult, attr, size uintptr) (uint32, error) {
	var v uint32
	var n uint64
	err := lt.call("cublasLtMatmulAlgoConfigGetAttribute", uintptr(unsafe.Pointer(&r[0])), attr,
		uintptr(unsafe.Pointer(&v)), size, uintptr(unsafe.Pointer(&n)))
	return v, err
}

// config reads the configuration of a result's algo.
func (lt *cublasLt) config(r *ltResult) (ltConfig, error) {
	var c ltConfig
	for _, a := range []struct {
		attr, size uintptr
		v          *int
	}{
		{ltConfigID, 4, &c.algo}, {ltConfigTile, 4, &c.tile}, {ltConfigStages, 4, &c.stages}, {ltConfigSplitK, 4, &c.split},
		{ltConfigSwizzle, 4, &c.swizzle}, {ltConfigCustom, 4, &c.custom}, {ltConfigInner, 2, &c.inner}, {ltConfigCluster, 2, &c.cluster},
	} {
		v, err := lt.configAttr(r, a.attr, a.size)
		if err != nil {
			return ltConfig{}, err
		}
		*a.v = int(v)
	}
	return c, nil
}

// withSplit returns r with its K cut into split parts (1: none) and checks that cuBLASLt
// takes it for m within the workspace.
func (lt *cublasLt) withSplit(m *ltMatmul, r ltResult, split int) (ltResult, error) {
	red, err := lt.configAttr(&r, ltConfigReduction, 4)
	if err != nil {
		return r, err
	}
	switch {
	case split == 1:
		red = ltReductionNone
	case red == ltReductionNone:
		red = ltReductionF32
	}
	sk := uint32(split)
	for _, a := range []struct {
		attr uintptr
		v    *uint32
	}{{ltConfigSplitK, &sk}, {ltConfigReduction, &red}} {
		if err := lt.call("cublasLtMatmulAlgoConfigSetAttribute", uintptr(unsafe.Pointer(&r[0])), a.attr, uintptr(unsafe.Pointer(a.v)), 4); err != nil {
			return r, err
		}
	}
	var chk ltResult
	if err := lt.call("cublasLtMatmulAlgoCheck", lt.handle, m.desc, m.a, m.b, m.c, m.c, uintptr(unsafe.Pointer(&r[0])), uintptr(unsafe.Pointer(&chk[0]))); err != nil {
		return r, err
	}
	if ws := *(*uint64)(unsafe.Pointer(&chk[ltResultWorkspace])); ws > ltWorkspaceBytes {
		return r, fmt.Errorf("split %d needs %d bytes of workspace, more than %d", split, ws, ltWorkspaceBytes)
	}
	// The check reports the workspace and waves; the algo is the one checked, whatever the
	// library leaves in the result's copy of it.
	copy(chk[:ltResultWorkspace], r[:ltResultWorkspace])
	return chk, nil
}

// algorithm is the algorithm m runs for g: the tuned pick where the table has one and
// cuBLASLt still offers it among its first ltCandidates results, else the library's first.
func (lt *cublasLt) algorithm(m *ltMatmul, g bundle.GEMM) (ltResult, error) {
	p, ok := lt.picks[GemmShape{g.M, g.N, g.K}]
	if !ok {
		res, err := lt.heuristics(m, g, 1)
		if err != nil {
			return ltResult{}, err
		}
		return res[0], nil
	}
	res, err := lt.heuristics(m, g, ltCandidates)
	if err != nil {
		return ltResult{}, err
	}
	for i := range res {
		c, err := lt.config(&res[i])
		if err != nil {
			return res[0], err
		}
		if !p.matches(c) {
			continue
		}
		r := res[i]
		if c.split != p.Split {
			if r, err = lt.withSplit(m, r, p.Split); err != nil {
				break
			}
		}
		lt.picked++
		return r, nil
	}
	lt.missed++
	return res[0], nil
}

// run enqueues the matmul on stream (inside a capture, it records it).
func (lt *cublasLt) run(m *ltMatmul, stream uintptr) error {
	return lt.call("cublasLtMatmul", lt.handle, m.desc, uintptr(unsafe.Pointer(lt.one)), m.w, m.a, m.x, m.b,
		uintptr(unsafe.Pointer(lt.zero)), m.y, m.c, m.y, m.c, uintptr(unsafe.Pointer(&m.algo[0])), lt.ws,
		ltWorkspaceBytes, stream)
}

func (lt *cublasLt) close() {
	for _, l := range lt.layouts {
		lt.call("cublasLtMatrixLayoutDestroy", l)
	}
	for _, d := range lt.descs {
		lt.call("cublasLtMatmulDescDestroy", d)
	}
	if lt.handle != 0 {
		lt.call("cublasLtDestroy", lt.handle)
	}
}
