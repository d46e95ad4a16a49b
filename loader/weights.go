package loader

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"

	"xmix/bundle"
	"xmix/ops"
	"xmix/safetensors"
)

// Weights yields the contents of every weight buffer of a bundle: from safetensors files
// (memory-mapped), from the bundle itself, or generated deterministically.
type Weights struct {
	synth   *bundle.Synth
	tensors map[string]*safetensors.Tensor
	closers []io.Closer
}

// OpenWeights resolves the bundle's weights reference. baseDir resolves a relative path.
func OpenWeights(b *bundle.Bundle, baseDir string) (*Weights, error) {
	ref := b.Manifest.Weights
	w := &Weights{tensors: map[string]*safetensors.Tensor{}}
	switch {
	case len(b.Weights) > 0:
		f, err := safetensors.Parse(b.Weights)
		if err != nil {
			return nil, fmt.Errorf("weights embedded in the bundle: %w", err)
		}
		w.add(f)
	case ref.Synthetic != nil:
		w.synth = ref.Synthetic
	case ref.Path != "":
		path := ref.Path
		if !filepath.IsAbs(path) {
			path = filepath.Join(baseDir, path)
		}
		files, err := WeightFiles(path)
		if err != nil {
			return nil, err
		}
		for _, fp := range files {
			f, c, err := safetensors.Open(fp)
			if err != nil {
				w.Close()
				return nil, fmt.Errorf("weights %s: %w", fp, err)
			}
			w.closers = append(w.closers, c)
			w.add(f)
		}
		if ref.SHA256 != "" {
			if got := headerDigest(w.tensors); got != ref.SHA256 {
				w.Close()
				return nil, fmt.Errorf("weights at %s are not the ones the bundle was built with (header digest %s, bundle expects %s): rebuild the bundle with xmixc or point it at the right files", path, got[:12], ref.SHA256[:min(12, len(ref.SHA256))])
			}
		}
	default:
		return nil, fmt.Errorf("the bundle names no weights: rebuild it with weights: in the model spec")
	}
	return w, nil
}

func (w *Weights) add(f *safetensors.File) {
	for name, t := range f.Tensors {
		w.tensors[name] = t
	}
}

// WeightFiles lists the safetensors files of a weights path: the file itself, or every
// *.safetensors file of a directory.
func WeightFiles(path string) ([]string, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("weights: %w (build the bundle from a spec whose weights: exists, or copy the weights there)", err)
	}
	if !st.IsDir() {
		return []string{path}, nil
	}
	files, err := filepath.Glob(filepath.Join(path, "*.safetensors"))
	if err != nil || len(files) == 0 {
		return nil, fmt.Errorf("weights: no *.safetensors files in directory %s", path)
	}
	sort.Strings(files)
	return files, nil
}

// WeightsDigest is the digest a bundle records for weights at path: sha256 over the sorted
// tensor names, dtypes, shapes and byte lengths. It identifies the checkpoint without
// reading gigabytes at every load.
func WeightsDigest(path string) (string, error) {
	files, err := WeightFiles(path)
	if err != nil {
		return "", err
	}
	all := map[string]*safetensors.Tensor{}
	for _, fp := range files {
		f, c, err := safetensors.Open(fp)
		if err != nil {
			return "", fmt.Errorf("weights %s: %w", fp, err)
		}
		for n, t := range f.Tensors {
			all[n] = t
		}
		defer c.Close()
	}
	return headerDigest(all), nil
}

func headerDigest(ts map[string]*safetensors.Tensor) string {
	names := make([]string, 0, len(ts))
	for n := range ts {
		names = append(names, n)
	}
	sort.Strings(names)
	h := sha256.New()
	for _, n := range names {
		t := ts[n]
		fmt.Fprintf(h, "%s %s %v %d\n", n, t.Dtype, t.Shape, len(t.Data))
	}
	return hex.EncodeToString(h.Sum(nil))
}

// Synthetic returns the synthetic-weights recipe, or nil for weights from files.
func (w *Weights) Synthetic() *bundle.Synth { return w.synth }

// Close releases memory maps.
func (w *Weights) Close() {
	for _, c := range w.closers {
		c.Close()
	}
	w.closers = nil
}

