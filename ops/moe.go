package ops

import (
	"fmt"
	"math"

	"xmix/mi"
)

// Mixture-of-experts (Mixtral) reference ops. A layer's MLP becomes three kernels:
// moe_router (router logits, the router_logits MI ops, softmax, top-k), moe_gate_up (each
// row's k experts' gate and up projections with SiLU(gate)*up) and moe_down (each expert's
// down projection, weighted by its routing weight and summed over the k slots).
//
// Expert weights sit in one buffer per kind, experts stacked along the first dimension:
// gate/up as [E*2I, H] (expert e's gate rows then its up rows), down as [E*H, I]. An expert
// index read from moe_idx is clamped to E-1, as the kernels do, so that a corrupt index can
// never read outside the weights.

// MaxExperts bounds the experts of a MoE layer: the router keeps a row's logits in one block's
// shared memory and selects with one thread.
const MaxExperts = 64

// MoERouterAttrs configure op "moe_router": per row, logits = x[row] @ w^T (w [Experts,
// Hidden] in WDtype), the MI ops applied to the logits, probabilities = softmax(logits),
// the TopK most probable experts (ties to the lower index) into idx [rows, TopK] u32 and
// their probabilities renormalised to sum 1 into wts [rows, TopK] f32. Parameters: x, w,
// idx, wts, ctl_mask, [ctl_tokens], [ctl_gen], [ctl_seq], [ctl_latch], MI parameters; one
// block per row.
type MoERouterAttrs struct {
	Hidden  int     `json:"hidden"`
	Experts int     `json:"experts"`
	TopK    int     `json:"top_k"`
	WDtype  string  `json:"w_dtype"`
	Ops     []mi.Op `json:"ops,omitempty"`
}

// MoEAttrs configure ops "moe_gate_up" and "moe_down".
//
// moe_gate_up: act[r*TopK+s] = silu(gate_e · x[r]) * (up_e · x[r]) over the Inter columns,
// e = idx[r*TopK+s]; parameters x [rows, Hidden] f32, w [Experts*2*Inter, Hidden], idx, act
// [rows*TopK, Inter] f32; grid (columns, rows*TopK).
//
// moe_down: y[r] = Σ_s wts[r*TopK+s] * (down_e @ act[r*TopK+s]); parameters act, w
// [Experts*Hidden, Inter], idx, wts, y [rows, Hidden] f32; grid (columns, rows).
type MoEAttrs struct {
	Hidden  int    `json:"hidden"`
	Inter   int    `json:"inter"`
	Experts int    `json:"experts"`
	TopK    int    `json:"top_k"`
	WDtype  string `json:"w_dtype"`
}

func (a MoEAttrs) check() (int, error) {
	if a.Hidden <= 0 || a.Inter <= 0 {
		return 0, fmt.Errorf("hidden %d, inter %d must be positive", a.Hidden, a.Inter)
	}
	if err := checkRouting(a.Experts, a.TopK); err != nil {
		return 0, err
	}
	return dtypeSize(a.WDtype)
}

// MoECombineAttrs configure op "moe_combine", the last step of the dense expert path (every
// expert run over every row by ordinary GEMMs): y[r] = Σ_s wts[r*TopK+s] * out[e][r] with
// e = idx[r*TopK+s], summed in slot order as moe_down sums. Parameters: out [Experts, Stride,
// Hidden] f32 (expert e's outputs start at row e*Stride), idx, wts, y [rows, Hidden] f32; one
// block per row.
type MoECombineAttrs struct {
	Hidden  int `json:"hidden"`
	Experts int `json:"experts"`
	TopK    int `json:"top_k"`
	Stride  int `json:"stride"`
}

func (a MoECombineAttrs) run(args []Arg, l Launch) error {
	rows, H, K := l.Grid[0], a.Hidden, a.TopK
	if rows > a.Stride {
		return fmt.Errorf("moe_combine: %d rows, but expert outputs are %d rows apart", rows, a.Stride)
	}
	if err := CheckArgs("moe_combine", args, 4*a.Experts*a.Stride*H, 4*rows*K, 4*rows*K, 4*rows*H); err != nil {
		return err
	}
	out := args[0].F32()
	sumSlots(rows, H, K, a.Experts, args[1].U32(), args[2].F32(), args[3].F32(), func(_, e, r, h int) float32 {
		return out[(e*a.Stride+r)*H+h]
	})
	return nil
}

