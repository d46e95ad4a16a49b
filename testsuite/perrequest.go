package testsuite

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"

	"xmix/bundle"
	"xmix/loader"
)

// perRequestApp is app "pr": steer_add of v at resid_post of layers 1 and 2 and project_out
// along d at layer 2, both params declared per_request (their values are the defaults).
func perRequestApp(v, d []float32, perRequest string) string {
	return fmt.Sprintf(`app: pr
params: {v: {values: %s%s}, d: {values: %s%s}}
ops:
  - write: {at: {layers: [1, 2], hook: resid_post}, kernel: steer_add, args: {vector: v, alpha: 1.5}}
  - write: {at: {layers: [2], hook: resid_post}, kernel: project_out, args: {direction: d}}
`, yamlList(v), perRequest, yamlList(d), perRequest)
}

// sameResults fails unless got and want have the same tokens and bit-identical exports.
func sameResults(t *testing.T, what string, got, want loader.Result) {
	t.Helper()
	if !slices.Equal(got.Tokens, want.Tokens) {
		t.Fatalf("%s: tokens %v, want %v", what, got.Tokens, want.Tokens)
	}
	if len(got.Rows) != len(want.Rows) {
		t.Fatalf("%s: %d rows, want %d", what, len(got.Rows), len(want.Rows))
	}
	for i := range want.Rows {
		for _, x := range want.Rows[i].Exports {
			g := got.Rows[i].Exports.Get(x.Name)
			if len(g) != len(x.Values) {
				t.Fatalf("%s: row %d export %s has %d values, want %d", what, i, x.Name, len(g), len(x.Values))
			}
			for j := range g {
				if math.Float32bits(g[j]) != math.Float32bits(x.Values[j]) {
					t.Fatalf("%s: row %d export %s[%d] = %v, want %v", what, i, x.Name, j, g[j], x.Values[j])
				}
			}
		}
	}
}

// CheckPerRequestVectors: a request that brings its own values of per_request params gets
// exactly what a bundle compiled with those values gives (the direction normalised, a param
// it does not bring at its default), in a batch with other requests' values and with rows
// without any, which are bit-identical to a bundle without per_request params; with the
// pool full a request waits in the queue and nothing is corrupted; a replaced default
// reaches running requests that did not bring that param; bad vectors are refused by name.
func CheckPerRequestVectors(t *testing.T, nb NewBackend) {
	v0, d0 := randVec(61, 128), randVec(62, 128)
	v1, v2, d2 := randVec(63, 128), randVec(64, 128), randVec(65, 128)
	for i := range d2 {
		d2[i] *= 3 // normalised by the engine, as the compiler normalises d
	}
	spec := strings.Replace(SmallModel, "max_seqs: 4,", "max_seqs: 4, vector_slots: 2,", 1)
	b := Compile(t, spec, perRequestApp(v0, d0, ", per_request: true"), captureApp(2, 128))
	if b.Manifest.Model.VectorSlots != 2 || b.Manifest.Apps[0].Vectors[0].Slots == "" {
		t.Fatalf("vector slots %d, vectors %+v", b.Manifest.Model.VectorSlots, b.Manifest.Apps[0].Vectors)
	}
	compiled := func(v, d []float32) *bundle.Bundle {
		return Compile(t, spec, perRequestApp(v, d, ""), captureApp(2, 128))
	}
	req := func(prompt []int, vecs map[string][]float32) loader.Request {
		return loader.Request{Prompt: prompt, Apps: []string{"pr", "cap"}, MaxTokens: 4, Vectors: vecs}
	}
	p1, p2, p3, p4 := []int{10, 20, 30}, []int{7, 8}, []int{40, 41, 42, 43}, []int{99}
	reqs := []loader.Request{
		req(p1, map[string][]float32{"pr.v": v1}),             // own v, default d
		req(p2, map[string][]float32{"pr.v": v2, "pr.d": d2}), // both its own
		req(p3, nil), // the defaults, no slot
		req(p4, map[string][]float32{"pr.v": v2}),         // waits: two slots
		{Prompt: p1, Apps: []string{"cap"}, MaxTokens: 4}, // no app
	}
	alone := func(b *bundle.Bundle, r loader.Request) loader.Result {
		r.Vectors = nil
		return Generate(t, nb, b, []loader.Request{r})[0]
	}
	want := []loader.Result{alone(compiled(v1, d0), reqs[0]), alone(compiled(v2, d2), reqs[1]),
		alone(compiled(v0, d0), reqs[2]), alone(compiled(v2, d0), reqs[3]), alone(compiled(v0, d0), reqs[4])}

	be := nb(t, b)
	defer be.Close()
	eng, err := loader.NewEngine(b, be)
	if err != nil {
		t.Fatal(err)
	}
	if got := eng.PerRequestVectors(); got["pr.v"] != 128 || got["pr.d"] != 128 || len(got) != 2 {
		t.Fatalf("per-request vectors %v", got)
	}
	hs := make([]*loader.Handle, len(reqs))
	for i, r := range reqs {
		if hs[i], err = eng.Submit(r); err != nil {
			t.Fatal(err)
		}
	}
	if free, total := eng.VectorSlots(); free != 0 || total != 2 {
		t.Fatalf("after submitting three requests with vectors: %d of %d slots available, want 0 of 2", free, total)
	}
	sawWait := false
	for eng.Busy() {
		if _, err := eng.Step(); err != nil {
			t.Fatal(err)
		}
		if !hs[0].Done && !hs[1].Done && len(hs[3].Result.Rows) > 0 {
			t.Fatal("the third request with vectors ran while both slots were held")
		}
		sawWait = sawWait || (!hs[0].Done && len(hs[3].Result.Rows) == 0 && len(hs[2].Result.Rows) > 0)
	}
	if !sawWait {
		t.Fatal("no step saw the request behind the full pool waiting")
	}
	for i := range reqs {
		sameResults(t, fmt.Sprintf("request %d", i), hs[i].Result, want[i])
	}
	if free, _ := eng.VectorSlots(); free != 2 {
		t.Fatalf("%d slots free after every request ended, want 2", free)
	}

	// A replaced default of d reaches a running request that brought only v.
	d3 := randVec(66, 128)
	replaced := func(eng *loader.Engine, r loader.Request) loader.Result {
		h, err := eng.Submit(r)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := eng.Step(); err != nil {
			t.Fatal(err)
		}
		if err := eng.SetVector("pr", "d", d3); err != nil {
			t.Fatal(err)
		}
		for eng.Busy() {
			if _, err := eng.Step(); err != nil {
				t.Fatal(err)
			}
		}
		return h.Result
	}
	got := replaced(eng, reqs[0])
	cb := compiled(v1, d0)
	cbe := nb(t, cb)
	defer cbe.Close()
	ceng, err := loader.NewEngine(cb, cbe)
	if err != nil {
		t.Fatal(err)
	}
	plain := reqs[0]
	plain.Vectors = nil
	sameResults(t, "default replaced while running", got, replaced(ceng, plain))

	for _, c := range []struct {
		vecs map[string][]float32
		apps []string
		want string
	}{
		{map[string][]float32{"pr.v": v1[:7]}, nil, "vector pr.v: 7 values, the app's kernels need 128"},
		{map[string][]float32{"pr.v": append(append([]float32(nil), v1[:127]...), float32(math.NaN()))}, nil, "vector pr.v: value 127 is NaN"},
		{map[string][]float32{"pr.d": make([]float32, 128)}, nil, "vector pr.d: it is a direction: it needs a finite, non-zero norm"},
		{map[string][]float32{"pr.w": v1}, nil, "vector pr.w is not a per_request param of a deployed app (per-request vectors: pr.v, pr.d)"},
		{map[string][]float32{"pr.v": v1}, []string{"cap"}, "vector pr.v: the request does not enable app pr (add it to apps)"},
	} {
		r := req(p1, c.vecs)
		if c.apps != nil {
			r.Apps = c.apps
		}
		if _, err := eng.Submit(r); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want %q", c.vecs, err, c.want)
		}
	}
	if free, _ := eng.VectorSlots(); free != 2 {
		t.Fatalf("refused requests hold %d slots", 2-free)
	}
}

