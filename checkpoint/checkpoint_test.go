package checkpoint

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"xmix/bundle"
	"xmix/safetensors"
)

func write(t *testing.T, path string, ts ...safetensors.Tensor) {
	t.Helper()
	if err := safetensors.WriteFile(path, ts, nil); err != nil {
		t.Fatal(err)
	}
}

func zeros(name string, n int) safetensors.Tensor {
	return safetensors.FromF32(name, make([]float32, n), n)
}

// writeSharded writes a two-shard checkpoint with an index into dir: a [2,2] and b [3] in
// shard 1, c [4] in shard 2. edit changes the index's weight_map before it is written.
func writeSharded(t *testing.T, dir string, edit func(map[string]string)) {
	t.Helper()
	s1, s2 := "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"
	write(t, filepath.Join(dir, s1), safetensors.FromF32("a", []float32{1, 2, 3, 4}, 2, 2), zeros("b", 3))
	write(t, filepath.Join(dir, s2), zeros("c", 4))
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

// openChecked opens the checkpoint in dir and checks it against bufs, as a load does.
func openChecked(dir string, bufs ...bundle.Buffer) (*Checkpoint, error) {
	c, err := Open(dir)
	if err != nil {
		return nil, err
	}
	if err := c.Check(bufs); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

func TestShardedCheckpoint(t *testing.T) {
	dir := t.TempDir()
	writeSharded(t, dir, nil)
	// A stray file beside the shards (Mistral ships consolidated.safetensors) is not read.
	write(t, filepath.Join(dir, "consolidated.safetensors"), zeros("a", 9))
	files, err := Files(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(files) != 2 || filepath.Base(files[0]) != "model-00001-of-00002.safetensors" || filepath.Base(files[1]) != "model-00002-of-00002.safetensors" {
		t.Fatalf("Files = %v, want the two shards in order", files)
	}
	ac := bundle.Buffer{Name: "ac", Kind: bundle.KindWeight, Dtype: "f32", Shape: []int{4}, Tensors: []string{"c"}}
	c, err := openChecked(dir, ac)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if got, _ := c.Tensors["a"].Float32s(); !slices.Equal(got, []float32{1, 2, 3, 4}) {
		t.Fatalf("a = %v, want the shard's values, not the stray file's", got)
	}
	d1, err := Digest(dir)
	if err != nil {
		t.Fatal(err)
	}
	// The digest is of the tensors the index maps: the stray file does not change it.
	if err := os.Remove(filepath.Join(dir, "consolidated.safetensors")); err != nil {
		t.Fatal(err)
	}
	if d2, err := Digest(dir); err != nil || d2 != d1 {
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
			ck, err := openChecked(dir, c.buf)
			if err == nil {
				ck.Close()
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
	write(t, filepath.Join(dir, "model.safetensors"), zeros("a", 2))
	write(t, filepath.Join(dir, "adapter.safetensors"), zeros("a", 3))
	files, err := Files(dir)
	if err != nil || len(files) != 1 || filepath.Base(files[0]) != "model.safetensors" {
		t.Fatalf("Files = %v, %v; want model.safetensors alone", files, err)
	}
}
