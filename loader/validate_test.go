package loader_test

import (
	"errors"
	"math"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"

	"xmix/bundle"
	"xmix/loader"
	"xmix/ops"
	"xmix/testsuite"
)

const steerApp = `app: steer
params: {v: {values: [` + "%s" + `]}}
ops:
  - write: {at: {layers: [1], hook: resid_post}, kernel: steer_add, args: {vector: v, alpha: 2}}
`

// steerVector is app steer's vector: 127 values of 0.5, then 4.
var steerVector = append(slices.Repeat([]float32{0.5}, 127), 4)

// steerBundle is SmallModel with app steer: steer_add of steerVector at resid_post.
func steerBundle(t *testing.T) *bundle.Bundle {
	vals := strings.TrimSuffix(strings.Repeat("0.5, ", 127), ", ") + ", 4"
	return testsuite.Compile(t, testsuite.SmallModel, strings.Replace(steerApp, "%s", vals, 1))
}

// TestCheckRefusesEachField: every field a client controls is checked against the bundle's
// limits by Check (and so by Submit), with the field named, before anything is sized from
// it: a max_tokens of 2^63-1 or 1e10 is an error, not a makeslice panic or gigabytes.
func TestCheckRefusesEachField(t *testing.T) {
	b := steerBundle(t)
	be := testsuite.NewCPU(t, b)
	defer be.Close()
	eng, err := loader.NewEngine(b, be)
	if err != nil {
		t.Fatal(err)
	}
	nan, inf := float32(math.NaN()), float32(math.Inf(1))
	ok := loader.Request{Prompt: []int{1, 2}, MaxTokens: 4, TopP: 1}
	with := func(f func(r *loader.Request)) loader.Request { r := ok; f(&r); return r }
	for _, c := range []struct {
		req         loader.Request
		field, want string
	}{
		{with(func(r *loader.Request) { r.MaxTokens = math.MaxInt64 }), "max_tokens", "prompt (3 tokens, BOS included) + max_tokens (9223372036854775807) = 9223372036854775810 exceeds the bundle's max_seq_len 128"},
		{with(func(r *loader.Request) { r.MaxTokens = 1e10 }), "max_tokens", "max_tokens (10000000000)"},
		{with(func(r *loader.Request) { r.MaxTokens = 126 }), "max_tokens", "= 129 exceeds the bundle's max_seq_len 128"},
		{with(func(r *loader.Request) { r.MaxTokens = 0 }), "max_tokens", "max_tokens 0: must be at least 1"},
		{with(func(r *loader.Request) { r.MaxTokens = -1 }), "max_tokens", "max_tokens -1: must be at least 1"},
		{with(func(r *loader.Request) { r.Prompt = make([]int, 200) }), "max_tokens", "prompt (201 tokens, BOS included)"},
		{with(func(r *loader.Request) { r.Temperature = nan }), "temperature", "temperature NaN: want a finite number >= 0 (0: greedy)"},
		{with(func(r *loader.Request) { r.Temperature = -1 }), "temperature", "temperature -1"},
		{with(func(r *loader.Request) { r.Temperature = inf }), "temperature", "temperature +Inf"},
		{with(func(r *loader.Request) { r.TopP = 2 }), "top_p", "top_p 2: want a number in [0, 1]"},
		{with(func(r *loader.Request) { r.TopP = nan }), "top_p", "top_p NaN"},
		{with(func(r *loader.Request) { r.TopP = -0.5 }), "top_p", "top_p -0.5"},
		{with(func(r *loader.Request) { r.Prompt = []int{1, 300} }), "prompt", "prompt token 1: id 300 is outside the vocabulary (0-299)"},
		{with(func(r *loader.Request) { r.Prompt = []int{-1} }), "prompt", "prompt token 0: id -1"},
		{with(func(r *loader.Request) { r.Force = []int{5, 1 << 40} }), "force", "force token 1: id 1099511627776"},
		{with(func(r *loader.Request) { r.Apps = []string{"steer", "nope"} }), "apps", `app "nope" is not deployed in this bundle (deployed: steer)`},
		{with(func(r *loader.Request) { r.Overrides = map[string]float32{"steer.op0.beta": 1} }), "set", `override "steer.op0.beta" names no app scalar (valid: steer.op0.alpha)`},
		{with(func(r *loader.Request) { r.Overrides = map[string]float32{"steer.op0.alpha": nan} }), "set", `override "steer.op0.alpha": NaN is not a finite number`},
		{with(func(r *loader.Request) { r.Overrides = map[string]float32{"steer.op0.alpha": -inf} }), "set", `-Inf is not a finite number`},
		{with(func(r *loader.Request) { r.Overrides = map[string]float32{"steer.op0.alpha": 1e38} }), "set",
			`override "steer.op0.alpha": 1e+38 times the app's param v overflows float32 (at most 2.67e+18 in magnitude)`},
	} {
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		_, err := eng.Submit(c.req)
		runtime.ReadMemStats(&after)
		var re *loader.RequestError
		if !errors.As(err, &re) || re.Field != c.field || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v (field %v), want %s: %q", c.req, err, re, c.field, c.want)
		}
		if grew := after.TotalAlloc - before.TotalAlloc; grew > 64<<10 {
			t.Errorf("%+v: refusing it allocated %d bytes", c.req, grew)
		}
		if eng.Check(&c.req) == nil {
			t.Errorf("Check accepts what Submit refuses: %+v", c.req)
		}
	}
	if eng.Busy() {
		t.Fatal("a refused request was queued")
	}
	// The limit is the largest alpha whose product with the vector keeps the next norm finite.
	limit := bundle.ProductLimit(steerVector, true)
	edge := with(func(r *loader.Request) {
		r.Apps, r.Overrides = []string{"steer"}, map[string]float32{"steer.op0.alpha": limit}
	})
	if err := eng.Check(&edge); err != nil {
		t.Errorf("alpha at the limit: %v", err)
	}
	edge.Overrides["steer.op0.alpha"] = -math.Nextafter32(limit, math.MaxFloat32)
	if err := eng.Check(&edge); err == nil {
		t.Errorf("alpha just past the limit was taken")
	}
	res, err := eng.Generate([]loader.Request{ok})
	if err != nil || len(res[0].Tokens) != 4 {
		t.Fatalf("the engine after the refusals: %v %+v", err, res)
	}
}