// Fill writes buffer buf's contents into dst (len = its byte size), converting dtypes and
// concatenating its source tensors along the first dimension.
func (w *Weights) Fill(buf bundle.Buffer, dst []byte) error {
	if w.synth != nil {
		return fillSynthetic(buf, dst, w.synth)
	}
	esz, err := DtypeSize(buf.Dtype)
	if err != nil {
		return err
	}
	off := 0
	for _, name := range buf.Tensors {
		t, ok := w.tensors[name]
		if !ok {
			return fmt.Errorf("weight tensor %s (for buffer %s) is missing from the checkpoint", name, buf.Name)
		}
		n := t.Elements()
		if off+n*esz > len(dst) {
			return fmt.Errorf("weight tensor %s has shape %v: buffer %s of shape %v has no room for it", name, t.Shape, buf.Name, buf.Shape)
		}
		if len(t.Shape) == 0 || (len(buf.Shape) > 1 && (len(t.Shape) != len(buf.Shape) || !slices.Equal(t.Shape[1:], buf.Shape[1:]))) {
			return fmt.Errorf("weight tensor %s has shape %v, expected [*%s]", name, t.Shape, shapeTail(buf.Shape))
		}
		if err := convert(t, buf.Dtype, dst[off:off+n*esz]); err != nil {
			return fmt.Errorf("weight tensor %s: %w", name, err)
		}
		off += n * esz
	}
	if off != len(dst) {
		return fmt.Errorf("buffer %s of shape %v: its tensors %s hold %d elements, expected %d", buf.Name, buf.Shape,
			strings.Join(buf.Tensors, ", "), off/esz, len(dst)/esz)
	}
	return nil
}

func shapeTail(s []int) string {
	var parts []string
	for _, d := range s[1:] {
		parts = append(parts, fmt.Sprint(d))
	}
	if len(parts) == 0 {
		return ""
	}
	return ", " + strings.Join(parts, ", ")
}

// convert writes tensor t into dst in dtype dt.
func convert(t *safetensors.Tensor, dt string, dst []byte) error {
	if (t.Dtype == "BF16" && dt == "bf16") || (t.Dtype == "F32" && dt == "f32") {
		copy(dst, t.Data)
		return nil
	}
	v, err := t.Float32s()
	if err != nil {
		return err
	}
	switch dt {
	case "f32":
		for i, x := range v {
			binary.LittleEndian.PutUint32(dst[4*i:], math.Float32bits(x))
		}
	case "bf16":
		for i, x := range v {
			binary.LittleEndian.PutUint16(dst[2*i:], f32ToBF16(x))
		}
	default:
		return fmt.Errorf("cannot store weights as %s", dt)
	}
	return nil
}

func f32ToBF16(f float32) uint16 {
	b := math.Float32bits(f)
	if b&0x7fffffff > 0x7f800000 {
		return uint16(b>>16) | 0x40
	}
	return uint16((b + 0x7fff + (b>>16)&1) >> 16)
}

func fillSynthetic(buf bundle.Buffer, dst []byte, s *bundle.Synth) error {
	esz, err := DtypeSize(buf.Dtype)
	if err != nil {
		return err
	}
	key, scale := s.Seed^ops.NameHash(buf.Name), ops.SynthScale(s.Std)
	oneD := len(buf.Shape) == 1
	n := len(dst) / esz
	// Real-size models have billions of weights: fill in parallel chunks.
	workers := runtime.GOMAXPROCS(0)
	chunk := (n + workers - 1) / workers
	var wg sync.WaitGroup
	for lo := 0; lo < n; lo += chunk {
		hi := min(lo+chunk, n)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := lo; i < hi; i++ {
				v := float32(1) // norm weights
				if !oneD {
					v = ops.SynthValue(key, scale, uint64(i))
				}
				if esz == 2 {
					binary.LittleEndian.PutUint16(dst[2*i:], f32ToBF16(v))
				} else {
					binary.LittleEndian.PutUint32(dst[4*i:], math.Float32bits(v))
				}
			}
		}()
	}
	wg.Wait()
	return nil
}

// ParamTensors maps each param buffer of a bundle to its bytes in the params section.
func ParamTensors(b *bundle.Bundle) (map[string][]byte, error) {
	out := map[string][]byte{}
	if len(b.Params) == 0 {
		return out, nil
	}
	f, err := safetensors.Parse(b.Params)
	if err != nil {
		return nil, fmt.Errorf("bundle params section: %w", err)
	}
	for _, buf := range b.Manifest.Buffers {
		if buf.Kind != bundle.KindParam {
			continue
		}
		if len(buf.Tensors) != 1 {
			return nil, fmt.Errorf("param buffer %s names %d tensors, want 1", buf.Name, len(buf.Tensors))
		}
		t, ok := f.Tensors[buf.Tensors[0]]
		if !ok {
			return nil, fmt.Errorf("param buffer %s: tensor %s missing from the bundle's params section", buf.Name, buf.Tensors[0])
		}
		n, err := BufferBytes(buf)
		if err != nil {
			return nil, err
		}
		if int64(len(t.Data)) != n {
			return nil, fmt.Errorf("param buffer %s: tensor has %d bytes, buffer %d", buf.Name, len(t.Data), n)
		}
		out[buf.Name] = t.Data
	}
	return out, nil
}
