package loader

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"time"

	"xmix/bundle"
	"xmix/ops"
)

// Request is one generation request.
type Request struct {
	// Prompt is the prompt's token ids. The engine puts the bundle's BOS before them
	// (ModelConfig.BOS; -1 when the checkpoint's tokenizer starts prompts with none), as
	// Hugging Face's tokenizer(text) and vLLM's completions do, unless Verbatim.
	Prompt []int
	// Verbatim: Prompt is the model's whole input as it stands, BOS included or not (a
	// rendered chat template writes its own: Chat.Prompt); the engine prepends nothing.
	Verbatim    bool
	Apps        []string // names of deployed apps to enable for this request
	MaxTokens   int
	Temperature float32 // <= 0: greedy
	TopP        float32 // <= 0 or >= 1: no nucleus cut
	Seed        uint64  // the request's sampling stream depends on Seed alone
	// Force, when set, feeds these tokens back as the generation instead of the sampled ones
	// (teacher forcing: scoring a given continuation); the sampled ones are still returned.
	Force []int
	// Overrides replace app scalars for this request only, by the app's name and the
	// scalar's manifest name ("steer.op0.alpha", "cast.op3.threshold"). An override for an
	// app the request does not enable changes nothing.
	Overrides map[string]float32
	// Vectors bring this request's own values of per_request vector params, by app and
	// param name ("steer.v"; Engine.PerRequestVectors lists them), for apps the request
	// enables: each has the param's width and finite values (a direction is normalised). A
	// request with any holds a vector slot while it runs (Engine.VectorSlots).
	Vectors map[string][]float32
	// Layers narrow, for this request, the layers an op marked at: {per_request: true} runs
	// at, by app and op ("steer.op0"): a subset of its compiled layers (none: the op does
	// not run). Ops not named run at all their layers.
	Layers map[string][]int
	// StopWhen, when set, ends the request once an export crosses a threshold (reason
	// "stop_when").
	StopWhen *StopWhen
	// TokenExportsOnly keeps the exports of the rows that sample a token (the last prompt row
	// and every generated one) and not those of the prompt's other rows, whose Rows entries
	// then come without Exports: a caller that reports reads per generated token keeps no
	// copy of a long prompt's (capturing every layer of Llama-3.1-8B is 512 KB a row).
	TokenExportsOnly bool
	// Logprobs asks, for every generated token, its logprob (Result.Logprobs), and
	// TopLogprobs (0 to ModelConfig.Logprobs, and implying Logprobs) the logprobs of that
	// many most likely tokens at its position. MinTokens keeps the sampler from picking an
	// EOS id until that many tokens are generated (at most MaxTokens); IgnoreEOS keeps the
	// request going past a generated EOS (sampling.go).
	Logprobs    bool
	TopLogprobs int
	MinTokens   int
	IgnoreEOS   bool
}

// Row is one forward row of a request: the token it fed in, its position, and what the
// request's exported reads produced there.
type Row struct {
	Pos     int     `json:"pos"`
	Token   int     `json:"token"`
	Exports Exports `json:"exports,omitempty"`
}

// Export is one exported read at one row: its name (app.buffer) and values.
type Export struct {
	Name   string
	Values []float32
}

// Exports are a row's exported reads in manifest order. A slice rather than a map: the decode
// loop makes one per row per step, and a map apiece cost more host time than a
// batch-8 decode step's MI ops cost the GPU.
type Exports []Export

// Get returns the values of the read named name, or nil.
func (x Exports) Get(name string) []float32 {
	for _, e := range x {
		if e.Name == name {
			return e.Values
		}
	}
	return nil
}

// MarshalJSON writes the reads as one object, name to values.
func (x Exports) MarshalJSON() ([]byte, error) {
	return marshalNamed(x == nil, len(x), func(i int) string { return x[i].Name }, func(i int) any { return x[i].Values })
}

// UnmarshalJSON reads what MarshalJSON writes, keeping the reads' order.
func (x *Exports) UnmarshalJSON(b []byte) error {
	out, err := unmarshalNamed(b, "exports", "name to values", func(name string, dec *json.Decoder) (Export, error) {
		e := Export{Name: name}
		err := dec.Decode(&e.Values)
		return e, err
	})
	if err != nil {
		return err
	}
	*x = out
	return nil
}

// Result is what one request produced.
type Result struct {
	Tokens []int // generated ids (the EOS that stopped it included)
	Rows   []Row // every forward row, prompt and generated, in position order
	Reason string
	// Error says why a request ended early (Reason ReasonNonFinite or ReasonError).
	Error string
	// PromptTokens is how many rows the prompt fed (its BOS included): Rows[PromptTokens-1]
	// sampled Tokens[0], Rows[PromptTokens-1+k] sampled Tokens[k].
	PromptTokens int
	// Fired counts, for every op of every app the request enables, the (token row, layer)
	// sites where it changed or read the row (fired.go).
	Fired Fired
	// Logprobs, when the request asked, has an entry per generated token, aligned with Tokens.
	Logprobs []TokenLogprob
}

// InputIDs is the prompt the engine feeds for r: the bundle's BOS (when the bundle has one
// and r is not Verbatim), then r.Prompt. Its length is Result.PromptTokens.
func InputIDs(c bundle.ModelConfig, r Request) []int {
	ids := make([]int, 0, 1+len(r.Prompt))
	if c.BOS >= 0 && !r.Verbatim {
		ids = append(ids, c.BOS)
	}
	return append(ids, r.Prompt...)
}

