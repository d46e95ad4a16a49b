package emu

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"

	"xmix/ptx"
)

// Launch is a kernel's grid and block shape.
type Launch struct{ Grid, Block [3]int }

// maxSteps bounds the instructions one thread may execute, so that a kernel that never
// terminates fails its test instead of hanging it.
const maxSteps = 1 << 24

// Run executes entry of mod over the whole grid. params[i] is the raw bits of parameter i
// (pointers are addresses from Alloc; 32-bit scalars in the low bits, f32 as its bits).
// Blocks run in parallel; global atomics are serialised, so they are atomic across blocks.
// Any fault (out-of-bounds or misaligned access, deadlock, a runaway loop) stops the run
// with an error naming the kernel, the instruction, the block and the thread.
func Run(mod *ptx.Module, entry string, l Launch, mem *Memory, params []uint64) error {
	k := mod.Kernel(entry)
	if k == nil {
		return fmt.Errorf("emu: no entry %q in module", entry)
	}
	one := &ptx.Module{Version: mod.Version, Target: mod.Target, AddressSize: mod.AddressSize, Kernels: []*ptx.Kernel{k}}
	if err := ptx.Validate(one); err != nil {
		return fmt.Errorf("emu: %w", err)
	}
	if len(params) != len(k.Params) {
		return fmt.Errorf("emu: kernel %s takes %d parameters, got %d", k.Name, len(k.Params), len(params))
	}
	nthreads, nblocks := 1, 1
	for i := range 3 {
		if l.Grid[i] < 1 || l.Block[i] < 1 {
			return fmt.Errorf("emu: kernel %s: bad launch grid %v block %v", k.Name, l.Grid, l.Block)
		}
		nthreads *= l.Block[i]
		nblocks *= l.Grid[i]
	}
	if nthreads > 1024 {
		return fmt.Errorf("emu: kernel %s: block of %d threads exceeds 1024", k.Name, nthreads)
	}
	p, err := decode(k, params)
	if err != nil {
		return fmt.Errorf("emu: %w", err)
	}
	var (
		next     atomic.Int64
		failed   atomic.Bool
		errMu    sync.Mutex
		firstErr error
		firstBlk = nblocks
		atomMu   sync.Mutex
		wg       sync.WaitGroup
	)
	workers := min(runtime.GOMAXPROCS(0), nblocks)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			b := newBlock(p, l, mem, &atomMu)
			for !failed.Load() {
				i := int(next.Add(1) - 1)
				if i >= nblocks {
					return
				}
				cta := [3]int{i % l.Grid[0], i / l.Grid[0] % l.Grid[1], i / (l.Grid[0] * l.Grid[1])}
				if err := b.run(cta); err != nil {
					errMu.Lock()
					if i < firstBlk {
						firstBlk, firstErr = i, err
					}
					errMu.Unlock()
					failed.Store(true)
				}
			}
		}()
	}
	wg.Wait()
	if firstErr != nil {
		return fmt.Errorf("emu: %w", firstErr)
	}
	return nil
}

// Thread states. stShfl covers every warp-collective instruction (shfl, mma).
const (
	stRun uint8 = iota
	stBar
	stShfl
	stExit
)

// block holds one thread block's state; a worker reuses it for block after block.
type block struct {
	p      *program
	l      Launch
	mem    *Memory
	atomMu *sync.Mutex
	n      int
	regs   []uint64
	pc     []int32
	state  []uint8
	steps  []int32
	shared []byte
	last   *alloc
	cta    [3]int
}

func newBlock(p *program, l Launch, mem *Memory, atomMu *sync.Mutex) *block {
	n := l.Block[0] * l.Block[1] * l.Block[2]
	return &block{
		p: p, l: l, mem: mem, atomMu: atomMu, n: n,
		regs:   make([]uint64, n*p.nregs),
		pc:     make([]int32, n),
		state:  make([]uint8, n),
		steps:  make([]int32, n),
		shared: make([]byte, p.sharedLen),
	}
}

func (b *block) threadRegs(t int) []uint64 { return b.regs[t*b.p.nregs : (t+1)*b.p.nregs] }

// errorAt wraps err with everything needed to find the fault.
func (b *block) errorAt(t int, pc int32, err error) error {
	k := b.p.k
	src := b.p.code[pc].src
	text := "end of body"
	if int(src) < len(k.Body) {
		text = k.Body[src].String()
	}
	bx := b.l.Block
	return fmt.Errorf("kernel %s: instr %d (%s): block (%d,%d,%d) thread (%d,%d,%d): %w",
		k.Name, src, text, b.cta[0], b.cta[1], b.cta[2], t%bx[0], t/bx[0]%bx[1], t/(bx[0]*bx[1]), err)
}

