package cuda

import "fmt"

// captureGraphs captures and instantiates one CUDA graph per launch list (names name them
// in errors), one after another on the backend's stream. On a failure it destroys the graphs
// it made and names the list that failed. Capturing on several threads at once, each with a
// stream of its own, was measured and not kept: with apps 1-6 deployed the 8B's 120 graphs
// took 0.21-0.30 s to capture and instantiate on one thread and 0.21-0.23 s on eight, of a
// load whose launch preparation alone took 0.8-1.4 s (H100; testsuite/gpu/LOAD.md, session 78).
func (be *Backend) captureGraphs(lists [][]launch, names []string) ([]uintptr, error) {
	execs := make([]uintptr, 0, len(lists))
	for i, nodes := range lists {
		exec, err := be.capture(nodes)
		if err != nil {
			for _, e := range execs {
				be.d.call("cuGraphExecDestroy", e)
			}
			return nil, fmt.Errorf("capturing %d graphs: %s: %w", len(lists), names[i], err)
		}
		execs = append(execs, exec)
	}
	return execs, nil
}
