package frontend

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"

	"xmix/bundle"
	"xmix/input"
)

// Families this version can compile, and the Hugging Face architectures (config.json
// "architectures") of theirs it can load.
var (
	families      = []string{"llama", "mistral", "qwen2", "qwen3", "mixtral", "gemma2"}
	architectures = causalLMs(families)
)

var (
	modelKeys       = []string{"model", "family", "hf", "dims", "config", "weights", "dtype", "kv_dtype", "tokenizer", "bos", "eos", "chat_template", "serving"}
	dimsKeys        = append([]string{"hidden", "intermediate", "layers", "heads", "kv_heads", "head_dim", "vocab", "rope_theta", "rms_eps", "tie_embeddings", "rope_scaling", "experts", "experts_per_token"}, gemma2DimsKeys...)
	ropeScalingKeys = []string{"type", "factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}
	servingKeys     = []string{"decode_buckets", "prefill_chunks", "max_batched_tokens", "max_seq_len", "max_seqs", "kv_block_size", "kv_cache_tokens", "vector_slots", "max_logprobs"}
	weightDtypes    = []string{"bf16", "f32"}
	kvDtypes        = []string{"f32", "bf16"}
)

// Defaults of a model spec.
const (
	defaultRopeTheta   = 10000
	defaultRMSEps      = 1e-5
	defaultMaxSeqLen   = 2048
	defaultKVBlockSize = 16
	defaultSyntheticSD = 0.02
	byteTokens         = 256 // ids 0-255 of the bytes tokenizer are the bytes themselves
	// defaultMaxLogprobs is how many top tokens a request may ask logprobs of (OpenAI's and
	// vLLM's limit); maxLogprobs bounds the spec's serving.max_logprobs (ops.MaxLogprobs).
	defaultMaxLogprobs = 20
	maxLogprobs        = 64
)

// LoadModel reads and parses a model spec file.
func LoadModel(path string) (*Model, error) {
	data, err := input.Read(path, input.Spec)
	if err != nil {
		return nil, fmt.Errorf("model spec: %w", err)
	}
	return ParseModel(path, data)
}

// ParseModel parses a model spec. path names the file in messages and is the base for the
// relative paths inside it. On error it returns an ErrorList with every problem found.
func ParseModel(path string, data []byte) (*Model, error) {
	p, err := newParser(path)
	if err != nil {
		return nil, err
	}
	root := p.document(data)
	if root == nil {
		return nil, p.result()
	}
	m := p.model(root)
	if err := p.result(); err != nil {
		return nil, err
	}
	return m, nil
}

// intField is a dimension with where it came from: a YAML value or a config.json key.
type intField struct {
	v    int
	set  bool // given (valid or not)
	ok   bool // given and well-typed
	pos  Pos
	name string // as the user wrote it, for messages
}

type floatField struct {
	v    float64
	set  bool
	ok   bool
	pos  Pos
	name string
}

func (p *parser) model(root *yaml.Node) *Model {
	top := p.mapping(root, "model spec", modelKeys)
	abs, err := filepath.Abs(p.file)
	if err != nil {
		abs = p.file
	}
	m := &Model{Pos: p.pos(root), Path: abs, Dir: p.dir, Dtype: "bf16", KVDtype: "f32", BOS: -1}
	hf := p.hfDir(top)
	switch {
	case top.get("hf") == nil:
		p.require(top, "model spec", "model", "weights", "tokenizer")
	case hf != nil && top.get("model") == nil:
		m.Name = filepath.Base(hf.dir)
	}
	if n := top.get("model"); n != nil {
		if s, ok := p.str(n, "model"); ok && s == "" {
			p.errorf(n, "", "model: name must not be empty")
		} else {
			m.Name = s
		}
	}
	if n := top.get("dtype"); n != nil {
		m.Dtype, _ = p.oneOf(n, "dtype", weightDtypes)
	}
	if n := top.get("kv_dtype"); n != nil {
		m.KVDtype, _ = p.oneOf(n, "kv_dtype", kvDtypes)
	}
	if n := top.get("weights"); n != nil {
		p.weights(n, &m.Weights)
	} else if hf != nil {
		m.Weights = Weights{Pos: hf.at, Path: hf.dir}
	}
	if n := top.get("tokenizer"); n != nil {
		p.tokenizer(n, &m.Tokenizer)
	} else if hf != nil {
		p.hfTokenizer(hf, &m.Tokenizer)
	}
	cfg := p.configRef(top, hf)
	p.dims(top, m, cfg)
	p.specialTokens(top, m, cfg)
	p.chatTemplate(top, m)
	p.serving(top, m)
	p.family(top, m, cfg)
	p.moe(top, m, cfg.cfg, cfg.keyAt)
	p.gemma2(top, m, cfg)
	return m
}

// hfCheckpoint is the directory named by hf: and where the spec names it.
type hfCheckpoint struct {
	dir   string // absolute
	at    Pos    // the value
	keyAt Pos    // the hf: key
}

// hfDir reads `hf: dir`: a Hugging Face checkpoint directory that supplies config.json,
// weights, tokenizer and generation settings wherever the spec does not. Unlike a weights
// path it must exist now: its config.json carries the dimensions.
func (p *parser) hfDir(top *mapping) *hfCheckpoint {
	n := top.get("hf")
	if n == nil {
		return nil
	}
	s, ok := p.str(n, "hf")
	if !ok {
		return nil
	}
	if s == "" {
		p.errorf(n, "", "hf: path must not be empty")
		return nil
	}
	dir := p.resolve(s)
	st, err := os.Stat(dir)
	switch {
	case err != nil:
		p.errorf(n, "give the checkpoint directory, relative to the spec's directory", "hf: %v", err)
		return nil
	case !st.IsDir():
		p.errorf(n, "give the directory that holds config.json, not a file in it", "hf: %s is not a directory", s)
		return nil
	}
	return &hfCheckpoint{dir: dir, at: p.pos(n), keyAt: top.keyPos(p, "hf")}
}

// hfTokenizer takes the checkpoint's tokenizer.json when the spec names no tokenizer.
func (p *parser) hfTokenizer(hf *hfCheckpoint, t *Tokenizer) {
	path := filepath.Join(hf.dir, "tokenizer.json")
	if st, err := os.Stat(path); err != nil || !st.Mode().IsRegular() {
		p.errorAt(hf.keyAt, `give tokenizer: {hf: path/to/tokenizer.json} or tokenizer: bytes`,
			"model spec: missing key \"tokenizer\", and %s has no tokenizer.json", hf.dir)
		return
	}
	*t = Tokenizer{Pos: hf.at, Kind: "hf", Path: path}
}

// configSource is the config.json a spec imports (from config:, else hf:) and where it is
// named: dimensions from it are reported at the value, problems with the file as a whole at
// the key.
type configSource struct {
	given bool      // config: or hf: names one
	cfg   *HFConfig // nil when none was given or it failed to load (reported already)
	at    Pos
	keyAt Pos
	// eos is generation_config.json's eos_token_id (hf: only); it takes precedence over
	// config.json's, as it does in transformers' generate.
	eos []int
}

func (p *parser) configRef(top *mapping, hf *hfCheckpoint) *configSource {
	if n := top.get("config"); n != nil {
		return &configSource{given: true, cfg: p.config(n), at: p.pos(n), keyAt: top.keyPos(p, "config")}
	}
	if n := top.get("hf"); n != nil && hf == nil {
		// A bad hf: was reported; what its config.json lacks is then unknown.
		return &configSource{given: true, at: p.pos(n), keyAt: top.keyPos(p, "hf")}
	}
	if hf == nil {
		return &configSource{keyAt: top.keyPos(p, "config")}
	}
	src := &configSource{given: true, at: hf.at, keyAt: hf.keyAt}
	src.cfg = p.readConfig(filepath.Join(hf.dir, "config.json"), "hf", hf.at,
		"a Hugging Face checkpoint directory holds config.json beside its weights")
	gen := filepath.Join(hf.dir, "generation_config.json")
	if _, err := os.Stat(gen); err == nil {
		eos, err := ReadGenerationEOS(gen)
		var e *Error
		switch {
		case errors.As(err, &e):
			p.errs = append(p.errs, e)
			p.errorAt(hf.at, "", "hf: %s is not usable (see the error there)", gen)
		case err != nil:
			p.errorAt(hf.at, "", "hf: %v", err)
		default:
			src.eos = eos
		}
	}
	return src
}

// family sets the family from family: or else config.json's model_type, and the attention
// options it implies (Hugging Face: Qwen2 has q/k/v biases, Qwen3 QK-norm). It rejects
// configs that ask for what the forward lacks: o_proj biases and sliding windows that a
// sequence could outgrow.
func (p *parser) family(top *mapping, m *Model, src *configSource) {
	n := top.get("family")
	if n != nil {
		m.Family, _ = p.oneOf(n, "family", families)
	}
	cfg, cfgPos := src.cfg, src.keyAt
	switch {
	case cfg != nil && cfg.ModelType != "":
		switch {
		case !contains(families, cfg.ModelType):
			p.errorAt(cfgPos, "supported: "+strings.Join(families, ", "), "config.json model_type %q is not a supported family", cfg.ModelType)
		case n == nil:
			m.Family = cfg.ModelType
		case m.Family != "" && m.Family != cfg.ModelType:
			p.errorf(n, "drop family: to take config.json's", "family %s, but config.json model_type is %s", m.Family, cfg.ModelType)
		}
	case n == nil && (cfg != nil || !src.given):
		hint := ""
		if cfg != nil {
			hint = "config.json has no model_type either"
		}
		p.errorf(p.owner(top.node), hint, "model spec: missing key %q", "family")
	}
	m.QKVBias, m.QKNorm = m.Family == "qwen2", m.Family == "qwen3"
	if cfg == nil {
		return
	}
	// architectures names the head too: a model_type's classification or vision variants
	// have other tensors than the causal LM the forward computes.
	for _, a := range cfg.Architectures {
		if !contains(architectures, a) {
			p.errorAt(cfgPos, "supported: "+strings.Join(architectures, ", "), "config.json architecture %s is not supported", a)
		}
	}
	if m.Family == "" {
		return
	}
	// Qwen2 ignores attention_bias (its q/k/v biases are fixed); the others bias o_proj too.
	if cfg.AttentionBias != nil && *cfg.AttentionBias && m.Family != "qwen2" {
		p.errorAt(cfgPos, "", "config.json attention_bias: projection biases (o_proj included) are not supported for family %s", m.Family)
	}
	window := 0
	switch m.Family {
	case "mistral":
		if cfg.SlidingWindow != nil {
			window = *cfg.SlidingWindow
		}
	case "qwen2", "qwen3":
		if cfg.UseSlidingWindow != nil && *cfg.UseSlidingWindow && cfg.SlidingWindow != nil {
			window = *cfg.SlidingWindow
		}
	}
	if window > 0 && m.MaxSeqLen > window {
		p.errorAt(cfgPos, fmt.Sprintf("set serving.max_seq_len to at most %d", window),
			"config.json sliding_window %d is shorter than serving.max_seq_len %d, and sliding-window attention is not supported", window, m.MaxSeqLen)
	}
}

// dims fills the model's dimensions from the imported config.json (if any), then dims: on top.
func (p *parser) dims(top *mapping, m *Model, src *configSource) {
	var d struct {
		hidden, intermediate, layers, heads, kvHeads, headDim, vocab intField
		ropeTheta, rmsEps                                            floatField
	}
	cfg := src.cfg
	if cfg != nil {
		at := src.at
		fromCfg := func(f *intField, v *int, key string) {
			if v != nil {
				*f = intField{v: *v, set: true, ok: true, pos: at, name: "config.json " + key}
			}
		}
		fromCfg(&d.hidden, cfg.HiddenSize, "hidden_size")
		fromCfg(&d.intermediate, cfg.IntermediateSize, "intermediate_size")
		fromCfg(&d.layers, cfg.NumHiddenLayers, "num_hidden_layers")
		fromCfg(&d.heads, cfg.NumAttentionHeads, "num_attention_heads")
		fromCfg(&d.kvHeads, cfg.NumKeyValueHeads, "num_key_value_heads")
		fromCfg(&d.headDim, cfg.HeadDim, "head_dim")
		fromCfg(&d.vocab, cfg.VocabSize, "vocab_size")
		if cfg.RopeTheta != nil {
			d.ropeTheta = floatField{v: *cfg.RopeTheta, set: true, ok: true, pos: at, name: "config.json rope_theta"}
		}
		if cfg.RMSNormEps != nil {
			d.rmsEps = floatField{v: *cfg.RMSNormEps, set: true, ok: true, pos: at, name: "config.json rms_norm_eps"}
		}
		if cfg.TieWordEmbeddings != nil {
			m.TieEmbeddings = *cfg.TieWordEmbeddings
		}
		m.RopeScaling = cfg.RopeScaling
	}

	dimsNode := top.get("dims")
	if dimsNode == nil && !src.given {
		p.errorf(top.node, "give dims: {hidden, intermediate, layers, heads, vocab}, config: path/to/config.json or hf: path/to/checkpoint",
			"model spec: missing key \"dims\"")
		return
	}
	dm := &mapping{byKey: map[string]entry{}}
	if dimsNode != nil {
		if dm = p.mapping(dimsNode, "dims", dimsKeys); dm == nil {
			return
		}
	}
	yamlInt := func(f *intField, key string) {
		if n := dm.get(key); n != nil {
			v, ok := p.integer(n, "dims."+key)
			*f = intField{v: v, set: true, ok: ok, pos: p.pos(n), name: "dims." + key}
		}
	}
	yamlInt(&d.hidden, "hidden")
	yamlInt(&d.intermediate, "intermediate")
	yamlInt(&d.layers, "layers")
	yamlInt(&d.heads, "heads")
	yamlInt(&d.kvHeads, "kv_heads")
	yamlInt(&d.headDim, "head_dim")
	yamlInt(&d.vocab, "vocab")
	yamlFloat := func(f *floatField, key string) {
		if n := dm.get(key); n != nil {
			v, ok := p.number(n, "dims."+key)
			*f = floatField{v: v, set: true, ok: ok, pos: p.pos(n), name: "dims." + key}
		}
	}
	yamlFloat(&d.ropeTheta, "rope_theta")
	yamlFloat(&d.rmsEps, "rms_eps")
	if n := dm.get("tie_embeddings"); n != nil {
		m.TieEmbeddings, _ = p.boolean(n, "dims.tie_embeddings")
	}
	if n := dm.get("rope_scaling"); n != nil {
		m.RopeScaling = p.ropeScaling(n)
	}

	missingAt := top.node
	if dimsNode != nil {
		missingAt = p.owner(dimsNode)
	}
	required := []struct {
		f   *intField
		key string
	}{{&d.hidden, "hidden"}, {&d.intermediate, "intermediate"}, {&d.layers, "layers"}, {&d.heads, "heads"}, {&d.vocab, "vocab"}}
	// A config.json that failed to load was reported already; what it lacks is then unknown.
	cfgFailed := src.given && cfg == nil
	for _, r := range required {
		if !r.f.set && !cfgFailed {
			hint := ""
			if cfg != nil {
				hint = "config.json does not give it either"
			}
			p.errorf(missingAt, hint, "dims: missing key %q", r.key)
		}
	}
	for _, x := range []struct {
		f   *intField
		key string
	}{{&d.hidden, "hidden"}, {&d.intermediate, "intermediate"}, {&d.layers, "layers"}, {&d.heads, "heads"},
		{&d.kvHeads, "kv_heads"}, {&d.headDim, "head_dim"}, {&d.vocab, "vocab"}} {
		f, lim := x.f, dimLimits[x.key]
		switch {
		case f.ok && (f.v < 1 || f.v > maxInt):
			p.errorAt(f.pos, "", "%s: must be a positive integer, got %d", f.name, f.v)
			f.ok = false
		case f.ok && f.v > lim.max:
			p.errorAt(f.pos, lim.hint(), "%s: %d is more than this compiler supports", f.name, f.v)
			f.ok = false
		}
	}
	for _, f := range []*floatField{&d.ropeTheta, &d.rmsEps} {
		switch {
		case f.ok && !(f.v > 0):
			p.errorAt(f.pos, "", "%s: must be positive, got %g", f.name, f.v)
			f.ok = false
		case f.ok && f.v > maxFloat32:
			p.errorAt(f.pos, fmt.Sprintf("at most %.4g", maxFloat32), "%s: %g is out of float32 range", f.name, f.v)
			f.ok = false
		}
	}
	m.Hidden, m.Intermediate, m.Layers, m.Heads, m.Vocab = d.hidden.v, d.intermediate.v, d.layers.v, d.heads.v, d.vocab.v
	m.LayersPos = d.layers.pos
	m.RopeTheta, m.RMSEps = defaultRopeTheta, defaultRMSEps
	if d.ropeTheta.ok {
		m.RopeTheta = d.ropeTheta.v
	}
	if d.rmsEps.ok {
		m.RMSEps = d.rmsEps.v
	}

	// Derived defaults need the values they derive from; skip them when those were bad.
	if !d.heads.ok {
		return
	}
	m.KVHeads = m.Heads
	if d.kvHeads.set {
		if !d.kvHeads.ok {
			return
		}
		m.KVHeads = d.kvHeads.v
		if m.Heads%m.KVHeads != 0 {
			p.errorAt(d.kvHeads.pos, "each KV head serves a whole group of query heads",
				"%s %d does not divide %s %d", d.kvHeads.name, m.KVHeads, d.heads.name, m.Heads)
		}
	}
	switch {
	case d.headDim.set:
		m.HeadDim, m.HeadDimPos = d.headDim.v, d.headDim.pos
	case d.hidden.ok && m.Hidden%m.Heads != 0:
		p.errorAt(d.heads.pos, "set dims.head_dim",
			"%s %d does not divide %s %d, so head_dim has no default", d.heads.name, m.Heads, d.hidden.name, m.Hidden)
	case d.hidden.ok:
		m.HeadDim, m.HeadDimPos = m.Hidden/m.Heads, d.heads.pos
	}
}

// config imports the config.json named by n. A missing or broken file is an error here, unlike
// missing weights, because the dimensions are needed to check the rest of the spec.
func (p *parser) config(n *yaml.Node) *HFConfig {
	s, ok := p.str(n, "config")
	if !ok {
		return nil
	}
	return p.readConfig(p.resolve(s), "config", p.pos(n), "the path is relative to the spec's directory")
}

// readConfig reads a config.json for key (config or hf), reporting problems at pos; hint
// goes with a file that cannot be read.
func (p *parser) readConfig(path, key string, pos Pos, hint string) *HFConfig {
	cfg, err := ReadHFConfig(path)
	if err != nil {
		var e *Error
		if errors.As(err, &e) {
			p.errs = append(p.errs, e)
			p.errorAt(pos, "", "%s: %s is not a usable config.json (see the error there)", key, path)
		} else {
			p.errorAt(pos, hint, "%s: %v", key, err)
		}
		return nil
	}
	return cfg
}

func (p *parser) ropeScaling(n *yaml.Node) *RopeScaling {
	if isNull(n) {
		return nil
	}
	rm := p.mapping(n, "rope_scaling", ropeScalingKeys)
	if rm == nil || !p.require(rm, "rope_scaling", ropeScalingKeys...) {
		return nil
	}
	rs := &RopeScaling{}
	var ok [5]bool
	rs.Type, ok[0] = p.oneOf(rm.get("type"), "rope_scaling.type", []string{"llama3"})
	rs.Factor, ok[1] = p.number(rm.get("factor"), "rope_scaling.factor")
	rs.LowFreqFactor, ok[2] = p.number(rm.get("low_freq_factor"), "rope_scaling.low_freq_factor")
	rs.HighFreqFactor, ok[3] = p.number(rm.get("high_freq_factor"), "rope_scaling.high_freq_factor")
	rs.OriginalMaxPos, ok[4] = p.positive(rm.get("original_max_position_embeddings"), "rope_scaling.original_max_position_embeddings")
	if ok[1] && !(rs.Factor > 0) {
		p.errorf(rm.get("factor"), "", "rope_scaling.factor: must be positive, got %g", rs.Factor)
	}
	if ok[2] && !(rs.LowFreqFactor > 0) {
		p.errorf(rm.get("low_freq_factor"), "", "rope_scaling.low_freq_factor: must be positive, got %g", rs.LowFreqFactor)
	}
	if ok[2] && ok[3] && !(rs.HighFreqFactor > rs.LowFreqFactor) {
		p.errorf(rm.get("high_freq_factor"), "llama3 scaling blends between the two wavelengths",
			"rope_scaling.high_freq_factor %g must be larger than low_freq_factor %g", rs.HighFreqFactor, rs.LowFreqFactor)
	}
	return rs
}

// weights reads `weights: path` or `weights: {synthetic: {seed, std}}`. A missing file is not
// an error here: `check` must work without the weights at hand.
func (p *parser) weights(n *yaml.Node, w *Weights) {
	w.Pos = p.pos(n)
	if n.Kind == yaml.ScalarNode && n.Tag == "!!str" {
		if n.Value == "" {
			p.errorf(n, "", "weights: path must not be empty")
			return
		}
		w.Path = p.resolve(n.Value)
		return
	}
	if n.Kind != yaml.MappingNode {
		p.errorf(n, "give a path or {synthetic: {seed: 1, std: 0.02}}", "weights: expected a path or a mapping, got %s", describe(n))
		return
	}
	wm := p.mapping(n, "weights", []string{"synthetic"})
	if wm == nil || !p.require(wm, "weights", "synthetic") {
		return
	}
	sm := p.mapping(wm.get("synthetic"), "weights.synthetic", []string{"seed", "std"})
	if sm == nil {
		return
	}
	w.Synthetic, w.Std = true, defaultSyntheticSD
	if s := sm.get("seed"); s != nil {
		v, _ := p.natural(s, "weights.synthetic.seed")
		w.Seed = uint64(v)
	}
	if s := sm.get("std"); s != nil {
		if v, ok := p.float32Number(s, "weights.synthetic.std"); ok && !(v > 0) {
			p.errorf(s, "", "weights.synthetic.std: must be positive, got %g", v)
		} else {
			w.Std = v
		}
	}
}

func (p *parser) tokenizer(n *yaml.Node, t *Tokenizer) {
	t.Pos = p.pos(n)
	const hint = `use "bytes" or {hf: path/to/tokenizer.json}`
	if n.Kind == yaml.ScalarNode && n.Tag == "!!str" {
		if n.Value != "bytes" {
			p.errorf(n, hint, "tokenizer: unknown tokenizer %q", n.Value)
			return
		}
		t.Kind = "bytes"
		return
	}
	if n.Kind != yaml.MappingNode {
		p.errorf(n, hint, "tokenizer: expected a word or a mapping, got %s", describe(n))
		return
	}
	tm := p.mapping(n, "tokenizer", []string{"hf"})
	if tm == nil || !p.require(tm, "tokenizer", "hf") {
		return
	}
	path, ok := p.str(tm.get("hf"), "tokenizer.hf")
	if !ok {
		return
	}
	if path == "" {
		p.errorf(tm.get("hf"), "", "tokenizer.hf: path must not be empty")
		return
	}
	t.Kind, t.Path = "hf", p.resolve(path)
}

// specialTokens sets BOS and EOS from the spec, falling back to generation_config.json (for
// eos) and config.json. BOS stays -1 when neither gives one. Whether prompts start with the
// BOS is the tokenizer's business (compile.PromptBOS decides it for a tokenizer.json); a bos: in the
// spec always is (BOSGiven).
func (p *parser) specialTokens(top *mapping, m *Model, src *configSource) {
	if cfg := src.cfg; cfg != nil {
		if cfg.BOSTokenID != nil {
			m.BOS = *cfg.BOSTokenID
		}
		m.EOS = cfg.EOSTokenIDs
	}
	if src.eos != nil {
		m.EOS = src.eos
	}
	bosPos, eosPos := src.keyAt, src.keyAt
	if n := top.get("bos"); n != nil {
		bosPos = p.pos(n)
		if v, ok := p.natural(n, "bos"); ok {
			m.BOS, m.BOSGiven = v, true
		}
	}
	if n := top.get("eos"); n != nil {
		eosPos = p.pos(n)
		m.EOS, _ = p.ints(n, "eos", true, p.natural)
	}
	if len(m.EOS) > maxEOS {
		p.errorAt(eosPos, fmt.Sprintf("at most %d", maxEOS), "eos: %d ids is more than this compiler supports", len(m.EOS))
		m.EOS = nil
	}
	if m.Tokenizer.Kind == "bytes" && m.Vocab > 0 && m.Vocab < byteTokens {
		p.errorAt(m.Tokenizer.Pos, "the bytes tokenizer uses ids 0-255 for the bytes", "tokenizer: vocab %d is smaller than %d", m.Vocab, byteTokens)
	}
	if m.Vocab <= 0 {
		return
	}
	hint := "vocab is " + strconv.Itoa(m.Vocab)
	if m.BOS >= m.Vocab || m.BOS < -1 {
		p.errorAt(bosPos, hint, "bos %d is not a token id of the model", m.BOS)
	}
	for _, id := range m.EOS {
		if id < 0 || id >= m.Vocab {
			p.errorAt(eosPos, hint, "eos %d is not a token id of the model", id)
		}
	}
}

// chatTemplate reads chat_template: a Jinja file (relative to the spec) that replaces the
// one of the checkpoint's tokenizer_config.json, or gives a model without one (the bytes
// tokenizer) a chat template. It is parsed when the bundle is built.
func (p *parser) chatTemplate(top *mapping, m *Model) {
	n := top.get("chat_template")
	if n == nil {
		return
	}
	path, ok := p.str(n, "chat_template")
	if !ok {
		return
	}
	if path == "" {
		p.errorf(n, "give the path of a .jinja file", "chat_template: path must not be empty")
		return
	}
	m.ChatTemplate, m.ChatTemplatePos = p.resolve(path), p.pos(n)
}

func (p *parser) serving(top *mapping, m *Model) {
	m.DecodeBuckets = []int{1, 2, 4, 8}
	m.PrefillChunks = []int{64}
	m.MaxSeqLen = defaultMaxSeqLen
	m.KVBlockSize = defaultKVBlockSize
	sm := &mapping{node: top.node, byKey: map[string]entry{}}
	if n := top.get("serving"); n != nil {
		if sm = p.mapping(n, "serving", servingKeys); sm == nil {
			return
		}
	}
	ok := true
	// rows reads a list of bucket sizes: ascending, each at most maxRows, at most maxBuckets.
	rows := func(n *yaml.Node, what string) ([]int, bool) {
		v, good := p.ints(n, what, false, p.positive)
		good = good && p.ascending(n, what, v)
		if good && len(v) > maxBuckets {
			p.errorf(n, fmt.Sprintf("at most %d: each becomes a template", maxBuckets), "%s: %d sizes is more than this compiler supports", what, len(v))
			good = false
		}
		if good && v[len(v)-1] > maxRows {
			p.errorf(n, fmt.Sprintf("at most %d rows per step", maxRows), "%s: %d is more than this compiler supports", what, v[len(v)-1])
			good = false
		}
		return v, good
	}
	// bounded reads a positive integer of at most limit.
	bounded := func(n *yaml.Node, what string, limit int) (int, bool) {
		v, good := p.positive(n, what)
		if good && v > limit {
			p.errorf(n, fmt.Sprintf("at most %d", limit), "%s: %d is more than this compiler supports", what, v)
			good = false
		}
		return v, good
	}
	if n := sm.get("decode_buckets"); n != nil {
		v, good := rows(n, "serving.decode_buckets")
		ok = good
		m.DecodeBuckets = v
	}
	if n := sm.get("prefill_chunks"); n != nil {
		v, good := rows(n, "serving.prefill_chunks")
		ok = good && ok
		m.PrefillChunks = v
	}
	if n := sm.get("max_seq_len"); n != nil {
		v, good := bounded(n, "serving.max_seq_len", maxSeqLen)
		ok = good && ok
		m.MaxSeqLen = v
	}
	if n := sm.get("kv_block_size"); n != nil {
		v, good := bounded(n, "serving.kv_block_size", maxSeqLen)
		if good && v&(v-1) != 0 {
			p.errorf(n, "the attention kernels find a page with a shift: use 16, 32, ...", "serving.kv_block_size %d is not a power of two", v)
			good = false
		}
		ok = good && ok
		m.KVBlockSize = v
	}
	if !ok {
		return
	}
	largest := m.DecodeBuckets[len(m.DecodeBuckets)-1]
	m.MaxSeqs = largest
	maxSeqsAt := sm.keyPos(p, "decode_buckets")
	if n := sm.get("max_seqs"); n != nil {
		maxSeqsAt = p.pos(n)
		if v, good := bounded(n, "serving.max_seqs", maxRows); good && v < largest {
			p.errorf(n, "raise max_seqs or drop the larger buckets",
				"serving.max_seqs %d is smaller than the largest decode bucket %d", v, largest)
		} else if good {
			m.MaxSeqs = v
		} else {
			return
		}
	}
	// The page pool: every resident sequence at max_seq_len unless kv_cache_tokens says less
	// (requests reserve their pages on admission, so a smaller pool makes requests wait in
	// the queue, never fail mid-way).
	full := int64(m.MaxSeqs) * int64(m.MaxSeqLen)
	if n := sm.get("kv_cache_tokens"); n != nil {
		v, good := p.positive(n, "serving.kv_cache_tokens")
		if !good {
			return
		}
		if problem, hint := m.kvPoolProblem(v); problem != "" {
			p.errorf(n, hint, "serving.kv_cache_tokens %d %s", v, problem)
		} else {
			m.KVCacheTokens = v
		}
	} else if full > maxResidentTokens {
		p.errorAt(maxSeqsAt, fmt.Sprintf("at most %d tokens: lower max_seqs or max_seq_len, or set kv_cache_tokens", maxResidentTokens),
			"serving: max_seqs %d x max_seq_len %d = %d tokens of KV cache is more than this compiler supports", m.MaxSeqs, m.MaxSeqLen, full)
	} else {
		m.KVCacheTokens = int(full)
	}
	m.MaxLogprobs = defaultMaxLogprobs
	if n := sm.get("max_logprobs"); n != nil {
		if v, good := p.natural(n, "serving.max_logprobs"); good && v > maxLogprobs {
			p.errorf(n, fmt.Sprintf("at most %d (OpenAI allows 20)", maxLogprobs), "serving.max_logprobs %d is more than %d", v, maxLogprobs)
		} else if good {
			m.MaxLogprobs = v
		}
	}
	m.VectorSlots = m.MaxSeqs
	if n := sm.get("vector_slots"); n != nil {
		if v, good := bounded(n, "serving.vector_slots", maxRows); good && v > m.MaxSeqs {
			p.errorf(n, fmt.Sprintf("at most max_seqs (%d): a running request holds at most one", m.MaxSeqs),
				"serving.vector_slots %d is more than max_seqs %d", v, m.MaxSeqs)
		} else if good {
			m.VectorSlots = v
		}
	}
	if m.MaxSeqLen%m.KVBlockSize != 0 {
		p.errorAt(sm.keyPos(p, "kv_block_size"), "KV pages must tile the sequence exactly",
			"serving.kv_block_size %d does not divide max_seq_len %d", m.KVBlockSize, m.MaxSeqLen)
	}
	largestChunk := m.PrefillChunks[len(m.PrefillChunks)-1]
	if largestChunk > m.MaxSeqLen {
		p.errorAt(sm.keyPos(p, "prefill_chunks"), "",
			"serving.prefill_chunks: chunk %d is longer than max_seq_len %d", largestChunk, m.MaxSeqLen)
	}
	m.MaxBatchedTokens = largestChunk
	if n := sm.get("max_batched_tokens"); n != nil {
		if v, good := p.positive(n, "serving.max_batched_tokens"); good {
			if err := bundle.CheckMaxBatchedTokens(v, m.PrefillChunks, m.MaxSeqs); err != nil {
				p.errorf(n, "", "serving.%v", err)
			} else {
				m.MaxBatchedTokens = v
			}
		}
	}
}

// kvPoolProblem says what is wrong with a KV page pool of v tokens for m's serving section
// (max_seqs, max_seq_len and kv_block_size set), and the hint that fixes it; "" when nothing
// is.
func (m *Model) kvPoolProblem(v int) (problem, hint string) {
	full := int64(m.MaxSeqs) * int64(m.MaxSeqLen)
	switch {
	case int64(v) > full:
		return "is more than every resident sequence can hold", fmt.Sprintf("at most max_seqs x max_seq_len = %d (more is never used), or leave it out", full)
	case v < m.MaxSeqLen:
		return "is less than max_seq_len", fmt.Sprintf("at least max_seq_len (%d), so that one request of that length fits", m.MaxSeqLen)
	case v%m.KVBlockSize != 0:
		return fmt.Sprintf("is not a whole number of %d-token pages", m.KVBlockSize), fmt.Sprintf("a multiple of kv_block_size: %d", (v+m.KVBlockSize-1)/m.KVBlockSize*m.KVBlockSize)
	case v > maxResidentTokens:
		return "is more than this compiler supports", fmt.Sprintf("at most %d", maxResidentTokens)
	}
	return "", ""
}

// SetKVCacheTokens gives a parsed model a KV page pool of v tokens in place of its spec's
// serving.kv_cache_tokens (xmixc build --kv-cache-tokens: the same spec on a card with less
// memory), checked as that key is.
func (m *Model) SetKVCacheTokens(v int) error {
	if v <= 0 {
		return fmt.Errorf("a KV pool of %d tokens: want a positive count", v)
	}
	if problem, hint := m.kvPoolProblem(v); problem != "" {
		return fmt.Errorf("a KV pool of %d tokens %s: want %s", v, problem, hint)
	}
	m.KVCacheTokens = v
	return nil
}
