package loader

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"xmix/bundle"
	"xmix/checkpoint"
	"xmix/safetensors"
)

// randTensor is a tensor of random bits of a float dtype (no NaN: exponents stay small).
func randTensor(rng *rand.Rand, name, dtype string, shape ...int) safetensors.Tensor {
	n := 1
	for _, d := range shape {
		n *= d
	}
	sz, _ := safetensors.DtypeSize(dtype)
	data := make([]byte, n*sz)
	for i := 0; i < n; i++ {
		switch dtype {
		case "F32":
			binary.LittleEndian.PutUint32(data[4*i:], rng.Uint32()&0xbfffffff)
		default: // BF16, F16
			binary.LittleEndian.PutUint16(data[2*i:], uint16(rng.Uint32())&0xbbff)
		}
	}
	return safetensors.Tensor{Name: name, Dtype: dtype, Shape: shape, Data: data}
}

// streamCheckpoint writes a checkpoint of two shards and an index: bf16 tensors copied as
// they are, f32 and f16 ones converted, tensors stacked into one buffer, and returns the
// weight buffers of a bundle over it.
func streamCheckpoint(t *testing.T) (*bundle.Bundle, []bundle.Buffer) {
	t.Helper()
	rng := rand.New(rand.NewPCG(7, 8))
	dir := t.TempDir()
	shard1 := []safetensors.Tensor{randTensor(rng, "a", "BF16", 300, 7), randTensor(rng, "b", "F32", 5, 7)}
	shard2 := []safetensors.Tensor{randTensor(rng, "c", "F16", 40, 33), randTensor(rng, "d", "BF16", 1000), randTensor(rng, "e", "BF16", 64, 64)}
	index := map[string]map[string]string{"weight_map": {}}
	for file, ts := range map[string][]safetensors.Tensor{"model-1.safetensors": shard1, "model-2.safetensors": shard2} {
		writeST(t, filepath.Join(dir, file), ts...)
		for _, x := range ts {
			index["weight_map"][x.Name] = file
		}
	}
	raw, _ := json.Marshal(index)
	if err := os.WriteFile(filepath.Join(dir, checkpoint.IndexFile), raw, 0o644); err != nil {
		t.Fatal(err)
	}
	bufs := []bundle.Buffer{
		{Name: "ab", Kind: bundle.KindWeight, Dtype: "bf16", Shape: []int{305, 7}, Tensors: []string{"a", "b"}},
		{Name: "c", Kind: bundle.KindWeight, Dtype: "f32", Shape: []int{40, 33}, Tensors: []string{"c"}},
		{Name: "d", Kind: bundle.KindWeight, Dtype: "bf16", Shape: []int{1000}, Tensors: []string{"d"}},
		{Name: "e", Kind: bundle.KindWeight, Dtype: "bf16", Shape: []int{64, 64}, Tensors: []string{"e"}},
	}
	return &bundle.Bundle{Manifest: bundle.Manifest{Weights: bundle.WeightsRef{Path: dir}, Buffers: bufs}}, bufs
}

