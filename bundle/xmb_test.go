package bundle

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"xmix/safetensors"
)

// testBundle is a small, valid bundle touching every field kind.
func testBundle() *Bundle {
	return &Bundle{
		Manifest: Manifest{
			Model: ModelConfig{
				Name: "tiny", Family: "llama", Hidden: 8, Intermediate: 16, Layers: 1, Heads: 2,
				KVHeads: 1, HeadDim: 4, Vocab: 32, RopeTheta: 10000, RMSEps: 1e-5,
				RopeScaling: &RopeScaling{Type: "llama3", Factor: 8, LowFreqFactor: 1, HighFreqFactor: 4, OriginalMaxPos: 8192},
				WeightDtype: "bf16", KVDtype: "bf16", MaxSeqLen: 64, MaxSeqs: 2, KVBlockSize: 16,
				KVBlocks: 8, Tokenizer: "bytes", BOS: 1, EOS: []int{2, 3},
			},
			Weights: WeightsRef{Synthetic: &Synth{Seed: 7, Std: 0.02}},
			Apps: []App{{
				Name: "steer", Bit: 0, Source: "apps/steer.yaml",
				Scalars: []Scalar{{Name: "alpha", Index: 0, Value: 0.25}},
				Exports: []Export{{Name: "probe", Buffer: "probe_out", Width: 8}},
			}},
			Buffers: []Buffer{
				{Name: "embed", Kind: KindWeight, Dtype: "bf16", Shape: []int{32, 8}, Tensors: []string{"model.embed_tokens.weight"}},
				{Name: "x", Kind: KindActivation, Dtype: "f32", Shape: []int{4, 8}},
				{Name: "tokens", Kind: KindControl, Dtype: "u32", Shape: []int{4}},
				{Name: "probe_out", Kind: KindOutput, Dtype: "f32", Shape: []int{4, 8}},
				{Name: "steer_vec", Kind: KindParam, Dtype: "f32", Shape: []int{8}, Tensors: []string{"steer.vec"}},
			},
			Sites: []Site{{Layer: 0, Hook: "resid_post", App: "steer", Op: 0, Kernel: "add_vec", Fused: false, What: "add"}},
			Build: BuildInfo{Compiler: "xmixc test", Inputs: []InputDigest{{Path: "model.yaml", SHA256: strings.Repeat("ab", 32)}}},
		},
		Kernels: []Kernel{
			{
				Name: "embed", PTX: ".version 8.0\n.target sm_90\n// embed\n", Op: "embed",
				Params: []Param{{"tokens", "u64"}, {"table", "u64"}, {"out", "u64"}, {"n", "u32"}},
				Attrs:  json.RawMessage(`{"dim":8,"vocab":32}`),
			},
			{
				Name: "add_vec", PTX: ".version 8.0\n.target sm_90\n// add\n", Op: "add_vec",
				Params: []Param{{"x", "u64"}, {"v", "u64"}, {"scale", "f32"}},
			},
		},
		Templates: []Template{{
			Name: "decode_4", Kind: "decode", Tokens: 4, Samples: 4,
			Nodes: []Node{
				{Label: "embed", Kernel: "embed", Grid: [3]int{4, 1, 1}, Block: [3]int{32, 1, 1},
					Args: []Slot{{Buffer: "tokens"}, {Buffer: "embed"}, {Buffer: "x"}, {Const: 4}}},
				{Label: "steer", Kernel: "add_vec", Grid: [3]int{1, 1, 1}, Block: [3]int{32, 1, 1}, Shared: 128,
					Args: []Slot{{Buffer: "x", Offset: 32}, {Buffer: "steer_vec"}, {Const: 0x3e800000}}},
			},
		}},
		Params:    safetensorsFile(safetensors.Tensor{Name: "steer.vec", Dtype: "F32", Shape: []int{8}, Data: make([]byte, 32)}),
		Tokenizer: []byte(`{"model":"bytes"}`),
	}
}

func safetensorsFile(tensors ...safetensors.Tensor) []byte {
	var buf bytes.Buffer
	if err := safetensors.Write(&buf, tensors, nil); err != nil {
		panic(err) // the tests' own fixtures are valid
	}
	return buf.Bytes()
}

func mustMarshal(t testing.TB, b *Bundle) []byte {
	t.Helper()
	data, err := Marshal(b)
	if err != nil {
		t.Fatalf("Marshal: %v", err)
	}
	return data
}

