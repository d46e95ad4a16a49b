package cuda

import (
	"bytes"
	"encoding/binary"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"xmix/bundle"
	"xmix/compile"
	"xmix/ptx"
	"xmix/ptx/emu"
)

// stampedPTX is kernel entry of src instrumented as kernel id, printed and parsed again.
func stampedPTX(t *testing.T, src, entry string, id uint32, base uint64, capacity int) *ptx.Module {
	t.Helper()
	m, err := ptx.Parse(src)
	if err != nil {
		t.Fatal(err)
	}
	instrumentForTrace(m.Kernel(entry), id, base, capacity)
	text, err := m.Print()
	if err != nil {
		t.Fatalf("%s: %v", entry, err)
	}
	out, err := ptx.Parse(text)
	if err != nil {
		t.Fatalf("%s: the instrumented PTX does not parse: %v", entry, err)
	}
	if err := ptx.Validate(out); err != nil {
		t.Fatalf("%s: the instrumented PTX: %v", entry, err)
	}
	return out
}

// Every kernel of the shipped specs' bundles (the 8B's copy-engine, warpgroup and attention
// kernels, the tiny model's app kernels) and the cast take the stamps and stay valid PTX,
// with their own instructions unchanged and in order, one record taken, one barrier added,
// a stamp after each wait, and before each ret and exit thread 0's stamp and its warp's
// raises of the CTA's end and of its own slot.
func TestInstrumentForTraceKeepsEveryKernel(t *testing.T) {
	tinyApps, err := filepath.Glob("../../specs/apps/tiny/tiny-app*.yaml")
	if err != nil || len(tinyApps) == 0 {
		t.Fatalf("tiny apps: %v (%d)", err, len(tinyApps))
	}
	var kernels []bundle.Kernel
	for _, c := range []struct {
		model string
		apps  []string
	}{{"../../specs/models/llama-3.1-8b.yaml", nil}, {"../../specs/models/tiny.yaml", tinyApps}} {
		b, err := compile.Build(c.model, c.apps, compile.Options{})
		if err != nil {
			t.Fatal(err)
		}
		kernels = append(kernels, b.Kernels...)
	}
	kernels = append(kernels, bundle.Kernel{Name: castEntry, PTX: castPTX})
	for i, k := range kernels {
		orig, err := ptx.Parse(k.PTX)
		if err != nil {
			t.Fatal(err)
		}
		got := stampedPTX(t, k.PTX, k.Name, uint32(i), 0x7f0000000000, traceCapacity).Kernel(k.Name)
		var own []string
		atoms, stamps, raises, warpRaises, barriers := 0, 0, 0, 0, 0
		for _, in := range got.Body {
			switch {
			case in.Op == "atom.global.add.u64":
				atoms++
			case in.Op == "mov.u64" && len(in.Args) == 2 && in.Args[1] == ptx.GlobalTimer:
				stamps++
			case in.Op == "red.global.max.u64":
				raises++
			case in.Op == "red.global.max.u32":
				warpRaises++
			case in.Op == "bar.sync":
				barriers++
			}
		}
		want, ends, ownBarriers := 1, 0, 0 // the record's first stamp
		for _, in := range orig.Kernel(k.Name).Body {
			own = append(own, instrText(in))
			switch in.Op {
			case bundle.PriorGridWait:
				want++
			case "ret", "exit":
				want += 2 // thread 0's end, and its warp's raise of the CTA's
				ends++
			case "bar.sync":
				ownBarriers++
			}
		}
		if atoms != 1 || stamps != want || raises != ends || warpRaises != ends || barriers != ownBarriers+1 {
			t.Errorf("%s: %d counter atomics, %d stamps, %d and %d raised ends (CTA's, warp's) and %d barriers, want 1, %d, %d, %d and %d",
				k.Name, atoms, stamps, raises, warpRaises, barriers, want, ends, ends, ownBarriers+1)
		}
		// The kernel's own instructions are a subsequence of the instrumented body, in order.
		j := 0
		for _, in := range got.Body {
			if j < len(own) && instrText(in) == own[j] {
				j++
			}
		}
		if j != len(own) {
			t.Errorf("%s: instruction %d of %d (%s) is missing or out of order", k.Name, j, len(own), own[j])
		}
	}
}

func instrText(in ptx.Instr) string {
	m := ptx.NewModule()
	k := ptx.NewKernel("x")
	k.Body = []ptx.Instr{in}
	if in.Label != "" {
		return in.Label + ":"
	}
	m.Kernels = []*ptx.Kernel{k}
	text, err := m.Print()
	if err != nil {
		return "?" + in.Op
	}
	lines := strings.Split(strings.TrimSpace(text), "\n")
	return lines[len(lines)-2]
}

