package serve

import (
	"fmt"
	"slices"
	"strings"

	"xmix/chat"
	"xmix/loader"
)

// chatIDs is the prompt of a conversation; generate: it is to generate (a completion, not
// /tokenize), and is refused when too long for the context by its bytes alone.
func (sv *Server) chatIDs(msgs []chat.Message, addGenerationPrompt, generate bool) ([]int, error) {
	if sv.chatErr != nil {
		return nil, badRequest("messages", "%v", sv.chatErr)
	}
	prompt := sv.chat.Prompt
	if generate {
		prompt = sv.chat.GenerationPrompt
	}
	ids, err := prompt(msgs, addGenerationPrompt)
	if err != nil {
		return nil, badRequest("messages", "%v", err)
	}
	return ids, nil
}

// plan is a parsed request made ready for the engine: its engine request and what the
// response reports.
type plan struct {
	req     loader.Request
	apps    []string // enabled, in manifest order
	exports []exportRef
	// stopTokens end the text where one is generated (vLLM's stop_token_ids), besides EOS.
	stopTokens []int
}

// exportRef is one export the response reports.
type exportRef struct {
	name  string // app.buffer
	width int
}

// defaultCompletionTokens is OpenAI's default max_tokens for completions; chat completions
// default to the rest of the context.
const defaultCompletionTokens = 16

// plan turns a parsed request into an engine request: the prompt's ids, the apps (the
// request's and, unless it opts out, those the control plane turned on for every request),
// sampling, the exports to report.
func (sv *Server) plan(gr *genRequest) (*plan, error) {
	m := sv.b.Manifest.Model
	p := &plan{req: loader.Request{TopP: 1, Temperature: 1, Overrides: gr.ext.set}}
	switch {
	case gr.chat:
		// The rendered template is the model's whole input: it writes its own BOS.
		ids, err := sv.chatIDs(gr.messages, gr.addGenerationPrompt, true)
		if err != nil {
			return nil, err
		}
		p.req.Prompt, p.req.Verbatim = ids, true
	case gr.text != nil:
		if n := sv.tok.MinTokens(*gr.text); n >= m.MaxSeqLen {
			return nil, badRequest("prompt", "the prompt is at least %d tokens (%d bytes of text); the model's context is %d, which leaves no room to generate",
				n, len(*gr.text), m.MaxSeqLen)
		}
		p.req.Prompt, p.req.Verbatim = sv.tok.Encode(*gr.text), !gr.addSpecialTokens
	default:
		p.req.Prompt, p.req.Verbatim = gr.prompt, !gr.addSpecialTokens
	}
	fed := len(loader.InputIDs(m, p.req))
	room := m.MaxSeqLen - fed
	if room < 1 {
		return nil, badRequest("prompt", "the prompt is %d tokens (BOS included); the model's context is %d, which leaves no room to generate",
			fed, m.MaxSeqLen)
	}
	switch {
	case gr.maxTokens != nil:
		p.req.MaxTokens = *gr.maxTokens
	case gr.chat:
		p.req.MaxTokens = room
	default:
		p.req.MaxTokens = min(defaultCompletionTokens, room)
	}
	if gr.temperature != nil {
		p.req.Temperature = *gr.temperature
	}
	p.req.Logprobs, p.req.TopLogprobs = gr.logprobs, gr.topLogprobs
	p.req.MinTokens, p.req.IgnoreEOS = gr.minTokens, gr.ignoreEOS
	for _, id := range gr.stopTokens {
		switch {
		case id < 0 || id >= m.Vocab:
			return nil, badRequest("stop_token_ids", "stop_token_ids: %d is not a token id of this model (0 to %d)", id, m.Vocab-1)
		case gr.minTokens > 0 && !slices.Contains(m.EOS, id):
			// vLLM bans stop_token_ids before min_tokens; the sampler here bans EOS ids alone.
			return nil, badRequest("stop_token_ids", "stop_token_ids %d with min_tokens %d: not implemented (before min_tokens the sampler bans only the model's EOS ids %v); leave out min_tokens or that id",
				id, gr.minTokens, m.EOS)
		}
	}
	p.stopTokens = gr.stopTokens
	if gr.topP != nil {
		p.req.TopP = *gr.topP
	}
	if gr.seed != nil {
		p.req.Seed = uint64(*gr.seed)
	} else {
		p.req.Seed = randomSeed()
	}
	want := map[string]bool{}
	for _, a := range gr.ext.apps {
		want[a] = true
	}
	if gr.ext.defaultApps {
		for _, a := range sv.ctl.onByDefault() {
			want[a] = true
		}
	}
	var deployed []string
	for _, a := range sv.b.Manifest.Apps {
		deployed = append(deployed, a.Name)
		if want[a.Name] {
			p.apps = append(p.apps, a.Name)
		}
	}
	for _, a := range gr.ext.apps {
		if !slices.Contains(deployed, a) {
			list := strings.Join(deployed, ", ")
			if list == "" {
				list = "none"
			}
			return nil, badRequest("xmix.apps", "app %q is not deployed in this bundle (deployed: %s)", a, list)
		}
	}
	p.req.Apps = p.apps
	p.req.Layers = gr.ext.layers
	p.req.StopWhen = gr.ext.stopWhen
	// The response reports reads per generated token, and the prompt's only when asked.
	p.req.TokenExportsOnly = !gr.ext.promptExports
	if len(gr.ext.vectors) > 0 {
		p.req.Vectors = map[string][]float32{}
		for _, name := range sortedKeys(gr.ext.vectors) {
			v, ok := sv.perRequest[name]
			if !ok {
				return nil, badRequest("xmix.vectors", "xmix.vectors %q: not a per_request vector param of a deployed app (per_request params: %s)",
					name, orNone(sortedKeys(sv.perRequest)))
			}
			vals, err := decodeVector(gr.ext.vectors[name], "xmix.vectors."+name, v)
			if err != nil {
				return nil, err
			}
			p.req.Vectors[name] = vals
		}
	}
	var available []exportRef
	for _, a := range sv.b.Manifest.Apps {
		if slices.Contains(p.apps, a.Name) {
			for _, x := range a.Exports {
				available = append(available, exportRef{name: a.Name + "." + x.Name, width: x.Width})
			}
		}
	}
	if err := sv.checkExportValues(available, p.req.MaxTokens, fed, gr.ext.promptExports); err != nil {
		return nil, err
	}
	if gr.ext.exports == nil {
		p.exports = available
	} else {
		for _, name := range gr.ext.exports {
			i := slices.IndexFunc(available, func(x exportRef) bool { return x.name == name })
			if i < 0 {
				var names []string
				for _, x := range available {
					names = append(names, x.name)
				}
				return nil, badRequest("xmix.exports", "export %q is not an export of the enabled apps (%s)", name, orNone(names))
			}
			if !slices.ContainsFunc(p.exports, func(x exportRef) bool { return x.name == name }) {
				p.exports = append(p.exports, available[i])
			}
		}
	}
	return p, nil
}

