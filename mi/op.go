package mi

import (
	"fmt"
	"math"
	"slices"
)

// Op is one MI op as its kernel and its reference take it: a kernel's attributes carry its
// ops as JSON (ops, the reference, reads them back). The buffers it reads and writes are the
// kernel's parameters, in the order Params gives.
type Op struct {
	Template   string `json:"template"`
	Bit        int    `json:"bit"`
	Width      int    `json:"width"`
	Alpha      int    `json:"alpha"`
	Bias       int    `json:"bias"`
	Activation string `json:"activation,omitempty"`
	OutCol     int    `json:"out_col,omitempty"`
	OutWidth   int    `json:"out_width,omitempty"`
	Gates      []Gate `json:"gates,omitempty"`
	// ScalStride > 0 makes Scal a table of ScalRows rows of ScalStride scalars, one row per
	// sequence slot, so that each request carries its own values: row r reads
	// Scal[ctl_seq[r]*ScalStride + idx]. With 0, every row reads the one row Scal holds.
	ScalStride int `json:"scal_stride,omitempty"`
	ScalRows   int `json:"scal_rows,omitempty"`
	// FiredWidth > 0: the op counts where it fires. Its kernel takes mi<i>_fired, rows of
	// FiredWidth bytes (pointing at the op's byte of its app's fired rows): on every row with the op's
	// app bit it writes 1 when the op ran there (its gates held; for clamp_projection, when
	// the clamp moved the projection) and 0 otherwise. Rows without the bit are left alone.
	FiredWidth int `json:"fired,omitempty"`
	// PoolSlots > 0: the op's vector is per-request. Its kernel also takes PoolSlots slots of
	// [Width] f32 (mi<i>_pool) and ctl_vslot; a row whose ctl_vslot is not bundle.NoRow reads
	// the vector of that slot instead of mi<i>_vec.
	PoolSlots int `json:"pool,omitempty"`
}

// Gate is one per-row condition of an op, evaluated in its kernel; all of an op's must
// hold for the row, besides its app bit.
type Gate struct {
	Kind string `json:"kind"` // activation | token_in | after_token | steps | positions | layers
	// activation: Buf[row*Width+Col] Cmp threshold, Buf an app buffer written earlier in the
	// same forward (the kernel's parameter mi<i>_g<j>); the threshold is Scal[Thresh-1] of the
	// row when Thresh > 0, else Value.
	Buf    string  `json:"-"`
	Col    int     `json:"col,omitempty"`
	Width  int     `json:"width,omitempty"`
	Cmp    string  `json:"cmp,omitempty"` // > >= < <= == !=
	Value  float32 `json:"value,omitempty"`
	Thresh int     `json:"thresh,omitempty"`
	// after_token: bit Latch of the row's ctl_latch, which the host sets once a token of the
	// latch's set has appeared in the request at or before the row's position.
	Latch int `json:"latch,omitempty"`
	// token_in: the row's current token (ctl_tokens) is one of Tokens.
	Tokens []int `json:"tokens,omitempty"`
	// steps: From <= ctl_gen[row] < To (To 0 = open); positions: prompt | generated | all,
	// where ctl_gen[row] is -1 on prompt rows and the generation step otherwise.
	From      int    `json:"from,omitempty"`
	To        int    `json:"to,omitempty"`
	Positions string `json:"positions,omitempty"`
	// layers: bit Bit of the u32 at Scal[Word] of the row (its request's layer mask of the
	// op, bits stored in the f32 table as they are).
	Word int `json:"word,omitempty"`
	Bit  int `json:"bit,omitempty"`
}

// Cmps maps an activation gate's comparison to the PTX setp condition with the same NaN
// behaviour as Go's operator (only != is true on NaN, hence the unordered "neu").
var Cmps = map[string]string{">": "gt", ">=": "ge", "<": "lt", "<=": "le", "==": "eq", "!=": "neu"}

