package safetensors

import (
	"bytes"
	"encoding/binary"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func f32Bytes(vs ...float32) []byte {
	out := make([]byte, 0, 4*len(vs))
	for _, v := range vs {
		out = binary.LittleEndian.AppendUint32(out, math.Float32bits(v))
	}
	return out
}

func u16Bytes(vs ...uint16) []byte {
	out := make([]byte, 0, 2*len(vs))
	for _, v := range vs {
		out = binary.LittleEndian.AppendUint16(out, v)
	}
	return out
}

func testTensors() []Tensor {
	return []Tensor{
		{Name: "model.norm.weight", Dtype: "BF16", Shape: []int{3}, Data: u16Bytes(0x3f80, 0xc000, 0x3e80)},
		{Name: "a.f32", Dtype: "F32", Shape: []int{2, 2}, Data: f32Bytes(1, -2, 0.5, 3e10)},
		{Name: "b.f16", Dtype: "F16", Shape: []int{2}, Data: u16Bytes(0x3c00, 0xc100)},
		{Name: "c.bytes", Dtype: "U8", Shape: []int{3}, Data: []byte{1, 2, 3}},
		{Name: "d.scalar", Dtype: "I32", Shape: []int{}, Data: []byte{7, 0, 0, 0}},
		{Name: "e.empty", Dtype: "F32", Shape: []int{0, 4}, Data: []byte{}},
	}
}

func mustWrite(t testing.TB, tensors []Tensor, meta map[string]string) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := Write(&buf, tensors, meta); err != nil {
		t.Fatalf("Write: %v", err)
	}
	return buf.Bytes()
}

// rawFile builds a file from a literal header, for tests of headers Write never produces.
func rawFile(header string, body []byte) []byte {
	out := binary.LittleEndian.AppendUint64(nil, uint64(len(header)))
	return append(append(out, header...), body...)
}

func TestRoundTrip(t *testing.T) {
	meta := map[string]string{"format": "pt", "source": "test"}
	data := mustWrite(t, testTensors(), meta)
	f, err := Parse(data)
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	want := []string{"a.f32", "b.f16", "c.bytes", "d.scalar", "e.empty", "model.norm.weight"}
	if !reflect.DeepEqual(f.Names, want) {
		t.Fatalf("Names %v, want %v", f.Names, want)
	}
	if !reflect.DeepEqual(f.Metadata, meta) {
		t.Fatalf("Metadata %v, want %v", f.Metadata, meta)
	}
	for _, in := range testTensors() {
		got := f.Tensors[in.Name]
		if got == nil {
			t.Fatalf("tensor %s missing", in.Name)
		}
		if got.Dtype != in.Dtype || !reflect.DeepEqual(got.Shape, in.Shape) || !bytes.Equal(got.Data, in.Data) {
			t.Errorf("tensor %s: got %+v, want %+v", in.Name, got, in)
		}
	}

	// Data aliases the input and every tensor starts 8-byte aligned in the file.
	hdr := binary.LittleEndian.Uint64(data)
	if (8+hdr)%8 != 0 {
		t.Errorf("data area starts at byte %d, not 8-aligned", 8+hdr)
	}
	for _, name := range f.Names {
		tn := f.Tensors[name]
		if len(tn.Data) == 0 {
			continue
		}
		off := bytes.Index(data, tn.Data) // the test data are distinct enough to find
		if &data[off] != &tn.Data[0] {
			t.Errorf("tensor %s: Data does not alias the input", name)
		}
		if off%8 != 0 {
			t.Errorf("tensor %s starts at byte %d, not 8-aligned", name, off)
		}
	}
}

