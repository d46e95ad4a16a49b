// Package cuda is the GPU backend: it loads a bundle's PTX through the CUDA driver API
// (libcuda.so.1 via purego, no cgo), allocates every buffer on the device, captures one CUDA
// graph per template at load time and replays it every step. Host-written control buffers
// live in one device arena that is refreshed by a single async copy before each replay;
// outputs live in another that is copied back after it, so a step costs one graph launch,
// two copies and one stream synchronisation.
package cuda

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"runtime"
	"strings"
	"time"
	"unsafe"

	"xmix/bundle"
	"xmix/loader"
	"xmix/ops"
)

// Progress reports load progress (may be nil).
type Progress func(format string, args ...any)

// Device describes the GPU a backend runs on.
type Device struct {
	Name        string
	Major       int
	Minor       int
	SMs         int
	TotalMemory int64
	FreeMemory  int64
	Driver      int
}

func (d Device) String() string {
	return fmt.Sprintf("%s (sm_%d%d, %d SMs, %.1f GiB)", d.Name, d.Major, d.Minor, d.SMs, float64(d.TotalMemory)/(1<<30))
}

// arena is a set of buffers placed in one device allocation with a pinned host mirror.
type arena struct {
	dev    uintptr
	host   unsafe.Pointer // pinned
	size   int64
	offset map[string]int64
	sizes  map[string]int64
	lo, hi int64 // dirty byte range of the host mirror (control arena)
}

func (a *arena) hostBytes() []byte {
	if a.size == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(a.host), a.size)
}

// launch is one recorded kernel launch of a template.
type launch struct {
	label, kernel string
	f             uintptr
	grid, block   [3]int
	shared        int
	params        uintptr
	skipUnless    uint32    // bundle.Node.SkipUnless (variants.go)
	matmul        *ltMatmul // non-nil: f casts x to bf16 (f 0: none, x is fed), then cuBLASLt multiplies (cublaslt.go)
	then          *launch   // non-nil: f casts x to bf16, then this kernel multiplies (gemm_copy.go)
	early         bool      // bundle.Kernel.EarlyLaunch: launched with programmatic stream serialization
}

// Backend runs a bundle on one GPU. All driver calls happen on an OS-locked thread with its
// context current (thread.go): after the load the caller's, or with Options.OwnThread the
// backend's own.
type Backend struct {
	work   chan func()
	done   chan struct{}
	caller *callerThread // non-nil: calls run on the caller's thread (all but Options.OwnThread)

	d       *driver
	Dev     Device
	ctx     uintptr
	stream  uintptr
	bufs    map[string]uintptr // device address of every buffer
	sizes   map[string]int64
	allocs  []uintptr
	ctl     arena
	out     arena
	modules []uintptr
	funcs   map[string]uintptr
	kernels map[string]bundle.Kernel
	regs    map[string]int // registers a thread of each kernel as the driver compiled it
	copy    *copyServer    // non-nil: GEMM nodes the bundle's copy-engine kernels serve (gemm_copy.go)
	trace   *traceBuffer   // non-nil: every kernel writes the step trace (trace.go)
	lt      *cublasLt      // nil: PTX kernels serve every GEMM
	fed     int            // GEMM launches reading bf16(x) as the launch ahead wrote it (feed.go)
	f32Cut  int            // launches feedAhead prepared to write their bf16 copy alone (feed.go)
	guF32   bool           // Options.GuF32
	guBF16  int            // gate/up GEMMs cuBLASLt serves writing bf16 for the activation (gu.go)
	steps   []stepGraphs   // each template's graph variants (variants.go)
	// gated: the gated pairs of the node list prepareAll prepares, which planPair asks of each
	// node; for another list it finds them anew.
	gated *bundle.GatedPairs
	// outCopies: per template, what of the output arena a step copies back (outputs.go);
	// outFresh: bytes of each output buffer the last step copied (Read serves those).
	outCopies [][]outCopy
	outFresh  map[string]int64
	params    [][]uint64
	paramP    [][]uintptr
	closed    bool
	// gaps: the host's time between steps, as Step sees it (HostGaps).
	gaps hostGaps
}

// do runs f where the backend's context is current and waits for it (thread.go).
func (be *Backend) do(f func() error) error {
	if be.caller != nil {
		return be.caller.run(f)
	}
	return onThread(be.work, f)
}

// Probe reports the GPU that New would use, or why there is none.
func Probe() (Device, error) {
	d, err := loadDriver()
	if err != nil {
		return Device{}, err
	}
	var dev Device
	err = withLockedThread(func() error {
		var e error
		dev, e = probe(d)
		return e
	})
	return dev, err
}

func withLockedThread(f func() error) error {
	ch := make(chan error)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		ch <- f()
	}()
	return <-ch
}

