package testsuite

import (
	"fmt"
	"math"
)

// Gemma2Ref is an independent float64 Gemma 2 forward: transformers' Gemma2ForCausalLM
// with eager attention (modeling_gemma2.py; llama.cpp's gemma2 graph computes the same),
// written from those semantics without the ops package, over weights by their Hugging Face
// names. It recomputes the whole sequence for every call: slow and plainly right.
type Gemma2Ref struct {
	C Gemma2Dims
	W map[string][]float64 // Hugging Face tensor name -> row-major values
}

// Gemma2Dims is Gemma2Config's part the forward reads.
type Gemma2Dims struct {
	Hidden, Intermediate, Layers, Heads, KVHeads, HeadDim, Vocab int
	RopeTheta, RMSEps                                            float64
	QueryPreAttnScalar                                           float64
	AttnSoftcap, FinalSoftcap                                    float64 // 0: none
	// EmbedScale multiplies the embeddings: sqrt(hidden), in the dtype transformers holds
	// the hidden states in (48 for 2304 in fp32 and bf16 alike).
	EmbedScale    float64
	SlidingWindow int
	Sliding       []bool // per layer: whether SlidingWindow applies (layer_types)
	Tied          bool   // the LM head is the embedding
}

// Gemma2TensorNames lists the tensors the forward reads, in a checkpoint's terms.
func (c Gemma2Dims) Gemma2TensorNames() []string {
	names := []string{"model.embed_tokens.weight", "model.norm.weight"}
	if !c.Tied {
		names = append(names, "lm_head.weight")
	}
	for l := range c.Layers {
		for _, s := range []string{"input_layernorm", "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
			"self_attn.o_proj", "post_attention_layernorm", "pre_feedforward_layernorm", "mlp.gate_proj",
			"mlp.up_proj", "mlp.down_proj", "post_feedforward_layernorm"} {
			names = append(names, fmt.Sprintf("model.layers.%d.%s.weight", l, s))
		}
	}
	return names
}

func (r *Gemma2Ref) layer(l int, name string) []float64 {
	return r.W[fmt.Sprintf("model.layers.%d.%s.weight", l, name)]
}

// Gemma2Norm is Gemma2RMSNorm: x / sqrt(mean(x²) + eps) * (1 + w).
func Gemma2Norm(x, w []float64, eps float64) []float64 {
	var ss float64
	for _, v := range x {
		ss += v * v
	}
	inv := 1 / math.Sqrt(ss/float64(len(x))+eps)
	out := make([]float64, len(x))
	for i, v := range x {
		out[i] = v * inv * (1 + w[i])
	}
	return out
}

// GeluTanh is gelu_pytorch_tanh: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x³))).
func GeluTanh(x float64) float64 {
	return 0.5 * x * (1 + math.Tanh(math.Sqrt(2/math.Pi)*(x+0.044715*x*x*x)))
}

// softcap64 is cap * tanh(x / cap); cap 0 leaves x.
func softcap64(x, cap float64) float64 {
	if cap == 0 {
		return x
	}
	return cap * math.Tanh(x/cap)
}

// linear is y = W x for W [len(y), len(x)] (nn.Linear without bias).
func linear(w, x []float64) []float64 {
	y := make([]float64, len(w)/len(x))
	for r := range y {
		row := w[r*len(x) : (r+1)*len(x)]
		var s float64
		for i, v := range x {
			s += row[i] * v
		}
		y[r] = s
	}
	return y
}

// ropeHalf rotates one head at pos the rotate_half way: dims i and i+D/2 are a pair at
// frequency theta^(-2i/D).
func ropeHalf(x []float64, pos int, theta float64) {
	d := len(x)
	for i := range d / 2 {
		a := float64(pos) * math.Pow(theta, -float64(2*i)/float64(d))
		c, s := math.Cos(a), math.Sin(a)
		x0, x1 := x[i], x[i+d/2]
		x[i], x[i+d/2] = x0*c-x1*s, x1*c+x0*s
	}
}

// Gemma2Layer is what one layer computes at every position ([position][column]), named as
// the hooks that read it: In its input (resid_pre; the scaled embedding at layer 0),
// AttnOut the post-normed attention output (attn_out), Mid the residual after it
// (resid_mid), Act the GeGLU activation (mlp.act), MLPOut the post-normed MLP output
// (mlp_out), Out the layer's output (resid_post: transformers' hidden_states[l+1], before
// the final norm at the last layer).
type Gemma2Layer struct {
	In, AttnOut, Mid, Act, MLPOut, Out [][]float64
}

