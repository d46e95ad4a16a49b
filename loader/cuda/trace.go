package cuda

import (
	"encoding/binary"
	"fmt"
	"unsafe"

	"xmix/bundle"
	"xmix/ptx"
)

// The step trace (Options.Trace, `xmix bench --trace`): a replayed graph's kernels overlap
// (early launch), so neither --profile (nodes one by one) nor --role-costs (a role left out)
// says when each kernel of a step really starts, waits and ends. With Trace, the backend
// rewrites every kernel it loads, its own cast included, so that thread 0 of each CTA takes a
// record in one device buffer, in the order the CTAs begin, and writes there when the CTA
// began, when its wait for the grid ahead returned, when thread 0 ended and the SM it ran on
// (%smid); lane 0 of every warp raises the record's end to its own, so the CTA's end is its
// last warp's (%globaltimer, ns). Trace replays a template's graph once and gives each launch
// its CTAs' records. cuBLASLt's kernels are the library's and carry no records. The stamps
// cost each CTA an atomic, a barrier and a few stores, so time shapes without Trace.

const (
	traceHeaderBytes = 64 // the record counter, then padding to the first record
	// A record: kernel id, CTA, began, waited, ended (the last warp's), SM, padding, thread
	// 0's end, then traceWarpSlots warps' ends (u32 ns after began; later warps share the
	// last slot).
	traceRecordBytes = 80
	traceWarpSlots   = 8
	traceCapacity    = 1 << 20 // records a replay may take; CTAs past it write none
)

// traceBuffer is the device buffer the instrumented kernels write.
type traceBuffer struct {
	addr uintptr
	ids  map[uintptr]uint32 // kernel function -> its id in the records: the bundle's kernels by index, then the cast
}

// newTraceBuffer allocates the trace's device buffer.
func (be *Backend) newTraceBuffer() error {
	be.trace = &traceBuffer{ids: map[uintptr]uint32{}}
	n := uintptr(traceHeaderBytes + traceCapacity*traceRecordBytes)
	if err := be.d.call("cuMemAlloc_v2", uintptr(unsafe.Pointer(&be.trace.addr)), n); err != nil {
		return fmt.Errorf("trace: allocating %d bytes: %w", n, err)
	}
	be.allocs = append(be.allocs, be.trace.addr)
	return nil
}

