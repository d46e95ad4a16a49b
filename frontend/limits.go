package frontend

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// The limits on every size a model spec (or the config.json it imports) gives. The frontend
// checks each at its value's position before any later stage sizes anything from it: a
// layer count of 2e9 must be an error at dims.layers, not gigabytes of template nodes in
// codegen. Where a generated kernel bounds a size, the limit is that bound (codegen checks
// the same and its tests hold the two equal); where none does, it is an allocation bound far
// above any released model.
const (
	// MaxRowWidth bounds hidden: the row kernels (add+norm, the MI ops fused into it) keep a
	// row in registers, at most 64 values in each of 512 threads.
	MaxRowWidth = 512 * 64
	// MaxVocab bounds vocab: the sampler and the logit lens hold token ids exactly in f32.
	MaxVocab = 1<<24 - 1
	// MaxHeadDim bounds head_dim: the attention kernels keep a head's values in a warp.
	MaxHeadDim = 256
	// HeadDimStep divides head_dim: the attention kernels split a head over a warp's lanes.
	// Codegen checks it, at Model.HeadDimPos: the stages before it take any head_dim.
	HeadDimStep = 32
	// maxHeads bounds heads and kv_heads (released models have at most 128).
	maxHeads = 1024
	// maxIntermediate bounds intermediate; a row kernel takes intermediate/tp columns, which
	// codegen holds to MaxRowWidth for the build's degree.
	maxIntermediate = 1 << 20
	// maxSeqLen bounds serving.max_seq_len: the RoPE tables and each sequence's page table
	// are sized by it (Llama 3.1's context is 131072).
	maxSeqLen = 1 << 20
	// maxRows bounds a decode bucket and a prefill chunk: a template's activations are
	// [rows, width].
	maxRows = 1 << 16
	// maxBuckets bounds the number of decode buckets and of prefill chunks: each becomes
	// a template (and its app-free twin).
	maxBuckets = 64
	// maxResidentTokens bounds max_seqs x max_seq_len, the tokens the KV pool holds.
	maxResidentTokens = 1 << 24
	// maxEOS bounds the eos list.
	maxEOS = 1024
)

// maxFloat32 is the largest finite float32, the range of every scalar a kernel reads.
const maxFloat32 = math.MaxFloat32

// overflowText reports a plain YAML scalar that reads as a number out of the range of any
// Go number (yaml.v3 then tags it a string: 1e400, 0x7fffffffffffffffff), or "" if n is
// not one. Such a value was meant as a number and must not be taken as a word.
func overflowText(n *yaml.Node) string {
	if n.Kind != yaml.ScalarNode || n.Tag != "!!str" || n.Style != 0 {
		return ""
	}
	s := strings.ReplaceAll(n.Value, "_", "")
	if _, err := strconv.ParseFloat(s, 64); errors.Is(err, strconv.ErrRange) {
		return n.Value
	}
	if _, err := strconv.ParseInt(s, 0, 64); errors.Is(err, strconv.ErrRange) {
		return n.Value
	}
	return ""
}

// float32Number reads a number that a kernel will hold as an f32: finite, and at most
// maxFloat32 in magnitude.
func (p *parser) float32Number(n *yaml.Node, what string) (float64, bool) {
	if s := overflowText(n); s != "" {
		p.errorf(n, fmt.Sprintf("at most %.4g in magnitude", maxFloat32), "%s: %s is out of float32 range", what, s)
		return 0, false
	}
	v, ok := p.number(n, what)
	if ok && math.Abs(v) > maxFloat32 {
		p.errorf(n, fmt.Sprintf("at most %.4g in magnitude", maxFloat32), "%s: %s is out of float32 range", what, n.Value)
		return 0, false
	}
	return v, ok
}

// limitFact is one bounded dimension: its limit and why there is one.
type limitFact struct {
	max int
	why string
}

// dimLimits are the bounds of dims: (and the config.json keys they import), by dims key.
var dimLimits = map[string]limitFact{
	"hidden":       {MaxRowWidth, "a row of the residual stream is held in registers"},
	"intermediate": {maxIntermediate, ""},
	"layers":       {maxLayers, ""},
	"heads":        {maxHeads, ""},
	"kv_heads":     {maxHeads, ""},
	"head_dim":     {MaxHeadDim, "the attention kernels hold a head in one warp"},
	"vocab":        {MaxVocab, "token ids are held exactly in f32"},
}

// limitHint is the hint of an error for a value above f.
func (f limitFact) hint() string {
	if f.why == "" {
		return fmt.Sprintf("at most %d", f.max)
	}
	return fmt.Sprintf("at most %d: %s", f.max, f.why)
}
