package loader

import (
	"fmt"
	"math"
	"strings"

	"xmix/bundle"
)

// RequestError says why a request cannot be served as asked: the client's mistake (an HTTP
// 400, a usage error of the CLI), not a failure of the engine. Field names the request
// field at fault, as the HTTP API spells it.
type RequestError struct {
	Field string // max_tokens, temperature, top_p, logprobs, top_logprobs, min_tokens, prompt, force, apps, set, vectors, layers or stop_when
	Msg   string
}

func (e *RequestError) Error() string { return e.Msg }

func invalid(field, format string, a ...any) error {
	return &RequestError{Field: field, Msg: fmt.Sprintf(format, a...)}
}

// Check validates r against the bundle's limits before anything is sized from it: the one
// check that Submit applies and that `xmix run` and `xmix serve` therefore share. Every
// field is checked the same way wherever it comes from; the error is a *RequestError.
func (e *Engine) Check(r *Request) error {
	_, err := e.check(r)
	return err
}

// CheckSampling checks a request's temperature and top_p, as Check does; the error is a
// *RequestError. It needs no engine: `xmix bench` checks its flags with it before it loads a
// bundle or reaches a server.
func CheckSampling(temperature, topP float32) error {
	if t := float64(temperature); math.IsNaN(t) || math.IsInf(t, 0) || t < 0 {
		return invalid("temperature", "temperature %g: want a finite number >= 0 (0: greedy)", temperature)
	}
	if p := float64(topP); math.IsNaN(p) || p < 0 || p > 1 {
		return invalid("top_p", "top_p %g: want a number in [0, 1] (0 or 1: no nucleus cut)", topP)
	}
	return nil
}

// checked is what check resolves from a valid request.
type checked struct {
	promptN   int // rows the prompt feeds (len(InputIDs))
	mask      uint32
	overrides []override
	vecs      map[*prVector][]float32
	layers    map[string][]int
	stop      *StopWhen
}

// check is Check, returning what it resolved.
func (e *Engine) check(r *Request) (*checked, error) {
	c := e.cfg
	if r.MaxTokens < 1 {
		return nil, invalid("max_tokens", "max_tokens %d: must be at least 1", r.MaxTokens)
	}
	v := &checked{promptN: len(r.Prompt)}
	if c.BOS >= 0 && !r.Verbatim {
		v.promptN++
	}
	if v.promptN == 0 {
		return nil, invalid("prompt", "empty prompt: model %s starts prompts with no BOS, so a request needs at least one token", c.Name)
	}
	// Compared without adding, so that no max_tokens can overflow the sum.
	if r.MaxTokens > c.MaxSeqLen || v.promptN > c.MaxSeqLen-r.MaxTokens {
		return nil, invalid("max_tokens", "prompt (%d tokens, BOS included) + max_tokens (%d) = %d exceeds the bundle's max_seq_len %d",
			v.promptN, r.MaxTokens, uint64(v.promptN)+uint64(r.MaxTokens), c.MaxSeqLen)
	}
	if pages := (v.promptN + r.MaxTokens + c.KVBlockSize - 1) / c.KVBlockSize; pages > c.KVBlocks-e.padPages {
		return nil, invalid("max_tokens", "request needs %d KV pages, the bundle has %d", pages, c.KVBlocks-e.padPages)
	}
	if err := CheckSampling(r.Temperature, r.TopP); err != nil {
		return nil, err
	}
	if err := e.checkSampling(r); err != nil {
		return nil, err
	}
	for _, ids := range []struct {
		field string
		ids   []int
	}{{"prompt", r.Prompt}, {"force", r.Force}} {
		for i, t := range ids.ids {
			if t < 0 || t >= c.Vocab {
				return nil, invalid(ids.field, "%s token %d: id %d is outside the vocabulary (0-%d)", ids.field, i, t, c.Vocab-1)
			}
		}
	}
	for _, name := range r.Apps {
		bit, ok := e.appBits[name]
		if !ok {
			return nil, invalid("apps", "app %q is not deployed in this bundle (deployed: %s)", name, strings.Join(e.AppNames(), ", "))
		}
		v.mask |= 1 << uint(bit)
	}
	var err error
	if v.overrides, err = e.resolveOverrides(r.Overrides); err != nil {
		return nil, err
	}
	if v.vecs, err = e.resolveVectors(r, v.mask); err != nil {
		return nil, &RequestError{Field: "vectors", Msg: err.Error()}
	}
	if err := v.checkProducts(); err != nil {
		return nil, err
	}
	if v.layers, err = e.resolveLayers(r.Layers, v.mask); err != nil {
		return nil, &RequestError{Field: "layers", Msg: err.Error()}
	}
	if v.stop, err = e.resolveStop(r.StopWhen, v.mask); err != nil {
		return nil, &RequestError{Field: "stop_when", Msg: err.Error()}
	}
	return v, nil
}

