package cuda

import "time"

// hostGaps sums the time between a step's return from its wait on the GPU and the next
// step's graph launch (Backend.HostGaps): the host's part of a step, which the GPU waits out.
type hostGaps struct {
	last  time.Time // the last step's return from its wait; zero: none since the reset
	total time.Duration
	n     int
}

// launched counts the gap that ends as a step's graph is launched at t.
func (g *hostGaps) launched(t time.Time) {
	if !g.last.IsZero() {
		g.total += t.Sub(g.last)
		g.n++
	}
}

// synced marks a step's return from its wait at t.
func (g *hostGaps) synced(t time.Time) { g.last = t }
