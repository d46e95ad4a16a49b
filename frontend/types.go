// Package frontend reads model and app specs (YAML) into typed values. Every value keeps the
// position it came from so that later stages can point at the line that caused an error.
package frontend

import "fmt"

// Pos is a place in a spec file.
type Pos struct {
	File string
	Line int
	Col  int
}

func (p Pos) String() string { return fmt.Sprintf("%s:%d:%d", p.File, p.Line, p.Col) }

// Error is one spec error: where, what is wrong, and how to fix it.
type Error struct {
	Pos  Pos
	Msg  string
	Hint string
}

func (e *Error) Error() string {
	if e.Hint != "" {
		return fmt.Sprintf("%s: %s (%s)", e.Pos, e.Msg, e.Hint)
	}
	return fmt.Sprintf("%s: %s", e.Pos, e.Msg)
}

// Errorf builds an Error at p.
func Errorf(p Pos, hint, format string, args ...any) *Error {
	return &Error{Pos: p, Msg: fmt.Sprintf(format, args...), Hint: hint}
}

// Model is a parsed model spec (specs/models/*.yaml).
type Model struct {
	Pos           Pos // of the document
	Path          string
	Dir           string // directory of the spec; relative paths resolve against it
	Name          string
	Family        string // "llama", "mistral", "qwen2", "qwen3", "mixtral" or "gemma2"
	Hidden        int
	Intermediate  int
	Layers        int
	Heads         int
	KVHeads       int
	HeadDim       int
	Vocab         int
	RopeTheta     float64
	RopeScaling   *RopeScaling
	RMSEps        float64
	TieEmbeddings bool
	// QKVBias: q_proj, k_proj and v_proj carry biases (qwen2). QKNorm: q and k heads are
	// RMS-normalised before RoPE with q_norm, k_norm and eps RMSEps (qwen3).
	QKVBias, QKNorm bool
	Dtype           string // weight storage: "bf16" (default) or "f32"
	KVDtype         string // "f32" (default) or "bf16"
	Weights         Weights
	Tokenizer       Tokenizer
	// BOS is the beginning-of-sequence id (-1: none); BOSGiven says the spec's bos: named
	// it, which makes every prompt start with it whatever the tokenizer says.
	BOS      int
	BOSGiven bool
	EOS      []int
	// ChatTemplate is the path of the spec's chat_template: file ("" when it names none).
	ChatTemplate    string
	ChatTemplatePos Pos
	DecodeBuckets   []int // batch sizes, ascending
	PrefillChunks   []int // token counts per prefill step, ascending
	// MaxBatchedTokens is the token budget of a step (vLLM's max_num_batched_tokens): decode
	// rows and prompt rows together (default: the largest prefill chunk).
	MaxBatchedTokens int
	MaxSeqLen        int
	MaxSeqs          int // requests resident at once (default: largest decode bucket)
	KVBlockSize      int // tokens per KV page (default 16)
	// KVCacheTokens is how many tokens the KV page pool holds, every sequence together
	// (default MaxSeqs x MaxSeqLen): a multiple of KVBlockSize, at least MaxSeqLen.
	KVCacheTokens int
	// VectorSlots is how many requests may hold per-request vectors at once (default
	// MaxSeqs): the size of the device pool of each per_request param.
	VectorSlots int
	// MaxLogprobs is how many top tokens a request may ask the logprobs of (default 20; 0:
	// the sampler reports no logprobs).
	MaxLogprobs int
	// LayersPos is where the layer count was given, for "layer out of range" hints.
	LayersPos Pos
	// HeadDimPos is where head_dim was given, or the head count it is hidden/heads of.
	HeadDimPos Pos

	// Experts > 0 makes every layer's MLP a mixture of Experts SwiGLU experts of Intermediate
	// columns, TopK of them per token (mixtral).
	Experts, TopK int

	// What Gemma 2 (family gemma2) changes; the zero values are the Llama forward.
	// Activation is the gated MLP's: "" SiLU (SwiGLU), ActGeluTanh (GeGLU).
	Activation string
	// NormOffset is added to every RMSNorm weight: 1 for Gemma's (1 + w).
	NormOffset float64
	// PostNorms: the attention and MLP outputs are RMS-normalised before their residual add
	// (post_attention_layernorm, post_feedforward_layernorm; the MLP's input norm is
	// pre_feedforward_layernorm).
	PostNorms bool
	// QueryPreAttnScalar, when set, scales scores by its inverse square root instead of
	// head_dim's (AttnScale).
	QueryPreAttnScalar float64
	// AttnSoftcap and FinalSoftcap cap attention scores and final logits at c*tanh(x/c); 0:
	// no capping.
	AttnSoftcap, FinalSoftcap float64
	// SlidingWindow is how many of its last positions a row attends to in the layers
	// SlidingLayers marks (AttnWindow); 0: every layer attends to every position.
	SlidingWindow int
	SlidingLayers []bool
}

