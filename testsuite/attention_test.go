package testsuite

import (
	"encoding/binary"
	"slices"
	"strings"
	"testing"

	"xmix/bundle"
	"xmix/loader"
)

// bf16Small is SmallModel with a bf16 cache (so that prefill chunks take the tensor-core
// attention) and contexts long enough for decode buckets to split them.
var bf16Small = strings.Replace(strings.Replace(SmallModel, "tokenizer: bytes", "kv_dtype: bf16\ntokenizer: bytes", 1),
	"max_seq_len: 128", "max_seq_len: 256", 1)

// chunkRecorder remembers every split word the engine writes.
type chunkRecorder struct {
	loader.Backend
	buffer string
	chunks []uint32
}

func (r *chunkRecorder) Write(name string, off int64, data []byte) error {
	if name == r.buffer {
		r.chunks = append(r.chunks, binary.LittleEndian.Uint32(data))
	}
	return r.Backend.Write(name, off, data)
}

// TestAttentionWiring: a prefill chunk runs the tensor-core kernel over its prompt rows and
// the decode kernel over the decode rows mixed in; decode buckets whose rows do not fill the
// GPU split contexts by the word the host writes each step. On the CPU both prefill nodes run
// the reference op over their rows, so a prompt fed as one chunk gives the tokens of the same
// prompt forced through decode steps, and a prompt prefilled beside a decoding request the
// tokens it gets alone.
func TestAttentionWiring(t *testing.T) {
	b := Compile(t, bf16Small)
	var split *bundle.AttnSplit
	for _, tmpl := range b.Templates {
		var kernels []string
		var grid [3]int
		for _, n := range tmpl.Nodes {
			if strings.HasPrefix(n.Label, "L0.attention") {
				kernels = append(kernels, n.Kernel)
				grid = n.Grid
			}
		}
		switch {
		case tmpl.Kind == "prefill":
			if len(kernels) != 2 || !strings.HasSuffix(kernels[0], "_singles") || !strings.HasSuffix(kernels[1], "_prefill") {
				t.Fatalf("%s: layer 0 attention kernels %v, want the singles and the prefill kernel", tmpl.Name, kernels)
			}
		case tmpl.AttnSplit != nil:
			// The host's plan counts the grid's blocks: splits in z, a row's head groups in y.
			a := tmpl.AttnSplit
			if a.MaxSplits != grid[2] || grid[2] < 2 || a.RowBlocks != grid[1] || grid[0] != tmpl.Tokens || !strings.HasSuffix(kernels[0], "_split") {
				t.Fatalf("%s: split %+v over a grid of %d splits, kernel %v", tmpl.Name, *tmpl.AttnSplit, grid, kernels)
			}
			if tmpl.Tokens == 1 {
				split = tmpl.AttnSplit
			}
		}
	}
	if split == nil {
		t.Fatal("decode_b1 does not split its context")
	}

	prompt := []int{5, 17, 200, 3, 99, 41, 8, 8, 150, 62, 71, 19, 44, 2, 250, 13, 77, 90}
	const n = 70 // past the fewest positions per split: the last steps run two splits
	chunked := Generate(t, NewCPU, b, []loader.Request{{Prompt: prompt, MaxTokens: n}})[0]
	rec := &chunkRecorder{Backend: NewCPU(t, b), buffer: split.Buffer}
	eng, err := loader.NewEngine(b, rec)
	if err != nil {
		t.Fatal(err)
	}
	res, err := eng.Generate([]loader.Request{{Prompt: prompt[:1], Force: prompt[1:], MaxTokens: len(prompt) - 1 + n}})
	rec.Close()
	if err != nil {
		t.Fatal(err)
	}
	if forced := res[0].Tokens[len(prompt)-1:]; !slices.Equal(forced, chunked.Tokens) {
		t.Fatalf("prompt as one chunk %v, forced through decode steps %v", chunked.Tokens, forced)
	}
	// Every decode step wrote its chunk: the longest context (the step's position + 1) over
	// the grid's splits, in multiples of the fewest positions per split.
	if len(rec.chunks) != len(prompt)-1+n-1 {
		t.Fatalf("%d split words for %d decode steps", len(rec.chunks), len(prompt)-1+n-1)
	}
	for i, c := range rec.chunks {
		if want := split.Chunk(i+2, 1); int(c) != want {
			t.Fatalf("step %d: chunk %d, want %d", i, c, want)
		}
	}

	// A prompt prefilled while another request decodes: its decode rows take the singles
	// kernel, the prompt the prefill kernel, and nothing changes for either.
	other := []int{9, 9, 9}
	both := Generate(t, NewCPU, b, []loader.Request{{Prompt: other, MaxTokens: 30}, {Prompt: prompt, MaxTokens: 6}})
	alone := Generate(t, NewCPU, b, []loader.Request{{Prompt: other, MaxTokens: 30}})
	if !slices.Equal(both[0].Tokens, alone[0].Tokens) || !slices.Equal(both[1].Tokens, chunked.Tokens[:6]) {
		t.Fatalf("batched %v %v, alone %v %v", both[0].Tokens, both[1].Tokens, alone[0].Tokens, chunked.Tokens[:6])
	}
}
