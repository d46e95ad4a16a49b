package ir

import (
	"fmt"
	"reflect"
)

// Op is what a node computes.
type Op uint8

// The ops. Builders write the first group; passes make the fused row kernels, the
// collectives and the MI nodes.
const (
	OpInvalid Op = iota
	// OpEmbed: tokens (the step's control block) -> rows of the embedding table (W "table").
	OpEmbed
	// OpNorm: x -> RMSNorm(x) * w (W "w"). An output in Samples rows gathers the sampled rows.
	OpNorm
	// OpAdd: the residual add, resid + delta.
	OpAdd
	// OpMatmul: x [rows, K] -> x · Wᵀ [rows, N] (W "w" of [N, K]).
	OpMatmul
	// OpRope: the q, k, v heads of qkv rotated in place (after bias and QK-norm when the
	// family has them); k and v written to the layer's KV cache (State).
	OpRope
	// OpAttention: the q heads of qkv against the KV cache -> z [rows, heads*head_dim].
	OpAttention
	// OpActivation: gated, act(gate) * up over [gate | up] rows.
	OpActivation
	// OpRouter: an MoE router: logits x · Wᵀ (in the kernel), softmax, top-k -> expert ids,
	// weights.
	OpRouter
	// OpExperts: the routed experts' gated MLPs, summed by the router's weights.
	OpExperts
	// OpSample: logits -> the sampled tokens.
	OpSample
	// OpSoftcap: x -> cap * tanh(x / cap) (Gemma 2's final logits).
	OpSoftcap

	// OpEmbedNorm (fuse-rows): embed, then the first layer's input norm, in one row kernel.
	OpEmbedNorm
	// OpAddNorm (fuse-rows): the residual add, then a norm, in one row kernel; with a norm of
	// the delta before the add (W "delta_w", Gemma 2's post-norms), the normalised delta is a
	// third output, kept in the kernel.
	OpAddNorm
	// OpCollective (shard-tp): an exchange of an activation between tensor-parallel ranks.
	OpCollective
	// OpMI (place-mi): a standalone MI kernel over a value no kernel of the forward can host
	// its ops in (a GEMM's or attention's output, the logits); in place.
	OpMI
	// OpCustom (place-mi): an app's own PTX kernel over the residual, in place.
	OpCustom
	// OpRenorm (place-mi): the norm of an add+norm again, after custom kernels changed the
	// residual it normalised; in place.
	OpRenorm
	// OpLens (place-mi): a logit lens, a heavy read: the final norm, the LM head and a top-k
	// of the residual, into the op's buffer.
	OpLens
	// OpMatmulRope (fuse-qkv-rope): the q/k/v projection and the rotation with the KV write
	// after it (Parts: the matmul, the rope), in one kernel where the bucket's GEMM can take
	// an epilogue. Out: the rotated q, k, v rows.
	OpMatmulRope
	// OpMatmulGated (fuse-gate-act): the gate/up projection and the gated activation after
	// it (Parts: the matmul, the activation). Out: the activation, then the [gate | up] rows,
	// which only the unfused kernels write (where the bucket's GEMM takes no epilogue).
	OpMatmulGated
	numOps
)

// Group is one place in a node's kernel where fused MI ops run, over one of its values.
type Group struct {
	Name string
	// Out: the group works on Out[Index]; else on In[Index].
	Out   bool
	Index int
}

// OpFact is what the compiler knows about an op.
type OpFact struct {
	Name string
	// In and Out are how many values it reads and defines; it may define up to MoreOut more.
	In, Out, MoreOut int
	// Attrs is the type of Node.Attrs (nil: none).
	Attrs any
	// Groups are where the op's kernel runs fused MI ops, in kernel order.
	Groups []Group
	// InPlace: the node updates its first input instead of defining a value.
	InPlace bool
	// Parts, for a fused op, are the ops of the nodes it fuses (Node.Parts), in order.
	Parts []Op
}

