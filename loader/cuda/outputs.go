package cuda

import (
	"encoding/binary"
	"unsafe"

	"xmix/bundle"
)

// outCopy is one byte range of the output arena that a step copies back to the host: always
// (bit < 0), or only when some row of the step enables app bit bit.
//
// Why not the whole arena: an export buffer holds max_tokens rows (the largest prefill chunk),
// and "capture every layer" exports 32 x 4096 floats per row: 270 MB at Llama-3.1-8B sizes
// with 512-token chunks. Copying that every step made the host step of a bundle deploying it
// 1.8x the app-free one's with nothing enabled (H200, apps.sh grid, session 4). The engine reads an export only for
// the rows of a step whose app is on, and never more rows than the template has.
type outCopy struct {
	name       string
	off, bytes int64
	bit        int
	// askedBy, when set, is a control buffer of per-sample words: the copy is wanted only
	// when one of the template's samples has a word that is not 0 (out.logprobs, asked for
	// through ctl.logprobs).
	askedBy string
	samples int
}

// planOutCopies lists, per template, the output ranges a step of it may copy back: the first
// Tokens rows of each export and fired buffer under its app's bit, every other output buffer
// whole.
func planOutCopies(b *bundle.Bundle, out arena) [][]outCopy {
	type owner struct {
		bit      int
		rowBytes int64
	}
	owners := map[string]owner{}
	for _, a := range b.Manifest.Apps {
		for _, x := range a.Exports {
			owners[x.Buffer] = owner{bit: a.Bit, rowBytes: 4 * int64(x.Width)}
		}
		if a.FiredBuffer != "" {
			// Rows of a byte per counted site, in whole words (bundle.App.Fired).
			width := 0
			for _, f := range a.Fired {
				width = max(width, f.Column+1)
			}
			owners[a.FiredBuffer] = owner{bit: a.Bit, rowBytes: int64((width + 3) / 4 * 4)}
		}
	}
	plan := make([][]outCopy, len(b.Templates))
	for i, t := range b.Templates {
		for _, buf := range b.Manifest.Buffers {
			off, ok := out.offset[buf.Name]
			if !ok {
				continue
			}
			c := outCopy{name: buf.Name, off: off, bytes: out.sizes[buf.Name], bit: -1}
			if o, ok := owners[buf.Name]; ok {
				c.bit = o.bit
				c.bytes = min(c.bytes, int64(t.Tokens)*o.rowBytes)
			}
			if buf.Name == bundle.OutLogprobs && len(buf.Shape) == 2 {
				// Rows of the samples that ask (bundle.ModelConfig.Logprobs).
				c.askedBy, c.samples = bundle.CtlLogprobs, t.Samples
				c.bytes = min(c.bytes, int64(t.Samples)*4*int64(buf.Shape[1]))
			}
			plan[i] = append(plan[i], c)
		}
	}
	return plan
}

// wanted reports whether a step whose rows enable the apps of mask any copies c back;
// asked reads a control buffer's first words from the pinned mirror (askedBy).
func (c outCopy) wanted(any uint32, asked func(buf string, words int) bool) bool {
	if c.askedBy != "" {
		return asked(c.askedBy, c.samples)
	}
	return c.bit < 0 || any&(1<<uint(c.bit)) != 0
}

// askedFor says whether one of the first words of control buffer buf, as the host last
// wrote them, is not 0.
func (be *Backend) askedFor(buf string, words int) bool {
	off, ok := be.ctl.offset[buf]
	if !ok {
		return false
	}
	n := min(int64(4*words), be.ctl.sizes[buf])
	b := unsafe.Slice((*byte)(unsafe.Add(be.ctl.host, off)), n)
	for i := int64(0); i+4 <= n; i += 4 {
		if binary.LittleEndian.Uint32(b[i:]) != 0 {
			return true
		}
	}
	return false
}

// anyMask is the union of the apps the rows of the next step enable (ctl.any_mask, written by
// the engine before Step); 0 when the bundle deploys no apps.
func (be *Backend) anyMask() uint32 {
	off, ok := be.ctl.offset[bundle.CtlAnyMask]
	if !ok {
		return 0
	}
	return binary.LittleEndian.Uint32(unsafe.Slice((*byte)(unsafe.Add(be.ctl.host, off)), 4))
}
