// Package safetensors reads and writes the Hugging Face safetensors format: a u64
// little-endian header length N, N bytes of JSON header mapping tensor names to dtype, shape
// and data offsets (plus an optional "__metadata__" string map), then the raw tensor data.
// Parsing never copies tensor data, so a memory-mapped file is read in place.
package safetensors

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"sort"

	"xmix/input"
)

// Tensor is one named tensor. Data holds its elements little-endian, row-major.
type Tensor struct {
	Name  string
	Dtype string
	Shape []int
	Data  []byte
}

// File is a parsed safetensors file.
type File struct {
	Tensors  map[string]*Tensor
	Names    []string // sorted
	Metadata map[string]string
}

const metadataKey = "__metadata__"

// maxHeader bounds the JSON header (the reference implementation uses the same 100 MB), so a
// garbage length never makes Parse walk or decode an absurd header.
const maxHeader = 100 << 20

// dtypeSizes are the element sizes of the safetensors dtypes.
var dtypeSizes = map[string]int{
	"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1,
	"U16": 2, "I16": 2, "F16": 2, "BF16": 2,
	"U32": 4, "I32": 4, "F32": 4,
	"U64": 8, "I64": 8, "F64": 8,
}

// DtypeSize returns the byte size of one element of a safetensors dtype ("BF16", "F32", ...).
func DtypeSize(dtype string) (int, bool) {
	n, ok := dtypeSizes[dtype]
	return n, ok
}

// Elements is the number of elements: the product of the shape (1 for a scalar).
func (t *Tensor) Elements() int {
	n := 1
	for _, d := range t.Shape {
		n *= d
	}
	return n
}

type headerEntry struct {
	Dtype       string   `json:"dtype"`
	Shape       []int    `json:"shape"`
	DataOffsets []uint64 `json:"data_offsets"`
}

// Parse reads a safetensors file held in data. Tensor Data slices alias data. It checks that
// the header fits the file, every dtype is known, every tensor's byte range matches its shape
// and lies inside the data area, and no two tensors overlap.
func Parse(data []byte) (*File, error) {
	if len(data) < 8 {
		return nil, fmt.Errorf("safetensors file is truncated: %d bytes, fewer than the 8-byte header length", len(data))
	}
	n := binary.LittleEndian.Uint64(data)
	if n > maxHeader {
		return nil, fmt.Errorf("safetensors header length %d is over the %d-byte limit; the file is corrupt or not safetensors", n, maxHeader)
	}
	if n > uint64(len(data)-8) {
		return nil, fmt.Errorf("safetensors file is truncated: the header needs %d bytes but only %d follow its length", n, len(data)-8)
	}
	header := data[8 : 8+n]
	body := data[8+n:]

	var raw map[string]json.RawMessage
	if err := json.Unmarshal(header, &raw); err != nil {
		return nil, fmt.Errorf("safetensors header is not a JSON object: %w", err)
	}
	f := &File{Tensors: make(map[string]*Tensor, len(raw))}
	if m, ok := raw[metadataKey]; ok {
		if err := json.Unmarshal(m, &f.Metadata); err != nil {
			return nil, fmt.Errorf("safetensors %s is not a map of strings: %w", metadataKey, err)
		}
		delete(raw, metadataKey)
	}

	type span struct {
		name       string
		begin, end uint64
	}
	spans := make([]span, 0, len(raw))
	for name, msg := range raw {
		if name == "" {
			return nil, fmt.Errorf("safetensors header names a tensor \"\": every tensor needs a name; the file is corrupt")
		}
		var h headerEntry
		if err := json.Unmarshal(msg, &h); err != nil {
			return nil, fmt.Errorf("tensor %s: header entry is not valid: %w", name, err)
		}
		if err := checkEntry(&h, uint64(len(body))); err != nil {
			return nil, fmt.Errorf("tensor %s: %w", name, err)
		}
		begin, end := h.DataOffsets[0], h.DataOffsets[1]
		f.Tensors[name] = &Tensor{Name: name, Dtype: h.Dtype, Shape: h.Shape, Data: body[begin:end:end]}
		spans = append(spans, span{name, begin, end})
		f.Names = append(f.Names, name)
	}
	sort.Strings(f.Names)

	// Writers may pad between tensors for alignment, so gaps are fine; overlaps are not.
	// Ties on begin are broken by name so the reported pair does not depend on map order.
	slices.SortFunc(spans, func(a, b span) int {
		return cmp.Or(cmp.Compare(a.begin, b.begin), cmp.Compare(a.end, b.end), cmp.Compare(a.name, b.name))
	})
	for i := 1; i < len(spans); i++ {
		prev, cur := spans[i-1], spans[i]
		// Empty tensors own no bytes, so they cannot overlap anything.
		if cur.begin < prev.end && cur.begin != cur.end && prev.begin != prev.end {
			return nil, fmt.Errorf("tensor %s: data_offsets [%d, %d] overlap tensor %s at [%d, %d]",
				cur.name, cur.begin, cur.end, prev.name, prev.begin, prev.end)
		}
	}
	return f, nil
}