// Ops is the table of ops, by Op.
var Ops = [numOps]OpFact{
	OpEmbed:      {Name: "embed", In: 0, Out: 1, Attrs: EmbedAttrs{}},
	OpNorm:       {Name: "norm", In: 1, Out: 1, Attrs: NormAttrs{}},
	OpAdd:        {Name: "add", In: 2, Out: 1},
	OpMatmul:     {Name: "matmul", In: 1, Out: 1, Attrs: MatmulAttrs{}},
	OpRope:       {Name: "rope", In: 1, Out: 0, Attrs: RopeAttrs{}, InPlace: true},
	OpAttention:  {Name: "attention", In: 1, Out: 1, Attrs: AttentionAttrs{}},
	OpActivation: {Name: "activation", In: 1, Out: 1, Attrs: ActivationAttrs{}, Groups: []Group{{"act", true, 0}}},
	OpRouter:     {Name: "router", In: 1, Out: 3, Attrs: RouterAttrs{}, Groups: []Group{{"logits", true, 0}}},
	OpExperts:    {Name: "experts", In: 3, Out: 1, Attrs: ExpertsAttrs{}},
	OpSample:     {Name: "sample", In: 1, Out: 1, Attrs: SampleAttrs{}, Groups: []Group{{"sampled", true, 0}}},
	OpSoftcap:    {Name: "softcap", In: 1, Out: 1, Attrs: SoftcapAttrs{}},
	OpEmbedNorm:  {Name: "embed_norm", In: 0, Out: 2, Attrs: NormAttrs{}, Groups: []Group{{"resid", true, 0}}},
	OpAddNorm: {Name: "add_norm", In: 2, Out: 2, MoreOut: 1, Attrs: NormAttrs{},
		Groups: []Group{{"delta", false, 1}, {"resid", true, 0}, {"norm", true, 1}, {"delta", true, 2}}},
	OpCollective: {Name: "collective", In: 1, Out: 1, Attrs: CollectiveAttrs{}},
	OpMI:         {Name: "mi", In: 1, Out: 0, Groups: []Group{{"x", false, 0}}, InPlace: true},
	OpCustom:     {Name: "custom", In: 1, Out: 0, Attrs: CustomAttrs{}, InPlace: true},
	OpRenorm:     {Name: "renorm", In: 2, Out: 0, Attrs: NormAttrs{}, InPlace: true},
	OpLens:       {Name: "lens", In: 1, Out: 0, Attrs: LensAttrs{}},
	// Fused ops keep their parts' attributes in their parts.
	OpMatmulRope:  {Name: "matmul+rope", In: 1, Out: 1, Parts: []Op{OpMatmul, OpRope}},
	OpMatmulGated: {Name: "matmul+activation", In: 1, Out: 2, Parts: []Op{OpMatmul, OpActivation}},
}

func init() {
	for op := OpInvalid + 1; op < numOps; op++ {
		if Ops[op].Name == "" {
			panic(fmt.Sprintf("ir: op %d has no entry in Ops", op)) // a programming error
		}
	}
}

func (o Op) String() string {
	if o > OpInvalid && o < numOps {
		return Ops[o].Name
	}
	return fmt.Sprintf("op%d", o)
}

// attrsOK says whether a has the type the op's fact names.
func (o Op) attrsOK(a any) bool {
	want := Ops[o].Attrs
	if want == nil {
		return a == nil
	}
	return a != nil && reflect.TypeOf(a) == reflect.TypeOf(want)
}

// EmbedAttrs are OpEmbed's. Scale, when not 0, multiplies the embedded rows (Gemma's
// sqrt(hidden)).
type EmbedAttrs struct {
	Vocab int
	Scale float32
}

// NormAttrs are an RMSNorm's: x * rsqrt(mean(x²) + Eps) * (Offset + w) (Offset 1: Gemma's
// (1 + w)).
type NormAttrs struct {
	Eps    float32
	Offset float32
	// Vocab and EmbedScale, in an OpEmbedNorm, are the embedding's (EmbedAttrs).
	Vocab      int
	EmbedScale float32
}

// SoftcapAttrs are OpSoftcap's.
type SoftcapAttrs struct {
	Cap float32
}

// MatmulAttrs are OpMatmul's: its tensor-parallel cut and, for a row-parallel one, the name
// of the all-reduce shard-tp inserts after it.
type MatmulAttrs struct {
	Split  Split
	Reduce string
	// Gather, for a vocab-parallel one, names the all-gather and Shard the value of one
	// rank's columns.
	Gather, Shard string
}

// RopeAttrs are OpRope's: the heads of qkv (per rank after shard-tp), and what the family
// adds before the rotation.
type RopeAttrs struct {
	Heads, KVHeads, HeadDim int
	Bias, QKNorm            bool
	Eps                     float32 // QK-norm's
}

// AttentionAttrs are OpAttention's: scores scaled by Scale, soft-capped at Softcap (0:
// not), over the last Window positions (0: all).
type AttentionAttrs struct {
	Heads, KVHeads, HeadDim int
	Scale, Softcap          float32
	Window                  int
}

// ActivationAttrs are OpActivation's: Fn over the gate, times the up half.
type ActivationAttrs struct {
	Fn    string // "silu" or "gelu_tanh"
	Inter int
}

// RouterAttrs are OpRouter's.
type RouterAttrs struct {
	Experts, TopK int
}

// ExpertsAttrs are OpExperts'; Reduce as MatmulAttrs'.
type ExpertsAttrs struct {
	Experts, TopK, Inter int
	Reduce               string
}

// SampleAttrs are OpSample's.
type SampleAttrs struct {
	Vocab    int
	EOS      []int
	Logprobs int
}

// Collective operations (CollectiveAttrs.Op), as the bundle names them.
const (
	AllReduceSum  = "all_reduce_sum"
	AllGatherCols = "all_gather_cols"
)

// CollectiveAttrs are OpCollective's.
type CollectiveAttrs struct {
	Op string
}

// CustomAttrs are OpCustom's: the op, whose Custom is the app's kernel.
type CustomAttrs struct {
	MI *MI
}

// LensAttrs are OpLens's: the op.
type LensAttrs struct {
	MI *MI
}
