package ptx

import (
	"os"
	"path/filepath"
	"testing"
)

// FuzzParse: any text given as PTX (a custom kernel is user PTX) either parses or is an
// error, never a panic; what parses and validates prints and parses again to the same text.
func FuzzParse(f *testing.F) {
	text, err := NewModule(sampleKernel()).Print()
	if err != nil {
		f.Fatal(err)
	}
	f.Add(text)
	f.Add(hopperSrc)
	f.Add(wgmmaSrc)
	for _, pattern := range []string{"../codegen/testdata/*.ptx", "../specs/apps/custom/*.ptx"} {
		files, _ := filepath.Glob(pattern)
		for _, p := range files {
			if data, err := os.ReadFile(p); err == nil {
				f.Add(string(data))
			}
		}
	}
	for _, s := range []string{"", ".version 8.0\n.target sm_90\n", ".visible .entry k() { ret; }", "{{{{", ".entry k(.param .u64 p) { ld.param.u64 %rd1, [p]; bra L; L: ret; }"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, text string) {
		m, err := Parse(text)
		if err != nil {
			return
		}
		if Validate(m) != nil {
			return
		}
		out, err := m.Print()
		if err != nil {
			return
		}
		again, err := Parse(out)
		if err != nil {
			t.Fatalf("printed PTX does not parse: %v\n%s", err, out)
		}
		if out2, err := again.Print(); err != nil || out2 != out {
			t.Fatalf("print(parse(print(m))) differs: %v\n%s\n---\n%s", err, out, out2)
		}
	})
}
