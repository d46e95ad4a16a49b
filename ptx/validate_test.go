package ptx

import (
	"strings"
	"testing"
)

func TestValidateAcceptsSample(t *testing.T) {
	if err := Validate(NewModule(sampleKernel())); err != nil {
		t.Fatal(err)
	}
	k := sampleKernel()
	k.Body = append([]Instr{{Op: "griddepcontrol.launch_dependents"}, {Op: "griddepcontrol.wait"}}, k.Body...)
	if err := Validate(NewModule(k)); err != nil {
		t.Fatal(err)
	}
}

// TestValidateCatches breaks a valid kernel in one way per case and checks the complaint.
func TestValidateCatches(t *testing.T) {
	cases := []struct {
		name  string
		build func(k *Kernel)
		want  string
	}{
		{"undeclared register", func(k *Kernel) {
			k.Emit("mov.u32", Reg{T: U32, N: 99}, Imm(1))
		}, "instr 18 (mov.u32 %r99, 1): register %r99 is not declared"},
		{"unknown opcode", func(k *Kernel) {
			k.Emit("frob.f32", k.Reg(F32), k.Reg(F32))
		}, "unknown opcode frob"},
		{"missing label", func(k *Kernel) {
			k.Emit("bra", Sym("nowhere"))
		}, "label nowhere does not exist"},
		{"operand count", func(k *Kernel) {
			k.Emit("add.f32", k.Reg(F32), k.Reg(F32))
		}, "add takes [3] operands, has 2"},
		{"store needs address", func(k *Kernel) {
			k.Emit("st.global.f32", k.Reg(U64), k.Reg(F32))
		}, "operand 0 must be an address"},
		{"duplicate label", func(k *Kernel) {
			k.Label("$L_done_1")
		}, "duplicate label $L_done_1"},
		{"unknown param", func(k *Kernel) {
			k.Emit("ld.param.u32", k.Reg(U32), Addr{Base: Sym("nope")})
		}, "parameter nope does not exist"},
		{"unknown shared", func(k *Kernel) {
			k.Emit("ld.shared.f32", k.Reg(F32), Addr{Base: Sym("nope")})
		}, "shared array nope does not exist"},
		{"class mismatch", func(k *Kernel) {
			k.Emit("add.u32", k.Reg(F32), k.Reg(U32), k.Reg(U32))
		}, "does not fit type .u32"},
		{"bad type suffix", func(k *Kernel) {
			k.Emit("fma.rn.u32", k.Reg(U32), k.Reg(U32), k.Reg(U32), k.Reg(U32))
		}, "type .u32 is not valid for fma"},
		{"bad modifier", func(k *Kernel) {
			k.Emit("ld.gloabl.f32", k.Reg(F32), Addr{Base: k.Reg(U64)})
		}, "modifier .gloabl is not valid"},
		{"cvt without rounding", func(k *Kernel) {
			k.Emit("cvt.f32.u32", k.Reg(F32), k.Reg(U32))
		}, "integer to float needs .rn"},
		{"integer mul without mode", func(k *Kernel) {
			k.Emit("mul.u32", k.Reg(U32), k.Reg(U32), k.Reg(U32))
		}, "mul needs exactly one mode"},
		{"griddepcontrol without action", func(k *Kernel) {
			k.Emit("griddepcontrol")
		}, "griddepcontrol needs exactly one action"},
		{"griddepcontrol with two actions", func(k *Kernel) {
			k.Emit("griddepcontrol.wait.launch_dependents")
		}, "griddepcontrol needs exactly one action"},
		{"setp without comparison", func(k *Kernel) {
			k.Emit("setp.f32", k.Reg(Pred), k.Reg(F32), k.Reg(F32))
		}, "setp needs exactly one comparison"},
		{"immediate destination", func(k *Kernel) {
			k.Emit("mov.u32", Imm(3), Imm(1))
		}, "destination operand 0 must be a register"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			k := sampleKernel()
			c.build(k)
			err := Validate(NewModule(k))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want it to contain %q", err, c.want)
			}
			if !strings.Contains(err.Error(), "kernel sample: instr ") && c.name != "duplicate label" {
				t.Fatalf("error %v does not name the kernel and instruction", err)
			}
		})
	}
}

func TestValidateHeader(t *testing.T) {
	m := NewModule(sampleKernel())
	m.Version, m.Target = "", ""
	err := Validate(m)
	if err == nil || !strings.Contains(err.Error(), "missing .version") || !strings.Contains(err.Error(), "missing .target") {
		t.Fatalf("got %v", err)
	}
}