// Validate checks everything the kernels rely on; rowWidth is the width of the hooked row.
func (o Op) Validate(rowWidth int) error {
	t, ok := Lookup(o.Template)
	if !ok || t.RunsIn != "" {
		return fmt.Errorf("unknown MI template %q", o.Template)
	}
	if o.Bit < 0 || o.Bit > 31 {
		return fmt.Errorf("%s: app bit %d outside 0..31", o.Template, o.Bit)
	}
	if o.Width != rowWidth {
		return fmt.Errorf("%s: width %d, but the hooked row has %d elements", o.Template, o.Width, rowWidth)
	}
	if err := checkScalar("alpha", t.Alpha, o.Alpha); err != nil {
		return fmt.Errorf("%s: %w", o.Template, err)
	}
	if err := checkScalar("bias", t.Bias, o.Bias); err != nil {
		return fmt.Errorf("%s: %w", o.Template, err)
	}
	if o.Activation != "" && !slices.Contains(t.Activations, o.Activation) {
		return fmt.Errorf("%s: activation %q not supported", o.Template, o.Activation)
	}
	if o.ScalStride < 0 || o.ScalRows < 0 || (o.ScalStride > 0) != (o.ScalRows > 0) {
		return fmt.Errorf("%s: scalar table of %d rows of %d", o.Template, o.ScalRows, o.ScalStride)
	}
	if n := o.ScalLen(); o.ScalStride > 0 && n > o.ScalStride {
		return fmt.Errorf("%s: reads %d scalars from rows of %d", o.Template, n, o.ScalStride)
	}
	if o.FiredWidth < 0 {
		return fmt.Errorf("%s: fired rows of %d", o.Template, o.FiredWidth)
	}
	if o.PoolSlots < 0 || o.PoolSlots > 0 && !o.hasVec() {
		return fmt.Errorf("%s: a pool of %d per-request vectors for an op without one", o.Template, o.PoolSlots)
	}
	if n := o.OutLen(); n > 0 && (o.OutCol < 0 || o.OutCol+n > o.OutWidth) {
		return fmt.Errorf("%s: %d output columns at %d do not fit an output row of %d", o.Template, n, o.OutCol, o.OutWidth)
	}
	for j, g := range o.Gates {
		if err := g.Validate(); err != nil {
			return fmt.Errorf("%s: gate %d: %w", o.Template, j, err)
		}
		if g.Kind == "layers" && o.ScalStride == 0 {
			return fmt.Errorf("%s: gate %d: a layer mask needs a per-request scalar table", o.Template, j)
		}
	}
	return nil
}

// checkScalar checks one scalar index against the template's use of it.
func checkScalar(name string, u Use, idx int) error {
	switch {
	case idx < -1:
		return fmt.Errorf("%s index %d not allowed", name, idx)
	case u == Required && idx < 0:
		return fmt.Errorf("no %s index", name)
	case u == Unused && idx >= 0:
		return fmt.Errorf("takes no %s (index %d)", name, idx)
	}
	return nil
}

func (g Gate) Validate() error {
	switch g.Kind {
	case "activation":
		if _, ok := Cmps[g.Cmp]; !ok {
			return fmt.Errorf("unknown comparison %q", g.Cmp)
		}
		if g.Width <= 0 || g.Col < 0 || g.Col >= g.Width {
			return fmt.Errorf("column %d outside a buffer row of %d", g.Col, g.Width)
		}
		if g.Thresh < 0 {
			return fmt.Errorf("threshold index %d not allowed", g.Thresh-1)
		}
	case "after_token":
		if g.Latch < 0 || g.Latch > 31 {
			return fmt.Errorf("latch bit %d outside 0..31", g.Latch)
		}
	case "token_in":
		if len(g.Tokens) == 0 {
			return fmt.Errorf("token_in with no tokens")
		}
		for _, t := range g.Tokens {
			if t < 0 || t > math.MaxUint32 {
				return fmt.Errorf("token %d out of range", t)
			}
		}
	case "steps":
		if g.From < 0 || g.From > math.MaxInt32 || g.To < 0 || g.To > math.MaxInt32 || (g.To != 0 && g.To <= g.From) {
			return fmt.Errorf("empty or invalid step window [%d, %d)", g.From, g.To)
		}
	case "positions":
		if g.Positions != "prompt" && g.Positions != "generated" && g.Positions != "all" {
			return fmt.Errorf("positions %q is not prompt, generated or all", g.Positions)
		}
	case "layers":
		if g.Word < 0 || g.Bit < 0 || g.Bit > 31 {
			return fmt.Errorf("layer mask word %d bit %d", g.Word, g.Bit)
		}
	default:
		return fmt.Errorf("unknown gate kind %q", g.Kind)
	}
	return nil
}

