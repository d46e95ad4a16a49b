package loader

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"xmix/bundle"
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
	writeST(t, p, f32T("model.norm.weight", 8), f32T("wide", 2, 5))
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
			"weight tensor model.layers.0.mlp.up_proj.weight (for buffer x) is missing"},
		{bundle.Buffer{Name: "x", Dtype: "f32", Shape: []int{4, 4}, Tensors: []string{"wide"}},
			"weight tensor wide has shape [2 5], expected [*, 4]"},
		{bundle.Buffer{Name: "x", Dtype: "f32", Shape: []int{16}, Tensors: []string{"model.norm.weight"}},
			"hold 8 elements, expected 16"},
	}
	for _, c := range cases {
		n, _ := BufferBytes(c.buf)
		err := w.Fill(c.buf, make([]byte, n))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Fill(%v): %v, want %q", c.buf.Tensors, err, c.want)
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

func TestSyntheticWeightsAreDeterministic(t *testing.T) {
	s := &bundle.Synth{Seed: 5, Std: 0.02}
	buf := bundle.Buffer{Name: "L0.wo", Dtype: "f32", Shape: []int{64, 64}}
	a, b := make([]byte, 64*64*4), make([]byte, 64*64*4)
	if err := fillSynthetic(buf, a, s); err != nil {
		t.Fatal(err)
	}
	if err := fillSynthetic(buf, b, s); err != nil {
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
