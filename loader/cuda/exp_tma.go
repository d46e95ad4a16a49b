package cuda

// EXPERIMENT, kept only in history: the commit after this one removes it (testsuite/gpu/RESULTS.md,
// "Session 29" and "Session 30"). A tensor-core GEMM for buckets of at most 8 rows whose W
// arrives through shared memory by cp.async.bulk (TMA, mbarrier completion), so a block keeps
// S stages of W in flight with no registers, issued before griddepcontrol.wait. Session 30 added
// the tensor-map form's fence (a map in global memory) and the cvta.param form (a map as a
// kernel parameter), XMIX_EXP_TMA_BC (columns a block), XMIX_EXP_TMA_KS (K split over the CTAs
// of a cluster, summed in rank 0's shared memory in rank order), _NOPRE, _EARLYDEP, a bounded
// mbarrier wait that traps, and XMIX_EXP_CARVEOUT (every kernel's shared-memory carveout).

import (
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"unsafe"

	"xmix/bundle"
)

type tmaShape struct {
	n, k, bc, s, kc int
	noX, noMMA      bool
	twoD            bool // W by a 2D tensor map: boxes of 256 k x bc rows, dense
	pmap            bool // the map as a 128-byte kernel parameter, not in global memory
	noPre, earlyDep bool // W asked for after the wait; the next grid let launch at the start
	ks              int  // K split over the CTAs of a cluster, partials summed in rank 0's shared memory
}

