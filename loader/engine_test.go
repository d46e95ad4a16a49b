package loader_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"xmix/bundle"
	"xmix/loader"
	"xmix/testsuite"
)

// TestNewEngineChecksRunTimeControl: the engine refuses a manifest whose scalar table,
// vectors or latches do not match the buffers that should hold them.
func TestNewEngineChecksRunTimeControl(t *testing.T) {
	const app = `app: seal
params: {v: {values: [` + "%s" + `]}}
ops:
  - write: {at: {layers: [1], hook: resid_post}, kernel: steer_add, args: {vector: v, alpha: 2}, when: {after_token: [65]}}
`
	vals := strings.TrimSuffix(strings.Repeat("0.5, ", 128), ", ")
	b := testsuite.Compile(t, testsuite.SmallModel, strings.Replace(app, "%s", vals, 1))
	be := testsuite.NewCPU(t, b)
	defer be.Close()
	if _, err := loader.NewEngine(b, be); err != nil {
		t.Fatal(err)
	}
	a := b.Manifest.Apps[0]
	if a.ScalarTable == "" || len(a.Vectors) != 1 || len(a.Latches) != 1 || a.Latches[0].Tokens[0] != 65 {
		t.Fatalf("manifest app %+v", a)
	}
	for _, c := range []struct {
		what   string
		tamper func(m *bundle.Manifest)
		want   string
	}{
		{"table", func(m *bundle.Manifest) { m.Apps[0].ScalarTable = bundle.CtlMask }, "not a control buffer of [5, 1] f32"},
		{"scalar index", func(m *bundle.Manifest) { m.Apps[0].Scalars[0].Index = 1 }, "index 1 in a table of 1"},
		{"vector width", func(m *bundle.Manifest) { m.Apps[0].Vectors[0].Width = 64 }, "not a param buffer of [64] f32"},
		{"latch bit", func(m *bundle.Manifest) { m.Apps[0].Latches[0].Bit = 32 }, "latch bit 32"},
		{"fired buffer", func(m *bundle.Manifest) { m.Apps[0].FiredBuffer = bundle.CtlMask }, `fired buffer "ctl.mask" is not an output buffer of [16, 1] u32`},
		{"fired column", func(m *bundle.Manifest) { m.Apps[0].FiredBuffer = "" }, "fired site of op 0 at column 0 without a fired buffer"},
		{"latch buffer", func(m *bundle.Manifest) {
			for i := range m.Buffers {
				if m.Buffers[i].Name == bundle.CtlLatch {
					m.Buffers[i].Name = "ctl.other"
				}
			}
		}, "no u32 control buffer ctl.latch"},
	} {
		data, err := bundle.Marshal(b)
		if err != nil {
			t.Fatal(err)
		}
		bad, err := bundle.Unmarshal(data) // a deep copy to tamper with
		if err != nil {
			t.Fatal(err)
		}
		c.tamper(&bad.Manifest)
		if _, err := loader.NewEngine(bad, be); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", c.what, err, c.want)
		}
	}
}

// Exports marshal as one JSON object in manifest order and read back the same; anything but
// an object of name to numbers is refused with the name.
func TestExportsJSON(t *testing.T) {
	x := loader.Exports{{Name: "probe.score", Values: []float32{0.25}}, {Name: "cap.x", Values: []float32{1, -2}}}
	raw, err := json.Marshal(struct{ E loader.Exports }{x})
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"E":{"probe.score":[0.25],"cap.x":[1,-2]}}`; string(raw) != want {
		t.Fatalf("marshal: %s, want %s", raw, want)
	}
	var back struct{ E loader.Exports }
	if err := json.Unmarshal(raw, &back); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(back.E) != fmt.Sprint(x) || back.E.Get("cap.x")[1] != -2 || back.E.Get("nope") != nil {
		t.Fatalf("round trip: %v", back.E)
	}
	var none struct{ E loader.Exports }
	if err := json.Unmarshal([]byte(`{"E":null}`), &none); err != nil || none.E != nil {
		t.Fatalf("null: %v %v", none.E, err)
	}
	for _, bad := range []string{`{"E":[1]}`, `{"E":{"a":"x"}}`} {
		if err := json.Unmarshal([]byte(bad), &none); err == nil {
			t.Fatalf("%s: no error", bad)
		}
	}
}

// Fired counts marshal as one object of op name to count, in order, and read back.
func TestFiredJSON(t *testing.T) {
	f := loader.Fired{{Name: "steer.op0", Sites: 12}, {Name: "probe.op0", Sites: 0}}
	raw, err := json.Marshal(struct{ F loader.Fired }{f})
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"F":{"steer.op0":12,"probe.op0":0}}`; string(raw) != want {
		t.Fatalf("marshal: %s, want %s", raw, want)
	}
	var back struct{ F loader.Fired }
	if err := json.Unmarshal(raw, &back); err != nil || fmt.Sprint(back.F) != fmt.Sprint(f) {
		t.Fatalf("round trip: %v %v", back.F, err)
	}
	if err := json.Unmarshal([]byte(`{"F":[1]}`), &back); err == nil {
		t.Fatal("a list read as fired counts")
	}
}

// TestAfterStepSeesEveryStep: AfterStep is called once per step with the template that ran,
// prefill and decode, and its error fails the step with the template named.
func TestAfterStepSeesEveryStep(t *testing.T) {
	b := testsuite.Compile(t, testsuite.SmallModel)
	be := testsuite.NewCPU(t, b)
	defer be.Close()
	eng, err := loader.NewEngine(b, be)
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[bundle.TemplateKind]int{}
	eng.AfterStep = func(ti int) error {
		kinds[b.Templates[ti].Kind]++
		return nil
	}
	if _, err := eng.Generate([]loader.Request{{Prompt: []int{3, 1, 4, 1, 5, 9, 2, 6}, MaxTokens: 4}}); err != nil {
		t.Fatal(err)
	}
	if kinds[bundle.Prefill] != eng.Stats.PrefillSteps || kinds[bundle.Decode] != eng.Stats.DecodeSteps || kinds[bundle.Prefill] == 0 || kinds[bundle.Decode] == 0 {
		t.Fatalf("AfterStep saw %v, the engine ran %d prefill and %d decode steps", kinds, eng.Stats.PrefillSteps, eng.Stats.DecodeSteps)
	}
	eng.AfterStep = func(int) error { return fmt.Errorf("profiler gone") }
	_, err = eng.Generate([]loader.Request{{Prompt: []int{3, 1, 4}, MaxTokens: 2}})
	if err == nil || !strings.Contains(err.Error(), "after the step: profiler gone") || !strings.Contains(err.Error(), "template prefill_t") {
		t.Fatalf("got %v", err)
	}
}
