package serve

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"time"

	"xmix/loader"
)

// maxBodyBytes bounds a request body (413 past it): a prompt of max_seq_len ids or a few
// per-request vectors fit many times over.
const maxBodyBytes = 8 << 20

// Finish reasons beyond OpenAI's "stop" and "length".
const (
	finishTimeout  = "timeout"             // --request-timeout ended it; the text is what it generated
	finishStopWhen = loader.ReasonStopWhen // xmix.stop_when: an export crossed its threshold
)

func randomSeed() uint64 { return rand.Uint64() }

// finishReason maps the engine's reason to the API's.
func finishReason(engine string) string {
	switch engine {
	case loader.ReasonStop, loader.ReasonLength, loader.ReasonStopWhen, loader.ReasonNonFinite:
		return engine
	case loader.ReasonCancelled:
		return finishTimeout // the only cancellation a client sees: the client itself left otherwise
	}
	return engine
}

type usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
}

func newUsage(prompt, completion int) *usage {
	return &usage{PromptTokens: prompt, CompletionTokens: completion, TotalTokens: prompt + completion}
}

// xmixResult is the response's "xmix" object.
type xmixResult struct {
	Apps          []string `json:"apps,omitempty"`
	Exports       *Exports `json:"exports,omitempty"`
	PromptExports *Exports `json:"prompt_exports,omitempty"`
	// Fired counts, per op of each enabled app ("app.opN"), the (token, layer) sites where
	// it changed or read the request's rows: {} without apps.
	Fired *loader.Fired `json:"fired,omitempty"`
	// Error says why a request ended early with finish_reason "nonfinite" (its logits held a
	// NaN or an infinity, so no token could be sampled).
	Error string `json:"error,omitempty"`
}

// firedOf is a view's counts, {} rather than null when the request enables no app.
func firedOf(v view) *loader.Fired {
	f := v.fired
	if f == nil {
		f = loader.Fired{}
	}
	return &f
}

type completionChoice struct {
	Index        int     `json:"index"`
	Text         string  `json:"text"`
	Logprobs     any     `json:"logprobs"`
	FinishReason *string `json:"finish_reason"`
	StopReason   any     `json:"stop_reason,omitempty"` // vLLM's: the stop string or token id that ended it
}

type chatMessage struct {
	Role    string  `json:"role,omitempty"`
	Content *string `json:"content,omitempty"`
}

type chatChoice struct {
	Index        int          `json:"index"`
	Message      *chatMessage `json:"message,omitempty"`
	Delta        *chatMessage `json:"delta,omitempty"`
	Logprobs     any          `json:"logprobs"`
	FinishReason *string      `json:"finish_reason"`
	StopReason   any          `json:"stop_reason,omitempty"`
}

// response is a whole response or one SSE chunk of either endpoint.
type response struct {
	ID      string      `json:"id"`
	Object  string      `json:"object"`
	Created int64       `json:"created"`
	Model   string      `json:"model"`
	Choices []any       `json:"choices"`
	Usage   *usage      `json:"usage,omitempty"`
	Xmix    *xmixResult `json:"xmix,omitempty"`
}

// call is one request to a generation endpoint on its way through the handler.
type call struct {
	sv    *Server
	gr    *genRequest
	p     *plan
	j     *job
	id    string
	start time.Time
	// The text side: ids to text, stop strings.
	dec  streamDecoder
	stop stopMatcher
	// stopToken is the stop_token_ids token that ended the text.
	stopToken *int
	n         int // generated tokens consumed
	finish    string
	// lpOffset is the text offset (in characters) of the next token's logprobs entry.
	lpOffset int
	outcome  string // for metrics and the log: the finish reason, or why it failed
}

// add consumes the next generated token and returns the text it releases.
func (c *call) add(tok int) string {
	c.n++
	// An EOS ends the request by itself unless ignore_eos (its stop_reason stays null); one of
	// stop_token_ids ends it past min_tokens.
	eos := slices.Contains(c.sv.b.Manifest.Model.EOS, tok) && !c.p.req.IgnoreEOS
	stopID := !eos && c.n >= c.p.req.MinTokens && slices.Contains(c.p.stopTokens, tok)
	ends := eos || stopID
	piece := ""
	if c.hasText(tok, ends) {
		piece = c.dec.Add(tok)
	}
	if stopID {
		// vLLM's stop_token_ids: the token ends the text; what was held for the stop strings
		// is released.
		c.finish, c.stopToken = "stop", &tok
		return c.stop.flush() + piece + c.dec.Flush()
	}
	c.stop.unarmed = c.n < c.p.req.MinTokens
	out := c.stop.feed(piece)
	if c.stop.matched != "" {
		c.finish = "stop"
	}
	return out
}