// checkExportValues refuses a request whose reads would hold more values than the server's
// bound (Config.MaxExportValues): the engine keeps every export of the enabled apps (all of
// available, whichever the response names) at each row that samples a token, maxTokens rows,
// and with prompt exports at the prompt's other fed-1 rows too.
func (sv *Server) checkExportValues(available []exportRef, maxTokens, fed int, prompt bool) error {
	limit := sv.cfg.MaxExportValues
	perRow := 0
	for _, x := range available {
		perRow += x.width
	}
	if limit == 0 || perRow == 0 {
		return nil
	}
	rows := maxTokens
	if prompt {
		rows += fed - 1
	}
	values := int64(perRow) * int64(rows)
	if values <= int64(limit) {
		return nil
	}
	hint := fmt.Sprintf("ask for at most %d tokens, or for fewer apps", limit/perRow-(rows-maxTokens))
	switch {
	case perRow > limit:
		hint = "ask for fewer apps: one token's reads are more than that"
	case limit/perRow-(rows-maxTokens) < 1:
		hint = "ask without prompt_exports, or for fewer apps"
	}
	return badRequest("xmix.apps", "the enabled apps' reads would hold %d values (%d a row for %d rows); this server holds at most %d for a request (--max-export-values): %s",
		values, perRow, rows, limit, hint)
}

func orNone(xs []string) string {
	if len(xs) == 0 {
		return "none"
	}
	return strings.Join(xs, ", ")
}
