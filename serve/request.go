package serve

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"slices"
	"sort"
	"strings"

	"xmix/chat"
	"xmix/loader"
)

// genRequest is a parsed body of POST /v1/completions or /v1/chat/completions.
type genRequest struct {
	chat     bool
	model    string
	prompt   []int   // completions: token ids given as such
	text     *string // completions: prompt text
	messages []chat.Message
	// addGenerationPrompt: chat, end the prompt with the assistant's turn header.
	addGenerationPrompt bool
	// addSpecialTokens: completions, put the model's BOS before the prompt.
	addSpecialTokens bool
	// The sampler's: logprobs of each token and of the topLogprobs likeliest at its place
	// (completions' "logprobs": N sets both), EOS banned before minTokens, or never final.
	logprobs     bool
	topLogprobs  int
	minTokens    int
	ignoreEOS    bool
	maxTokens    *int
	temperature  *float32
	topP         *float32
	seed         *int64
	stop         []string
	stopTokens   []int // vLLM's stop_token_ids
	includeStop  bool
	skipSpecial  bool // vLLM's skip_special_tokens: special tokens have no text (default)
	n            int
	stream       bool
	includeUsage bool
	ext          extension
}

// extension is the request's "xmix" object: MI on an OpenAI request.
type extension struct {
	apps []string
	set  map[string]float32
	// vectors are per_request vector params' values, by "app.param", as given (a list of
	// numbers or base64 of f32): decoded against the param's width when the request is planned.
	vectors map[string]json.RawMessage
	// layers narrow the layers of ops marked at: {per_request: true}, by "app.opN".
	layers map[string][]int
	// stopWhen ends the request when a one-value export crosses a threshold.
	stopWhen      *loader.StopWhen
	exports       []string // nil: every export of the enabled apps
	promptExports bool
	// defaultApps false opts the request out of the apps the control plane turned on for
	// every request.
	defaultApps bool
}

// field says how a request body key is treated: read into the request, accepted because it
// does not change results, or, when it would and is not implemented, accepted only at a
// value that asks for what the server does anyway (defaults, besides null).
type field struct {
	set      func(r *genRequest, raw json.RawMessage) error
	ignored  bool
	defaults []string
}

// noEffect are fields of the OpenAI and vLLM request bodies that do not change what is
// generated: accounting, storage, scheduling and caching hints.
var noEffect = []string{"user", "metadata", "store", "service_tier", "prompt_cache_key",
	"safety_identifier", "request_id", "priority", "parallel_tool_calls"}

// unimplemented are fields that would change results, with the values at which they do
// not.
var unimplemented = map[string][]string{
	"frequency_penalty": {"0"}, "presence_penalty": {"0"}, "repetition_penalty": {"1"},
	"logit_bias": {"{}"}, "top_k": {"-1", "0"}, "min_p": {"0"},
	"bad_words": {"[]"}, "allowed_token_ids": {}, "truncate_prompt_tokens": {},
	"spaces_between_special_tokens": {"true"},
	"response_format":               {`{"type":"text"}`}, "guided_json": {}, "guided_regex": {},
	"guided_choice": {}, "guided_grammar": {}, "structured_outputs": {}, "prompt_logprobs": {},
	"best_of": {"1"}, "echo": {"false"}, "use_beam_search": {"false"}, "length_penalty": {"1"},
	"seed_per_choice": {}, "return_tokens_as_token_ids": {"false"}, "return_token_ids": {"false"},
}

// completionOnly and chatOnly are the fields of one endpoint alone.
var completionOnly = map[string]field{
	"prompt": {set: func(r *genRequest, raw json.RawMessage) error { return r.parsePrompt(raw) }},
	"suffix": {defaults: []string{`""`}},
	// logprobs N: each token's logprob and the N likeliest tokens at its place.
	"logprobs": {set: func(r *genRequest, raw json.RawMessage) error {
		var n int
		if err := decodeField(raw, "logprobs", &n); err != nil {
			return err
		}
		if n < 0 {
			return badRequest("logprobs", "logprobs %d: want 0 or more top tokens", n)
		}
		r.logprobs, r.topLogprobs = true, n
		return nil
	}},
	// add_special_tokens false: the prompt is the model's whole input, no BOS put before it.
	"add_special_tokens": {set: func(r *genRequest, raw json.RawMessage) error {
		return decodeField(raw, "add_special_tokens", &r.addSpecialTokens)
	}},
}

