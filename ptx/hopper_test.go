package ptx

import (
	"strings"
	"testing"
)

// hopperSrc is the copy-engine GEMM's Hopper instructions as a previous experiment ran them
// on an H200.
const hopperSrc = `
.version 8.3
.target sm_90
.address_size 64
.visible .entry K(.param .u64 px, .param .u64 pw, .param .u64 py, .param .u32 prows, .param .u64 pmap) .reqnctapercluster 2, 1, 1
{
	.reg .pred %p<8>;
	.reg .b32 %r<70>;
	.reg .b64 %rd<40>;
	.reg .f32 %f<4>;
	.reg .b16 %rs<2>;
	.extern .shared .align 128 .b8 smem[];
	ld.param.u64 %rd8, [pmap];
	fence.proxy.tensormap::generic.acquire.gpu [%rd8], 128;
	mov.u32 %r61, %cluster_ctarank;
	mov.u32 %r62, %cluster_nctarank;
	mov.u32 %r11, smem;
	mbarrier.init.shared::cta.b64 [%r11+8], 1;
	fence.mbarrier_init.release.cluster;
	bar.sync 0;
	mbarrier.arrive.expect_tx.shared::cta.b64 %rd30, [%r40], %r17;
	mbarrier.arrive.shared::cta.b64 %rd30, [smem+16];
	bar.warp.sync -1;
	cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%r41+32768], [%rd8, {%r44, %r10}], [%r40];
	cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%r41], [%rd31], 1024, [%r40];
	mbarrier.try_wait.parity.shared::cta.b64 %p6, [%r23], %r22;
	fence.proxy.async.shared::cta;
	griddepcontrol.wait;
	mapa.shared::cluster.u32 %r64, %r63, 0;
	st.shared::cluster.v4.f32 [%r64], {%f0, %f1, %f2, %f3};
	ld.shared::cluster.f32 %f0, [%r64+4];
	ld.shared::cta.f32 %f1, [smem+4];
	barrier.cluster.arrive.release;
	barrier.cluster.wait.acquire;
	barrier.cluster.arrive;
	barrier.cluster.wait;
	mbarrier.arrive.shared::cluster.b64 _, [%r64];
	cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%r41], [%rd8, {%r44, %r10}], [%r40], %rs1;
	cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%r41], [%rd8, {%r44, %r10}], [%r40], 3;
}
`

func TestHopperRoundTrip(t *testing.T) {
	m, err := Parse(hopperSrc)
	if err != nil {
		t.Fatal(err)
	}
	if err := Validate(m); err != nil {
		t.Fatal(err)
	}
	k := m.Kernels[0]
	if k.ClusterX != 2 || len(k.Shared) != 1 || !k.Shared[0].Extern || k.Shared[0].Align != 128 {
		t.Fatalf("cluster %d shared %+v", k.ClusterX, k.Shared)
	}
	ta, ok := k.Body[11].Args[1].(TensorAddr)
	if !ok || ta.Map != (Reg{T: B64, N: 8}) || len(ta.Coords) != 2 || ta.Coords[1] != (Reg{T: B32, N: 10}) {
		t.Fatalf("tensor source parsed as %#v", k.Body[11].Args[1])
	}
	text, err := m.Print()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(strings.TrimSpace(hopperSrc), "\n") {
		line = strings.TrimSpace(line)
		if strings.HasPrefix(line, ".visible") {
			continue // the printer puts one parameter a line
		}
		if !strings.Contains(text, line) {
			t.Errorf("printed text lacks %q", line)
		}
	}
	again, err := Parse(text)
	if err != nil {
		t.Fatalf("reparse: %v\n%s", err, text)
	}
	if text2, _ := again.Print(); text2 != text {
		t.Fatalf("round trip differs:\n%s\n---\n%s", text, text2)
	}
}

