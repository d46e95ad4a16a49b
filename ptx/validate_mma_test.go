package ptx

import (
	"strings"
	"testing"
)

// mmaCheck validates one kernel holding a single instruction built by add.
func mmaCheck(add func(k *Kernel)) error {
	k := NewKernel("k")
	add(k)
	return Validate(NewModule(k))
}

func TestValidateMmaAndPacking(t *testing.T) {
	const mma = "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"
	frag := func(k *Kernel) (d, a, b, c Vec) {
		return Vec(k.Regs(F32, 4)), Vec(k.Regs(B32, 4)), Vec(k.Regs(B32, 2)), Vec(k.Regs(F32, 4))
	}
	good := []func(k *Kernel){
		func(k *Kernel) { d, a, b, c := frag(k); k.Emit(mma, d, a, b, c) },
		func(k *Kernel) { k.Emit("cvt.rn.bf16x2.f32", k.Reg(B32), k.Reg(F32), k.Reg(F32)) },
		func(k *Kernel) { k.Emit("mov.b32", k.Reg(B32), Vec(k.Regs(B16, 2))) },
		func(k *Kernel) { k.Emit("ld.global.v4.b32", Vec(k.Regs(B32, 4)), Addr{Base: k.Reg(U64)}) },
	}
	for i, g := range good {
		if err := mmaCheck(g); err != nil {
			t.Errorf("good case %d: %v", i, err)
		}
	}
	bad := []struct {
		add  func(k *Kernel)
		want string
	}{
		{func(k *Kernel) {
			d, a, b, c := frag(k)
			k.Emit("mma.sync.aligned.m16n8k8.row.col.f32.bf16.bf16.f32", d, a, b, c)
		}, "modifier .m16n8k8 is not valid"},
		{func(k *Kernel) {
			d, a, b, c := frag(k)
			k.Emit("mma.sync.aligned.m16n8k16.col.row.f32.bf16.bf16.f32", d, a, b, c)
		}, "supports only .sync.aligned.m16n8k16.row.col"},
		{func(k *Kernel) {
			d, a, b, c := frag(k)
			k.Emit("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32", d, a, b, c)
		}, "type .f16 is not valid for mma"},
		{func(k *Kernel) {
			d, a, _, c := frag(k)
			k.Emit(mma, d, a, Vec(k.Regs(B32, 4)), c)
		}, "vector operand 2 does not match"},
		{func(k *Kernel) {
			d, a, b, _ := frag(k)
			k.Emit(mma, d, a, b, k.Reg(F32))
		}, "mma operand 3 must be a register vector"},
		{func(k *Kernel) {
			d, _, b, c := frag(k)
			k.Emit(mma, d, Vec(k.Regs(B64, 4)), b, c)
		}, "does not fit type .b32"},
		{func(k *Kernel) {
			k.Emit("cvt.rz.bf16x2.f32", k.Reg(B32), k.Reg(F32), k.Reg(F32))
		}, "packed conversion supports only .rn.bf16x2.f32"},
		{func(k *Kernel) {
			k.Emit("cvt.rn.bf16x2.f32", k.Reg(B32), k.Reg(F32))
		}, "cvt takes three operands exactly when it packs"},
		{func(k *Kernel) {
			k.Emit("cvt.rn.bf16.f32", k.Reg(B16), k.Reg(F32), k.Reg(F32))
		}, "cvt takes three operands exactly when it packs"},
		{func(k *Kernel) {
			k.Emit("mov.b32", k.Reg(B32), Vec(k.Regs(B32, 2)))
		}, "does not fit type .b16"},
		{func(k *Kernel) {
			k.Emit("add.u32", k.Reg(B32), Vec(k.Regs(B16, 2)), k.Reg(B32))
		}, "vector operand 1 does not match"},
	}
	for i, c := range bad {
		if err := mmaCheck(c.add); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("case %d: got %v, want %q", i, err, c.want)
		}
	}
}

func TestParseMma(t *testing.T) {
	src := `.version 8.0
.target sm_90
.address_size 64
.visible .entry k()
{
	.reg .b32 %r<8>;
	.reg .f32 %f<12>;
	.reg .b16 %rs<3>;
	mov.b32 %r7, {%rs1, %rs2};
	cvt.rn.bf16x2.f32 %r6, %f9, %f10;
	mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%f1, %f2, %f3, %f4}, {%r1, %r2, %r3, %r4}, {%r5, %r6}, {%f5, %f6, %f7, %f8};
	ret;
}
`
	m, err := Parse(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := Validate(m); err != nil {
		t.Fatal(err)
	}
	out, err := m.Print()
	if err != nil || !strings.Contains(out, "{%f1, %f2, %f3, %f4}, {%r1, %r2, %r3, %r4}, {%r5, %r6}") {
		t.Fatalf("round trip: %v\n%s", err, out)
	}
}
