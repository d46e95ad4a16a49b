package loader

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"xmix/bundle"
	"xmix/ops"
	"xmix/safetensors"
)

func writeST(t *testing.T, path string, ts ...safetensors.Tensor) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := safetensors.Write(f, ts, nil); err != nil {
		t.Fatal(err)
	}
}

func f32T(name string, shape ...int) safetensors.Tensor {
	n := 1
	for _, d := range shape {
		n *= d
	}
	return safetensors.Tensor{Name: name, Dtype: "F32", Shape: shape, Data: make([]byte, 4*n)}
}

func TestWeightsFillConcatenatesAndConverts(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "w.safetensors")
	a := f32T("a", 2, 3)
	copy(a.Data, putF32s([]float32{1, 2, 3, 4, 5, 6}))
	b := f32T("b", 1, 3)
	copy(b.Data, putF32s([]float32{7, 8, 9}))
	writeST(t, p, a, b)
	bd := &bundle.Bundle{Manifest: bundle.Manifest{Weights: bundle.WeightsRef{Path: p}}}
	w, err := OpenWeights(bd, "")
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	dst := make([]byte, 2*9)
	if err := w.Fill(bundle.Buffer{Name: "ab", Dtype: "bf16", Shape: []int{3, 3}, Tensors: []string{"a", "b"}}, dst); err != nil {
		t.Fatal(err)
	}
	for i, h := range []uint16{0x3f80, 0x4000, 0x4040, 0x4080, 0x40a0, 0x40c0, 0x40e0, 0x4100, 0x4110} {
		if got := uint16(dst[2*i]) | uint16(dst[2*i+1])<<8; got != h {
			t.Fatalf("element %d: bf16 %#04x, want %#04x", i, got, h)
		}
	}
}

func TestWeightsErrors(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "w.safetensors")
	ids := safetensors.Tensor{Name: "ids", Dtype: "I64", Shape: []int{2}, Data: make([]byte, 16)}
	writeST(t, p, f32T("model.norm.weight", 8), f32T("wide", 2, 5), f32T("q", 4, 4), f32T("k", 2, 4), ids)
	bd := &bundle.Bundle{Manifest: bundle.Manifest{Weights: bundle.WeightsRef{Path: p}}}
	w, err := OpenWeights(bd, "")
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	cases := []struct {
		buf  bundle.Buffer
		want string
	}{
		{bundle.Buffer{Name: "x", Dtype: "f32", Shape: []int{8}, Tensors: []string{"model.layers.0.mlp.up_proj.weight"}},
			"weight tensor model.layers.0.mlp.up_proj.weight (for buffer x) is missing from the checkpoint"},
		{bundle.Buffer{Name: "x", Dtype: "f32", Shape: []int{4, 4}, Tensors: []string{"wide"}},
			"weight tensor wide has shape [2 5], expected [4 4] (buffer x)"},
		{bundle.Buffer{Name: "x", Dtype: "f32", Shape: []int{16}, Tensors: []string{"model.norm.weight"}},
			"weight tensor model.norm.weight has shape [8], expected [16]"},
		{bundle.Buffer{Name: "x", Dtype: "f32", Shape: []int{8, 5}, Tensors: []string{"q", "wide"}},
			"weight tensor q has shape [4 4], expected [* 5] (stacked into buffer x of shape [8 5])"},
		{bundle.Buffer{Name: "qk", Dtype: "f32", Shape: []int{8, 4}, Tensors: []string{"q", "k"}},
			"buffer qk of shape [8 4] stacks q [4 4], k [2 4]: 6 rows, expected 8"},
		{bundle.Buffer{Name: "x", Dtype: "f32", Shape: []int{2}, Tensors: []string{"ids"}},
			"weight tensor ids has dtype I64; supported: BF16, F16, F32"},
		{bundle.Buffer{Name: "lm_head", Dtype: "bf16", Shape: []int{8, 4}, Tensors: []string{"lm_head.weight"}},
			"weight tensor lm_head.weight (for buffer lm_head) is missing from the checkpoint: the model's embeddings are not tied"},
	}
	for _, c := range cases {
		n, _ := BufferBytes(c.buf)
		err := w.Fill(c.buf, make([]byte, n))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Fill(%v): %v, want %q", c.buf.Tensors, err, c.want)
		}
		// OpenWeights checks the same for every weight buffer of the bundle up front.
		bad := &bundle.Bundle{Manifest: bundle.Manifest{Weights: bd.Manifest.Weights, Buffers: []bundle.Buffer{c.buf}}}
		bad.Manifest.Buffers[0].Kind = bundle.KindWeight
		if w2, err := OpenWeights(bad, ""); err == nil || !strings.Contains(err.Error(), c.want) {
			if w2 != nil {
				w2.Close()
			}
			t.Errorf("OpenWeights(%v): %v, want %q", c.buf.Tensors, err, c.want)
		}
	}
	// A digest mismatch (other weights than the bundle was built with) is refused.
	bd.Manifest.Weights.SHA256 = strings.Repeat("0", 64)
	if _, err := OpenWeights(bd, ""); err == nil || !strings.Contains(err.Error(), "not the ones the bundle was built with") {
		t.Fatalf("digest mismatch: %v", err)
	}
	bd.Manifest.Weights.Path = filepath.Join(dir, "missing.safetensors")
	if _, err := OpenWeights(bd, ""); err == nil || !strings.Contains(err.Error(), "no such file") {
		t.Fatalf("missing file: %v", err)
	}
}

