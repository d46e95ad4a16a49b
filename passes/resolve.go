package passes

import (
	"errors"
	"fmt"
	"strings"

	"xmix/frontend"
	"xmix/ir"
	"xmix/mi"
	"xmix/models"
)

// buildGraph writes the model's forward with its family's builder.
func buildGraph(p *Program) error {
	g, err := models.Build(p.Model)
	if err != nil {
		return frontend.Errorf(p.Model.Pos, "families: "+strings.Join(models.Families(), ", "), "%v", err)
	}
	p.Graph = g
	return nil
}

// resolveHooks expands every app op into one MIOp per layer at a hook value of the graph.
func resolveHooks(p *Program) error {
	m, g := p.Model, p.Graph
	names, perLayer := g.HookNames()
	var errs []error
	for _, a := range p.Apps {
		for i, op := range a.Spec.Ops {
			if why, refused := g.Refused[op.Hook]; refused {
				errs = append(errs, frontend.Errorf(op.HookPos, why,
					"hook %s cannot be fired on model %q (family %s) in this version of xmixc", op.Hook, m.Name, m.Family))
				continue
			}
			if !contains(names, op.Hook) {
				errs = append(errs, frontend.Errorf(op.HookPos, frontend.Suggest(op.Hook, names, "hooks the model can fire"),
					"unknown hook %q (model %q, family %s)", op.Hook, m.Name, m.Family))
				continue
			}
			if op.LayersPerRequest && !perLayer[op.Hook] {
				errs = append(errs, frontend.Errorf(op.PerRequestPos, "per_request: lets a request narrow an op's layers; remove it here",
					"hook %s is a whole-model hook: a request has no layers of it to choose", op.Hook))
				continue
			}
			custom := customKernel(a.Spec, op.Kernel)
			template := op.Kernel
			if custom != nil {
				template = CustomTemplate
			} else if _, ok := mi.Lookup(op.Kernel); !ok {
				errs = append(errs, frontend.Errorf(op.KernelPos, "templates this compiler fuses: "+strings.Join(mi.Names(), ", "),
					"kernel %s is not supported by this version of xmixc", op.Kernel))
				continue
			}
			var layers []int
			switch {
			case !perLayer[op.Hook]:
				if len(op.Layers) > 0 || op.AllLayers {
					errs = append(errs, frontend.Errorf(op.LayersPos, "remove layers: for whole-model hooks",
						"hook %s is a whole-model hook and takes no layers", op.Hook))
					continue
				}
				layers = []int{-1}
			case op.AllLayers:
				for l := range m.Layers {
					layers = append(layers, l)
				}
			default:
				if len(op.Layers) == 0 {
					errs = append(errs, frontend.Errorf(op.HookPos, `add layers: N, [N, M], "A-B" or all`,
						"hook %s is per layer and needs layers", op.Hook))
					continue
				}
				for _, l := range op.Layers {
					if l < 0 || l >= m.Layers {
						errs = append(errs, frontend.Errorf(op.LayersPos,
							fmt.Sprintf("model %q has layers 0-%d", m.Name, m.Layers-1), "layer %d out of range", l))
						continue
					}
					layers = append(layers, l)
				}
			}
			for _, l := range layers {
				v, key := hookSite(g, ir.Hook{Name: op.Hook, Layer: l})
				if v == nil {
					return fmt.Errorf("graph of %s: no value is hook %s of layer %d", m.Name, op.Hook, l)
				}
				mo := &MIOp{App: a, Pos: op.Pos, Kind: op.Kind, Custom: custom, Hook: op.Hook, Layer: l, Key: key, Value: v}
				mo.Template, mo.OpIndex, mo.Width, mo.Alpha, mo.Bias = template, i, v.Width, -1, -1
				p.Ops = append(p.Ops, mo)
			}
		}
	}
	return errors.Join(errs...)
}

// assignAppBits gives each app its bit in the per-row app mask, in deployment order.
func assignAppBits(p *Program) error {
	if len(p.Apps) > MaxApps {
		return frontend.Errorf(p.Apps[MaxApps].Spec.Pos, "split the deployment into several bundles",
			"%d apps deployed, a bundle holds at most %d", len(p.Apps), MaxApps)
	}
	for i, a := range p.Apps {
		a.Bit = i
	}
	return nil
}

// declareAppBuffers gives every declared app buffer a device buffer; reads fill its columns.
func declareAppBuffers(p *Program) error {
	var errs []error
	for _, a := range p.Apps {
		for _, b := range a.Spec.Buffers {
			if b.Dtype != "" && b.Dtype != "f32" {
				errs = append(errs, frontend.Errorf(b.Pos, "use dtype: f32", "buffer %s: dtype %s is not supported", b.Name, b.Dtype))
				continue
			}
			w := 1
			for _, d := range b.Shape {
				w *= d
			}
			a.Exports = append(a.Exports, Export{
				Name: b.Name, Buffer: "app." + a.Name + ".buffer." + b.Name, Width: w, Export: b.Export, Pos: b.Pos,
			})
		}
	}
	return errors.Join(errs...)
}

func (a *AppPlan) export(name string) *Export {
	for i := range a.Exports {
		if a.Exports[i].Name == name {
			return &a.Exports[i]
		}
	}
	return nil
}

// checkPlacement refuses what the placement cannot order: a buffer filled both at hook
// logits (sampled rows only) and at token hooks, and an activation gate on a heavy read's
// buffer (a heavy op runs after the add+norm kernel that hosts the next layer's resid_pre).
func checkPlacement(p *Program) error {
	var errs []error
	hosts := map[string]map[bool]bool{} // buffer -> written at logits?
	heavy := map[string]bool{}
	for _, op := range p.Ops {
		if op.Out == "" {
			continue
		}
		if hosts[op.Out] == nil {
			hosts[op.Out] = map[bool]bool{}
		}
		hosts[op.Out][op.Host == HostLogits] = true
		heavy[op.Out] = heavy[op.Out] || op.Host == HostLens
	}
	reported := map[string]bool{}
	for _, op := range p.Ops {
		if h := hosts[op.Out]; len(h) == 2 && !reported[op.Out] {
			reported[op.Out] = true
			errs = append(errs, frontend.Errorf(op.Pos, "read the logits into a buffer of their own",
				"buffer %s is filled at hook logits (sampled rows) and at token hooks", op.Out))
		}
		for _, g := range op.Gates {
			if g.Kind == "activation" && heavy[g.Buf] {
				errs = append(errs, frontend.Errorf(op.Pos, "gate on a probe_linear or capture read instead",
					"condition on buffer %s, which a logit_lens fills: not supported in this version of xmixc", g.Buf))
			}
		}
	}
	return errors.Join(errs...)
}