// TestSetDefaultAndSetVectorStayFinite: run-time replacements of an app's scalars and
// vectors are held to what the compiler holds the spec's values to.
func TestSetDefaultAndSetVectorStayFinite(t *testing.T) {
	b := steerBundle(t)
	be := testsuite.NewCPU(t, b)
	defer be.Close()
	eng, err := loader.NewEngine(b, be)
	if err != nil {
		t.Fatal(err)
	}
	v := make([]float32, 128)
	for i := range v {
		v[i] = 1
	}
	for _, c := range []struct {
		err  error
		want string
	}{
		{eng.SetDefault("steer", "op0.alpha", float32(math.NaN())), "NaN is not a finite number"},
		{eng.SetDefault("steer", "op0.alpha", 1e38), "overflows float32"},
		{eng.SetVector("steer", "v", append(slices.Clone(v[:127]), float32(math.Inf(-1)))), "value 127 is -Inf; want finite numbers"},
		{eng.SetVector("steer", "v", append(slices.Clone(v[:127]), 3e38)), "the new vector times the default 2 of op0.alpha overflows float32"},
	} {
		if c.err == nil || !strings.Contains(c.err.Error(), c.want) {
			t.Errorf("%v, want %q", c.err, c.want)
		}
	}
	// A smaller vector raises the limit (ones: sqrt(MaxFloat32/128) = 1.6e18), a larger
	// one lowers it again.
	if err := eng.SetVector("steer", "v", v); err != nil {
		t.Fatal(err)
	}
	if err := eng.SetDefault("steer", "op0.alpha", 1.5e18); err != nil {
		t.Errorf("alpha 1.5e18 with a vector of ones: %v", err)
	}
	with8 := append(slices.Clone(v[:127]), 8)
	if err := eng.SetVector("steer", "v", with8); err == nil {
		t.Error("a vector whose product with the default 1.5e18 overflows was taken")
	}
	// Change is all or nothing: a refused vector takes the new default down with it (the
	// default stays 1.5e18, so with8 is still refused alone), and the refusal is the caller's
	// (a RequestError naming the field).
	err = eng.Change("steer", map[string]float32{"op0.alpha": 1}, map[string][]float32{"v": append(slices.Clone(v[:127]), float32(math.NaN()))})
	var re *loader.RequestError
	if !errors.As(err, &re) || re.Field != "vectors" || !strings.Contains(re.Msg, "app steer param v: value 127 is NaN") {
		t.Errorf("a change with a NaN vector: %v", err)
	}
	if err := eng.SetVector("steer", "v", with8); err == nil {
		t.Error("the default of a refused change was applied")
	}
	// Its values are held to the state it leaves: a default of 1 with with8 is within float32,
	// though with8 alone against the present default is not.
	if err := eng.Change("steer", map[string]float32{"op0.alpha": 1}, map[string][]float32{"v": with8}); err != nil {
		t.Errorf("alpha 1 with a vector holding an 8: %v", err)
	}
	err = eng.Change("steer", map[string]float32{"op0.alpha": 1e38}, nil)
	if !errors.As(err, &re) || re.Field != "set" || !strings.Contains(re.Msg, "app steer scalar op0.alpha: 1e+38 times the app's param v overflows float32") {
		t.Errorf("alpha 1e38: %v", err)
	}
}