// instrumentForTrace rewrites kernel k (parsed PTX) to write its CTAs' records, as kernel id,
// into the trace buffer at base (room for capacity records): a prologue takes a record
// (thread 0 of each CTA only: an atomic on the counter, then the kernel id, the CTA's index,
// the time and the SM) and leaves the record's address in shared memory for the other warps
// (a barrier of the whole CTA, ahead of the kernel's own instructions); the wait for the grid
// ahead is followed by its time; every ret and exit is preceded by thread 0's end time where
// thread 0 takes it, and by lane 0 of each warp raising the record's end to its time, so a
// CTA whose warps leave at different times (the copy-engine kernels' producer warp) ends
// with its last, and raising its warp's slot to the ns since the CTA began (which warp ended
// when).
// Lane 0 stands for its warp: in the kernels here a warp's other lanes never leave after it,
// and an atomic from every thread would cost more than what it measures. The kernel's own
// instructions are unchanged, and its threads write nothing else.
func instrumentForTrace(k *ptx.Kernel, id uint32, base uint64, capacity int) {
	u32, u64 := func() ptx.Reg { return k.Reg(ptx.U32) }, func() ptx.Reg { return k.Reg(ptx.U64) }
	pred := func() ptx.Reg { return k.Reg(ptx.Pred) }
	tid, t, cta, n, kid, sm, lane, warp, elapsed := u32(), u32(), u32(), u32(), u32(), u32(), u32(), u32(), u32()
	buf, idx, rec, now, found, since, slot, zero := u64(), u64(), u64(), u64(), u64(), u64(), u64(), u64()
	on, first, lead, raise := pred(), pred(), pred(), pred()
	recAt := k.DeclareShared("xmix_trace_record", ptx.U64, 1)
	in := func(op string, args ...ptx.Operand) ptx.Instr { return ptx.Instr{Op: op, Args: args} }
	if1 := func(p ptx.Reg, op string, args ...ptx.Operand) ptx.Instr {
		return ptx.Instr{Guard: &p, Op: op, Args: args}
	}
	stamp := func(p ptx.Reg, offset int64) []ptx.Instr {
		return []ptx.Instr{
			if1(p, "mov.u64", now, ptx.GlobalTimer),
			if1(p, "st.global.u64", ptx.Addr{Base: rec, Offset: offset}, now),
		}
	}
	// raiseEnd: lane 0 of a warp (where p) raises the end of its CTA's record, where the CTA
	// has one, to its time, and its warp's slot to the ns since the CTA began.
	raiseEnd := func(p ptx.Reg) []ptx.Instr {
		return []ptx.Instr{
			if1(p, "ld.shared.u64", found, ptx.Addr{Base: recAt}),
			if1(p, "setp.ne.u64", raise, found, ptx.Imm(0)),
			in("and.pred", raise, raise, p),
			if1(raise, "mov.u64", now, ptx.GlobalTimer),
			if1(raise, "red.global.max.u64", ptx.Addr{Base: found, Offset: 24}, now),
			if1(raise, "ld.global.u64", since, ptx.Addr{Base: found, Offset: 8}), // when the CTA began
			if1(raise, "sub.u64", since, now, since),
			if1(raise, "cvt.u32.u64", elapsed, since),
			if1(raise, "add.u64", found, found, slot),
			if1(raise, "red.global.max.u32", ptx.Addr{Base: found, Offset: 48}, elapsed),
		}
	}
	body := []ptx.Instr{
		in("mov.u32", tid, ptx.TidX), in("mov.u32", t, ptx.TidY), in("or.b32", tid, tid, t),
		in("mov.u32", t, ptx.Special("%tid.z")), in("or.b32", tid, tid, t),
		in("setp.eq.u32", first, tid, ptx.Imm(0)),
		in("mov.pred", on, first),
		in("mov.u32", lane, ptx.Special("%laneid")),
		in("setp.eq.u32", lead, lane, ptx.Imm(0)),
		// The warp's slot in the record: 4 bytes a warp of the CTA, in thread order.
		in("mov.u32", t, ptx.Special("%ntid.y")), in("mov.u32", n, ptx.Special("%tid.z")),
		in("mov.u32", warp, ptx.Special("%tid.y")), in("mad.lo.u32", warp, n, t, warp),
		in("mov.u32", t, ptx.Special("%ntid.x")), in("mov.u32", n, ptx.TidX), in("mad.lo.u32", warp, warp, t, n),
		in("shr.u32", warp, warp, ptx.Imm(5)), in("min.u32", warp, warp, ptx.Imm(traceWarpSlots-1)),
		in("mul.wide.u32", slot, warp, ptx.Imm(4)),
		in("mov.u64", now, ptx.GlobalTimer),
		in("mov.u64", buf, ptx.U64Imm(base)),
		in("mov.u64", rec, ptx.U64Imm(0)),
		// The record's index: the order in which CTAs began. Taken before the kernel lets the
		// grid after it launch, so each launch's CTAs take consecutive indices of its kernel.
		if1(on, "atom.global.add.u64", idx, ptx.Addr{Base: buf}, ptx.Imm(1)),
		if1(on, "setp.lt.u64", on, idx, ptx.Imm(capacity)),
		in("mov.u32", cta, ptx.CtaidZ), in("mov.u32", n, ptx.NCtaidY), in("mov.u32", t, ptx.CtaidY),
		in("mad.lo.u32", cta, cta, n, t),
		in("mov.u32", n, ptx.NCtaidX), in("mov.u32", t, ptx.CtaidX),
		in("mad.lo.u32", cta, cta, n, t),
		in("mov.u32", kid, ptx.Imm(int64(id))),
		if1(on, "mul.lo.u64", rec, idx, ptx.Imm(traceRecordBytes)),
		if1(on, "add.u64", rec, rec, buf),
		if1(on, "add.u64", rec, rec, ptx.Imm(traceHeaderBytes)),
		if1(on, "st.global.v2.u32", ptx.Addr{Base: rec}, ptx.Vec{kid, cta}),
		if1(on, "st.global.u64", ptx.Addr{Base: rec, Offset: 8}, now),
		if1(on, "st.global.u64", ptx.Addr{Base: rec, Offset: 24}, ptx.U64Imm(0)),
		in("mov.u64", zero, ptx.U64Imm(0)),
		if1(on, "st.global.v2.u64", ptx.Addr{Base: rec, Offset: 48}, ptx.Vec{zero, zero}),
		if1(on, "st.global.v2.u64", ptx.Addr{Base: rec, Offset: 64}, ptx.Vec{zero, zero}),
		in("mov.u32", sm, ptx.SMID),
		if1(on, "st.global.u32", ptx.Addr{Base: rec, Offset: 32}, sm),
		// Every warp finds the record (0: none) there, its end zeroed above, once all have
		// passed the barrier.
		if1(first, "st.shared.u64", ptx.Addr{Base: recAt}, rec),
		in("bar.sync", ptx.Imm(0)),
	}
	for _, i := range k.Body {
		switch {
		case i.Label == "" && (i.Op == "ret" || i.Op == "exit"):
			p, q := on, lead // thread 0's stamp, lane 0's raise
			if i.Guard != nil {
				g := *i.Guard
				if i.GuardNeg {
					g = pred()
					body = append(body, in("not.pred", g, *i.Guard))
				}
				p, q = pred(), pred()
				body = append(body, in("and.pred", p, g, on), in("and.pred", q, g, lead))
			}
			body = append(append(append(body, stamp(p, 40)...), raiseEnd(q)...), i)
		case i.Label == "" && i.Op == bundle.PriorGridWait:
			body = append(append(body, i), stamp(on, 16)...)
		default:
			body = append(body, i)
		}
	}
	k.Body = body
}