// Why a request ended (Result.Reason): the OpenAI API's finish reasons where it has one, so
// the CLI and the server speak one vocabulary.
const (
	ReasonStop      = "stop"      // it generated an end-of-sequence token
	ReasonLength    = "length"    // it generated max_tokens tokens
	ReasonStopWhen  = "stop_when" // an export crossed the request's StopWhen threshold
	ReasonCancelled = "cancelled" // Cancel removed it
	// ReasonNonFinite: the logits of its last row were not all finite (a NaN or an
	// infinity: the forward overflowed, or an app wrote one), so no token could be sampled;
	// Error names the step. The tokens before it are what the request generated.
	ReasonNonFinite = "nonfinite"
	// ReasonError: the engine failed while serving it (Error says how): a failure of its
	// own work ends it alone, a failure of a whole step every request in that step.
	ReasonError = "error"
)

// Engine runs batched generation of a bundle on a backend.
type Engine struct {
	B  *bundle.Bundle
	Be Backend

	cfg     bundle.ModelConfig
	maxT    int
	maxS    int
	blocks  int // pages per sequence (block-table width)
	appBits map[string]int
	apps    []*appCtl
	latches []latchInfo // every after_token latch of the bundle, once per bit
	exports []exportInfo
	scratch stepScratch
	// exportBits are the app bits that have exports: rows without any skip collectExports.
	exportBits uint32
	decode     []bundle.Template
	prefill    []bundle.Template
	budget     int // rows per step at most (MaxBatchedTokens)
	tmplIdx    map[string]int
	freePage   []uint32
	padPages   int
	pool       vectorPool
	fired      []firedApp // by app, in manifest order
	queue      []*seqState
	slots      []*seqState
	nextID     int
	Stats      Stats
	// AfterStep, when set, is called after each step's template has run on the backend and
	// before its outputs are read, with the template's index; an error fails the step.
	// xmix bench --profile times a prefill step's nodes there, with the step's own control
	// words on the device.
	AfterStep func(template int) error
	// hasSRow: the bundle has ctl.s_row (each sample's token row), which the engine fills.
	hasSRow bool
	// hasBan: the sampler takes ctl.eos_ban (the bundle has EOS ids), for min_tokens.
	hasBan bool
	// hasAny: the bundle has heavy nodes, which read ctl.any_mask (the OR of the step's app
	// masks) to skip themselves.
	hasAny bool
}

// Stats counts what the engine ran.
type Stats struct {
	Steps, DecodeSteps, PrefillSteps, Rows, PaddedRows int
	DecodeTime, PrefillTime                            time.Duration
	// FirstToken is when the first token the engine sampled came back to the host.
	FirstToken time.Time
}

// appCtl is what the engine controls of one app at run time: its scalar table and the
// defaults written into it, and its replaceable vectors.
type appCtl struct {
	name     string
	bit      int
	table    string         // control buffer of [max_seqs+1, width] f32, or ""
	width    int            // columns of a table row: scalars, then layer-mask words
	defaults []float32      // by table column, scalars only; SetDefault changes them
	scalars  map[string]int // manifest scalar name -> column
	vectors  []bundle.Vector
	// By column: the vector buffer a scalar multiplies ("" for none), whether the product
	// enters the residual stream, and the largest magnitude the scalar may have
	// (bundle.ProductLimit; 0: unbounded).
	scales   []string
	residual []bool
	limits   []float32
	masks    []bundle.LayerMask
}

type latchInfo struct {
	bit    int
	tokens map[int]bool
}

type exportInfo struct {
	key     string // app.name, as Row.Exports names it
	bit     int
	buffer  string
	width   int
	samples bool // written on sampled rows only
}