// hopperKernel builds the same instructions with the builder.
func hopperKernel() *Kernel {
	k := NewKernel("K")
	k.ClusterX = 2
	pmap := k.Param("pmap", U64)
	smem := k.DeclareDynamicShared("smem", 128)
	mp := k.Reg(U64)
	k.Emit("ld.param.u64", mp, Addr{Base: pmap})
	k.Emit("fence.proxy.tensormap::generic.acquire.gpu", Addr{Base: mp}, Imm(128))
	rank, sb := k.Reg(U32), k.Reg(U32)
	k.Emit("mov.u32", rank, ClusterCtaRank)
	k.Emit("mov.u32", sb, smem)
	k.Emit("mbarrier.init.shared::cta.b64", Addr{Base: sb, Offset: 8}, Imm(1))
	k.Emit("fence.mbarrier_init.release.cluster")
	st, tx, c0, c1 := k.Reg(U64), k.Reg(U32), k.Reg(U32), k.Reg(U32)
	k.Emit("mbarrier.arrive.expect_tx.shared::cta.b64", st, Addr{Base: sb, Offset: 8}, tx)
	k.Emit("bar.warp.sync", Imm(-1))
	k.Emit("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes",
		Addr{Base: sb, Offset: 32768}, TensorAddr{Map: mp, Coords: Vec{c0, c1}}, Addr{Base: sb, Offset: 8})
	k.Emit("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes", Addr{Base: sb, Offset: 1024}, Addr{Base: mp}, Imm(1024), Addr{Base: smem, Offset: 8})
	p := k.Reg(Pred)
	k.Emit("mbarrier.try_wait.parity.shared::cta.b64", p, Addr{Base: sb, Offset: 8}, Imm(0))
	remote := k.Reg(U32)
	k.Emit("mapa.shared::cluster.u32", remote, sb, Imm(0))
	k.Emit("st.shared::cluster.v4.f32", Addr{Base: remote}, Vec(k.Regs(F32, 4)))
	k.Emit("barrier.cluster.arrive.release")
	k.Emit("barrier.cluster.wait.acquire")
	return k
}

func TestHopperBuilder(t *testing.T) {
	m := NewModule(hopperKernel())
	if err := Validate(m); err != nil {
		t.Fatal(err)
	}
	text, err := m.Print()
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		".version 8.3\n",
		"\n)\n.reqnctapercluster 2, 1, 1\n{",
		"\n.extern .shared .align 128 .b8 smem[];\n\n.visible .entry K(", // at module scope, where the JIT takes it
		"\tcp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%r2+32768], [%rd1, {%r4, %r5}], [%r2+8];\n",
		"\tmov.u32 %r1, %cluster_ctarank;\n",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("printed text lacks %q:\n%s", want, text)
		}
	}
	reprints(t, text)
}

// reprints checks that text parses, validates and prints back as itself.
func reprints(t *testing.T, text string) {
	t.Helper()
	again, err := Parse(text)
	if err != nil {
		t.Fatal(err)
	}
	if err := Validate(again); err != nil {
		t.Fatal(err)
	}
	if text2, _ := again.Print(); text2 != text {
		t.Fatalf("round trip differs:\n%s\n---\n%s", text, text2)
	}
}

// TestVersionOnlyRaised: a module that needs nothing new keeps its version; one that needs
// 8.3 is printed with it; a declared higher version is kept.
func TestVersionOnlyRaised(t *testing.T) {
	for _, c := range []struct {
		k        *Kernel
		declared string
		want     string
	}{
		{sampleKernel(), Version, ".version 8.0\n"},
		{hopperKernel(), Version, ".version 8.3\n"},
		{hopperKernel(), "8.5", ".version 8.5\n"},
		{sampleKernel(), "8.4", ".version 8.4\n"},
	} {
		m := NewModule(c.k)
		m.Version = c.declared
		text, err := m.Print()
		if err != nil || !strings.Contains(text, c.want) {
			t.Errorf("declared %s: want %q in\n%s", c.declared, c.want, text)
		}
	}
}

