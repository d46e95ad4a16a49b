package frontend

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"xmix/input"
)

// HFConfig is the part of a Hugging Face config.json that a model spec imports. A nil field
// was absent (or null) in the file.
type HFConfig struct {
	Path              string // the file read
	HiddenSize        *int
	IntermediateSize  *int
	NumHiddenLayers   *int
	NumAttentionHeads *int
	NumKeyValueHeads  *int
	HeadDim           *int
	VocabSize         *int
	RopeTheta         *float64
	RMSNormEps        *float64
	TieWordEmbeddings *bool
	RopeScaling       *RopeScaling
	BOSTokenID        *int
	EOSTokenIDs       []int
	ModelType         string   // "" when absent
	Architectures     []string // model classes, e.g. LlamaForCausalLM; nil when absent
	AttentionBias     *bool
	SlidingWindow     *int // nil when absent or null (no window)
	UseSlidingWindow  *bool
	NumLocalExperts   *int // mixtral
	NumExpertsPerTok  *int
	// SlidingWindowGiven: the file has sliding_window, maybe null (SlidingWindow nil): Gemma
	// 2 then has no window, where a config.json without the key has Gemma2Config's 4096.
	SlidingWindowGiven bool
	// Gemma 2 (family gemma2). A soft-cap of 0 is null in the file: no capping.
	QueryPreAttnScalar        *float64
	AttnSoftcap, FinalSoftcap *float64
	HiddenActivation          *string
	LayerTypes                []string // sliding_attention | full_attention per layer
	UseBidirectionalAttention *bool
}

// hfConfigJSON mirrors the JSON; the fields whose JSON type varies are decoded by hand.
type hfConfigJSON struct {
	HiddenSize        *int            `json:"hidden_size"`
	IntermediateSize  *int            `json:"intermediate_size"`
	NumHiddenLayers   *int            `json:"num_hidden_layers"`
	NumAttentionHeads *int            `json:"num_attention_heads"`
	NumKeyValueHeads  *int            `json:"num_key_value_heads"`
	HeadDim           *int            `json:"head_dim"`
	VocabSize         *int            `json:"vocab_size"`
	RopeTheta         *float64        `json:"rope_theta"`
	RMSNormEps        *float64        `json:"rms_norm_eps"`
	TieWordEmbeddings *bool           `json:"tie_word_embeddings"`
	RopeScaling       json.RawMessage `json:"rope_scaling"`
	// RopeParameters is transformers v5's form: rope_type, rope_theta and the scaling
	// factors in one object (instead of rope_theta + rope_scaling).
	RopeParameters   json.RawMessage `json:"rope_parameters"`
	BOSTokenID       *int            `json:"bos_token_id"`
	EOSTokenID       json.RawMessage `json:"eos_token_id"`
	ModelType        string          `json:"model_type"`
	Architectures    []string        `json:"architectures"`
	AttentionBias    *bool           `json:"attention_bias"`
	SlidingWindow    *int            `json:"sliding_window"`
	UseSlidingWindow *bool           `json:"use_sliding_window"`
	NumLocalExperts  *int            `json:"num_local_experts"`
	NumExpertsPerTok *int            `json:"num_experts_per_tok"`
	// Gemma 2.
	QueryPreAttnScalar        *float64        `json:"query_pre_attn_scalar"`
	AttnLogitSoftcapping      json.RawMessage `json:"attn_logit_softcapping"`
	FinalLogitSoftcapping     json.RawMessage `json:"final_logit_softcapping"`
	HiddenActivation          *string         `json:"hidden_activation"`
	LayerTypes                []string        `json:"layer_types"`
	UseBidirectionalAttention *bool           `json:"use_bidirectional_attention"`
}

type ropeScalingJSON struct {
	RopeType       string   `json:"rope_type"`
	Type           string   `json:"type"` // older configs name rope_type this way
	Factor         *float64 `json:"factor"`
	LowFreqFactor  *float64 `json:"low_freq_factor"`
	HighFreqFactor *float64 `json:"high_freq_factor"`
	OriginalMaxPos *int     `json:"original_max_position_embeddings"`
}