func probe(d *driver) (Device, error) {
	if err := d.call("cuInit", 0); err != nil {
		return Device{}, fmt.Errorf("the NVIDIA driver failed to start: %w", err)
	}
	var n int32
	if err := d.call("cuDeviceGetCount", uintptr(unsafe.Pointer(&n))); err != nil || n == 0 {
		return Device{}, fmt.Errorf("no CUDA device found (driver sees %d GPUs)", n)
	}
	var dev Device
	var ver int32
	if err := d.call("cuDriverGetVersion", uintptr(unsafe.Pointer(&ver))); err != nil {
		return dev, err
	}
	dev.Driver = int(ver)
	name := make([]byte, 256)
	if err := d.call("cuDeviceGetName", uintptr(unsafe.Pointer(&name[0])), 256, 0); err != nil {
		return dev, err
	}
	dev.Name = strings.TrimRight(string(name), "\x00")
	for _, a := range []struct {
		attr int
		dst  *int
	}{{75, &dev.Major}, {76, &dev.Minor}, {16, &dev.SMs}} {
		var v int32
		if err := d.call("cuDeviceGetAttribute", uintptr(unsafe.Pointer(&v)), uintptr(a.attr), 0); err != nil {
			return dev, err
		}
		*a.dst = int(v)
	}
	var total uint64
	if err := d.call("cuDeviceTotalMem_v2", uintptr(unsafe.Pointer(&total)), 0); err != nil {
		return dev, err
	}
	dev.TotalMemory = int64(total)
	return dev, nil
}

// Options configure New.
type Options struct {
	Progress Progress // load progress (may be nil)
	// Gemm picks who serves the bundle's tensor-core GEMM nodes: GemmAuto (the default),
	// GemmPTX or GemmCublasLt.
	Gemm string
	// LoadReaders is how many goroutines read the checkpoint into pinned staging while
	// earlier chunks are copied (0: loader.DefaultReaders).
	LoadReaders int
	// GemmPicks are cuBLASLt's tuned algorithms (gemm_picks.go); nil: the shipped table
	// (DefaultGemmPicks), empty: none (the library's first choice everywhere).
	GemmPicks []GemmPick
	// Trace instruments every kernel for Backend.Trace (trace.go); the stamps cost time, so
	// a traced backend's other timings are not the bundle's.
	Trace bool
	// GuF32 keeps every gate/up GEMM that cuBLASLt serves writing f32 (for measuring); by
	// default one whose y only the gated activation after it reads writes it in bf16 for that
	// kernel (gu.go).
	GuF32 bool
	// OwnThread hands every driver call to the backend's own locked thread, as before, and
	// waits to be woken (for measuring). By default the calls after the load (each step's
	// among them) run on the calling goroutine's thread, locked for the call with the
	// context made current there, so a step wakes no other thread: on an H100 the host's
	// gap between steps fell from 41-70 us to 5-16 us (thread.go; testsuite/gpu/RESULTS.md,
	// session 70).
	OwnThread bool
	// NoSolo leaves the templates' Solo node lists unused (for measuring): a step that
	// enables one app runs every deployed app's ops, as before (variants.go).
	NoSolo bool
}

// New loads a bundle onto GPU 0: modules, buffers, weights, params and graphs.
func New(b *bundle.Bundle, w *loader.Weights, opt Options) (*Backend, error) {
	progress := opt.Progress
	if progress == nil {
		progress = func(string, ...any) {}
	}
	switch opt.Gemm {
	case "":
		opt.Gemm = GemmAuto
	case GemmAuto, GemmPTX, GemmCublasLt:
	default:
		return nil, fmt.Errorf("unknown GEMM server %q: use auto, ptx or cublaslt", opt.Gemm)
	}
	if opt.GemmPicks == nil {
		picks, err := DefaultGemmPicks()
		if err != nil {
			return nil, err
		}
		opt.GemmPicks = picks
	}
	be, err := start()
	if err != nil {
		return nil, err
	}
	be.guF32 = opt.GuF32
	if err := be.do(func() error { return be.load(b, w, opt, progress) }); err != nil {
		be.Close()
		return nil, err
	}
	if !opt.OwnThread {
		be.caller = &callerThread{makeCurrent: be.makeCurrent}
	}
	return be, nil
}

// start opens GPU 0: a backend with its context and stream on its locked thread, nothing
// loaded yet.
func start() (*Backend, error) {
	d, err := loadDriver()
	if err != nil {
		return nil, err
	}
	be := &Backend{d: d, work: make(chan func()), done: make(chan struct{}), bufs: map[string]uintptr{},
		sizes: map[string]int64{}, funcs: map[string]uintptr{}, kernels: map[string]bundle.Kernel{}, regs: map[string]int{}}
	ready := make(chan error)
	go be.loop(ready)
	if err := <-ready; err != nil {
		return nil, err
	}
	return be, nil
}

func (be *Backend) loop(ready chan<- error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	d := be.d
	dev, err := probe(d)
	if err == nil && dev.Major < 9 {
		err = fmt.Errorf("GPU %s is sm_%d%d; xmix bundles target sm_90 (Hopper: H100, H200) and newer", dev.Name, dev.Major, dev.Minor)
	}
	if err == nil {
		err = d.call("cuDevicePrimaryCtxRetain", uintptr(unsafe.Pointer(&be.ctx)), 0)
	}
	if err == nil {
		err = be.makeCurrent()
	}
	if err == nil {
		var free, total uint64
		err = d.call("cuMemGetInfo_v2", uintptr(unsafe.Pointer(&free)), uintptr(unsafe.Pointer(&total)))
		dev.FreeMemory = int64(free)
	}
	if err == nil {
		err = d.call("cuStreamCreate", uintptr(unsafe.Pointer(&be.stream)), 1) // non-blocking
	}
	be.Dev = dev
	ready <- err
	if err != nil {
		return
	}
	for f := range be.work {
		f()
	}
	close(be.done)
}

