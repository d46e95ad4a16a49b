// Package cpu is the CPU backend: it executes a bundle's templates with the Go reference ops
// (package ops), node by node; each op spreads its rows and columns over all cores. It serves
// machines without a GPU, runs the embedded default model, and is the reference the GPU
// backend is checked against. A tensor-parallel bundle runs as its ranks in one process
// (tp.go), so the sharding is checked wherever the tests run.
package cpu

import (
	"encoding/binary"
	"fmt"
	"unsafe"

	"xmix/bundle"
	"xmix/loader"
	"xmix/ops"
)

// Backend holds every buffer of a bundle in host memory, once per tensor-parallel rank.
type Backend struct {
	ranks []*rank
	// sharded names the buffers whose ranks hold different parts: the host cannot write
	// them whole.
	sharded map[string]bool
	// hub, on rank 0 of a multi-process group (group.go), reaches the other ranks; ranks
	// then holds rank 0 alone.
	hub *hub
}

// rank is one tensor-parallel rank's buffers and bound templates (the only one at tp 1).
type rank struct {
	id, tp    int
	bufs      map[string][]byte
	templates []bundle.Template
	// lists[t] are template t's node lists bound (bundle.Template.NodeLists): all the apps'
	// ops, then the app-free and one-app lists where it has them; a step runs the one
	// Template.ListFor picks.
	lists [][][]boundNode
}

type boundNode struct {
	label  string
	run    ops.Runner
	args   []ops.Arg
	launch ops.Launch
	// coll, when set, makes the node an exchange with the other ranks (args unused).
	coll *collective
}

// Progress reports load progress (may be nil).
type Progress func(format string, args ...any)

// New allocates the bundle's buffers (one copy per tensor-parallel rank, each holding its
// part of the sharded ones), fills weights and params, and binds every template node to its
// reference op.
func New(b *bundle.Bundle, w *loader.Weights, progress Progress) (*Backend, error) {
	if progress == nil {
		progress = func(string, ...any) {}
	}
	tp := max(1, b.Manifest.TP)
	if err := checkMemory(b, tp, physicalMemory()); err != nil {
		return nil, err
	}
	be := &Backend{sharded: map[string]bool{}}
	for _, buf := range b.Manifest.Buffers {
		if buf.Shard != nil {
			be.sharded[buf.Name] = true
		}
	}
	for r := range tp {
		rk, err := newRank(b, w, r, tp, progress)
		if err != nil {
			if tp > 1 {
				return nil, fmt.Errorf("rank %d: %w", r, err)
			}
			return nil, err
		}
		be.ranks = append(be.ranks, rk)
	}
	return be, nil
}

// checkMemory refuses a bundle whose buffers (tp copies) need more than the machine's
// memory (mem bytes, 0: unknown) before any is allocated: allocating them would end the
// process with a fatal out-of-memory error, which no caller can catch.
func checkMemory(b *bundle.Bundle, tp int, mem int64) error {
	var total int64
	for _, buf := range b.Manifest.Buffers {
		n, err := loader.BufferBytes(buf)
		if err != nil {
			return err
		}
		total += n
	}
	if need := total * int64(tp); mem > 0 && need > mem {
		return fmt.Errorf("cpu: the bundle's buffers need %.1f GB (%d rank(s)), more than this machine's %.1f GB of memory",
			float64(need)/1e9, tp, float64(mem)/1e9)
	}
	return nil
}

func newRank(b *bundle.Bundle, w *loader.Weights, id, tp int, progress Progress) (*rank, error) {
	rk := &rank{id: id, tp: tp, bufs: map[string][]byte{}}
	params, err := loader.RankParamTensors(b, id)
	if err != nil {
		return nil, err
	}
	var total int64
	var weights []bundle.Buffer
	var dsts [][]byte
	for _, buf := range b.Manifest.Buffers {
		n, err := loader.BufferBytes(buf)
		if err != nil {
			return nil, err
		}
		total += n
		mem := alignedBytes(n)
		switch buf.Kind {
		case bundle.KindWeight:
			weights, dsts = append(weights, buf), append(dsts, mem)
		case bundle.KindParam:
			copy(mem, params[buf.Name])
		}
		rk.bufs[buf.Name] = mem
	}
	progress("cpu: %s%d buffers, %.1f MB", rankPrefix(b, id), len(b.Manifest.Buffers), float64(total)/1e6)
	prefix := rankPrefix(b, id)
	if err := w.FillAll(weights, id, dsts, loader.LoadOptions{Progress: func(f string, a ...any) { progress("cpu: "+prefix+f, a...) }}); err != nil {
		return nil, err
	}
	// Runners are built per rank: ranks run concurrently and must share no op state.
	runners := map[string]ops.Runner{}
	kernels := map[string]*bundle.Kernel{}
	for i := range b.Kernels {
		k := &b.Kernels[i]
		r, err := ops.Build(k.Op, k.Attrs)
		if err != nil {
			return nil, fmt.Errorf("kernel %s: %w", k.Name, err)
		}
		runners[k.Name], kernels[k.Name] = r, k
	}
	for _, t := range b.Templates {
		var lists [][]boundNode
		for i, nodes := range t.NodeLists() {
			bound, err := rk.bindAll(nodes, kernels, runners)
			if err != nil {
				return nil, fmt.Errorf("template %s (node list %d) %w", t.Name, i, err)
			}
			lists = append(lists, bound)
		}
		rk.templates = append(rk.templates, t)
		rk.lists = append(rk.lists, lists)
	}
	return rk, nil
}

func (rk *rank) bindAll(nodes []bundle.Node, kernels map[string]*bundle.Kernel, runners map[string]ops.Runner) ([]boundNode, error) {
	var out []boundNode
	for _, n := range nodes {
		bn, err := rk.bind(n, kernels, runners)
		if err != nil {
			return nil, fmt.Errorf("node %s: %w", n.Label, err)
		}
		out = append(out, bn)
	}
	return out, nil
}