// sumSlots sets y[r*H+h] = Σ_s wts[q] * term(q, e, r, h) over the row's slots q = r*K+s in
// slot order, e = idx[q] clamped to the experts; each product is rounded to f32 before it is
// added, as the kernels do.
func sumSlots(rows, H, K, experts int, idx []uint32, wts, y []float32, term func(q, e, r, h int) float32) {
	ParallelFor(rows, func(lo, hi int) {
		for r := lo; r < hi; r++ {
			for h := range H {
				var acc float32
				for s := range K {
					q := r*K + s
					acc += float32(wts[q] * term(q, expert(idx[q], experts), r, h))
				}
				y[r*H+h] = acc
			}
		}
	})
}

func checkRouting(experts, topK int) error {
	if experts < 1 || experts > MaxExperts {
		return fmt.Errorf("%d experts: want 1 to %d", experts, MaxExperts)
	}
	if topK < 1 || topK > experts {
		return fmt.Errorf("top-k %d: want 1 to the %d experts", topK, experts)
	}
	return nil
}

func init() {
	Register("moe_router", func(attrs []byte) (Runner, error) {
		var a MoERouterAttrs
		if err := DecodeAttrs(attrs, &a); err != nil {
			return nil, err
		}
		if a.Hidden <= 0 {
			return nil, fmt.Errorf("hidden %d must be positive", a.Hidden)
		}
		if err := checkRouting(a.Experts, a.TopK); err != nil {
			return nil, err
		}
		if _, err := dtypeSize(a.WDtype); err != nil {
			return nil, err
		}
		return RunnerFunc(a.run), nil
	})
	Register("moe_combine", func(attrs []byte) (Runner, error) {
		var a MoECombineAttrs
		if err := DecodeAttrs(attrs, &a); err != nil {
			return nil, err
		}
		if a.Hidden <= 0 || a.Stride <= 0 {
			return nil, fmt.Errorf("hidden %d, stride %d must be positive", a.Hidden, a.Stride)
		}
		if err := checkRouting(a.Experts, a.TopK); err != nil {
			return nil, err
		}
		return RunnerFunc(a.run), nil
	})
	// The grouped expert kernels share their attributes and checks.
	for name, run := range map[string]func(MoEAttrs, []Arg, Launch, int) error{
		"moe_gate_up": MoEAttrs.gateUp, "moe_down": MoEAttrs.down,
	} {
		Register(name, func(attrs []byte) (Runner, error) {
			var a MoEAttrs
			if err := DecodeAttrs(attrs, &a); err != nil {
				return nil, err
			}
			ws, err := a.check()
			if err != nil {
				return nil, err
			}
			return RunnerFunc(func(args []Arg, l Launch) error { return run(a, args, l, ws) }), nil
		})
	}
}

func (a MoERouterAttrs) run(args []Arg, l Launch) error {
	rows, E, K, H := l.Grid[0], a.Experts, a.TopK, a.Hidden
	ws, _ := dtypeSize(a.WDtype)
	c := &argCursor{args: args}
	var bufs [4]Arg
	for i, p := range []struct {
		name  string
		bytes int
	}{{"x", 4 * rows * H}, {"w", ws * E * H}, {"idx", 4 * rows * K}, {"wts", 4 * rows * K}} {
		b, err := c.take(p.name, p.bytes)
		if err != nil {
			return fmt.Errorf("moe_router: %w", err)
		}
		bufs[i] = b
	}
	ctl, err := bindCtl(c, rows, a.Ops)
	if err != nil {
		return fmt.Errorf("moe_router: %w", err)
	}
	bound, err := bindMI(c, rows, E, 0, a.Ops)
	if err != nil {
		return fmt.Errorf("moe_router: %w", err)
	}
	if err := c.done(); err != nil {
		return fmt.Errorf("moe_router: %w", err)
	}
	x, idx, wts := bufs[0].F32(), bufs[2].U32(), bufs[3].F32()
	ParallelFor(rows, func(lo, hi int) {
		logits := make([]float32, E)
		for r := lo; r < hi; r++ {
			xr := x[r*H : (r+1)*H]
			for e := range E {
				var s float64
				for i, v := range xr {
					s += float64(v) * float64(loadElem(bufs[1], ws, e*H+i))
				}
				logits[e] = float32(s)
			}
			applyMI(bound, r, ctl, logits)
			Route(logits, K, idx[r*K:(r+1)*K], wts[r*K:(r+1)*K])
		}
	})
	return nil
}