func (be *Backend) load(b *bundle.Bundle, w *loader.Weights, opt Options, progress Progress) error {
	d := be.d
	// Memory plan: control and output buffers go to arenas, the rest get one allocation each.
	var need, kvBytes int64
	be.ctl = arena{offset: map[string]int64{}, sizes: map[string]int64{}}
	be.out = arena{offset: map[string]int64{}, sizes: map[string]int64{}}
	for _, buf := range b.Manifest.Buffers {
		n, err := loader.BufferBytes(buf)
		if err != nil {
			return err
		}
		be.sizes[buf.Name] = n
		switch buf.Kind {
		case bundle.KindControl:
			place(&be.ctl, buf.Name, n)
		case bundle.KindOutput:
			place(&be.out, buf.Name, n)
		default:
			need += align(n)
			if buf.Kind == bundle.KindKV {
				kvBytes += align(n)
			}
		}
	}
	need += be.ctl.size + be.out.size
	if need > be.Dev.FreeMemory {
		return fmt.Errorf("out of GPU memory: the bundle needs %.2f GiB, %s has %.2f GiB free of %.2f GiB (%s)",
			float64(need)/(1<<30), be.Dev.Name, float64(be.Dev.FreeMemory)/(1<<30), float64(be.Dev.TotalMemory)/(1<<30),
			poolAdvice(b.Manifest.Model, kvBytes, need-be.Dev.FreeMemory))
	}
	progress("cuda: %s, driver %d, allocating %.2f GiB", be.Dev, be.Dev.Driver, float64(need)/(1<<30))
	for _, a := range []*arena{&be.ctl, &be.out} {
		if a.size == 0 {
			continue
		}
		if err := d.call("cuMemAlloc_v2", uintptr(unsafe.Pointer(&a.dev)), uintptr(a.size)); err != nil {
			return fmt.Errorf("allocating %d bytes: %w", a.size, err)
		}
		be.allocs = append(be.allocs, a.dev)
		if err := d.call("cuMemAllocHost_v2", uintptr(unsafe.Pointer(&a.host)), uintptr(a.size)); err != nil {
			return fmt.Errorf("allocating %d pinned bytes: %w", a.size, err)
		}
		clear(a.hostBytes())
		if err := d.call("cuMemsetD8_v2", a.dev, 0, uintptr(a.size)); err != nil {
			return err
		}
		for name, off := range a.offset {
			be.bufs[name] = a.dev + uintptr(off)
		}
	}
	be.outCopies, be.outFresh = planOutCopies(b, be.out), map[string]int64{}
	if opt.Trace {
		if err := be.newTraceBuffer(); err != nil {
			return err
		}
	}
	start := time.Now()
	if err := be.loadModules(b); err != nil {
		return err
	}
	progress("cuda: %d kernels compiled by the driver in %.2f s", len(b.Kernels), time.Since(start).Seconds())
	if err := be.allocAndFill(b, w, opt.LoadReaders, progress); err != nil {
		return err
	}
	if err := be.initCublasLt(b, opt.Gemm, opt.GemmPicks, progress); err != nil {
		return err
	}
	if err := be.initCopyGemms(b, opt.Gemm); err != nil {
		return err
	}
	start = time.Now()
	for _, t := range b.Templates {
		g, err := be.prepareVariants(t, opt.NoSolo)
		if err != nil {
			return fmt.Errorf("template %s: %w", t.Name, err)
		}
		be.steps = append(be.steps, g)
	}
	prepared := time.Since(start)
	graphs := 0
	for i := range be.steps {
		if err := be.captureGraphs(&be.steps[i]); err != nil {
			return fmt.Errorf("template %s: %w", be.steps[i].tmpl.Name, err)
		}
		graphs += len(be.steps[i].execs)
	}
	progress("cuda: %d graphs instantiated for %d templates in %.2f s (launches prepared in %.2f s)",
		graphs, len(b.Templates), time.Since(start).Seconds(), prepared.Seconds())
	if be.lt != nil && be.lt.fallbacks > 0 {
		progress("cuda: %d GEMM nodes kept their PTX kernel (cuBLASLt refused them; first: %v)", be.lt.fallbacks, be.lt.fallbackErr)
	}
	if be.copy != nil {
		progress("cuda: %d GEMM nodes served by the bundle's copy-engine kernels (%d weights)", be.copy.nodes, len(be.copy.maps))
	}
	if be.guBF16 > 0 {
		progress("cuda: %d gate/up GEMMs served by cuBLASLt write bf16 for their activation", be.guBF16)
	}
	if be.lt != nil && be.lt.picked > 0 {
		progress("cuda: %d GEMMs run their tuned cuBLASLt algorithm", be.lt.picked)
	}
	if be.lt != nil && be.lt.missed > 0 {
		progress("cuda: %d GEMMs take cuBLASLt's first algorithm: their tuned one is not among its results (rerun xmix tune-gemm)", be.lt.missed)
	}
	return d.call("cuCtxSynchronize")
}

func align(n int64) int64 { return (n + 255) &^ 255 }

func place(a *arena, name string, n int64) {
	a.offset[name] = a.size
	a.sizes[name] = n
	a.size += align(n)
}