func TestRoundTrip(t *testing.T) {
	withWeights := testBundle()
	withWeights.Weights = safetensorsFile(safetensors.Tensor{
		Name: "model.embed_tokens.weight", Dtype: "BF16", Shape: []int{32, 8}, Data: bytes.Repeat([]byte{1, 2, 3, 4}, 128)})
	for name, b := range map[string]*Bundle{"referenced weights": testBundle(), "embedded weights": withWeights} {
		t.Run(name, func(t *testing.T) {
			data := mustMarshal(t, b)
			got, err := Unmarshal(data)
			if err != nil {
				t.Fatalf("Unmarshal: %v", err)
			}
			if !reflect.DeepEqual(got, b) {
				t.Fatalf("round trip changed the bundle:\n got %+v\nwant %+v", got, b)
			}
			var buf bytes.Buffer
			if err := Write(&buf, b); err != nil {
				t.Fatalf("Write: %v", err)
			}
			path := filepath.Join(t.TempDir(), "b.xmb")
			if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
				t.Fatal(err)
			}
			fromFile, err := ReadFile(path)
			if err != nil {
				t.Fatalf("ReadFile: %v", err)
			}
			fromReader, err := Read(bytes.NewReader(buf.Bytes()))
			if err != nil {
				t.Fatalf("Read: %v", err)
			}
			if !reflect.DeepEqual(fromFile, b) || !reflect.DeepEqual(fromReader, b) {
				t.Fatal("ReadFile/Read disagree with the written bundle")
			}
		})
	}
}

// Weights bigger than the zstd window span several blocks and a non-single-segment frame,
// the path real weights take.
func TestLargeWeightsRoundTrip(t *testing.T) {
	const n = 3 * encoderWindow / 2 / 2 // bf16 elements: 12 MiB of data
	data := make([]byte, 2*n)
	x := uint32(1)
	for i := range data {
		x ^= x << 13
		x ^= x >> 17
		x ^= x << 5
		data[i] = byte(x) & 0x0f // half-random: compressible but not trivially
	}
	b := testBundle()
	b.Manifest.Buffers[0].Shape = []int{n / 8, 8}
	b.Weights = safetensorsFile(safetensors.Tensor{Name: "model.embed_tokens.weight", Dtype: "BF16", Shape: []int{n / 8, 8}, Data: data})
	got, err := Unmarshal(mustMarshal(t, b))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got.Weights, b.Weights) {
		t.Fatal("large weights changed in the round trip")
	}
}

func TestWeightsSectionOnlyWhenEmbedded(t *testing.T) {
	if n := binary.LittleEndian.Uint32(mustMarshal(t, testBundle())[12:]); n != 5 {
		t.Fatalf("bundle without weights has %d sections, want 5", n)
	}
	b := testBundle()
	b.Weights = safetensorsFile(safetensors.Tensor{Name: "model.embed_tokens.weight", Dtype: "BF16", Shape: []int{256}, Data: make([]byte, 512)})
	if n := binary.LittleEndian.Uint32(mustMarshal(t, b)[12:]); n != 6 {
		t.Fatalf("bundle with weights has %d sections, want 6", n)
	}
}

func TestDeterministic(t *testing.T) {
	a := mustMarshal(t, testBundle())
	if b := mustMarshal(t, testBundle()); !bytes.Equal(a, b) {
		t.Fatal("marshalling the same bundle twice gave different bytes")
	}
	// Attributes written with other key order and spacing mean the same and must give the
	// same file.
	reordered := testBundle()
	reordered.Kernels[0].Attrs = json.RawMessage("{ \"vocab\": 32,\n \"dim\": 8 }")
	if b := mustMarshal(t, reordered); !bytes.Equal(a, b) {
		t.Fatal("kernel attrs in another key order gave a different bundle")
	}
	// Large numbers survive canonicalisation exactly.
	big := testBundle()
	big.Kernels[0].Attrs = json.RawMessage(`{"seed":18446744073709551615,"x":0.1}`)
	got, err := Unmarshal(mustMarshal(t, big))
	if err != nil {
		t.Fatal(err)
	}
	if s := string(got.Kernels[0].Attrs); s != `{"seed":18446744073709551615,"x":0.1}` {
		t.Fatalf("attrs after round trip: %s", s)
	}
}

func TestMarshalRejectsInvalid(t *testing.T) {
	b := testBundle()
	b.Templates[0].Nodes[0].Kernel = "missing"
	if _, err := Marshal(b); err == nil || !strings.Contains(err.Error(), `kernel "missing" does not exist`) {
		t.Fatalf("Marshal of a dangling kernel reference: %v", err)
	}
	b = testBundle()
	b.Kernels[1].Attrs = json.RawMessage(`{"a":`)
	if _, err := Marshal(b); err == nil {
		t.Fatal("Marshal accepted invalid attrs JSON")
	}
	if _, err := Marshal(nil); err == nil {
		t.Fatal("Marshal accepted nil")
	}
}