// TestNewEngineRefusesADamagedConfig: the serving limits the engine sizes its own state from
// are checked against the bundle's buffers, so a manifest with absurd ones is an error.
func TestNewEngineRefusesADamagedConfig(t *testing.T) {
	b := testsuite.Compile(t, testsuite.SmallModel)
	be := testsuite.NewCPU(t, b)
	defer be.Close()
	for _, c := range []struct {
		tamper func(b *bundle.Bundle)
		want   string
	}{
		{func(b *bundle.Bundle) { b.Manifest.Model.MaxSeqLen = 1 << 50 }, "kv.block_table is not a u32 control buffer of [max_seqs+1, max_seq_len/kv_block_size] = [5, 70368744177664]"},
		{func(b *bundle.Bundle) { b.Manifest.Model.KVBlockSize = 0 }, "kv_block_size 0"},
		{func(b *bundle.Bundle) { b.Manifest.Model.MaxSeqs = -1 }, "max_seqs -1"},
		{func(b *bundle.Bundle) { b.Manifest.Model.KVBlocks = 3 }, "3 KV pages leave fewer than the 8 one sequence needs"},
		{func(b *bundle.Bundle) { b.Templates[0].Tokens = 1 << 40 }, "tokens and 1 samples, the control buffers hold 16 and 4"},
	} {
		data, err := bundle.Marshal(b)
		if err != nil {
			t.Fatal(err)
		}
		bad, err := bundle.Unmarshal(data)
		if err != nil {
			t.Fatal(err)
		}
		c.tamper(bad)
		if _, err := loader.NewEngine(bad, be); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v, want %q", err, c.want)
		}
	}
}

// faulty is a backend that fails on cue: a panic when a scalar table row holding the value
// panicAt is written (one request's admission), an error from the next Step, or a panic in
// the next Step on a worker goroutine of ops.ParallelFor, as the CPU backend's ops run.
type faulty struct {
	loader.Backend
	panicAt     float32
	failStep    bool
	workerPanic bool
}

func (f *faulty) Write(buf string, off int64, data []byte) error {
	if strings.HasSuffix(buf, ".scalars") {
		for i := 0; i+4 <= len(data); i += 4 {
			if math.Float32frombits(uint32(data[i])|uint32(data[i+1])<<8|uint32(data[i+2])<<16|uint32(data[i+3])<<24) == f.panicAt {
				panic("write of the poisoned scalar")
			}
		}
	}
	return f.Backend.Write(buf, off, data)
}

