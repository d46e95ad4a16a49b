package serve

import (
	"math"
	"strings"
	"unicode/utf8"
)

// The sampler's logprobs in the two endpoints' shapes: the legacy completions' four lists,
// and chat's content entries with bytes.

type completionLogprobs struct {
	Tokens        []string             `json:"tokens"`
	TokenLogprobs []float32            `json:"token_logprobs"`
	TopLogprobs   []map[string]float32 `json:"top_logprobs"`
	TextOffset    []int                `json:"text_offset"`
}

type chatLogprobs struct {
	Content []chatLogprob `json:"content"`
}

type chatLogprob struct {
	Token       string           `json:"token"`
	Logprob     float32          `json:"logprob"`
	Bytes       []int            `json:"bytes"`
	TopLogprobs []chatTopLogprob `json:"top_logprobs"`
}

type chatTopLogprob struct {
	Token   string  `json:"token"`
	Logprob float32 `json:"logprob"`
	Bytes   []int   `json:"bytes"`
}

// finiteLogprob writes -inf (a token the sampler gave no probability) as vLLM does, -9999:
// JSON has no infinity.
func finiteLogprob(f float32) float32 {
	if math.IsInf(float64(f), -1) || math.IsNaN(float64(f)) {
		return -9999
	}
	return f
}

// tokenText is one token's text, and its bytes when that text is whole characters (a
// token holding part of a character has no text of its own: its bytes are null).
func (c *call) tokenText(id int) (string, []int) {
	s := c.sv.tok.Decode([]int{id})
	if !utf8.ValidString(s) || strings.ContainsRune(s, utf8.RuneError) {
		return s, nil
	}
	b := make([]int, len(s))
	for i := range len(s) {
		b[i] = int(s[i])
	}
	return s, b
}

// logprobs is a choice's logprobs for generated tokens [from, to), or nil when the request
// did not ask; c.lpOffset carries the completions' text_offset from one call to the next.
func (c *call) logprobs(v view, from, to int) any {
	if !c.p.req.Logprobs && c.p.req.TopLogprobs == 0 {
		return nil
	}
	to = min(to, len(v.logprobs))
	if c.gr.chat {
		out := chatLogprobs{Content: []chatLogprob{}}
		for _, lp := range v.logprobs[from:to] {
			tok, b := c.tokenText(lp.Token)
			e := chatLogprob{Token: tok, Logprob: finiteLogprob(lp.Logprob), Bytes: b, TopLogprobs: []chatTopLogprob{}}
			for _, t := range lp.Top {
				tt, tb := c.tokenText(t.Token)
				e.TopLogprobs = append(e.TopLogprobs, chatTopLogprob{Token: tt, Logprob: finiteLogprob(t.Logprob), Bytes: tb})
			}
			out.Content = append(out.Content, e)
		}
		return out
	}
	out := completionLogprobs{Tokens: []string{}, TokenLogprobs: []float32{}, TopLogprobs: []map[string]float32{}, TextOffset: []int{}}
	for _, lp := range v.logprobs[from:to] {
		tok, _ := c.tokenText(lp.Token)
		top := map[string]float32{}
		for _, t := range lp.Top {
			tt, _ := c.tokenText(t.Token)
			if _, dup := top[tt]; !dup { // two ids with one text: the likelier one
				top[tt] = finiteLogprob(t.Logprob)
			}
		}
		out.Tokens = append(out.Tokens, tok)
		out.TokenLogprobs = append(out.TokenLogprobs, finiteLogprob(lp.Logprob))
		out.TopLogprobs = append(out.TopLogprobs, top)
		out.TextOffset = append(out.TextOffset, c.lpOffset)
		c.lpOffset += utf8.RuneCountInString(tok)
	}
	return out
}
