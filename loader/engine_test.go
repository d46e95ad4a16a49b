package loader_test

import (
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
		{"table", func(m *bundle.Manifest) { m.Apps[0].ScalarTable = "ctl.mask" }, "not a control buffer of [5, 1] f32"},
		{"scalar index", func(m *bundle.Manifest) { m.Apps[0].Scalars[0].Index = 1 }, "index 1 in a table of 1"},
		{"vector width", func(m *bundle.Manifest) { m.Apps[0].Vectors[0].Width = 64 }, "not a param buffer of [64] f32"},
		{"latch bit", func(m *bundle.Manifest) { m.Apps[0].Latches[0].Bit = 32 }, "latch bit 32"},
		{"latch buffer", func(m *bundle.Manifest) {
			for i := range m.Buffers {
				if m.Buffers[i].Name == "ctl.latch" {
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