func (s tmaShape) warps() int { return s.bc / 16 * 4 }
func (s tmaShape) strideW() int {
	if s.twoD {
		return 2 * s.kc
	}
	return 2*s.kc + 64
}
func (s tmaShape) strideX() int   { return 4*s.kc + 16 }
func (s tmaShape) slotBytes() int { return (s.bc*s.strideW() + 8*s.strideX() + 127) &^ 127 }
func (s tmaShape) smem() int      { return 128 + s.s*s.slotBytes() + (s.ks-1)*s.bc/16*512 }
func (s tmaShape) kPart() int     { return s.k / s.ks }
func (s tmaShape) name() string {
	return fmt.Sprintf("xmix_exp_tma_n%d_k%d_c%d_s%d_kc%d_x%v_m%v_2d%v_p%v_ks%d_np%v_ed%v", s.n, s.k, s.bc, s.s, s.kc, !s.noX, !s.noMMA, s.twoD, s.pmap, s.ks, s.noPre, s.earlyDep)
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

func tmaPick(n, k int) (tmaShape, bool) {
	s := tmaShape{n: n, k: k, bc: 32, kc: envInt("XMIX_EXP_TMA_KC", 256), noX: os.Getenv("XMIX_EXP_TMA_NOX") != "", noMMA: os.Getenv("XMIX_EXP_TMA_NOMMA") != "", twoD: os.Getenv("XMIX_EXP_TMA_2D") != "", pmap: os.Getenv("XMIX_EXP_TMA_PMAP") != ""}
	if k%s.kc != 0 || n%32 != 0 {
		return tmaShape{}, false
	}
	if n/32 < envInt("XMIX_EXP_TMA_BC16_BELOW", 2*132) {
		s.bc = 16
	}
	if bc := envInt("XMIX_EXP_TMA_BC", 0); bc > 0 && n%bc == 0 {
		s.bc = bc
	}
	s.ks = 1
	s.noPre, s.earlyDep = os.Getenv("XMIX_EXP_TMA_NOPRE") != "", os.Getenv("XMIX_EXP_TMA_EARLYDEP") != ""
	if ks := envInt("XMIX_EXP_TMA_KS", 1); ks > 1 && n/s.bc < envInt("XMIX_EXP_TMA_KS_BELOW", 2*132) && k%(ks*s.kc) == 0 {
		s.ks = ks
	}
	budget := envInt("XMIX_EXP_TMA_SMEM", 100*1024)
	if s.bc == 32 {
		budget = envInt("XMIX_EXP_TMA_SMEM32", budget)
	}
	s.s = max(2, min(16, (budget-128)/s.slotBytes()))
	if s.s > s.kPart()/s.kc {
		s.s = s.kPart() / s.kc
	}
	return s, true
}

func tmaPTX(s tmaShape) string {
	var b strings.Builder
	p := func(f string, a ...any) { fmt.Fprintf(&b, f+"\n", a...) }
	nst := s.kPart() / s.kc
	p(".version 8.3\n.target sm_90\n.address_size 64\n")
	p(".extern .shared .align 128 .b8 smem[];")
	mapParam, mapOp := ".param .u64 pmap", "%rd8"
	if s.pmap {
		mapParam = ".param .align 64 .b8 pmap[128]"
	}
	cluster := ""
	if s.ks > 1 {
		cluster = fmt.Sprintf(" .reqnctapercluster %d, 1, 1", s.ks)
	}
	p(".visible .entry %s(.param .u64 px, .param .u64 pw, .param .u64 py, .param .u32 prows, %s)%s", s.name(), mapParam, cluster)
	p("{")
	p(".reg .pred %%p<10>;\n.reg .b32 %%r<80>;\n.reg .b64 %%rd<32>;\n.reg .f32 %%f<64>;")
	p("ld.param.u64 %%rd1, [px];\nld.param.u64 %%rd2, [pw];\nld.param.u64 %%rd3, [py];\nld.param.u32 %%r1, [prows];")
	if !s.pmap {
		p("ld.param.u64 %%rd8, [pmap];")
		if s.twoD { // a map copied from the host into global memory: acquire it for the tensor proxy
			p("fence.proxy.tensormap::generic.acquire.gpu [%%rd8], 128;")
		}
	} else {
		p("mov.u64 %%rd8, pmap;\ncvta.param.u64 %%rd8, %%rd8;")
	}
	p("mov.u32 %%r2, %%tid.x;\nshr.u32 %%r3, %%r2, 5;\nand.b32 %%r4, %%r2, 31;")                    // r3 warp, r4 lane
	p("shr.u32 %%r5, %%r4, 2;\nand.b32 %%r6, %%r4, 3;")                                             // r5 g, r6 t
	p("shr.u32 %%r7, %%r3, 2;\nand.b32 %%r8, %%r3, 3;")                                             // r7 cg, r8 q
	p("mov.u32 %%r9, %%ctaid.x;\ndiv.u32 %%r9, %%r9, %d;\nmul.lo.u32 %%r10, %%r9, %d;", s.ks, s.bc) // r10 col0
	p("mov.u32 %%r61, %%cluster_ctarank;\nmul.lo.u32 %%r62, %%r61, %d;", s.kPart())                 // r61 rank, r62 its first k
	p("mov.u32 %%r11, smem;")                                                                       // bars; slots at +128
	p("add.u32 %%r19, %%r11, 128;")                                                                 // r19 slot 0
	p("setp.eq.u32 %%p1, %%r2, 0;\n@!%%p1 bra INITDONE;")
	for i := 0; i < s.s; i++ {
		p("mbarrier.init.shared::cta.b64 [%%r11+%d], 1;", 8*i)
	}
	p("fence.mbarrier_init.release.cluster;\nINITDONE:\nbar.sync 0;")
	p("setp.eq.u32 %%p2, %%r3, 0;")        // warp 0 produces
	p("setp.lt.u32 %%p3, %%r4, %d;", s.bc) // lane copies a W row
	p("and.pred %%p3, %%p3, %%p2;")
	p("setp.lt.u32 %%p8, %%r4, %%r1;") // lane copies an x row (lane < rows)
	p("and.pred %%p8, %%p8, %%p2;")
	p("setp.eq.u32 %%p4, %%r2, 0;")                                                                       // thread 0 arrives
	p("add.u32 %%r12, %%r10, %%r4;\nmul.wide.u32 %%rd4, %%r12, %d;\nadd.u64 %%rd4, %%rd2, %%rd4;", 2*s.k) // W row src
	p("mul.wide.u32 %%rd9, %%r62, 2;\nadd.u64 %%rd4, %%rd4, %%rd9;")
	p("mul.wide.u32 %%rd7, %%r4, %d;\nadd.u64 %%rd7, %%rd1, %%rd7;", 4*s.k) // x row src
	p("mul.wide.u32 %%rd9, %%r62, 4;\nadd.u64 %%rd7, %%rd7, %%rd9;")
	p("mad.lo.u32 %%r13, %%r4, %d, %%r19;", s.strideW())                                              // W row dst, slot 0
	p("mad.lo.u32 %%r18, %%r4, %d, %%r19;\nadd.u32 %%r18, %%r18, %d;", s.strideX(), s.bc*s.strideW()) // x row dst, slot 0
	p("mul.lo.u32 %%r17, %%r1, %d;\nadd.u32 %%r17, %%r17, %d;", 4*s.kc, 2*s.kc*s.bc)                  // tx bytes
	arrive := func(slot string) {
		p("shl.b32 %%r40, %s, 3;\nadd.u32 %%r40, %%r40, %%r11;", slot)
		p("@%%p4 mbarrier.arrive.expect_tx.shared::cta.b64 %%rd30, [%%r40], %%r17;")
		p("bar.warp.sync -1;")
	}
	copyW := func(stage, slot string) {
		p("shl.b32 %%r40, %s, 3;\nadd.u32 %%r40, %%r40, %%r11;", slot)
		if s.twoD {
			p("mad.lo.u32 %%r41, %s, %d, %%r19;", slot, s.slotBytes())
			p("mad.lo.u32 %%r44, %s, %d, %%r62;", stage, s.kc)
			for bx := 0; bx < s.kc/256; bx++ {
				p("@%%p4 cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%%r41+%d], [%s, {%%r44, %%r10}], [%%r40];", bx*s.bc*512, mapOp)
				p("add.u32 %%r44, %%r44, 256;")
			}
			return
		}
		p("mad.lo.u32 %%r41, %s, %d, %%r13;", slot, s.slotBytes())
		p("mul.wide.u32 %%rd31, %s, %d;\nadd.u64 %%rd31, %%rd31, %%rd4;", stage, 2*s.kc)
		p("@%%p3 cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%%r41], [%%rd31], %d, [%%r40];", 2*s.kc)
	}
	copyX := func(stage, slot string) {
		if s.noX {
			return
		}
		p("shl.b32 %%r40, %s, 3;\nadd.u32 %%r40, %%r40, %%r11;", slot)
		p("mad.lo.u32 %%r41, %s, %d, %%r18;", slot, s.slotBytes())
		p("mul.wide.u32 %%rd31, %s, %d;\nadd.u64 %%rd31, %%rd31, %%rd7;", stage, 4*s.kc)
		p("@%%p8 cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%%r41], [%%rd31], %d, [%%r40];", 4*s.kc)
	}
	if s.earlyDep {
		p("griddepcontrol.launch_dependents;")
	}
	if s.noPre {
		p("griddepcontrol.wait;")
	}
	p("@!%%p2 bra NOPRE;")
	for i := 0; i < s.s; i++ {
		p("mov.u32 %%r42, %d;", i)
		arrive("%r42")
		copyW("%r42", "%r42")
	}
	p("NOPRE:")
	if !s.noPre {
		p("griddepcontrol.wait;")
	}
	p("@!%%p2 bra NOPREX;")
	for i := 0; i < s.s; i++ {
		p("mov.u32 %%r42, %d;", i)
		copyX("%r42", "%r42")
	}
	p("NOPREX:")
	// consumer lane offsets within a slot
	p("mad.lo.u32 %%r14, %%r7, 16, %%r5;")                                      // r0 = cg*16+g
	p("mul.lo.u32 %%r15, %%r8, %d;\nmad.lo.u32 %%r15, %%r6, 8, %%r15;", s.kc/4) // kq = q*KC/4 + 8t
	if s.twoD {                                                                 // box kq/256, row r0 at 512 bytes, (kq%256)*2
		p("shr.u32 %%r45, %%r15, 8;\nand.b32 %%r46, %%r15, 255;")
		p("mad.lo.u32 %%r16, %%r45, %d, %%r19;\nmad.lo.u32 %%r16, %%r14, 512, %%r16;\nmad.lo.u32 %%r16, %%r46, 2, %%r16;", s.bc*512)
	} else {
		p("mad.lo.u32 %%r16, %%r14, %d, %%r19;\nmad.lo.u32 %%r16, %%r15, 2, %%r16;", s.strideW())
	}
	p("mad.lo.u32 %%r26, %%r5, %d, %%r19;\nmad.lo.u32 %%r26, %%r15, 4, %%r26;\nadd.u32 %%r26, %%r26, %d;", s.strideX(), s.bc*s.strideW()) // x addr slot 0
	for i := 0; i < 4; i++ {
		p("mov.f32 %%f%d, 0f00000000;", i)
	}
	p("mov.u32 %%r20, 0;\nmov.u32 %%r21, 0;\nmov.u32 %%r22, 0;") // i, slot, phase
	p("LOOP:")
	p("shl.b32 %%r23, %%r21, 3;\nadd.u32 %%r23, %%r23, %%r11;")
	p("mov.u32 %%r60, 0;")
	p("WAIT:\nmbarrier.try_wait.parity.shared::cta.b64 %%p6, [%%r23], %%r22;\n@%%p6 bra WAITED;")
	p("add.u32 %%r60, %%r60, 1;\nsetp.lt.u32 %%p9, %%r60, 4000000;\n@%%p9 bra WAIT;\ntrap;\nWAITED:")
	p("mad.lo.u32 %%r24, %%r21, %d, %%r16;\nmad.lo.u32 %%r25, %%r21, %d, %%r26;", s.slotBytes(), s.slotBytes())
	for c := 0; c < s.kc/128; c++ {
		p("ld.shared.v4.b32 {%%r30,%%r31,%%r32,%%r33}, [%%r24+%d];", 64*c)
		r1 := 8 * s.strideW()
		if s.twoD {
			r1 = 8 * 512
		}
		p("ld.shared.v4.b32 {%%r34,%%r35,%%r36,%%r37}, [%%r24+%d];", 64*c+r1)
		p("ld.shared.v4.f32 {%%f8,%%f9,%%f10,%%f11}, [%%r25+%d];", 128*c)
		p("ld.shared.v4.f32 {%%f12,%%f13,%%f14,%%f15}, [%%r25+%d];", 128*c+16)
		p("cvt.rn.bf16x2.f32 %%r50, %%f9, %%f8;\ncvt.rn.bf16x2.f32 %%r51, %%f11, %%f10;")
		p("cvt.rn.bf16x2.f32 %%r52, %%f13, %%f12;\ncvt.rn.bf16x2.f32 %%r53, %%f15, %%f14;")
		if s.noMMA { // keep the loads live: fold them into the accumulators cheaply
			p("xor.b32 %%r30, %%r30, %%r34;\nxor.b32 %%r31, %%r31, %%r35;\nxor.b32 %%r30, %%r30, %%r31;\nxor.b32 %%r32, %%r32, %%r36;\nxor.b32 %%r33, %%r33, %%r37;\nxor.b32 %%r32, %%r32, %%r33;\nxor.b32 %%r30, %%r30, %%r32;\nxor.b32 %%r30, %%r30, %%r50;\nxor.b32 %%r30, %%r30, %%r52;")
			p("mov.b32 %%f4, %%r30;\nadd.f32 %%f0, %%f0, %%f4;")
			continue
		}
		p("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%%f0,%%f1,%%f2,%%f3}, {%%r30,%%r34,%%r31,%%r35}, {%%r50,%%r51}, {%%f0,%%f1,%%f2,%%f3};")
		p("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%%f0,%%f1,%%f2,%%f3}, {%%r32,%%r36,%%r33,%%r37}, {%%r52,%%r53}, {%%f0,%%f1,%%f2,%%f3};")
	}
	p("bar.sync 0;")
	p("add.u32 %%r43, %%r20, %d;\nsetp.lt.u32 %%p7, %%r43, %d;\nand.pred %%p7, %%p7, %%p2;\n@!%%p7 bra NOREFILL;", s.s, nst)
	arrive("%r21")
	copyW("%r43", "%r21")
	copyX("%r43", "%r21")
	p("NOREFILL:")
	p("add.u32 %%r21, %%r21, 1;\nsetp.eq.u32 %%p7, %%r21, %d;\n@%%p7 mov.u32 %%r21, 0;\n@%%p7 xor.b32 %%r22, %%r22, 1;", s.s)
	p("add.u32 %%r20, %%r20, 1;\nsetp.lt.u32 %%p7, %%r20, %d;\n@%%p7 bra LOOP;", nst)
	p("griddepcontrol.launch_dependents;")
	p("shl.b32 %%r27, %%r3, 5;\nadd.u32 %%r27, %%r27, %%r4;\nshl.b32 %%r27, %%r27, 4;\nadd.u32 %%r27, %%r27, %%r19;")
	p("st.shared.v4.f32 [%%r27], {%%f0,%%f1,%%f2,%%f3};\nbar.sync 0;")
	p("setp.ne.u32 %%p7, %%r8, 0;\n@%%p7 bra SKIPQ;")
	for q := 1; q < 4; q++ {
		p("ld.shared.v4.f32 {%%f4,%%f5,%%f6,%%f7}, [%%r27+%d];", q*512)
		p("add.f32 %%f0, %%f0, %%f4;\nadd.f32 %%f1, %%f1, %%f5;\nadd.f32 %%f2, %%f2, %%f6;\nadd.f32 %%f3, %%f3, %%f7;")
	}
	recv := 128 + s.s*s.slotBytes()
	if s.ks > 1 { // ranks 1.. send their sums to rank 0's receive area, one 512-byte row per (rank-1, column warp)
		p("setp.eq.u32 %%p9, %%r61, 0;\n@%%p9 bra SKIPQ;")
		p("add.u32 %%r63, %%r61, -1;\nmad.lo.u32 %%r63, %%r63, %d, %%r7;\nshl.b32 %%r63, %%r63, 9;", s.bc/16)
		p("mad.lo.u32 %%r63, %%r4, 16, %%r63;\nadd.u32 %%r63, %%r63, %%r11;\nadd.u32 %%r63, %%r63, %d;", recv)
		p("mapa.shared::cluster.u32 %%r64, %%r63, 0;")
		p("st.shared::cluster.v4.f32 [%%r64], {%%f0,%%f1,%%f2,%%f3};")
	}
	p("SKIPQ:")
	if s.ks > 1 {
		p("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;")
		p("setp.ne.u32 %%p9, %%r61, 0;\n@%%p9 bra DONE;")
	}
	p("@%%p7 bra DONE;")
	for r := 1; r < s.ks; r++ {
		p("mad.lo.u32 %%r63, %%r7, 512, %%r11;\nmad.lo.u32 %%r63, %%r4, 16, %%r63;")
		p("ld.shared.v4.f32 {%%f4,%%f5,%%f6,%%f7}, [%%r63+%d];", recv+(r-1)*s.bc/16*512)
		p("add.f32 %%f0, %%f0, %%f4;\nadd.f32 %%f1, %%f1, %%f5;\nadd.f32 %%f2, %%f2, %%f6;\nadd.f32 %%f3, %%f3, %%f7;")
	}
	p("add.u32 %%r28, %%r10, %%r14;") // c0
	p("shl.b32 %%r29, %%r6, 1;")      // tok0
	p("mad.lo.u32 %%r28, %%r29, %d, %%r28;", s.n)
	p("mul.wide.u32 %%rd6, %%r28, 4;\nadd.u64 %%rd6, %%rd6, %%rd3;")
	p("setp.lt.u32 %%p7, %%r29, %%r1;")
	p("@%%p7 st.global.f32 [%%rd6], %%f0;\n@%%p7 st.global.f32 [%%rd6+32], %%f2;")
	p("add.u32 %%r29, %%r29, 1;\nsetp.lt.u32 %%p7, %%r29, %%r1;")
	p("@%%p7 st.global.f32 [%%rd6+%d], %%f1;\n@%%p7 st.global.f32 [%%rd6+%d], %%f3;", 4*s.n, 4*s.n+32)
	p("DONE:\nret;\n}")
	return b.String()
}

// tmaNode serves GEMM node n (at most 8 rows) with the experimental kernel, or says no.
func (be *Backend) tmaNode(n bundle.Node, vals []uint64) (*launch, bool, error) {
	k, ok := be.kernels[n.Kernel]
	if !ok {
		return nil, false, nil
	}
	g, ok, err := bundle.GemmOf(n, k)
	if err != nil || !ok || g.Guard != 0 || g.M > 8 || g.M < 1 {
		return nil, false, nil
	}
	if only := os.Getenv("XMIX_EXP_TMA_N"); only != "" && !strings.Contains(","+only+",", fmt.Sprintf(",%d,", g.N)) {
		return nil, false, nil
	}
	s, ok := tmaPick(g.N, g.K)
	if !ok {
		return nil, false, nil
	}
	if be.tmaFuncs == nil {
		be.tmaFuncs = map[string]uintptr{}
	}
	f, ok := be.tmaFuncs[s.name()]
	if !ok {
		d := be.d
		src := append([]byte(tmaPTX(s)), 0)
		errLog := make([]byte, 16384)
		opts := []int32{5, 6}
		ov := []uintptr{uintptr(unsafe.Pointer(&errLog[0])), uintptr(len(errLog))}
		var mod uintptr
		err := d.call("cuModuleLoadDataEx", uintptr(unsafe.Pointer(&mod)), uintptr(unsafe.Pointer(&src[0])),
			2, uintptr(unsafe.Pointer(&opts[0])), uintptr(unsafe.Pointer(&ov[0])))
		runtime.KeepAlive(src)
		if err != nil {
			return nil, false, fmt.Errorf("exp tma %s: %w\n%s\n%s", s.name(), err, strings.TrimRight(string(errLog), "\x00"), tmaPTX(s))
		}
		be.modules = append(be.modules, mod)
		name := append([]byte(s.name()), 0)
		if err := d.call("cuModuleGetFunction", uintptr(unsafe.Pointer(&f)), mod, uintptr(unsafe.Pointer(&name[0]))); err != nil {
			return nil, false, err
		}
		if err := d.call("cuFuncSetAttribute", f, 8, uintptr(s.smem())); err != nil { // MAX_DYNAMIC_SHARED_SIZE_BYTES
			return nil, false, fmt.Errorf("exp tma smem %d: %w", s.smem(), err)
		}
		if err := expCarveout(d, f); err != nil {
			return nil, false, err
		}
		be.tmaFuncs[s.name()] = f
		fmt.Fprintf(os.Stderr, "exp tma: %s grid %d block %d smem %d\n", s.name(), s.n/s.bc*s.ks, 32*s.warps(), s.smem())
	}
	var tmap uint64
	var params uintptr
	if s.twoD {
		host, err := be.tmaMap(vals[g.W], g.N, g.K, s.bc)
		if err != nil {
			return nil, false, err
		}
		if s.pmap {
			v := []uint64{vals[g.X], vals[g.W], vals[g.Y], uint64(g.M)}
			m := make([]uint64, 24)
			mp := (*[128]byte)(unsafe.Pointer((uintptr(unsafe.Pointer(&m[0])) + 63) &^ 63))
			copy(mp[:], host[:])
			ptrs := []uintptr{uintptr(unsafe.Pointer(&v[0])), uintptr(unsafe.Pointer(&v[1])), uintptr(unsafe.Pointer(&v[2])), uintptr(unsafe.Pointer(&v[3])), uintptr(unsafe.Pointer(mp))}
			be.params = append(be.params, v, m)
			be.paramP = append(be.paramP, ptrs)
			params = uintptr(unsafe.Pointer(&ptrs[0]))
		} else {
			var dp uintptr
			if err := be.d.call("cuMemAlloc_v2", uintptr(unsafe.Pointer(&dp)), 128); err != nil {
				return nil, false, err
			}
			be.allocs = append(be.allocs, dp)
			if err := be.d.call("cuMemcpyHtoD_v2", dp, uintptr(unsafe.Pointer(&host[0])), 128); err != nil {
				return nil, false, err
			}
			tmap = uint64(dp)
		}
	}
	if params == 0 {
		params = be.keepParams([]uint64{vals[g.X], vals[g.W], vals[g.Y], uint64(g.M), tmap})
	}
	l := &launch{label: n.Label, kernel: s.name(), f: f, grid: [3]int{s.n / s.bc * s.ks, 1, 1}, block: [3]int{32 * s.warps(), 1, 1},
		shared: s.smem(), params: params, skipUnless: n.SkipUnless, early: true}
	return l, true, nil
}

// tmaMap encodes a 2D tensor map of W ([n][k] bf16) with boxes of 256 k x bc rows.
func (be *Backend) tmaMap(w uint64, n, k, bc int) ([128]byte, error) {
	var out [128]byte
	d := be.d
	dims := []uint64{uint64(k), uint64(n)}
	strides := []uint64{uint64(2 * k)}
	box := []uint32{256, uint32(bc)}
	es := []uint32{1, 1}
	mp := (*[128]byte)(unsafe.Pointer((uintptr(unsafe.Pointer(&be.tmaHost[0])) + 63) &^ 63))
	if err := d.call("cuTensorMapEncodeTiled", uintptr(unsafe.Pointer(mp)), 9, 2, uintptr(w),
		uintptr(unsafe.Pointer(&dims[0])), uintptr(unsafe.Pointer(&strides[0])), uintptr(unsafe.Pointer(&box[0])),
		uintptr(unsafe.Pointer(&es[0])), 0, 0, 3, 0); err != nil {
		return out, fmt.Errorf("tensor map: %w", err)
	}
	copy(out[:], mp[:])
	return out, nil
}

// expCarveout sets every kernel's preferred shared-memory carveout to XMIX_EXP_CARVEOUT (percent),
// so that SMs need not drain to change their L1/shared split between kernels launched early.
func expCarveout(d *driver, f uintptr) error {
	v, err := strconv.Atoi(os.Getenv("XMIX_EXP_CARVEOUT"))
	if err != nil {
		return nil
	}
	if err := d.call("cuFuncSetAttribute", f, 9, uintptr(v)); err != nil { // PREFERRED_SHARED_MEMORY_CARVEOUT
		return fmt.Errorf("carveout %d: %w", v, err)
	}
	return nil
}