var chatOnly = map[string]field{
	"messages": {set: func(r *genRequest, raw json.RawMessage) error { return r.parseMessages(raw) }},
	"max_completion_tokens": {set: func(r *genRequest, raw json.RawMessage) error {
		return decodeField(raw, "max_completion_tokens", &r.maxTokens)
	}},
	"add_generation_prompt": {set: func(r *genRequest, raw json.RawMessage) error {
		return decodeField(raw, "add_generation_prompt", &r.addGenerationPrompt)
	}},
	"logprobs": {set: func(r *genRequest, raw json.RawMessage) error { return decodeField(raw, "logprobs", &r.logprobs) }},
	"top_logprobs": {set: func(r *genRequest, raw json.RawMessage) error {
		return decodeField(raw, "top_logprobs", &r.topLogprobs)
	}},
	"tools": {defaults: []string{"[]"}}, "tool_choice": {defaults: []string{`"none"`, `"auto"`}},
	"functions": {defaults: []string{"[]"}}, "function_call": {defaults: []string{`"none"`, `"auto"`}},
	"modalities": {defaults: []string{`["text"]`}}, "audio": {}, "prediction": {},
	"reasoning_effort": {}, "web_search_options": {}, "continue_final_message": {defaults: []string{"false"}},
	"chat_template": {}, "chat_template_kwargs": {defaults: []string{"{}"}}, "documents": {},
	"add_special_tokens": {defaults: []string{"false"}},
}

// shared are the fields both endpoints read.
var shared = map[string]field{
	"model": {set: func(r *genRequest, raw json.RawMessage) error { return decodeField(raw, "model", &r.model) }},
	"max_tokens": {set: func(r *genRequest, raw json.RawMessage) error {
		return decodeField(raw, "max_tokens", &r.maxTokens)
	}},
	"temperature": {set: func(r *genRequest, raw json.RawMessage) error {
		return decodeField(raw, "temperature", &r.temperature)
	}},
	"top_p":  {set: func(r *genRequest, raw json.RawMessage) error { return decodeField(raw, "top_p", &r.topP) }},
	"seed":   {set: func(r *genRequest, raw json.RawMessage) error { return decodeField(raw, "seed", &r.seed) }},
	"n":      {set: func(r *genRequest, raw json.RawMessage) error { return decodeField(raw, "n", &r.n) }},
	"stream": {set: func(r *genRequest, raw json.RawMessage) error { return decodeField(raw, "stream", &r.stream) }},
	"stop":   {set: func(r *genRequest, raw json.RawMessage) error { return r.parseStop(raw) }},
	"stop_token_ids": {set: func(r *genRequest, raw json.RawMessage) error {
		if err := decodeField(raw, "stop_token_ids", &r.stopTokens); err != nil {
			return err
		}
		if len(r.stopTokens) > maxStopTokens {
			return badRequest("stop_token_ids", "stop_token_ids: %d ids; at most %d", len(r.stopTokens), maxStopTokens)
		}
		return nil
	}},
	"skip_special_tokens": {set: func(r *genRequest, raw json.RawMessage) error {
		return decodeField(raw, "skip_special_tokens", &r.skipSpecial)
	}},
	"include_stop_str_in_output": {set: func(r *genRequest, raw json.RawMessage) error {
		return decodeField(raw, "include_stop_str_in_output", &r.includeStop)
	}},
	"min_tokens":     {set: func(r *genRequest, raw json.RawMessage) error { return decodeField(raw, "min_tokens", &r.minTokens) }},
	"ignore_eos":     {set: func(r *genRequest, raw json.RawMessage) error { return decodeField(raw, "ignore_eos", &r.ignoreEOS) }},
	"stream_options": {set: func(r *genRequest, raw json.RawMessage) error { return r.parseStreamOptions(raw) }},
	"xmix":           {set: func(r *genRequest, raw json.RawMessage) error { return r.ext.parse(raw) }},
}

// fieldsOf is the table of one endpoint.
func fieldsOf(isChat bool) map[string]field {
	out := map[string]field{}
	for _, k := range noEffect {
		out[k] = field{ignored: true}
	}
	for k, d := range unimplemented {
		out[k] = field{defaults: d}
	}
	own := completionOnly
	if isChat {
		own = chatOnly
	}
	for _, m := range []map[string]field{own, shared} {
		for k, f := range m {
			out[k] = f
		}
	}
	return out
}

var fieldTables = [2]map[string]field{fieldsOf(false), fieldsOf(true)}