// CheckPerRequestLayers: an op marked at: {per_request: true} runs, for a request that
// names layers, at exactly those of its compiled layers (as a bundle compiled at them gives),
// at all of them by default, and a request naming a layer it was not compiled at is refused.
func CheckPerRequestLayers(t *testing.T, nb NewBackend) {
	v := randVec(67, 128)
	app := func(layers, perRequest string) string {
		return fmt.Sprintf(`app: lay
params: {v: {values: %s}}
ops:
  - write: {at: {layers: %s, hook: resid_post%s}, kernel: steer_add, args: {vector: v, alpha: 2}}
`, yamlList(v), layers, perRequest)
	}
	b := Compile(t, SmallModel, app("[0, 1, 2]", ", per_request: true"), captureApp(2, 128))
	if m := b.Manifest.Apps[0].LayerMasks; len(m) != 1 || !slices.Equal(m[0].Layers, []int{0, 1, 2}) {
		t.Fatalf("layer masks %+v", m)
	}
	r := loader.Request{Prompt: []int{5, 6, 7}, Apps: []string{"lay", "cap"}, MaxTokens: 4}
	only := r
	only.Layers = map[string][]int{"lay.op0": {1}}
	none := r
	none.Layers = map[string][]int{"lay.op0": {}}
	got := Generate(t, nb, b, []loader.Request{r, only, none})
	sameResults(t, "default layers", got[0], Generate(t, nb, Compile(t, SmallModel, app("[0, 1, 2]", ""), captureApp(2, 128)), []loader.Request{r})[0])
	sameResults(t, "layer 1 only", got[1], Generate(t, nb, Compile(t, SmallModel, app("[1]", ""), captureApp(2, 128)), []loader.Request{r})[0])
	bare := r
	bare.Apps = []string{"cap"}
	sameResults(t, "no layers", got[2], Generate(t, nb, Compile(t, SmallModel, captureApp(2, 128)), []loader.Request{bare})[0])

	be := nb(t, b)
	defer be.Close()
	eng, err := loader.NewEngine(b, be)
	if err != nil {
		t.Fatal(err)
	}
	for layers, want := range map[string]map[string][]int{
		"layers lay.op0: layer 5 is not one the op was compiled at ([0 1 2])":  {"lay.op0": {5}},
		"layers lay.op1: not an op with per-request layers (ops: lay.op0)":     {"lay.op1": {1}},
		"layers lay.op0: the request does not enable app lay (add it to apps)": nil,
	} {
		q := r
		q.Layers = want
		if want == nil {
			q.Apps, q.Layers = []string{"cap"}, map[string][]int{"lay.op0": {1}}
		}
		if _, err := eng.Submit(q); err == nil || !strings.Contains(err.Error(), layers) {
			t.Errorf("%v: %v, want %q", q.Layers, err, layers)
		}
	}
}
