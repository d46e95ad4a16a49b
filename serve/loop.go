package serve

import (
	"context"
	"slices"
	"sync"
	"time"

	"xmix/loader"
)

// The engine is owned by one goroutine, the loop: handlers send it messages and it applies
// them between steps, so every change (a new request, a cancellation, a control-plane
// change) lands at a step boundary and a step sees the engine whole.
type message struct {
	submit  *job
	cancel  *job
	control *change
}

// job is one request in flight. The loop fills the fields under mu after each step and
// pokes wake; the handler reads them.
type job struct {
	req loader.Request
	// wantRows: the handler reads the rows' exports; without it publish copies no rows.
	wantRows bool
	accepted chan error // Submit's verdict: nil, or why the request is invalid
	wake     chan struct{}
	h        *loader.Handle // the loop's

	mu        sync.Mutex
	tokens    []int
	times     []time.Time
	rows      []loader.Row
	fired     loader.Fired // a copy: the engine counts in its own
	logprobs  []loader.TokenLogprob
	reason    string
	err       string // why it ended early (loader.Result.Error)
	finished  bool
	promptLen int
}

func newJob(req loader.Request, wantRows bool) *job {
	return &job{req: req, wantRows: wantRows, accepted: make(chan error, 1), wake: make(chan struct{}, 1)}
}

// view is what a handler sees of its job: everything published so far.
type view struct {
	tokens    []int
	times     []time.Time
	rows      []loader.Row
	fired     loader.Fired // the counts so far; its backing array is the view's own
	logprobs  []loader.TokenLogprob
	reason    string
	err       string
	finished  bool
	promptLen int
}

func (j *job) view() view {
	j.mu.Lock()
	defer j.mu.Unlock()
	return view{tokens: j.tokens, times: j.times, rows: j.rows, fired: slices.Clone(j.fired), logprobs: j.logprobs,
		reason: j.reason, err: j.err, finished: j.finished, promptLen: j.promptLen}
}

// publish copies what the engine produced for j since the last call; it reports whether j
// has finished.
func (j *job) publish() bool {
	h := j.h
	r := &h.Result
	j.mu.Lock()
	j.tokens = append(j.tokens, r.Tokens[len(j.tokens):]...)
	j.times = append(j.times, h.TokenTimes[len(j.times):]...)
	if j.wantRows {
		j.rows = append(j.rows, r.Rows[len(j.rows):]...)
	}
	j.fired = append(j.fired[:0], r.Fired...)
	j.logprobs = append(j.logprobs, r.Logprobs[len(j.logprobs):]...)
	if h.Done {
		j.finished, j.reason, j.err = true, r.Reason, r.Error
	}
	done := j.finished
	j.mu.Unlock()
	select {
	case j.wake <- struct{}{}:
	default:
	}
	return done
}

// loop owns the engine: it takes messages between steps and publishes each step's tokens to
// their jobs. It returns when ctx ends.
func (sv *Server) loop(ctx context.Context) {
	defer close(sv.stopped)
	eng := sv.eng
	var live []*job
	handle := func(m message) {
		switch {
		case m.submit != nil:
			j := m.submit
			h, err := eng.Submit(j.req)
			sv.pending.Add(-1)
			if err == nil {
				sv.queued.Add(1) // until the next step says whether it was admitted

				j.h = h
				j.promptLen = h.Result.PromptTokens
				live = append(live, j)
			}
			j.accepted <- err
		case m.cancel != nil:
			if h := m.cancel.h; h != nil && eng.Cancel(h) {
				sv.metrics.aborted.Inc()
			}
		case m.control != nil:
			m.control.done <- sv.apply(m.control)
		}
	}
	for {
		if !eng.Busy() {
			sv.observeLoad(eng.Load())
			select {
			case m := <-sv.inbox:
				handle(m)
			case <-ctx.Done():
				return
			}
		}
	drain:
		for {
			select {
			case m := <-sv.inbox:
				handle(m)
			default:
				break drain
			}
		}
		// Shutdown cancels ctx once the handlers are done or its time is up; requests still
		// running then belong to clients that left or ran out of time.
		if ctx.Err() != nil {
			return
		}
		if eng.Busy() {
			before := eng.Stats
			start := time.Now()
			// A step that fails has ended its requests (their handlers answer 500) and the
			// engine goes on with the queue; health reports it until a step succeeds.
			_, err := eng.Step()
			sv.failing.Store(&stepError{err})
			if err == nil {
				sv.observeStep(before, eng.Stats, time.Since(start))
			}
		}
		sv.observeLoad(eng.Load())
		kept := live[:0]
		for _, j := range live {
			if !j.publish() {
				kept = append(kept, j)
			}
		}
		clear(live[len(kept):])
		live = kept
	}
}

// send hands m to the loop; false when the loop has stopped or ctx ended first.
func (sv *Server) send(ctx context.Context, m message) bool {
	select {
	case sv.inbox <- m:
		return true
	case <-sv.stopped:
		return false
	case <-ctx.Done():
		return false
	}
}

// wait blocks until the engine publishes more for j; false when it never will (the loop
// stopped) or ctx ended.
func (sv *Server) wait(ctx context.Context, j *job) bool {
	// The engine may publish faster than the handler reads: look at ctx first, or a busy
	// stream would never notice its client left.
	if ctx.Err() != nil {
		return false
	}
	select {
	case <-j.wake:
		return true
	case <-sv.stopped:
		// The loop may have published the last tokens just before stopping.
		select {
		case <-j.wake:
			return true
		default:
			return false
		}
	case <-ctx.Done():
		return false
	}
}

// stepError is the last step's error, nil when it succeeded.
type stepError struct{ err error }