// exitsKernel stores 3*tid to out[ctaid][tid] for threads below 40, which exit first; CTA 1
// also stores to out2 before a ret taken under a negated guard: every form of a kernel's
// end the instrumentation stamps.
func exitsKernel() *ptx.Module {
	k := ptx.NewKernel("exits")
	out, out2 := k.Param("out", ptx.U64), k.Param("out2", ptx.U64)
	k.Emit(bundle.PriorGridLaunch)
	k.Emit(bundle.PriorGridWait)
	tid, cta, v := k.Reg(ptx.U32), k.Reg(ptx.U32), k.Reg(ptx.U32)
	p, q := k.Reg(ptx.Pred), k.Reg(ptx.Pred)
	a, o := k.Reg(ptx.U64), k.Reg(ptx.U64)
	k.Emit("mov.u32", tid, ptx.TidX)
	k.Emit("mov.u32", cta, ptx.CtaidX)
	k.Emit("setp.ge.u32", p, tid, ptx.Imm(40))
	k.EmitIf(p, false, "exit")
	k.Emit("mul.lo.u32", v, tid, ptx.Imm(3))
	k.Emit("mad.lo.u32", tid, cta, ptx.Imm(64), tid)
	k.Emit("mul.wide.u32", o, tid, ptx.Imm(4))
	k.Emit("ld.param.u64", a, ptx.Addr{Base: out})
	k.Emit("add.u64", a, a, o)
	k.Emit("st.global.u32", ptx.Addr{Base: a}, v)
	k.Emit("setp.eq.u32", q, cta, ptx.Imm(1))
	k.EmitIf(q, true, "ret")
	k.Emit("ld.param.u64", a, ptx.Addr{Base: out2})
	k.Emit("add.u64", a, a, o)
	k.Emit("st.global.u32", ptx.Addr{Base: a}, v)
	k.Emit("ret")
	return ptx.NewModule(k)
}

// On the emulator an instrumented kernel computes what it computes without the stamps, bit for
// bit, and leaves one record per CTA (the capacity permitting): its id, each CTA once,
// began <= waited <= thread 0's end <= the CTA's end, each warp's end in its slot, on SM 0
// (the emulator's one). CTAs past the capacity write no record but count.
func TestTraceRecordsOnEmulator(t *testing.T) {
	src, err := exitsKernel().Print()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, src, entry string
		grid, block      int
		params           func(mem *emu.Memory) ([]uint64, []uint64) // params, output addresses
		outBytes         int
	}{
		{"cast", castPTX, castEntry, 3, 256, func(mem *emu.Memory) ([]uint64, []uint64) {
			x, y := mem.Alloc(4*2048), mem.Alloc(2*2048)
			for i := range 2048 {
				binary.LittleEndian.PutUint32(mem.Bytes(x)[4*i:], uint32(0x3f800000+i*4099))
			}
			return []uint64{x, y, 1024, 200}, []uint64{y} // 200 quads, then pairs 800-1023
		}, 2 * 2048},
		{"exits", src, "exits", 4, 64, func(mem *emu.Memory) ([]uint64, []uint64) {
			o, o2 := mem.Alloc(4*64*4), mem.Alloc(4*64*4)
			return []uint64{o, o2}, []uint64{o, o2}
		}, 4 * 64 * 4},
	} {
		for _, capacity := range []int{c.grid, c.grid - 1} {
			run := func(m *ptx.Module) (*emu.Memory, []uint64) {
				mem := emu.NewMemory()
				params, outs := c.params(mem)
				l := emu.Launch{Grid: [3]int{c.grid, 1, 1}, Block: [3]int{c.block, 1, 1}}
				if err := emu.Run(m, c.entry, l, mem, params); err != nil {
					t.Fatalf("%s: %v", c.name, err)
				}
				return mem, outs
			}
			plain, err := ptx.Parse(c.src)
			if err != nil {
				t.Fatal(err)
			}
			wantMem, wantOuts := run(plain)
			// The trace buffer is allocated last in the instrumented run's memory, so the
			// kernel's own buffers sit where they do without it.
			mem := emu.NewMemory()
			params, outs := c.params(mem)
			base := mem.Alloc(traceHeaderBytes + capacity*traceRecordBytes)
			// Records start as all ones, so that a field the prologue does not store shows.
			for i := range capacity * traceRecordBytes {
				mem.Bytes(base)[traceHeaderBytes+i] = 0xff
			}
			m := stampedPTX(t, c.src, c.entry, 7, base, capacity)
			if err := emu.Run(m, c.entry, emu.Launch{Grid: [3]int{c.grid, 1, 1}, Block: [3]int{c.block, 1, 1}}, mem, params); err != nil {
				t.Fatalf("%s: %v", c.name, err)
			}
			for i := range outs {
				if !bytes.Equal(mem.Bytes(outs[i])[:c.outBytes], wantMem.Bytes(wantOuts[i])[:c.outBytes]) {
					t.Fatalf("%s: output %d differs from the uninstrumented kernel's", c.name, i)
				}
			}
			raw := mem.Bytes(base)
			if n := binary.LittleEndian.Uint64(raw); n != uint64(c.grid) {
				t.Fatalf("%s: counter %d, want %d CTAs", c.name, n, c.grid)
			}
			recs := decodeTraceRecords(raw[traceHeaderBytes : traceHeaderBytes+capacity*traceRecordBytes])
			var ctas []uint32
			for _, r := range recs {
				if r.kernel != 7 || r.began == 0 || r.waited < r.began || r.ended0 < r.waited || r.ended < r.ended0 || r.sm != 0 { // the emulator is SM 0
					t.Fatalf("%s: record %+v", c.name, r)
				}
				// The emulator runs a block's warps in turn after the prologue's barrier, so
				// each warp ends after the one before it (its clock counts thread resumes):
				// warp 0 with thread 0, the last warp with the CTA.
				warps := (c.block + 31) / 32
				last := r.warps[warps-1]
				if r.warps[0] != uint32(r.ended0-r.began) || uint64(last) != r.ended-r.began || warps > 1 && last <= r.warps[0] || slices.Max(r.warps[:]) != last {
					t.Fatalf("%s: record %+v: warp ends %v, want warp 0's at thread 0's end and the last warp's, the latest, at the CTA's", c.name, r, r.warps)
				}
				ctas = append(ctas, r.cta)
			}
			slices.Sort(ctas)
			if len(slices.Compact(ctas)) != capacity {
				t.Fatalf("%s, capacity %d: CTAs %v, want %d distinct", c.name, capacity, ctas, capacity)
			}
		}
	}
}

