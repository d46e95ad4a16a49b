package cpu

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"xmix/bundle"
	"xmix/loader"
	"xmix/loader/rendezvous"
)

// Tensor parallelism across processes (and hosts): the ranks of a group found each other
// through package rendezvous; rank 0 runs the engine and is the hub, every other rank is a
// worker that follows it. Rank 0 forwards every control write and every step; at each
// collective node the workers send their parts to rank 0, which adds them in rank order (or
// lays the columns out) exactly as the in-process communicator does and sends the result
// back. The bits therefore equal an in-process run's. NCCL would replace this transport;
// the rendezvous and the driving stay.

// Frame kinds on a group's links.
const (
	frameWrite  = rendezvous.FirstUserKind + iota // 0 -> r: u16 name length, name, i64 offset, bytes
	frameStep                                     // 0 -> r: u32 template index
	frameResult                                   // 0 -> r: a collective's result, f32s
	frameBye                                      // 0 -> r: the group is done; exit
	framePart                                     // r -> 0: this rank's part of a collective, f32s
	frameDone                                     // r -> 0: the step ended well
	frameReady                                    // r -> 0: loaded
	frameFail                                     // r -> 0: what failed (text); the worker exits
)

// DefaultWait bounds every wait of rank 0 for a worker when GroupOptions.Wait is zero.
const DefaultWait = 10 * time.Minute

// GroupOptions tune rank 0 of a multi-process group.
type GroupOptions struct {
	Progress Progress
	// Wait bounds each wait for a worker (its load, its part at a collective, the end of its
	// step): a worker that is alive but stuck fails the step instead of hanging it. A
	// worker that exits is noticed at once (its connection closes).
	Wait time.Duration
}

// hub is rank 0's end of the group.
type hub struct {
	n     int
	links []*rendezvous.Link // links[r] reaches rank r; links[0] is nil
	wait  time.Duration
	// broken is the failure that ended the group: after it every call returns it, since
	// the workers have been dismissed and their buffers may be half a step ahead.
	broken error
}

// NewGroup loads rank 0 of a tensor-parallel bundle whose other ranks joined g (each
// running Serve), waits until every worker has loaded its rank, and returns the backend the
// engine drives: Write and Step reach every rank, Read reads rank 0.
func NewGroup(b *bundle.Bundle, w *loader.Weights, g *rendezvous.Group, opts GroupOptions) (*Backend, error) {
	if opts.Progress == nil {
		opts.Progress = func(string, ...any) {}
	}
	if opts.Wait <= 0 {
		opts.Wait = DefaultWait
	}
	if g.Rank != 0 || g.World != max(1, b.Manifest.TP) {
		g.Close()
		return nil, fmt.Errorf("rank %d of a group of %d cannot drive a bundle of tp %d: only rank 0 does, with every rank present", g.Rank, g.World, b.Manifest.TP)
	}
	h := &hub{n: g.World, links: g.Links, wait: opts.Wait}
	rk, err := newRank(b, w, 0, g.World, opts.Progress)
	if err == nil {
		err = h.awaitAll(frameReady)
	}
	if err != nil {
		h.fail(err)
		return nil, fmt.Errorf("rank 0: %w", err)
	}
	be := &Backend{ranks: []*rank{rk}, sharded: map[string]bool{}, hub: h}
	for _, buf := range b.Manifest.Buffers {
		if buf.Shard != nil {
			be.sharded[buf.Name] = true
		}
	}
	return be, nil
}

// write forwards a control write; it leaves with the next step's frames.
func (h *hub) write(name string, off int64, data []byte) error {
	if h.broken != nil {
		return h.brokenError()
	}
	if len(name) > 0xffff {
		return fmt.Errorf("buffer name of %d bytes: too long to forward", len(name))
	}
	hdr := binary.LittleEndian.AppendUint16(nil, uint16(len(name)))
	hdr = append(hdr, name...)
	hdr = binary.LittleEndian.AppendUint64(hdr, uint64(off))
	for _, l := range h.links[1:] {
		if err := l.Send(frameWrite, hdr, data); err != nil {
			h.fail(err)
			return err
		}
	}
	return nil
}