// hasText says whether tok's text goes into the response, as vLLM's: a special token (BOS,
// EOS, the tokenizer's special added tokens) has none unless the request keeps them
// (skip_special_tokens false), and the token that ends the request (an EOS, a stop id) none
// unless include_stop_str_in_output.
func (c *call) hasText(tok int, ends bool) bool {
	return (!c.sv.silent[tok] || !c.gr.skipSpecial) && (!ends || c.gr.includeStop)
}

// end releases the rest of the text once generation has ended.
func (c *call) end(reason string) string {
	out := c.stop.feed(c.dec.Flush())
	if c.stop.matched == "" {
		out += c.stop.flush()
		c.finish = reason
	} else {
		c.finish = "stop"
	}
	return out
}

func (sv *Server) generate(w http.ResponseWriter, r *http.Request, isChat bool) {
	c := &call{sv: sv, start: time.Now()}
	status := http.StatusOK
	defer func() { sv.record(r, c, status) }()
	fail := func(err error) {
		ae := asAPIError(err)
		status = ae.status
		writeError(w, ae)
	}
	gr, err := parseGenRequest(http.MaxBytesReader(w, r.Body, maxBodyBytes), isChat)
	if err != nil {
		fail(err)
		return
	}
	c.gr = gr
	if ae := sv.checkModel(gr.model); ae != nil {
		fail(ae)
		return
	}
	if c.p, err = sv.plan(gr); err != nil {
		fail(err)
		return
	}
	j := newJob(c.p.req, len(c.p.exports) > 0)
	if err := sv.submit(r.Context(), j); err != nil {
		if errors.Is(err, errClientGone) {
			c.outcome = "cancelled"
			return
		}
		fail(err)
		return
	}
	c.j = j // from here on the request runs: it is counted and, if left, cancelled
	sv.metrics.enabled(c.p.apps)
	c.dec = newStreamDecoder(sv.tok)
	c.stop = newStopMatcher(gr.stop, gr.includeStop)
	prefix := "cmpl-"
	if isChat {
		prefix = "chatcmpl-"
	}
	c.id = newID(prefix)
	ctx := r.Context()
	if t := sv.cfg.RequestTimeout; t > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, t)
		defer cancel()
	}
	// Whatever ends the handler (a stop string, a client gone, a timeout, a panic), the
	// engine stops generating for it at the next step boundary.
	defer func() {
		if !c.j.view().finished {
			sv.cancel(c.j)
		}
	}()
	if gr.stream {
		sv.stream(ctx, w, r, c)
		return
	}
	if err := sv.whole(ctx, w, r, c); err != nil {
		fail(err)
	}
}

// errClientGone: the client closed the connection before the request was taken.
var errClientGone = errors.New("the client left")

// submit hands j to the engine, within the queue bound.
func (sv *Server) submit(ctx context.Context, j *job) error {
	n := sv.pending.Add(1)
	if max := sv.cfg.MaxQueue; max > 0 && n+sv.queued.Load() > int64(max) {
		sv.pending.Add(-1)
		return &apiError{status: http.StatusTooManyRequests, code: "queue_full", retryAfter: 1,
			message: fmt.Sprintf("%d requests are waiting for a slot (--max-queue %d); retry later", n-1+sv.queued.Load(), max)}
	}
	if !sv.send(ctx, message{submit: j}) {
		sv.pending.Add(-1)
		if ctx.Err() != nil {
			return errClientGone
		}
		return sv.stoppedErr()
	}
	return sv.answer(j.accepted)
}

// answer waits for the loop's reply to a message it was sent; a loop that stopped before it
// took the message from the inbox answers that it stopped.
func (sv *Server) answer(reply chan error) error {
	select {
	case err := <-reply:
		return err
	case <-sv.stopped:
		select {
		case err := <-reply:
			return err
		default:
			return sv.stoppedErr()
		}
	}
}

// cancel asks the loop to drop j at the next step boundary.
func (sv *Server) cancel(j *job) {
	sv.send(context.Background(), message{cancel: j})
}

