package loader

import (
	"encoding/binary"
	"fmt"
	"math"
	"path/filepath"
	"runtime"
	"sync"

	"xmix/bundle"
	"xmix/checkpoint"
	"xmix/ops"
	"xmix/safetensors"
)

// Weights yields the contents of every weight buffer of a bundle: from safetensors files
// (memory-mapped), from the bundle itself, or generated deterministically.
type Weights struct {
	synth *bundle.Synth
	ck    *checkpoint.Checkpoint // nil for synthetic weights
	// tp is the bundle's tensor-parallel degree (1 without): sharded buffers are filled
	// with one rank's part of their tensors.
	tp int
	// origin says where the weights come from, for progress lines.
	origin string
}

// OpenWeights resolves the bundle's weights reference. baseDir resolves a relative path.
// Weights from files are checked against every weight buffer of the bundle (tensor present,
// dtype supported, shape right) before any is read, and all problems are reported together.
func OpenWeights(b *bundle.Bundle, baseDir string) (*Weights, error) {
	ref := b.Manifest.Weights
	w := &Weights{tp: max(1, b.Manifest.TP)}
	switch {
	case len(b.Weights) > 0:
		f, err := safetensors.Parse(b.Weights)
		if err != nil {
			return nil, fmt.Errorf("weights embedded in the bundle: %w", err)
		}
		w.ck = checkpoint.FromFile(f, "the bundle")
	case ref.Synthetic != nil:
		w.synth = ref.Synthetic
		w.origin = "synthetic weights"
		return w, nil
	case ref.Path != "":
		path := ref.Path
		if !filepath.IsAbs(path) {
			path = filepath.Join(baseDir, path)
		}
		ck, err := checkpoint.Open(path)
		if err != nil {
			return nil, err
		}
		w.ck = ck
		if ref.SHA256 != "" {
			if got := ck.Digest(); got != ref.SHA256 {
				w.Close()
				return nil, fmt.Errorf("weights at %s are not the ones the bundle was built with (header digest %s, bundle expects %s): rebuild the bundle with xmixc or point it at the right files", path, got[:12], ref.SHA256[:min(12, len(ref.SHA256))])
			}
		}
	default:
		return nil, fmt.Errorf("the bundle names no weights: rebuild it with weights: in the model spec")
	}
	w.origin = w.ck.Origin
	if err := w.ck.Check(b.Manifest.Buffers); err != nil {
		w.Close()
		return nil, err
	}
	return w, nil
}

// Origin says where the weights come from: a path, the bundle, synthetic weights.
func (w *Weights) Origin() string { return w.origin }

// Synthetic returns the synthetic-weights recipe, or nil for weights from files.
func (w *Weights) Synthetic() *bundle.Synth { return w.synth }

// Close releases memory maps.
func (w *Weights) Close() {
	if w.ck != nil {
		w.ck.Close()
	}
}

// Fill writes buffer buf's contents into dst (len = its byte size), converting dtypes and
// concatenating its source tensors along the first dimension; a sharded buffer gets rank
// 0's part (FillRank).
func (w *Weights) Fill(buf bundle.Buffer, dst []byte) error { return w.FillRank(buf, 0, dst) }

// FillRank is Fill for tensor-parallel rank rank: a buffer with a Shard holds that rank's
// part of each source tensor (bundle.Shard), sliced while converting; replicated buffers
// are the same on every rank.
func (w *Weights) FillRank(buf bundle.Buffer, rank int, dst []byte) error {
	if err := checkRank(rank, w.tp); err != nil {
		return fmt.Errorf("buffer %s: %w", buf.Name, err)
	}
	if w.synth != nil {
		return fillSynthetic(buf, dst, w.synth, w.tp, rank)
	}
	s, err := w.source(buf, rank)
	if err != nil {
		return err
	}
	if int64(len(dst)) != s.size {
		return fmt.Errorf("buffer %s of shape %v: %d bytes given, it has %d", buf.Name, buf.Shape, len(dst), s.size)
	}
	return s.fill(0, dst)
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
			binary.LittleEndian.PutUint16(dst[2*i:], ops.F32ToBF16(x))
		}
	default:
		return fmt.Errorf("cannot store weights as %s", dt)
	}
	return nil
}

