package serve

import (
	"fmt"
	"net/http"
)

// modelCard is one entry of GET /v1/models, with vLLM's max_model_len.
type modelCard struct {
	ID          string `json:"id"`
	Object      string `json:"object"`
	Created     int64  `json:"created"`
	OwnedBy     string `json:"owned_by"`
	Root        string `json:"root"`
	MaxModelLen int    `json:"max_model_len"`
}

func (sv *Server) card() modelCard {
	return modelCard{ID: sv.model, Object: "model", Created: sv.created, OwnedBy: "xmix",
		Root: sv.b.Manifest.Model.Name, MaxModelLen: sv.b.Manifest.Model.MaxSeqLen}
}

func (sv *Server) models(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, map[string]any{"object": "list", "data": []modelCard{sv.card()}})
}

func (sv *Server) modelByID(w http.ResponseWriter, r *http.Request) {
	if err := sv.checkModel(r.PathValue("model")); err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, sv.card())
}

// checkModel accepts the served model's name (and an absent one).
func (sv *Server) checkModel(name string) *apiError {
	if name == "" || name == sv.model {
		return nil
	}
	return &apiError{status: http.StatusNotFound, param: "model", code: "model_not_found",
		message: fmt.Sprintf("the model %q does not exist: this server serves %q", name, sv.model)}
}