// TestOpenWeightsReportsEveryBadBuffer: one load lists all problems, capped, not the first.
func TestOpenWeightsReportsEveryBadBuffer(t *testing.T) {
	p := filepath.Join(t.TempDir(), "w.safetensors")
	writeST(t, p, f32T("a", 4))
	bd := &bundle.Bundle{Manifest: bundle.Manifest{Weights: bundle.WeightsRef{Path: p}}}
	for i := range 12 {
		name := fmt.Sprintf("t%02d", i)
		bd.Manifest.Buffers = append(bd.Manifest.Buffers, bundle.Buffer{Name: name, Kind: bundle.KindWeight, Dtype: "f32", Shape: []int{4}, Tensors: []string{name}})
	}
	// Buffers of other kinds are not the checkpoint's business.
	bd.Manifest.Buffers = append(bd.Manifest.Buffers, bundle.Buffer{Name: "act", Kind: bundle.KindActivation, Dtype: "f32", Shape: []int{4}})
	_, err := OpenWeights(bd, "")
	if err == nil {
		t.Fatal("OpenWeights accepted a checkpoint missing every tensor")
	}
	msg := err.Error()
	for _, want := range []string{"weight tensor t00 ", "weight tensor t07 ", "and 4 more buffers with problems"} {
		if !strings.Contains(msg, want) {
			t.Errorf("error lacks %q:\n%s", want, msg)
		}
	}
	if strings.Contains(msg, "t08") || strings.Contains(msg, "act") {
		t.Errorf("error lists more than it should:\n%s", msg)
	}
}

// TestWeightsConvertEveryDtype: BF16, F16 and F32 tensors all load into bf16 and f32
// buffers; widening is exact and narrowing to bf16 rounds to nearest even.
func TestWeightsConvertEveryDtype(t *testing.T) {
	vals := []float32{1, -2.5, 0.099975586, 65504, 1.0 / 1024}
	f32 := safetensors.Tensor{Name: "f32", Dtype: "F32", Shape: []int{5}, Data: putF32s(vals)}
	bf := safetensors.Tensor{Name: "bf16", Dtype: "BF16", Shape: []int{5}, Data: make([]byte, 10)}
	f16 := safetensors.Tensor{Name: "f16", Dtype: "F16", Shape: []int{5}, Data: make([]byte, 10)}
	// F16 bit patterns of vals (all exactly representable in half precision).
	for i, h := range []uint16{0x3c00, 0xc100, 0x2e66, 0x7bff, 0x1400} {
		binary.LittleEndian.PutUint16(f16.Data[2*i:], h)
		binary.LittleEndian.PutUint16(bf.Data[2*i:], ops.F32ToBF16(vals[i]))
	}
	p := filepath.Join(t.TempDir(), "w.safetensors")
	writeST(t, p, f32, bf, f16)
	w, err := OpenWeights(&bundle.Bundle{Manifest: bundle.Manifest{Weights: bundle.WeightsRef{Path: p}}}, "")
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	for _, src := range []string{"f32", "bf16", "f16"} {
		for _, dt := range []string{"f32", "bf16"} {
			buf := bundle.Buffer{Name: src + "->" + dt, Kind: bundle.KindWeight, Dtype: dt, Shape: []int{5}, Tensors: []string{src}}
			n, _ := BufferBytes(buf)
			dst := make([]byte, n)
			if err := w.Fill(buf, dst); err != nil {
				t.Fatalf("%s: %v", buf.Name, err)
			}
			for i, v := range vals {
				want := v
				if src == "bf16" || dt == "bf16" {
					want = ops.BF16ToF32(ops.F32ToBF16(v))
				}
				var got float32
				if dt == "bf16" {
					got = ops.BF16ToF32(binary.LittleEndian.Uint16(dst[2*i:]))
				} else {
					got = math.Float32frombits(binary.LittleEndian.Uint32(dst[4*i:]))
				}
				if got != want {
					t.Errorf("%s element %d: %g, want %g", buf.Name, i, got, want)
				}
			}
		}
	}
}

