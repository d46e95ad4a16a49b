package loader

import (
	"encoding/binary"
	"fmt"
	"math"
	"path/filepath"
	"strings"
	"testing"

	"xmix/bundle"
	"xmix/ops"
	"xmix/safetensors"
)

func writeST(t *testing.T, path string, ts ...safetensors.Tensor) {
	t.Helper()
	if err := safetensors.WriteFile(path, ts, nil); err != nil {
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