// NewEngine prepares the decode loop for a bundle running on be.
func NewEngine(b *bundle.Bundle, be Backend) (*Engine, error) {
	e := &Engine{B: b, Be: be, cfg: b.Manifest.Model, appBits: map[string]int{}, tmplIdx: map[string]int{}}
	for i, t := range b.Templates {
		e.tmplIdx[t.Name] = i
		if t.Kind == bundle.Decode {
			e.decode = append(e.decode, t)
		} else {
			e.prefill = append(e.prefill, t)
		}
		e.maxT = max(e.maxT, t.Tokens)
		e.maxS = max(e.maxS, t.Samples)
	}
	if len(e.decode) == 0 || len(e.prefill) == 0 {
		return nil, fmt.Errorf("bundle has %d decode and %d prefill templates; it needs both", len(e.decode), len(e.prefill))
	}
	sort.Slice(e.decode, func(i, j int) bool { return e.decode[i].Tokens < e.decode[j].Tokens })
	sort.Slice(e.prefill, func(i, j int) bool { return e.prefill[i].Tokens < e.prefill[j].Tokens })
	e.budget = e.prefill[len(e.prefill)-1].Tokens
	if n := b.Manifest.Model.MaxBatchedTokens; n != 0 {
		if err := e.SetMaxBatchedTokens(n); err != nil {
			return nil, fmt.Errorf("bundle serving: %w", err)
		}
	}
	c := e.cfg
	bufs := map[string]bundle.Buffer{}
	for _, buf := range b.Manifest.Buffers {
		bufs[buf.Name] = buf
	}
	if err := checkConfig(b, bufs); err != nil {
		return nil, err
	}
	_, e.hasSRow = bufs[bundle.CtlSRow]
	_, e.hasAny = bufs[bundle.CtlAnyMask]
	latchBits := map[int]bool{}
	for _, a := range b.Manifest.Apps {
		e.appBits[a.Name] = a.Bit
		for _, x := range a.Exports {
			e.exportBits |= 1 << uint(a.Bit)
			e.exports = append(e.exports, exportInfo{key: a.Name + "." + x.Name, bit: a.Bit, buffer: x.Buffer, width: x.Width, samples: x.Samples})
		}
		ac, err := newAppCtl(a, bufs, c.MaxSeqs)
		if err != nil {
			return nil, fmt.Errorf("app %s: %w", a.Name, err)
		}
		e.apps = append(e.apps, ac)
		for _, l := range a.Latches {
			if l.Bit < 0 || l.Bit > 31 {
				return nil, fmt.Errorf("app %s: latch bit %d outside 0..31", a.Name, l.Bit)
			}
			if latchBits[l.Bit] {
				continue
			}
			latchBits[l.Bit] = true
			li := latchInfo{bit: l.Bit, tokens: map[int]bool{}}
			for _, t := range l.Tokens {
				li.tokens[t] = true
			}
			e.latches = append(e.latches, li)
		}
	}
	if len(e.latches) > 0 {
		if lb, ok := bufs[bundle.CtlLatch]; !ok || lb.Kind != bundle.KindControl || lb.Dtype != "u32" {
			return nil, fmt.Errorf("bundle has after_token latches but no u32 control buffer %s", bundle.CtlLatch)
		}
	}
	if err := e.initVectors(bufs); err != nil {
		return nil, err
	}
	if err := e.initFired(bufs); err != nil {
		return nil, err
	}
	if err := e.initSampling(bufs); err != nil {
		return nil, err
	}
	e.blocks = (c.MaxSeqLen + c.KVBlockSize - 1) / c.KVBlockSize
	// The last pages belong to the padding sequence (row MaxSeqs of the block table).
	e.padPages = max(1, c.KVPadPages)
	for p := c.KVBlocks - e.padPages - 1; p >= 0; p-- {
		e.freePage = append(e.freePage, uint32(p))
	}
	pad := make([]uint32, e.blocks)
	for i := range pad {
		pad[i] = uint32(c.KVBlocks - e.padPages + min(i, e.padPages-1))
	}
	if err := e.writeTableRow(c.MaxSeqs, pad); err != nil {
		return nil, err
	}
	e.slots = make([]*seqState, c.MaxSeqs)
	return e, nil
}

// newAppCtl checks an app's scalar table and vectors against the buffers that hold them.
func newAppCtl(a bundle.App, bufs map[string]bundle.Buffer, maxSeqs int) (*appCtl, error) {
	ac := &appCtl{name: a.Name, bit: a.Bit, table: a.ScalarTable, scalars: map[string]int{}, vectors: a.Vectors,
		masks: a.LayerMasks, width: a.TableWidth()}
	n := len(a.Scalars)
	if ac.width > 0 || a.ScalarTable != "" {
		tb, ok := bufs[a.ScalarTable]
		if !ok || tb.Kind != bundle.KindControl || tb.Dtype != "f32" || len(tb.Shape) != 2 || tb.Shape[0] != maxSeqs+1 || tb.Shape[1] != ac.width {
			return nil, fmt.Errorf("scalar table %q is not a control buffer of [%d, %d] f32", a.ScalarTable, maxSeqs+1, ac.width)
		}
	}
	col := n
	for _, m := range a.LayerMasks {
		if m.Column != col || m.Words <= 0 || len(m.Layers) == 0 {
			return nil, fmt.Errorf("layer mask of op %d: %d words at column %d, want column %d", m.Op, m.Words, m.Column, col)
		}
		for _, l := range m.Layers {
			if l < 0 || l >= 32*m.Words {
				return nil, fmt.Errorf("layer mask of op %d: layer %d outside its %d words", m.Op, l, m.Words)
			}
		}
		col += m.Words
	}
	ac.defaults, ac.scales, ac.residual, ac.limits = make([]float32, n), make([]string, n), make([]bool, n), make([]float32, n)
	for _, v := range a.Vectors {
		vb, ok := bufs[v.Buffer]
		if !ok || vb.Kind != bundle.KindParam || vb.Dtype != "f32" || len(vb.Shape) != 1 || vb.Shape[0] != v.Width {
			return nil, fmt.Errorf("vector %s: buffer %q is not a param buffer of [%d] f32", v.Param, v.Buffer, v.Width)
		}
	}
	for _, s := range a.Scalars {
		if _, dup := ac.scalars[s.Name]; dup || s.Index < 0 || s.Index >= n {
			return nil, fmt.Errorf("scalar %q: index %d in a table of %d (or a duplicate name)", s.Name, s.Index, n)
		}
		if s.Scales != "" && !slices.ContainsFunc(a.Vectors, func(v bundle.Vector) bool { return v.Buffer == s.Scales }) {
			return nil, fmt.Errorf("scalar %q scales %q, which is not one of the app's vectors", s.Name, s.Scales)
		}
		if l := float64(s.Limit); math.IsNaN(l) || math.IsInf(l, 0) || l < 0 {
			return nil, fmt.Errorf("scalar %q: limit %v", s.Name, s.Limit)
		}
		ac.scalars[s.Name] = s.Index
		ac.defaults[s.Index], ac.scales[s.Index], ac.residual[s.Index], ac.limits[s.Index] = s.Value, s.Scales, s.Residual, s.Limit
		if err := ac.checkValue(s.Index, s.Value, s.Limit); err != nil {
			return nil, fmt.Errorf("scalar %q: %w", s.Name, err)
		}
	}
	return ac, nil
}

func (e *Engine) app(name string) (*appCtl, error) {
	for _, a := range e.apps {
		if a.name == name {
			return a, nil
		}
	}
	return nil, fmt.Errorf("app %q is not deployed in this bundle (deployed: %s)", name, strings.Join(e.AppNames(), ", "))
}