// step runs template t on every rank: the workers on their own once told, rank 0 here with
// the hub as its exchanger; it returns once every worker has finished the step.
func (h *hub) step(rk *rank, t int) error {
	if h.broken != nil {
		return h.brokenError()
	}
	if t < 0 || t >= len(rk.templates) {
		return fmt.Errorf("no template %d", t) // refused before the workers hear of it
	}
	err := h.sendAll(frameStep, binary.LittleEndian.AppendUint32(nil, uint32(t)))
	if err == nil {
		err = rk.step(t, h)
	}
	if err == nil {
		err = h.awaitAll(frameDone)
	}
	if err != nil {
		h.fail(err)
		return fmt.Errorf("tensor-parallel step (template %d): %w", t, err)
	}
	return nil
}

// sendAll sends one frame to every worker and flushes, so it leaves with every queued write.
func (h *hub) sendAll(kind byte, payload []byte) error {
	for _, l := range h.links[1:] {
		if err := l.Post(kind, payload); err != nil {
			return err
		}
	}
	return nil
}

// recv reads rank r's next frame, which must be of kind want; a frameFail is the worker's
// own error.
func (h *hub) recv(r int, want byte) ([]byte, error) {
	l := h.links[r]
	kind, payload, err := l.Recv(time.Now().Add(h.wait))
	switch {
	case err != nil:
		return nil, err
	case kind == frameFail:
		return nil, fmt.Errorf("%s failed: %s", l.Peer, payload)
	case kind != want:
		return nil, fmt.Errorf("%s sent frame kind %d, want %d (out of step with rank 0)", l.Peer, kind, want)
	}
	return payload, nil
}

func (h *hub) awaitAll(want byte) error {
	for r := 1; r < h.n; r++ {
		if _, err := h.recv(r, want); err != nil {
			return err
		}
	}
	return nil
}

// parts collects every rank's part of a collective of n elements, rank 0's being mine.
func (h *hub) parts(mine []float32) ([][]float32, error) {
	all := make([][]float32, h.n)
	all[0] = mine
	for r := 1; r < h.n; r++ {
		p, err := h.recv(r, framePart)
		if err != nil {
			return nil, err
		}
		if all[r], err = decodeF32s(p, len(mine)); err != nil {
			return nil, fmt.Errorf("%s: part: %w", h.links[r].Peer, err)
		}
	}
	return all, nil
}

func (h *hub) allReduceSum(_ int, x []float32) error {
	all, err := h.parts(x)
	if err != nil {
		return err
	}
	copy(x, sumInRankOrder(all, len(x)))
	return h.sendAll(frameResult, encodeF32s(x))
}

func (h *hub) allGatherCols(_ int, in, out []float32, rows, cols int) error {
	all, err := h.parts(in)
	if err != nil {
		return err
	}
	gatherCols(all, out, rows, cols)
	return h.sendAll(frameResult, encodeF32s(out))
}

// fail ends the group after err: the workers are dismissed by closing their connections
// (those blocked at a collective see it at once) and every later call returns err.
func (h *hub) fail(err error) {
	if h.broken == nil {
		h.broken = err
	}
	for _, l := range h.links[1:] {
		l.Close()
	}
}

func (h *hub) brokenError() error {
	return fmt.Errorf("the tensor-parallel group stopped after an earlier failure: %w", h.broken)
}

// close tells every worker to exit.
func (h *hub) close() error {
	if h.broken != nil {
		return nil // the workers were dismissed when the group broke
	}
	err := h.sendAll(frameBye, nil)
	h.fail(errors.New("rank 0 closed the group"))
	return err
}

// spoke is a worker's exchanger: it sends its part to rank 0 and waits for the result.
type spoke struct{ link *rendezvous.Link }

