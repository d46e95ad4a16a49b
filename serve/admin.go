package serve

import (
	"crypto/subtle"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"slices"
	"sort"
	"strings"
	"sync"

	"xmix/bundle"
	"xmix/loader"
)

// controlState is the control plane's view of the apps: the scalar defaults, which vectors
// were replaced and which apps are on for every request. The loop writes it when it
// applies a change; handlers read it.
type controlState struct {
	mu   sync.RWMutex
	apps []*appState // manifest order
}

type appState struct {
	app         bundle.App
	defaults    map[string]float32 // by manifest scalar name ("op0.alpha")
	replaced    map[string]bool    // vector params replaced since the server started
	onByDefault bool
}

func newControlState(b *bundle.Bundle) *controlState {
	cs := &controlState{}
	for _, a := range b.Manifest.Apps {
		st := &appState{app: a, defaults: map[string]float32{}, replaced: map[string]bool{}}
		for _, s := range a.Scalars {
			st.defaults[s.Name] = s.Value
		}
		cs.apps = append(cs.apps, st)
	}
	return cs
}

func (cs *controlState) find(name string) *appState {
	for _, a := range cs.apps {
		if a.app.Name == name {
			return a
		}
	}
	return nil
}

// onByDefault lists the apps every request gets unless it opts out.
func (cs *controlState) onByDefault() []string {
	cs.mu.RLock()
	defer cs.mu.RUnlock()
	var out []string
	for _, a := range cs.apps {
		if a.onByDefault {
			out = append(out, a.app.Name)
		}
	}
	return out
}

// appInfo is one app of GET /v1/apps.
type appInfo struct {
	Name        string   `json:"name"`
	Bit         int      `json:"bit"`
	Source      string   `json:"source,omitempty"`
	OnByDefault bool     `json:"on_by_default"`
	Ops         []opInfo `json:"ops"`
	// Scalars by the name a request's "xmix.set" uses, with their current defaults.
	Scalars map[string]float32 `json:"scalars"`
	Vectors []vectorInfo       `json:"vectors"`
	Exports []exportInfo       `json:"exports"`
}

// opInfo is one op of an app: where it sits and what runs it.
type opInfo struct {
	Op     int    `json:"op"`
	Kernel string `json:"kernel"` // the op's kernel: steer_add, probe_linear, ...
	Hook   string `json:"hook"`
	Layers []int  `json:"layers,omitempty"` // absent for whole-model hooks
	Fused  bool   `json:"fused"`            // run inside the model kernel that makes the hooked value
	Host   string `json:"host"`             // the bundle kernel that runs it
	// PerRequestLayers: a request may run it at fewer of its layers (xmix.layers "app.opN").
	PerRequestLayers bool `json:"per_request_layers"`
}

type vectorInfo struct {
	Name     string `json:"name"` // app.param, as PATCH and xmix.vectors name it
	Width    int    `json:"width"`
	Unit     bool   `json:"unit"`        // a direction: normalised to unit length when replaced
	Replaced bool   `json:"replaced"`    // replaced since the server started
	PerReq   bool   `json:"per_request"` // a request may bring its own (xmix.vectors)
}

type exportInfo struct {
	Name    string `json:"name"` // the key under "xmix.exports"
	Width   int    `json:"width"`
	Samples bool   `json:"sampled_rows_only"`
}

func (sv *Server) appInfo(st *appState) appInfo {
	a := st.app
	ai := appInfo{Name: a.Name, Bit: a.Bit, Source: a.Source, OnByDefault: st.onByDefault, Ops: []opInfo{},
		Scalars: map[string]float32{}, Vectors: []vectorInfo{}, Exports: []exportInfo{}}
	for n, v := range st.defaults {
		ai.Scalars[a.Name+"."+n] = v
	}
	seen := map[string]bool{}
	for _, v := range a.Vectors {
		if !seen[v.Param] {
			seen[v.Param] = true
			ai.Vectors = append(ai.Vectors, vectorInfo{Name: a.Name + "." + v.Param, Width: v.Width, Unit: v.Unit,
				Replaced: st.replaced[v.Param], PerReq: v.Slots != ""})
		}
	}
	for _, x := range a.Exports {
		ai.Exports = append(ai.Exports, exportInfo{Name: a.Name + "." + x.Name, Width: x.Width, Samples: x.Samples})
	}
	for _, s := range sv.b.Manifest.Sites {
		if s.App != a.Name {
			continue
		}
		i := slices.IndexFunc(ai.Ops, func(o opInfo) bool { return o.Op == s.Op && o.Hook == s.Hook })
		if i < 0 {
			ai.Ops = append(ai.Ops, opInfo{Op: s.Op, Kernel: s.What, Hook: s.Hook, Fused: s.Fused, Host: s.Kernel})
			i = len(ai.Ops) - 1
		}
		if s.Layer >= 0 && !slices.Contains(ai.Ops[i].Layers, s.Layer) {
			ai.Ops[i].Layers = append(ai.Ops[i].Layers, s.Layer)
		}
	}
	sort.SliceStable(ai.Ops, func(i, j int) bool { return ai.Ops[i].Op < ai.Ops[j].Op })
	for i := range ai.Ops {
		ai.Ops[i].PerRequestLayers = slices.ContainsFunc(a.LayerMasks, func(m bundle.LayerMask) bool { return m.Op == ai.Ops[i].Op })
	}
	return ai
}

