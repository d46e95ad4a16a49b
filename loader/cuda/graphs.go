package cuda

import (
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"unsafe"
)

// DefaultGraphThreads is how many threads capture and instantiate a bundle's graphs at load
// when Options.GraphThreads is 0: one, until several are measured on a GPU.
const DefaultGraphThreads = 1

// graphThreads is the threads captureGraphs runs for n graphs: asked (Options.GraphThreads),
// or DefaultGraphThreads for 0; never more than n.
func graphThreads(asked, n int) int {
	if asked == 0 {
		asked = DefaultGraphThreads
	}
	return max(1, min(asked, n))
}

// captureGraphs captures and instantiates one CUDA graph per launch list (names name them
// in errors), in order, on threads OS threads at once: one runs on the backend's own thread
// and its stream; more each make the context current on their thread and capture on a
// stream of their own. Capture is relaxed (cuStreamBeginCapture mode 2), so the threads'
// captures do not interfere, and cuBLASLt's matmul, which a capture records, takes the
// stream to use. With one app's lists beside every template (Template.Solo), a bundle of six
// apps has eight graphs a template, 120 for the 8B's 15: one after another they took 1.0 s of
// its load on an H100, against 0.3 s for the bare bundle's 15 (testsuite/gpu/LOAD.md,
// session 77). What several threads save is not measured yet (graph_threads.sh).
func (be *Backend) captureGraphs(lists [][]launch, names []string, threads int) ([]uintptr, error) {
	execs := make([]uintptr, len(lists))
	errs := make([]error, len(lists))
	if threads <= 1 {
		for i, nodes := range lists {
			if execs[i], errs[i] = be.capture(nodes, be.stream); errs[i] != nil {
				errs[i] = fmt.Errorf("%s: %w", names[i], errs[i])
				break
			}
		}
	} else {
		var next atomic.Int64 // the next list to take; past the end once one has failed
		setup := make([]error, threads)
		var wg sync.WaitGroup
		for k := range threads {
			wg.Add(1)
			go func() {
				defer wg.Done()
				setup[k] = be.captureOnThread(lists, names, execs, errs, &next)
			}()
		}
		wg.Wait()
		errs = append(setup, errs...)
	}
	for _, err := range errs {
		if err != nil {
			for _, e := range execs {
				if e != 0 {
					be.d.call("cuGraphExecDestroy", e)
				}
			}
			return nil, fmt.Errorf("capturing %d graphs on %d threads: %w", len(lists), threads, err)
		}
	}
	return execs, nil
}

// captureOnThread is one of captureGraphs' threads: it makes the context current on its OS
// thread, then captures the next list not yet taken until none is left or one fails (its
// error in errs). It returns what failed before it could capture.
func (be *Backend) captureOnThread(lists [][]launch, names []string, execs []uintptr, errs []error, next *atomic.Int64) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := be.makeCurrent(); err != nil {
		next.Store(int64(len(lists)))
		return fmt.Errorf("making the CUDA context current: %w", err)
	}
	var stream uintptr
	if err := be.d.call("cuStreamCreate", uintptr(unsafe.Pointer(&stream)), 1); err != nil { // non-blocking
		next.Store(int64(len(lists)))
		return err
	}
	defer be.d.call("cuStreamDestroy_v2", stream)
	for {
		i := int(next.Add(1)) - 1
		if i >= len(lists) {
			return nil
		}
		if execs[i], errs[i] = be.capture(lists[i], stream); errs[i] != nil {
			errs[i] = fmt.Errorf("%s: %w", names[i], errs[i])
			next.Store(int64(len(lists))) // the other threads stop at their next list
			return nil
		}
	}
}