// scalarNames lists the app's scalars in table order.
func (a *appCtl) scalarNames() []string {
	ns := make([]string, len(a.defaults))
	for n, i := range a.scalars {
		ns[i] = n
	}
	return ns
}

// SetDefault changes the default of one of an app's scalars ("op0.alpha") for requests
// admitted from now on; running requests keep the values they were admitted with (Change).
func (e *Engine) SetDefault(app, scalar string, v float32) error {
	return e.Change(app, map[string]float32{scalar: v}, nil)
}

// SetVector replaces the value of one of an app's vector params on the device; it takes
// effect from the next step, for every request that enables the app, without rebuilding
// anything (Change). A param the app uses as a direction is normalised to unit length
// first, as the compiler does.
func (e *Engine) SetVector(app, param string, v []float32) error {
	return e.Change(app, nil, map[string][]float32{param: v})
}

// Change sets defaults of an app's scalars (by name, "op0.alpha") and values of its vector
// params at once, all or nothing. Every name must be the app's, every value finite, a
// direction's norm not zero, and each scalar's default times the vector it scales within
// float32 in the state the change leaves: the new default and the new vector where the
// change gives them, the present ones elsewhere. Only then is anything written, so a refused
// change (a *RequestError, field "set" or "vectors") leaves the app as it was. New defaults
// hold for requests admitted from now on, new vectors from the next step.
func (e *Engine) Change(app string, scalars map[string]float32, vectors map[string][]float32) error {
	a, err := e.app(app)
	if err != nil {
		return err
	}
	defaults := slices.Clone(a.defaults)
	for _, name := range slices.Sorted(maps.Keys(scalars)) {
		i, ok := a.scalars[name]
		if !ok {
			return invalid("set", "app %s has no scalar %q (scalars: %s)", app, name, strings.Join(a.scalarNames(), ", "))
		}
		defaults[i] = scalars[name]
	}
	data := map[string][]float32{} // the new vectors' buffers' values
	for _, param := range slices.Sorted(maps.Keys(vectors)) {
		v, found := vectors[param], false
		for _, x := range a.vectors {
			if x.Param != param {
				continue
			}
			found = true
			if len(v) != x.Width {
				return invalid("vectors", "app %s param %s: %d values, the app's kernels need %d", app, param, len(v), x.Width)
			}
			d, err := checkVector(v, x.Unit)
			if err != nil {
				return invalid("vectors", "app %s param %s: %v", app, param, err)
			}
			data[x.Buffer] = d
		}
		if !found {
			var params []string
			for _, x := range a.vectors {
				params = append(params, x.Param)
			}
			slices.Sort(params)
			return invalid("vectors", "app %s has no replaceable vector param %q (params: %s)", app, param, strings.Join(slices.Compact(params), ", "))
		}
	}
	limits := slices.Clone(a.limits)
	for col, buf := range a.scales {
		if d, ok := data[buf]; ok {
			limits[col] = bundle.ProductLimit(d, a.residual[col])
		}
	}
	names := a.scalarNames()
	for col := range defaults {
		_, newVector := data[a.scales[col]]
		if _, set := scalars[names[col]]; !set && !newVector {
			continue
		}
		err := a.checkValue(col, defaults[col], limits[col])
		switch {
		case err == nil:
		case newVector && !math.IsNaN(float64(defaults[col])) && !math.IsInf(float64(defaults[col]), 0):
			return invalid("vectors", "app %s param %s: the new vector times the default %g of %s overflows float32 (with it, at most %.4g in magnitude)",
				app, a.paramOf(col), defaults[col], names[col], limits[col])
		default:
			return invalid("set", "app %s scalar %s: %v", app, names[col], err)
		}
	}
	for _, buf := range slices.Sorted(maps.Keys(data)) {
		if err := e.Be.Write(buf, 0, putF32s(data[buf])); err != nil {
			return fmt.Errorf("app %s vector %s: %w", app, buf, err)
		}
		if err := e.setDefaultVector(buf, data[buf]); err != nil {
			return fmt.Errorf("app %s vector %s: %w", app, buf, err)
		}
	}
	a.defaults, a.limits = defaults, limits
	return nil
}

// override is one resolved Request.Overrides entry.
type override struct {
	app *appCtl
	col int
	v   float32
}

// writeScalars writes slot's row of the scalar table of every app s enables: the current
// defaults with the request's overrides, then the words of its layer masks (every compiled
// layer on, or those the request names).
func (e *Engine) writeScalars(s *seqState) error {
	for _, a := range e.apps {
		if a.table == "" || s.mask&(1<<uint(a.bit)) == 0 {
			continue
		}
		row := make([]float32, a.width)
		copy(row, a.defaults)
		for _, o := range s.overrides {
			if o.app == a {
				row[o.col] = o.v
			}
		}
		for _, m := range a.masks {
			layers, own := s.layers[layerKey(a, m)]
			if !own {
				layers = m.Layers
			}
			words := make([]uint32, m.Words)
			for _, l := range layers {
				words[l/32] |= 1 << uint(l%32)
			}
			for i, w := range words {
				row[m.Column+i] = math.Float32frombits(w)
			}
		}
		if err := e.Be.Write(a.table, int64(4*s.slot*len(row)), putF32s(row)); err != nil {
			return fmt.Errorf("app %s scalars: %w", a.name, err)
		}
	}
	return nil
}