// tracedPTX is src with its entry instrumented as kernel id when the backend traces, else
// src itself.
func (be *Backend) tracedPTX(src, entry string, id uint32) (string, error) {
	if be.trace == nil {
		return src, nil
	}
	m, err := ptx.Parse(src)
	if err != nil {
		return "", fmt.Errorf("trace: %w", err)
	}
	k := m.Kernel(entry)
	if k == nil {
		return "", fmt.Errorf("trace: no entry %s in its PTX", entry)
	}
	instrumentForTrace(k, id, uint64(be.trace.addr), traceCapacity)
	return m.Print()
}

// TraceSpan is one launch of a traced step: when its first CTA began, when the first and the last
// CTA's wait for the grid ahead returned, and when its last CTA ended (its last warp), in µs from
// the step's first CTA; Thread0Ended is when the last CTA's thread 0 ended, short of Ended where
// other warps outlive thread 0 (a producer warp), and WarpLags[w] how long warp w of a CTA outlived
// its thread 0, on average over the CTAs (µs; warps past traceWarpSlots-1 share its slot). CTAs is
// the launch's grid, Records the CTAs that left a record; a cuBLASLt launch has none and no times.
// SMs is how many SMs its working CTAs ran on, and MostOnOneSM the most of them that ran on one
// over the launch (not necessarily at once): an uneven spread, such as a grid launched early
// crowding onto the SMs the kernel ahead leaves free, shows there. Working CTAs are those that
// waited for the grid ahead, where any did: a CTA that ends before its wait has nothing to do (the
// decode attention's blocks past a row's last split), and counted it would hide the spread of those
// that work. LateCTAs is how many of its CTAs began only after the launch ahead's last CTA ended
// (not counted behind a launch without records): a grid launched early whose CTAs did not all find
// room on the SMs beside the kernel ahead shows there. Regs is a thread's registers in the
// instrumented kernel as the driver compiled it (0: cuBLASLt's, or the cast's).
type TraceSpan struct {
	Label        string    `json:"label"`
	Kernel       string    `json:"kernel"`
	CTAs         int       `json:"ctas"`
	Records      int       `json:"records"`
	Began        float64   `json:"began_us"`
	FirstWaited  float64   `json:"first_waited_us,omitempty"`
	Waited       float64   `json:"waited_us,omitempty"`
	Ended        float64   `json:"ended_us"`
	Thread0Ended float64   `json:"thread0_ended_us,omitempty"`
	WarpLags     []float64 `json:"warp_lags_us,omitempty"`
	SMs          int       `json:"sms,omitempty"`
	MostOnOneSM  int       `json:"most_on_one_sm,omitempty"`
	LateCTAs     int       `json:"late_ctas,omitempty"`
	Regs         int       `json:"regs,omitempty"`
}

