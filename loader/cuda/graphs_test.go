package cuda

import "testing"

func TestGraphThreads(t *testing.T) {
	for _, c := range []struct{ asked, graphs, want int }{
		{0, 120, DefaultGraphThreads},
		{0, 1, 1},
		{0, 0, 1},
		{1, 120, 1},
		{4, 120, 4},
		{16, 3, 3},
	} {
		if got := graphThreads(c.asked, c.graphs); got != c.want {
			t.Errorf("graphThreads(%d, %d) = %d, want %d", c.asked, c.graphs, got, c.want)
		}
	}
}