// latchWord is the latch bits of s's row at pos: bit b once a token of latch b's set has
// appeared at a position <= pos. It scans each token of the sequence once.
func (e *Engine) latchWord(s *seqState, pos int) uint32 {
	if s.latchAt == nil {
		s.latchAt = make([]int, len(e.latches))
		for i := range s.latchAt {
			s.latchAt[i] = -1
		}
	}
	for ; s.scanned <= pos; s.scanned++ {
		tok := s.tokens[s.scanned]
		for i, l := range e.latches {
			if s.latchAt[i] < 0 && l.tokens[tok] {
				s.latchAt[i] = s.scanned
			}
		}
	}
	var w uint32
	for i, l := range e.latches {
		if at := s.latchAt[i]; at >= 0 && at <= pos {
			w |= 1 << uint(l.bit)
		}
	}
	return w
}

func (e *Engine) writeTableRow(seq int, pages []uint32) error {
	return e.Be.Write(bundle.KVBlockTable, int64(4*seq*e.blocks), putU32s(pages))
}

// AppNames lists the deployed apps.
func (e *Engine) AppNames() []string {
	var ns []string
	for _, a := range e.B.Manifest.Apps {
		ns = append(ns, a.Name)
	}
	return ns
}

type seqState struct {
	h       *Handle
	req     *Request
	res     *Result
	slot    int
	pages   []uint32
	tokens  []int // InputIDs, then the generated tokens
	fed     int   // tokens already run through the model
	mask    uint32
	rng     *rand.Rand
	done    bool
	promptN int
	// Run-time control: scalar overrides, and for each of the engine's latches the first
	// position where one of its tokens appears (-1: not yet), over tokens[:scanned].
	overrides []override
	latchAt   []int
	scanned   int
	// Per-request vectors (nil: none, no slot needed) and the slot held (-1: none); layer
	// masks the request narrows, by layerKey.
	vecs   map[*prVector][]float32
	vslot  int
	layers map[string][]int
	// firedAt[i]: where app i's entries start in res.Fired (nil: no app enabled); stop:
	// the request's resolved StopWhen.
	firedAt []int
	stop    *StopWhen
}

// Handle follows one submitted request.
type Handle struct {
	ID     int
	Result Result
	Done   bool
	// TokenTimes is when each generated token came back to the host.
	TokenTimes []time.Time
	Submitted  time.Time
}

// Submit validates a request (Check) and queues it; it joins the running batch at the next
// step boundary that has a free sequence slot and enough KV pages for it. Nothing is sized
// from the request before it has passed Check. An internal failure (a panic) is returned
// as an error that is not a *RequestError.
func (e *Engine) Submit(r Request) (h *Handle, err error) {
	defer func() {
		if p := recover(); p != nil {
			h, err = nil, panicError("submit", p)
		}
	}()
	v, err := e.check(&r)
	if err != nil {
		return nil, err
	}
	e.nextID++
	h = &Handle{ID: e.nextID, Submitted: time.Now()}
	s := &seqState{h: h, req: &r, res: &h.Result, slot: -1, vslot: -1, rng: rand.New(rand.NewPCG(r.Seed, 0x786d6978)),
		mask: v.mask, overrides: v.overrides, vecs: v.vecs, layers: v.layers, stop: v.stop}
	s.tokens = append(make([]int, 0, v.promptN+r.MaxTokens), InputIDs(e.cfg, r)...)
	s.promptN = len(s.tokens)
	h.Result.PromptTokens = s.promptN
	e.startFired(s)
	// Sized for the whole request: nothing regrows on the decode loop's path.
	s.res.Rows = make([]Row, 0, s.promptN+r.MaxTokens)
	s.res.Tokens = make([]int, 0, r.MaxTokens)
	h.TokenTimes = make([]time.Time, 0, r.MaxTokens)
	e.queue = append(e.queue, s)
	return h, nil
}

// Busy reports whether requests are queued or running.
func (e *Engine) Busy() bool {
	if len(e.queue) > 0 {
		return true
	}
	for _, s := range e.slots {
		if s != nil {
			return true
		}
	}
	return false
}

// Step admits queued requests and runs one forward over the running batch. It returns
// false when there was nothing to do.
//
// One request's failure never stops the engine. A failure of a request's own work (its
// admission, its rows' results; a panic there included) ends that request alone with
// ReasonError; the step goes on for the others. A failure of the step itself (the backend,
// or a panic outside any one request's work) ends every running request with ReasonError,
// naming the step, and is returned; the engine stays usable, and queued requests run in
// later steps.
func (e *Engine) Step() (ran bool, err error) {
	ran, err = e.tryStep()
	if err != nil {
		err = fmt.Errorf("step %d: %w", e.Stats.Steps, err)
		for _, s := range e.slots {
			if s != nil && !s.done {
				e.fail(s, ReasonError, err)
			}
		}
	}
	for i, s := range e.slots {
		if s != nil && s.done {
			e.retire(i)
		}
	}
	return ran, err
}

// tryStep is Step's work, with a panic turned into its error.
func (e *Engine) tryStep() (ran bool, err error) {
	defer func() {
		if p := recover(); p != nil {
			ran, err = true, panicError("step", p)
		}
	}()
	if err := e.admit(); err != nil {
		return false, err
	}
	active := emptied(e.scratch.active)
	for _, s := range e.slots {
		if s != nil && !s.done {
			active = append(active, s)
		}
	}
	e.scratch.active = active
	if len(active) == 0 {
		return false, nil
	}
	return true, e.step(active)
}

// fail ends s early: Reason why (ReasonNonFinite or ReasonError) and err's message.
func (e *Engine) fail(s *seqState, why string, err error) {
	s.done, s.res.Reason, s.res.Error = true, why, err.Error()
}