// readObject reads a body that must be one JSON object, into its keys' raw values.
func readObject(body io.Reader) (map[string]json.RawMessage, error) {
	data, err := io.ReadAll(body)
	if err != nil {
		var mb *http.MaxBytesError
		if errors.As(err, &mb) {
			return nil, asAPIError(err)
		}
		return nil, badRequest("", "reading the request body: %v", err)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	var obj map[string]json.RawMessage
	if err := dec.Decode(&obj); err != nil {
		var ute *json.UnmarshalTypeError
		if errors.As(err, &ute) {
			return nil, badRequest("", "the request body is a JSON %s; it must be an object", ute.Value)
		}
		return nil, badRequest("", "the request body is not valid JSON: %v", err)
	}
	if obj == nil {
		return nil, badRequest("", "the request body is null; it must be a JSON object")
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, badRequest("", "the request body has data after its JSON object")
	}
	return obj, nil
}

// parseGenRequest reads a completions (isChat false) or chat completions body.
func parseGenRequest(body io.Reader, isChat bool) (*genRequest, error) {
	obj, err := readObject(body)
	if err != nil {
		return nil, err
	}
	r := &genRequest{chat: isChat, n: 1, addGenerationPrompt: true, addSpecialTokens: true, skipSpecial: true, ext: extension{defaultApps: true}}
	table := fieldTables[0]
	if isChat {
		table = fieldTables[1]
	}
	for _, k := range sortedKeys(obj) {
		raw := obj[k]
		f, ok := table[k]
		switch {
		case !ok:
			return nil, badRequest(k, "unknown field %q: this server does not implement it, and it may change results", k)
		case f.ignored || isNull(raw):
		case f.set != nil:
			if err := f.set(r, raw); err != nil {
				return nil, err
			}
		case !atDefault(raw, f.defaults):
			return nil, badRequest(k, "%s %s: not implemented by xmix (it would change results); leave it out", k, compact(raw))
		}
	}
	return r, r.check()
}

// sortedKeys are an object's keys in order, so that the first bad field a request is told
// about is the same every time.
func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func isNull(raw json.RawMessage) bool { return string(bytes.TrimSpace(raw)) == "null" }

// atDefault reports whether raw equals one of defaults as JSON values (0 == 0.0).
func atDefault(raw json.RawMessage, defaults []string) bool {
	var v any
	if json.Unmarshal(raw, &v) != nil {
		return false
	}
	for _, d := range defaults {
		var dv any
		json.Unmarshal([]byte(d), &dv)
		if reflect.DeepEqual(v, dv) {
			return true
		}
	}
	return false
}

func compact(raw json.RawMessage) string {
	var b bytes.Buffer
	if json.Compact(&b, raw) != nil {
		return string(raw)
	}
	s := b.String()
	if len(s) > 80 {
		s = s[:77] + "..."
	}
	return s
}

// decodeField decodes one field's value, naming the field and the wanted type on failure.
func decodeField(raw json.RawMessage, name string, dst any) error {
	if err := json.Unmarshal(raw, dst); err != nil {
		return badRequest(name, "%s %s: want %s", name, compact(raw), jsonKind(reflect.TypeOf(dst).Elem()))
	}
	return nil
}

// plural is a kind jsonKind names, many of it: "an integer" -> "integers", "a list of
// strings" -> "lists of strings", "true or false" -> "true or false values".
func plural(kind string) string {
	kind = strings.TrimPrefix(strings.TrimPrefix(kind, "an "), "a ")
	if kind == "true or false" {
		return kind + " values"
	}
	first, rest, _ := strings.Cut(kind, " ")
	if rest != "" {
		return first + "s " + rest
	}
	return first + "s"
}

// jsonKind names a Go type as JSON.
func jsonKind(t reflect.Type) string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.Bool:
		return "true or false"
	case reflect.Int, reflect.Int64, reflect.Int32, reflect.Uint64:
		return "an integer"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.String:
		return "a string"
	case reflect.Slice:
		return "a list of " + plural(jsonKind(t.Elem()))
	case reflect.Map:
		return "an object of " + plural(jsonKind(t.Elem()))
	}
	return t.String()
}

// maxPromptTokens bounds a prompt given as token ids before anything is allocated from it;
// the engine then checks it against the bundle's max_seq_len.
const maxPromptTokens = 1 << 20