// wholeBuffers is what FillRank makes of every buffer: the reference of the streamed loads.
func wholeBuffers(t *testing.T, w *Weights, bufs []bundle.Buffer, rank int) [][]byte {
	t.Helper()
	out := make([][]byte, len(bufs))
	for i, buf := range bufs {
		n, err := BufferBytes(buf)
		if err != nil {
			t.Fatal(err)
		}
		out[i] = make([]byte, n)
		if err := w.FillRank(buf, rank, out[i]); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// Any run of whole elements of a buffer is made on its own exactly as the whole buffer
// makes it: copied and converted tensors, stacked tensors, tensor-parallel parts (rows and
// columns cut), synthetic weights.
func TestSourceFillsAnyRange(t *testing.T) {
	b, bufs := streamCheckpoint(t)
	w, err := OpenWeights(b, "")
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	ts := map[string]*safetensors.Tensor{"q": seqTensor("q", 0, 8, 4), "k": seqTensor("k", 100, 4, 4), "v": seqTensor("v", 200, 4, 4), "o": seqTensor("o", 300, 4, 8)}
	sharded := &Weights{ck: &checkpoint.Checkpoint{Tensors: ts}, tp: 2}
	synth := &Weights{synth: &bundle.Synth{Seed: 3, Std: 0.02}, tp: 1}
	rng := rand.New(rand.NewPCG(1, 2))
	type tc struct {
		w    *Weights
		bufs []bundle.Buffer
		rank int
	}
	cases := []tc{{w, bufs, 0}, {synth, bufs, 0}}
	for _, c := range shardCases(2) {
		cases = append(cases, tc{sharded, []bundle.Buffer{c.buf}, 1})
	}
	for _, c := range cases {
		whole := wholeBuffers(t, c.w, c.bufs, c.rank)
		for i, buf := range c.bufs {
			s, err := c.w.source(buf, c.rank)
			if err != nil {
				t.Fatal(err)
			}
			elems := int(s.size) / s.esz
			for range 50 {
				lo := rng.IntN(elems)
				hi := lo + 1 + rng.IntN(elems-lo)
				dst := make([]byte, (hi-lo)*s.esz)
				if err := s.fill(int64(lo*s.esz), dst); err != nil {
					t.Fatal(err)
				}
				if !slices.Equal(dst, whole[i][lo*s.esz:hi*s.esz]) {
					t.Fatalf("buffer %s (rank %d, synthetic %v): elements [%d,%d) differ from the whole buffer's", buf.Name, c.rank, c.w.synth != nil, lo, hi)
				}
			}
			for _, bad := range [][2]int64{{-int64(s.esz), int64(s.esz)}, {1, int64(s.esz)}, {0, s.size + int64(s.esz)}} {
				if err := s.fill(bad[0], make([]byte, bad[1])); err == nil || !strings.Contains(err.Error(), "not whole elements") {
					t.Errorf("buffer %s: bytes [%d,%d): %v", buf.Name, bad[0], bad[0]+bad[1], err)
				}
			}
		}
	}
}

// FillAll gives what FillRank gives, with one reader or several, the buffers cut into
// chunks that end inside tensors, and reports its progress.
func TestFillAllMatchesFillRank(t *testing.T) {
	b, bufs := streamCheckpoint(t)
	w, err := OpenWeights(b, "")
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	want := wholeBuffers(t, w, bufs, 0)
	for _, readers := range []int{1, 3} {
		var lines []string
		dsts := make([][]byte, len(bufs))
		for i := range dsts {
			dsts[i] = make([]byte, len(want[i]))
		}
		opt := LoadOptions{Readers: readers, chunk: 998, every: time.Nanosecond, Progress: func(f string, a ...any) { lines = append(lines, fmt.Sprintf(f, a...)) }}
		if err := w.FillAll(bufs, 0, dsts, opt); err != nil {
			t.Fatal(err)
		}
		for i := range bufs {
			if !slices.Equal(dsts[i], want[i]) {
				t.Fatalf("%d readers: buffer %s differs from FillRank's", readers, bufs[i].Name)
			}
		}
		last := lines[len(lines)-1]
		if len(lines) < 5 || !strings.Contains(lines[0], "weights:  1") || !strings.Contains(lines[0], "GB/s") || !strings.Contains(lines[0], "s left") ||
			!strings.Contains(last, fmt.Sprintf("GB/s, %d readers)", readers)) {
			t.Fatalf("%d readers: progress %q", readers, lines)
		}
	}
	if err := w.FillAll(bufs, 0, make([][]byte, len(bufs)), LoadOptions{}); err == nil || !strings.Contains(err.Error(), "buffer ab: 0 bytes given, it has 4270") {
		t.Fatalf("short destinations: %v", err)
	}
}

// lateDevice completes its uploads in order, at random later times, and only then reads the
// staged bytes, as a DMA engine does: a staging chunk that a reader refilled before its copy
// completed would land corrupted.
type lateDevice struct {
	staging  [][]byte
	mem      [][]byte
	queue    []WeightChunk
	rng      *rand.Rand
	failAt   int // the Upload call that fails (0: none)
	calls    int
	inflight int // most uploads in flight at once
}

func (d *lateDevice) Staging() [][]byte { return d.staging }

func (d *lateDevice) Upload(c WeightChunk) error {
	d.calls++
	if d.calls == d.failAt {
		return errors.New("copy engine on fire")
	}
	d.queue = append(d.queue, c)
	d.inflight = max(d.inflight, len(d.queue))
	return nil
}

func (d *lateDevice) Done(wait bool) (bool, error) {
	if len(d.queue) == 0 {
		return false, errors.New("Done with nothing in flight")
	}
	if !wait && d.rng.IntN(3) > 0 {
		return false, nil
	}
	if !wait {
		time.Sleep(time.Duration(d.rng.IntN(50)) * time.Microsecond)
	}
	c := d.queue[0]
	copy(d.mem[c.Buf][c.Off:], c.Data)
	d.queue = d.queue[1:]
	return true, nil
}

func newLateDevice(want [][]byte, slices, chunk int) *lateDevice {
	d := &lateDevice{rng: rand.New(rand.NewPCG(3, 4))}
	for range slices {
		d.staging = append(d.staging, make([]byte, chunk))
	}
	for _, w := range want {
		d.mem = append(d.mem, make([]byte, len(w)))
	}
	return d
}

// Upload lands every byte FillRank makes in the device's buffers, through a few staging
// chunks that readers refill only once their copy has completed; a failed copy stops the
// load with the buffer's name, after the readers and the copies in flight have finished.
func TestUploadThroughStagingChunks(t *testing.T) {
	b, bufs := streamCheckpoint(t)
	w, err := OpenWeights(b, "")
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	want := wholeBuffers(t, w, bufs, 0)
	for _, c := range []struct{ readers, slices, chunk int }{{1, 1, 1000}, {2, 3, 998}, {4, 10, 512}, {3, 4, 1 << 20}} {
		d := newLateDevice(want, c.slices, c.chunk)
		var lines []string
		opt := LoadOptions{Readers: c.readers, Progress: func(f string, a ...any) { lines = append(lines, fmt.Sprintf(f, a...)) }}
		if err := w.Upload(bufs, 0, d, opt); err != nil {
			t.Fatalf("%+v: %v", c, err)
		}
		for i := range bufs {
			if !slices.Equal(d.mem[i], want[i]) {
				t.Fatalf("%+v: buffer %s on the device differs from FillRank's", c, bufs[i].Name)
			}
		}
		if len(d.queue) != 0 || d.inflight > c.slices || len(lines) != 1 || !strings.Contains(lines[0], "weights: 0.00 GB in") {
			t.Fatalf("%+v: %d uploads left, %d in flight at most, progress %q", c, len(d.queue), d.inflight, lines)
		}
	}
	base := runtime.NumGoroutine()
	d := newLateDevice(want, 4, 700)
	d.failAt = 5
	err = w.Upload(bufs, 0, d, LoadOptions{Readers: 3})
	if err == nil || !strings.Contains(err.Error(), "uploading ") || !strings.Contains(err.Error(), "copy engine on fire") {
		t.Fatalf("failed copy: %v", err)
	}
	if len(d.queue) != 0 {
		t.Fatalf("failed copy: Upload returned with %d copies in flight", len(d.queue))
	}
	for deadline := time.Now().Add(2 * time.Second); runtime.NumGoroutine() > base; {
		if time.Now().After(deadline) {
			t.Fatalf("failed copy: %d goroutines left running, %d before", runtime.NumGoroutine(), base)
		}
		time.Sleep(time.Millisecond)
	}
	if err := w.Upload(bufs, 0, &lateDevice{}, LoadOptions{}); err == nil || !strings.Contains(err.Error(), "no staging memory") {
		t.Fatalf("no staging: %v", err)
	}
}