func (be *Backend) loadModules(b *bundle.Bundle) error {
	d := be.d
	for i, k := range b.Kernels {
		text, err := be.tracedPTX(k.PTX, k.Name, uint32(i))
		if err != nil {
			return fmt.Errorf("kernel %s: %w", k.Name, err)
		}
		src := append([]byte(text), 0)
		errLog := make([]byte, 16384)
		opts := []int32{5, 6} // CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES
		vals := []uintptr{uintptr(unsafe.Pointer(&errLog[0])), uintptr(len(errLog))}
		var mod uintptr
		err = d.call("cuModuleLoadDataEx", uintptr(unsafe.Pointer(&mod)), uintptr(unsafe.Pointer(&src[0])),
			2, uintptr(unsafe.Pointer(&opts[0])), uintptr(unsafe.Pointer(&vals[0])))
		runtime.KeepAlive(src)
		if err != nil {
			return fmt.Errorf("kernel %s: the driver could not compile its PTX: %w\n%s", k.Name, err,
				strings.TrimRight(string(errLog), "\x00"))
		}
		be.modules = append(be.modules, mod)
		var f uintptr
		name := append([]byte(k.Name), 0)
		if err := d.call("cuModuleGetFunction", uintptr(unsafe.Pointer(&f)), mod, uintptr(unsafe.Pointer(&name[0]))); err != nil {
			return fmt.Errorf("kernel %s: %w", k.Name, err)
		}
		var regs int32
		if err := d.call("cuFuncGetAttribute", uintptr(unsafe.Pointer(&regs)), cuFuncAttributeNumRegs, f); err != nil {
			return fmt.Errorf("kernel %s: registers: %w", k.Name, err)
		}
		be.funcs[k.Name], be.regs[k.Name] = f, int(regs)
		be.kernels[k.Name] = k
		if be.trace != nil {
			be.trace.ids[f] = uint32(i)
		}
	}
	return nil
}

// allocAndFill allocates the device buffers, generates synthetic weight matrices on the
// device, streams the other weights through pinned staging (upload.go) and uploads params.
func (be *Backend) allocAndFill(b *bundle.Bundle, w *loader.Weights, readers int, progress Progress) error {
	d := be.d
	params, err := loader.ParamTensors(b)
	if err != nil {
		return err
	}
	var upload []bundle.Buffer
	var dst []uintptr
	var uploadBytes int64
	uploadChunks := 0
	for _, buf := range b.Manifest.Buffers {
		if buf.Kind == bundle.KindControl || buf.Kind == bundle.KindOutput {
			continue
		}
		n := be.sizes[buf.Name]
		var p uintptr
		if err := d.call("cuMemAlloc_v2", uintptr(unsafe.Pointer(&p)), uintptr(n)); err != nil {
			return fmt.Errorf("allocating buffer %s (%d bytes): %w", buf.Name, n, err)
		}
		be.allocs = append(be.allocs, p)
		be.bufs[buf.Name] = p
		switch buf.Kind {
		case bundle.KindWeight:
			if synth := w.Synthetic(); synth != nil && synth.Kernel != "" && len(buf.Shape) > 1 {
				if err := be.synthesize(synth, buf, p, n); err != nil {
					return err
				}
				continue
			}
			upload, dst = append(upload, buf), append(dst, p)
			uploadBytes += n
			uploadChunks += int((n + loader.ChunkBytes - 1) / loader.ChunkBytes)
		case bundle.KindParam:
			data, ok := params[buf.Name]
			if !ok || int64(len(data)) != n {
				return fmt.Errorf("param buffer %s: no matching tensor in the bundle's params section", buf.Name)
			}
			if err := d.call("cuMemcpyHtoD_v2", p, uintptr(unsafe.Pointer(&data[0])), uintptr(n)); err != nil {
				return fmt.Errorf("uploading %s: %w", buf.Name, err)
			}
		default:
			if err := d.call("cuMemsetD8_v2", p, 0, uintptr(n)); err != nil {
				return err
			}
		}
	}
	if len(upload) == 0 {
		return nil
	}
	if readers <= 0 {
		readers = loader.DefaultReaders()
	}
	// A small upload (the norm weights of a synthetic model) pins no more than it needs.
	chunks := min(stagingChunks(readers), uploadChunks)
	progress("cuda: weights: %.2f GB from %s, %d readers, %d pinned chunks of %d MiB",
		float64(uploadBytes)/1e9, w.Origin(), readers, chunks, loader.ChunkBytes>>20)
	u, err := be.newStagedUpload(dst, chunks)
	if err != nil {
		return err
	}
	err = w.Upload(upload, 0, u, loader.LoadOptions{Readers: readers, Progress: func(f string, a ...any) { progress("cuda: "+f, a...) }})
	return errors.Join(err, u.close())
}

// synthesize generates a synthetic weight matrix on the device with the bundle's synth
// kernel: the same bits the CPU backend computes, without moving them over PCIe.
func (be *Backend) synthesize(s *bundle.Synth, buf bundle.Buffer, p uintptr, bytes int64) error {
	f, ok := be.funcs[s.Kernel]
	if !ok {
		return fmt.Errorf("the bundle names synth kernel %s but does not hold it", s.Kernel)
	}
	esz, err := loader.DtypeSize(buf.Dtype)
	if err != nil {
		return err
	}
	n := uint64(bytes) / uint64(esz)
	if n >= 1<<32 {
		return fmt.Errorf("buffer %s: %d elements is more than the synth kernel indexes", buf.Name, n)
	}
	vals := []uint64{uint64(p), n, s.Seed ^ ops.NameHash(buf.Name), math.Float64bits(ops.SynthScale(s.Std))}
	ptrs := make([]uintptr, len(vals))
	for i := range vals {
		ptrs[i] = uintptr(unsafe.Pointer(&vals[i]))
	}
	grid := (n + ops.SynthThreads - 1) / ops.SynthThreads
	err = be.d.call("cuLaunchKernel", f, uintptr(grid), 1, 1, ops.SynthThreads, 1, 1, 0, be.stream,
		uintptr(unsafe.Pointer(&ptrs[0])), 0)
	runtime.KeepAlive(vals)
	if err != nil {
		return fmt.Errorf("generating %s: %w", buf.Name, err)
	}
	return nil
}

