// Package checkpoint finds and checks a model's weights on disk: a safetensors file, or a
// Hugging Face checkpoint directory (model.safetensors, or the shards its
// model.safetensors.index.json names), memory-mapped; the digest a bundle records of its
// headers; and the check of its tensors against a bundle's weight buffers, run by the
// compiler at build time and by the loader before it reads anything.
package checkpoint

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"xmix/bundle"
	"xmix/input"
	"xmix/safetensors"
)

// IndexFile is the Hugging Face index of a sharded checkpoint: it maps every tensor to the
// shard file that holds it.
const IndexFile = "model.safetensors.index.json"

// singleFile is the name Hugging Face gives an unsharded checkpoint.
const singleFile = "model.safetensors"

// SupportedDtypes are the safetensors dtypes weights may be stored in; the loader converts
// each to the buffer's dtype.
var SupportedDtypes = []string{"BF16", "F16", "F32"}

// Checkpoint is a set of weight tensors by name, memory-mapped from their files (or parsed
// from a bundle's weights section).
type Checkpoint struct {
	Tensors map[string]*safetensors.Tensor
	// Origin says where the tensors come from, for progress lines and errors.
	Origin string
	// index is the model.safetensors.index.json the tensors were chosen by, "" without one;
	// a tensor it does not map is missing even when some shard holds it.
	index   string
	closers []io.Closer
}

// FromFile is the checkpoint of one parsed safetensors file (a bundle's embedded weights).
func FromFile(f *safetensors.File, origin string) *Checkpoint {
	return &Checkpoint{Tensors: f.Tensors, Origin: origin}
}

// Open memory-maps the checkpoint at path: one safetensors file, or a directory (see
// Files). An index's claims are checked against the shards' headers.
func Open(path string) (*Checkpoint, error) {
	files, mapped, index, err := resolve(path)
	if err != nil {
		return nil, err
	}
	c := &Checkpoint{Tensors: map[string]*safetensors.Tensor{}, Origin: path, index: index}
	if len(files) > 1 {
		c.Origin = fmt.Sprintf("%d files in %s", len(files), path)
	}
	for _, fp := range files {
		f, closer, err := safetensors.Open(fp)
		if err != nil {
			c.Close()
			return nil, fmt.Errorf("weights: %w", err)
		}
		c.closers = append(c.closers, closer)
		if index == "" {
			maps.Copy(c.Tensors, f.Tensors)
			continue
		}
		for _, name := range mapped[filepath.Base(fp)] {
			t, ok := f.Tensors[name]
			if !ok {
				c.Close()
				return nil, fmt.Errorf("weights: %s maps tensor %s to %s, but that file has no such tensor (the index and the shards are from different checkpoints, or a download was cut short)",
					index, name, filepath.Base(fp))
			}
			c.Tensors[name] = t
		}
	}
	return c, nil
}

// Close releases the memory maps.
func (c *Checkpoint) Close() {
	for _, cl := range c.closers {
		cl.Close()
	}
	c.closers = nil
}

// Files lists the safetensors files of a weights path: the file itself, or for a directory
// the shards its model.safetensors.index.json names, else its model.safetensors, else every
// *.safetensors file in it.
func Files(path string) ([]string, error) {
	files, _, _, err := resolve(path)
	return files, err
}

