package codegen

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"xmix/ir"
	"xmix/mi"
	"xmix/ptx"
)

// registeredOps are, for every template of package mi that is fused row code and may sit
// outside the router (whose kernel, with its -inf logits, moe_test.go checks), the ops its
// facts allow at a hook of width w: with and without each optional scalar, with its
// activations, under a gate. A template added to mi is tested here with no change to this
// file: its PTX against its reference, in the standalone MI kernel and, when it may sit at
// the residual stream, at the residual of an add+norm kernel.
func registeredOps(w int) map[string]ir.MI {
	out := map[string]ir.MI{}
	for _, name := range mi.Names() {
		t, _ := mi.Lookup(name)
		if t.Emit == nil || slices.Equal(t.Hooks, []string{"router_logits"}) {
			continue
		}
		base := ir.MI{Op: mi.Op{Template: name, Bit: testBit, Width: w, Alpha: -1, Bias: -1,
			Gates: []mi.Gate{{Kind: "positions", Positions: "generated"}}}}
		if t.Out != 0 {
			cols := t.OutCols(w, 0)
			base.Out, base.OutCol, base.OutWidth = "o", 1, cols+2
		}
		variants := []ir.MI{base}
		for _, slot := range []struct {
			use mi.Use
			set func(o *ir.MI)
		}{{t.Alpha, func(o *ir.MI) { o.Alpha = 0 }}, {t.Bias, func(o *ir.MI) { o.Bias = 1 }}} {
			switch slot.use {
			case mi.Required:
				for i := range variants {
					slot.set(&variants[i])
				}
			case mi.Optional:
				for _, v := range variants {
					slot.set(&v)
					variants = append(variants, v)
				}
			}
		}
		for _, act := range t.Activations {
			v := variants[len(variants)-1]
			v.Activation = act
			variants = append(variants, v)
		}
		for i, v := range variants {
			if v.Alpha >= 0 || v.Bias >= 0 {
				v.Scal = "s"
			}
			if t.Vec && !(t.VecOrAlpha && v.Alpha >= 0) {
				v.Vec = "v"
			}
			out[fmt.Sprintf("%s_%d", name, i)] = v
		}
	}
	return out
}

func TestEveryTemplateMatchesReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(31, 32))
	const w = 160
	ops := registeredOps(w)
	if len(ops) < 10 {
		t.Fatalf("%d template variants", len(ops))
	}
	for name, op := range ops {
		c := MIKernelConfig{Width: w, Stride: w + 64, Offset: 32, Ops: []ir.MI{op}}
		k, err := MIKernel("mi_"+name, c)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		x := targ{name: "x", f32: randF32(rng, testRows*c.Stride, 1), out: testRows * c.Stride}
		checkKernel(t, k, c.Launch(testRows), append([]targ{x}, miTargs(rng, c.Ops)...))
		if tmpl, _ := mi.Lookup(op.Template); tmpl.Hooks != nil && !slices.Contains(tmpl.Hooks, "resid_post") {
			continue // not at the residual stream (head_ablate: attn.z only)
		}
		rc := RowConfig{Hidden: w, Eps: 1e-5, WDtype: ptx.BF16, Load: "add", ResidOps: []ir.MI{op}}
		if k, err = RowNorm("row_"+name, rc); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		checkKernel(t, k, rc.Launch(testRows), rowNormArgs(rng, rc, testRows))
	}
}