func (r *genRequest) parsePrompt(raw json.RawMessage) error {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		r.text = &s
		return nil
	}
	var ids []int
	if json.Unmarshal(raw, &ids) == nil {
		if len(ids) == 0 {
			return badRequest("prompt", "prompt []: give the text, or at least one token id")
		}
		r.prompt = ids
		return nil
	}
	var ss []string
	if json.Unmarshal(raw, &ss) == nil {
		if len(ss) != 1 {
			return badRequest("prompt", "prompt: a list of %d prompts; this server takes one prompt per request", len(ss))
		}
		r.text = &ss[0]
		return nil
	}
	var idss [][]int
	if json.Unmarshal(raw, &idss) == nil {
		if len(idss) != 1 || len(idss[0]) == 0 {
			return badRequest("prompt", "prompt: a list of %d token-id prompts; this server takes one non-empty prompt per request", len(idss))
		}
		r.prompt = idss[0]
		return nil
	}
	return badRequest("prompt", "prompt %s: want a string or a list of token ids", compact(raw))
}

// maxStops bounds the stop strings of a request (OpenAI takes 4), maxStopBytes their
// length together (the matcher keeps 4 bytes of table a byte), maxStopTokens its
// stop_token_ids.
const (
	maxStops      = 16
	maxStopBytes  = 1 << 20
	maxStopTokens = 1024
)

func (r *genRequest) parseStop(raw json.RawMessage) error {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		r.stop = []string{s}
	} else if err := json.Unmarshal(raw, &r.stop); err != nil {
		return badRequest("stop", "stop %s: want a string or a list of strings", compact(raw))
	}
	if len(r.stop) > maxStops {
		return badRequest("stop", "stop: %d strings; at most %d", len(r.stop), maxStops)
	}
	n := 0
	for _, s := range r.stop {
		if s == "" {
			return badRequest("stop", "stop: an empty string would stop before the first token")
		}
		n += len(s)
	}
	if n > maxStopBytes {
		return badRequest("stop", "stop: %d bytes of stop strings; at most %d", n, maxStopBytes)
	}
	return nil
}

func (r *genRequest) parseStreamOptions(raw json.RawMessage) error {
	var o map[string]json.RawMessage
	if json.Unmarshal(raw, &o) != nil {
		return badRequest("stream_options", "stream_options %s: want an object", compact(raw))
	}
	for _, k := range sortedKeys(o) {
		v := o[k]
		switch k {
		case "include_usage":
			if !isNull(v) {
				if err := decodeField(v, "stream_options.include_usage", &r.includeUsage); err != nil {
					return err
				}
			}
		case "continuous_usage_stats", "include_obfuscation":
			// vLLM's per-chunk usage and OpenAI's padding: neither changes the text.
		default:
			return badRequest("stream_options."+k, "unknown field stream_options.%s", k)
		}
	}
	return nil
}

// contentPart is one element of a message's content list.
type contentPart struct {
	Type string  `json:"type"`
	Text *string `json:"text"`
}

func (r *genRequest) parseMessages(raw json.RawMessage) error {
	var msgs []map[string]json.RawMessage
	if json.Unmarshal(raw, &msgs) != nil {
		return badRequest("messages", "messages: want a list of {\"role\", \"content\"} objects")
	}
	if len(msgs) == 0 {
		return badRequest("messages", "messages: the list is empty")
	}
	for i, m := range msgs {
		at := fmt.Sprintf("messages[%d]", i)
		var msg chat.Message
		if err := decodeField(m["role"], at+".role", &msg.Role); err != nil || m["role"] == nil {
			return badRequest(at+".role", "%s: want a role: system, developer, user or assistant", at)
		}
		switch msg.Role {
		case "system", "user", "assistant":
		case "developer":
			msg.Role = "system" // OpenAI's newer name for the system turn
		default:
			return badRequest(at+".role", "%s.role %q: want system, developer, user or assistant (tool turns are not implemented)", at, msg.Role)
		}
		for k, v := range m {
			switch k {
			case "role":
			case "name":
				// A participant's name: chat templates of the shipped families do not render it.
			case "content":
				text, err := messageText(v, at)
				if err != nil {
					return err
				}
				msg.Content = text
			case "tool_calls", "function_call", "audio", "refusal":
				if !isNull(v) && !atDefault(v, []string{"[]"}) {
					return badRequest(at+"."+k, "%s.%s: not implemented by xmix", at, k)
				}
			default:
				return badRequest(at+"."+k, "unknown field %s.%s", at, k)
			}
		}
		if _, ok := m["content"]; !ok && msg.Role != "assistant" {
			return badRequest(at+".content", "%s: a %s message needs content", at, msg.Role)
		}
		r.messages = append(r.messages, msg)
	}
	return nil
}

