package loader

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"

	"xmix/bundle"
	"xmix/input"
	"xmix/ops"
	"xmix/safetensors"
)

// Weights yields the contents of every weight buffer of a bundle: from safetensors files
// (memory-mapped), from the bundle itself, or generated deterministically.
type Weights struct {
	synth   *bundle.Synth
	tensors map[string]*safetensors.Tensor
	closers []io.Closer
	// index is the model.safetensors.index.json the tensors were chosen by, "" without one;
	// a tensor it does not map is missing even when some shard holds it.
	index string
	// tp is the bundle's tensor-parallel degree (1 without): sharded buffers are filled
	// with one rank's part of their tensors.
	tp int
	// origin says where the weights come from, for progress lines.
	origin string
}

// IndexFile is the Hugging Face index of a sharded checkpoint: it maps every tensor to the
// shard file that holds it.
const IndexFile = "model.safetensors.index.json"

// singleFile is the name Hugging Face gives an unsharded checkpoint.
const singleFile = "model.safetensors"

// SupportedWeightDtypes are the safetensors dtypes weights may be stored in; each is
// converted to the buffer's dtype on load.
var SupportedWeightDtypes = []string{"BF16", "F16", "F32"}

// OpenWeights resolves the bundle's weights reference. baseDir resolves a relative path.
// Weights from files are checked against every weight buffer of the bundle (tensor present,
// dtype supported, shape right) before any is read, and all problems are reported together.
func OpenWeights(b *bundle.Bundle, baseDir string) (*Weights, error) {
	ref := b.Manifest.Weights
	w := &Weights{tensors: map[string]*safetensors.Tensor{}, tp: max(1, b.Manifest.TP)}
	switch {
	case len(b.Weights) > 0:
		f, err := safetensors.Parse(b.Weights)
		if err != nil {
			return nil, fmt.Errorf("weights embedded in the bundle: %w", err)
		}
		w.tensors = f.Tensors
		w.origin = "the bundle"
	case ref.Synthetic != nil:
		w.synth = ref.Synthetic
		w.origin = "synthetic weights"
		return w, nil
	case ref.Path != "":
		path := ref.Path
		if !filepath.IsAbs(path) {
			path = filepath.Join(baseDir, path)
		}
		if err := w.open(path); err != nil {
			return nil, err
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
	if err := w.Check(b.Manifest.Buffers); err != nil {
		w.Close()
		return nil, err
	}
	return w, nil
}

// maxReported bounds how many checkpoint problems one error lists: a checkpoint of the wrong
// model has thousands.
const maxReported = 8

// Check validates the source tensors of every weight buffer in bufs against the checkpoint
// headers, without reading tensor data. Other buffers are ignored.
func (w *Weights) Check(bufs []bundle.Buffer) error {
	if w.synth != nil {
		return nil
	}
	var errs []error
	failed := 0
	for _, buf := range bufs {
		if buf.Kind != bundle.KindWeight {
			continue
		}
		if err := w.check(buf); err != nil {
			if failed++; failed <= maxReported {
				errs = append(errs, err)
			}
		}
	}
	if failed > maxReported {
		errs = append(errs, fmt.Errorf("and %d more buffers with problems", failed-maxReported))
	}
	return errors.Join(errs...)
}

// open memory-maps the checkpoint at path: one safetensors file, or a directory (see
// checkpointFiles). An index's claims are checked against the shards' headers.
func (w *Weights) open(path string) error {
	files, mapped, index, err := checkpointFiles(path)
	if err != nil {
		return err
	}
	w.index = index
	w.origin = path
	if len(files) > 1 {
		w.origin = fmt.Sprintf("%d files in %s", len(files), path)
	}
	for _, fp := range files {
		f, c, err := safetensors.Open(fp)
		if err != nil {
			w.Close()
			return fmt.Errorf("weights: %w", err)
		}
		w.closers = append(w.closers, c)
		if index == "" {
			maps.Copy(w.tensors, f.Tensors)
			continue
		}
		names := mapped[filepath.Base(fp)]
		for _, name := range names {
			t, ok := f.Tensors[name]
			if !ok {
				w.Close()
				return fmt.Errorf("weights: %s maps tensor %s to %s, but that file has no such tensor (the index and the shards are from different checkpoints, or a download was cut short)",
					index, name, filepath.Base(fp))
			}
			w.tensors[name] = t
		}
	}
	return nil
}

// WeightFiles lists the safetensors files of a weights path: the file itself, or for a
// directory the shards its model.safetensors.index.json names, else its model.safetensors,
// else every *.safetensors file in it.
func WeightFiles(path string) ([]string, error) {
	files, _, _, err := checkpointFiles(path)
	return files, err
}

// checkpointFiles resolves a weights path to its files. For an indexed directory it also
// returns, per shard file name, the tensors the index maps to it, and the index's path; every
// shard the index names must exist.
func checkpointFiles(path string) (files []string, mapped map[string][]string, index string, err error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, nil, "", fmt.Errorf("weights: %w (build the bundle from a spec whose weights: exists, or copy the weights there)", err)
	}
	if !st.IsDir() {
		return []string{path}, nil, "", nil
	}
	index = filepath.Join(path, IndexFile)
	if _, err := os.Stat(index); err == nil {
		files, mapped, err := readIndex(index)
		return files, mapped, index, err
	}
	if single := filepath.Join(path, singleFile); fileExists(single) {
		return []string{single}, nil, "", nil
	}
	files, err = filepath.Glob(filepath.Join(path, "*.safetensors"))
	if err != nil || len(files) == 0 {
		return nil, nil, "", fmt.Errorf("weights: no *.safetensors files in directory %s (a Hugging Face checkpoint has %s, or shards listed in %s)", path, singleFile, IndexFile)
	}
	sort.Strings(files)
	return files, nil, "", nil
}

func fileExists(path string) bool {
	st, err := os.Stat(path)
	return err == nil && st.Mode().IsRegular()
}

// readIndex reads a model.safetensors.index.json: its shard files (sorted, each checked to
// exist) and the tensors it maps to each.
func readIndex(path string) ([]string, map[string][]string, error) {
	data, err := input.Read(path, input.Settings)
	if err != nil {
		return nil, nil, fmt.Errorf("weights: %w", err)
	}
	var idx struct {
		WeightMap map[string]string `json:"weight_map"`
	}
	if err := json.Unmarshal(data, &idx); err != nil {
		return nil, nil, fmt.Errorf("weights: %s is not a checkpoint index: %w", path, err)
	}
	if len(idx.WeightMap) == 0 {
		return nil, nil, fmt.Errorf("weights: %s has no weight_map entries (it should map every tensor name to its shard file)", path)
	}
	dir := filepath.Dir(path)
	mapped := map[string][]string{}
	for name, shard := range idx.WeightMap {
		// Shards sit beside the index; a name reaching elsewhere is refused, not followed.
		if !filepath.IsLocal(shard) || filepath.Base(shard) != shard {
			return nil, nil, fmt.Errorf("weights: %s maps tensor %s to %q, which is not a file name in %s", path, name, shard, dir)
		}
		mapped[shard] = append(mapped[shard], name)
	}
	shards := slices.Sorted(maps.Keys(mapped))
	var files []string
	for _, shard := range shards {
		names := mapped[shard]
		sort.Strings(names)
		fp := filepath.Join(dir, shard)
		if !fileExists(fp) {
			more := ""
			if len(names) > 1 {
				more = fmt.Sprintf(" and %d more", len(names)-1)
			}
			return nil, nil, fmt.Errorf("weights: %s names shard %s (for tensor %s%s), but %s does not exist (download it, or fix the index)",
				filepath.Base(path), shard, names[0], more, fp)
		}
		files = append(files, fp)
	}
	return files, mapped, nil
}

// WeightsDigest is the digest a bundle records for weights at path: sha256 over the sorted
// tensor names, dtypes, shapes and byte lengths. It identifies the checkpoint without
// reading gigabytes at every load.
func WeightsDigest(path string) (string, error) {
	w := &Weights{tensors: map[string]*safetensors.Tensor{}}
	if err := w.open(path); err != nil {
		return "", err
	}
	defer w.Close()
	return headerDigest(w.tensors), nil
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

// Origin says where the weights come from: a path, the bundle, synthetic weights.
func (w *Weights) Origin() string { return w.origin }

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

// check validates buf's source tensors: each present, of a supported dtype, and together
// of buf's shape. One tensor must have exactly that shape; several are stacked along the
// first dimension, so they must agree with it on the others and sum to its first.
func (w *Weights) check(buf bundle.Buffer) error {
	if len(buf.Tensors) == 0 || len(buf.Shape) == 0 {
		return fmt.Errorf("weight buffer %s names no tensors or has no shape: the bundle is malformed", buf.Name)
	}
	ts := make([]*safetensors.Tensor, len(buf.Tensors))
	for i, name := range buf.Tensors {
		t, ok := w.tensors[name]
		if !ok {
			return w.missing(name, buf)
		}
		if !slices.Contains(SupportedWeightDtypes, t.Dtype) {
			return fmt.Errorf("weight tensor %s has dtype %s; supported: %s", name, t.Dtype, strings.Join(SupportedWeightDtypes, ", "))
		}
		ts[i] = t
	}
	if buf.Shard != nil {
		return checkSharded(buf, ts)
	}
	if len(ts) == 1 {
		if !slices.Equal(ts[0].Shape, buf.Shape) {
			return fmt.Errorf("weight tensor %s has shape %v, expected %v (buffer %s)", ts[0].Name, ts[0].Shape, buf.Shape, buf.Name)
		}
		return nil
	}
	rows := 0
	var parts []string
	for _, t := range ts {
		if len(t.Shape) != len(buf.Shape) || !slices.Equal(t.Shape[1:], buf.Shape[1:]) {
			return fmt.Errorf("weight tensor %s has shape %v, expected [*%s] (stacked into buffer %s of shape %v)",
				t.Name, t.Shape, shapeTail(buf.Shape), buf.Name, buf.Shape)
		}
		rows += t.Shape[0]
		parts = append(parts, fmt.Sprintf("%s %v", t.Name, t.Shape))
	}
	if rows != buf.Shape[0] {
		return fmt.Errorf("buffer %s of shape %v stacks %s: %d rows, expected %d (do the head counts in the config match the checkpoint?)",
			buf.Name, buf.Shape, strings.Join(parts, ", "), rows, buf.Shape[0])
	}
	return nil
}

// missing is the error for a tensor the checkpoint lacks, with what is most likely wrong.
func (w *Weights) missing(name string, buf bundle.Buffer) error {
	where := "the checkpoint"
	if w.index != "" {
		where = w.index + " (it maps no such tensor)"
	}
	hint := ""
	switch {
	case name == "lm_head.weight":
		hint = ": the model's embeddings are not tied (tie_word_embeddings false), so it needs its own output projection; if the checkpoint shares model.embed_tokens.weight, set tie_word_embeddings true in config.json or dims.tie_embeddings: true"
	case strings.HasSuffix(name, ".bias"):
		hint = ": the model family has q/k/v biases (qwen2); is the checkpoint of another family?"
	case strings.HasSuffix(name, "_norm.weight") && strings.Contains(name, "self_attn."):
		hint = ": the model family has QK-norm (qwen3); is the checkpoint of another family?"
	}
	return fmt.Errorf("weight tensor %s (for buffer %s) is missing from %s%s", name, buf.Name, where, hint)
}

func shapeTail(s []int) string {
	var b strings.Builder
	for _, d := range s[1:] {
		fmt.Fprintf(&b, " %d", d)
	}
	return b.String()
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
	g.idx.walk(lo, lo+len(dst)/esz, func(i, gi int) {
		v := float32(1)
		if !g.oneD {
			v = ops.SynthValue(g.key, g.scale, uint64(gi))
		}
		if esz == 2 {
			binary.LittleEndian.PutUint16(dst[2*(i-lo):], f32ToBF16(v))
		} else {
			binary.LittleEndian.PutUint32(dst[4*(i-lo):], math.Float32bits(v))
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
		if err := checkSharded(buf, []*safetensors.Tensor{t}); err != nil {
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