func TestWriteDeterministic(t *testing.T) {
	a := mustWrite(t, testTensors(), map[string]string{"x": "1", "y": "2", "z": "3"})
	rev := testTensors()
	for i, j := 0, len(rev)-1; i < j; i, j = i+1, j-1 {
		rev[i], rev[j] = rev[j], rev[i]
	}
	b := mustWrite(t, rev, map[string]string{"z": "3", "y": "2", "x": "1"})
	if !bytes.Equal(a, b) {
		t.Fatal("the same tensors in another order gave different bytes")
	}
}

func TestWriteErrors(t *testing.T) {
	cases := []struct {
		name    string
		tensors []Tensor
		want    string
	}{
		{"duplicate", []Tensor{{Name: "w", Dtype: "U8", Shape: []int{1}, Data: []byte{1}}, {Name: "w", Dtype: "U8", Shape: []int{1}, Data: []byte{2}}}, "tensor w appears twice"},
		{"dtype", []Tensor{{Name: "w", Dtype: "Q4", Shape: []int{1}, Data: []byte{1}}}, `unknown dtype "Q4"`},
		{"size", []Tensor{{Name: "w", Dtype: "F32", Shape: []int{2}, Data: []byte{1}}}, "1 data bytes but shape [2] of F32 needs 8"},
		{"negative", []Tensor{{Name: "w", Dtype: "F32", Shape: []int{-1}, Data: nil}}, "negative dimension"},
		{"reserved", []Tensor{{Name: "__metadata__", Dtype: "U8", Shape: []int{1}, Data: []byte{1}}}, "reserved or empty"},
	}
	for _, c := range cases {
		err := Write(&bytes.Buffer{}, c.tensors, nil)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want it to contain %q", c.name, err, c.want)
		}
	}
}

func TestParseErrors(t *testing.T) {
	body := make([]byte, 1024)
	cases := []struct {
		name string
		data []byte
		want string
	}{
		{"shorter than length", []byte{1, 2, 3}, "truncated: 3 bytes"},
		{"header past end", rawFile(`{}`, nil)[:9], "the header needs 2 bytes but only 1 follow"},
		{"header over limit", binary.LittleEndian.AppendUint64(nil, 1<<40), "over the 104857600-byte limit"},
		{"not JSON", rawFile(`{"a":`, nil), "header is not a JSON object"},
		{"not an object", rawFile(`[1,2]`, nil), "header is not a JSON object"},
		{"bad dtype", rawFile(`{"w":{"dtype":"Q4_K","shape":[2],"data_offsets":[0,2]}}`, body), `tensor w: unknown dtype "Q4_K"`},
		{"size mismatch", rawFile(`{"model.norm.weight":{"dtype":"BF16","shape":[256],"data_offsets":[0,1024]}}`, body),
			"tensor model.norm.weight: data_offsets [0, 1024] but shape [256] of BF16 needs 512 bytes"},
		{"header lies about offsets", rawFile(`{"w":{"dtype":"F32","shape":[512],"data_offsets":[0,2048]}}`, body),
			"tensor w: data_offsets [0, 2048] reach past the data area of 1024 bytes"},
		{"reversed offsets", rawFile(`{"w":{"dtype":"U8","shape":[0],"data_offsets":[8,4]}}`, body), "end before they begin"},
		{"three offsets", rawFile(`{"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1,2]}}`, body), "data_offsets has 3 values"},
		{"negative offset", rawFile(`{"w":{"dtype":"U8","shape":[1],"data_offsets":[-1,0]}}`, body), "tensor w: header entry is not valid"},
		{"negative dim", rawFile(`{"w":{"dtype":"U8","shape":[-2,-3],"data_offsets":[0,6]}}`, body), "negative dimension"},
		{"overflowing shape", rawFile(`{"w":{"dtype":"F32","shape":[4294967296,4294967296,16],"data_offsets":[0,0]}}`, body), "needs more than the whole data area"},
		{"overlap", rawFile(`{"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},"b":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}}`, body),
			"tensor b: data_offsets [8, 24] overlap tensor a at [0, 16]"},
		{"empty name", rawFile(`{"":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}}`, body), `names a tensor "": every tensor needs a name`},
		{"bad metadata", rawFile(`{"__metadata__":{"n":1}}`, nil), "__metadata__ is not a map of strings"},
	}
	for _, c := range cases {
		_, err := Parse(c.data)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want it to contain %q", c.name, err, c.want)
		}
	}
}