// guard runs f, a part of the step's work that concerns s alone: its error, or a panic,
// ends s and no other request.
func (e *Engine) guard(s *seqState, f func() error) {
	defer func() {
		if p := recover(); p != nil {
			e.fail(s, ReasonError, panicError("request", p))
		}
	}()
	if err := f(); err != nil {
		e.fail(s, ReasonError, err)
	}
}

// panicError turns a recovered panic into an error naming where it happened: the innermost
// frame outside the runtime, on a worker goroutine where one raised it (ops.WorkerPanic).
// Call it from the deferred function that recovered p.
func panicError(what string, p any) error {
	at := ops.PanicSite(2)
	if wp, ok := p.(ops.WorkerPanic); ok {
		p, at = wp.Value, wp.At
	}
	if at == "" {
		return fmt.Errorf("internal error in %s: %v; please report it", what, p)
	}
	return fmt.Errorf("internal error in %s: %v (at %s); please report it", what, p, at)
}

// Generate runs all requests to completion, batching them; results are in request order.
// A request that ends early (ReasonNonFinite, ReasonError) does not stop the others: its
// error is returned, joined with theirs, beside every result.
func (e *Engine) Generate(reqs []Request) ([]Result, error) {
	hs := make([]*Handle, len(reqs))
	for i, r := range reqs {
		h, err := e.Submit(r)
		if err != nil {
			return nil, fmt.Errorf("request %d: %w", i, err)
		}
		hs[i] = h
	}
	for e.Busy() {
		if _, err := e.Step(); err != nil {
			return nil, err
		}
	}
	out := make([]Result, len(hs))
	var errs []error
	for i, h := range hs {
		out[i] = h.Result
		if h.Result.Error != "" {
			errs = append(errs, fmt.Errorf("request %d: %s", i, h.Result.Error))
		}
	}
	return out, errors.Join(errs...)
}

// admit moves queued requests into free slots while pages last. Pages for the whole
// request (prompt + max tokens) are reserved on admission, so a running request never
// waits for memory; a request that does not fit waits in the queue.
func (e *Engine) admit() error {
	c := e.cfg
	for len(e.queue) > 0 {
		s := e.queue[0]
		free := -1
		for i, x := range e.slots {
			if x == nil {
				free = i
				break
			}
		}
		need := (s.promptN + s.req.MaxTokens + c.KVBlockSize - 1) / c.KVBlockSize
		if free < 0 || need > len(e.freePage) || s.vecs != nil && len(e.pool.free) == 0 {
			return nil
		}
		s.pages = append([]uint32(nil), e.freePage[len(e.freePage)-need:]...)
		e.freePage = e.freePage[:len(e.freePage)-need]
		s.slot = free
		e.slots[free] = s
		e.queue = e.queue[1:]
		// What is written for s concerns s alone: a failure ends it, and Step frees what it
		// holds (pages, slot, vector slot).
		e.guard(s, func() error {
			if err := e.takeVectorSlot(s); err != nil {
				return err
			}
			row := make([]uint32, e.blocks)
			copy(row, s.pages)
			if err := e.writeTableRow(free, row); err != nil {
				return err
			}
			return e.writeScalars(s)
		})
	}
	return nil
}

type stepRow struct {
	s      *seqState
	pos    int
	sample int // index among samples, -1 if the row is not sampled
}

// step plans one forward (schedule.go) and runs it.
func (e *Engine) step(active []*seqState) error {
	t, rows := e.plan(active)
	e.Stats.Steps++
	e.Stats.Rows += len(rows)
	e.Stats.PaddedRows += t.Tokens - len(rows)
	start := time.Now()
	err := e.run(t, rows)
	if t.Kind == bundle.Decode {
		e.Stats.DecodeTime += time.Since(start)
	} else {
		e.Stats.PrefillTime += time.Since(start)
	}
	return err
}