// run executes one block: every thread runs until it waits at a barrier or a shuffle or
// exits; a warp's shuffle resolves once all its live lanes wait on it, a barrier once all the
// block's live threads do. If neither can happen while threads still wait, it is a deadlock.
func (b *block) run(cta [3]int) error {
	b.cta = cta
	clear(b.regs)
	clear(b.shared)
	clear(b.pc)
	clear(b.state)
	clear(b.steps)
	bx := b.l.Block
	nwarps := (b.n + 31) / 32
	for t := range b.n {
		s := b.threadRegs(t)[b.p.specials:]
		s[sTidX], s[sTidY], s[sTidZ] = uint64(t%bx[0]), uint64(t/bx[0]%bx[1]), uint64(t/(bx[0]*bx[1]))
		s[sNTidX], s[sNTidY], s[sNTidZ] = uint64(bx[0]), uint64(bx[1]), uint64(bx[2])
		s[sCtaidX], s[sCtaidY], s[sCtaidZ] = uint64(cta[0]), uint64(cta[1]), uint64(cta[2])
		s[sNCtaidX], s[sNCtaidY], s[sNCtaidZ] = uint64(b.l.Grid[0]), uint64(b.l.Grid[1]), uint64(b.l.Grid[2])
		s[sLane], s[sWarp], s[sNWarp] = uint64(t%32), uint64(t/32), uint64(nwarps)
	}
	for {
		for w := range nwarps {
			lo, hi := w*32, min(w*32+32, b.n)
			for {
				for t := lo; t < hi; t++ {
					if b.state[t] == stRun {
						if err := b.thread(t); err != nil {
							return err
						}
					}
				}
				resolved, err := b.shuffle(lo, hi)
				if err != nil {
					return err
				}
				if !resolved {
					break
				}
			}
		}
		live, atBar := 0, 0
		for t := range b.n {
			switch b.state[t] {
			case stBar:
				atBar++
				live++
			case stShfl:
				live++
			}
		}
		if live == 0 {
			return nil
		}
		if atBar != live {
			return b.deadlock()
		}
		for t := range b.n {
			if b.state[t] == stBar {
				b.state[t] = stRun
				b.pc[t]++
			}
		}
	}
}

// deadlock describes a block whose threads all wait and none can be released: it names the
// first thread waiting at a shuffle and the first at a barrier.
func (b *block) deadlock() error {
	first := [2]int{-1, -1}
	var count [2]int
	for t := range b.n {
		k := -1
		switch b.state[t] {
		case stShfl:
			k = 0
		case stBar:
			k = 1
		}
		if k >= 0 {
			count[k]++
			if first[k] < 0 {
				first[k] = t
			}
		}
	}
	var errs []error
	for k, what := range []string{"a shuffle", "a barrier"} {
		if t := first[k]; t >= 0 {
			errs = append(errs, b.errorAt(t, b.pc[t], fmt.Errorf("deadlock: waits at %s forever (%d threads wait at shuffles, %d at barriers)", what, count[0], count[1])))
		}
	}
	return errors.Join(errs...)
}

// shuffle resolves the shfl (or mma) that every live lane of the warp [lo,hi) waits on, if
// they all wait on the same one. Source lanes are read before any lane is written, so d may equal a.
func (b *block) shuffle(lo, hi int) (bool, error) {
	pc := int32(-1)
	for t := lo; t < hi; t++ {
		switch b.state[t] {
		case stExit:
			continue
		case stShfl:
			if pc >= 0 && b.pc[t] != pc {
				return false, nil
			}
			pc = b.pc[t]
		default:
			return false, nil
		}
	}
	if pc < 0 {
		return false, nil
	}
	in := &b.p.code[pc]
	if in.op == cMma {
		return true, b.mma(lo, hi, pc)
	}
	var vals [32]uint64
	for t := lo; t < hi; t++ {
		if b.state[t] != stShfl {
			continue
		}
		r := b.threadRegs(t)
		lane := t - lo
		bv := int(rv(r, in.b) & 0x1f)
		cv := int(rv(r, in.c))
		clamp, seg := cv&0x1f, (cv>>8)&0x1f
		maxLane, minLane := lane&seg|clamp&^seg, lane&seg
		var j int
		var ok bool
		switch in.mode {
		case shflUp:
			j = lane - bv
			ok = j >= maxLane
		case shflDown:
			j = lane + bv
			ok = j <= maxLane
		case shflBfly:
			j = lane ^ bv
			ok = j <= maxLane
		default:
			j = minLane | bv&^seg
			ok = j <= maxLane
		}
		if !ok || lo+j >= hi {
			j = lane
		}
		vals[lane] = rv(b.threadRegs(lo+j), in.a) & 0xffffffff
	}
	for t := lo; t < hi; t++ {
		if b.state[t] == stShfl {
			b.threadRegs(t)[in.d[0]] = vals[t-lo]
			b.state[t] = stRun
			b.pc[t]++
		}
	}
	return true, nil
}

func rv(r []uint64, o opnd) uint64 {
	if o.reg >= 0 {
		return r[o.reg]
	}
	return o.imm
}

// thread runs thread t until it blocks or exits.
func (b *block) thread(t int) error {
	r := b.threadRegs(t)
	code := b.p.code
	pc := b.pc[t]
	steps := b.steps[t]
	defer func() { b.steps[t] = steps }()
	for {
		in := &code[pc]
		if steps++; steps > maxSteps {
			return b.errorAt(t, pc, fmt.Errorf("more than %d instructions executed; runaway loop?", maxSteps))
		}
		if in.guard >= 0 && (r[in.guard]&1 != 0) == in.gneg {
			pc++
			continue
		}
		switch in.op {
		case cBra:
			pc = in.target
			continue
		case cExit:
			b.pc[t], b.state[t] = pc, stExit
			return nil
		case cBar:
			b.pc[t], b.state[t] = pc, stBar
			return nil
		case cShfl, cMma:
			b.pc[t], b.state[t] = pc, stShfl
			return nil
		case cNop:
		case cLd:
			if err := b.load(in, r); err != nil {
				return b.errorAt(t, pc, err)
			}
		case cPrefetch:
			if err := b.prefetch(in, r); err != nil {
				return b.errorAt(t, pc, err)
			}
		case cSt:
			if err := b.store(in, r); err != nil {
				return b.errorAt(t, pc, err)
			}
		case cAtom:
			if err := b.atomic(in, r); err != nil {
				return b.errorAt(t, pc, err)
			}
		default:
			v, err := alu(in, r)
			if err != nil {
				return b.errorAt(t, pc, err)
			}
			r[in.d[0]] = v
		}
		pc++
	}
}
