package bundle

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/klauspost/compress/zstd"

	"xmix/input"
)

// FormatVersion is the .xmb layout this package reads and writes. Any change to the layout or
// to the meaning of a section's content bumps it, so an old runtime never misreads a new file.
const FormatVersion = 1

// File layout (little-endian throughout):
//
//	magic "XMIXBNDL" | u32 version | u32 section count
//	table of contents: per section
//	    name [16]byte (zero padded) | offset u64 | compressed length u64 |
//	    uncompressed length u64 | sha256 of the uncompressed bytes [32]byte
//	sections, zstd frames, back to back in table order
//	trailer: sha256 of every byte before it
const (
	magic        = "XMIXBNDL"
	headerSize   = 8 + 4 + 4
	nameSize     = 16
	tocEntrySize = nameSize + 3*8 + sha256.Size
	trailerSize  = sha256.Size
)

// Section caps bound what a reader allocates for a section, whatever its table of contents
// claims; a writer refuses content over them so it never writes a bundle readers refuse.
const (
	smallSectionCap   = 1 << 30
	weightsSectionCap = 64 << 30
)

// encoderWindow fixes the zstd window so output does not depend on library defaults, and
// bounds the history a reader must keep.
const encoderWindow = 8 << 20

type sectionSpec struct {
	name     string
	required bool
	cap      uint64
}

// sections lists every section in the order Write emits them.
var sections = []sectionSpec{
	{"manifest", true, smallSectionCap},
	{"kernels", true, smallSectionCap},
	{"templates", true, smallSectionCap},
	{"params", true, smallSectionCap},
	{"tokenizer", true, smallSectionCap},
	{"weights", false, weightsSectionCap},
}

func sectionByName(name string) (sectionSpec, bool) {
	for _, s := range sections {
		if s.name == name {
			return s, true
		}
	}
	return sectionSpec{}, false
}

// VersionError reports a bundle written in another format version; callers can tell it apart
// from corruption and ask for a rebuild.
type VersionError struct{ Got uint32 }

func (e *VersionError) Error() string {
	return fmt.Sprintf("bundle format version %d, this xmix reads version %d: rebuild the bundle with this xmixc",
		e.Got, FormatVersion)
}

// Marshal encodes b as an .xmb file. The output depends only on b's content: equal bundles
// give identical bytes (kernel attributes are canonicalised, so their key order does not matter).
// b must pass Verify, so no reader ever meets a bundle its writer knew to be broken.
func Marshal(b *Bundle) ([]byte, error) {
	if b == nil {
		return nil, errors.New("write bundle: nil bundle")
	}
	if err := Verify(b); err != nil {
		return nil, fmt.Errorf("write bundle: %w", err)
	}
	payloads, err := encodeSections(b)
	if err != nil {
		return nil, fmt.Errorf("write bundle: %w", err)
	}
	return assemble(payloads)
}

// assemble compresses the payloads and lays out the file.
func assemble(payloads []payload) ([]byte, error) {
	enc, err := zstd.NewWriter(nil,
		zstd.WithEncoderConcurrency(1),
		zstd.WithEncoderLevel(zstd.SpeedDefault),
		zstd.WithWindowSize(encoderWindow),
		zstd.WithZeroFrames(true))
	if err != nil {
		return nil, fmt.Errorf("write bundle: zstd encoder: %w", err)
	}
	defer enc.Close()

	compressed := make([][]byte, len(payloads))
	size := headerSize + len(payloads)*tocEntrySize + trailerSize
	for i, p := range payloads {
		compressed[i] = enc.EncodeAll(p.data, nil)
		size += len(compressed[i])
	}
	out := make([]byte, 0, size)
	out = append(out, magic...)
	out = binary.LittleEndian.AppendUint32(out, FormatVersion)
	out = binary.LittleEndian.AppendUint32(out, uint32(len(payloads)))
	offset := uint64(headerSize + len(payloads)*tocEntrySize)
	for i, p := range payloads {
		var name [nameSize]byte
		copy(name[:], p.name)
		sum := sha256.Sum256(p.data)
		out = append(out, name[:]...)
		out = binary.LittleEndian.AppendUint64(out, offset)
		out = binary.LittleEndian.AppendUint64(out, uint64(len(compressed[i])))
		out = binary.LittleEndian.AppendUint64(out, uint64(len(p.data)))
		out = append(out, sum[:]...)
		offset += uint64(len(compressed[i]))
	}
	for _, c := range compressed {
		out = append(out, c...)
	}
	sum := sha256.Sum256(out)
	return append(out, sum[:]...), nil
}

