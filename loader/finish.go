package loader

// Cancel removes the request h follows, at this step boundary (the engine is driven by one
// goroutine, and Cancel is called between its steps): a queued request leaves the queue, a
// running one leaves its sequence slot and its KV pages return to the pool. Its Result keeps
// what it generated so far, with Reason "cancelled", and h.Done is set. It reports whether the
// request was still queued or running; cancelling a finished request changes nothing.
func (e *Engine) Cancel(h *Handle) bool {
	for i, s := range e.queue {
		if s.h == h {
			e.queue = append(e.queue[:i], e.queue[i+1:]...)
			s.done, s.res.Reason = true, ReasonCancelled
			h.Done = true
			return true
		}
	}
	for i, s := range e.slots {
		if s != nil && s.h == h {
			s.done, s.res.Reason = true, ReasonCancelled
			e.retire(i)
			return true
		}
	}
	return false
}

// retire frees sequence slot i, whose request has finished: its pages and its vector slot
// go back to their pools.
func (e *Engine) retire(i int) {
	s := e.slots[i]
	e.freePage = append(e.freePage, s.pages...)
	e.releaseVectorSlot(s)
	e.slots[i] = nil
	s.h.Done = true
}

// Load is what the engine holds at a step boundary.
type Load struct {
	Running   int // requests in a sequence slot
	Queued    int // requests waiting for a slot or for KV pages
	Slots     int // sequence slots (the bundle's max_seqs)
	FreePages int // KV pages in the pool
	Pages     int // KV pages requests can use (the padding sequence's excluded)
	// Per-request vector slots free and in all (0 when the bundle has no per_request params).
	FreeVectorSlots, VectorSlots int
}

// Load counts the engine's running and queued requests, its free KV pages and vector slots;
// an idle engine has Running and Queued 0, FreePages == Pages and FreeVectorSlots ==
// VectorSlots.
func (e *Engine) Load() Load {
	l := Load{Queued: len(e.queue), Slots: len(e.slots), FreePages: len(e.freePage), Pages: e.cfg.KVBlocks - e.padPages,
		FreeVectorSlots: len(e.pool.free), VectorSlots: e.pool.total}
	for _, s := range e.slots {
		if s != nil {
			l.Running++
		}
	}
	return l
}