// outcomeOf says why a wait ended early: the client left, the request timed out, or the
// engine stopped (an error to answer).
func (sv *Server) waitFailed(ctx context.Context, r *http.Request) (outcome string, err error) {
	switch {
	case r.Context().Err() != nil:
		return "cancelled", nil
	case ctx.Err() != nil:
		return finishTimeout, nil
	}
	return "error", sv.stoppedErr()
}

// whole answers a request that did not ask to stream, once it has finished.
func (sv *Server) whole(ctx context.Context, w http.ResponseWriter, r *http.Request, c *call) error {
	var text strings.Builder
	for c.finish == "" {
		v := c.j.view()
		for c.n < len(v.tokens) && c.finish == "" {
			text.WriteString(c.add(v.tokens[c.n]))
		}
		if c.finish != "" {
			break
		}
		if v.finished {
			if v.reason == loader.ReasonError {
				return c.failed(v)
			}
			text.WriteString(c.end(finishReason(v.reason)))
			break
		}
		if !sv.wait(ctx, c.j) {
			outcome, err := sv.waitFailed(ctx, r)
			if err != nil {
				return err
			}
			if outcome == "cancelled" {
				c.outcome = outcome
				return nil
			}
			text.WriteString(c.end(outcome))
		}
	}
	c.outcome = c.finish
	v := c.j.view()
	resp := c.header(false)
	resp.Usage = newUsage(v.promptLen, c.n)
	resp.Xmix = c.xmixResult(v, 0, c.n, true)
	fr := c.finish
	stopReason := c.stopReason()
	s := text.String()
	lp := c.logprobs(v, 0, c.n)
	if c.gr.chat {
		resp.Choices = []any{chatChoice{Message: &chatMessage{Role: "assistant", Content: &s}, Logprobs: lp, FinishReason: &fr, StopReason: stopReason}}
	} else {
		resp.Choices = []any{completionChoice{Text: s, Logprobs: lp, FinishReason: &fr, StopReason: stopReason}}
	}
	http.NewResponseController(w).SetWriteDeadline(time.Now().Add(timeouts.Write))
	writeJSON(w, http.StatusOK, resp)
	return nil
}

// stopReason is vLLM's stop_reason: the stop string that ended the text, the id of the
// stop_token_ids token that did, or, after a stop_when, the test that fired
// ("tiny-probe.happy > 0.9"); nil otherwise.
func (c *call) stopReason() any {
	switch {
	case c.stop.matched != "":
		return c.stop.matched
	case c.stopToken != nil:
		return *c.stopToken
	case c.finish == finishStopWhen:
		w := c.p.req.StopWhen
		return fmt.Sprintf("%s %s %g", w.Export, w.Op, w.Value)
	}
	return nil
}

// failed is the answer to a request the engine failed (loader.ReasonError): a 500 naming it.
func (c *call) failed(v view) *apiError {
	return &apiError{status: http.StatusInternalServerError, code: "engine_error", message: fmt.Sprintf("request %s: %s", c.id, v.err)}
}

// earlyEnd is why a finished request ended without a normal finish ("" when it did not).
func (c *call) earlyEnd(v view) string {
	if v.finished && v.reason == loader.ReasonNonFinite && c.finish == loader.ReasonNonFinite {
		return v.err
	}
	return ""
}

// header is a response (or, chunk, an SSE chunk) without choices.
func (c *call) header(chunk bool) response {
	obj := "text_completion"
	if c.gr.chat {
		obj = "chat.completion"
		if chunk {
			obj = "chat.completion.chunk"
		}
	}
	return response{ID: c.id, Object: obj, Created: c.start.Unix(), Model: c.sv.model}
}

// xmixResult reports the apps and the exports of generated tokens [from, to); whole: the
// whole response (prompt exports when asked for).
func (c *call) xmixResult(v view, from, to int, whole bool) *xmixResult {
	x := &xmixResult{Apps: c.p.apps}
	if len(c.p.exports) > 0 || whole {
		e := tokenExports(c.p.exports, v.rows, v.promptLen, from, to)
		x.Exports = &e
	}
	if whole && c.gr.ext.promptExports {
		e := promptExports(c.p.exports, v.rows, v.promptLen)
		x.PromptExports = &e
	}
	if whole {
		x.Fired = firedOf(v)
		x.Error = c.earlyEnd(v)
	}
	return x
}