// Write writes b to w as an .xmb file; see Marshal.
func Write(w io.Writer, b *Bundle) error {
	data, err := Marshal(b)
	if err != nil {
		return err
	}
	if _, err := w.Write(data); err != nil {
		return fmt.Errorf("write bundle: %w", err)
	}
	return nil
}

type payload struct {
	name string
	data []byte
}

func encodeSections(b *Bundle) ([]payload, error) {
	manifest, err := json.Marshal(b.Manifest)
	if err != nil {
		return nil, fmt.Errorf("section manifest: %w", err)
	}
	kernels := make([]Kernel, len(b.Kernels))
	for i, k := range b.Kernels {
		attrs, err := canonicalJSON(k.Attrs)
		if err != nil {
			return nil, fmt.Errorf("kernel %d (%s): attrs: %w", i, k.Name, err)
		}
		k.Attrs = attrs
		kernels[i] = k
	}
	kernelJSON, err := json.Marshal(kernels)
	if err != nil {
		return nil, fmt.Errorf("section kernels: %w", err)
	}
	templates, err := json.Marshal(b.Templates)
	if err != nil {
		return nil, fmt.Errorf("section templates: %w", err)
	}
	out := []payload{
		{"manifest", manifest},
		{"kernels", kernelJSON},
		{"templates", templates},
		{"params", b.Params},
		{"tokenizer", b.Tokenizer},
	}
	if len(b.Weights) > 0 {
		out = append(out, payload{"weights", b.Weights})
	}
	for _, p := range out {
		spec, _ := sectionByName(p.name)
		if uint64(len(p.data)) > spec.cap {
			return nil, fmt.Errorf("section %s is %d bytes, over the %d-byte limit readers accept",
				p.name, len(p.data), spec.cap)
		}
	}
	return out, nil
}