// fillSynthetic generates rank's part of buf (synthRange), in parallel chunks: real-size
// models have billions of weights.
func fillSynthetic(buf bundle.Buffer, dst []byte, s *bundle.Synth, tp, rank int) error {
	esz, err := DtypeSize(buf.Dtype)
	if err != nil {
		return err
	}
	n := len(dst) / esz
	g := newSynthGen(buf, s, tp, rank)
	workers := runtime.GOMAXPROCS(0)
	chunk := (n + workers - 1) / workers
	var wg sync.WaitGroup
	for lo := 0; lo < n; lo += chunk {
		hi := min(lo+chunk, n)
		wg.Add(1)
		go func() {
			defer wg.Done()
			g.fill(lo, esz, dst[lo*esz:hi*esz])
		}()
	}
	wg.Wait()
	return nil
}

// synthGen makes synthetic values of rank's part of a buffer: element i of the unsharded
// buffer is SynthValue(seed ^ hash(name), i), so every rank's part equals the same slice at
// tp 1; a vector (norm weights) is all ones.
type synthGen struct {
	key   uint64
	scale float64
	oneD  bool
	idx   globalIndexer
}

func newSynthGen(buf bundle.Buffer, s *bundle.Synth, tp, rank int) synthGen {
	name := buf.Name
	if buf.Shard != nil && buf.Shard.Global != "" {
		name = buf.Shard.Global
	}
	return synthGen{key: s.Seed ^ ops.NameHash(name), scale: ops.SynthScale(s.Std), oneD: len(buf.Shape) == 1,
		idx: newGlobalIndexer(synthParts(buf, tp, rank))}
}

// fill writes the rank's elements from lo on into dst, esz bytes each.
func (g synthGen) fill(lo, esz int, dst []byte) {
	g.idx.runs(lo, lo+len(dst)/esz, func(i, gi, n int) {
		out := dst[esz*(i-lo) : esz*(i-lo+n)]
		for j := range n {
			v := float32(1)
			if !g.oneD {
				v = ops.SynthValue(g.key, g.scale, uint64(gi+j))
			}
			if esz == 2 {
				binary.LittleEndian.PutUint16(out[2*j:], ops.F32ToBF16(v))
			} else {
				binary.LittleEndian.PutUint32(out[4*j:], math.Float32bits(v))
			}
		}
	})
}

// ParamTensors maps each param buffer of a bundle to its bytes in the params section (rank
// 0's part of a sharded one: RankParamTensors).
func ParamTensors(b *bundle.Bundle) (map[string][]byte, error) { return RankParamTensors(b, 0) }

// RankParamTensors maps each param buffer of a bundle to the bytes tensor-parallel rank
// rank holds: the tensor in the params section, or the rank's part of it when the buffer
// is sharded (a head mask covers the heads of every rank; a rank keeps its own heads').
func RankParamTensors(b *bundle.Bundle, rank int) (map[string][]byte, error) {
	out := map[string][]byte{}
	tp := max(1, b.Manifest.TP)
	if err := checkRank(rank, tp); err != nil {
		return nil, err
	}
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
		if buf.Shard == nil {
			if int64(len(t.Data)) != n {
				return nil, fmt.Errorf("param buffer %s: tensor has %d bytes, buffer %d", buf.Name, len(t.Data), n)
			}
			out[buf.Name] = t.Data
			continue
		}
		if err := checkpoint.CheckSharded(buf, []*safetensors.Tensor{t}); err != nil {
			return nil, fmt.Errorf("param %w", err)
		}
		data := make([]byte, n)
		if err := fillParts(buf, []*safetensors.Tensor{t}, shardParts(buf.Shard, []matrix{asMatrix(t.Shape)}, tp, rank), data); err != nil {
			return nil, fmt.Errorf("param buffer %s: %w", buf.Name, err)
		}
		out[buf.Name] = data
	}
	return out, nil
}
