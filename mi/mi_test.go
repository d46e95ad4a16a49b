package mi

import (
	"slices"
	"strings"
	"testing"
)

// A template missing a piece is refused at registration, naming it.
func TestRegisterRefusesIncompleteTemplates(t *testing.T) {
	for _, c := range []struct {
		t    Template
		want string
	}{
		{Template{Name: "nokind", Ref: steerAdd, Emit: emitSteerAdd}, `template "nokind": kind is neither read nor write`},
		{Template{Name: "noref", Kind: Write, Writes: true, Emit: emitSteerAdd}, `template "noref": no reference or no emitter`},
		{Template{Name: "noemit", Kind: Write, Writes: true, Ref: steerAdd}, `template "noemit": no reference or no emitter`},
		{Template{Name: "noout", Kind: Read, Ref: steerAdd, Emit: emitSteerAdd}, `template "noout": a read without OutCols`},
		{Template{Name: "steer_add", Kind: Write, Writes: true, Ref: steerAdd, Emit: emitSteerAdd}, `template "steer_add": registered twice`},
		{Template{Name: "nomax", Kind: Write, Writes: true, Ref: steerAdd, Emit: emitSteerAdd, Args: map[string]Arg{"k": {Kind: Count}}},
			`template "nomax": count argument k without Max`},
	} {
		func() {
			defer func() {
				if r := recover(); r == nil || !strings.Contains(r.(string), c.want) {
					t.Errorf("%s: panic %v, want %q", c.t.Name, r, c.want)
				}
				delete(templates, "nokind")
			}()
			Register(c.t)
		}()
	}
	// Every shipped template is complete (its init would have panicked otherwise); the
	// logits take the elementwise ones.
	for _, n := range []string{"capture", "patch", "scale", "steer_add"} {
		if !slices.Contains(ElementwiseNames(), n) {
			t.Errorf("%s is not elementwise (%v)", n, ElementwiseNames())
		}
	}
	if slices.Contains(ElementwiseNames(), "probe_linear") {
		t.Error("probe_linear, a reduction, is elementwise")
	}
}
