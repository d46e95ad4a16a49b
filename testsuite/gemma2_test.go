package testsuite

import (
	"encoding/binary"
	"maps"
	"math"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"xmix/frontend"
	"xmix/loader/cpu"
	"xmix/models"
	"xmix/ops"
	"xmix/safetensors"
)

// TestGemma2ForwardMatchesFloat64Reference: the CPU backend's Gemma 2 (prefill with the
// window binding, then decode) matches the float64 reference in logits and in every
// layer's resid_post at every row, within 1e-4. Norm weights are drawn around 0 (synthetic
// weights make them all 1, which would hide a (1 + w) read at the wrong index).
func TestGemma2ForwardMatchesFloat64Reference(t *testing.T) {
	b := CompileGemma2(t, SmallGemma2, CaptureAllApp(3, 96))
	be := NewCPU(t, b).(*cpu.Backend)
	defer be.Close()
	r := rand.New(rand.NewPCG(17, 18))
	for _, buf := range b.Manifest.Buffers {
		if !strings.HasSuffix(buf.Name, "norm") || buf.Dtype != "bf16" {
			continue
		}
		raw := be.Buffer(buf.Name)
		for i := 0; i < len(raw)/2; i++ {
			binary.LittleEndian.PutUint16(raw[2*i:], ops.F32ToBF16(float32(0.5*(2*r.Float64()-1))))
		}
	}
	CheckGemma2Reference(t, b, be, be.Buffer, 1e-4)
}

// TestGemma2TensorNames: the builder (models/gemma2.go) reads exactly the tensors the
// reference reads, written independently from transformers' module names.
func TestGemma2TensorNames(t *testing.T) {
	mp, _ := WriteSpecs(t, SmallGemma2)
	m, err := frontend.LoadModel(mp)
	if err != nil {
		t.Fatal(err)
	}
	g, err := models.Build(m)
	if err != nil {
		t.Fatal(err)
	}
	var table []string
	for _, w := range g.Weights() {
		table = append(table, w.Tensors...)
	}
	slices.Sort(table)
	ref := Gemma2Dims{Layers: 3, Tied: true}.Gemma2TensorNames()
	slices.Sort(ref)
	if !slices.Equal(table, ref) {
		t.Fatalf("codegen's table\n%v\nthe reference reads\n%v", table, ref)
	}
}

// TestHFTensorsSplitsBuffers: HFTensors gives back, from a bundle's buffers, the tensors a
// checkpoint holds (q/k/v and gate/up stacked, shards of mixed dtypes).
func TestHFTensorsSplitsBuffers(t *testing.T) {
	syn := Compile(t, SmallModel)
	dir := t.TempDir()
	bufs := writeHFCheckpoint(t, syn, dir, hfOptions{})
	got, err := HFTensors(syn, func(name string) []byte { return bufs[name] })
	if err != nil {
		t.Fatal(err)
	}
	files, _ := filepath.Glob(filepath.Join(dir, "*.safetensors"))
	want := map[string][]float64{}
	for _, f := range files {
		st, closer, err := safetensors.Open(f)
		if err != nil {
			t.Fatal(err)
		}
		for name, ts := range st.Tensors {
			var v []float64
			for i := 0; i < len(ts.Data); {
				switch ts.Dtype {
				case "F32":
					v = append(v, float64(math.Float32frombits(binary.LittleEndian.Uint32(ts.Data[i:]))))
					i += 4
				case "BF16":
					v = append(v, float64(ops.BF16ToF32(binary.LittleEndian.Uint16(ts.Data[i:]))))
					i += 2
				case "F16":
					v = append(v, f16(binary.LittleEndian.Uint16(ts.Data[i:])))
					i += 2
				}
			}
			want[name] = v
		}
		closer.Close()
	}
	if !slices.Equal(slices.Sorted(maps.Keys(got)), slices.Sorted(maps.Keys(want))) {
		t.Fatalf("tensors %v, checkpoint %v", slices.Sorted(maps.Keys(got)), slices.Sorted(maps.Keys(want)))
	}
	for name, w := range want {
		if !slices.Equal(got[name], w) {
			t.Fatalf("tensor %s differs from the checkpoint's", name)
		}
	}
}

// f16 widens a half-precision value that is zero or normal (as exactInAll's are).
func f16(h uint16) float64 {
	if h&0x7fff == 0 {
		return 0
	}
	v := math.Ldexp(1+float64(h&0x3ff)/1024, int(h>>10&0x1f)-15)
	if h&0x8000 != 0 {
		return -v
	}
	return v
}
