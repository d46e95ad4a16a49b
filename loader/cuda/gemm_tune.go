package cuda

import (
	"fmt"
	"slices"
	"unsafe"

	"xmix/bundle"
)

// GemmShape is one GEMM a bundle runs: y[M,N] = x[M,K] . w[N,K]^T.
type GemmShape struct{ M, N, K int }

// GemmShapes lists the distinct shapes of b's tensor-core GEMM nodes of at most maxRows rows
// that cuBLASLt may serve (even K), in the order the templates first run them.
func GemmShapes(b *bundle.Bundle, maxRows int) ([]GemmShape, error) {
	kernels := b.KernelsByName()
	var shapes []GemmShape
	for _, t := range b.Templates {
		for _, n := range t.Nodes {
			g, ok, err := bundle.GemmOf(n, kernels[n.Kernel])
			if err != nil {
				return nil, fmt.Errorf("template %s: %w", t.Name, err)
			}
			s := GemmShape{g.M, g.N, g.K}
			if ok && g.M > 0 && g.M <= maxRows && g.K%2 == 0 && !slices.Contains(shapes, s) {
				shapes = append(shapes, s)
			}
		}
	}
	return shapes, nil
}

// Tuning measures each candidate in a graph of back-to-back calls whose weights rotate
// through tuneColdBytes or more of copies, so every call reads its weights from HBM as a
// decode step does (the H200's L2 holds 50 MB), and takes a candidate only when it beats
// the heuristic's first result by pickMargin: closer than that, the timing's noise decides.
const (
	tuneColdBytes  = 768 << 20
	tuneMinCalls   = 16
	tuneReplays    = 8
	pickMargin     = 0.01
	tuneSplitsOf   = 2 // results whose split-K variants are timed too
	maxTuneWeights = 64
)

// tuneSplits are the split-K variants timed for the first tuneSplitsOf results.
var tuneSplits = []int{1, 2, 3, 4, 6, 8, 12, 16}

// GemmTiming is what tuning one shape measured.
type GemmTiming struct {
	Shape       GemmShape
	Candidates  int
	HeuristicUs float64 // the library's first result, µs a call
	Pick        *GemmPick
}

// TuneGemms times cuBLASLt's candidates for each shape on GPU 0 (the heuristic's results and
// split-K variants of its first two) and returns the picks that beat the first result, with
// what each shape measured. progress is told each shape's outcome.
func TuneGemms(shapes []GemmShape, progress Progress) ([]GemmTiming, error) {
	if progress == nil {
		progress = func(string, ...any) {}
	}
	be, err := start()
	if err != nil {
		return nil, err
	}
	defer be.Close()
	var out []GemmTiming
	err = be.do(func() error {
		lt, err := loadCublasLt()
		if err != nil {
			return err
		}
		var xbBytes int64
		for _, s := range shapes {
			xbBytes = max(xbBytes, int64(s.M)*int64(s.K)*2)
		}
		if err := be.setupCublasLt(lt, xbBytes, 0); err != nil {
			return err
		}
		be.lt = lt
		if err := be.d.call("cuMemsetD8_v2", lt.xb, 0x3c, uintptr(xbBytes)); err != nil {
			return err
		}
		for i, s := range shapes {
			t, err := be.tuneShape(s)
			if err != nil {
				return fmt.Errorf("%dx%dx%d: %w", s.M, s.N, s.K, err)
			}
			out = append(out, t)
			if t.Pick == nil {
				progress("tune-gemm %d/%d %dx%dx%d: the first of %d candidates stays (%.2f µs)", i+1, len(shapes), s.M, s.N, s.K, t.Candidates, t.HeuristicUs)
				continue
			}
			p := t.Pick
			progress("tune-gemm %d/%d %dx%dx%d: %s, %.2f µs against %.2f (%+.1f%%) of %d candidates",
				i+1, len(shapes), s.M, s.N, s.K, p.Algorithm(), p.Us, p.HeuristicUs, 100*(p.Us/p.HeuristicUs-1), t.Candidates)
		}
		return nil
	})
	return out, err
}