// capture records launches into a CUDA graph and instantiates it. Nodes are prepared (and a
// node served by cuBLASLt run once) before, so nothing but launches happens in the capture.
func (be *Backend) capture(nodes []launch) (uintptr, error) {
	d := be.d
	if err := d.call("cuStreamBeginCapture_v2", be.stream, 2); err != nil { // relaxed mode
		return 0, err
	}
	var launchErr error
	for _, l := range nodes {
		if launchErr = be.issue(l); launchErr != nil {
			launchErr = fmt.Errorf("node %s (kernel %s): %w", l.label, l.kernel, launchErr)
			break
		}
	}
	var graph uintptr
	endErr := d.call("cuStreamEndCapture", be.stream, uintptr(unsafe.Pointer(&graph)))
	if launchErr != nil {
		if graph != 0 {
			d.call("cuGraphDestroy", graph)
		}
		return 0, launchErr
	}
	if endErr != nil {
		return 0, endErr
	}
	defer d.call("cuGraphDestroy", graph)
	var exec uintptr
	if err := d.call("cuGraphInstantiateWithFlags", uintptr(unsafe.Pointer(&exec)), graph, 0); err != nil {
		return 0, err
	}
	return exec, nil
}

// ltMayServe says whether cuBLASLt may serve node n of a template whose variant bits
// (variants.go) OR to variants: a heavy node only when every graph that holds it has a row
// enabling its app, since the library call has no early exit.
func ltMayServe(n bundle.Node, variants uint32) bool { return n.SkipUnless&^variants == 0 }

// prepare resolves a node's kernel and arguments to device addresses; variants as
// ltMayServe takes it; fed, if not 0, is bf16 of the GEMM node's x as the launch ahead wrote
// it (feedable said a server reads it there), for copyNode's xb or ltNode's fed; yBF16: where
// cuBLASLt serves the node it writes y in bf16 (guBF16At said only the next node reads it).
func (be *Backend) prepare(n bundle.Node, variants uint32, fed uintptr, yBF16 bool) (launch, error) {
	f, ok := be.funcs[n.Kernel]
	if !ok {
		return launch{}, fmt.Errorf("unknown kernel %s", n.Kernel)
	}
	vals, err := be.argValues(n)
	if err != nil {
		return launch{}, err
	}
	if be.copy != nil && ltMayServe(n, variants) {
		l, ok, err := be.copyNode(n, vals, fed)
		if err != nil {
			return launch{}, fmt.Errorf("copy-engine GEMM: %w", err)
		}
		if ok {
			served := *l
			served.label, served.skipUnless = n.Label, n.SkipUnless
			return served, nil
		}
	}
	if ltMayServe(n, variants) {
		l, ok, err := be.ltNode(n, vals, fed, yBF16)
		switch {
		case err != nil && (be.lt.strict || fed != 0):
			return launch{}, fmt.Errorf("cuBLASLt: %w", err)
		case err != nil:
			// --gemm auto: the bundle's own kernel serves what cuBLASLt refuses.
			be.lt.fallbacks++
			if be.lt.fallbackErr == nil {
				be.lt.fallbackErr = fmt.Errorf("node %s: %w", n.Label, err)
			}
		case ok:
			served := *l // one cuBLASLt launch may serve several nodes of one shape and buffers
			served.label, served.skipUnless = n.Label, n.SkipUnless
			return served, nil
		}
	}
	if fed != 0 {
		return launch{}, fmt.Errorf("the launch ahead wrote bf16(x) for a GEMM server that reads it, and none serves this node")
	}
	return launch{label: n.Label, kernel: n.Kernel, f: f, grid: n.Grid, block: n.Block, shared: n.Shared,
		params: be.keepParams(vals), skipUnless: n.SkipUnless, early: be.kernels[n.Kernel].EarlyLaunch}, nil
}

// kernel is the bundle's kernel of that name, as the bundle's pair finders take it.
func (be *Backend) kernel(name string) bundle.Kernel { return be.kernels[name] }

// argValues are node n's arguments: device addresses of its buffers (plus offsets) and its
// constants.
func (be *Backend) argValues(n bundle.Node) ([]uint64, error) {
	vals := make([]uint64, len(n.Args))
	for i, s := range n.Args {
		v, err := be.slotValue(s)
		if err != nil {
			return nil, err
		}
		vals[i] = v
	}
	return vals, nil
}

// slotValue is one argument's value: its buffer's device address plus the offset, or its
// constant.
func (be *Backend) slotValue(s bundle.Slot) (uint64, error) {
	if s.Buffer == "" {
		return s.Const, nil
	}
	base, ok := be.bufs[s.Buffer]
	if !ok {
		return 0, fmt.Errorf("unknown buffer %s", s.Buffer)
	}
	return uint64(base) + uint64(s.Offset), nil
}

