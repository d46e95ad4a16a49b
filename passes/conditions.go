package passes

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"xmix/frontend"
	"xmix/mi"
)

// checkConditions resolves each op's `when` into device-evaluated gates. An activation gate
// must read a buffer that a read op fills earlier in the same forward; its threshold becomes
// the app scalar op<i>.threshold so that requests may override it. Each distinct after_token
// token set gets a latch bit, shared by every op and app that uses the same set.
func checkConditions(p *Program) error {
	var errs []error
	latches := map[string]int{}
	for _, op := range p.Ops {
		spec := op.App.Spec.Ops[op.OpIndex]
		for _, c := range spec.When {
			g, err := resolveGate(p, op, c, latches)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			op.Gates = append(op.Gates, g)
		}
	}
	return errors.Join(errs...)
}

func resolveGate(p *Program, op *MIOp, c frontend.Cond, latches map[string]int) (mi.Gate, error) {
	switch c.Kind {
	case "token_in":
		return mi.Gate{Kind: c.Kind, Tokens: c.Tokens}, nil
	case "after_token":
		set := slices.Clone(c.Tokens)
		slices.Sort(set)
		set = slices.Compact(set)
		key := fmt.Sprint(set)
		bit, ok := latches[key]
		if !ok {
			if len(p.Latches) == MaxLatches {
				return mi.Gate{}, frontend.Errorf(c.Pos, "share token sets between after_token conditions",
					"more than %d distinct after_token token sets in one deployment", MaxLatches)
			}
			bit = len(p.Latches)
			latches[key] = bit
			p.Latches = append(p.Latches, set)
		}
		return mi.Gate{Kind: c.Kind, Tokens: set, Latch: bit}, nil
	case "steps":
		return mi.Gate{Kind: c.Kind, From: c.From, To: c.To}, nil
	case "positions":
		return mi.Gate{Kind: c.Kind, Positions: c.Positions}, nil
	case "activation":
		e := op.App.export(c.Buffer)
		if e == nil {
			return mi.Gate{}, frontend.Errorf(c.Pos, "declare it under buffers: and fill it with a read", "buffer %q is not declared", c.Buffer)
		}
		var writer *MIOp
		for _, w := range p.Ops {
			if w.App == op.App && w.Out == e.Buffer && w.Key.Less(op.Key) {
				writer = w
			}
		}
		if writer == nil {
			where := op.Hook // a whole-model hook
			if op.Layer >= 0 {
				where = fmt.Sprintf("%s at layer %d", op.Hook, op.Layer)
			}
			return mi.Gate{}, frontend.Errorf(c.Pos, "read into it at an earlier layer or hook than this op",
				"buffer %s is not written before %s in the forward", c.Buffer, where)
		}
		// The threshold is a scalar of the app (requests may override it): the kernel reads
		// it from the scalar table, Thresh its index plus one.
		thresh := op.App.scalar(fmt.Sprintf("op%d.threshold", op.OpIndex), float32(c.Value))
		return mi.Gate{Kind: c.Kind, Buf: e.Buffer, Col: 0, Width: e.Width, Cmp: c.Cmp, Thresh: thresh + 1}, nil
	default:
		return mi.Gate{}, frontend.Errorf(c.Pos, "conditions this compiler evaluates: "+strings.Join(gateKinds, ", "),
			"condition %s is not supported by this version of xmixc", c.Kind)
	}
}

// gateKinds are the conditions resolveGate turns into gates.
var gateKinds = []string{"token_in", "after_token", "steps", "positions", "activation"}

// scalar returns the index of the app's scalar called name, adding it with value v first if
// the app has none by that name (an op over several layers shares its scalars).
func (a *AppPlan) scalar(name string, v float32) int {
	for i, s := range a.Scalars {
		if s.Name == name {
			return i
		}
	}
	a.Scalars = append(a.Scalars, Scalar{Name: name, Value: v})
	return len(a.Scalars) - 1
}

// planLayerMasks gives each op marked at: {per_request: true} a layer mask in its app's
// scalar table, after the scalars, and each of its sites a "layers" gate on its layer's bit:
// a request runs the op at the layers whose bits its table row sets (all by default).
func planLayerMasks(p *Program) error {
	var errs []error
	words := (p.Model.Layers + 31) / 32
	for _, a := range p.Apps {
		col := len(a.Scalars)
		for i, spec := range a.Spec.Ops {
			if !spec.LayersPerRequest {
				continue
			}
			m := LayerMask{OpIndex: i, Col: col, Words: words, Pos: spec.LayersPos}
			for _, op := range p.Ops {
				if op.App == a && op.OpIndex == i {
					if op.Custom != nil || templateOf(op).Heavy {
						errs = append(errs, frontend.Errorf(spec.HookPos, "enable the app per request instead",
							"kernel %s takes no per-request layers in this version of xmixc", spec.Kernel))
						break
					}
					m.Layers = append(m.Layers, op.Layer)
					op.Gates = append(op.Gates, mi.Gate{Kind: "layers", Word: col + op.Layer/32, Bit: op.Layer % 32})
				}
			}
			if len(m.Layers) == 0 {
				continue
			}
			slices.Sort(m.Layers)
			a.LayerMasks = append(a.LayerMasks, m)
			col += words
		}
	}
	return errors.Join(errs...)
}
