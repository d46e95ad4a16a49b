package emu

import (
	"cmp"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"

	"xmix/ptx"
)

// Launch is a kernel's grid and block shape, and its dynamic shared memory.
type Launch struct {
	Grid, Block [3]int
	// Shared is the dynamic shared memory in bytes: the kernel's extern shared array, placed
	// after its static arrays at its own alignment, has this size.
	Shared int
	// Lag makes rank r of each cluster run one round in r+1, so that each block runs ahead
	// of the ones ranked after it: an ordering between a cluster's blocks that lockstep
	// rounds would hide (a copy into a partner's buffer it has not read yet) shows up.
	Lag bool
}

// globalTimer is what %globaltimer reads: the emulator's clock, a count of thread resumes
// (runWarps). A thread reads one value from one resume to its next stop (a barrier, an
// mbarrier wait, a shuffle, its exit), so the clock is monotonic, as the GPU's is, and a
// thread that runs on after another has stopped reads a later time: the step trace's
// records show which warp of a block ended last.
var globalTimer atomic.Uint64

// maxBarriers are a block's named barriers (bar.sync's id: 0..15).
const maxBarriers = 16

// maxSteps bounds the instructions one thread may execute, so that a kernel that never
// terminates fails its test instead of hanging it.
const maxSteps = 1 << 24

// maxShared is the most shared memory (static and dynamic) a block may have on sm_90.
const maxShared = 227 << 10

