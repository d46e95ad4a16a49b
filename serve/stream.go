package serve

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"time"

	"xmix/loader"
)

// sse writes server-sent events: "data: {json}\n\n" per chunk, "data: [DONE]" at the end.
// Each write has timeouts.Write to complete: a client that stops reading is cut off there.
type sse struct {
	w   http.ResponseWriter
	rc  *http.ResponseController
	buf []byte
	err error // the first write error: the client left
}

func (s *sse) event(v any) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		b.Reset()
		enc.Encode((&apiError{status: http.StatusInternalServerError, message: err.Error()}).body())
	}
	s.buf = append(append(append(s.buf, "data: "...), bytes.TrimSuffix(b.Bytes(), []byte("\n"))...), "\n\n"...)
}

// flush sends the buffered events; false once the client is gone.
func (s *sse) flush() bool {
	if s.err == nil && len(s.buf) > 0 {
		s.rc.SetWriteDeadline(time.Now().Add(timeouts.Write))
		_, s.err = s.w.Write(s.buf)
		s.buf = s.buf[:0]
		if s.err == nil {
			s.err = s.rc.Flush()
		}
	}
	return s.err == nil
}

// stream answers with SSE: one chunk per generated token as the engine produces it (its
// text, held back while it could be the start of a stop string, and its exports), the
// finish reason on the last, then the usage when stream_options.include_usage asked for it.
func (sv *Server) stream(ctx context.Context, w http.ResponseWriter, r *http.Request, c *call) {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	out := &sse{w: w, rc: http.NewResponseController(w)}
	out.rc.SetWriteDeadline(time.Now().Add(timeouts.Write))
	w.WriteHeader(http.StatusOK)
	if c.gr.chat {
		empty := ""
		out.event(c.chunk("", false, &chatMessage{Role: "assistant", Content: &empty}, nil, view{}, -1))
	}
	for c.finish == "" {
		v := c.j.view()
		if v.finished && v.reason == loader.ReasonError {
			out.event(c.failed(v).body())
			c.outcome = "error"
			break
		}
		for c.n < len(v.tokens) && c.finish == "" {
			k := c.n
			text := c.add(v.tokens[k])
			if c.finish == "" && k == len(v.tokens)-1 && v.finished {
				text += c.end(finishReason(v.reason))
			}
			out.event(c.textChunk(text, v, k))
		}
		if c.finish == "" && v.finished { // it ended without a new token
			out.event(c.textChunk(c.end(finishReason(v.reason)), v, -1))
		}
		if !out.flush() {
			c.outcome = "cancelled"
			return
		}
		if c.finish != "" {
			break
		}
		if !sv.wait(ctx, c.j) {
			outcome, err := sv.waitFailed(ctx, r)
			if outcome == "cancelled" {
				c.outcome = outcome
				return
			}
			if err != nil {
				out.event(asAPIError(err).body())
				c.finish, c.outcome = "", "error"
				break
			}
			out.event(c.textChunk(c.end(outcome), c.j.view(), -1))
		}
	}
	if c.outcome != "error" {
		c.outcome = c.finish
	}
	if c.gr.includeUsage && c.outcome != "error" {
		resp := c.header(true)
		resp.Choices = []any{}
		resp.Usage = newUsage(c.j.view().promptLen, c.n)
		out.event(resp)
	}
	out.buf = append(out.buf, "data: [DONE]\n\n"...)
	if !out.flush() {
		c.outcome = "cancelled"
	}
}

// textChunk is the chunk of generated token k (-1: none, the end of the stream), with the
// finish reason once the call has one.
func (c *call) textChunk(text string, v view, k int) any {
	var fin *string
	if c.finish != "" {
		f := c.finish
		fin = &f
	}
	if c.gr.chat {
		return c.chunk("", false, &chatMessage{Content: &text}, fin, v, k)
	}
	return c.chunk(text, true, nil, fin, v, k)
}

// chunk builds one SSE chunk; completion: a completions chunk with text, else a chat chunk
// with delta. Its xmix object carries the exports of token k.
func (c *call) chunk(text string, completion bool, delta *chatMessage, fin *string, v view, k int) response {
	resp := c.header(true)
	var stopReason any
	if fin != nil {
		stopReason = c.stopReason()
	}
	var lp any
	if k >= 0 {
		lp = c.logprobs(v, k, k+1)
	}
	if completion {
		resp.Choices = []any{completionChoice{Text: text, Logprobs: lp, FinishReason: fin, StopReason: stopReason}}
	} else {
		resp.Choices = []any{chatChoice{Delta: delta, Logprobs: lp, FinishReason: fin, StopReason: stopReason}}
	}
	if k >= 0 && len(c.p.exports) > 0 {
		e := tokenExports(c.p.exports, v.rows, v.promptLen, k, k+1)
		resp.Xmix = &xmixResult{Exports: &e}
	}
	if fin != nil { // the last chunk: the request's fired counts, its prompt's reads when asked, and why it ended early
		if resp.Xmix == nil {
			resp.Xmix = &xmixResult{}
		}
		resp.Xmix.Fired = firedOf(v)
		if c.gr.ext.promptExports {
			e := promptExports(c.p.exports, v.rows, v.promptLen)
			resp.Xmix.PromptExports = &e
		}
		resp.Xmix.Error = c.earlyEnd(v)
	}
	if c.gr.includeUsage {
		resp.Usage = nil // the usage comes in a chunk of its own
	}
	return resp
}