// tuneShape times s's candidates. Weights and output are allocated here and freed before it
// returns; x is the cast scratch, filled by TuneGemms.
func (be *Backend) tuneShape(s GemmShape) (GemmTiming, error) {
	d, lt := be.d, be.lt
	wBytes := int64(s.N) * int64(s.K) * 2
	copies := int(min(maxTuneWeights, max(2, (tuneColdBytes+wBytes-1)/wBytes)))
	var free, total uint64
	if err := d.call("cuMemGetInfo_v2", uintptr(unsafe.Pointer(&free)), uintptr(unsafe.Pointer(&total))); err != nil {
		return GemmTiming{}, err
	}
	yBytes := int64(s.M) * int64(s.N) * 4
	copies = int(min(int64(copies), (int64(free)*3/4-yBytes)/wBytes))
	if copies < 1 {
		return GemmTiming{}, fmt.Errorf("its weights (%d bytes) do not fit in the %d bytes of GPU memory free", wBytes, free)
	}
	var bufs []uintptr
	defer func() {
		for _, p := range bufs {
			d.call("cuMemFree_v2", p)
		}
	}()
	alloc := func(n int64) (uintptr, error) {
		var p uintptr
		if err := d.call("cuMemAlloc_v2", uintptr(unsafe.Pointer(&p)), uintptr(n)); err != nil {
			return 0, err
		}
		bufs = append(bufs, p)
		// 0x3c3c is bf16 0.0115: finite products, as real weights give.
		return p, d.call("cuMemsetD8_v2", p, 0x3c, uintptr(n))
	}
	ws := make([]uintptr, copies)
	for i := range ws {
		var err error
		if ws[i], err = alloc(wBytes); err != nil {
			return GemmTiming{}, err
		}
	}
	y, err := alloc(yBytes)
	if err != nil {
		return GemmTiming{}, err
	}
	g := bundle.GEMM{M: s.M, N: s.N, K: s.K}
	m, err := lt.newMatmul(g, lt.xb, ws[0], y, false)
	if err != nil {
		return GemmTiming{}, err
	}
	res, err := lt.heuristics(m, g, ltCandidates)
	if err != nil {
		return GemmTiming{}, err
	}
	cands := slices.Clone(res)
	for _, r := range res[:min(tuneSplitsOf, len(res))] {
		for _, split := range tuneSplits {
			if v, err := lt.withSplit(m, r, split); err == nil {
				cands = append(cands, v)
			}
		}
	}
	calls := max(copies, tuneMinCalls)
	calls = (calls + copies - 1) / copies * copies
	t := GemmTiming{Shape: s}
	seen := map[ltConfig]bool{}
	best, bestUs, bestCfg := -1, 0.0, ltConfig{}
	for i := range cands {
		c, err := lt.config(&cands[i])
		if err != nil {
			return t, err
		}
		if seen[c] {
			continue
		}
		seen[c] = true
		us, err := be.timeMatmul(m, cands[i], ws, calls)
		if err != nil {
			if i == 0 {
				return t, fmt.Errorf("cuBLASLt's first algorithm (%s): %w", c, err)
			}
			continue // a variant the library takes at check time but not at run time
		}
		t.Candidates++
		if i == 0 {
			t.HeuristicUs = us
		}
		if best < 0 || us < bestUs {
			best, bestUs, bestCfg = i, us, c
		}
	}
	if best > 0 && bestUs < t.HeuristicUs*(1-pickMargin) {
		p := bestCfg.pick(be.Dev.Name, lt.version, s, bestUs, t.HeuristicUs)
		t.Pick = &p
	}
	return t, nil
}

// timeMatmul times algorithm r for m in a graph of calls back-to-back, each on the next copy
// of the weights, and returns µs a call.
func (be *Backend) timeMatmul(m *ltMatmul, r ltResult, ws []uintptr, calls int) (float64, error) {
	d := be.d
	mm := *m
	mm.algo = r
	if err := d.call("cuStreamBeginCapture_v2", be.stream, 2); err != nil { // relaxed mode
		return 0, err
	}
	var runErr error
	for i := range calls {
		mm.w = ws[i%len(ws)]
		if runErr = be.lt.run(&mm, be.stream); runErr != nil {
			break
		}
	}
	var graph uintptr
	endErr := d.call("cuStreamEndCapture", be.stream, uintptr(unsafe.Pointer(&graph)))
	if graph != 0 {
		defer d.call("cuGraphDestroy", graph)
	}
	if runErr != nil {
		return 0, runErr
	}
	if endErr != nil {
		return 0, endErr
	}
	var exec uintptr
	if err := d.call("cuGraphInstantiateWithFlags", uintptr(unsafe.Pointer(&exec)), graph, 0); err != nil {
		return 0, err
	}
	defer d.call("cuGraphExecDestroy", exec)
	if _, err := be.timeGraph(exec, 2); err != nil { // warm-up
		return 0, err
	}
	ms, err := be.timeGraph(exec, tuneReplays)
	if err != nil {
		return 0, err
	}
	return ms * 1000 / float64(calls), nil
}