func (e *Engine) run(t bundle.Template, rows []stepRow) error {
	c := e.cfg
	n, ns := t.Tokens, t.Samples
	sc := &e.scratch
	words := sc.words(8*n + 4*ns)
	tokens, pos, seq, mask := words[:n], words[n:2*n], words[2*n:3*n], words[3*n:4*n]
	gen, outRow, latch, vslot := words[4*n:5*n], words[5*n:6*n], words[6*n:7*n], words[7*n:8*n]
	rng, sRow, lpk, ban := words[8*n:8*n+ns], words[8*n+ns:8*n+2*ns], words[8*n+2*ns:8*n+3*ns], words[8*n+3*ns:]
	asked := false // some sample wants logprobs
	floats := sc.floats(2 * ns)
	temp, topP := floats[:ns], floats[ns:]
	for i := range sRow {
		sRow[i] = 0xFFFFFFFF
	}
	for i := range n {
		seq[i] = uint32(c.MaxSeqs) // padding rows: the padding sequence, each at its own position
		pos[i] = uint32(min(i, e.padPages*c.KVBlockSize-1))
		gen[i] = 0xFFFFFFFF
		outRow[i] = 0xFFFFFFFF
		vslot[i] = 0xFFFFFFFF
	}
	sampled := sc.sampled[:0]
	for i, r := range rows {
		s := r.s
		tokens[i] = uint32(s.tokens[r.pos])
		pos[i] = uint32(r.pos)
		seq[i] = uint32(s.slot)
		mask[i] = s.mask
		if len(e.latches) > 0 {
			latch[i] = e.latchWord(s, r.pos)
		}
		if s.vslot >= 0 {
			vslot[i] = uint32(s.vslot)
		}
		if r.pos >= s.promptN {
			gen[i] = uint32(r.pos - s.promptN)
		}
		if r.sample >= 0 {
			outRow[i] = uint32(r.sample)
			temp[r.sample] = s.req.Temperature
			topP[r.sample] = s.req.TopP
			rng[r.sample] = s.rng.Uint32()
			sRow[r.sample] = uint32(i)
			lpk[r.sample] = wantsLogprobs(s.req)
			asked = asked || lpk[r.sample] != 0
			if len(s.res.Tokens) < s.req.MinTokens {
				ban[r.sample] = 1
			}
			sampled = append(sampled, r)
		}
	}
	sc.sampled = sampled
	for _, w := range []struct {
		buf string
		v   []uint32
	}{
		{bundle.CtlTokens, tokens}, {bundle.CtlPos, pos}, {bundle.CtlSeq, seq}, {bundle.CtlMask, mask}, {bundle.CtlGen, gen},
		{bundle.CtlOutRow, outRow}, {bundle.CtlRNG, rng},
	} {
		if err := e.Be.Write(w.buf, 0, sc.encode(w.v)); err != nil {
			return err
		}
	}
	for _, w := range []struct {
		buf string
		v   []float32
	}{{bundle.CtlTemperature, temp}, {bundle.CtlTopP, topP}} {
		if err := e.Be.Write(w.buf, 0, sc.encodeF32(w.v)); err != nil {
			return err
		}
	}
	if len(e.latches) > 0 {
		if err := e.Be.Write(bundle.CtlLatch, 0, sc.encode(latch)); err != nil {
			return err
		}
	}
	if e.pool.total > 0 {
		if err := e.Be.Write(bundle.CtlVSlot, 0, sc.encode(vslot)); err != nil {
			return err
		}
	}
	if e.hasAny {
		var any uint32
		for _, m := range mask {
			any |= m
		}
		if err := e.Be.Write(bundle.CtlAnyMask, 0, sc.encode([]uint32{any})); err != nil {
			return err
		}
	}
	if e.hasSRow {
		if err := e.Be.Write(bundle.CtlSRow, 0, sc.encode(sRow)); err != nil {
			return err
		}
	}
	if a := t.AttnSplit; a != nil {
		// The decode attention's context split for this step, from its longest context.
		maxN := 0
		for _, r := range rows {
			maxN = max(maxN, r.pos+1)
		}
		if err := e.Be.Write(a.Buffer, 0, sc.encode([]uint32{uint32(a.Chunk(maxN, len(rows)))})); err != nil {
			return err
		}
	}
	if e.cfg.Logprobs > 0 {
		if err := e.Be.Write(bundle.CtlLogprobs, 0, sc.encode(lpk)); err != nil {
			return err
		}
	}
	if e.hasBan {
		if err := e.Be.Write(bundle.CtlEOSBan, 0, sc.encode(ban)); err != nil {
			return err
		}
	}
	ti := e.tmplIdx[t.Name]
	if err := e.Be.Step(ti); err != nil {
		return fmt.Errorf("template %s: %w", t.Name, err)
	}
	if e.AfterStep != nil {
		if err := e.AfterStep(ti); err != nil {
			return fmt.Errorf("template %s: after the step: %w", t.Name, err)
		}
	}
	out := sc.bytes(4 * ns)
	if err := e.Be.Read(bundle.OutSampled, out); err != nil {
		return err
	}
	ids := sc.decode(out)
	now := time.Now()
	if e.Stats.FirstToken.IsZero() && len(sampled) > 0 {
		e.Stats.FirstToken = now
	}
	if err := e.collectExports(rows, n); err != nil {
		return err
	}
	if err := e.collectFired(rows, n); err != nil {
		return err
	}
	var lps []float32
	if asked {
		var err error
		if lps, err = e.readLogprobs(ns); err != nil {
			return err
		}
	}
	for _, r := range sampled {
		if !r.s.done {
			e.guard(r.s, func() error { return e.take(r, ids[r.sample], now, lps) })
		}
	}
	return nil
}

// take records the token sampled at r (and its logprobs, from the step's rows lps, when the
// request asked), or ends r's request when its logits were not finite.
func (e *Engine) take(r stepRow, id uint32, now time.Time, lps []float32) error {
	s, c := r.s, &e.cfg // a pointer: the config is copied per sampled row otherwise
	if id == bundle.NonFinite {
		e.fail(s, ReasonNonFinite, fmt.Errorf("generation step %d: the logits at position %d are not finite (the forward overflowed, or an app wrote a NaN or an infinity), so no token %d was sampled",
			len(s.res.Tokens), r.pos, len(s.res.Tokens)))
		return nil
	}
	if int64(id) >= int64(c.Vocab) {
		return fmt.Errorf("the sampler returned token %d outside the vocabulary (0-%d) at position %d", id, c.Vocab-1, r.pos)
	}
	tok := int(id)
	fed := tok
	if k := len(s.res.Tokens); k < len(s.req.Force) {
		fed = s.req.Force[k]
	}
	s.tokens = append(s.tokens, fed)
	s.res.Tokens = append(s.res.Tokens, tok)
	s.h.TokenTimes = append(s.h.TokenTimes, now)
	if lps != nil && wantsLogprobs(s.req) != 0 {
		s.res.Logprobs = append(s.res.Logprobs, e.tokenLogprob(lps, r.sample, tok, s.req))
	}
	switch {
	case isEOS(c.EOS, fed) && !s.req.IgnoreEOS:
		s.done, s.res.Reason = true, ReasonStop
	case s.stop != nil && s.stop.crossed(s.res.Rows[r.pos].Exports):
		s.done, s.res.Reason = true, ReasonStopWhen
	case len(s.res.Tokens) >= s.req.MaxTokens:
		s.done, s.res.Reason = true, ReasonLength
	}
	return nil
}

