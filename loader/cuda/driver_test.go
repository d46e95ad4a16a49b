package cuda

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"unsafe"
)

// TestUintptrArgumentsEscape: every function of this package that takes ...uintptr forwards
// pointers converted to uintptr to a C library, so it must carry //go:uintptrescapes (see
// driver.call); one without it lets the library write to a moved goroutine stack.
func TestUintptrArgumentsEscape(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	checked := 0
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		file, err := parser.ParseFile(fset, f, nil, parser.ParseComments)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range file.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || !variadicUintptr(fn.Type.Params) {
				continue
			}
			checked++
			if fn.Doc == nil || !strings.Contains(rawComments(fn.Doc), "//go:uintptrescapes") {
				t.Errorf("%s: %s takes ...uintptr without //go:uintptrescapes", fset.Position(fn.Pos()), fn.Name.Name)
			}
		}
	}
	if checked < 2 {
		t.Fatalf("found %d functions taking ...uintptr, want the driver's and cuBLASLt's call at least", checked)
	}
}

func variadicUintptr(params *ast.FieldList) bool {
	if params == nil || len(params.List) == 0 {
		return false
	}
	last, ok := params.List[len(params.List)-1].Type.(*ast.Ellipsis)
	if !ok {
		return false
	}
	id, ok := last.Elt.(*ast.Ident)
	return ok && id.Name == "uintptr"
}

// rawComments: directives are left out of CommentGroup.Text.
func rawComments(g *ast.CommentGroup) string {
	var b strings.Builder
	for _, c := range g.List {
		b.WriteString(c.Text + "\n")
	}
	return b.String()
}

// TestEveryCallIsResolved: every driver or cuBLASLt entry point this package calls by name
// is in the list resolved at load, so a call added without its symbol fails here instead of
// jumping to address 0 on the GPU machine.
func TestEveryCallIsResolved(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	known := map[string]bool{}
	for _, s := range append(append([]string{}, driverSymbols...), ltSymbols...) {
		known[s] = true
	}
	fset := token.NewFileSet()
	calls := 0
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		file, err := parser.ParseFile(fset, f, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(file, func(n ast.Node) bool {
			c, ok := n.(*ast.CallExpr)
			if !ok || len(c.Args) == 0 {
				return true
			}
			sel, ok := c.Fun.(*ast.SelectorExpr)
			lit, isLit := c.Args[0].(*ast.BasicLit)
			if !ok || sel.Sel.Name != "call" || !isLit || lit.Kind != token.STRING {
				return true
			}
			name := strings.Trim(lit.Value, `"`)
			calls++
			if !known[name] {
				t.Errorf("%s: %s is called but not in driverSymbols or ltSymbols", fset.Position(c.Pos()), name)
			}
			return true
		})
	}
	if calls < 40 {
		t.Fatalf("found %d calls by name, want the backend's (40 and more)", calls)
	}
}

// TestLaunchConfigLayout: the structs cuLaunchKernelEx reads have the C layout of cuda.h
// (CUlaunchConfig: the stream at 32, the attributes at 40, their count at 48; CUlaunchAttribute:
// 72 bytes, the value at 8).
func TestLaunchConfigLayout(t *testing.T) {
	var c launchConfig
	var a launchAttribute
	got := []uintptr{unsafe.Offsetof(c.shared), unsafe.Offsetof(c.stream), unsafe.Offsetof(c.attrs), unsafe.Offsetof(c.numAttrs), unsafe.Sizeof(c),
		unsafe.Offsetof(a.value), unsafe.Sizeof(a)}
	want := []uintptr{24, 32, 40, 48, 56, 8, 72}
	if !slices.Equal(got, want) {
		t.Fatalf("offsets and sizes %v, want %v", got, want)
	}
}
