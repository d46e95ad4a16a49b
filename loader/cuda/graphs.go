package cuda

import "fmt"

// captureGraphs captures and instantiates step g's graphs, one per launch list, one after
// another on the backend's stream, into g.execs as it goes: a failed load's Close destroys
// those made before the failure, as every loaded step's. Capturing on several threads at
// once, each with a stream of its own, was measured and not kept: with apps 1-6 deployed the
// 8B's 120 graphs took 0.21-0.30 s to capture and instantiate on one thread and 0.21-0.23 s
// on eight, of a load whose launch preparation alone took 0.8-1.4 s (H100;
// testsuite/gpu/LOAD.md, session 78).
func (be *Backend) captureGraphs(g *stepGraphs) error {
	for v, nodes := range g.nodes {
		exec, err := be.capture(nodes)
		if err != nil {
			return fmt.Errorf("graph %d: %w", v, err)
		}
		g.execs = append(g.execs, exec)
	}
	return nil
}