func TestParseAcceptsGapsAndEmptyTensors(t *testing.T) {
	f, err := Parse(rawFile(`{"b":{"dtype":"U8","shape":[2],"data_offsets":[6,8]},"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"z":{"dtype":"F32","shape":[0],"data_offsets":[1,1]}}`,
		[]byte{1, 2, 0, 0, 0, 0, 3, 4}))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	if got := f.Tensors["b"].Data; !bytes.Equal(got, []byte{3, 4}) {
		t.Fatalf("tensor b data %v", got)
	}
	if f.Metadata != nil {
		t.Fatalf("Metadata %v, want nil", f.Metadata)
	}
}

func TestTruncatedFile(t *testing.T) {
	data := mustWrite(t, testTensors(), nil)
	for _, n := range []int{0, 7, 8, 20, len(data) / 2, len(data) - 1} {
		if _, err := Parse(data[:n]); err == nil {
			t.Errorf("file cut to %d of %d bytes parsed", n, len(data))
		}
	}
}

// f16Reference computes a half-precision value from its definition.
func f16Reference(h uint16) float64 {
	sign := 1.0
	if h&0x8000 != 0 {
		sign = -1
	}
	exp := int(h>>10) & 0x1f
	mant := float64(h & 0x3ff)
	switch exp {
	case 0:
		return sign * math.Ldexp(mant/1024, -14)
	case 0x1f:
		if mant != 0 {
			return math.NaN()
		}
		return sign * math.Inf(1)
	}
	return sign * math.Ldexp(1+mant/1024, exp-15)
}

func TestF16ToF32AllValues(t *testing.T) {
	for h := range 1 << 16 {
		got := F16ToF32(uint16(h))
		want := f16Reference(uint16(h))
		if math.IsNaN(want) {
			if !math.IsNaN(float64(got)) {
				t.Fatalf("f16 %#04x: got %v, want NaN", h, got)
			}
			continue
		}
		if float64(got) != want || math.Signbit(float64(got)) != math.Signbit(want) {
			t.Fatalf("f16 %#04x: got %v, want %v", h, got, want)
		}
	}
}

func TestFloat32s(t *testing.T) {
	cases := []struct {
		t    Tensor
		want []float32
	}{
		{Tensor{Name: "bf", Dtype: "BF16", Shape: []int{4}, Data: u16Bytes(0x3f80, 0xc000, 0x3e80, 0x7f80)},
			[]float32{1, -2, 0.25, float32(math.Inf(1))}},
		{Tensor{Name: "h", Dtype: "F16", Shape: []int{5}, Data: u16Bytes(0x3c00, 0xc100, 0x7bff, 0x0001, 0x8000)},
			[]float32{1, -2.5, 65504, float32(math.Ldexp(1, -24)), float32(math.Copysign(0, -1))}},
		{Tensor{Name: "f", Dtype: "F32", Shape: []int{1, 2}, Data: f32Bytes(0.1, -7)}, []float32{0.1, -7}},
	}
	for _, c := range cases {
		got, err := c.t.Float32s()
		if err != nil {
			t.Fatalf("%s: %v", c.t.Name, err)
		}
		if len(got) != len(c.want) {
			t.Fatalf("%s: %d values, want %d", c.t.Name, len(got), len(c.want))
		}
		for i := range got {
			if math.Float32bits(got[i]) != math.Float32bits(c.want[i]) {
				t.Errorf("%s[%d] = %v, want %v", c.t.Name, i, got[i], c.want[i])
			}
		}
	}
	if _, err := (&Tensor{Name: "i", Dtype: "I32", Shape: []int{1}, Data: make([]byte, 4)}).Float32s(); err == nil ||
		!strings.Contains(err.Error(), "cannot convert I32") {
		t.Errorf("I32 conversion: %v", err)
	}
	if _, err := (&Tensor{Name: "s", Dtype: "F32", Shape: []int{3}, Data: make([]byte, 4)}).Float32s(); err == nil {
		t.Error("short data converted")
	}
	if n := (&Tensor{Shape: []int{2, 3, 4}}).Elements(); n != 24 {
		t.Errorf("Elements = %d, want 24", n)
	}
	if n := (&Tensor{}).Elements(); n != 1 {
		t.Errorf("scalar Elements = %d, want 1", n)
	}
}