// OutLen is how many f32 the op writes per row into Out.
func (o Op) OutLen() int {
	switch n := o.template().Out; n {
	case -1:
		return o.Width
	default:
		return n
	}
}

// ScalLen is how many leading Scal entries the op may read (0 = no Scal parameter).
func (o Op) ScalLen() int {
	t := o.template()
	n := 0
	if t.Alpha != Unused {
		n = max(n, o.Alpha+1)
	}
	if t.Bias != Unused {
		n = max(n, o.Bias+1)
	}
	for _, g := range o.Gates {
		switch g.Kind {
		case "activation":
			n = max(n, g.Thresh)
		case "layers":
			n = max(n, g.Word+1)
		}
	}
	return n
}

// template is the op's template (the zero template for an unknown one: Validate refuses it).
func (o Op) template() *Template {
	if t, ok := Lookup(o.Template); ok {
		return t
	}
	return &Template{}
}

// hasVec says whether the op reads a vector.
func (o Op) hasVec() bool {
	t := o.template()
	return t.Vec && !(t.VecOrAlpha && o.Alpha >= 0)
}

// Param is one buffer parameter of an op. In a kernel, op i's parameter is named
// mi<i>_<Suffix>; the reference receives them in the order Params gives.
type Param struct {
	Suffix string // vec, pool, scal, out, fired or g<j>
	Gate   int    // j for g<j> (the buffer activation gate j reads); -1 otherwise
}

// Params lists the op's buffer parameters in kernel order.
func (o Op) Params() []Param {
	var ps []Param
	if o.hasVec() {
		ps = append(ps, Param{"vec", -1})
		if o.PoolSlots > 0 {
			ps = append(ps, Param{"pool", -1})
		}
	}
	if o.ScalLen() > 0 {
		ps = append(ps, Param{"scal", -1})
	}
	if o.OutLen() > 0 {
		ps = append(ps, Param{"out", -1})
	}
	if o.FiredWidth > 0 {
		ps = append(ps, Param{"fired", -1})
	}
	for j, g := range o.Gates {
		if g.Kind == "activation" {
			ps = append(ps, Param{fmt.Sprintf("g%d", j), j})
		}
	}
	return ps
}

// Control says which optional control arrays (ctl_tokens, ctl_gen) a kernel with these ops
// takes.
func Control(groups ...[]Op) (tokens, gen bool) {
	for _, ops := range groups {
		for _, o := range ops {
			for _, g := range o.Gates {
				switch {
				case g.Kind == "token_in":
					tokens = true
				case g.Kind == "steps", g.Kind == "positions" && g.Positions != "all":
					gen = true
				}
			}
		}
	}
	return tokens, gen
}

// RequestControl says which per-request control arrays a kernel with these ops takes after
// those of Control: ctl_seq (the row's sequence slot, when an op reads per-request
// scalars), ctl_latch (the row's after_token latch bits) and ctl_vslot (the row's vector
// slot, when an op has a per-request vector), in that order.
func RequestControl(groups ...[]Op) (seq, latch, vslot bool) {
	for _, ops := range groups {
		for _, o := range ops {
			seq = seq || (o.ScalStride > 0 && o.ScalLen() > 0)
			vslot = vslot || o.PoolSlots > 0
			for _, g := range o.Gates {
				latch = latch || g.Kind == "after_token"
			}
		}
	}
	return seq, latch, vslot
}
