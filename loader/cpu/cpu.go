// Package cpu is the CPU backend: it executes a bundle's templates with the Go reference ops
// (package ops), node by node; each op spreads its rows and columns over all cores. It serves
// machines without a GPU, runs the embedded default model, and is the reference the GPU
// backend is checked against.
package cpu

import (
	"fmt"
	"unsafe"

	"xmix/bundle"
	"xmix/loader"
	"xmix/ops"
)

// Backend holds every buffer of a bundle in host memory.
type Backend struct {
	bufs      map[string][]byte
	templates [][]boundNode
}

type boundNode struct {
	label  string
	run    ops.Runner
	args   []ops.Arg
	launch ops.Launch
}

// Progress reports load progress (may be nil).
type Progress func(format string, args ...any)

// New allocates the bundle's buffers, fills weights and params, and binds every template
// node to its reference op.
func New(b *bundle.Bundle, w *loader.Weights, progress Progress) (*Backend, error) {
	if progress == nil {
		progress = func(string, ...any) {}
	}
	be := &Backend{bufs: map[string][]byte{}}
	params, err := loader.ParamTensors(b)
	if err != nil {
		return nil, err
	}
	var total int64
	for _, buf := range b.Manifest.Buffers {
		n, err := loader.BufferBytes(buf)
		if err != nil {
			return nil, err
		}
		total += n
		mem := alignedBytes(n)
		switch buf.Kind {
		case bundle.KindWeight:
			if err := w.Fill(buf, mem); err != nil {
				return nil, err
			}
		case bundle.KindParam:
			copy(mem, params[buf.Name])
		}
		be.bufs[buf.Name] = mem
	}
	progress("cpu: %d buffers, %.1f MB", len(b.Manifest.Buffers), float64(total)/1e6)
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
		var nodes []boundNode
		for _, n := range t.Nodes {
			k, ok := kernels[n.Kernel]
			if !ok {
				return nil, fmt.Errorf("template %s node %s: unknown kernel %s", t.Name, n.Label, n.Kernel)
			}
			if len(n.Args) != len(k.Params) {
				return nil, fmt.Errorf("template %s node %s: %d args for %d params", t.Name, n.Label, len(n.Args), len(k.Params))
			}
			args := make([]ops.Arg, len(n.Args))
			for i, s := range n.Args {
				if s.Buffer == "" {
					args[i] = ops.Arg{Bits: s.Const}
					continue
				}
				mem, ok := be.bufs[s.Buffer]
				if !ok || s.Offset < 0 || s.Offset > int64(len(mem)) {
					return nil, fmt.Errorf("template %s node %s: argument %s names buffer %q (offset %d) that does not exist",
						t.Name, n.Label, k.Params[i].Name, s.Buffer, s.Offset)
				}
				args[i] = ops.Arg{Mem: mem[s.Offset:]}
			}
			nodes = append(nodes, boundNode{label: n.Label, run: runners[n.Kernel], args: args,
				launch: ops.Launch{Grid: n.Grid, Block: n.Block, Shared: n.Shared}})
		}
		be.templates = append(be.templates, nodes)
	}
	return be, nil
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
func (be *Backend) Name() string { return "cpu" }

func (be *Backend) span(name string, off int64, n int) ([]byte, error) {
	mem, ok := be.bufs[name]
	if !ok {
		return nil, fmt.Errorf("no buffer %q", name)
	}
	if off < 0 || off+int64(n) > int64(len(mem)) {
		return nil, fmt.Errorf("buffer %s: bytes [%d,%d) outside its %d bytes", name, off, off+int64(n), len(mem))
	}
	return mem[off : off+int64(n)], nil
}

// Write implements loader.Backend.
func (be *Backend) Write(name string, off int64, data []byte) error {
	dst, err := be.span(name, off, len(data))
	if err != nil {
		return err
	}
	copy(dst, data)
	return nil
}

// Read implements loader.Backend.
func (be *Backend) Read(name string, dst []byte) error {
	src, err := be.span(name, 0, len(dst))
	if err != nil {
		return err
	}
	copy(dst, src)
	return nil
}

// Buffer exposes a buffer's memory (for tests that inspect activations).
func (be *Backend) Buffer(name string) []byte { return be.bufs[name] }

// Step implements loader.Backend.
func (be *Backend) Step(t int) error {
	if t < 0 || t >= len(be.templates) {
		return fmt.Errorf("no template %d", t)
	}
	for _, n := range be.templates[t] {
		if err := n.run.Run(n.args, n.launch); err != nil {
			return fmt.Errorf("node %s: %w", n.label, err)
		}
	}
	return nil
}

// Close implements loader.Backend.
func (be *Backend) Close() error { return nil }