func TestTruncated(t *testing.T) {
	data := mustMarshal(t, testBundle())
	tocEnd := headerSize + 5*tocEntrySize
	for _, n := range []int{0, 3, 8, 12, 15, 16, 40, tocEnd - 1, tocEnd, tocEnd + 10, len(data) / 2, len(data) - trailerSize, len(data) - 1} {
		_, err := Unmarshal(data[:n])
		if err == nil {
			t.Errorf("truncated to %d of %d bytes: no error", n, len(data))
			continue
		}
		want := "truncated"
		if n < len(magic) {
			want = "not an xmix bundle"
		}
		if !strings.Contains(err.Error(), want) {
			t.Errorf("truncated to %d bytes: error %q does not say %q", n, err, want)
		}
	}
}

func TestEveryByteFlipped(t *testing.T) {
	data := mustMarshal(t, testBundle())
	for i := range data {
		for _, mask := range []byte{0x01, 0x80} {
			bad := bytes.Clone(data)
			bad[i] ^= mask
			if _, err := Unmarshal(bad); err == nil {
				t.Fatalf("flipping byte %d with %#x of %d went unnoticed", i, mask, len(data))
			}
		}
	}
}

func TestWrongVersion(t *testing.T) {
	data := mustMarshal(t, testBundle())
	binary.LittleEndian.PutUint32(data[8:], 7)
	_, err := Unmarshal(data)
	var ve *VersionError
	if !errors.As(err, &ve) || ve.Got != 7 {
		t.Fatalf("want a VersionError for version 7, got %v", err)
	}
	const want = "bundle format version 7, this xmix reads version 1: rebuild the bundle with this xmixc"
	if err.Error() != want {
		t.Fatalf("error %q, want %q", err, want)
	}
}

func TestWrongMagic(t *testing.T) {
	data := mustMarshal(t, testBundle())
	copy(data, "PK\x03\x04xxxx")
	if _, err := Unmarshal(data); err == nil || !strings.Contains(err.Error(), "not an xmix bundle") {
		t.Fatalf("wrong magic: %v", err)
	}
}

// editTOC lets a test rewrite the table of contents, then fixes the trailer so that only
// the edit is wrong.
func editTOC(t *testing.T, data []byte, edit func(row int, entry []byte)) []byte {
	t.Helper()
	data = bytes.Clone(data)
	count := int(binary.LittleEndian.Uint32(data[12:]))
	for i := range count {
		edit(i, data[headerSize+i*tocEntrySize:headerSize+(i+1)*tocEntrySize])
	}
	return fixTrailer(data)
}

func fixTrailer(data []byte) []byte {
	if len(data) < trailerSize {
		return data
	}
	body := len(data) - trailerSize
	sum := sha256.Sum256(data[:body])
	copy(data[body:], sum[:])
	return data
}

func TestTrailerChecksum(t *testing.T) {
	data := mustMarshal(t, testBundle())
	data[len(data)-1] ^= 1
	if _, err := Unmarshal(data); err == nil || !strings.Contains(err.Error(), "checksum mismatch") {
		t.Fatalf("bad trailer: %v", err)
	}
}

func TestBadSectionHash(t *testing.T) {
	data := editTOC(t, mustMarshal(t, testBundle()), func(row int, e []byte) {
		if row == 1 {
			e[nameSize+24] ^= 1
		}
	})
	_, err := Unmarshal(data)
	if err == nil || !strings.Contains(err.Error(), "section kernels: its content does not match its sha256") {
		t.Fatalf("bad kernels hash: %v", err)
	}
}