// stepScratch keeps a step's control arrays and their encodings from one step to the next,
// so that the decode loop allocates none for them: each array is rewritten whole every step,
// and Backend.Write is done with its bytes when it returns.
type stepScratch struct {
	w       []uint32
	is      []int
	f       []float32
	b       []byte
	fired   []byte
	lpB     []byte
	lpF     []float32
	ids     []uint32
	sampled []stepRow
	// The scheduler's lists (tryStep, plan): kept from step to step so that a step allocates
	// none of them (the step's rows alone were 24 bytes times the largest template's tokens).
	rows                         []stepRow
	active, decoding, prefilling []*seqState
}

// emptied returns s with no elements, its old ones cleared so that a kept list holds no
// finished request alive; the caller stores the list back after appending to it.
func emptied[T any](s []T) []T {
	clear(s)
	return s[:0]
}

// lpBytes and lpFloats hold the step's logprob rows.
func (sc *stepScratch) lpBytes(n int) []byte {
	sc.lpB = grow(sc.lpB, n)
	return sc.lpB
}

func (sc *stepScratch) lpFloats(n int) []float32 {
	sc.lpF = grow(sc.lpF, n)
	return sc.lpF
}

// firedBytes returns n bytes for a fired buffer, valid until the next call.
func (sc *stepScratch) firedBytes(n int) []byte {
	sc.fired = grow(sc.fired, n)
	return sc.fired
}

// words returns n zeroed words.
func (sc *stepScratch) words(n int) []uint32 {
	sc.w = grow(sc.w, n)
	clear(sc.w)
	return sc.w
}

// ints returns n ints, not cleared.
func (sc *stepScratch) ints(n int) []int {
	sc.is = grow(sc.is, n)
	return sc.is
}

// floats returns n zeroed floats.
func (sc *stepScratch) floats(n int) []float32 {
	sc.f = grow(sc.f, n)
	clear(sc.f)
	return sc.f
}

// bytes returns n bytes, valid until the next call of bytes, encode or encodeF32.
func (sc *stepScratch) bytes(n int) []byte {
	sc.b = grow(sc.b, n)
	return sc.b
}

// encode is v little-endian, valid until the next call of bytes, encode or encodeF32.
func (sc *stepScratch) encode(v []uint32) []byte {
	sc.b = appendU32s(sc.b[:0], v)
	return sc.b
}

// encodeF32 is encode for floats.
func (sc *stepScratch) encodeF32(v []float32) []byte {
	sc.b = appendF32s(sc.b[:0], v)
	return sc.b
}

// decode reads b's words, valid until the next call of decode.
func (sc *stepScratch) decode(b []byte) []uint32 {
	sc.ids = grow(sc.ids, len(b)/4)
	for i := range sc.ids {
		sc.ids[i] = binary.LittleEndian.Uint32(b[4*i:])
	}
	return sc.ids
}

// grow returns s resized to n, reallocated only when its capacity is short.
func grow[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	return s[:n]
}

func isEOS(eos []int, tok int) bool {
	for _, e := range eos {
		if e == tok {
			return true
		}
	}
	return false
}

// collectExports copies each exported read of the rows that enabled its app. It runs every
// step on the decode loop's critical path, and an export may be wide (capture every layer:
// 32 x 4096 floats per row), so each output buffer is read once into the reused scratch
// bytes and each wanted row is decoded from there straight into one slab that the step's
// rows share: one allocation for the values, one for the entries, and no row's values keep
// another's alive.
func (e *Engine) collectExports(rows []stepRow, n int) error {
	wants := func(r stepRow, x *exportInfo) bool {
		return r.s.mask&(1<<uint(x.bit)) != 0 && (r.sample >= 0 || !x.samples && !r.s.req.TokenExportsOnly)
	}
	// at[xi]: where export xi's n rows start in the scratch bytes, -1 when no row wants it.
	at := e.scratch.ints(len(e.exports))
	for xi := range at {
		at[xi] = -1
	}
	width, count, bytes := 0, 0, 0
	for _, r := range rows {
		if r.s.mask&e.exportBits == 0 {
			continue
		}
		for xi := range e.exports {
			if x := &e.exports[xi]; wants(r, x) {
				width += x.width
				count++
				if at[xi] < 0 {
					at[xi] = bytes
					bytes += 4 * n * x.width
				}
			}
		}
	}
	raw := e.scratch.bytes(bytes)
	for xi, x := range e.exports {
		if at[xi] >= 0 {
			if err := e.Be.Read(x.buffer, raw[at[xi]:at[xi]+4*n*x.width]); err != nil {
				return err
			}
		}
	}
	var slab []float32
	var entries Exports
	if count > 0 {
		slab, entries = make([]float32, width), make(Exports, 0, count)
	}
	next := 0
	for i, r := range rows {
		row := Row{Pos: r.pos, Token: r.s.tokens[r.pos]}
		if r.s.mask&e.exportBits != 0 {
			first := len(entries)
			for xi := range e.exports {
				if x := &e.exports[xi]; wants(r, x) {
					v := slab[next : next+x.width : next+x.width]
					next += x.width
					decodeF32s(v, raw[at[xi]+4*i*x.width:at[xi]+4*(i+1)*x.width])
					entries = append(entries, Export{Name: x.key, Values: v})
				}
			}
			if len(entries) > first {
				row.Exports = entries[first:len(entries):len(entries)]
			}
		}
		r.s.res.Rows = append(r.s.res.Rows, row)
	}
	return nil
}
