package mi

import "xmix/ptx"

// capture: the hooked row, copied into the op's buffer.
func init() {
	Register(Template{
		Name: "capture", Kind: Read, Out: -1, Elementwise: true,
		OutCols: func(width, _ int) int { return width },
		Ref: func(r Row) bool {
			copy(r.Out, r.X)
			return true
		},
		Emit: func(e Emitter, _ *Op, x []ptx.Reg) { e.StoreOut(x) },
	})
}