func (sv *Server) listApps(w http.ResponseWriter, r *http.Request) {
	sv.ctl.mu.RLock()
	out := []appInfo{}
	for _, st := range sv.ctl.apps {
		out = append(out, sv.appInfo(st))
	}
	sv.ctl.mu.RUnlock()
	writeJSON(w, http.StatusOK, map[string]any{"model": sv.model, "apps": out})
}

func (sv *Server) getApp(w http.ResponseWriter, r *http.Request) {
	st, err := sv.appNamed(r.PathValue("app"))
	if err != nil {
		writeError(w, err)
		return
	}
	sv.ctl.mu.RLock()
	ai := sv.appInfo(st)
	sv.ctl.mu.RUnlock()
	writeJSON(w, http.StatusOK, ai)
}

func (sv *Server) appNamed(name string) (*appState, error) {
	if st := sv.ctl.find(name); st != nil {
		return st, nil
	}
	var names []string
	for _, a := range sv.ctl.apps {
		names = append(names, a.app.Name)
	}
	return nil, &apiError{status: http.StatusNotFound, code: "app_not_found",
		message: fmt.Sprintf("app %q is not deployed in this bundle (deployed: %s)", name, orNone(names))}
}

// change is one PATCH /v1/apps/{app}, checked, for the loop to apply.
type change struct {
	st          *appState
	scalars     map[string]float32 // by manifest scalar name
	vectors     map[string][]float32
	onByDefault *bool
	done        chan error
}

// authorize checks the bearer token of a control-plane write.
func (sv *Server) authorize(r *http.Request) *apiError {
	if sv.cfg.AdminToken == "" {
		return &apiError{status: http.StatusForbidden, code: "control_plane_off",
			message: "the control plane is off: start xmix serve with --admin-token (or XMIX_ADMIN_TOKEN) to change apps live"}
	}
	got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || subtle.ConstantTimeCompare([]byte(got), []byte(sv.cfg.AdminToken)) != 1 {
		return &apiError{status: http.StatusUnauthorized, code: "invalid_admin_token",
			message: "PATCH /v1/apps needs \"Authorization: Bearer <admin token>\" with the server's --admin-token"}
	}
	return nil
}

// PATCH /v1/apps/{app}: {"set": {"op0.alpha": 20}, "vectors": {"param": [floats] or base64
// f32}, "on_by_default": true}. Everything is checked before anything changes; the loop
// applies it all between two steps, so a step sees the old state or the new one.
func (sv *Server) patchApp(w http.ResponseWriter, r *http.Request) {
	if err := sv.authorize(r); err != nil {
		w.Header().Set("WWW-Authenticate", `Bearer realm="xmix control plane"`)
		writeError(w, err)
		return
	}
	st, err := sv.appNamed(r.PathValue("app"))
	if err != nil {
		writeError(w, err)
		return
	}
	obj, err := readObject(http.MaxBytesReader(w, r.Body, maxBodyBytes))
	if err != nil {
		writeError(w, err)
		return
	}
	ch, err := sv.parseChange(st, obj)
	if err != nil {
		writeError(w, err)
		return
	}
	if !sv.send(r.Context(), message{control: ch}) {
		writeError(w, sv.stoppedErr())
		return
	}
	if err := sv.answer(ch.done); err != nil {
		// The engine's refusal of a value (a product that overflows, say) names the body's
		// own field, which a request's "xmix" object would prefix.
		var re *loader.RequestError
		if errors.As(err, &re) {
			err = badRequest(re.Field, "%s", re.Msg)
		}
		writeError(w, err)
		return
	}
	sv.ctl.mu.RLock()
	ai := sv.appInfo(st)
	sv.ctl.mu.RUnlock()
	writeJSON(w, http.StatusOK, ai)
}

