package cuda

import (
	"fmt"
	"runtime"
	"sync"
)

// A CUDA context is current per OS thread, and goroutines move between threads, so every
// driver call runs on a thread locked for it with the backend's context current. Two ways:
//
//   - the backend's own thread (the load, and every call with Options.OwnThread): one
//     goroutine, locked to its OS thread for the backend's life with the context current on
//     it, runs each call that onThread hands it, while the caller waits. Each hand-off wakes
//     that thread and, when the call returns, the caller's: two thread wake-ups a step, which
//     BenchmarkThreadHandoff times.
//   - the caller's thread (every call after the load, by default): callerThread locks the
//     calling goroutine to its OS thread for the call and makes the context current there
//     first, so a step wakes no other thread.

// makeCurrent makes the backend's context current on the calling OS thread, which the
// caller has locked.
func (be *Backend) makeCurrent() error { return be.d.call("cuCtxSetCurrent", be.ctx) }

// onThread hands f to the goroutine that serves work on its locked thread and waits for it.
func onThread(work chan<- func(), f func() error) error {
	var err error
	ch := make(chan struct{})
	work <- func() {
		defer close(ch)
		err = f()
	}
	<-ch
	return err
}

// callerThread runs each call on the caller's OS thread, locked for the call, after
// makeCurrent has made the backend's context current on it; mu keeps the calls one at a
// time, as the own thread's queue does, since the backend's state is not guarded otherwise.
type callerThread struct {
	mu          sync.Mutex
	makeCurrent func() error
}

func (c *callerThread) run(f func() error) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := c.makeCurrent(); err != nil {
		return fmt.Errorf("making the CUDA context current on the caller's thread: %w", err)
	}
	return f()
}