// messageText is a message's content: a string, or a list of text parts joined.
func messageText(raw json.RawMessage, at string) (string, error) {
	if isNull(raw) {
		return "", nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, nil
	}
	var parts []contentPart
	if json.Unmarshal(raw, &parts) != nil {
		return "", badRequest(at+".content", "%s.content: want a string or a list of {\"type\": \"text\", \"text\"} parts", at)
	}
	var b strings.Builder
	for k, p := range parts {
		if p.Type != "text" || p.Text == nil {
			return "", badRequest(fmt.Sprintf("%s.content[%d]", at, k), "%s.content[%d]: type %q: only text parts are implemented", at, k, p.Type)
		}
		b.WriteString(*p.Text)
	}
	return b.String(), nil
}

// check verifies the fields against each other and their ranges.
func (r *genRequest) check() error {
	if r.chat && r.messages == nil {
		return badRequest("messages", "messages: required")
	}
	if !r.chat && r.text == nil && r.prompt == nil {
		return badRequest("prompt", "prompt: required")
	}
	if r.n != 1 {
		return badRequest("n", "n %d: only one choice per request is implemented", r.n)
	}
	// Sampling values and sizes are the engine's to check (loader.Engine.Check, which xmix run
	// shares); what is checked here is the API's own: its shapes and combinations.
	if r.chat && r.topLogprobs > 0 && !r.logprobs {
		return badRequest("top_logprobs", "top_logprobs %d needs \"logprobs\": true", r.topLogprobs)
	}
	if len(r.prompt) > maxPromptTokens {
		return badRequest("prompt", "prompt: %d token ids; at most %d", len(r.prompt), maxPromptTokens)
	}
	return nil
}

// extensionFields are the keys of the "xmix" object.
var extensionFields = []string{"apps", "set", "vectors", "layers", "exports", "prompt_exports", "default_apps", "stop_when"}

func (x *extension) parse(raw json.RawMessage) error {
	var o map[string]json.RawMessage
	if json.Unmarshal(raw, &o) != nil {
		return badRequest("xmix", "xmix %s: want an object {\"apps\", \"set\", \"exports\", ...}", compact(raw))
	}
	for _, k := range sortedKeys(o) {
		v := o[k]
		name := "xmix." + k
		if !slices.Contains(extensionFields, k) {
			return badRequest(name, "unknown field %s (the extension takes %s)", name, strings.Join(extensionFields, ", "))
		}
		if isNull(v) {
			continue
		}
		var err error
		switch k {
		case "apps":
			err = decodeField(v, name, &x.apps)
		case "set":
			err = decodeField(v, name, &x.set)
		case "vectors":
			err = decodeField(v, name, &x.vectors)
		case "layers":
			err = decodeField(v, name, &x.layers)
		case "exports":
			err = decodeField(v, name, &x.exports)
			if err == nil && x.exports == nil {
				x.exports = []string{}
			}
		case "prompt_exports":
			err = decodeField(v, name, &x.promptExports)
		case "default_apps":
			err = decodeField(v, name, &x.defaultApps)
		case "stop_when":
			err = x.parseStopWhen(v)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// parseStopWhen reads {"export": "app.buffer", "op": ">", "value": 0.9}; the engine checks
// the export and the op against the request's apps.
func (x *extension) parseStopWhen(raw json.RawMessage) error {
	var o map[string]json.RawMessage
	if json.Unmarshal(raw, &o) != nil {
		return badRequest("xmix.stop_when", "xmix.stop_when %s: want {\"export\": \"app.buffer\", \"op\": \">\", \"value\": 0.9}", compact(raw))
	}
	w := &loader.StopWhen{}
	for _, k := range sortedKeys(o) {
		name := "xmix.stop_when." + k
		var err error
		switch k {
		case "export":
			err = decodeField(o[k], name, &w.Export)
		case "op":
			err = decodeField(o[k], name, &w.Op)
		case "value":
			err = decodeField(o[k], name, &w.Value)
		default:
			err = badRequest(name, "unknown field %s (stop_when takes export, op, value)", name)
		}
		if err != nil {
			return err
		}
	}
	for _, k := range []string{"export", "op", "value"} {
		if _, ok := o[k]; !ok {
			return badRequest("xmix.stop_when."+k, "xmix.stop_when.%s: required", k)
		}
	}
	x.stopWhen = w
	return nil
}
