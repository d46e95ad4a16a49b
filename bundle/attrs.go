package bundle

import (
	"encoding/json"
	"sync"
)

// attrsMemo decodes kernels' attributes into T once per distinct JSON text. A backend reads
// a kernel's attributes for each node of each node list it prepares, several times a node
// (GemmOf, BF16CopyOf, the pair finders), and a bundle's nodes share a few hundred kernels:
// with apps 1-6 deployed the 8B's 120 node lists have 34664 nodes, and decoding the JSON at
// every read made the CUDA backend's launch preparation take 0.81 s where the memo's takes
// 0.35 (an H100, testsuite/gpu/LOAD.md, session 78). Decoded values are shared, so callers
// only read them.
type attrsMemo[T any] struct {
	mu sync.Mutex
	m  map[string]attrsDecoded[T]
}

type attrsDecoded[T any] struct {
	v   T
	err error
}

// attrsMemoMax bounds a memo's entries: past it the memo starts again, so a process that
// loads bundle after bundle (the tests) does not keep every kernel's attributes it ever read.
const attrsMemoMax = 1 << 12

func (c *attrsMemo[T]) decode(raw json.RawMessage) (T, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if d, ok := c.m[string(raw)]; ok {
		return d.v, d.err
	}
	var d attrsDecoded[T]
	d.err = json.Unmarshal(raw, &d.v)
	if c.m == nil || len(c.m) >= attrsMemoMax {
		c.m = map[string]attrsDecoded[T]{}
	}
	c.m[string(raw)] = d
	return d.v, d.err
}
