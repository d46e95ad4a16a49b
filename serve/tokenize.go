package serve

import (
	"net/http"

	"xmix/loader"
)

// POST /tokenize: vLLM's shape. {"prompt": text, "add_special_tokens": true} or
// {"messages": [...], "add_generation_prompt": true} -> {"count", "max_model_len",
// "tokens"}: the ids the engine runs for a completion with that prompt (the model's BOS
// included; add_special_tokens false leaves it out) or for a chat completion with those
// messages.
func (sv *Server) tokenize(w http.ResponseWriter, r *http.Request) {
	obj, err := readObject(http.MaxBytesReader(w, r.Body, maxBodyBytes))
	if err != nil {
		writeError(w, err)
		return
	}
	var model, prompt *string
	special, addGen := true, true
	var gr genRequest
	for _, k := range sortedKeys(obj) {
		v := obj[k]
		if isNull(v) {
			continue
		}
		switch k {
		case "model":
			err = decodeField(v, k, &model)
		case "prompt":
			err = decodeField(v, k, &prompt)
		case "add_special_tokens":
			err = decodeField(v, k, &special)
		case "messages":
			err = gr.parseMessages(v)
		case "add_generation_prompt":
			err = decodeField(v, k, &addGen)
		case "return_token_strs":
			var b bool
			err = decodeField(v, k, &b)
			if err == nil && b {
				err = badRequest(k, "return_token_strs: not implemented")
			}
		default:
			err = badRequest(k, "unknown field %q (tokenize takes model, prompt or messages, add_special_tokens, add_generation_prompt)", k)
		}
		if err != nil {
			writeError(w, err)
			return
		}
	}
	if model != nil {
		if err := sv.checkModel(*model); err != nil {
			writeError(w, err)
			return
		}
	}
	var ids []int
	switch {
	case prompt != nil && gr.messages != nil:
		err = badRequest("messages", "give prompt or messages, not both")
	case prompt != nil:
		ids = sv.tok.Encode(*prompt)
		if special {
			ids = loader.InputIDs(sv.b.Manifest.Model, loader.Request{Prompt: ids})
		}
	case gr.messages != nil:
		// The rendered template is the whole input, its BOS its own.
		ids, err = sv.chatIDs(gr.messages, addGen, false)
	default:
		err = badRequest("prompt", "prompt or messages: required")
	}
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, tokenizeResponse{Count: len(ids), MaxModelLen: sv.b.Manifest.Model.MaxSeqLen, Tokens: ids})
}

type tokenizeResponse struct {
	Count       int   `json:"count"`
	MaxModelLen int   `json:"max_model_len"`
	Tokens      []int `json:"tokens"`
	TokenStrs   any   `json:"token_strs"`
}

// POST /detokenize: {"tokens": [ids]} -> {"prompt": text}.
func (sv *Server) detokenize(w http.ResponseWriter, r *http.Request) {
	obj, err := readObject(http.MaxBytesReader(w, r.Body, maxBodyBytes))
	if err != nil {
		writeError(w, err)
		return
	}
	var ids []int
	for _, k := range sortedKeys(obj) {
		v := obj[k]
		switch k {
		case "model":
			var m string
			if err = decodeField(v, k, &m); err == nil {
				if ae := sv.checkModel(m); ae != nil {
					err = ae
				}
			}
		case "tokens":
			err = decodeField(v, k, &ids)
		default:
			err = badRequest(k, "unknown field %q (detokenize takes model, tokens)", k)
		}
		if err != nil {
			writeError(w, err)
			return
		}
	}
	if ids == nil {
		writeError(w, badRequest("tokens", "tokens: required"))
		return
	}
	vocab := sv.b.Manifest.Model.Vocab
	for i, id := range ids {
		if id < 0 || id >= vocab {
			writeError(w, badRequest("tokens", "tokens[%d] = %d is outside the vocabulary (0-%d)", i, id, vocab-1))
			return
		}
	}
	writeJSON(w, http.StatusOK, map[string]string{"prompt": sv.tok.Decode(ids)})
}