// Forward runs tokens through the model. logits[t] are the (soft-capped) next-token logits
// after tokens[:t+1]; layers[l] holds layer l's values.
func (r *Gemma2Ref) Forward(tokens []int) (logits [][]float64, layers []Gemma2Layer) {
	c := r.C
	H, D, T := c.Hidden, c.HeadDim, len(tokens)
	emb := r.W["model.embed_tokens.weight"]
	x := make([][]float64, T)
	for t, tok := range tokens {
		x[t] = make([]float64, H)
		for i := range H {
			x[t][i] = emb[tok*H+i] * c.EmbedScale
		}
	}
	scale := 1 / math.Sqrt(c.QueryPreAttnScalar)
	group := c.Heads / c.KVHeads
	snap := func() [][]float64 {
		out := make([][]float64, T)
		for t := range T {
			out[t] = append([]float64(nil), x[t]...)
		}
		return out
	}
	for l := range c.Layers {
		ly := Gemma2Layer{In: snap(), AttnOut: make([][]float64, T), Act: make([][]float64, T), MLPOut: make([][]float64, T)}
		q, k, v := make([][]float64, T), make([][]float64, T), make([][]float64, T)
		for t := range T {
			h := Gemma2Norm(x[t], r.layer(l, "input_layernorm"), c.RMSEps)
			q[t], k[t], v[t] = linear(r.layer(l, "self_attn.q_proj"), h), linear(r.layer(l, "self_attn.k_proj"), h), linear(r.layer(l, "self_attn.v_proj"), h)
			for hd := range c.Heads {
				ropeHalf(q[t][hd*D:(hd+1)*D], t, c.RopeTheta)
			}
			for hd := range c.KVHeads {
				ropeHalf(k[t][hd*D:(hd+1)*D], t, c.RopeTheta)
			}
		}
		for t := range T {
			z := make([]float64, c.Heads*D)
			for hd := range c.Heads {
				kv := hd / group // repeat_kv: query head hd reads kv head hd / group
				w := make([]float64, t+1)
				mx := math.Inf(-1)
				for j := 0; j <= t; j++ {
					if c.Sliding[l] && j <= t-c.SlidingWindow { // kv_idx > q_idx - sliding_window
						w[j] = math.Inf(-1)
						continue
					}
					var s float64
					for i := range D {
						s += q[t][hd*D+i] * k[j][kv*D+i]
					}
					w[j] = softcap64(s*scale, c.AttnSoftcap)
					mx = math.Max(mx, w[j])
				}
				var sum float64
				for j := range w {
					w[j] = math.Exp(w[j] - mx)
					sum += w[j]
				}
				for j := range w {
					for i := range D {
						z[hd*D+i] += w[j] / sum * v[j][kv*D+i]
					}
				}
			}
			ly.AttnOut[t] = Gemma2Norm(linear(r.layer(l, "self_attn.o_proj"), z), r.layer(l, "post_attention_layernorm"), c.RMSEps)
		}
		// Every position's attention read the layer's input; the residual moves on after.
		for t := range T {
			for i := range H {
				x[t][i] += ly.AttnOut[t][i]
			}
		}
		ly.Mid = snap()
		for t := range T {
			h := Gemma2Norm(x[t], r.layer(l, "pre_feedforward_layernorm"), c.RMSEps)
			gate, up := linear(r.layer(l, "mlp.gate_proj"), h), linear(r.layer(l, "mlp.up_proj"), h)
			for i := range gate {
				gate[i] = GeluTanh(gate[i]) * up[i]
			}
			ly.Act[t] = gate
			ly.MLPOut[t] = Gemma2Norm(linear(r.layer(l, "mlp.down_proj"), gate), r.layer(l, "post_feedforward_layernorm"), c.RMSEps)
			for i := range H {
				x[t][i] += ly.MLPOut[t][i]
			}
		}
		ly.Out = snap()
		layers = append(layers, ly)
	}
	head := r.W["lm_head.weight"]
	if c.Tied {
		head = emb
	}
	for t := range T {
		y := linear(head, Gemma2Norm(x[t], r.W["model.norm.weight"], c.RMSEps))
		for i := range y {
			y[i] = softcap64(y[i], c.FinalSoftcap)
		}
		logits = append(logits, y)
	}
	return logits, layers
}
