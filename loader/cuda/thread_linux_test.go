package cuda

import (
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// serveWork runs what onThread hands it on one goroutine locked to its OS thread, as the
// backend's own thread does; it reports that thread's id and stops when work is closed.
func serveWork(t testing.TB, work chan func()) (tid int) {
	ready := make(chan int)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		ready <- syscall.Gettid()
		for f := range work {
			f()
		}
	}()
	t.Cleanup(func() { close(work) })
	return <-ready
}

func TestOnThreadRunsOnTheServingThread(t *testing.T) {
	work := make(chan func())
	tid := serveWork(t, work)
	for range 20 {
		var ran int
		if err := onThread(work, func() error { ran = syscall.Gettid(); return nil }); err != nil {
			t.Fatal(err)
		}
		if ran != tid {
			t.Fatalf("ran on thread %d, the serving thread is %d", ran, tid)
		}
	}
	want := errors.New("driver said no")
	if err := onThread(work, func() error { return want }); err != want {
		t.Fatalf("error %v, want the call's own", err)
	}
}

// Every call runs on the thread where the context was just made current, one at a time,
// though many goroutines call at once and each call yields its thread's goroutine slot.
func TestCallerThreadRunsWhereTheContextIsCurrent(t *testing.T) {
	var current atomic.Int64
	c := &callerThread{makeCurrent: func() error { current.Store(int64(syscall.Gettid())); return nil }}
	var inFlight atomic.Int32
	var wg sync.WaitGroup
	errs := make(chan error, 8*50)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 50 {
				errs <- c.run(func() error {
					if n := inFlight.Add(1); n != 1 {
						return errors.New("two calls at once")
					}
					defer inFlight.Add(-1)
					time.Sleep(10 * time.Microsecond) // a locked goroutine wakes on its own thread
					runtime.Gosched()
					if got, want := int64(syscall.Gettid()), current.Load(); got != want {
						return errors.New("the call left the thread its context was made current on")
					}
					return nil
				})
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
}

func TestCallerThreadStopsWhenTheContextFails(t *testing.T) {
	refused := errors.New("CUDA_ERROR_INVALID_CONTEXT")
	c := &callerThread{makeCurrent: func() error { return refused }}
	ran := false
	err := c.run(func() error { ran = true; return nil })
	if !errors.Is(err, refused) || ran {
		t.Fatalf("error %v, call ran %v: want the context's error and no call", err, ran)
	}
}

// BenchmarkThreadHandoff: what a step's driver calls cost beyond their own work on each
// thread (thread.go). Each call spins for stepWork, as cuStreamSynchronize does while a
// step's graph runs, after hostWork on the caller, as the engine's work between steps; the
// figure is us a call beyond those two. The hand-off to the own thread and back waits for
// two thread wake-ups.
func BenchmarkThreadHandoff(b *testing.B) {
	const stepWork, hostWork = 500 * time.Microsecond, 10 * time.Microsecond
	spin := func(d time.Duration) {
		for start := time.Now(); time.Since(start) < d; {
		}
	}
	call := func() error { spin(stepWork); return nil }
	report := func(b *testing.B) {
		b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N)-float64((stepWork+hostWork).Microseconds()), "us-beyond/call")
	}
	b.Run("own", func(b *testing.B) {
		work := make(chan func())
		serveWork(b, work)
		for b.Loop() {
			spin(hostWork)
			if err := onThread(work, call); err != nil {
				b.Fatal(err)
			}
		}
		report(b)
	})
	b.Run("caller", func(b *testing.B) {
		c := &callerThread{makeCurrent: func() error { return nil }}
		for b.Loop() {
			spin(hostWork)
			if err := c.run(call); err != nil {
				b.Fatal(err)
			}
		}
		report(b)
	})
}