// TestValidateHopperCatches breaks the builder's Hopper kernel in one way per case.
func TestValidateHopperCatches(t *testing.T) {
	const bulk = "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes"
	const tensor = "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
	r32 := func(k *Kernel) Reg { return k.Reg(U32) }
	r64 := func(k *Kernel) Reg { return k.Reg(U64) }
	cases := []struct {
		name  string
		build func(k *Kernel)
		want  string
	}{
		{"mbarrier without state space", func(k *Kernel) {
			k.Emit("mbarrier.init.b64", Addr{Base: r32(k)}, Imm(1))
		}, "unsupported form of mbarrier; supported: mbarrier.arrive.expect_tx.shared::cta.b64, "},
		{"mbarrier.test_wait", func(k *Kernel) {
			k.Emit("mbarrier.test_wait.parity.shared::cta.b64", k.Reg(Pred), Addr{Base: r32(k)}, Imm(0))
		}, "unsupported form of mbarrier"},
		{"mbarrier init count missing", func(k *Kernel) {
			k.Emit("mbarrier.init.shared::cta.b64", Addr{Base: r32(k)})
		}, "takes 2 operands, has 1"},
		{"mbarrier 64-bit address", func(k *Kernel) {
			k.Emit("mbarrier.init.shared::cta.b64", Addr{Base: r64(k)}, Imm(1))
		}, "operand 0: register %rd3 must be a 32-bit register (a shared address)"},
		{"mbarrier unknown shared", func(k *Kernel) {
			k.Emit("mbarrier.init.shared::cta.b64", Addr{Base: Sym("nope")}, Imm(1))
		}, "shared array nope does not exist"},
		{"mbarrier address not an address", func(k *Kernel) {
			k.Emit("mbarrier.init.shared::cta.b64", r32(k), Imm(1))
		}, "operand 0: must be an address"},
		{"arrive state 32-bit", func(k *Kernel) {
			k.Emit("mbarrier.arrive.shared::cta.b64", r32(k), Addr{Base: r32(k)})
		}, "must be a 64-bit register"},
		{"arrive state immediate", func(k *Kernel) {
			k.Emit("mbarrier.arrive.shared::cta.b64", Imm(0), Addr{Base: r32(k)})
		}, "destination must be a register"},
		{"expect_tx 64-bit count", func(k *Kernel) {
			k.Emit("mbarrier.arrive.expect_tx.shared::cta.b64", r64(k), Addr{Base: r32(k)}, r64(k))
		}, "operand 2: register %rd4 must be a 32-bit register"},
		{"try_wait into a u32", func(k *Kernel) {
			k.Emit("mbarrier.try_wait.parity.shared::cta.b64", r32(k), Addr{Base: r32(k)}, Imm(0))
		}, "must be a predicate"},
		{"bulk copy from a 32-bit address", func(k *Kernel) {
			k.Emit(bulk, Addr{Base: r32(k)}, Addr{Base: r32(k)}, Imm(16), Addr{Base: r32(k)})
		}, "operand 1: register %r8 must be a 64-bit register (a global address)"},
		{"bulk copy without mbarrier", func(k *Kernel) {
			k.Emit("cp.async.bulk.shared::cluster.global", Addr{Base: r32(k)}, Addr{Base: r64(k)}, Imm(16))
		}, "unsupported form of cp"},
		{"bulk copy size from a float", func(k *Kernel) {
			k.Emit(bulk, Addr{Base: r32(k)}, Addr{Base: r64(k)}, k.Reg(F32), Addr{Base: r32(k)})
		}, "operand 2: register %f5 must be a 32-bit register"},
		{"tensor copy 3-D", func(k *Kernel) {
			k.Emit("cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes", Addr{Base: r32(k)}, TensorAddr{Map: r64(k), Coords: Vec{r32(k), r32(k), r32(k)}}, Addr{Base: r32(k)})
		}, "unsupported form of cp"},
		{"tensor copy one coordinate", func(k *Kernel) {
			k.Emit(tensor, Addr{Base: r32(k)}, TensorAddr{Map: r64(k), Coords: Vec{r32(k)}}, Addr{Base: r32(k)})
		}, "takes 2 coordinates, has 1"},
		{"tensor copy 64-bit coordinate", func(k *Kernel) {
			k.Emit(tensor, Addr{Base: r32(k)}, TensorAddr{Map: r64(k), Coords: Vec{r32(k), r64(k)}}, Addr{Base: r32(k)})
		}, "must be a 32-bit register (a coordinate)"},
		{"tensor copy 32-bit map", func(k *Kernel) {
			k.Emit(tensor, Addr{Base: r32(k)}, TensorAddr{Map: r32(k), Coords: Vec{r32(k), r32(k)}}, Addr{Base: r32(k)})
		}, "a 64-bit register (the tensor map's address)"},
		{"remote arrive into a register", func(k *Kernel) {
			k.Emit("mbarrier.arrive.shared::cluster.b64", r64(k), Addr{Base: r32(k)})
		}, "operand 0: must be the sink _"},
		{"remote arrive with an expected count", func(k *Kernel) {
			k.Emit("mbarrier.arrive.expect_tx.shared::cluster.b64", Sink, Addr{Base: r32(k)}, Imm(16))
		}, "unsupported form of mbarrier"},
		{"multicast mask 32-bit", func(k *Kernel) {
			k.Emit(tensor+".multicast::cluster", Addr{Base: r32(k)}, TensorAddr{Map: r64(k), Coords: Vec{r32(k), r32(k)}}, Addr{Base: r32(k)}, r32(k))
		}, "operand 3: register %r11 must be a 16-bit register (the CTA mask)"},
		{"multicast mask too wide", func(k *Kernel) {
			k.Emit(tensor+".multicast::cluster", Addr{Base: r32(k)}, TensorAddr{Map: r64(k), Coords: Vec{r32(k), r32(k)}}, Addr{Base: r32(k)}, Imm(1<<16))
		}, "must be a 16-bit mask"},
		{"multicast without mask", func(k *Kernel) {
			k.Emit(tensor+".multicast::cluster", Addr{Base: r32(k)}, TensorAddr{Map: r64(k), Coords: Vec{r32(k), r32(k)}}, Addr{Base: r32(k)})
		}, "takes 4 operands, has 3"},
		{"tensor copy map symbol", func(k *Kernel) {
			k.Emit(tensor, Addr{Base: r32(k)}, TensorAddr{Map: Sym("pmap"), Coords: Vec{r32(k), r32(k)}}, Addr{Base: r32(k)})
		}, "tensor map must be a 64-bit register"},
		{"tensor copy plain source", func(k *Kernel) {
			k.Emit(tensor, Addr{Base: r32(k)}, Addr{Base: r64(k)}, Addr{Base: r32(k)})
		}, "must be a tensor source"},
		{"tensor source elsewhere", func(k *Kernel) {
			k.Emit("ld.global.f32", k.Reg(F32), TensorAddr{Map: r64(k), Coords: Vec{r32(k), r32(k)}})
		}, "operand 1 must be an address"},
		{"mapa 64-bit", func(k *Kernel) {
			k.Emit("mapa.shared::cluster.u64", r64(k), r64(k), Imm(0))
		}, "unsupported form of mapa; supported: mapa.shared::cluster.u32"},
		{"mapa into 64-bit", func(k *Kernel) {
			k.Emit("mapa.shared::cluster.u32", r64(k), r32(k), Imm(1))
		}, "operand 0: register %rd3 must be a 32-bit register"},
		{"mapa rank float", func(k *Kernel) {
			k.Emit("mapa.shared::cluster.u32", r32(k), r32(k), F32Imm(1))
		}, "operand 2: must be a 32-bit register or an integer immediate"},
		{"barrier.cluster.sync", func(k *Kernel) {
			k.Emit("barrier.cluster.sync")
		}, "unsupported form of barrier"},
		{"barrier.cluster with operand", func(k *Kernel) {
			k.Emit("barrier.cluster.arrive", Imm(0))
		}, "takes 0 operands, has 1"},
		{"fence.proxy.tensormap size", func(k *Kernel) {
			k.Emit("fence.proxy.tensormap::generic.acquire.gpu", Addr{Base: r64(k)}, Imm(64))
		}, "must be the immediate 128"},
		{"fence.proxy.tensormap release", func(k *Kernel) {
			k.Emit("fence.proxy.tensormap::generic.release.gpu")
		}, "unsupported form of fence"},
		{"fence.mbarrier_init cta", func(k *Kernel) {
			k.Emit("fence.mbarrier_init.release.cta")
		}, "unsupported form of fence"},
		{"two state spaces", func(k *Kernel) {
			k.Emit("ld.shared::cluster.global.f32", k.Reg(F32), Addr{Base: r32(k)})
		}, "names more than one state space"},
		{"shared::cluster with 32-bit global", func(k *Kernel) {
			k.Emit("st.shared::cluster.f32", Addr{Base: Sym("nope")}, k.Reg(F32))
		}, "shared array nope does not exist"},
		{"special dst", func(k *Kernel) {
			k.Emit("mov.u32", ClusterCtaRank, r32(k))
		}, "special register %cluster_ctarank may only be read"},
		{"wgmma.fence without .sync.aligned", func(k *Kernel) {
			k.Emit("wgmma.fence")
		}, "unsupported form of wgmma; supported: wgmma.commit_group.sync.aligned, wgmma.fence.sync.aligned, " +
			"wgmma.mma_async.sync.aligned.m64nNk16.f32.bf16.bf16 (N a multiple of 8 from 8 to 256), wgmma.wait_group.sync.aligned"},
		{"wgmma.commit_group without .aligned", func(k *Kernel) {
			k.Emit("wgmma.commit_group.sync")
		}, "unsupported form of wgmma"},
		{"wgmma.mma_async without .sync.aligned", func(k *Kernel) {
			wgmma(k, "wgmma.mma_async.m64n16k16.f32.bf16.bf16", 8, -1, nil)
		}, "unsupported form of wgmma"},
		{"wgmma N not a multiple of 8", func(k *Kernel) {
			wgmma(k, "wgmma.mma_async.sync.aligned.m64n12k16.f32.bf16.bf16", 6, -1, nil)
		}, "shape m64nNk16 needs N a multiple of 8 from 8 to 256"},
		{"wgmma N 264", func(k *Kernel) {
			wgmma(k, "wgmma.mma_async.sync.aligned.m64n264k16.f32.bf16.bf16", 132, -1, nil)
		}, "shape m64nNk16 needs N a multiple of 8 from 8 to 256"},
		{"wgmma N 0", func(k *Kernel) {
			wgmma(k, "wgmma.mma_async.sync.aligned.m64n0k16.f32.bf16.bf16", 0, -1, nil)
		}, "shape m64nNk16 needs N a multiple of 8 from 8 to 256"},
		{"wgmma N spelled N", func(k *Kernel) {
			wgmma(k, "wgmma.mma_async.sync.aligned.m64nNk16.f32.bf16.bf16", 8, -1, nil)
		}, "shape m64nNk16 needs N a multiple of 8 from 8 to 256"},
		{"wgmma k32", func(k *Kernel) {
			wgmma(k, "wgmma.mma_async.sync.aligned.m64n16k32.f32.bf16.bf16", 8, -1, nil)
		}, "unsupported form of wgmma"},
		{"wgmma f16", func(k *Kernel) {
			wgmma(k, "wgmma.mma_async.sync.aligned.m64n16k16.f32.f16.f16", 8, -1, nil)
		}, "unsupported form of wgmma"},
		{"wgmma f16 accumulators", func(k *Kernel) {
			wgmma(k, "wgmma.mma_async.sync.aligned.m64n16k16.f16.bf16.bf16", 8, -1, nil)
		}, "unsupported form of wgmma"},
		{"wgmma vector length", func(k *Kernel) {
			wgmma(k, wgmmaN16, 4, -1, nil)
		}, "operand 0: m64n16k16 takes a vector of 8 accumulators, has 4"},
		{"wgmma vector length for N=256", func(k *Kernel) {
			wgmma(k, "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16", 64, -1, nil)
		}, "m64n256k16 takes a vector of 128 accumulators, has 64"},
		{"wgmma scalar accumulator", func(k *Kernel) {
			wgmma(k, wgmmaN16, 8, 0, k.Reg(F32))
		}, "operand 0: must be a vector {d0, ...} of the f32 accumulators"},
		{"wgmma b32 accumulators", func(k *Kernel) {
			wgmma(k, wgmmaN16, 8, 0, Vec(k.Regs(B32, 8)))
		}, "must be an f32 register (an accumulator)"},
		{"wgmma 32-bit descriptor", func(k *Kernel) {
			wgmma(k, wgmmaN16, 8, 1, r32(k))
		}, "operand 1: register %r7 must be a 64-bit register (a matrix descriptor)"},
		{"wgmma immediate descriptor", func(k *Kernel) {
			wgmma(k, wgmmaN16, 8, 2, Imm(0))
		}, "operand 2: must be a 64-bit register (a matrix descriptor)"},
		{"wgmma scale-d 0", func(k *Kernel) {
			wgmma(k, wgmmaN16, 8, 3, Imm(0))
		}, "operand 3: scale-d must be the immediate 1 (D = A*B + D) or a predicate"},
		{"wgmma scale-d u32", func(k *Kernel) {
			wgmma(k, wgmmaN16, 8, 3, r32(k))
		}, "operand 3: register %r7 must be a predicate (scale-d)"},
		{"wgmma scale-a 2", func(k *Kernel) {
			wgmma(k, wgmmaN16, 8, 4, Imm(2))
		}, "operand 4: must be the immediate 1 or -1"},
		{"wgmma scale-b register", func(k *Kernel) {
			wgmma(k, wgmmaN16, 8, 5, r32(k))
		}, "operand 5: must be the immediate 1 or -1"},
		{"wgmma trans-a 1", func(k *Kernel) {
			wgmma(k, wgmmaN16, 8, 6, Imm(1))
		}, "operand 6: must be the immediate 0 (imm-trans: only K-major operands are supported)"},
		{"wgmma trans-b 1", func(k *Kernel) {
			wgmma(k, wgmmaN16, 8, 7, Imm(1))
		}, "operand 7: must be the immediate 0"},
		{"wgmma without trans-b", func(k *Kernel) {
			wgmma(k, wgmmaN16, 8, 7, nil)
		}, "takes 8 operands, has 7"},
		{"wgmma.wait_group 8", func(k *Kernel) {
			k.Emit("wgmma.wait_group.sync.aligned", Imm(8))
		}, "operand 0: must be an integer immediate 0..7"},
		{"wgmma.wait_group register", func(k *Kernel) {
			k.Emit("wgmma.wait_group.sync.aligned", r32(k))
		}, "operand 0: must be an integer immediate 0..7"},
		{"wgmma.wait_group without count", func(k *Kernel) {
			k.Emit("wgmma.wait_group.sync.aligned")
		}, "takes 1 operands, has 0"},
		{"wgmma.fence with operand", func(k *Kernel) {
			k.Emit("wgmma.fence.sync.aligned", Imm(0))
		}, "takes 0 operands, has 1"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			k := hopperKernel()
			c.build(k)
			err := Validate(NewModule(k))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want it to contain %q", err, c.want)
			}
			if !strings.Contains(err.Error(), "kernel K: instr ") {
				t.Fatalf("error %v does not name the kernel and instruction", err)
			}
		})
	}
}