func TestOpen(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "w.safetensors")
	if err := os.WriteFile(path, mustWrite(t, testTensors(), nil), 0o644); err != nil {
		t.Fatal(err)
	}
	f, c, err := Open(path)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	got, err := f.Tensors["a.f32"].Float32s()
	if err != nil || !reflect.DeepEqual(got, []float32{1, -2, 0.5, 3e10}) {
		t.Fatalf("a.f32 = %v, %v", got, err)
	}
	if err := c.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := c.Close(); err == nil {
		t.Fatal("second Close succeeded")
	}

	bad := filepath.Join(dir, "bad.safetensors")
	if err := os.WriteFile(bad, rawFile(`{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`, nil), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, err := Open(bad); err == nil || !strings.HasPrefix(err.Error(), bad+": tensor w") {
		t.Fatalf("Open of a bad file: %v", err)
	}
	empty := filepath.Join(dir, "empty.safetensors")
	if err := os.WriteFile(empty, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, err := Open(empty); err == nil || !strings.Contains(err.Error(), "truncated") {
		t.Fatalf("Open of an empty file: %v", err)
	}
	if _, _, err := Open(filepath.Join(dir, "absent")); err == nil {
		t.Fatal("Open of a missing file succeeded")
	}
}

func FuzzParse(f *testing.F) {
	f.Add(mustWrite(f, testTensors(), map[string]string{"k": "v"}))
	f.Add(rawFile(`{"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},"b":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}}`, make([]byte, 24)))
	f.Add(rawFile(`{"w":{"dtype":"BF16","shape":[1,2],"data_offsets":[0,4]}}`, make([]byte, 4)))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		file, err := Parse(data)
		if err != nil {
			return
		}
		tensors := make([]Tensor, 0, len(file.Names))
		for _, name := range file.Names {
			tn := file.Tensors[name]
			size, _ := DtypeSize(tn.Dtype)
			if len(tn.Data) != tn.Elements()*size {
				t.Fatalf("tensor %s: %d bytes for %d elements of %s", name, len(tn.Data), tn.Elements(), tn.Dtype)
			}
			tensors = append(tensors, *tn)
		}
		var buf bytes.Buffer
		if err := Write(&buf, tensors, file.Metadata); err != nil {
			t.Fatalf("re-Write of a parsed file: %v", err)
		}
		again, err := Parse(buf.Bytes())
		if err != nil {
			t.Fatalf("re-Parse: %v", err)
		}
		if !reflect.DeepEqual(again.Names, file.Names) {
			t.Fatalf("names changed: %v -> %v", file.Names, again.Names)
		}
	})
}

type failWriter struct{ left int }

func (w *failWriter) Write(p []byte) (int, error) {
	if w.left < len(p) {
		return 0, os.ErrClosed
	}
	w.left -= len(p)
	return len(p), nil
}

func TestWriteReportsWriterErrors(t *testing.T) {
	full := len(mustWrite(t, testTensors(), nil))
	for _, left := range []int{0, 100, full - 1} {
		if err := Write(&failWriter{left: left}, testTensors(), nil); err == nil {
			t.Errorf("writer failing after %d of %d bytes: no error", left, full)
		}
	}
}