// keepParams holds a launch's parameter values and the pointer array cuLaunchKernel takes for
// the backend's lifetime (graphs and profiling reuse them) and returns that array's address.
func (be *Backend) keepParams(vals []uint64) uintptr {
	if len(vals) == 0 {
		return 0
	}
	ptrs := make([]uintptr, len(vals))
	for i := range vals {
		ptrs[i] = uintptr(unsafe.Pointer(&vals[i]))
	}
	be.params = append(be.params, vals)
	be.paramP = append(be.paramP, ptrs)
	return uintptr(unsafe.Pointer(&ptrs[0]))
}

// issue enqueues one recorded node on the backend's stream: its kernel and, for a node that
// cuBLASLt or a copy-engine GEMM of bf16(x) serves, the matmul after the cast, or where the
// launch ahead wrote bf16(x) (no kernel, f 0) cuBLASLt's matmul alone.
func (be *Backend) issue(n launch) error {
	if n.f == 0 {
		return be.lt.run(n.matmul, be.stream) // fed: no cast
	}
	if n.early {
		if err := be.launchEarly(n); err != nil {
			return err
		}
	} else if err := be.d.call("cuLaunchKernel", n.f, uintptr(n.grid[0]), uintptr(n.grid[1]), uintptr(n.grid[2]),
		uintptr(n.block[0]), uintptr(n.block[1]), uintptr(n.block[2]), uintptr(n.shared), be.stream, n.params, 0); err != nil {
		return err
	}
	if n.matmul != nil {
		return be.lt.run(n.matmul, be.stream)
	}
	if n.then != nil {
		return be.issue(*n.then)
	}
	return nil
}

// runOnce issues n and waits for it: a server's first launch, run outside any graph so that a
// failure surfaces at load, not inside a capture.
func (be *Backend) runOnce(n launch) error {
	if err := be.issue(n); err != nil {
		return err
	}
	return be.d.call("cuStreamSynchronize", be.stream)
}

// launchAttribute is the driver's CUlaunchAttribute: an id, padding to 8 bytes, a 64-byte
// value union; launchConfig is CUlaunchConfig (the stream at offset 32, as in C).
type launchAttribute struct {
	id    uint32
	_     uint32
	value [64]byte
}

type launchConfig struct {
	grid, block [3]uint32
	shared      uint32
	stream      uintptr
	attrs       *launchAttribute
	numAttrs    uint32
}

// cuFuncAttributeNumRegs is CU_FUNC_ATTRIBUTE_NUM_REGS: the registers a thread of a kernel
// takes as the driver compiled its PTX, which decides how many of its blocks an SM holds
// beside the kernel ahead when it is launched early (Backend.KernelRegisters).
const cuFuncAttributeNumRegs = 4

// launchProgrammaticSerialization is CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION.
const launchProgrammaticSerialization = 6

// launchEarly launches a kernel built for programmatic dependent launch (bundle.Kernel.
// EarlyLaunch) so that it may start while the kernel ahead of it on the stream still runs,
// once that one's blocks have all asked for it; the kernel itself waits for that one to end
// before touching memory. Captured into a graph, the pair keeps the programmatic edge.
func (be *Backend) launchEarly(n launch) error {
	attr := launchAttribute{id: launchProgrammaticSerialization}
	attr.value[0] = 1 // programmaticStreamSerializationAllowed (an int)
	cfg := launchConfig{shared: uint32(n.shared), stream: be.stream, attrs: &attr, numAttrs: 1}
	for i := range 3 {
		cfg.grid[i], cfg.block[i] = uint32(n.grid[i]), uint32(n.block[i])
	}
	err := be.d.call("cuLaunchKernelEx", uintptr(unsafe.Pointer(&cfg)), n.f, n.params, 0)
	runtime.KeepAlive(&attr)
	return err
}

// Name implements loader.Backend.
func (be *Backend) Name() string {
	if be.lt != nil {
		return "cuda " + be.Dev.Name + " (GEMMs: cuBLASLt)"
	}
	return "cuda " + be.Dev.Name + " (GEMMs: PTX)"
}

// Write implements loader.Backend: control buffers are staged in pinned memory and sent
// with the next step; other buffers are copied at once.
func (be *Backend) Write(name string, off int64, data []byte) error {
	if o, ok := be.ctl.offset[name]; ok {
		if off < 0 || off+int64(len(data)) > be.ctl.sizes[name] {
			return fmt.Errorf("write to %s: bytes [%d,%d) outside its %d bytes", name, off, off+int64(len(data)), be.ctl.sizes[name])
		}
		start := o + off
		copy(be.ctl.hostBytes()[start:], data)
		if be.ctl.hi == 0 || start < be.ctl.lo {
			be.ctl.lo = start
		}
		be.ctl.hi = max(be.ctl.hi, start+int64(len(data)))
		return nil
	}
	p, ok := be.bufs[name]
	if !ok || off < 0 || off+int64(len(data)) > be.sizes[name] {
		return fmt.Errorf("write to %s: no such buffer or out of its bounds", name)
	}
	delete(be.outFresh, name) // an output's host copy no longer matches the device
	if len(data) == 0 {
		return nil
	}
	return be.do(func() error {
		return be.d.call("cuMemcpyHtoD_v2", p+uintptr(off), uintptr(unsafe.Pointer(&data[0])), uintptr(len(data)))
	})
}