// canonicalJSON re-encodes a JSON value with sorted object keys and no insignificant space,
// keeping numbers as written, so attribute order in the producer never changes the bundle.
// An empty or null value becomes nil.
func canonicalJSON(raw json.RawMessage) (json.RawMessage, error) {
	if len(bytes.TrimSpace(raw)) == 0 {
		return nil, nil
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, fmt.Errorf("invalid JSON: %w", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("invalid JSON: data after the value")
	}
	if v == nil {
		return nil, nil
	}
	return json.Marshal(v)
}

// ReadFile reads and fully checks the bundle at path.
func ReadFile(path string) (*Bundle, error) {
	data, err := input.Read(path, input.Bundle)
	if err != nil {
		return nil, fmt.Errorf("read bundle: %w", err)
	}
	b, err := Unmarshal(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return b, nil
}

// Read reads a whole bundle from r and checks it; see Unmarshal.
func Read(r io.Reader) (*Bundle, error) {
	data, err := io.ReadAll(r)
	if err != nil {
		return nil, fmt.Errorf("read bundle: %w", err)
	}
	return Unmarshal(data)
}

// tocEntry is one parsed table-of-contents row.
type tocEntry struct {
	spec       sectionSpec
	offset     uint64
	compressed uint64
	raw        uint64
	sum        [sha256.Size]byte
}

// Unmarshal decodes an .xmb file and checks everything: layout, trailer checksum, each
// section's size and hash, JSON content, and Verify's cross-references. Sections that are
// empty come back as nil slices. The returned bundle does not alias data.
func Unmarshal(data []byte) (*Bundle, error) {
	toc, err := parseLayout(data)
	if err != nil {
		return nil, err
	}
	raw := map[string][]byte{}
	for _, e := range toc {
		content, err := decodeSection(data, e)
		if err != nil {
			return nil, err
		}
		raw[e.spec.name] = content
	}
	b := &Bundle{}
	if err := decodeJSON("manifest", raw["manifest"], &b.Manifest); err != nil {
		return nil, err
	}
	if err := decodeJSON("kernels", raw["kernels"], &b.Kernels); err != nil {
		return nil, err
	}
	for i := range b.Kernels {
		if string(b.Kernels[i].Attrs) == "null" {
			b.Kernels[i].Attrs = nil
		}
	}
	if err := decodeJSON("templates", raw["templates"], &b.Templates); err != nil {
		return nil, err
	}
	b.Params = nilIfEmpty(raw["params"])
	b.Tokenizer = nilIfEmpty(raw["tokenizer"])
	b.Weights = nilIfEmpty(raw["weights"])
	if err := Verify(b); err != nil {
		return nil, fmt.Errorf("%w; rebuild the bundle", err)
	}
	return b, nil
}

func nilIfEmpty(b []byte) []byte {
	if len(b) == 0 {
		return nil
	}
	return b
}

const truncatedHint = "the file was cut short — copy it again or rebuild it"
const corruptHint = "the file is corrupt — copy it again or rebuild it"

// parseLayout checks the header, the table of contents, that sections tile the file exactly,
// and the trailer checksum. It only reads bytes inside data and allocates nothing in
// proportion to what the file claims.
func parseLayout(data []byte) ([]tocEntry, error) {
	size := uint64(len(data))
	if size < uint64(len(magic)) {
		return nil, fmt.Errorf("not an xmix bundle: the file has %d bytes, fewer than the %d-byte magic", size, len(magic))
	}
	if string(data[:len(magic)]) != magic {
		return nil, fmt.Errorf("not an xmix bundle: it starts with %q instead of %q", data[:len(magic)], magic)
	}
	if size < headerSize {
		return nil, fmt.Errorf("bundle is truncated: the header needs %d bytes but the file has %d bytes; %s",
			headerSize, size, truncatedHint)
	}
	if v := binary.LittleEndian.Uint32(data[8:]); v != FormatVersion {
		return nil, &VersionError{Got: v}
	}
	count := uint64(binary.LittleEndian.Uint32(data[12:]))
	if count == 0 || count > uint64(len(sections)) {
		return nil, fmt.Errorf("bundle header declares %d sections but a bundle has at most %d; %s",
			count, len(sections), corruptHint)
	}
	tocEnd := headerSize + count*tocEntrySize
	if tocEnd > size {
		return nil, fmt.Errorf("bundle is truncated: the table of contents ends at byte %d but the file has %d bytes; %s",
			tocEnd, size, truncatedHint)
	}

	toc := make([]tocEntry, 0, count)
	seen := map[string]bool{}
	next := tocEnd // where the next section must start: sections are back to back
	for i := range count {
		row := data[headerSize+i*tocEntrySize : headerSize+(i+1)*tocEntrySize]
		name, err := sectionName(row[:nameSize])
		if err != nil {
			return nil, fmt.Errorf("bundle table of contents entry %d: %w; %s", i, err, corruptHint)
		}
		spec, ok := sectionByName(name)
		if !ok {
			return nil, fmt.Errorf("bundle table of contents entry %d names unknown section %q (sections are %s); the file is corrupt or was written by a newer xmixc — rebuild it",
				i, name, sectionNames())
		}
		if seen[name] {
			return nil, fmt.Errorf("section %s appears twice in the bundle table of contents; %s", name, corruptHint)
		}
		seen[name] = true
		e := tocEntry{
			spec:       spec,
			offset:     binary.LittleEndian.Uint64(row[nameSize:]),
			compressed: binary.LittleEndian.Uint64(row[nameSize+8:]),
			raw:        binary.LittleEndian.Uint64(row[nameSize+16:]),
		}
		copy(e.sum[:], row[nameSize+24:])
		if e.offset != next {
			return nil, fmt.Errorf("section %s starts at byte %d but the data before it ends at byte %d; the table of contents is corrupt — rebuild the bundle",
				name, e.offset, next)
		}
		if e.compressed > ^uint64(0)-e.offset {
			return nil, fmt.Errorf("section %s declares %d compressed bytes, more than any file holds; %s",
				name, e.compressed, corruptHint)
		}
		// size >= tocEnd > trailerSize, so size-trailerSize does not wrap.
		if end := e.offset + e.compressed; end > size-trailerSize {
			return nil, fmt.Errorf("bundle is truncated: section %s ends at byte %d but the file has %d bytes before its %d-byte checksum; %s",
				name, end, size-trailerSize, trailerSize, truncatedHint)
		}
		if e.raw > spec.cap {
			return nil, fmt.Errorf("section %s declares %d uncompressed bytes, over the %d-byte limit for that section; %s",
				name, e.raw, spec.cap, corruptHint)
		}
		next = e.offset + e.compressed
		toc = append(toc, e)
	}
	for _, s := range sections {
		if s.required && !seen[s.name] {
			return nil, fmt.Errorf("bundle has no %s section; the file is corrupt or was written by an incompatible xmixc — rebuild it", s.name)
		}
	}
	if want := next + trailerSize; want != size {
		if want > size {
			return nil, fmt.Errorf("bundle is truncated: its checksum ends at byte %d but the file has %d bytes; %s",
				want, size, truncatedHint)
		}
		return nil, fmt.Errorf("bundle has %d stray bytes after its checksum; %s", size-want, corruptHint)
	}
	if sum := sha256.Sum256(data[:next]); !bytes.Equal(sum[:], data[next:]) {
		return nil, fmt.Errorf("bundle checksum mismatch: the file was damaged in storage or transfer — copy it again or rebuild it")
	}
	return toc, nil
}

func sectionName(field []byte) (string, error) {
	name, pad, _ := bytes.Cut(field, []byte{0})
	if len(name) == 0 {
		return "", errors.New("empty section name")
	}
	if len(bytes.Trim(pad, "\x00")) != 0 {
		return "", fmt.Errorf("section name field %q has bytes after its terminator", field)
	}
	for _, c := range name {
		if c < 'a' || c > 'z' {
			return "", fmt.Errorf("section name %q is not lower-case letters", name)
		}
	}
	return string(name), nil
}

// decodeSection decompresses one section within its declared size and checks its hash.
func decodeSection(data []byte, e tocEntry) ([]byte, error) {
	name := e.spec.name
	// The declared size (already capped) bounds the output, so a frame claiming more fails
	// before anything is allocated for it. The decoder also applies the memory bound to the
	// window, which zstd rounds up past small contents, hence the floor at encoderWindow.
	dec, err := zstd.NewReader(nil,
		zstd.WithDecoderConcurrency(1),
		zstd.WithDecoderMaxMemory(max(e.raw, encoderWindow)),
		zstd.WithDecoderMaxWindow(encoderWindow))
	if err != nil {
		return nil, fmt.Errorf("section %s: zstd decoder: %w", name, err)
	}
	defer dec.Close()
	content, err := dec.DecodeAll(data[e.offset:e.offset+e.compressed], nil)
	if err != nil {
		return nil, fmt.Errorf("section %s does not decompress (%v); %s", name, err, corruptHint)
	}
	if uint64(len(content)) != e.raw {
		return nil, fmt.Errorf("section %s decompresses to %d bytes but the table of contents says %d; %s",
			name, len(content), e.raw, corruptHint)
	}
	if sha256.Sum256(content) != e.sum {
		return nil, fmt.Errorf("section %s: its content does not match its sha256 in the table of contents; %s", name, corruptHint)
	}
	return content, nil
}

// decodeJSON decodes a JSON section strictly: unknown fields mean the writer and this reader
// disagree about the format, which a version bump should have caught.
func decodeJSON(name string, data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("section %s is not valid: %w; the file is corrupt or was written by an incompatible xmixc — rebuild it", name, err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return fmt.Errorf("section %s has data after its JSON value; %s", name, corruptHint)
	}
	return nil
}

// sectionNames lists the section names, for messages.
func sectionNames() string {
	names := make([]string, len(sections))
	for i, s := range sections {
		names[i] = s.name
	}
	return strings.Join(names, ", ")
}