// traceSpans hands each launch the next records of its kernel, as many as its CTAs, takes the
// earliest start and wait and the latest wait and ends (thread 0's and the last warp's), each
// warp's lag behind thread 0 on average over the CTAs, counts µs from the step's first CTA
// and the SMs its working CTAs ran on (those that waited, where any did), counts the CTAs
// that began after the launch ahead ended (none behind cuBLASLt's), and leaves cuBLASLt's
// launches without times.
func TestTraceSpans(t *testing.T) {
	ids := map[uintptr]uint32{10: 0, 20: 1}
	chain := []launch{
		{label: "a", kernel: "k0", f: 10, grid: [3]int{2, 1, 1}},
		{label: "b", kernel: "k1", f: 20, grid: [3]int{1, 1, 1}},
		{label: "b", kernel: "cublasLt"},
		{label: "c", kernel: "k0", f: 10, grid: [3]int{1, 3, 1}},
		{label: "d", kernel: "k1", f: 20, grid: [3]int{2, 1, 1}},
	}
	recs := []traceRecord{
		{0, 0, 1000, 1500, 4000, 3, 3900, [traceWarpSlots]uint32{2900, 3000}}, {0, 1, 1200, 1600, 4200, 3, 4200, [traceWarpSlots]uint32{3000, 3000}},
		{1, 0, 3000, 4300, 6000, 7, 6000, [traceWarpSlots]uint32{}},
		{0, 1, 6100, 6500, 9000, 5, 8000, [traceWarpSlots]uint32{}}, {0, 0, 6200, 6400, 8000, 0, 8000, [traceWarpSlots]uint32{}},
		{0, 2, 6300, 0, 6350, 5, 6350, [traceWarpSlots]uint32{}}, {1, 0, 8900, 0, 9500, 2, 9500, [traceWarpSlots]uint32{}},
		{1, 1, 9200, 0, 9600, 2, 9400, [traceWarpSlots]uint32{}},
	}
	got := traceSpans(chain, ids, recs)
	want := []TraceSpan{
		{Label: "a", Kernel: "k0", CTAs: 2, Records: 2, Began: 0, FirstWaited: 0.5, Waited: 0.6, Ended: 3.2, Thread0Ended: 3.2, WarpLags: []float64{0, 0.05}, SMs: 1, MostOnOneSM: 2},
		{Label: "b", Kernel: "k1", CTAs: 1, Records: 1, Began: 2, FirstWaited: 3.3, Waited: 3.3, Ended: 5, Thread0Ended: 5, SMs: 1, MostOnOneSM: 1},
		{Label: "b", Kernel: "cublasLt"},
		{Label: "c", Kernel: "k0", CTAs: 3, Records: 3, Began: 5.1, FirstWaited: 5.4, Waited: 5.5, Ended: 8, Thread0Ended: 7, SMs: 2, MostOnOneSM: 1},
		{Label: "d", Kernel: "k1", CTAs: 2, Records: 2, Began: 7.9, Ended: 8.6, Thread0Ended: 8.5, SMs: 1, MostOnOneSM: 2, LateCTAs: 1},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("spans\n%+v\nwant\n%+v", got, want)
	}
}
