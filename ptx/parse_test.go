package ptx

import (
	"strings"
	"testing"
)

// sampleKernel uses every operand kind and most instruction shapes the generators emit.
func sampleKernel() *Kernel {
	k := NewKernel("sample")
	k.MaxNTid, k.MinBlocks, k.MaxNReg = 256, 2, 48
	x := k.Param("x", U64)
	n := k.Param("n", U32)
	sm := k.DeclareShared("smem", F32, 8)
	px, rn := k.Reg(U64), k.Reg(U32)
	k.Emit("ld.param.u64", px, Addr{Base: x})
	k.Emit("ld.param.u32", rn, Addr{Base: n})
	tid := k.Reg(U32)
	k.Emit("mov.u32", tid, TidX)
	p := k.Reg(Pred)
	k.Emit("setp.ge.u32", p, tid, rn)
	done := k.NewLabel("done")
	k.EmitIf(p, false, "bra.uni", Sym(done))
	off := k.Reg(U64)
	k.Emit("mul.wide.u32", off, tid, Imm(4))
	a := k.Reg(U64)
	k.Emit("add.u64", a, px, off)
	v := k.Regs(F32, 4)
	k.Emit("ld.global.nc.v4.f32", Vec(v), Addr{Base: a, Offset: 16})
	k.Emit("fma.rn.f32", v[0], v[1], F32Imm(1.5), v[2])
	k.Emit("st.global.f32", Addr{Base: a, Offset: -8}, v[0])
	sb := k.Reg(U32)
	k.Emit("mov.u32", sb, sm)
	k.EmitIf(p, true, "st.shared.f32", Addr{Base: sb}, v[3])
	k.Emit("ld.shared.f32", v[3], Addr{Base: sm, Offset: 4})
	h := k.Reg(B16)
	k.Emit("cvt.rn.bf16.f32", h, v[3])
	k.Emit("shfl.sync.bfly.b32", v[1], v[0], Imm(16), Imm(0x1f), Imm(-1))
	k.Emit("bar.sync", Imm(0))
	k.Label(done)
	k.Emit("ret")
	return k
}

func TestRoundTrip(t *testing.T) {
	text, err := NewModule(sampleKernel()).Print()
	if err != nil {
		t.Fatal(err)
	}
	m, err := Parse(text)
	if err != nil {
		t.Fatalf("parse: %v\n%s", err, text)
	}
	if err := Validate(m); err != nil {
		t.Fatalf("validate: %v", err)
	}
	again, err := m.Print()
	if err != nil {
		t.Fatal(err)
	}
	if again != text {
		t.Fatalf("round trip differs:\n--- printed\n%s\n--- reparsed\n%s", text, again)
	}
	k := m.Kernel("sample")
	if k.RegDecls["f"] != 4 || len(k.Params) != 2 || k.Shared[0].Len != 8 || k.MaxNTid != 256 || k.MinBlocks != 2 || k.MaxNReg != 48 {
		t.Fatalf("parsed kernel: regs %v params %v shared %v", k.RegDecls, k.Params, k.Shared)
	}
}

func TestParseHandWritten(t *testing.T) {
	src := `
.version 8.0
.target sm_90 // comment
.address_size 64
/* a block
   comment */
.visible .entry k(.param .u64 p)
.reqntid 64, 1, 1
{
	.reg .pred %p<2>;
	.reg .b32 %r1, %r2;
	.reg .f32 %f<3>;
	.shared .f32 buf[4];
	{
	mov.f32 %f1, 1.5;
	mov.b32 %r1, 0xFFFFFFFF;
	add.s32 %r2, %r1, -3;
	}
	exit;
}`
	m, err := Parse(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := Validate(m); err != nil {
		t.Fatal(err)
	}
	k := m.Kernels[0]
	if k.RegDecls["r"] != 2 || k.Shared[0].Align != 4 || len(k.Body) != 4 {
		t.Fatalf("got regs %v shared %+v body %v", k.RegDecls, k.Shared, k.Body)
	}
	if got := k.Body[0].Args[1]; got != F32Imm(1.5) {
		t.Fatalf("decimal float parsed as %#v", got)
	}
	if got := k.Body[2].Args[2]; got != Imm(-3) {
		t.Fatalf("negative immediate parsed as %#v", got)
	}
}

func TestParseErrors(t *testing.T) {
	head := ".version 8.0\n.target sm_90\n.address_size 64\n.visible .entry k()\n{\n"
	cases := []struct{ src, want string }{
		{head + "\tmov.u32 %r1 5;\n}", `line 6:14: expected ","`},
		{head + "\tmov.u32 %q1, 5;\n}", "line 6:10: bad register %q1"},
		{head + "\tld.global.f32 %f1, [%rd1+x];\n}", "line 6:27: expected an integer offset"},
		{head + "\tadd.f32 %f1, %f2, %f3;\n", "missing \"}\""},
		{".target sm_90\n", "missing .version"},
		{head + "\tmov.u32 %r1, #;\n}", "line 6:15: unexpected character"},
		{head + "\t.reg .f32 %x<3>;\n}", "line 6:12: unknown register class"},
	}
	for _, c := range cases {
		_, err := Parse(c.src)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Parse(%q): error %v, want it to contain %q", c.src, err, c.want)
		}
	}
}