// Read implements loader.Backend: outputs come from the copy made at the end of the last
// step where that step copied them (outCopies), other bytes are read from the device.
func (be *Backend) Read(name string, dst []byte) error {
	if o, ok := be.out.offset[name]; ok {
		if int64(len(dst)) > be.out.sizes[name] {
			return fmt.Errorf("read of %s: %d bytes, it has %d", name, len(dst), be.out.sizes[name])
		}
		if int64(len(dst)) <= be.outFresh[name] {
			copy(dst, be.out.hostBytes()[o:])
			return nil
		}
	}
	p, ok := be.bufs[name]
	if !ok || int64(len(dst)) > be.sizes[name] {
		return fmt.Errorf("read of %s: no such buffer or more than its size", name)
	}
	if len(dst) == 0 {
		return nil
	}
	return be.do(func() error {
		if err := be.d.call("cuStreamSynchronize", be.stream); err != nil {
			return err
		}
		return be.d.call("cuMemcpyDtoH_v2", uintptr(unsafe.Pointer(&dst[0])), p, uintptr(len(dst)))
	})
}

// Step implements loader.Backend: send the dirty control bytes, replay the graph, copy the
// outputs back, wait.
func (be *Backend) Step(t int) error {
	if t < 0 || t >= len(be.steps) {
		return fmt.Errorf("no template %d", t)
	}
	return be.do(func() error {
		d := be.d
		if be.ctl.hi > be.ctl.lo {
			lo, hi := be.ctl.lo, be.ctl.hi
			if err := d.call("cuMemcpyHtoDAsync_v2", be.ctl.dev+uintptr(lo), uintptr(be.ctl.host)+uintptr(lo), uintptr(hi-lo), be.stream); err != nil {
				return err
			}
			be.ctl.lo, be.ctl.hi = 0, 0
		}
		be.gaps.launched(time.Now())
		if err := d.call("cuGraphLaunch", be.steps[t].execs[be.variant(t)], be.stream); err != nil {
			return err
		}
		any := be.anyMask()
		clear(be.outFresh)
		for _, c := range be.outCopies[t] {
			if !c.wanted(any, be.askedFor) {
				continue
			}
			if err := d.call("cuMemcpyDtoHAsync_v2", uintptr(be.out.host)+uintptr(c.off), be.out.dev+uintptr(c.off), uintptr(c.bytes), be.stream); err != nil {
				clear(be.outFresh)
				return err
			}
			be.outFresh[c.name] = c.bytes
		}
		if err := d.call("cuStreamSynchronize", be.stream); err != nil {
			clear(be.outFresh) // the copies may not have landed
			return err
		}
		be.gaps.synced(time.Now())
		return nil
	})
}

// HostGaps is the time from each step's return from its wait on the GPU to the next step's
// graph launch, summed, and how many such gaps, since ResetHostGaps: the GPU idles that
// long between two steps (the copies around a replay aside), while the host hands the
// results back, does the engine's work and hands the next step over. Like Step, it is called
// by the one goroutine that steps the backend, so it reads what the steps wrote.
func (be *Backend) HostGaps() (total time.Duration, n int) { return be.gaps.total, be.gaps.n }

// ResetHostGaps starts HostGaps anew; the next step's launch starts no gap.
func (be *Backend) ResetHostGaps() { be.gaps = hostGaps{} }

// Time replays template t n times back to back (no host work between) and returns the mean
// milliseconds per replay, measured with CUDA events. It replays the graph variant that the
// control arena's current app union selects, as Step would.
func (be *Backend) Time(t, n int) (float64, error) {
	if t < 0 || t >= len(be.steps) {
		return 0, fmt.Errorf("no template %d", t)
	}
	var ms float64
	err := be.do(func() (err error) {
		ms, err = be.timeGraph(be.steps[t].execs[be.variant(t)], n)
		return err
	})
	return ms, err
}

// TimeWithout is Time for template t's graph captured again without the nodes whose labels
// leave picks, after warm replays of it: Time's figure less this one is what those nodes cost
// inside the replayed graph, the overlap of early launch included (Profile's node times each
// hold a launch and none of it). The replays compute garbage, since what the left-out nodes
// write stays stale; the template's own graphs are untouched, and the one captured here is
// destroyed.
func (be *Backend) TimeWithout(t, n int, leave func(label string) bool) (float64, error) {
	if t < 0 || t >= len(be.steps) {
		return 0, fmt.Errorf("no template %d", t)
	}
	var ms float64
	err := be.do(func() error {
		var kept []launch
		for _, l := range be.steps[t].nodes[be.variant(t)] {
			if !leave(l.label) {
				kept = append(kept, l)
			}
		}
		if len(kept) == 0 {
			return fmt.Errorf("template %d: every node left out, nothing to time", t)
		}
		exec, err := be.capture(kept)
		if err != nil {
			return err
		}
		defer be.d.call("cuGraphExecDestroy", exec)
		if _, err := be.timeGraph(exec, timeWithoutWarmup); err != nil {
			return err
		}
		ms, err = be.timeGraph(exec, n)
		return err
	})
	return ms, err
}

// timeWithoutWarmup is how many replays of its graph TimeWithout discards first.
const timeWithoutWarmup = 3

