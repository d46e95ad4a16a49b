package codegen

import (
	"fmt"
	"math"
	"strings"

	"xmix/bundle"
	"xmix/ir"
	"xmix/ops"
	"xmix/passes"
	"xmix/ptx"
)

// Custom kernels are user PTX with a declared signature (passes.CustomABI: x, stride, offset,
// width, ctl_mask, bit, then the op's vector pointers and f32 scalars). passes checks the text
// against the signature at compile time; here the entry is renamed to a bundle-unique name and
// reprinted, and the kernel is bound to op custom_ptx, whose CPU reference is the same PTX run
// in ptx/emu (ops/custom.go). A custom node runs right after the host kernel of its hook; at resid_post that is
// the add+norm kernel, which has already normalised the residual, so a renorm node follows the
// layer's custom nodes and recomputes the next layer's input (or the final norm) from the
// residual as the custom kernels left it.

// CustomConfig configures CustomKernel.
type CustomConfig struct {
	PTX, Entry string
	Signature  []ptx.Param
}

// Launch is the grid for rows rows: one block of passes.CustomThreads threads per row.
func (CustomConfig) Launch(rows int) ops.Launch {
	return ops.Launch{Grid: [3]int{rows, 1, 1}, Block: [3]int{passes.CustomThreads, 1, 1}}
}

// CustomKernel checks c's PTX and returns its entry, renamed name, as a kernel bound to
// op custom_ptx.
func CustomKernel(name string, c CustomConfig) (*Kernel, error) {
	m, err := passes.CheckCustomPTX(c.PTX, c.Entry, c.Signature)
	if err != nil {
		return nil, fmt.Errorf("custom %s: %w", name, err)
	}
	k := *m.Kernels[0]
	k.Name = name
	text, err := ptx.NewModule(&k).Print()
	if err != nil {
		return nil, fmt.Errorf("custom %s: %w", name, err)
	}
	return &Kernel{Name: name, PTX: text, Params: k.Params, Op: customOp,
		Attrs: ops.EncodeAttrs(ops.CustomPTXAttrs{PTX: text, Entry: name})}, nil
}

// RenormConfig configures Renorm.
type RenormConfig struct {
	Hidden int
	Eps    float32
	WDtype ptx.Type // storage of w: F32 or BF16
	Gather bool     // out_row[row] picks the output row; NoRow skips
	// WOffset is added to w as in RowConfig (1: Gemma's (1 + w)).
	WOffset float32
}

// Launch is the grid for rows rows.
func (c RenormConfig) Launch(rows int) ops.Launch { return rowLaunch(c.Hidden, rows) }

// Renorm generates out = RMSNorm(resid) * w, the norm half of row_norm (same code, so the
// same bits). Parameters: resid, w, out, [out_row].
func Renorm(name string, c RenormConfig) (*Kernel, error) {
	return named("renorm", name, c, renorm)
}

func renorm(name string, c RenormConfig) (*Kernel, error) {
	if c.WDtype != ptx.F32 && c.WDtype != ptx.BF16 {
		return nil, fmt.Errorf("weight dtype %s is not f32 or bf16", c.WDtype)
	}
	r, err := newRowEmitter(name, c.Hidden)
	if err != nil {
		return nil, err
	}
	resid := r.param("resid", ptx.U64)
	w := r.param("w", ptx.U64)
	out := r.param("out", ptx.U64)
	var outRow ptx.Reg
	if c.Gather {
		outRow = r.param("out_row", ptx.U64)
	}
	r.begin()
	end := r.NewLabel("end")
	dst := r.outRow(c.Gather, outRow, end)
	x := r.loadRow(r.ptr(resid, r.row, c.Hidden, 0, ptx.F32, false), nil)
	r.rmsNorm(x, r.loadNormWeight(w, RowConfig{WDtype: c.WDtype, WOffset: c.WOffset}), c.Eps)
	r.storeRow(r.ptr(out, dst, c.Hidden, 0, ptx.F32, false), x)
	r.Label(end)
	return finish(r.Kernel, "row_renorm", ops.RenormAttrs{Hidden: c.Hidden, Eps: c.Eps, WDtype: c.WDtype.String(), Gather: c.Gather, WOffset: c.WOffset})
}

// customName names an op's kernel in the bundle: one per (app, custom kernel). The app's bit
// keeps it unique (app names may differ only in - and _, which PTX names cannot hold both of).
func customName(op *ir.MI) string {
	return fmt.Sprintf("custom_%s_%s_b%d", strings.ReplaceAll(op.App, "-", "_"), op.Custom.Name, op.Bit)
}

// custom is an app's own kernel over the residual rows, in place.
func (t *tb) custom(n *ir.Node) {
	g := t.g
	op := n.Attrs.(ir.CustomAttrs).MI
	x := n.In[0]
	sig := make([]ptx.Param, len(op.Custom.Signature))
	for i, s := range op.Custom.Signature {
		tp, _ := ptx.ParseType(s.Type)
		sig[i] = ptx.Param{Name: s.Name, T: tp}
	}
	c := CustomConfig{PTX: op.Custom.PTX, Entry: op.Custom.Entry, Signature: sig}
	name := customName(op)
	k, err := g.kernel(name, func() (*Kernel, error) { return CustomKernel(name, c) })
	g.site(n, name)
	s := slots{"x": buf(x.Buffer), "stride": konst(uint64(x.Base().Width)), "offset": konst(uint64(x.Offset)),
		"width": konst(uint64(op.Width)), "ctl_mask": buf(bundle.CtlMask), "bit": konst(uint64(op.Bit))}
	for _, a := range op.Custom.Args {
		if a.Type == ptx.U64.String() {
			s[a.Name] = buf(a.Buf)
		} else {
			s[a.Name] = konst(uint64(math.Float32bits(a.Value)))
		}
	}
	t.add(n.Name, k, err, c.Launch(t.rows), s, nil)
}

// renorm recomputes what an add+norm kernel derived from the residual (the next layer's
// input, or the final norm of the sampled rows) after custom kernels changed the residual.
func (t *tb) renorm(n *ir.Node) {
	g := t.g
	resid, out := n.In[0], n.In[1]
	a := n.Attrs.(ir.NormAttrs)
	c := RenormConfig{Hidden: resid.Width, Eps: a.Eps, WDtype: g.wdt, Gather: out.Rows == ir.Samples, WOffset: a.Offset}
	s := slots{"resid": buf(resid.Buffer), "w": buf(n.Weight("w").Name), "out": buf(out.Buffer)}
	name := fmt.Sprintf("renorm_h%d", c.Hidden)
	if c.Gather {
		name = fmt.Sprintf("final_renorm_h%d", c.Hidden)
		s["out_row"] = buf(bundle.CtlOutRow)
	}
	k, err := g.kernel(name, func() (*Kernel, error) { return Renorm(name, c) })
	t.add(n.Name, k, err, c.Launch(t.rows), s, nil)
}