// checkProducts refuses a request's own vector whose product with the scalar that scales it
// (the request's override, else the default) overflows f32.
func (v *checked) checkProducts() error {
	for pv, data := range v.vecs {
		a := pv.app
		for col, buf := range a.scales {
			if buf != pv.buffer {
				continue
			}
			val := a.defaults[col]
			for _, o := range v.overrides {
				if o.app == a && o.col == col {
					val = o.v
				}
			}
			if l := bundle.ProductLimit(data, a.residual[col]); math.Abs(float64(val)) > float64(l) {
				return invalid("vectors", "vector %s: its product with %s %g overflows float32 (with it, %s may be at most %.4g in magnitude)",
					pv.key, a.scalarNames()[col], val, a.scalarNames()[col], l)
			}
		}
	}
	return nil
}

// resolveOverrides maps "app.scalar" names to table columns, refusing a value that is not
// finite or whose product with the vector it scales would overflow.
func (e *Engine) resolveOverrides(m map[string]float32) ([]override, error) {
	var out []override
	for name, v := range m {
		var o *override
		for _, a := range e.apps {
			if rest, ok := strings.CutPrefix(name, a.name+"."); ok {
				if col, ok := a.scalars[rest]; ok {
					o = &override{app: a, col: col, v: v}
				}
			}
		}
		if o == nil {
			var valid []string
			for _, a := range e.apps {
				for _, s := range a.scalarNames() {
					valid = append(valid, a.name+"."+s)
				}
			}
			if len(valid) == 0 {
				return nil, invalid("set", "override %q: no deployed app has scalars", name)
			}
			return nil, invalid("set", "override %q names no app scalar (valid: %s)", name, strings.Join(valid, ", "))
		}
		if err := o.app.checkValue(o.col, v, o.app.limits[o.col]); err != nil {
			return nil, invalid("set", "override %q: %v", name, err)
		}
		out = append(out, *o)
	}
	return out, nil
}

// checkValue refuses a value for column col of a's scalar table that is not finite, or whose
// product with the vector the scalar scales overflows f32: whose magnitude passes limit (the
// column's bundle.ProductLimit; 0: unbounded).
func (a *appCtl) checkValue(col int, v, limit float32) error {
	if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
		return fmt.Errorf("%v is not a finite number", v)
	}
	if l := limit; l > 0 && math.Abs(float64(v)) > float64(l) {
		return fmt.Errorf("%g times the app's param %s overflows float32 (at most %.4g in magnitude)", v, a.paramOf(col), l)
	}
	return nil
}

// paramOf is the name of the vector param column col's scalar scales (its buffer's where no
// param names it; "" for none).
func (a *appCtl) paramOf(col int) string {
	for _, x := range a.vectors {
		if x.Buffer == a.scales[col] {
			return x.Param
		}
	}
	return a.scales[col]
}

// checkConfig checks what the engine sizes its own state from in a bundle: the serving
// limits against the block table and the control buffers, so that a damaged or hostile
// manifest is an error, not an allocation of its numbers.
func checkConfig(b *bundle.Bundle, bufs map[string]bundle.Buffer) error {
	c := b.Manifest.Model
	if c.MaxSeqs < 1 || c.MaxSeqLen < 1 || c.KVBlockSize < 1 || c.Vocab < 1 || c.KVPadPages < 0 {
		return fmt.Errorf("model config: max_seqs %d, max_seq_len %d, kv_block_size %d, vocab %d, kv_pad_pages %d: want all positive",
			c.MaxSeqs, c.MaxSeqLen, c.KVBlockSize, c.Vocab, c.KVPadPages)
	}
	blocks := (c.MaxSeqLen + c.KVBlockSize - 1) / c.KVBlockSize
	bt, ok := bufs[bundle.KVBlockTable]
	if !ok || bt.Kind != bundle.KindControl || bt.Dtype != "u32" || len(bt.Shape) != 2 || bt.Shape[0] != c.MaxSeqs+1 || bt.Shape[1] != blocks {
		return fmt.Errorf("model config: %s is not a u32 control buffer of [max_seqs+1, max_seq_len/kv_block_size] = [%d, %d]", bundle.KVBlockTable, c.MaxSeqs+1, blocks)
	}
	if pad := max(1, c.KVPadPages); c.KVBlocks <= pad || c.KVBlocks-pad < blocks {
		return fmt.Errorf("model config: %d KV pages leave fewer than the %d one sequence needs beside %d padding pages", c.KVBlocks, blocks, pad)
	}
	rows := func(name string) int {
		if buf, ok := bufs[name]; ok && buf.Kind == bundle.KindControl && len(buf.Shape) > 0 {
			return buf.Shape[0]
		}
		return 0
	}
	for _, t := range b.Templates {
		if t.Tokens > rows(bundle.CtlTokens) || t.Samples > rows(bundle.CtlRNG) {
			return fmt.Errorf("template %s: %d tokens and %d samples, the control buffers hold %d and %d",
				t.Name, t.Tokens, t.Samples, rows(bundle.CtlTokens), rows(bundle.CtlRNG))
		}
	}
	return nil
}