func TestValidateHopperKernelShape(t *testing.T) {
	cases := []struct {
		name  string
		build func(k *Kernel)
		want  string
	}{
		{"two dynamic arrays", func(k *Kernel) { k.DeclareDynamicShared("more", 16) }, "2 dynamic shared arrays"},
		{"dynamic with length", func(k *Kernel) {
			k.Shared = append(k.Shared, Shared{Name: "x", Align: 16, T: B8, Len: 4, Extern: true})
		}, "dynamic shared x: bad length 4"},
		{"dynamic bad alignment", func(k *Kernel) { k.Shared[0].Align = 48 }, "alignment 48"},
		{"cluster too big", func(k *Kernel) { k.ClusterX = 16 }, "cluster size 16 is outside 1..8"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			k := hopperKernel()
			c.build(k)
			err := Validate(NewModule(k))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want it to contain %q", err, c.want)
			}
		})
	}
}

func TestParseHopperErrors(t *testing.T) {
	head := ".version 8.3\n.target sm_90\n.address_size 64\n"
	cases := []struct{ src, want string }{
		{head + ".visible .entry k() .reqnctapercluster 2, 2, 1\n{\n}", "line 4:43: clusters are supported along x only"},
		{head + ".visible .entry k()\n{\n.extern .shared .align 16 .b8 s[4];\n}", "line 6:33: expected \"]\""},
		{head + ".visible .entry k()\n{\n.extern .align 16 .b8 s[];\n}", "line 6:9: expected \".shared\""},
		{head + ".visible .entry k()\n{\ncp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%r1], [%rd1, %r2], [%r3];\n}", "expected \"{\""},
	}
	for _, c := range cases {
		_, err := Parse(c.src)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Parse(%q): error %v, want it to contain %q", c.src, err, c.want)
		}
	}
}

