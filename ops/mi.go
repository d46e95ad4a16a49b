package ops

import (
	"fmt"
	"math"

	"xmix/bundle"
	"xmix/mi"
)

// paramBytes is how large the buffer behind o's parameter p must be for a kernel over rows
// rows.
func paramBytes(o mi.Op, p mi.Param, rows int) int {
	switch p.Suffix {
	case "vec":
		return 4 * o.Width
	case "pool":
		return 4 * o.Width * o.PoolSlots
	case "scal":
		if o.ScalStride > 0 {
			return 4 * o.ScalStride * o.ScalRows
		}
		return 4 * o.ScalLen()
	case "out":
		return 4 * rows * o.OutWidth
	case "fired":
		return (rows-1)*o.FiredWidth + 1
	}
	return 4 * rows * o.Gates[p.Gate].Width
}

// miCtl is the per-row control block a kernel reads: app mask, current token, generation step
// (as int32; negative on prompt rows), sequence slot, latch bits and vector slot.
type miCtl struct {
	mask, tokens, gen, seq, latch, vslot []uint32
}

// miBound is an mi.Op with its buffers.
type miBound struct {
	mi.Op
	vec, pool, scal, out []float32
	fired                []byte
	gates                [][]float32 // indexed like Gates; nil for gates without a buffer
}

// fire records on a row with the op's app bit whether the op fired there.
func (b *miBound) fire(row int, on bool) {
	if b.FiredWidth > 0 {
		v := byte(0)
		if on {
			v = 1
		}
		b.fired[row*b.FiredWidth] = v
	}
}

// vecAt is the vector row reads: its request's slot of the pool, or the compiled one.
func (b *miBound) vecAt(row int, ctl miCtl) []float32 {
	if b.PoolSlots > 0 {
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
func bindCtl(c *argCursor, rows int, groups ...[]mi.Op) (miCtl, error) {
	var ctl miCtl
	a, err := c.take("ctl_mask", 4*rows)
	if err != nil {
		return ctl, err
	}
	ctl.mask = a.U32()
	tok, gen := mi.Control(groups...)
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
	seq, latch, vslot := mi.RequestControl(groups...)
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
				if o.PoolSlots == 0 {
					continue
				}
				for r, s := range ctl.vslot[:rows] {
					if s != bundle.NoRow && int64(s) >= int64(o.PoolSlots) {
						return ctl, fmt.Errorf("ctl_vslot[%d] = %d outside a pool of %d vector slots", r, s, o.PoolSlots)
					}
				}
			}
		}
	}
	return ctl, nil
}

// bindMI validates ops (numbered from first for messages) and takes their buffers.
func bindMI(c *argCursor, rows, rowWidth, first int, ops []mi.Op) ([]miBound, error) {
	bound := make([]miBound, len(ops))
	for i, o := range ops {
		if err := o.Validate(rowWidth); err != nil {
			return nil, fmt.Errorf("MI op %d: %w", first+i, err)
		}
		b := miBound{Op: o, gates: make([][]float32, len(o.Gates))}
		for _, p := range o.Params() {
			a, err := c.take(fmt.Sprintf("mi%d_%s", first+i, p.Suffix), paramBytes(o, p, rows))
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
		if !holds(g, row, ctl, b.gates[j], sc) {
			b.fire(row, false)
			return false
		}
	}
	return true
}

// holds says whether gate g lets row run (buf: the buffer an activation gate reads; sc: the
// row's scalars).
func holds(g mi.Gate, row int, ctl miCtl, buf, sc []float32) bool {
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

// applyMI runs ops in order on row x of row index row: each enabled op's template's
// reference (package mi), which matches the PTX bit for bit where the kernels promise that
// (steer_add, scale, head_ablate, patch).
func applyMI(ops []miBound, row int, ctl miCtl, x []float32) {
	for i := range ops {
		b := &ops[i]
		sc := b.scalars(row, ctl)
		if !b.enabled(row, ctl, sc) {
			continue
		}
		r := mi.Row{Op: &b.Op, X: x[:b.Width], Vec: b.vecAt(row, ctl), Scal: sc}
		if b.out != nil {
			r.Out = b.out[row*b.OutWidth+b.OutCol : (row+1)*b.OutWidth]
		}
		t, _ := mi.Lookup(b.Template) // Validate checked it
		b.fire(row, t.Ref(r))
	}
}

// MIKernelAttrs are the attributes of op "mi": MI ops applied in place to
// x[row*Stride+Offset : +Width] for every row of the grid.
type MIKernelAttrs struct {
	Width  int     `json:"width"`
	Stride int     `json:"stride"`
	Offset int     `json:"offset"`
	Ops    []mi.Op `json:"ops"`
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
