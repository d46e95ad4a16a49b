package ops

import (
	"regexp"
	"sync"
	"testing"
)

// TestWorkerPanicsRaiseOnTheWaiter: the first panic of a group of goroutines comes back on
// the goroutine that waits for them, with where it happened, after onPanic has released
// the goroutines that would otherwise wait for the one that panicked (as stepRanks's
// ranks wait at their barriers); without one, Raise does nothing.
func TestWorkerPanicsRaiseOnTheWaiter(t *testing.T) {
	var panics WorkerPanics
	release := make(chan struct{})
	var wg sync.WaitGroup
	for i := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer panics.Catch(func() { close(release) })
			if i == 1 {
				var s []int
				_ = s[i] // an index out of range, raised by the runtime
			}
			<-release // the others wait for the one that panics
		}()
	}
	wg.Wait()
	raised := func() (p any) {
		defer func() { p = recover() }()
		panics.Raise()
		return nil
	}()
	wp, ok := raised.(WorkerPanic)
	if !ok || !regexp.MustCompile(`^runtime error: index out of range \[1\] with length 0 \(at workers_test\.go:\d+\)$`).MatchString(wp.String()) {
		t.Fatalf("raised %#v", raised)
	}

	var none WorkerPanics
	none.Raise()
	ParallelFor(4, func(lo, hi int) {}) // no panic, none raised
}