// writeSharded writes a two-shard checkpoint with an index into dir: a [2,2] and b [3] in
// shard 1, c [4] in shard 2. edit changes the index's weight_map before it is written.
func writeSharded(t *testing.T, dir string, edit func(map[string]string)) {
	t.Helper()
	s1, s2 := "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"
	a := f32T("a", 2, 2)
	copy(a.Data, putF32s([]float32{1, 2, 3, 4}))
	writeST(t, filepath.Join(dir, s1), a, f32T("b", 3))
	writeST(t, filepath.Join(dir, s2), f32T("c", 4))
	wm := map[string]string{"a": s1, "b": s1, "c": s2}
	if edit != nil {
		edit(wm)
	}
	data, err := json.Marshal(map[string]any{"metadata": map[string]int{"total_size": 64}, "weight_map": wm})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, IndexFile), data, 0o644); err != nil {
		t.Fatal(err)
	}
}

func openDir(dir string, bufs ...bundle.Buffer) (*Weights, error) {
	return OpenWeights(&bundle.Bundle{Manifest: bundle.Manifest{Weights: bundle.WeightsRef{Path: dir}, Buffers: bufs}}, "")
}

func TestShardedCheckpoint(t *testing.T) {
	dir := t.TempDir()
	writeSharded(t, dir, nil)
	// A stray file beside the shards (Mistral ships consolidated.safetensors) is not read.
	writeST(t, filepath.Join(dir, "consolidated.safetensors"), f32T("a", 9))
	files, err := WeightFiles(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(files) != 2 || filepath.Base(files[0]) != "model-00001-of-00002.safetensors" || filepath.Base(files[1]) != "model-00002-of-00002.safetensors" {
		t.Fatalf("WeightFiles = %v, want the two shards in order", files)
	}
	ac := bundle.Buffer{Name: "ac", Kind: bundle.KindWeight, Dtype: "f32", Shape: []int{4}, Tensors: []string{"c"}}
	w, err := openDir(dir, ac)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	dst := make([]byte, 16)
	if err := w.Fill(bundle.Buffer{Name: "a", Dtype: "f32", Shape: []int{2, 2}, Tensors: []string{"a"}}, dst); err != nil {
		t.Fatal(err)
	}
	if got := getF32s(dst); !slices.Equal(got, []float32{1, 2, 3, 4}) {
		t.Fatalf("a = %v, want the shard's values, not the stray file's", got)
	}
	d1, err := WeightsDigest(dir)
	if err != nil {
		t.Fatal(err)
	}
	// The digest is of the tensors the index maps: the stray file does not change it.
	if err := os.Remove(filepath.Join(dir, "consolidated.safetensors")); err != nil {
		t.Fatal(err)
	}
	if d2, err := WeightsDigest(dir); err != nil || d2 != d1 {
		t.Fatalf("digest changed with a file the index does not name: %s vs %s (%v)", d1, d2, err)
	}
}

func TestShardedCheckpointErrors(t *testing.T) {
	need := func(name string) bundle.Buffer {
		return bundle.Buffer{Name: "buf." + name, Kind: bundle.KindWeight, Dtype: "f32", Shape: []int{3}, Tensors: []string{name}}
	}
	cases := []struct {
		name  string
		setup func(t *testing.T, dir string)
		buf   bundle.Buffer
		want  []string
	}{
		{"shard missing", func(t *testing.T, dir string) {
			writeSharded(t, dir, func(wm map[string]string) { wm["c"] = "model-00003-of-00002.safetensors" })
		}, need("b"), []string{IndexFile + " names shard model-00003-of-00002.safetensors (for tensor c)", "does not exist"}},
		{"tensor not in its shard", func(t *testing.T, dir string) {
			writeSharded(t, dir, func(wm map[string]string) { wm["d"] = "model-00002-of-00002.safetensors" })
		}, need("b"), []string{"maps tensor d to model-00002-of-00002.safetensors, but that file has no such tensor"}},
		{"tensor missing from the index", func(t *testing.T, dir string) {
			writeSharded(t, dir, func(wm map[string]string) { delete(wm, "b") })
		}, need("b"), []string{"weight tensor b (for buffer buf.b) is missing from", IndexFile + " (it maps no such tensor)"}},
		{"shard outside the directory", func(t *testing.T, dir string) {
			writeSharded(t, dir, func(wm map[string]string) { wm["c"] = "../elsewhere.safetensors" })
		}, need("b"), []string{`maps tensor c to "../elsewhere.safetensors", which is not a file name in`}},
		{"index not JSON", func(t *testing.T, dir string) {
			writeSharded(t, dir, nil)
			os.WriteFile(filepath.Join(dir, IndexFile), []byte("{\"weight_map\": ["), 0o644)
		}, need("b"), []string{IndexFile + " is not a checkpoint index"}},
		{"index without weight_map", func(t *testing.T, dir string) {
			writeSharded(t, dir, nil)
			os.WriteFile(filepath.Join(dir, IndexFile), []byte(`{"metadata": {}}`), 0o644)
		}, need("b"), []string{"has no weight_map entries"}},
		{"truncated shard", func(t *testing.T, dir string) {
			writeSharded(t, dir, nil)
			p := filepath.Join(dir, "model-00002-of-00002.safetensors")
			st, _ := os.Stat(p)
			os.Truncate(p, st.Size()-4)
		}, need("b"), []string{"model-00002-of-00002.safetensors: tensor c: data_offsets [0, 16] reach past the data area of 12 bytes; the file is truncated or its header lies"}},
		{"header lies about offsets", func(t *testing.T, dir string) {
			writeSharded(t, dir, nil)
			p := filepath.Join(dir, "model-00002-of-00002.safetensors")
			data, _ := os.ReadFile(p)
			os.WriteFile(p, []byte(strings.Replace(string(data), "[0,16]", "[0,12]", 1)), 0o644)
		}, need("b"), []string{"model-00002-of-00002.safetensors: tensor c: data_offsets [0, 12] but shape [4] of F32 needs 16 bytes"}},
		{"empty directory", func(t *testing.T, dir string) {}, need("b"),
			[]string{"no *.safetensors files in directory", "a Hugging Face checkpoint has model.safetensors, or shards listed in " + IndexFile}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			c.setup(t, dir)
			w, err := openDir(dir, c.buf)
			if err == nil {
				w.Close()
				t.Fatal("opened a broken checkpoint")
			}
			for _, want := range c.want {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q lacks %q", err, want)
				}
			}
		})
	}
}