// timeGraph replays exec n times back to back and returns the mean milliseconds per replay,
// measured with CUDA events (on the context's thread).
func (be *Backend) timeGraph(exec uintptr, n int) (float64, error) {
	if n < 1 {
		return 0, fmt.Errorf("%d replays to time: want at least 1", n) // else 0/0 ms
	}
	d := be.d
	var start, stop uintptr
	if err := d.call("cuEventCreate", uintptr(unsafe.Pointer(&start)), 0); err != nil {
		return 0, err
	}
	defer d.call("cuEventDestroy_v2", start)
	if err := d.call("cuEventCreate", uintptr(unsafe.Pointer(&stop)), 0); err != nil {
		return 0, err
	}
	defer d.call("cuEventDestroy_v2", stop)
	if err := d.call("cuEventRecord", start, be.stream); err != nil {
		return 0, err
	}
	for range n {
		if err := d.call("cuGraphLaunch", exec, be.stream); err != nil {
			return 0, err
		}
	}
	if err := d.call("cuEventRecord", stop, be.stream); err != nil {
		return 0, err
	}
	if err := d.call("cuEventSynchronize", stop); err != nil {
		return 0, err
	}
	var ms float32
	if err := d.call("cuEventElapsedTime", uintptr(unsafe.Pointer(&ms)), start, stop); err != nil {
		return 0, err
	}
	return float64(ms) / float64(n), nil
}

// NodeTime is one node's measured time.
type NodeTime struct {
	Label  string  `json:"label"`
	Kernel string  `json:"kernel"`
	Ms     float64 `json:"ms"`
}

// Profile launches template t's nodes one by one (outside the graph), each between two CUDA
// events, and returns every node's time: what each kernel of a step costs (the nodes of the
// graph variant Step would replay now).
func (be *Backend) Profile(t int) ([]NodeTime, error) {
	if t < 0 || t >= len(be.steps) {
		return nil, fmt.Errorf("no template %d", t)
	}
	var out []NodeTime
	err := be.do(func() error {
		d := be.d
		nodes := be.steps[t].nodes[be.variant(t)]
		events := make([]uintptr, len(nodes)+1)
		for i := range events {
			if err := d.call("cuEventCreate", uintptr(unsafe.Pointer(&events[i])), 0); err != nil {
				return err
			}
			defer d.call("cuEventDestroy_v2", events[i])
		}
		if err := d.call("cuEventRecord", events[0], be.stream); err != nil {
			return err
		}
		for i, n := range nodes {
			if err := be.issue(n); err != nil {
				return fmt.Errorf("node %s: %w", n.label, err)
			}
			if err := d.call("cuEventRecord", events[i+1], be.stream); err != nil {
				return err
			}
		}
		if err := d.call("cuEventSynchronize", events[len(nodes)]); err != nil {
			return err
		}
		for i, n := range nodes {
			var ms float32
			if err := d.call("cuEventElapsedTime", uintptr(unsafe.Pointer(&ms)), events[i], events[i+1]); err != nil {
				return err
			}
			out = append(out, NodeTime{Label: n.label, Kernel: n.kernel, Ms: float64(ms)})
		}
		return nil
	})
	return out, err
}

// Close releases every device resource.
func (be *Backend) Close() error {
	if be.closed {
		return nil
	}
	be.closed = true
	err := be.do(func() error {
		d := be.d
		for _, g := range be.steps {
			for _, e := range g.execs {
				d.call("cuGraphExecDestroy", e)
			}
		}
		if be.lt != nil {
			be.lt.close()
		}
		for _, a := range []*arena{&be.ctl, &be.out} {
			if a.host != nil {
				d.call("cuMemFreeHost", uintptr(a.host))
			}
		}
		for _, p := range be.allocs {
			d.call("cuMemFree_v2", p)
		}
		for _, m := range be.modules {
			d.call("cuModuleUnload", m)
		}
		if be.stream != 0 {
			d.call("cuStreamDestroy_v2", be.stream)
		}
		return d.call("cuDevicePrimaryCtxRelease_v2", 0)
	})
	close(be.work)
	<-be.done
	return err
}

// poolAdvice says how a bundle short of short bytes of GPU memory fits: the largest KV pool
// (serving.kv_cache_tokens, whole pages) that the free memory holds, when one of at least
// max_seq_len tokens does, given the pool's kvBytes over its pages; else that the weights and
// the rest need less memory (a smaller model or a larger card).
func poolAdvice(m bundle.ModelConfig, kvBytes, short int64) string {
	pages := int64(m.KVBlocks - m.KVPadPages)
	if pages <= 0 || kvBytes <= 0 || m.KVBlockSize <= 0 {
		return "the bundle has no KV pool to shrink: use a card with more free memory"
	}
	perPage := (kvBytes + int64(m.KVBlocks) - 1) / int64(m.KVBlocks)
	fit := (pages - (short+perPage-1)/perPage) * int64(m.KVBlockSize)
	if fit < int64(m.MaxSeqLen) {
		return fmt.Sprintf("its KV pool of %d tokens takes %.2f GiB, and even one of max_seq_len (%d) tokens would not fit: lower max_seq_len in the model spec, or use a card with more free memory",
			pages*int64(m.KVBlockSize), float64(kvBytes)/(1<<30), m.MaxSeqLen)
	}
	return fmt.Sprintf("its KV pool of %d tokens takes %.2f GiB; a pool of at most %d tokens fits the free memory, less the CUDA graphs' and the GEMM library's own: rebuild with xmixc build --kv-cache-tokens below that (or set serving.kv_cache_tokens, max_seqs or max_seq_len in the model spec)",
		pages*int64(m.KVBlockSize), float64(kvBytes)/(1<<30), fit)
}

// KernelRegisters is the registers a thread of each of the bundle's kernels takes as the
// driver compiled it (with Options.Trace, the instrumented kernels'), by kernel name.
func (be *Backend) KernelRegisters() map[string]int {
	return maps.Clone(be.regs)
}