const wgmmaN16 = "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16"

// wgmma emits op with nacc f32 accumulators, two 64-bit descriptors and the operands 1, 1, 1,
// 0, 0, then puts a in operand j (j < 0: none), or cuts the list at j where a is nil.
func wgmma(k *Kernel, op string, nacc, j int, a Operand) {
	args := []Operand{Vec(k.Regs(F32, nacc)), k.Reg(U64), k.Reg(U64), Imm(1), Imm(1), Imm(1), Imm(0), Imm(0)}
	switch {
	case j >= 0 && a == nil:
		args = args[:j]
	case j >= 0:
		args[j] = a
	}
	k.Emit(op, args...)
}

// wgmmaSrc is the warpgroup MMA's four instructions as the codegen spells them, with the
// predicate form of scale-d and a negated operand besides.
const wgmmaSrc = `
.version 8.0
.target sm_90a
.address_size 64
.visible .entry W(.param .u64 pa, .param .u64 pb)
.maxntid 128, 1, 1
{
	.reg .pred %p<2>;
	.reg .b64 %rd<4>;
	.reg .f32 %f<17>;
	ld.param.u64 %rd1, [pa];
	ld.param.u64 %rd2, [pb];
	setp.ne.u64 %p1, %rd1, 0;
	wgmma.fence.sync.aligned;
	wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {%f1, %f2, %f3, %f4}, %rd1, %rd2, 1, 1, 1, 0, 0;
	wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {%f5, %f6, %f7, %f8, %f9, %f10, %f11, %f12}, %rd1, %rd2, %p1, -1, 1, 0, 0;
	wgmma.commit_group.sync.aligned;
	wgmma.wait_group.sync.aligned 0;
	wgmma.wait_group.sync.aligned 7;
	ret;
}
`