func (s spoke) exchange(part, result []float32) error {
	if err := s.link.Post(framePart, encodeF32s(part)); err != nil {
		return err
	}
	// No deadline: rank 0 waits for the slowest rank, and a rank 0 that dies closes the link.
	kind, payload, err := s.link.Recv(time.Time{})
	if err != nil {
		return err
	}
	if kind != frameResult {
		return fmt.Errorf("%s sent frame kind %d in a collective, want its result", s.link.Peer, kind)
	}
	v, err := decodeF32s(payload, len(result))
	if err != nil {
		return fmt.Errorf("%s: result: %w", s.link.Peer, err)
	}
	copy(result, v)
	return nil
}

func (s spoke) allReduceSum(_ int, x []float32) error { return s.exchange(x, x) }

func (s spoke) allGatherCols(_ int, in, out []float32, rows, cols int) error {
	return s.exchange(in, out)
}

// Serve is a worker's life: load rank g.Rank of b, tell rank 0, then apply every write and
// run every step rank 0 sends until it says goodbye (nil) or the group fails (the error,
// also sent to rank 0 when the link still works).
func Serve(b *bundle.Bundle, w *loader.Weights, g *rendezvous.Group, progress Progress) error {
	if progress == nil {
		progress = func(string, ...any) {}
	}
	if g.Rank == 0 || g.World != max(1, b.Manifest.TP) {
		return fmt.Errorf("rank %d of a group of %d cannot serve a bundle of tp %d: rank 0 drives, the others serve", g.Rank, g.World, b.Manifest.TP)
	}
	link := g.Links[0]
	defer link.Close()
	rk, err := newRank(b, w, g.Rank, g.World, progress)
	if err != nil {
		return failTo(link, g.Rank, err)
	}
	return serve(rk, link)
}

// serve reports rk ready and follows rank 0's orders until its goodbye.
func serve(rk *rank, link *rendezvous.Link) error {
	err := link.Post(frameReady, nil)
	for err == nil {
		var done bool
		if done, err = follow(rk, link); done {
			return nil
		}
	}
	return failTo(link, rk.id, err)
}

// failTo tells rank 0 what failed on rank id, when the link still works, and returns it.
func failTo(link *rendezvous.Link, id int, err error) error {
	err = fmt.Errorf("rank %d: %w", id, err)
	link.Post(frameFail, []byte(err.Error()))
	return err
}

// follow carries out rank 0's next order; done is its goodbye.
func follow(rk *rank, link *rendezvous.Link) (done bool, err error) {
	kind, payload, err := link.Recv(time.Time{})
	if err != nil {
		return false, err
	}
	switch kind {
	case frameWrite:
		name, off, data, err := decodeWrite(payload)
		if err != nil {
			return false, err
		}
		return false, rk.write(name, off, data)
	case frameStep:
		if len(payload) != 4 {
			return false, fmt.Errorf("%s sent a step frame of %d bytes", link.Peer, len(payload))
		}
		if err := rk.step(int(binary.LittleEndian.Uint32(payload)), spoke{link}); err != nil {
			return false, err
		}
		return false, link.Post(frameDone, nil)
	case frameBye:
		return true, nil
	}
	return false, fmt.Errorf("%s sent frame kind %d, want a write, a step or goodbye", link.Peer, kind)
}

func decodeWrite(p []byte) (name string, off int64, data []byte, err error) {
	if len(p) < 2 || len(p) < 2+int(binary.LittleEndian.Uint16(p))+8 {
		return "", 0, nil, fmt.Errorf("truncated write frame of %d bytes", len(p))
	}
	n := int(binary.LittleEndian.Uint16(p))
	name = string(p[2 : 2+n])
	off = int64(binary.LittleEndian.Uint64(p[2+n:]))
	return name, off, p[2+n+8:], nil
}

func encodeF32s(v []float32) []byte {
	b, _ := binary.Append(make([]byte, 0, 4*len(v)), binary.LittleEndian, v)
	return b
}

// decodeF32s reads exactly n little-endian f32s.
func decodeF32s(p []byte, n int) ([]float32, error) {
	if len(p) != 4*n {
		return nil, fmt.Errorf("%d bytes, want %d f32s", len(p), n)
	}
	v := make([]float32, n)
	_, err := binary.Decode(p, binary.LittleEndian, v)
	return v, err
}
