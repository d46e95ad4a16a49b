package passes

import (
	"errors"
	"fmt"
	"strings"

	"xmix/frontend"
)

// MaxTP bounds the tensor-parallel degree (bundle.MaxTP).
const MaxTP = 256

// shardedHooks are the hooks whose activation tensor parallelism cuts across ranks: each
// rank holds its own heads of q, k, v and z and its own columns of mlp.act, so an op there
// sees a part of the vector. head_ablate at attn.z is the exception: its column mask is cut
// with the heads, so the rank that owns the head ablates it and the others do nothing.
var shardedHooks = map[string]string{
	"attn.q":  "each rank holds heads/tp of the query heads",
	"attn.k":  "each rank holds kv_heads/tp of the key heads",
	"attn.v":  "each rank holds kv_heads/tp of the value heads",
	"attn.z":  "each rank holds heads/tp of the attention heads",
	"mlp.act": "each rank holds intermediate/tp of the MLP columns",
}

// checkTP refuses what tensor parallelism cannot compile: dimensions that do not split
// into p.TP equal parts, and ops that would see a shard of their hook.
func checkTP(p *Program) error {
	tp := p.TP
	if tp <= 1 {
		if tp < 0 {
			return fmt.Errorf("tensor-parallel degree %d: want 1 or more", tp)
		}
		return nil
	}
	m := p.Model
	if tp > MaxTP {
		return frontend.Errorf(m.Pos, fmt.Sprintf("use at most %d", MaxTP), "tensor-parallel degree %d is too large", tp)
	}
	var errs []error
	dims := []struct {
		name string
		v    int
	}{{"heads", m.Heads}, {"kv_heads", m.KVHeads}, {"intermediate", m.Intermediate}, {"vocab", m.Vocab}}
	for _, d := range dims {
		if d.v%tp != 0 {
			errs = append(errs, frontend.Errorf(m.Pos, "build with --tp "+validTP(dims[0].v, dims[1].v, dims[2].v, dims[3].v)+": they divide heads, kv_heads, intermediate and vocab",
				"tensor parallelism %d: %s %d is not divisible by %d, so the ranks cannot hold equal parts", tp, d.name, d.v, tp))
		}
	}
	reported := map[[2]any]bool{}
	for _, op := range p.Ops {
		why := tpUnsupported(op)
		key := [2]any{op.App, op.OpIndex}
		if why == "" || reported[key] {
			continue
		}
		reported[key] = true
		errs = append(errs, frontend.Errorf(op.Pos, "build without --tp, or move the op to a residual-stream hook (resid_pre, resid_mid, resid_post, attn_out, mlp_out)",
			"%s at hook %s is not supported at tensor parallelism %d: %s", op.Template, op.Hook, tp, why))
	}
	return errors.Join(errs...)
}

// tpUnsupported says why op cannot run tensor-parallel, or "" when it can.
func tpUnsupported(op *MIOp) string {
	if templateOf(op).Heavy {
		return "it multiplies by the whole LM head, which tensor parallelism cuts by vocabulary rows across ranks"
	}
	why, sharded := shardedHooks[op.Hook]
	if !sharded || op.Custom == nil && contains(templateOf(op).Sharded, op.Hook) {
		return ""
	}
	return why + ", so the op would see a part of the vector"
}

// validTP lists the degrees that divide every given dimension ("1, 2").
func validTP(dims ...int) string {
	var ok []string
	for n := 1; n <= MaxTP; n++ {
		fits := true
		for _, d := range dims {
			fits = fits && d%n == 0
		}
		if fits {
			ok = append(ok, fmt.Sprint(n))
		}
	}
	return strings.Join(ok, " or ")
}
