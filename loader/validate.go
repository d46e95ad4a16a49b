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
	Field string // max_tokens, temperature, top_p, prompt, force, apps or set
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

// check is Check, returning the resolved overrides.
func (e *Engine) check(r *Request) ([]override, error) {
	c := e.cfg
	if r.MaxTokens < 1 {
		return nil, invalid("max_tokens", "max_tokens %d: must be at least 1", r.MaxTokens)
	}
	// Compared without adding, so that no max_tokens can overflow the sum.
	promptN := 1 + len(r.Prompt) // with BOS
	if r.MaxTokens > c.MaxSeqLen || promptN > c.MaxSeqLen-r.MaxTokens {
		return nil, invalid("max_tokens", "prompt (%d tokens with BOS) + max_tokens (%d) = %d exceeds the bundle's max_seq_len %d",
			promptN, r.MaxTokens, uint64(promptN)+uint64(r.MaxTokens), c.MaxSeqLen)
	}
	if pages := (promptN + r.MaxTokens + c.KVBlockSize - 1) / c.KVBlockSize; pages > c.KVBlocks-e.padPages {
		return nil, invalid("max_tokens", "request needs %d KV pages, the bundle has %d", pages, c.KVBlocks-e.padPages)
	}
	if t := float64(r.Temperature); math.IsNaN(t) || math.IsInf(t, 0) || t < 0 {
		return nil, invalid("temperature", "temperature %g: want a finite number >= 0 (0: greedy)", r.Temperature)
	}
	if p := float64(r.TopP); math.IsNaN(p) || p < 0 || p > 1 {
		return nil, invalid("top_p", "top_p %g: want a number in [0, 1] (0 or 1: no nucleus cut)", r.TopP)
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
		if _, ok := e.appBits[name]; !ok {
			return nil, invalid("apps", "app %q is not deployed in this bundle (deployed: %s)", name, strings.Join(e.AppNames(), ", "))
		}
	}
	return e.resolveOverrides(r.Overrides)
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
		if err := o.app.checkValue(o.col, v); err != nil {
			return nil, invalid("set", "override %q: %v", name, err)
		}
		out = append(out, *o)
	}
	return out, nil
}

// checkValue refuses a value for column col of a's scalar table that is not finite, or whose
// product with the vector the scalar scales overflows f32.
func (a *appCtl) checkValue(col int, v float32) error {
	if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
		return fmt.Errorf("%v is not a finite number", v)
	}
	if l := a.limits[col]; l > 0 && math.Abs(float64(v)) > float64(l) {
		param := a.scales[col]
		for _, x := range a.vectors {
			if x.Buffer == param {
				param = x.Param
			}
		}
		return fmt.Errorf("%g times the app's param %s overflows float32 (at most %.4g in magnitude)", v, param, l)
	}
	return nil
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
	bt, ok := bufs["kv.block_table"]
	if !ok || bt.Kind != bundle.KindControl || bt.Dtype != "u32" || len(bt.Shape) != 2 || bt.Shape[0] != c.MaxSeqs+1 || bt.Shape[1] != blocks {
		return fmt.Errorf("model config: kv.block_table is not a u32 control buffer of [max_seqs+1, max_seq_len/kv_block_size] = [%d, %d]", c.MaxSeqs+1, blocks)
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
		if t.Tokens > rows("ctl.tokens") || t.Samples > rows("ctl.rng") {
			return fmt.Errorf("template %s: %d tokens and %d samples, the control buffers hold %d and %d",
				t.Name, t.Tokens, t.Samples, rows("ctl.tokens"), rows("ctl.rng"))
		}
	}
	return nil
}
