package ops

import (
	"fmt"
	"math"

	"xmix/bundle"
)

// MIOp is one fused MI op as its reference sees it: codegen's MIOp without the buffer names,
// because the buffers arrive as positional arguments in the order ParamSuffixes gives.
type MIOp struct {
	Template   string   `json:"template"`
	Bit        int      `json:"bit"`
	Width      int      `json:"width"`
	Alpha      int      `json:"alpha"`
	Bias       int      `json:"bias"`
	Activation string   `json:"activation,omitempty"`
	OutCol     int      `json:"out_col,omitempty"`
	OutWidth   int      `json:"out_width,omitempty"`
	Gates      []MIGate `json:"gates,omitempty"`
	// ScalStride > 0 makes Scal a table of ScalRows rows of ScalStride scalars, one row per
	// sequence slot, so that each request carries its own values: row r reads
	// Scal[ctl_seq[r]*ScalStride + idx]. With 0, every row reads the one row Scal holds.
	ScalStride int `json:"scal_stride,omitempty"`
	ScalRows   int `json:"scal_rows,omitempty"`
	// Fired > 0: the op counts where it fires. Its kernel takes mi<i>_fired, rows of Fired
	// bytes (pointing at the op's byte of its app's fired rows): on every row with the op's
	// app bit it writes 1 when the op ran there (its gates held; for clamp_projection, when
	// the clamp moved the projection) and 0 otherwise. Rows without the bit are left alone.
	Fired int `json:"fired,omitempty"`
	// Pool > 0: the op's vector is per-request. Its kernel also takes Pool slots of [Width]
	// f32 (mi<i>_pool) and ctl_vslot; a row whose ctl_vslot is not NoRow reads the vector of
	// that slot instead of mi<i>_vec.
	Pool int `json:"pool,omitempty"`
}

// MIGate is one per-row condition of an MIOp (see codegen.Gate for the meaning of each field).
type MIGate struct {
	Kind  string  `json:"kind"`
	Col   int     `json:"col,omitempty"`
	Width int     `json:"width,omitempty"`
	Cmp   string  `json:"cmp,omitempty"`
	Value float32 `json:"value,omitempty"`
	// Thresh is 1 + the index in Scal of an activation gate's threshold, which then replaces
	// the constant Value (0: Value is the threshold).
	Thresh    int    `json:"thresh,omitempty"`
	Latch     int    `json:"latch,omitempty"` // after_token: the bit of ctl_latch it tests
	Tokens    []int  `json:"tokens,omitempty"`
	From      int    `json:"from,omitempty"`
	To        int    `json:"to,omitempty"`
	Positions string `json:"positions,omitempty"`
	// layers: bit Bit of the u32 at Scal[Word] of the row (its request's layer mask of the
	// op, bits stored in the f32 table as they are).
	Word int `json:"word,omitempty"`
	Bit  int `json:"bit,omitempty"`
}

// MIUse says whether a template reads one of its scalars.
type MIUse int

const (
	MIUnused   MIUse = iota
	MIOptional       // read when its index is >= 0
	MIRequired
)

// MITemplate holds the facts about one MI template that both its reference and its PTX
// emitter rely on. Adding a template means an entry here, its case in applyMI,
// and its emitter in codegen/mi_emit.go.
type MITemplate struct {
	Vec    bool // reads a [Width] f32 vector (mi<i>_vec)
	Out    int  // writes this many f32 per row into Out (mi<i>_out); -1 = Width, 0 = none
	Writes bool // rewrites the hooked row
	// The op's two scalars, Scal[Alpha] and Scal[Bias]. Alpha is alpha (steer_add, scale,
	// head_ablate), the target value (steer_set) or the lower bound (clamp_projection); Bias
	// is probe_linear's bias or clamp_projection's upper bound.
	Alpha, Bias MIUse
	// VecOrAlpha: the op reads its vector or Scal[Alpha], never both; it has the vector
	// exactly when Alpha is -1 (scale).
	VecOrAlpha bool
}

// MITemplates is the table of known templates. head_ablate's vector is a 0/1 mask over the
// head's columns, built at compile time, so that the kernel needs no head geometry.
var MITemplates = map[string]MITemplate{
	"capture":          {Out: -1},
	"probe_linear":     {Vec: true, Out: 1, Bias: MIOptional},
	"steer_add":        {Vec: true, Writes: true, Alpha: MIRequired},
	"project_out":      {Vec: true, Writes: true},
	"steer_set":        {Vec: true, Writes: true, Alpha: MIRequired},
	"clamp_projection": {Vec: true, Writes: true, Alpha: MIOptional, Bias: MIOptional},
	"scale":            {Vec: true, Writes: true, Alpha: MIOptional, VecOrAlpha: true},
	"head_ablate":      {Vec: true, Writes: true, Alpha: MIRequired},
	"patch":            {Vec: true, Writes: true},
}

