package bundle

import (
	"encoding/json"
	"strings"
	"testing"
)

// tpBundle is testBundle at tp 2: its steer vector sharded, a row-parallel weight, a
// partial-sum buffer all-reduced and a logits shard gathered.
func tpBundle() *Bundle {
	b := testBundle()
	b.Manifest.TP = 2
	b.Manifest.Buffers[4].Shape = []int{4}
	b.Manifest.Buffers[4].Shard = &Shard{Dim: 0, Extents: []int{8}}
	b.Manifest.Buffers = append(b.Manifest.Buffers,
		Buffer{Name: "wo", Kind: KindWeight, Dtype: "bf16", Shape: []int{8, 2}, Tensors: []string{"o_proj"}, Shard: &Shard{Dim: 1, Extents: []int{4}}},
		Buffer{Name: "head", Kind: KindWeight, Dtype: "bf16", Shape: []int{16, 8}, Tensors: []string{"model.embed_tokens.weight"},
			Shard: &Shard{Dim: 0, Extents: []int{32}, Global: "embed"}},
		Buffer{Name: "logits_shard", Kind: KindActivation, Dtype: "f32", Shape: []int{4, 16}},
		Buffer{Name: "logits", Kind: KindActivation, Dtype: "f32", Shape: []int{4, 32}},
	)
	b.Templates[0].Nodes = append(b.Templates[0].Nodes,
		Node{Label: "reduce", Collective: &Collective{Op: AllReduceSum, In: "x", Out: "x", Rows: 4, Cols: 8}},
		Node{Label: "gather", Collective: &Collective{Op: AllGatherCols, In: "logits_shard", Out: "logits", Rows: 4, Cols: 16}},
	)
	return b
}

func TestVerifyAcceptsTPBundle(t *testing.T) {
	b := tpBundle()
	if err := Verify(b); err != nil {
		t.Fatal(err)
	}
	back, err := Unmarshal(mustMarshal(t, b))
	if err != nil {
		t.Fatal(err)
	}
	if back.Manifest.TP != 2 || back.Manifest.Buffers[6].Shard.Global != "embed" || back.Templates[0].Nodes[3].Collective.Op != AllGatherCols {
		t.Fatalf("tp fields did not survive the round trip: %+v", back.Manifest.Buffers[6])
	}
}

// TestNoTPFieldsWithoutTP: a bundle without tensor parallelism writes none of the new
// fields, so its bytes are what they were before they existed.
func TestNoTPFieldsWithoutTP(t *testing.T) {
	b := testBundle()
	for _, v := range []any{b.Manifest, b.Templates} {
		data, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		for _, key := range []string{`"tp"`, `"shard"`, `"collective"`} {
			if strings.Contains(string(data), key) {
				t.Errorf("a bundle without tp writes %s: %s", key, data)
			}
		}
	}
}

func TestVerifyTPFailures(t *testing.T) {
	cases := []struct {
		name   string
		mutate func(b *Bundle)
		want   string
	}{
		{"tp range", func(b *Bundle) { b.Manifest.TP = 1000 }, "tensor-parallel degree 1000 is outside 0..256"},
		{"shard without tp", func(b *Bundle) { b.Manifest.TP = 1 }, `buffer 4 ("steer_vec"): shard: the bundle is not tensor-parallel (tp 1)`},
		{"shard kind", func(b *Bundle) {
			b.Manifest.Buffers[1].Shard = &Shard{Dim: 0, Extents: []int{8}}
		}, `buffer 1 ("x"): shard: a activation buffer cannot be sharded`},
		{"extent count", func(b *Bundle) { b.Manifest.Buffers[4].Shard.Extents = []int{4, 4} }, "2 extents for 1 tensors"},
		{"uneven extent", func(b *Bundle) { b.Manifest.Buffers[4].Shard.Extents = []int{7} }, `extent 7 of tensor "steer.vec" does not split into 2 equal parts`},
		{"dim 0 rows", func(b *Bundle) { b.Manifest.Buffers[4].Shard.Extents = []int{16} }, "stack to 8 rows, the buffer's shape [4] has 4"},
		{"dim 1 columns", func(b *Bundle) { b.Manifest.Buffers[5].Shard.Extents = []int{8} }, `tensor "o_proj" of 8 columns gives parts of 4, the buffer's shape [8 2] has 2`},
		{"dim 1 vector", func(b *Bundle) { b.Manifest.Buffers[4].Shard.Dim = 1 }, "dim 1 cuts a matrix; the buffer's shape [4] is not 2-D"},
		{"dim 2", func(b *Bundle) { b.Manifest.Buffers[5].Shard.Dim = 2 }, "dim 2: want 0 (rows) or 1 (columns)"},
		{"global", func(b *Bundle) { b.Manifest.Buffers[6].Shard.Global = "x" }, `global "x" is not an unsharded weight buffer`},
		{"param size", func(b *Bundle) {
			b.Manifest.Buffers[4].Shape = []int{8}
			b.Manifest.Buffers[4].Shard.Extents = []int{16}
		}, "shape [8] holds 16 elements but tensors [steer.vec] hold 8"},
		{"collective without tp", func(b *Bundle) {
			b.Manifest.TP = 0
			for i := range b.Manifest.Buffers {
				b.Manifest.Buffers[i].Shard = nil
			}
			b.Manifest.Buffers[4].Shape = []int{8}
		}, `node 2 ("reduce"): collective all_reduce_sum in a bundle that is not tensor-parallel`},
		{"collective kernel", func(b *Bundle) { b.Templates[0].Nodes[2].Kernel = "embed" }, "a collective node launches no kernel"},
		{"collective op", func(b *Bundle) { b.Templates[0].Nodes[2].Collective.Op = "broadcast" }, `unknown collective "broadcast"`},
		{"collective rows", func(b *Bundle) { b.Templates[0].Nodes[2].Collective.Rows = 5 }, "want 1..4 rows"},
		{"reduce in place", func(b *Bundle) { b.Templates[0].Nodes[2].Collective.Out = "probe_out" }, `in "x" and out "probe_out" differ`},
		{"gather in place", func(b *Bundle) { b.Templates[0].Nodes[3].Collective.Out = "logits_shard" }, "cannot work in place"},
		{"collective size", func(b *Bundle) { b.Templates[0].Nodes[3].Collective.Cols = 32 },
			`buffer "logits_shard" of shape [4 16] holds 64 elements, fewer than 4 rows x 32 columns`},
		{"collective dtype", func(b *Bundle) {
			b.Templates[0].Nodes[2].Collective = &Collective{Op: AllReduceSum, In: "tokens", Out: "tokens", Rows: 4, Cols: 1}
		},
			`buffer "tokens" is a u32 control buffer; collectives move f32 activations`},
		{"collective buffer", func(b *Bundle) { b.Templates[0].Nodes[3].Collective.In = "nope" }, `buffer "nope" does not exist`},
	}
	for _, c := range cases {
		b := tpBundle()
		c.mutate(b)
		err := Verify(b)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want it to contain %q", c.name, err, c.want)
		}
	}
}