// ReadHFConfig reads a Hugging Face config.json; path may also be the model directory that
// holds it. Errors inside the file are *Error values at the offending line:col.
func ReadHFConfig(path string) (*HFConfig, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if fi.IsDir() {
		path = filepath.Join(path, "config.json")
	}
	data, err := input.Read(path, input.Settings)
	if err != nil {
		return nil, err
	}
	return parseHFConfig(path, data)
}

// ReadGenerationEOS reads eos_token_id (an integer or a list) from a Hugging Face
// generation_config.json; nil when the file has none. Errors inside the file are *Error
// values at the offending line:col.
func ReadGenerationEOS(path string) ([]int, error) {
	data, err := input.Read(path, input.Settings)
	if err != nil {
		return nil, err
	}
	var raw struct {
		EOSTokenID json.RawMessage `json:"eos_token_id"`
	}
	if err := json.Unmarshal(data, &raw); err != nil {
		return nil, jsonError(path, data, err)
	}
	eos, err := eosIDs(raw.EOSTokenID)
	if err != nil {
		return nil, fieldError(path, data, "eos_token_id", err.Error(), "give an integer or a list of integers")
	}
	return eos, nil
}

func parseHFConfig(path string, data []byte) (*HFConfig, error) {
	var raw hfConfigJSON
	if err := json.Unmarshal(data, &raw); err != nil {
		return nil, jsonError(path, data, err)
	}
	c := &HFConfig{
		Path:              path,
		HiddenSize:        raw.HiddenSize,
		IntermediateSize:  raw.IntermediateSize,
		NumHiddenLayers:   raw.NumHiddenLayers,
		NumAttentionHeads: raw.NumAttentionHeads,
		NumKeyValueHeads:  raw.NumKeyValueHeads,
		HeadDim:           raw.HeadDim,
		VocabSize:         raw.VocabSize,
		RopeTheta:         raw.RopeTheta,
		RMSNormEps:        raw.RMSNormEps,
		TieWordEmbeddings: raw.TieWordEmbeddings,
		BOSTokenID:        raw.BOSTokenID,
		ModelType:         raw.ModelType,
		Architectures:     raw.Architectures,
		AttentionBias:     raw.AttentionBias,
		SlidingWindow:     raw.SlidingWindow,
		UseSlidingWindow:  raw.UseSlidingWindow,
		NumLocalExperts:   raw.NumLocalExperts,
		NumExpertsPerTok:  raw.NumExpertsPerTok,

		QueryPreAttnScalar:        raw.QueryPreAttnScalar,
		HiddenActivation:          raw.HiddenActivation,
		LayerTypes:                raw.LayerTypes,
		UseBidirectionalAttention: raw.UseBidirectionalAttention,
	}
	var keys map[string]json.RawMessage
	if err := json.Unmarshal(data, &keys); err == nil {
		_, c.SlidingWindowGiven = keys["sliding_window"]
	}
	var err error
	if c.AttnSoftcap, err = softcapJSON(raw.AttnLogitSoftcapping); err != nil {
		return nil, fieldError(path, data, "attn_logit_softcapping", err.Error(), "give a number, or null for no capping")
	}
	if c.FinalSoftcap, err = softcapJSON(raw.FinalLogitSoftcapping); err != nil {
		return nil, fieldError(path, data, "final_logit_softcapping", err.Error(), "give a number, or null for no capping")
	}
	if c.EOSTokenIDs, err = eosIDs(raw.EOSTokenID); err != nil {
		return nil, fieldError(path, data, "eos_token_id", err.Error(), "give an integer or a list of integers")
	}
	if c.RopeScaling, err = ropeScaling(raw.RopeScaling); err != nil {
		return nil, fieldError(path, data, "rope_scaling", err.Error(), "")
	}
	if len(raw.RopeParameters) > 0 && string(raw.RopeParameters) != "null" && len(raw.RopeScaling) == 0 {
		var p struct {
			RopeTheta *float64 `json:"rope_theta"`
		}
		if err := json.Unmarshal(raw.RopeParameters, &p); err != nil {
			return nil, fieldError(path, data, "rope_parameters", err.Error(), "")
		}
		if c.RopeTheta == nil {
			c.RopeTheta = p.RopeTheta
		}
		if c.RopeScaling, err = ropeScaling(raw.RopeParameters); err != nil {
			return nil, fieldError(path, data, "rope_parameters", err.Error(), "")
		}
	}
	return c, nil
}