func (sv *Server) parseChange(st *appState, obj map[string]json.RawMessage) (*change, error) {
	a := st.app
	ch := &change{st: st, scalars: map[string]float32{}, vectors: map[string][]float32{}, done: make(chan error, 1)}
	for _, k := range sortedKeys(obj) {
		v := obj[k]
		switch k {
		case "set":
			var set map[string]float32
			if err := decodeField(v, k, &set); err != nil {
				return nil, err
			}
			for name, val := range set {
				short := strings.TrimPrefix(name, a.Name+".")
				if !slices.ContainsFunc(a.Scalars, func(s bundle.Scalar) bool { return s.Name == short }) {
					var names []string
					for _, s := range a.Scalars {
						names = append(names, s.Name)
					}
					return nil, badRequest("set", "app %s has no scalar %q (scalars: %s)", a.Name, name, orNone(names))
				}
				ch.scalars[short] = val
			}
		case "vectors":
			var vecs map[string]json.RawMessage
			if err := decodeField(v, k, &vecs); err != nil {
				return nil, err
			}
			for _, name := range sortedKeys(vecs) {
				param := strings.TrimPrefix(name, a.Name+".")
				i := slices.IndexFunc(a.Vectors, func(x bundle.Vector) bool { return x.Param == param })
				if i < 0 {
					var names []string
					for _, x := range a.Vectors {
						if !slices.Contains(names, x.Param) {
							names = append(names, x.Param)
						}
					}
					return nil, badRequest("vectors", "app %s has no replaceable vector %q (vectors: %s)", a.Name, name, orNone(names))
				}
				vals, err := decodeVector(vecs[name], "vectors."+name, a.Vectors[i])
				if err != nil {
					return nil, err
				}
				ch.vectors[param] = vals
			}
		case "on_by_default":
			var on bool
			if err := decodeField(v, k, &on); err != nil {
				return nil, err
			}
			ch.onByDefault = &on
		default:
			return nil, badRequest(k, "unknown field %q (PATCH /v1/apps/{app} takes set, vectors, on_by_default)", k)
		}
	}
	if len(ch.scalars) == 0 && len(ch.vectors) == 0 && ch.onByDefault == nil {
		return nil, badRequest("", "nothing to change: give set, vectors or on_by_default")
	}
	return ch, nil
}

// decodeVector reads a vector given as a list of numbers or as base64 of little-endian f32
// and checks it for the param: its width, every value finite, and for a direction a
// non-zero norm.
func decodeVector(raw json.RawMessage, name string, v bundle.Vector) ([]float32, error) {
	var vals []float32
	var s string
	if json.Unmarshal(raw, &s) == nil {
		data, err := base64.StdEncoding.DecodeString(s)
		if err != nil {
			return nil, badRequest(name, "%s: not base64: %v", name, err)
		}
		if len(data) != 4*v.Width {
			return nil, badRequest(name, "%s: %d bytes of base64 f32; the param has %d values (%d bytes)", name, len(data), v.Width, 4*v.Width)
		}
		vals = make([]float32, v.Width)
		for i := range vals {
			vals[i] = math.Float32frombits(binary.LittleEndian.Uint32(data[4*i:]))
		}
	} else if err := json.Unmarshal(raw, &vals); err != nil {
		return nil, badRequest(name, "%s: want a list of %d numbers or base64 of %d little-endian f32", name, v.Width, v.Width)
	}
	if len(vals) != v.Width {
		return nil, badRequest(name, "%s: %d values; the param has %d", name, len(vals), v.Width)
	}
	var norm float64
	for i, f := range vals {
		if math.IsNaN(float64(f)) || math.IsInf(float64(f), 0) {
			return nil, badRequest(name, "%s[%d] is %g: every value must be finite", name, i, f)
		}
		norm += float64(f) * float64(f)
	}
	if v.Unit && (norm == 0 || math.IsInf(norm, 0)) {
		return nil, badRequest(name, "%s is a direction: it needs a finite, non-zero norm", name)
	}
	return vals, nil
}

// apply runs a checked change on the engine, from the loop, and logs it.
func (sv *Server) apply(ch *change) error {
	a := ch.st.app.Name
	if err := sv.eng.Change(a, ch.scalars, ch.vectors); err != nil {
		return err
	}
	var done []string
	for _, name := range sortedKeys(ch.scalars) {
		done = append(done, fmt.Sprintf("%s default %g -> %g", name, ch.st.defaults[name], ch.scalars[name]))
	}
	for _, param := range sortedKeys(ch.vectors) {
		var norm float64
		for _, f := range ch.vectors[param] {
			norm += float64(f) * float64(f)
		}
		done = append(done, fmt.Sprintf("vector %s replaced (%d values, norm %.4g)", param, len(ch.vectors[param]), math.Sqrt(norm)))
	}
	sv.ctl.mu.Lock()
	for name, v := range ch.scalars {
		ch.st.defaults[name] = v
	}
	for param := range ch.vectors {
		ch.st.replaced[param] = true
	}
	if ch.onByDefault != nil {
		done = append(done, fmt.Sprintf("on by default %v -> %v", ch.st.onByDefault, *ch.onByDefault))
		ch.st.onByDefault = *ch.onByDefault
	}
	sv.ctl.mu.Unlock()
	sv.cfg.Logf("control plane: app %s: %s", a, strings.Join(done, "; "))
	return nil
}
