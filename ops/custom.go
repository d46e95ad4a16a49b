package ops

import (
	"fmt"

	"xmix/bundle"
	"xmix/ptx"
	"xmix/ptx/emu"
)

// CustomPTXAttrs are the attributes of op "custom_ptx": a user kernel given as PTX text in an
// app spec (see passes.CustomABI for its parameters). Go has no implementation of it, so its
// reference is the PTX itself, run in the PTX emulator.
type CustomPTXAttrs struct {
	PTX   string `json:"ptx"`
	Entry string `json:"entry"`
}

func init() {
	Register("custom_ptx", func(attrs []byte) (Runner, error) {
		var a CustomPTXAttrs
		if err := DecodeAttrs(attrs, &a); err != nil {
			return nil, err
		}
		if a.PTX == "" || a.Entry == "" {
			return nil, fmt.Errorf("custom kernel without PTX text or entry")
		}
		m, err := ptx.Parse(a.PTX)
		if err != nil {
			return nil, fmt.Errorf("entry %s: %w", a.Entry, err)
		}
		if m.Kernel(a.Entry) == nil {
			return nil, fmt.Errorf("entry %s: no .entry %s", a.Entry, a.Entry)
		}
		return &emuRunner{mod: m, entry: a.Entry}, nil
	})
}

// emuRunner runs a PTX entry in the emulator on the CPU backend's buffers.
type emuRunner struct {
	mod   *ptx.Module
	entry string
}

// Run copies every pointer argument into emulator memory, runs the grid, and copies them
// back. Arguments that start at the same address share one copy, so a buffer bound twice
// sees its own writes.
func (r *emuRunner) Run(args []Arg, l Launch) error {
	k := r.mod.Kernel(r.entry)
	if len(args) != len(k.Params) {
		return fmt.Errorf("custom %s: %d arguments, want %d", r.entry, len(args), len(k.Params))
	}
	mem := emu.NewMemory()
	params := make([]uint64, len(args))
	owner := make([]int, len(args)) // index of the argument whose copy this one uses; -1: scalar
	for i, a := range args {
		owner[i] = -1
		if a.Mem == nil {
			params[i] = a.Bits
			continue
		}
		owner[i] = i
		for j := range i {
			if owner[j] >= 0 && len(args[j].Mem) == len(a.Mem) && (len(a.Mem) == 0 || &args[j].Mem[0] == &a.Mem[0]) {
				owner[i], params[i] = j, params[j]
				break
			}
		}
		if owner[i] == i {
			params[i] = mem.Alloc(len(a.Mem))
			copy(mem.Bytes(params[i]), a.Mem)
		}
	}
	if err := emu.Run(r.mod, r.entry, emu.Launch{Grid: l.Grid, Block: l.Block}, mem, params); err != nil {
		return fmt.Errorf("custom %s: %w", r.entry, err)
	}
	for i, a := range args {
		if owner[i] == i {
			copy(a.Mem, mem.Bytes(params[i]))
		}
	}
	return nil
}

// RenormAttrs are the attributes of op "row_renorm": RMSNorm the residual rows into out, as
// row_norm does after its add, for a residual that a custom kernel changed after row_norm ran.
// Parameters: resid, w, out, [out_row] (Gather: out_row[row] picks the output row, NoRow skips).
type RenormAttrs struct {
	Hidden int     `json:"hidden"`
	Eps    float32 `json:"eps"`
	WDtype string  `json:"wdtype"` // f32 | bf16
	Gather bool    `json:"gather,omitempty"`
	// WOffset is added to every weight, as in row_norm.
	WOffset float32 `json:"w_offset,omitempty"`
}

func init() {
	Register("row_renorm", func(attrs []byte) (Runner, error) {
		var a RenormAttrs
		if err := DecodeAttrs(attrs, &a); err != nil {
			return nil, err
		}
		if err := checkRow(a.Hidden, a.WDtype); err != nil {
			return nil, err
		}
		return named("row_renorm", a.run), nil
	})
}

func (a RenormAttrs) run(args []Arg, l Launch) error {
	rows, h := l.Grid[0], a.Hidden
	wsize, err := dtypeSize(a.WDtype)
	if err != nil {
		return err
	}
	c := &argCursor{args: args}
	resid, err := c.take("resid", 4*rows*h)
	if err != nil {
		return err
	}
	wArg, err := c.take("w", wsize*h)
	if err != nil {
		return err
	}
	w := viewWeights(a.WDtype, wArg)
	outArg, err := c.take("out", 0)
	if err != nil {
		return err
	}
	out := outArg.F32()
	var outRow []uint32
	if a.Gather {
		o, err := c.take("out_row", 4*rows)
		if err != nil {
			return err
		}
		outRow = o.U32()
		for r, o := range outRow[:rows] {
			if o != bundle.NoRow && (int(o)+1)*h > len(out) {
				return fmt.Errorf("out_row[%d] = %d, but out holds %d rows", r, o, len(out)/h)
			}
		}
	} else if len(out) < rows*h {
		return fmt.Errorf("out holds %d bytes, needs %d", len(outArg.Mem), 4*rows*h)
	}
	if err := c.done(); err != nil {
		return err
	}
	rs := resid.F32()
	ParallelFor(rows, func(lo, hi int) {
		x := make([]float32, h)
		for r := lo; r < hi; r++ {
			o := r
			if a.Gather {
				if outRow[r] == bundle.NoRow {
					continue
				}
				o = int(outRow[r])
			}
			copy(x, rs[r*h:(r+1)*h])
			rmsNorm(x, w, a.Eps, a.WOffset)
			copy(out[o*h:], x)
		}
	})
	return nil
}
