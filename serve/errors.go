package serve

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"

	"xmix/loader"
)

// apiError is an error answered as OpenAI's error object: {"error": {"message", "type",
// "param", "code"}} with an HTTP status.
type apiError struct {
	status  int
	message string
	param   string // the request field at fault, or ""
	code    string // a machine-readable code, or ""
	// retryAfter, when > 0, is sent as the Retry-After header (seconds).
	retryAfter int
}

func (e *apiError) Error() string { return e.message }

// badRequest is a 400 naming the field at fault.
func badRequest(param, format string, a ...any) *apiError {
	return &apiError{status: http.StatusBadRequest, message: fmt.Sprintf(format, a...), param: param}
}

// errorType is the OpenAI error type of each status the server answers.
var errorType = map[int]string{
	http.StatusBadRequest:            "invalid_request_error",
	http.StatusUnauthorized:          "authentication_error",
	http.StatusForbidden:             "permission_error",
	http.StatusNotFound:              "not_found_error",
	http.StatusMethodNotAllowed:      "invalid_request_error",
	http.StatusRequestEntityTooLarge: "invalid_request_error",
	http.StatusTooManyRequests:       "rate_limit_error",
	http.StatusInternalServerError:   "server_error",
	http.StatusServiceUnavailable:    "server_error",
}

type errorObject struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    *string `json:"code"`
}

type errorBody struct {
	Error errorObject `json:"error"`
}

// asAPIError turns any error into an apiError: the engine's refusals of a request
// (loader.RequestError: an unknown app, a prompt too long) are a 400 naming the field,
// anything else a failure of the server's, a 500.
func asAPIError(err error) *apiError {
	var ae *apiError
	if errors.As(err, &ae) {
		return ae
	}
	var re *loader.RequestError
	if errors.As(err, &re) {
		return &apiError{status: http.StatusBadRequest, message: re.Msg, param: requestParam[re.Field]}
	}
	var mb *http.MaxBytesError
	if errors.As(err, &mb) {
		return &apiError{status: http.StatusRequestEntityTooLarge, code: "request_too_large",
			message: fmt.Sprintf("the request body is larger than %d bytes", mb.Limit)}
	}
	return &apiError{status: http.StatusInternalServerError, message: err.Error()}
}

// requestParam is the API's name of each engine request field (loader.RequestError.Field):
// the MI ones sit in the xmix object.
var requestParam = map[string]string{"max_tokens": "max_tokens", "temperature": "temperature", "top_p": "top_p",
	"logprobs": "logprobs", "top_logprobs": "top_logprobs", "min_tokens": "min_tokens", "prompt": "prompt",
	"apps": "xmix.apps", "set": "xmix.set", "vectors": "xmix.vectors", "layers": "xmix.layers", "stop_when": "xmix.stop_when"}

func (e *apiError) body() errorBody {
	o := errorObject{Message: e.message, Type: errorType[e.status]}
	if o.Type == "" {
		o.Type = "server_error"
	}
	if e.param != "" {
		o.Param = &e.param
	}
	if e.code != "" {
		o.Code = &e.code
	}
	return errorBody{Error: o}
}

func writeError(w http.ResponseWriter, err error) {
	ae := asAPIError(err)
	if ae.retryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(ae.retryAfter))
	}
	writeJSON(w, ae.status, ae.body())
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false) // "<" in a completion or an error stays "<"
	enc.Encode(v)
}