func (f *faulty) Step(t int) error {
	if f.failStep {
		f.failStep = false
		return errors.New("the device fell over")
	}
	if f.workerPanic {
		f.workerPanic = false
		ops.ParallelFor(2, func(lo, hi int) {
			if hi == 2 { // the last chunk: on a worker goroutine wherever ops.Workers > 1
				panic("a worker fell over")
			}
		})
	}
	return f.Backend.Step(t)
}

// TestOneRequestFailsAlone: a request whose own work fails (here a panic while its scalars
// are written) ends alone with ReasonError and an error naming the panic, while the requests
// beside it finish as if it had not been there; a step that fails ends the requests running
// in it, and the engine serves the next ones.
func TestOneRequestFailsAlone(t *testing.T) {
	b := steerBundle(t)
	f := &faulty{Backend: testsuite.NewCPU(t, b), panicAt: 1234}
	defer f.Close()
	eng, err := loader.NewEngine(b, f)
	if err != nil {
		t.Fatal(err)
	}
	good := []loader.Request{
		{Prompt: []int{1, 2, 3}, MaxTokens: 5},
		{Prompt: []int{4, 5}, Apps: []string{"steer"}, MaxTokens: 5},
	}
	want, err := eng.Generate(good)
	if err != nil {
		t.Fatal(err)
	}
	poisoned := loader.Request{Prompt: []int{6}, Apps: []string{"steer"}, MaxTokens: 5, Overrides: map[string]float32{"steer.op0.alpha": 1234}}
	res, err := eng.Generate([]loader.Request{good[0], poisoned, good[1]})
	if err == nil || !strings.Contains(err.Error(), "request 1: internal error in request: write of the poisoned scalar (at validate_test.go:") {
		t.Fatalf("Generate: %v, want request 1's panic named", err)
	}
	if r := res[1]; r.Reason != loader.ReasonError || len(r.Tokens) != 0 {
		t.Errorf("the poisoned request: %+v", r)
	}
	for _, i := range []int{0, 2} {
		if w := want[i/2]; res[i].Reason != w.Reason || !slices.Equal(res[i].Tokens, w.Tokens) {
			t.Errorf("request %d beside it: %s %v, alone %s %v", i, res[i].Reason, res[i].Tokens, w.Reason, w.Tokens)
		}
	}

	// A failed step ends what runs in it and says so; the engine goes on.
	h, err := eng.Submit(good[0])
	if err != nil {
		t.Fatal(err)
	}
	f.failStep = true
	if _, err := eng.Step(); err == nil || !strings.Contains(err.Error(), "the device fell over") {
		t.Fatalf("Step: %v", err)
	}
	if !h.Done || h.Result.Reason != loader.ReasonError || !regexp.MustCompile(`^step \d+: template prefill_t16: the device fell over$`).MatchString(h.Result.Error) {
		t.Fatalf("the request in the failed step: done %v, %+v", h.Done, h.Result)
	}
	res, err = eng.Generate(good)
	if err != nil || !slices.Equal(res[0].Tokens, want[0].Tokens) || !slices.Equal(res[1].Tokens, want[1].Tokens) {
		t.Fatalf("after the failed step: %v %+v", err, res)
	}

	// So does a panic on a worker goroutine, which would otherwise end the process: the
	// step's error names it and where it happened.
	if h, err = eng.Submit(good[0]); err != nil {
		t.Fatal(err)
	}
	f.workerPanic = true
	panicked := regexp.MustCompile(`^step \d+: internal error in step: a worker fell over \(at validate_test\.go:\d+\); please report it$`)
	if _, err := eng.Step(); err == nil || !panicked.MatchString(err.Error()) {
		t.Fatalf("Step: %v", err)
	}
	if !h.Done || h.Result.Reason != loader.ReasonError || !panicked.MatchString(h.Result.Error) {
		t.Fatalf("the request in the step that panicked: done %v, %+v", h.Done, h.Result)
	}
	res, err = eng.Generate(good)
	if err != nil || !slices.Equal(res[0].Tokens, want[0].Tokens) || !slices.Equal(res[1].Tokens, want[1].Tokens) {
		t.Fatalf("after the step that panicked: %v %+v", err, res)
	}
}