// MICmps maps an activation gate's comparison to the PTX setp condition with the same NaN
// behaviour as Go's operator (only != is true on NaN, hence the unordered "neu").
var MICmps = map[string]string{">": "gt", ">=": "ge", "<": "lt", "<=": "le", "==": "eq", "!=": "neu"}

// Validate checks everything the kernels rely on; rowWidth is the width of the hooked row.
func (o MIOp) Validate(rowWidth int) error {
	t, ok := MITemplates[o.Template]
	if !ok {
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
	if o.Activation != "" && (o.Template != "probe_linear" || o.Activation != "sigmoid") {
		return fmt.Errorf("%s: activation %q not supported", o.Template, o.Activation)
	}
	if o.ScalStride < 0 || o.ScalRows < 0 || (o.ScalStride > 0) != (o.ScalRows > 0) {
		return fmt.Errorf("%s: scalar table of %d rows of %d", o.Template, o.ScalRows, o.ScalStride)
	}
	if n := o.scalLen(); o.ScalStride > 0 && n > o.ScalStride {
		return fmt.Errorf("%s: reads %d scalars from rows of %d", o.Template, n, o.ScalStride)
	}
	if o.Fired < 0 {
		return fmt.Errorf("%s: fired rows of %d", o.Template, o.Fired)
	}
	if o.Pool < 0 || o.Pool > 0 && !o.hasVec() {
		return fmt.Errorf("%s: a pool of %d per-request vectors for an op without one", o.Template, o.Pool)
	}
	if n := o.outLen(); n > 0 && (o.OutCol < 0 || o.OutCol+n > o.OutWidth) {
		return fmt.Errorf("%s: %d output columns at %d do not fit an output row of %d", o.Template, n, o.OutCol, o.OutWidth)
	}
	for j, g := range o.Gates {
		if err := g.validate(); err != nil {
			return fmt.Errorf("%s: gate %d: %w", o.Template, j, err)
		}
		if g.Kind == "layers" && o.ScalStride == 0 {
			return fmt.Errorf("%s: gate %d: a layer mask needs a per-request scalar table", o.Template, j)
		}
	}
	return nil
}

// checkScalar checks one scalar index against the template's use of it.
func checkScalar(name string, u MIUse, idx int) error {
	switch {
	case idx < -1:
		return fmt.Errorf("%s index %d not allowed", name, idx)
	case u == MIRequired && idx < 0:
		return fmt.Errorf("no %s index", name)
	case u == MIUnused && idx >= 0:
		return fmt.Errorf("takes no %s (index %d)", name, idx)
	}
	return nil
}

func (g MIGate) validate() error {
	switch g.Kind {
	case "activation":
		if _, ok := MICmps[g.Cmp]; !ok {
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

// outLen is how many f32 the op writes per row into Out.
func (o MIOp) outLen() int {
	switch n := MITemplates[o.Template].Out; n {
	case -1:
		return o.Width
	default:
		return n
	}
}

// scalLen is how many leading Scal entries the op may read (0 = no Scal parameter).
func (o MIOp) scalLen() int {
	t := MITemplates[o.Template]
	n := 0
	if t.Alpha != MIUnused {
		n = max(n, o.Alpha+1)
	}
	if t.Bias != MIUnused {
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

// hasVec says whether the op reads a vector.
func (o MIOp) hasVec() bool {
	t := MITemplates[o.Template]
	return t.Vec && !(t.VecOrAlpha && o.Alpha >= 0)
}

// MIParam is one buffer parameter of an MI op. In a kernel, op i's parameter is named
// mi<i>_<Suffix>; the reference receives them in the order Params gives.
type MIParam struct {
	Suffix string // vec, pool, scal, out, fired or g<j>
	Gate   int    // j for g<j> (the buffer activation gate j reads); -1 otherwise
}

// Params lists the op's buffer parameters in kernel order.
func (o MIOp) Params() []MIParam {
	var ps []MIParam
	if o.hasVec() {
		ps = append(ps, MIParam{"vec", -1})
		if o.Pool > 0 {
			ps = append(ps, MIParam{"pool", -1})
		}
	}
	if o.scalLen() > 0 {
		ps = append(ps, MIParam{"scal", -1})
	}
	if o.outLen() > 0 {
		ps = append(ps, MIParam{"out", -1})
	}
	if o.Fired > 0 {
		ps = append(ps, MIParam{"fired", -1})
	}
	for j, g := range o.Gates {
		if g.Kind == "activation" {
			ps = append(ps, MIParam{fmt.Sprintf("g%d", j), j})
		}
	}
	return ps
}

// bytes is how large the buffer behind p must be for a kernel over rows rows.
func (o MIOp) bytes(p MIParam, rows int) int {
	switch p.Suffix {
	case "vec":
		return 4 * o.Width
	case "pool":
		return 4 * o.Width * o.Pool
	case "scal":
		if o.ScalStride > 0 {
			return 4 * o.ScalStride * o.ScalRows
		}
		return 4 * o.scalLen()
	case "out":
		return 4 * rows * o.OutWidth
	case "fired":
		return (rows-1)*o.Fired + 1
	}
	return 4 * rows * o.Gates[p.Gate].Width
}

// MIControl says which optional control arrays (ctl_tokens, ctl_gen) a kernel with these ops
// takes.
func MIControl(groups ...[]MIOp) (tokens, gen bool) {
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

// MIRequestControl says which per-request control arrays a kernel with these ops takes after
// those of MIControl: ctl_seq (the row's sequence slot, when an op reads per-request
// scalars), ctl_latch (the row's after_token latch bits) and ctl_vslot (the row's vector
// slot, when an op has a per-request vector), in that order.
func MIRequestControl(groups ...[]MIOp) (seq, latch, vslot bool) {
	for _, ops := range groups {
		for _, o := range ops {
			seq = seq || (o.ScalStride > 0 && o.scalLen() > 0)
			vslot = vslot || o.Pool > 0
			for _, g := range o.Gates {
				latch = latch || g.Kind == "after_token"
			}
		}
	}
	return seq, latch, vslot
}

// miCtl is the per-row control block a kernel reads: app mask, current token, generation step
// (as int32; negative on prompt rows), sequence slot, latch bits and vector slot.
type miCtl struct {
	mask, tokens, gen, seq, latch, vslot []uint32
}

// miBound is an MIOp with its buffers.
type miBound struct {
	MIOp
	vec, pool, scal, out []float32
	fired                []byte
	gates                [][]float32 // indexed like Gates; nil for gates without a buffer
}

// fire records on a row with the op's app bit whether the op fired there.
func (b *miBound) fire(row int, on bool) {
	if b.Fired > 0 {
		v := byte(0)
		if on {
			v = 1
		}
		b.fired[row*b.Fired] = v
	}
}

// vecAt is the vector row reads: its request's slot of the pool, or the compiled one.
func (b *miBound) vecAt(row int, ctl miCtl) []float32 {
	if b.Pool > 0 {
		if s := ctl.vslot[row]; s != bundle.NoRow {
			return b.pool[int(s)*b.Width : (int(s)+1)*b.Width]
		}
	}
	return b.vec
}

// argCursor hands out a kernel's arguments in order, checking sizes as it goes.
type argCursor struct {
	args []Arg
	next int
}

func (c *argCursor) take(name string, bytes int) (Arg, error) {
	if c.next >= len(c.args) {
		return Arg{}, fmt.Errorf("missing argument %d (%s)", c.next, name)
	}
	a := c.args[c.next]
	c.next++
	if len(a.Mem) < bytes {
		return Arg{}, fmt.Errorf("argument %d (%s) holds %d bytes, needs %d", c.next-1, name, len(a.Mem), bytes)
	}
	return a, nil
}

func (c *argCursor) done() error {
	if c.next != len(c.args) {
		return fmt.Errorf("%d arguments, want %d", len(c.args), c.next)
	}
	return nil
}

// bindCtl takes ctl_mask and the optional control arrays for a kernel over rows rows.
func bindCtl(c *argCursor, rows int, groups ...[]MIOp) (miCtl, error) {
	var ctl miCtl
	a, err := c.take("ctl_mask", 4*rows)
	if err != nil {
		return ctl, err
	}
	ctl.mask = a.U32()
	tok, gen := MIControl(groups...)
	if tok {
		if a, err = c.take("ctl_tokens", 4*rows); err != nil {
			return ctl, err
		}
		ctl.tokens = a.U32()
	}
	if gen {
		if a, err = c.take("ctl_gen", 4*rows); err != nil {
			return ctl, err
		}
		ctl.gen = a.U32()
	}
	seq, latch, vslot := MIRequestControl(groups...)
	if seq {
		if a, err = c.take("ctl_seq", 4*rows); err != nil {
			return ctl, err
		}
		ctl.seq = a.U32()
		// Every row reads its sequence's row of each per-request table, so every row's
		// sequence must have one (padding rows included: they name the padding sequence).
		for _, ops := range groups {
			for _, o := range ops {
				if o.ScalStride == 0 {
					continue
				}
				for r, s := range ctl.seq {
					if int64(s) >= int64(o.ScalRows) {
						return ctl, fmt.Errorf("ctl_seq[%d] = %d outside a scalar table of %d rows", r, s, o.ScalRows)
					}
				}
			}
		}
	}
	if latch {
		if a, err = c.take("ctl_latch", 4*rows); err != nil {
			return ctl, err
		}
		ctl.latch = a.U32()
	}
	if vslot {
		if a, err = c.take("ctl_vslot", 4*rows); err != nil {
			return ctl, err
		}
		ctl.vslot = a.U32()
		// A row with a slot reads that slot of every per-request pool of its ops.
		for _, ops := range groups {
			for _, o := range ops {
				if o.Pool == 0 {
					continue
				}
				for r, s := range ctl.vslot[:rows] {
					if s != bundle.NoRow && int64(s) >= int64(o.Pool) {
						return ctl, fmt.Errorf("ctl_vslot[%d] = %d outside a pool of %d vector slots", r, s, o.Pool)
					}
				}
			}
		}
	}
	return ctl, nil
}

// bindMI validates ops (numbered from first for messages) and takes their buffers.
func bindMI(c *argCursor, rows, rowWidth, first int, ops []MIOp) ([]miBound, error) {
	bound := make([]miBound, len(ops))
	for i, o := range ops {
		if err := o.Validate(rowWidth); err != nil {
			return nil, fmt.Errorf("MI op %d: %w", first+i, err)
		}
		b := miBound{MIOp: o, gates: make([][]float32, len(o.Gates))}
		for _, p := range o.Params() {
			a, err := c.take(fmt.Sprintf("mi%d_%s", first+i, p.Suffix), o.bytes(p, rows))
			if err != nil {
				return nil, err
			}
			switch p.Suffix {
			case "vec":
				b.vec = a.F32()
			case "pool":
				b.pool = a.F32()
			case "fired":
				b.fired = a.Mem
			case "scal":
				b.scal = a.F32()
			case "out":
				b.out = a.F32()
			default:
				b.gates[p.Gate] = a.F32()
			}
		}
		bound[i] = b
	}
	return bound, nil
}

// scalars is the part of Scal that row reads: its sequence's row of a per-request table.
func (b *miBound) scalars(row int, ctl miCtl) []float32 {
	if b.ScalStride == 0 {
		return b.scal
	}
	base := int(ctl.seq[row]) * b.ScalStride
	return b.scal[base : base+b.ScalStride]
}

// enabled is the op's row predicate: the app bit and every gate; sc is the row's scalars.
// On a row with the bit whose gates fail it records that the op did not fire.
func (b *miBound) enabled(row int, ctl miCtl, sc []float32) bool {
	if ctl.mask[row]>>b.Bit&1 == 0 {
		return false
	}
	for j, g := range b.Gates {
		if !g.holds(row, ctl, b.gates[j], sc) {
			b.fire(row, false)
			return false
		}
	}
	return true
}

func (g MIGate) holds(row int, ctl miCtl, buf, sc []float32) bool {
	switch g.Kind {
	case "activation":
		v, t := buf[row*g.Width+g.Col], g.Value
		if g.Thresh > 0 {
			t = sc[g.Thresh-1]
		}
		switch g.Cmp {
		case ">":
			return v > t
		case ">=":
			return v >= t
		case "<":
			return v < t
		case "<=":
			return v <= t
		case "==":
			return v == t
		default: // "!=", the only one left after validation
			return v != t
		}
	case "after_token":
		return ctl.latch[row]>>g.Latch&1 != 0
	case "layers":
		return math.Float32bits(sc[g.Word])>>g.Bit&1 != 0
	case "token_in":
		for _, t := range g.Tokens {
			if uint32(t) == ctl.tokens[row] {
				return true
			}
		}
		return false
	case "steps":
		gen := int32(ctl.gen[row])
		return gen >= 0 && gen >= int32(g.From) && (g.To == 0 || gen < int32(g.To))
	default: // positions
		switch g.Positions {
		case "prompt":
			return int32(ctl.gen[row]) < 0
		case "generated":
			return int32(ctl.gen[row]) >= 0
		}
		return true
	}
}

// applyMI runs ops in order on row x of row index row. Float32 conversions around products
// keep Go from fusing them into FMAs, so results match the PTX's separately rounded mul.rn
// and add.rn bit for bit where the kernels promise that (steer_add, scale, head_ablate,
// patch).
func applyMI(ops []miBound, row int, ctl miCtl, x []float32) {
	for i := range ops {
		b := &ops[i]
		sc := b.scalars(row, ctl)
		if !b.enabled(row, ctl, sc) {
			continue
		}
		vec := b.vecAt(row, ctl)
		fired := true
		switch b.Template {
		case "capture":
			copy(b.out[row*b.OutWidth+b.OutCol:], x[:b.Width])
		case "probe_linear":
			s := dot64(x, vec)
			if b.Bias >= 0 {
				s += float64(sc[b.Bias])
			}
			if b.Activation == "sigmoid" {
				s = 1 / (1 + math.Exp(-s))
			}
			b.out[row*b.OutWidth+b.OutCol] = float32(s)
		case "steer_add":
			alpha := sc[b.Alpha]
			for k := range b.Width {
				x[k] += float32(alpha * vec[k])
			}
		case "project_out":
			d := float32(dot64(x, vec))
			for k := range b.Width {
				x[k] -= float32(d * vec[k])
			}
		case "steer_set", "clamp_projection":
			p := float32(dot64(x, vec))
			c := b.target(p, sc)
			// A clamp that finds the projection inside its bounds leaves the row alone.
			fired = b.Template == "steer_set" || c != p
			a := c - p
			for k := range b.Width {
				x[k] += float32(a * vec[k])
			}
		case "scale":
			if b.Alpha >= 0 {
				alpha := sc[b.Alpha]
				for k := range b.Width {
					x[k] *= alpha
				}
			} else {
				for k := range b.Width {
					x[k] *= vec[k]
				}
			}
		case "head_ablate":
			alpha := sc[b.Alpha]
			for k := range b.Width {
				if vec[k] != 0 {
					x[k] *= alpha
				}
			}
		case "patch":
			copy(x[:b.Width], vec)
		}
		b.fire(row, fired)
	}
}

// target is the projection steer_set and clamp_projection leave along their direction, given
// the current one p and the row's scalars sc. The clamp follows PTX max/min, where a NaN
// operand loses to the other.
func (b *miBound) target(p float32, sc []float32) float32 {
	if b.Template == "steer_set" {
		return sc[b.Alpha]
	}
	c := p
	if b.Alpha >= 0 {
		if lo := sc[b.Alpha]; c < lo || isNaN(c) {
			c = lo
		}
	}
	if b.Bias >= 0 {
		if hi := sc[b.Bias]; c > hi || isNaN(c) {
			c = hi
		}
	}
	return c
}

func isNaN(v float32) bool { return math.IsNaN(float64(v)) }

func dot64(x, v []float32) float64 {
	var s float64
	for k := range v {
		s += float64(x[k]) * float64(v[k])
	}
	return s
}

// MIKernelAttrs are the attributes of op "mi": MI ops applied in place to
// x[row*Stride+Offset : +Width] for every row of the grid.
type MIKernelAttrs struct {
	Width  int    `json:"width"`
	Stride int    `json:"stride"`
	Offset int    `json:"offset"`
	Ops    []MIOp `json:"ops"`
}

func init() {
	Register("mi", func(attrs []byte) (Runner, error) {
		var a MIKernelAttrs
		if err := DecodeAttrs(attrs, &a); err != nil {
			return nil, err
		}
		if a.Width <= 0 || a.Offset < 0 || a.Offset+a.Width > a.Stride {
			return nil, fmt.Errorf("row [%d, +%d) does not fit a stride of %d", a.Offset, a.Width, a.Stride)
		}
		return RunnerFunc(a.run), nil
	})
}

func (a MIKernelAttrs) run(args []Arg, l Launch) error {
	rows := l.Grid[0]
	c := &argCursor{args: args}
	x, err := c.take("x", 4*((rows-1)*a.Stride+a.Offset+a.Width))
	if err != nil {
		return fmt.Errorf("mi: %w", err)
	}
	ctl, err := bindCtl(c, rows, a.Ops)
	if err != nil {
		return fmt.Errorf("mi: %w", err)
	}
	bound, err := bindMI(c, rows, a.Width, 0, a.Ops)
	if err != nil {
		return fmt.Errorf("mi: %w", err)
	}
	if err := c.done(); err != nil {
		return fmt.Errorf("mi: %w", err)
	}
	xs := x.F32()
	ParallelFor(rows, func(lo, hi int) {
		for r := lo; r < hi; r++ {
			off := r*a.Stride + a.Offset
			applyMI(bound, r, ctl, xs[off:off+a.Width])
		}
	})
	return nil
}