// nodes is what template t runs this step: the node list Template.ListFor picks for the
// step's ctl.any_mask (all of them in a bundle without apps).
func (rk *rank) nodes(t int) []boundNode {
	m := rk.bufs[bundle.CtlAnyMask]
	if len(m) < 4 {
		return rk.lists[t][0]
	}
	return rk.lists[t][rk.templates[t].ListFor(binary.LittleEndian.Uint32(m))]
}

func rankPrefix(b *bundle.Bundle, id int) string {
	if b.Manifest.TP > 1 {
		return fmt.Sprintf("rank %d/%d: ", id, b.Manifest.TP)
	}
	return ""
}

// bind resolves a node's kernel and argument buffers in this rank's memory.
func (rk *rank) bind(n bundle.Node, kernels map[string]*bundle.Kernel, runners map[string]ops.Runner) (boundNode, error) {
	if n.Collective != nil {
		c, err := rk.bindCollective(n.Collective)
		return boundNode{label: n.Label, coll: c}, err
	}
	k, ok := kernels[n.Kernel]
	if !ok {
		return boundNode{}, fmt.Errorf("unknown kernel %s", n.Kernel)
	}
	if len(n.Args) != len(k.Params) {
		return boundNode{}, fmt.Errorf("%d args for %d params", len(n.Args), len(k.Params))
	}
	args := make([]ops.Arg, len(n.Args))
	for i, s := range n.Args {
		if s.Buffer == "" {
			args[i] = ops.Arg{Bits: s.Const}
			continue
		}
		mem, ok := rk.bufs[s.Buffer]
		if !ok || s.Offset < 0 || s.Offset > int64(len(mem)) {
			return boundNode{}, fmt.Errorf("argument %s names buffer %q (offset %d) that does not exist", k.Params[i].Name, s.Buffer, s.Offset)
		}
		args[i] = ops.Arg{Mem: mem[s.Offset:]}
	}
	return boundNode{label: n.Label, run: runners[n.Kernel], args: args,
		launch: ops.Launch{Grid: n.Grid, Block: n.Block, Shared: n.Shared}}, nil
}

// alignedBytes returns n zero bytes aligned for 8-byte views.
func alignedBytes(n int64) []byte {
	words := make([]uint64, (n+7)/8)
	if len(words) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&words[0])), n)
}

// Name implements loader.Backend.
func (be *Backend) Name() string {
	switch {
	case be.hub != nil:
		return fmt.Sprintf("cpu tp=%d (%d processes)", be.hub.n, be.hub.n)
	case len(be.ranks) > 1:
		return fmt.Sprintf("cpu tp=%d", len(be.ranks))
	}
	return "cpu"
}

func (rk *rank) span(name string, off int64, n int) ([]byte, error) {
	mem, ok := rk.bufs[name]
	if !ok {
		return nil, fmt.Errorf("no buffer %q", name)
	}
	if off < 0 || off+int64(n) > int64(len(mem)) {
		return nil, fmt.Errorf("buffer %s: bytes [%d,%d) outside its %d bytes", name, off, off+int64(n), len(mem))
	}
	return mem[off : off+int64(n)], nil
}

// Write implements loader.Backend: every rank gets the same bytes (control blocks, app
// tables and vectors are replicated).
func (be *Backend) Write(name string, off int64, data []byte) error {
	if be.sharded[name] {
		return fmt.Errorf("buffer %s is cut across %d tensor-parallel ranks; the host cannot write it whole", name, be.world())
	}
	for _, rk := range be.ranks {
		if err := rk.write(name, off, data); err != nil {
			return err
		}
	}
	if be.hub != nil {
		return be.hub.write(name, off, data)
	}
	return nil
}

func (rk *rank) write(name string, off int64, data []byte) error {
	dst, err := rk.span(name, off, len(data))
	if err != nil {
		return err
	}
	copy(dst, data)
	return nil
}

// world is the number of ranks, in this process or not.
func (be *Backend) world() int {
	if be.hub != nil {
		return be.hub.n
	}
	return len(be.ranks)
}

// Read implements loader.Backend. Outputs come from rank 0: every rank computes them alike.
func (be *Backend) Read(name string, dst []byte) error {
	src, err := be.ranks[0].span(name, 0, len(dst))
	if err != nil {
		return err
	}
	copy(dst, src)
	return nil
}

// Buffer exposes rank 0's memory of a buffer (for tests that inspect activations).
func (be *Backend) Buffer(name string) []byte { return be.ranks[0].bufs[name] }

// Step implements loader.Backend.
func (be *Backend) Step(t int) error {
	if be.hub != nil {
		return be.hub.step(be.ranks[0], t)
	}
	if len(be.ranks) == 1 {
		return be.ranks[0].step(t, nil)
	}
	return stepRanks(be.ranks, t)
}

// step runs template t on this rank; c exchanges with the other ranks (nil at tp 1).
func (rk *rank) step(t int, c exchanger) error {
	if t < 0 || t >= len(rk.templates) {
		return fmt.Errorf("no template %d", t)
	}
	for _, n := range rk.nodes(t) {
		var err error
		if n.coll != nil {
			err = n.coll.run(c, rk.id)
		} else {
			err = n.run.Run(n.args, n.launch)
		}
		if err != nil {
			return fmt.Errorf("node %s: %w", n.label, err)
		}
	}
	return nil
}

// Close implements loader.Backend. On rank 0 of a multi-process group it dismisses the
// workers.
func (be *Backend) Close() error {
	if be.hub != nil {
		return be.hub.close()
	}
	return nil
}
