package ops

import (
	"fmt"
	"sync"
)

// CustomPTXAttrs are the attributes of op "custom_ptx": a user kernel given as PTX text in an
// app spec (see passes.CustomABI for its parameters). Go has no implementation of it, so its
// reference is the PTX itself, run by a CPU PTX executor.
type CustomPTXAttrs struct {
	PTX   string `json:"ptx"`
	Entry string `json:"entry"`
}

// PTXExecutor builds a Runner that executes entry of a PTX module on the CPU: it maps each
// pointer Arg to executor memory, runs the grid and copies the buffers back.
type PTXExecutor func(text, entry string) (Runner, error)

var (
	ptxMu   sync.RWMutex
	ptxExec PTXExecutor
)

// SetPTXExecutor installs the executor custom_ptx runs with. ops cannot import the emulator
// itself (the emulator's tests import ops), so the package that links both installs it.
func SetPTXExecutor(f PTXExecutor) {
	ptxMu.Lock()
	defer ptxMu.Unlock()
	ptxExec = f
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
		ptxMu.RLock()
		exec := ptxExec
		ptxMu.RUnlock()
		if exec == nil {
			return nil, fmt.Errorf("entry %s: no CPU PTX executor installed (link xmix/codegen)", a.Entry)
		}
		r, err := exec(a.PTX, a.Entry)
		if err != nil {
			return nil, fmt.Errorf("entry %s: %w", a.Entry, err)
		}
		return r, nil
	})
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
			if o != NoRow && (int(o)+1)*h > len(out) {
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
				if outRow[r] == NoRow {
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
