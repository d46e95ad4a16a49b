package mi

import "xmix/ptx"

// head_ablate: x[head*D : (head+1)*D] *= alpha on attn.z rows [heads*D]. The compiler turns
// the head index into a 0/1 column mask (the op's vector), so the kernel needs no head
// geometry, and under tensor parallelism the mask is cut with the heads: the rank that owns
// the head ablates it.
func init() {
	Register(Template{
		Name: "head_ablate", Kind: Write, Vec: true, Writes: true, Alpha: Required,
		Hooks: []string{"attn.z"}, Sharded: []string{"attn.z"},
		Args: map[string]Arg{
			"head":  {Kind: Head, Required: true},
			"alpha": {Kind: Scalar},
		},
		Ref: func(r Row) bool {
			alpha := r.Scal[r.Alpha]
			for k := range r.X {
				if r.Vec[k] != 0 {
					r.X[k] *= alpha
				}
			}
			return true
		},
		// The tail's mask loads as zero, so the tail is never touched.
		Emit: func(e Emitter, o *Op, x []ptx.Reg) {
			k := e.Kernel()
			alpha := e.Scalar(o.Alpha)
			vec := e.Vec()
			for j := range x {
				m, _ := vec(j)
				on := k.Reg(ptx.Pred)
				k.Emit("setp.neu.f32", on, m, ptx.F32Imm(0))
				k.EmitIf(on, false, "mul.rn.f32", x[j], x[j], alpha)
			}
		},
	})
}