// Run executes entry of mod over the whole grid. params[i] is the raw bits of parameter i
// (pointers are addresses from Alloc; 32-bit scalars in the low bits, f32 as its bits).
// Blocks run in parallel (the blocks of one cluster together on one goroutine, interleaved,
// so that they can wait for each other); global atomics are serialised, so they are atomic
// across blocks. Any fault (out-of-bounds or misaligned access, deadlock, a runaway loop)
// stops the run with an error naming the kernel, the instruction, the block and the thread.
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
	csize := max(k.ClusterX, 1)
	if l.Grid[0]%csize != 0 {
		return fmt.Errorf("emu: kernel %s: grid x %d is not a multiple of its cluster size %d", k.Name, l.Grid[0], csize)
	}
	if l.Shared < 0 {
		return fmt.Errorf("emu: kernel %s: negative dynamic shared memory %d", k.Name, l.Shared)
	}
	p, err := decode(k, params, l.Shared)
	if err != nil {
		return fmt.Errorf("emu: %w", err)
	}
	if l.Shared > 0 && p.sharedLen > maxShared {
		return fmt.Errorf("emu: kernel %s: %d bytes of shared memory exceed the %d a block may have", k.Name, p.sharedLen, maxShared)
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
	nclusters := nblocks / csize
	workers := min(runtime.GOMAXPROCS(0), nclusters)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cl := newCluster(p, l, mem, &atomMu, csize)
			for !failed.Load() {
				i := int(next.Add(1)-1) * csize
				if i >= nblocks {
					return
				}
				if err := cl.run(i); err != nil {
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

// Thread states. stShfl covers every warp-collective instruction (shfl, mma, wgmma); stCWait is a
// wait at barrier.cluster, stMbar a wait for an mbarrier's phase (try_wait).
const (
	stRun uint8 = iota
	stBar
	stShfl
	stExit
	stCWait
	stMbar
)

// Cluster-barrier arrival of a thread, in block.carr.
const (
	cNone    uint8 = iota // not arrived in the current phase
	cPending              // arrived, the phase not complete
	cDone                 // arrived, the phase completed before the thread waited
)

// block holds one thread block's state; a worker reuses it for block after block.
type block struct {
	p      *program
	l      Launch
	mem    *Memory
	atomMu *sync.Mutex
	cl     *cluster
	rank   int
	n      int
	regs   []uint64
	pc     []int32
	state  []uint8
	carr   []uint8
	// barID is the barrier (bar.sync's id) a thread in stBar waits at; barWant[id] the
	// threads that barrier waits for (its count operand), 0 for all the block's live ones.
	barID   []uint8
	barWant [maxBarriers]int
	// arrived counts the threads with carr cPending.
	arrived int
	steps   []int32
	// waited is set once a thread has run griddepcontrol.wait: its global loads before are
	// early ones (Memory.EarlyLoads).
	waited []bool
	shared []byte
	last   *alloc
	cta    [3]int
	// progress is set when a thread executes anything beyond re-checking an mbarrier that
	// still blocks it, or a collective resolves.
	progress bool
}

func newBlock(p *program, l Launch, mem *Memory, atomMu *sync.Mutex) *block {
	n := l.Block[0] * l.Block[1] * l.Block[2]
	return &block{
		p: p, l: l, mem: mem, atomMu: atomMu, n: n,
		regs:   make([]uint64, n*p.nregs),
		pc:     make([]int32, n),
		state:  make([]uint8, n),
		carr:   make([]uint8, n),
		barID:  make([]uint8, n),
		steps:  make([]int32, n),
		waited: make([]bool, n),
		shared: make([]byte, p.sharedLen),
	}
}

// cluster is the blocks that run together: one without a cluster, ClusterX with one.
type cluster struct{ blocks []*block }

func newCluster(p *program, l Launch, mem *Memory, atomMu *sync.Mutex, size int) *cluster {
	cl := &cluster{}
	for r := range size {
		b := newBlock(p, l, mem, atomMu)
		b.cl, b.rank = cl, r
		cl.blocks = append(cl.blocks, b)
	}
	return cl
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

// run executes the cluster whose first block has linear index first. Each round runs every
// runnable thread of every block until it waits (at a barrier, a shuffle, barrier.cluster or
// an mbarrier) or exits; then a warp's shuffle resolves once all its live lanes wait on it, a
// block's barrier once all its live threads do, the cluster barrier once all the cluster's
// live threads have arrived, and mbarrier waiters look again. A round in which nothing moves
// while threads still wait is a deadlock (with Lag, a window of rounds in which every rank
// ran).
func (cl *cluster) run(first int) error {
	g := cl.blocks[0].l.Grid
	for r, b := range cl.blocks {
		i := first + r
		b.init([3]int{i % g[0], i / g[0] % g[1], i / (g[0] * g[1])})
	}
	// still counts the rounds in a row in which nothing moved. Every block runs at least once
	// in any window of rounds, so nothing moving in a whole window is a deadlock.
	window := 1
	if cl.blocks[0].l.Lag {
		window = len(cl.blocks)
	}
	for round, still := 0, 0; ; round++ {
		progress := false
		for r, b := range cl.blocks {
			if b.l.Lag && round%(r+1) != 0 {
				continue
			}
			if err := b.runWarps(); err != nil {
				return err
			}
			progress = progress || b.progress
			b.progress = false
		}
		live, mbar, arrived := 0, 0, 0
		for _, b := range cl.blocks {
			n, m, released := b.releaseBar()
			live, mbar, arrived = live+n, mbar+m, arrived+b.arrived
			progress = progress || released
		}
		if live == 0 {
			return nil
		}
		if arrived > 0 && cl.releaseClusterBarrier() {
			progress = true
		}
		if still = still + 1; progress {
			still = 0
		}
		if still >= window {
			return cl.deadlock()
		}
		if mbar == 0 {
			continue
		}
		for _, b := range cl.blocks {
			for t := range b.n {
				if b.state[t] == stMbar {
					b.state[t] = stRun
				}
			}
		}
	}
}

// init readies the block to run CTA cta.
func (b *block) init(cta [3]int) {
	b.cta = cta
	clear(b.regs)
	clear(b.shared)
	clear(b.pc)
	clear(b.state)
	clear(b.carr)
	clear(b.barID)
	b.barWant = [maxBarriers]int{}
	b.arrived = 0
	clear(b.steps)
	clear(b.waited)
	bx := b.l.Block
	nwarps := (b.n + 31) / 32
	for t := range b.n {
		s := b.threadRegs(t)[b.p.specials:]
		s[sTidX], s[sTidY], s[sTidZ] = uint64(t%bx[0]), uint64(t/bx[0]%bx[1]), uint64(t/(bx[0]*bx[1]))
		s[sNTidX], s[sNTidY], s[sNTidZ] = uint64(bx[0]), uint64(bx[1]), uint64(bx[2])
		s[sCtaidX], s[sCtaidY], s[sCtaidZ] = uint64(cta[0]), uint64(cta[1]), uint64(cta[2])
		s[sNCtaidX], s[sNCtaidY], s[sNCtaidZ] = uint64(b.l.Grid[0]), uint64(b.l.Grid[1]), uint64(b.l.Grid[2])
		s[sLane], s[sWarp], s[sNWarp] = uint64(t%32), uint64(t/32), uint64(nwarps)
		s[sClusterRank], s[sClusterSize] = uint64(b.rank), uint64(len(b.cl.blocks))
		s[sSMID] = 0 // the emulator is one SM
	}
}

// runWarps runs every runnable thread of the block, warp by warp, resolving each warp's
// shuffles as they become complete.
func (b *block) runWarps() error {
	nwarps := (b.n + 31) / 32
	for w := range nwarps {
		lo, hi := w*32, min(w*32+32, b.n)
		for {
			for t := lo; t < hi; t++ {
				if b.state[t] == stRun {
					b.threadRegs(t)[b.p.specials+sGlobalTimer] = globalTimer.Add(1)
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
			b.progress = true
		}
	}
	return nil
}

// releaseBar releases each of the block's barriers whose threads are all there: its count
// (bar.sync id, count), or else every live thread. It returns the number of live threads,
// how many wait at an mbarrier and whether it released any.
func (b *block) releaseBar() (live, mbar int, released bool) {
	var waiting [maxBarriers]int
	for t := range b.n {
		switch b.state[t] {
		case stExit:
		case stBar:
			waiting[b.barID[t]]++
			live++
		case stMbar:
			mbar++
			live++
		default:
			live++
		}
	}
	for id, w := range waiting {
		if w == 0 || w != cmp.Or(b.barWant[id], live) {
			continue
		}
		for t := range b.n {
			if b.state[t] == stBar && int(b.barID[t]) == id {
				b.state[t] = stRun
				b.pc[t]++
			}
		}
		released = true
	}
	return live, mbar, released
}

// releaseClusterBarrier completes the cluster barrier's phase when every live thread of the
// cluster has arrived: waiting threads resume, the others find the phase complete when they
// wait.
func (cl *cluster) releaseClusterBarrier() bool {
	any := false
	for _, b := range cl.blocks {
		for t := range b.n {
			if b.state[t] == stExit {
				continue
			}
			if b.carr[t] != cPending {
				return false
			}
			any = true
		}
	}
	if !any {
		return false
	}
	for _, b := range cl.blocks {
		b.arrived = 0
		for t := range b.n {
			switch {
			case b.state[t] == stCWait:
				b.state[t], b.carr[t] = stRun, cNone
				b.pc[t]++
			case b.carr[t] == cPending:
				b.carr[t] = cDone
			}
		}
	}
	return true
}

// deadlock describes a cluster whose threads all wait and none can be released: it names
// the first thread waiting at each kind of wait.
func (cl *cluster) deadlock() error {
	kinds := []struct {
		st   uint8
		what string
	}{{stShfl, "a shuffle"}, {stBar, "a barrier"}, {stCWait, "barrier.cluster"}, {stMbar, "an mbarrier phase that never completes"}}
	type where struct {
		b *block
		t int
	}
	first := make([]where, len(kinds))
	count := make([]int, len(kinds))
	for _, b := range cl.blocks {
		for t := range b.n {
			for k, kd := range kinds {
				if b.state[t] == kd.st {
					if count[k] == 0 {
						first[k] = where{b, t}
					}
					count[k]++
				}
			}
		}
	}
	var errs []error
	for k, kd := range kinds {
		if count[k] > 0 {
			w := first[k]
			errs = append(errs, w.b.errorAt(w.t, w.b.pc[w.t], fmt.Errorf("deadlock: waits at %s forever (%d threads wait at shuffles, %d at barriers, %d at barrier.cluster, %d at mbarriers)",
				kd.what, count[0], count[1], count[2], count[3])))
		}
	}
	return errors.Join(errs...)
}

// shuffle resolves the shfl (or mma, wgmma) that every live lane of the warp [lo,hi) waits on, if
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
	switch in.op {
	case cMma:
		return true, b.mma(lo, hi, pc)
	case cWgmma:
		return true, b.wgmma(lo, hi, pc)
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
	steps, blockedAgain, err := b.exec(t, b.steps[t])
	b.steps[t] = steps
	if !blockedAgain {
		b.progress = true
	}
	return err
}

// exec is thread's loop (without a defer, which would cost more than a short run); it
// returns the thread's step count and whether it only re-checked an mbarrier that still
// blocks it.
func (b *block) exec(t int, steps int32) (int32, bool, error) {
	r := b.threadRegs(t)
	code := b.p.code
	pc := b.pc[t]
	start := steps
	for {
		in := &code[pc]
		if steps++; steps > maxSteps {
			return steps, false, b.errorAt(t, pc, fmt.Errorf("more than %d instructions executed; runaway loop?", maxSteps))
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
			return steps, false, nil
		case cBar:
			id, want := rv(r, in.a), rv(r, in.b)
			if id >= maxBarriers || want%32 != 0 || want > uint64(b.n) {
				return steps, false, b.errorAt(t, pc, fmt.Errorf("barrier %d of %d threads: want a barrier below %d and a multiple of 32 threads up to the block's %d", id, want, maxBarriers, b.n))
			}
			b.barID[t], b.barWant[id] = uint8(id), int(want)
			b.pc[t], b.state[t] = pc, stBar
			return steps, false, nil
		case cShfl, cMma, cWgmma:
			b.pc[t], b.state[t] = pc, stShfl
			return steps, false, nil
		case cNop:
		case cTrap:
			return steps, false, b.errorAt(t, pc, errors.New("trap"))
		case cClusterArrive:
			if b.carr[t] != cNone {
				return steps, false, b.errorAt(t, pc, errors.New("arrives at barrier.cluster twice in one phase"))
			}
			b.carr[t] = cPending
			b.arrived++
		case cClusterWait:
			switch b.carr[t] {
			case cNone:
				return steps, false, b.errorAt(t, pc, errors.New("barrier.cluster.wait without a barrier.cluster.arrive before it"))
			case cPending:
				b.pc[t], b.state[t] = pc, stCWait
				return steps, false, nil
			}
			b.carr[t] = cNone
		case cMbarWait:
			done, err := b.mbarWait(in, r)
			if err != nil {
				return steps, false, b.errorAt(t, pc, err)
			}
			if !done {
				b.pc[t], b.state[t] = pc, stMbar
				return steps, steps == start+1, nil
			}
		case cMbarInit, cMbarArrive, cBulk, cTensor, cMapa:
			if err := b.async(in, r); err != nil {
				return steps, false, b.errorAt(t, pc, err)
			}
		case cGridWait:
			b.waited[t] = true
		case cLd:
			if err := b.load(in, r, !b.waited[t]); err != nil {
				return steps, false, b.errorAt(t, pc, err)
			}
		case cPrefetch:
			if err := b.prefetch(in, r); err != nil {
				return steps, false, b.errorAt(t, pc, err)
			}
		case cSt:
			if err := b.store(in, r); err != nil {
				return steps, false, b.errorAt(t, pc, err)
			}
		case cAtom:
			if err := b.atomic(in, r); err != nil {
				return steps, false, b.errorAt(t, pc, err)
			}
		default:
			v, err := alu(in, r)
			if err != nil {
				return steps, false, b.errorAt(t, pc, err)
			}
			r[in.d[0]] = v
		}
		pc++
	}
}