// traceRecord is one CTA's record as the instrumented kernels write it.
type traceRecord struct {
	kernel, cta          uint32
	began, waited, ended uint64 // ended: the CTA's last warp's
	sm                   uint32
	ended0               uint64                 // thread 0's end
	warps                [traceWarpSlots]uint32 // each warp's end, ns after began (0: none)
}

// Trace replays template t's graph (after warm replays) with the trace's counter reset and
// returns its launches in step order. It needs a backend made with Options.Trace.
func (be *Backend) Trace(t int) ([]TraceSpan, error) {
	if be.trace == nil {
		return nil, fmt.Errorf("trace: the backend was loaded without Options.Trace")
	}
	if t < 0 || t >= len(be.steps) {
		return nil, fmt.Errorf("no template %d", t)
	}
	var recs []traceRecord
	err := be.do(func() error {
		exec := be.steps[t].execs[be.variant(t)]
		if _, err := be.timeGraph(exec, timeWithoutWarmup); err != nil {
			return err
		}
		if err := be.d.call("cuMemsetD8_v2", be.trace.addr, 0, traceHeaderBytes); err != nil {
			return err
		}
		if err := be.d.call("cuGraphLaunch", exec, be.stream); err != nil {
			return err
		}
		if err := be.d.call("cuStreamSynchronize", be.stream); err != nil {
			return err
		}
		var count uint64
		if err := be.d.call("cuMemcpyDtoH_v2", uintptr(unsafe.Pointer(&count)), be.trace.addr, 8); err != nil {
			return err
		}
		n := min(int(count), traceCapacity)
		if n == 0 {
			return nil
		}
		raw := make([]byte, n*traceRecordBytes)
		if err := be.d.call("cuMemcpyDtoH_v2", uintptr(unsafe.Pointer(&raw[0])), be.trace.addr+traceHeaderBytes, uintptr(len(raw))); err != nil {
			return err
		}
		recs = decodeTraceRecords(raw)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("trace of template %d: %w", t, err)
	}
	var chain []launch
	for _, l := range be.steps[t].nodes[be.variant(t)] {
		for p := &l; p != nil; p = p.then {
			c := *p
			if p.matmul != nil || p.then != nil {
				c.kernel = castEntry // a GEMM's cast, which names the GEMM's kernel elsewhere
			}
			if p.f != 0 { // f 0: a matmul with no cast ahead (fed)
				chain = append(chain, c)
			}
			if p.matmul != nil {
				chain = append(chain, launch{label: p.label, kernel: "cublasLt"})
			}
		}
	}
	spans := traceSpans(chain, be.trace.ids, recs)
	for i := range spans {
		spans[i].Regs = be.regs[spans[i].Kernel]
	}
	return spans, nil
}

func decodeTraceRecords(raw []byte) []traceRecord {
	recs := make([]traceRecord, len(raw)/traceRecordBytes)
	for i := range recs {
		r := raw[i*traceRecordBytes:]
		recs[i] = traceRecord{kernel: binary.LittleEndian.Uint32(r), cta: binary.LittleEndian.Uint32(r[4:]),
			began: binary.LittleEndian.Uint64(r[8:]), waited: binary.LittleEndian.Uint64(r[16:]), ended: binary.LittleEndian.Uint64(r[24:]),
			sm: binary.LittleEndian.Uint32(r[32:]), ended0: binary.LittleEndian.Uint64(r[40:])}
		for w := range recs[i].warps {
			recs[i].warps[w] = binary.LittleEndian.Uint32(r[48+4*w:])
		}
	}
	return recs
}

// traceSpans gives each launch of chain (step order) the next records of its kernel, as many
// as its grid has CTAs: one kernel's launches in a step follow each other, and each takes its
// records before the grid after it may launch.
func traceSpans(chain []launch, ids map[uintptr]uint32, recs []traceRecord) []TraceSpan {
	byKernel := map[uint32][]traceRecord{}
	var t0 uint64
	for _, r := range recs {
		byKernel[r.kernel] = append(byKernel[r.kernel], r)
		if r.began != 0 && (t0 == 0 || r.began < t0) {
			t0 = r.began
		}
	}
	us := func(ns uint64) float64 {
		if ns == 0 {
			return 0
		}
		return float64(int64(ns-t0)) / 1e3
	}
	spans := make([]TraceSpan, 0, len(chain))
	var aheadEnded uint64 // the launch ahead's last end, 0 where it left no records
	for _, l := range chain {
		s := TraceSpan{Label: l.label, Kernel: l.kernel, CTAs: l.grid[0] * l.grid[1] * l.grid[2]}
		id, ok := ids[l.f]
		if l.f == 0 || !ok {
			spans = append(spans, s)
			aheadEnded = 0
			continue
		}
		q := byKernel[id]
		mine := q[:min(s.CTAs, len(q))]
		byKernel[id] = q[len(mine):]
		s.Records = len(mine)
		var began, first, waited, ended, ended0 uint64
		for _, r := range mine {
			if began == 0 || r.began < began {
				began = r.began
			}
			if r.waited != 0 && (first == 0 || r.waited < first) {
				first = r.waited
			}
			waited, ended, ended0 = max(waited, r.waited), max(ended, r.ended), max(ended0, r.ended0)
			if aheadEnded != 0 && r.began > aheadEnded {
				s.LateCTAs++
			}
		}
		aheadEnded = ended
		s.WarpLags = warpLags(mine)
		perSM := map[uint32]int{}
		for _, r := range mine {
			if r.waited != 0 || first == 0 {
				perSM[r.sm]++
				s.MostOnOneSM = max(s.MostOnOneSM, perSM[r.sm])
			}
		}
		s.Began, s.FirstWaited, s.Waited, s.Ended, s.Thread0Ended, s.SMs = us(began), us(first), us(waited), us(ended), us(ended0), len(perSM)
		spans = append(spans, s)
	}
	return spans
}

// warpLags is, for each warp slot any record of recs raised, how long that warp outlived its
// CTA's thread 0 on average over the CTAs it ran in, in µs.
func warpLags(recs []traceRecord) []float64 {
	var lags []float64
	for w := range traceWarpSlots {
		sum, n := 0.0, 0
		for _, r := range recs {
			if r.warps[w] != 0 && r.ended0 != 0 {
				sum += float64(int64(r.began+uint64(r.warps[w])-r.ended0)) / 1e3
				n++
			}
		}
		if n == 0 {
			break
		}
		lags = append(lags, sum/float64(n))
	}
	return lags
}
