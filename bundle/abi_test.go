package bundle

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A GEMM node is read through its kernel's parameter names, wherever they stand, and a node
// that claims to be one but lacks an operand is an error naming it.
func TestGemmOfReadsOperandsByRole(t *testing.T) {
	k := Kernel{Name: "g", Op: OpGemmTC, Attrs: []byte(`{"k":64,"n":32,"guard":4}`), Params: []Param{
		{Name: GemmW, Type: "u64"}, {Name: GemmRows, Type: "u32"}, {Name: GemmX, Type: "u64"}, {Name: "ws", Type: "u64"}, {Name: GemmY, Type: "u64"}}}
	n := Node{Label: "L0.o", Kernel: "g", Args: []Slot{{Buffer: "w"}, {Const: 8}, {Buffer: "x"}, {Buffer: "ws"}, {Buffer: "y"}}}
	g, ok, err := GemmOf(n, k)
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	if want := (GEMM{M: 8, N: 32, K: 64, X: 2, W: 0, Y: 4, Guard: 4}); g != want {
		t.Fatalf("got %+v, want %+v", g, want)
	}
	if _, ok, err := GemmOf(n, Kernel{Op: "row_norm"}); ok || err != nil {
		t.Fatalf("a row_norm node reads as a GEMM: %v %v", ok, err)
	}
	bad := n
	bad.Args = append([]Slot(nil), n.Args...)
	bad.Args[1] = Slot{Buffer: "rows"}
	if _, _, err := GemmOf(bad, k); err == nil || !strings.Contains(err.Error(), "node L0.o: kernel g: a GEMM needs parameters x, w, y and a constant rows") {
		t.Fatalf("rows bound to a buffer: %v", err)
	}
	k.Attrs = []byte(`{"k":0,"n":32}`)
	if _, _, err := GemmOf(n, k); err == nil || !strings.Contains(err.Error(), "want positive k and n") {
		t.Fatalf("k 0: %v", err)
	}
}

// The control block is spelled in this file only: no other source file of the repository
// names a control buffer, the page table or an output the host reads by a string literal.
func TestABINamesAreSpelledOnce(t *testing.T) {
	names := []string{CtlTokens, CtlPos, CtlSeq, CtlMask, CtlGen, CtlOutRow, CtlLatch, CtlVSlot, CtlTemperature, CtlTopP,
		CtlRNG, CtlSRow, CtlLogprobs, CtlEOSBan, CtlAnyMask, CtlAttnChunk, KVBlockTable, OutSampled, OutLogprobs, ActLogits}
	err := filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") || path == filepath.Join("..", "bundle", "abi.go") {
			return err
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, n := range names {
			if strings.Contains(string(data), `"`+n+`"`) {
				t.Errorf("%s spells %q: use its constant from bundle/abi.go", path, n)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