// checkEntry validates one header entry against a data area of bodyLen bytes.
func checkEntry(h *headerEntry, bodyLen uint64) error {
	size, ok := dtypeSizes[h.Dtype]
	if !ok {
		return fmt.Errorf("unknown dtype %q", h.Dtype)
	}
	if len(h.DataOffsets) != 2 {
		return fmt.Errorf("data_offsets has %d values, want [begin, end]", len(h.DataOffsets))
	}
	begin, end := h.DataOffsets[0], h.DataOffsets[1]
	if begin > end {
		return fmt.Errorf("data_offsets [%d, %d] end before they begin", begin, end)
	}
	if end > bodyLen {
		return fmt.Errorf("data_offsets [%d, %d] reach past the data area of %d bytes; the file is truncated or its header lies",
			begin, end, bodyLen)
	}
	// The byte count is bounded by bodyLen, so a shape needing more is wrong whatever its
	// product: stop multiplying there instead of overflowing.
	need := uint64(size)
	for _, d := range h.Shape {
		if d < 0 {
			return fmt.Errorf("shape %v has a negative dimension", h.Shape)
		}
		if need != 0 && uint64(d) > bodyLen/need {
			return fmt.Errorf("data_offsets [%d, %d] but shape %v of %s needs more than the whole data area of %d bytes",
				begin, end, h.Shape, h.Dtype, bodyLen)
		}
		need *= uint64(d)
	}
	if need != end-begin {
		return fmt.Errorf("data_offsets [%d, %d] but shape %v of %s needs %d bytes", begin, end, h.Shape, h.Dtype, need)
	}
	return nil
}

// WriteFile writes tensors as the safetensors file path (Write), creating or replacing it.
func WriteFile(path string, tensors []Tensor, metadata map[string]string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := Write(f, tensors, metadata); err != nil {
		f.Close()
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return f.Close()
}

// FromF32 is an F32 tensor holding v in the given shape.
func FromF32(name string, v []float32, shape ...int) Tensor {
	data := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(data[4*i:], math.Float32bits(x))
	}
	return Tensor{Name: name, Dtype: "F32", Shape: shape, Data: data}
}

// Write writes tensors as a safetensors file. The output is deterministic: tensors are laid
// out in name order, each starting at an 8-byte-aligned offset (zero padding between), and the
// header is padded with spaces so the data area starts 8-byte aligned in the file. Tensors
// whose byte size is a multiple of 8 leave no gaps, which is what strict readers (the
// reference Rust implementation rejects gaps) need.
func Write(w io.Writer, tensors []Tensor, metadata map[string]string) error {
	sorted := make([]*Tensor, len(tensors))
	for i := range tensors {
		sorted[i] = &tensors[i]
	}
	slices.SortFunc(sorted, func(a, b *Tensor) int { return cmp.Compare(a.Name, b.Name) })

	header := make(map[string]any, len(tensors)+1)
	if len(metadata) > 0 {
		header[metadataKey] = metadata
	}
	var offset uint64
	for i, t := range sorted {
		if t.Name == "" || t.Name == metadataKey {
			return fmt.Errorf("write safetensors: tensor name %q is reserved or empty", t.Name)
		}
		if i > 0 && sorted[i-1].Name == t.Name {
			return fmt.Errorf("write safetensors: tensor %s appears twice", t.Name)
		}
		size, ok := dtypeSizes[t.Dtype]
		if !ok {
			return fmt.Errorf("write safetensors: tensor %s: unknown dtype %q", t.Name, t.Dtype)
		}
		for _, d := range t.Shape {
			if d < 0 {
				return fmt.Errorf("write safetensors: tensor %s: shape %v has a negative dimension", t.Name, t.Shape)
			}
		}
		if want := t.Elements() * size; len(t.Data) != want {
			return fmt.Errorf("write safetensors: tensor %s: %d data bytes but shape %v of %s needs %d",
				t.Name, len(t.Data), t.Shape, t.Dtype, want)
		}
		offset = align8(offset)
		shape := t.Shape
		if shape == nil {
			shape = []int{}
		}
		header[t.Name] = headerEntry{Dtype: t.Dtype, Shape: shape, DataOffsets: []uint64{offset, offset + uint64(len(t.Data))}}
		offset += uint64(len(t.Data))
	}
	js, err := json.Marshal(header) // map keys come out sorted
	if err != nil {
		return fmt.Errorf("write safetensors: header: %w", err)
	}
	js = append(js, bytes.Repeat([]byte{' '}, int(align8(uint64(len(js)))-uint64(len(js))))...)

	// Tensor data is written straight from the caller's slices: weights files are large.
	head := binary.LittleEndian.AppendUint64(make([]byte, 0, 8+len(js)), uint64(len(js)))
	if _, err := w.Write(append(head, js...)); err != nil {
		return fmt.Errorf("write safetensors: %w", err)
	}
	var pad [8]byte
	var at uint64
	for _, t := range sorted {
		if p := align8(at) - at; p > 0 {
			if _, err := w.Write(pad[:p]); err != nil {
				return fmt.Errorf("write safetensors: %w", err)
			}
			at += p
		}
		if _, err := w.Write(t.Data); err != nil {
			return fmt.Errorf("write safetensors: tensor %s: %w", t.Name, err)
		}
		at += uint64(len(t.Data))
	}
	return nil
}