// resolve resolves a weights path to its files. For an indexed directory it also returns,
// per shard file name, the tensors the index maps to it, and the index's path; every shard
// the index names must exist.
func resolve(path string) (files []string, mapped map[string][]string, index string, err error) {
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
	var files []string
	for _, shard := range slices.Sorted(maps.Keys(mapped)) {
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

// Digest is the digest a bundle records for the weights at path (Checkpoint.Digest).
func Digest(path string) (string, error) {
	c, err := Open(path)
	if err != nil {
		return "", err
	}
	defer c.Close()
	return c.Digest(), nil
}

// Digest is sha256 over the sorted tensor names, dtypes, shapes and byte lengths: it
// identifies the checkpoint without reading gigabytes at every load.
func (c *Checkpoint) Digest() string {
	h := sha256.New()
	for _, n := range slices.Sorted(maps.Keys(c.Tensors)) {
		t := c.Tensors[n]
		fmt.Fprintf(h, "%s %s %v %d\n", n, t.Dtype, t.Shape, len(t.Data))
	}
	return hex.EncodeToString(h.Sum(nil))
}

// maxReported bounds how many problems one error lists: a checkpoint of the wrong model has
// thousands.
const maxReported = 8

// Check validates the source tensors of every weight buffer in bufs against the headers,
// without reading tensor data, and reports the problems together. Other buffers are ignored.
func (c *Checkpoint) Check(bufs []bundle.Buffer) error {
	var errs []error
	failed := 0
	for _, buf := range bufs {
		if buf.Kind != bundle.KindWeight {
			continue
		}
		if _, err := c.Sources(buf); err != nil {
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

// Sources returns buf's source tensors, checked: each present, of a supported dtype, and
// together of buf's shape. One tensor must have exactly that shape; several are stacked
// along the first dimension, so they must agree with it on the others and sum to its first.
func (c *Checkpoint) Sources(buf bundle.Buffer) ([]*safetensors.Tensor, error) {
	if len(buf.Tensors) == 0 || len(buf.Shape) == 0 {
		return nil, fmt.Errorf("weight buffer %s names no tensors or has no shape: the bundle is malformed", buf.Name)
	}
	ts := make([]*safetensors.Tensor, len(buf.Tensors))
	for i, name := range buf.Tensors {
		t, ok := c.Tensors[name]
		if !ok {
			return nil, c.missing(name, buf)
		}
		if !slices.Contains(SupportedDtypes, t.Dtype) {
			return nil, fmt.Errorf("weight tensor %s has dtype %s; supported: %s", name, t.Dtype, strings.Join(SupportedDtypes, ", "))
		}
		ts[i] = t
	}
	return ts, checkShapes(buf, ts)
}

func checkShapes(buf bundle.Buffer, ts []*safetensors.Tensor) error {
	if buf.Shard != nil {
		return CheckSharded(buf, ts)
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
func (c *Checkpoint) missing(name string, buf bundle.Buffer) error {
	where := "the checkpoint"
	if c.index != "" {
		where = c.index + " (it maps no such tensor)"
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

// CheckSharded validates the source tensors of a sharded buffer: each tensor's extent along
// the cut dimension is the one the bundle recorded, and the rank parts stack into the
// buffer's shape.
func CheckSharded(buf bundle.Buffer, ts []*safetensors.Tensor) error {
	s := buf.Shard
	if len(s.Extents) != len(ts) {
		return fmt.Errorf("weight buffer %s: %d shard extents for %d tensors: the bundle is malformed", buf.Name, len(s.Extents), len(ts))
	}
	rows := 0
	for i, t := range ts {
		if s.Dim >= len(t.Shape) || t.Shape[s.Dim] != s.Extents[i] {
			return fmt.Errorf("weight tensor %s has shape %v; buffer %s cuts a dimension %d of %d across ranks (do the dims in the config match the checkpoint?)",
				t.Name, t.Shape, buf.Name, s.Dim, s.Extents[i])
		}
		if s.Dim == 0 && !slices.Equal(t.Shape[1:], buf.Shape[1:]) {
			return fmt.Errorf("weight tensor %s has shape %v, expected [%d%s] (rows cut across ranks into buffer %s of shape %v)",
				t.Name, t.Shape, s.Extents[i], shapeTail(buf.Shape), buf.Name, buf.Shape)
		}
		if s.Dim == 1 && len(t.Shape) != 2 {
			return fmt.Errorf("weight tensor %s has shape %v; buffer %s cuts its columns, so it must be a matrix", t.Name, t.Shape, buf.Name)
		}
		rows += t.Shape[0]
	}
	if s.Dim == 1 && rows != buf.Shape[0] {
		return fmt.Errorf("buffer %s of shape %v stacks tensors %v of %d rows in all, expected %d", buf.Name, buf.Shape, buf.Tensors, rows, buf.Shape[0])
	}
	return nil
}

func shapeTail(s []int) string {
	var b strings.Builder
	for _, d := range s[1:] {
		fmt.Fprintf(&b, " %d", d)
	}
	return b.String()
}
