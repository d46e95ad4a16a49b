package passes

import (
	"errors"

	"xmix/frontend"
)

// checkConditions resolves each op's `when` into device-evaluated gates. An activation gate
// must read a buffer that a read op fills earlier in the same forward.
func checkConditions(p *Program) error {
	var errs []error
	for _, op := range p.Ops {
		spec := op.App.Spec.Ops[op.OpIndex]
		for _, c := range spec.When {
			g, err := resolveGate(p, op, c)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			op.Gates = append(op.Gates, g)
		}
	}
	return errors.Join(errs...)
}

func resolveGate(p *Program, op *MIOp, c frontend.Cond) (Gate, error) {
	switch c.Kind {
	case "token_in":
		return Gate{Kind: c.Kind, Tokens: c.Tokens}, nil
	case "steps":
		return Gate{Kind: c.Kind, From: c.From, To: c.To}, nil
	case "positions":
		return Gate{Kind: c.Kind, Positions: c.Positions}, nil
	case "activation":
		e := op.App.export(c.Buffer)
		if e == nil {
			return Gate{}, frontend.Errorf(c.Pos, "declare it under buffers: and fill it with a read", "buffer %q is not declared", c.Buffer)
		}
		var writer *MIOp
		for _, w := range p.Ops {
			if w.App == op.App && w.Out == e.Buffer && w.Key.Less(op.Key) {
				writer = w
			}
		}
		if writer == nil {
			return Gate{}, frontend.Errorf(c.Pos, "read into it at an earlier layer or hook than this op",
				"buffer %s is not written before %s at layer %d in the forward", c.Buffer, op.Hook, op.Layer)
		}
		return Gate{Kind: c.Kind, Buf: e.Buffer, Col: 0, Width: e.Width, Cmp: c.Cmp, Value: float32(c.Value)}, nil
	default:
		return Gate{}, frontend.Errorf(c.Pos, "conditions this compiler evaluates: token_in, steps, positions, activation",
			"condition %s is not supported by this version of xmixc", c.Kind)
	}
}
