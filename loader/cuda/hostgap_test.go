package cuda

import (
	"testing"
	"time"
)

func TestHostGapsCountFromAWaitToTheNextLaunch(t *testing.T) {
	var g hostGaps
	t0 := time.Unix(100, 0)
	g.launched(t0) // the first step after a reset: no wait ahead of it
	g.synced(t0.Add(4 * time.Millisecond))
	g.launched(t0.Add(4*time.Millisecond + 30*time.Microsecond))
	g.synced(t0.Add(8 * time.Millisecond))
	g.launched(t0.Add(8*time.Millisecond + 50*time.Microsecond))
	if g.n != 2 || g.total != 80*time.Microsecond {
		t.Fatalf("%d gaps, %v in all: want 2 and 80us", g.n, g.total)
	}
}