func TestLayoutErrors(t *testing.T) {
	valid := mustMarshal(t, testBundle())
	paramsLen := len(testBundle().Params)
	rename := func(target int, name string) func(int, []byte) {
		return func(row int, e []byte) {
			if row == target {
				clear(e[:nameSize])
				copy(e, name)
			}
		}
	}
	cases := []struct {
		name string
		data []byte
		want string
	}{
		{"unknown section", editTOC(t, valid, rename(4, "extras")), `unknown section "extras"`},
		{"duplicate section", editTOC(t, valid, rename(4, "params")), "section params appears twice"},
		{"garbage name", editTOC(t, valid, rename(0, "Manifest")), "not lower-case letters"},
		{"name padding", editTOC(t, valid, func(row int, e []byte) {
			if row == 0 {
				e[nameSize-1] = 'x'
			}
		}), "bytes after its terminator"},
		{"gap between sections", editTOC(t, valid, func(row int, e []byte) {
			if row == 2 {
				binary.LittleEndian.PutUint64(e[nameSize:], binary.LittleEndian.Uint64(e[nameSize:])+1)
			}
		}), "section templates starts at byte"},
		{"absurd size", editTOC(t, valid, func(row int, e []byte) {
			if row == 1 {
				binary.LittleEndian.PutUint64(e[nameSize+16:], 1<<40)
			}
		}), "over the 1073741824-byte limit"},
		{"huge compressed length", editTOC(t, valid, func(row int, e []byte) {
			if row == 4 {
				binary.LittleEndian.PutUint64(e[nameSize+8:], ^uint64(0))
			}
		}), "compressed bytes, more than any file holds"},
		{"wrong uncompressed length", editTOC(t, valid, func(row int, e []byte) {
			if row == 3 {
				binary.LittleEndian.PutUint64(e[nameSize+16:], binary.LittleEndian.Uint64(e[nameSize+16:])+1)
			}
		}), fmt.Sprintf("section params decompresses to %d bytes but the table of contents says %d", paramsLen, paramsLen+1)},
		{"stray bytes", fixTrailer(append(bytes.Clone(valid), make([]byte, trailerSize+3)...)), "35 stray bytes after its checksum"},
		{"zero sections", fixTrailer(func() []byte {
			d := bytes.Clone(valid)
			binary.LittleEndian.PutUint32(d[12:], 0)
			return d
		}()), "declares 0 sections"},
	}
	for _, c := range cases {
		_, err := Unmarshal(c.data)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want it to contain %q", c.name, err, c.want)
		}
	}
}

// rawPayloads is a valid bundle's section contents, for tests that craft bad ones.
func rawPayloads(t *testing.T) []payload {
	t.Helper()
	p, err := encodeSections(testBundle())
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestSectionContentErrors(t *testing.T) {
	replace := func(name string, data string) []payload {
		ps := rawPayloads(t)
		for i := range ps {
			if ps[i].name == name {
				ps[i].data = []byte(data)
			}
		}
		return ps
	}
	drop := func(name string) []payload {
		var out []payload
		for _, p := range rawPayloads(t) {
			if p.name != name {
				out = append(out, p)
			}
		}
		return out
	}
	cases := []struct {
		name     string
		payloads []payload
		want     string
	}{
		{"missing section", drop("templates"), "bundle has no templates section"},
		{"bad JSON", replace("kernels", `[{"name":`), "section kernels is not valid"},
		{"unknown field", replace("manifest", `{"model":{},"colour":1}`), "section manifest is not valid: json: unknown field"},
		{"trailing data", replace("templates", `[] []`), "section templates has data after its JSON value"},
		{"inconsistent content", replace("templates", `[{"name":"t","kind":"decode","tokens":1,"nodes":[{"kernel":"nope","grid":[1,1,1],"block":[1,1,1]}]}]`),
			`template 0 ("t"): node 0 (""): kernel "nope" does not exist in the bundle; rebuild the bundle`},
	}
	for _, c := range cases {
		data, err := assemble(c.payloads)
		if err != nil {
			t.Fatal(err)
		}
		_, err = Unmarshal(data)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want it to contain %q", c.name, err, c.want)
		}
	}
}

func TestReadFileNamesPath(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cut.xmb")
	if err := os.WriteFile(path, mustMarshal(t, testBundle())[:100], 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadFile(path); err == nil || !strings.HasPrefix(err.Error(), path+": bundle is truncated") {
		t.Fatalf("ReadFile of a cut file: %v", err)
	}
	if _, err := ReadFile(filepath.Join(t.TempDir(), "absent.xmb")); err == nil {
		t.Fatal("ReadFile of a missing file succeeded")
	}
}

func FuzzRead(f *testing.F) {
	valid := mustMarshal(f, testBundle())
	f.Add(valid)
	f.Add(valid[:len(valid)/2])
	f.Add([]byte(magic))
	for _, i := range []int{8, 12, headerSize + nameSize + 8, headerSize + nameSize + 16, len(valid) - 40} {
		bad := bytes.Clone(valid)
		bad[i] ^= 0xff
		f.Add(bad)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		// Garbage rarely passes the trailer checksum; fixing it lets the fuzzer reach the
		// decompression, JSON and Verify paths too.
		for _, d := range [][]byte{data, fixTrailer(bytes.Clone(data))} {
			b, err := Unmarshal(d)
			if err != nil {
				continue
			}
			if err := Verify(b); err != nil {
				t.Fatalf("Unmarshal returned a bundle that fails Verify: %v", err)
			}
			again, err := Marshal(b)
			if err != nil {
				t.Fatalf("Marshal of a read bundle: %v", err)
			}
			if _, err := Unmarshal(again); err != nil {
				t.Fatalf("re-read of a re-written bundle: %v", err)
			}
		}
	})
}