// Route turns one row's router logits into its top-k experts and their weights, with the
// f32 operations of the router kernel in its order: m = max (a NaN loses), p = 2^((l-m)·log2 e)
// / Σ, then k passes that each take the most probable expert not yet taken (the lower index
// on ties; a NaN never beats a number), and the taken probabilities divided by their sum.
// A row whose logits are all -inf (every expert masked) gets NaN weights, as softmax would.
func Route(logits []float32, k int, idx []uint32, wts []float32) {
	m := float32(math.Inf(-1))
	for _, l := range logits {
		if l > m {
			m = l
		}
	}
	p := make([]float32, len(logits))
	var s float32
	for e, l := range logits {
		t := float32(float32(l-m) * log2e)
		p[e] = float32(math.Exp2(float64(t)))
		s += p[e]
	}
	for e := range p {
		p[e] /= s
	}
	taken := make([]bool, len(p))
	var tot float32
	for i := range k {
		best, bv := -1, float32(math.Inf(-1))
		for e, v := range p {
			if !taken[e] && (best < 0 || v > bv) {
				best, bv = e, v
			}
		}
		taken[best] = true
		idx[i], wts[i] = uint32(best), bv
		tot += bv
	}
	for i := range k {
		wts[i] /= tot
	}
}

const log2e = float32(1.4426950408889634)

// expert clamps an index read from moe_idx to a valid expert.
func expert(v uint32, experts int) int { return min(int(v), experts-1) }

func (a MoEAttrs) gateUp(args []Arg, l Launch, ws int) error {
	rs := l.Grid[1] // rows * TopK
	H, I := a.Hidden, a.Inter
	if err := CheckArgs("moe_gate_up", args, 4*(rs/a.TopK)*H, ws*a.Experts*2*I*H, 4*rs, 4*rs*I); err != nil {
		return err
	}
	if rs%a.TopK != 0 {
		return fmt.Errorf("moe_gate_up: grid of %d row slots is not a multiple of top-k %d", rs, a.TopK)
	}
	x, w, idx, act := args[0].F32(), args[1], args[2].U32(), args[3].F32()
	ParallelFor(rs, func(lo, hi int) {
		for q := lo; q < hi; q++ {
			e := expert(idx[q], a.Experts)
			xr := x[(q/a.TopK)*H : (q/a.TopK+1)*H]
			for c := range I {
				g := wdot(xr, w, ws, (e*2*I+c)*H)
				u := wdot(xr, w, ws, (e*2*I+I+c)*H)
				act[q*I+c] = Silu(g) * u
			}
		}
	})
	return nil
}

func (a MoEAttrs) down(args []Arg, l Launch, ws int) error {
	rows := l.Grid[1]
	H, I, K := a.Hidden, a.Inter, a.TopK
	if err := CheckArgs("moe_down", args, 4*rows*K*I, ws*a.Experts*H*I, 4*rows*K, 4*rows*K, 4*rows*H); err != nil {
		return err
	}
	act, w := args[0].F32(), args[1]
	sumSlots(rows, H, K, a.Experts, args[2].U32(), args[3].F32(), args[4].F32(), func(q, e, _, h int) float32 {
		return wdot(act[q*I:(q+1)*I], w, ws, (e*H+h)*I)
	})
	return nil
}

// wdot is x · w[off : off+len(x)] with w stored as f32 (ws 4) or bf16 (ws 2).
func wdot(x []float32, w Arg, ws, off int) float32 {
	if ws == 2 {
		return dotBF16(x, w.U16()[off:off+len(x)])
	}
	return dot(x, w.F32()[off:off+len(x)])
}