func align8(n uint64) uint64 { return (n + 7) &^ 7 }

// Float32s converts the tensor's elements to float32. BF16 and F16 widen exactly; F32 is
// copied, so the result never aliases Data.
func (t *Tensor) Float32s() ([]float32, error) {
	size, ok := dtypeSizes[t.Dtype]
	if !ok {
		return nil, fmt.Errorf("tensor %s: unknown dtype %q", t.Name, t.Dtype)
	}
	n := t.Elements()
	if len(t.Data) != n*size {
		return nil, fmt.Errorf("tensor %s: %d data bytes but shape %v of %s needs %d", t.Name, len(t.Data), t.Shape, t.Dtype, n*size)
	}
	out := make([]float32, n)
	switch t.Dtype {
	case "F32":
		for i := range out {
			out[i] = math.Float32frombits(binary.LittleEndian.Uint32(t.Data[4*i:]))
		}
	case "BF16":
		for i := range out {
			out[i] = math.Float32frombits(uint32(binary.LittleEndian.Uint16(t.Data[2*i:])) << 16)
		}
	case "F16":
		for i := range out {
			out[i] = F16ToF32(binary.LittleEndian.Uint16(t.Data[2*i:]))
		}
	default:
		return nil, fmt.Errorf("tensor %s: cannot convert %s to float32 (want BF16, F16 or F32)", t.Name, t.Dtype)
	}
	return out, nil
}

// F16ToF32 widens an IEEE half-precision bit pattern exactly, subnormals, infinities and
// NaN payloads included.
func F16ToF32(h uint16) float32 {
	sign := uint32(h>>15) << 31
	exp := uint32(h>>10) & 0x1f
	mant := uint32(h) & 0x3ff
	switch {
	case exp == 0x1f: // inf or NaN
		return math.Float32frombits(sign | 0xff<<23 | mant<<13)
	case exp != 0: // normal
		return math.Float32frombits(sign | (exp+127-15)<<23 | mant<<13)
	case mant == 0:
		return math.Float32frombits(sign)
	}
	// Subnormal: shift the mantissa up until its leading one becomes the implicit bit.
	e := uint32(127 - 15 + 1)
	for mant&0x400 == 0 {
		mant <<= 1
		e--
	}
	return math.Float32frombits(sign | e<<23 | (mant&0x3ff)<<13)
}

// Open maps the file at path read-only and parses it; tensor Data aliases the mapping, so
// opening a multi-gigabyte weights file costs no copy. Where mapping is unavailable the file is
// read into memory instead. The Closer releases the mapping: Data must not be used after
// Close. As with any mapping, another process truncating the file makes reads fault.
func Open(path string) (*File, io.Closer, error) {
	data, unmap, err := mapFile(path)
	if err != nil {
		return nil, nil, fmt.Errorf("open safetensors %s: %w", path, err)
	}
	f, err := Parse(data)
	if err != nil {
		if unmap != nil {
			_ = unmap() // the parse error is the one worth reporting
		}
		return nil, nil, fmt.Errorf("%s: %w", path, err)
	}
	return f, &closer{unmap: unmap}, nil
}

type closer struct {
	unmap  func() error
	closed bool
}

func (c *closer) Close() error {
	if c.closed {
		return errors.New("safetensors: file already closed")
	}
	c.closed = true
	if c.unmap == nil {
		return nil
	}
	return c.unmap()
}

// readWhole is the fallback when a file cannot be mapped.
func readWhole(path string) ([]byte, func() error, error) {
	data, err := input.Read(path, input.Weights)
	return data, nil, err
}