// RopeScaling mirrors HF's rope_scaling for rope_type llama3.
type RopeScaling struct {
	Type           string
	Factor         float64
	LowFreqFactor  float64
	HighFreqFactor float64
	OriginalMaxPos int
}

// Weights says where the weights are: a safetensors file (or HF directory), or synthetic.
type Weights struct {
	Pos       Pos
	Path      string // absolute, resolved against the spec's directory
	Synthetic bool
	Seed      uint64
	Std       float64
}

// Tokenizer is "bytes" (256 byte tokens + specials) or "hf" with a tokenizer.json path.
type Tokenizer struct {
	Pos  Pos
	Kind string
	Path string
}

// App is a parsed app spec (specs/apps/*.yaml).
type App struct {
	Pos     Pos
	Path    string
	Dir     string
	Name    string
	Params  []Param        // in file order
	Buffers []Buffer       // in file order
	Kernels []CustomKernel // custom PTX kernels, in file order (see app.go)
	Ops     []Op
}

// Param is a named tensor an app uses: from a safetensors file or given inline.
type Param struct {
	Pos    Pos
	Name   string
	File   string // absolute
	Tensor string
	Values []float32 // inline values, when File is empty
	// Random, when set, makes the param a deterministic random unit vector of whatever width
	// the hook it is used at has (seeded; the paper's overhead measurements use such vectors).
	Random *uint64
	// PerRequest (per_request: true) lets a request bring its own value of the vector for its
	// lifetime; the param's data is the default of requests that do not.
	PerRequest bool
}

// Buffer is a named MI buffer an app writes (reads land here) and may export.
type Buffer struct {
	Pos    Pos
	Name   string
	Shape  []int
	Dtype  string
	Export bool
}

// Op is one read or write of an app.
type Op struct {
	Pos       Pos
	Kind      string // "read" or "write"
	Layers    []int  // nil for whole-model hooks
	LayersPos Pos
	AllLayers bool // layers: all
	// LayersPerRequest (at: {per_request: true}) lets a request run the op at a subset of
	// its layers.
	LayersPerRequest bool
	PerRequestPos    Pos
	Hook             string
	HookPos          Pos
	Kernel           string
	KernelPos        Pos
	Args             []Arg // in file order
	Into             string
	IntoPos          Pos
	When             []Cond // all must hold
}

// Arg is one kernel argument: a number, or a name (a param reference or an enum word).
type Arg struct {
	Pos    Pos
	Name   string
	Number *float64
	Word   string
}

// Cond is one condition of an op's `when`.
type Cond struct {
	Pos  Pos
	Kind string // token_in, after_token, activation, steps, positions
	// token_in / after_token
	Tokens []int
	// activation
	Buffer string
	Cmp    string // > >= < <= == !=
	Value  float64
	// steps: [From, To) generation step window; To = 0 means open
	From, To int
	// positions: prompt, generated, all
	Positions string
}