// TestSingleFileCheckpointPreferred: a directory with model.safetensors reads that file only.
func TestSingleFileCheckpointPreferred(t *testing.T) {
	dir := t.TempDir()
	writeST(t, filepath.Join(dir, "model.safetensors"), f32T("a", 2))
	writeST(t, filepath.Join(dir, "adapter.safetensors"), f32T("a", 3))
	files, err := WeightFiles(dir)
	if err != nil || len(files) != 1 || filepath.Base(files[0]) != "model.safetensors" {
		t.Fatalf("WeightFiles = %v, %v; want model.safetensors alone", files, err)
	}
}

func TestSyntheticWeightsAreDeterministic(t *testing.T) {
	s := &bundle.Synth{Seed: 5, Std: 0.02}
	buf := bundle.Buffer{Name: "L0.wo", Dtype: "f32", Shape: []int{64, 64}}
	a, b := make([]byte, 64*64*4), make([]byte, 64*64*4)
	if err := fillSynthetic(buf, a, s, 1, 0); err != nil {
		t.Fatal(err)
	}
	if err := fillSynthetic(buf, b, s, 1, 0); err != nil {
		t.Fatal(err)
	}
	if string(a) != string(b) {
		t.Fatal("synthetic weights differ between two fills")
	}
	var sum, sq float64
	for _, v := range getF32s(a) {
		sum += float64(v)
		sq += float64(v) * float64(v)
	}
	n := float64(64 * 64)
	if mean, std := sum/n, (sq / n); mean > 0.002 || mean < -0.002 || std < 0.0003 || std > 0.0005 {
		t.Fatalf("synthetic mean %g, mean square %g: want ~0 and ~0.0004 (std 0.02)", mean, std)
	}
}