func TestWgmmaRoundTrip(t *testing.T) {
	m, err := Parse(wgmmaSrc)
	if err != nil {
		t.Fatal(err)
	}
	if err := Validate(m); err != nil {
		t.Fatal(err)
	}
	if m.Target != "sm_90a" {
		t.Fatalf("target parsed as %q", m.Target)
	}
	b := m.Kernels[0].Body
	if acc, ok := b[4].Args[0].(Vec); !ok || len(acc) != 4 || acc[3] != (Reg{T: F32, N: 4}) {
		t.Fatalf("accumulators parsed as %#v", b[4].Args[0])
	}
	if b[5].Args[3] != (Reg{T: Pred, N: 1}) || b[5].Args[4] != Imm(-1) || b[7].Args[0] != Imm(0) {
		t.Fatalf("operands parsed as %v and %v", b[5].Args, b[7].Args)
	}
	text, err := m.Print()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(strings.TrimSpace(wgmmaSrc), "\n") {
		line = strings.TrimSpace(line)
		if strings.HasPrefix(line, ".visible") {
			continue // the printer puts one parameter a line
		}
		if !strings.Contains(text, line) {
			t.Errorf("printed text lacks %q", line)
		}
	}
	reprints(t, text)
}

// wgmmaKernel uses wgmma through the builder, as the codegen does.
func wgmmaKernel() *Kernel {
	k := NewKernel("W")
	da, db := k.Reg(U64), k.Reg(U64)
	k.Emit("ld.param.u64", da, Addr{Base: k.Param("pa", U64)})
	k.Emit("ld.param.u64", db, Addr{Base: k.Param("pb", U64)})
	k.Emit("wgmma.fence.sync.aligned")
	k.Emit("wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16", Vec(k.Regs(F32, 64)), da, db, Imm(1), Imm(1), Imm(1), Imm(0), Imm(0))
	k.Emit("wgmma.commit_group.sync.aligned")
	k.Emit("wgmma.wait_group.sync.aligned", Imm(0))
	return k
}