func eosIDs(raw json.RawMessage) ([]int, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var one int
	if err := json.Unmarshal(raw, &one); err == nil {
		return []int{one}, nil
	}
	var many []int
	if err := json.Unmarshal(raw, &many); err != nil {
		return nil, errors.New("eos_token_id is neither an integer nor a list of integers")
	}
	return many, nil
}

// ropeScaling imports rope_scaling; only llama3 scaling changes the forward, "default" is none.
func ropeScaling(raw json.RawMessage) (*RopeScaling, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var r ropeScalingJSON
	if err := json.Unmarshal(raw, &r); err != nil {
		return nil, fmt.Errorf("rope_scaling: %w", err)
	}
	typ := r.RopeType
	if typ == "" {
		typ = r.Type
	}
	switch typ {
	case "default":
		return nil, nil
	case "llama3":
	default:
		return nil, fmt.Errorf("rope_scaling type %q is not supported (only llama3)", typ)
	}
	if r.Factor == nil || r.LowFreqFactor == nil || r.HighFreqFactor == nil || r.OriginalMaxPos == nil {
		return nil, errors.New("llama3 rope_scaling needs factor, low_freq_factor, high_freq_factor and original_max_position_embeddings")
	}
	return &RopeScaling{
		Type: typ, Factor: *r.Factor, LowFreqFactor: *r.LowFreqFactor,
		HighFreqFactor: *r.HighFreqFactor, OriginalMaxPos: *r.OriginalMaxPos,
	}, nil
}

// jsonError places a decoding error at its line:col in the JSON file.
func jsonError(path string, data []byte, err error) error {
	var syn *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case errors.As(err, &syn):
		return &Error{Pos: offsetPos(path, data, syn.Offset), Msg: "malformed JSON: " + syn.Error()}
	case errors.As(err, &typ):
		return &Error{
			Pos: offsetPos(path, data, typ.Offset),
			Msg: fmt.Sprintf("%s: expected %s, got a JSON %s", typ.Field, typ.Type, typ.Value),
		}
	}
	return &Error{Pos: Pos{File: path, Line: 1, Col: 1}, Msg: err.Error()}
}

// fieldError places an error at the first occurrence of "key" in the JSON text: good enough to
// point a reader at the field, without a position-tracking JSON decoder.
func fieldError(path string, data []byte, key, msg, hint string) error {
	off := int64(bytes.Index(data, []byte(`"`+key+`"`)))
	return &Error{Pos: offsetPos(path, data, max(off, 0)), Msg: msg, Hint: hint}
}

func offsetPos(path string, data []byte, off int64) Pos {
	off = min(max(off, 0), int64(len(data)))
	prefix := data[:off]
	line := bytes.Count(prefix, []byte{'\n'}) + 1
	col := int(off) - (bytes.LastIndexByte(prefix, '\n') + 1) + 1
	return Pos{File: path, Line: line, Col: col}
}

// causalLMs are the Hugging Face causal-LM classes of families, as config.json's
// "architectures" names them: LlamaForCausalLM for llama.
func causalLMs(families []string) []string {
	out := make([]string, len(families))
	for i, f := range families {
		out[i] = strings.ToUpper(f[:1]) + f[1:] + "ForCausalLM"
	}
	return out
}