// TestWgmmaRaisesTarget: wgmma needs sm_90a and PTX 8.0; a module that targets sm_90 is
// printed with sm_90a, others keep their target, and a target wgmma cannot run on is an
// error naming the instruction.
func TestWgmmaRaisesTarget(t *testing.T) {
	for _, c := range []struct {
		k               *Kernel
		version, target string
		want            string
	}{
		{wgmmaKernel(), Version, Target, ".version 8.0\n.target sm_90a\n"},
		{wgmmaKernel(), "7.8", Target, ".version 8.0\n.target sm_90a\n"},
		{wgmmaKernel(), "8.4", "sm_90a", ".version 8.4\n.target sm_90a\n"},
		{wgmmaKernel(), Version, "sm_90, debug", ".target sm_90a, debug\n"},
		{sampleKernel(), Version, Target, ".version 8.0\n.target sm_90\n"},
		{hopperKernel(), Version, Target, ".version 8.3\n.target sm_90\n"},
	} {
		m := NewModule(c.k)
		m.Version, m.Target = c.version, c.target
		if err := Validate(m); err != nil {
			t.Fatal(err)
		}
		text, err := m.Print()
		if err != nil || !strings.Contains(text, c.want) {
			t.Errorf("declared %s %s: want %q in\n%s", c.version, c.target, c.want, text)
			continue
		}
		reprints(t, text)
	}
	m := NewModule(wgmmaKernel())
	m.Target = "sm_80"
	err := Validate(m)
	if err == nil || !strings.Contains(err.Error(), "kernel W: instr 2 (wgmma.fence.sync.aligned): wgmma needs .target sm_90a; the module's is sm_80") {
		t.Fatalf("wgmma on sm_80: %v", err)
	}
	if text, _ := m.Print(); !strings.Contains(text, ".target sm_80\n") {
		t.Fatalf("sm_80 was changed:\n%s", text)
	}
}
