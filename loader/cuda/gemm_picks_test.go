package cuda

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"xmix/bundle"
	"xmix/ops"
)

const onePick = `{"device": "NVIDIA H200", "cublaslt": 130100, "m": 8, "n": 4096, "k": 4096, "algo": 66, "tile": 10,
 "stages": 35, "split": 1, "swizzle": 0, "custom": 0, "inner": 0, "cluster": 0, "us": 11.5, "heuristic_us": 12.3}`

func TestShippedGemmPicksParse(t *testing.T) {
	picks, err := DefaultGemmPicks()
	if err != nil {
		t.Fatal(err)
	}
	for i, p := range picks {
		if p.Us >= p.HeuristicUs {
			t.Errorf("pick %d (%dx%dx%d): %.2f µs, not faster than the heuristic's %.2f", i, p.M, p.N, p.K, p.Us, p.HeuristicUs)
		}
	}
}

func TestReadGemmPicksRejectsBadTables(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct{ name, body, want string }{
		{"notjson", `{"m": 8`, "want a JSON list of picks"},
		{"unknown", `[{"device": "x", "cublaslt": 1, "m": 8, "n": 8, "k": 8, "split": 1, "tiles": 3}]`, `unknown field "tiles"`},
		{"nodevice", `[{"cublaslt": 1, "m": 8, "n": 8, "k": 8, "split": 1}]`, `pick 0: device "", cublaslt 1: name the GPU`},
		{"zerom", `[{"device": "x", "cublaslt": 1, "m": 0, "n": 8, "k": 8, "split": 1}]`, "pick 0: shape 0x8x8: m, n and k must be 1 to 16777216"},
		{"hugek", `[{"device": "x", "cublaslt": 1, "m": 8, "n": 8, "k": 99999999, "split": 1}]`, "shape 8x8x99999999"},
		{"negtile", `[{"device": "x", "cublaslt": 1, "m": 8, "n": 8, "k": 8, "split": 1, "tile": -1}]`, "tile -1"},
		{"split0", `[{"device": "x", "cublaslt": 1, "m": 8, "n": 8, "k": 8, "split": 0}]`, "split 0: must be 1 to 64"},
		{"twice", "[" + onePick + ",\n" + onePick + "]", "pick 1: a second pick for 8x4096x4096 on NVIDIA H200, cuBLASLt 130100: keep one"},
	} {
		path := filepath.Join(dir, c.name+".json")
		os.WriteFile(path, []byte(c.body), 0o644)
		_, err := ReadGemmPicks(path)
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), path) {
			t.Errorf("%s: %v, want %q and the file's name", c.name, err, c.want)
		}
	}
	if _, err := ReadGemmPicks(filepath.Join(dir, "absent.json")); err == nil {
		t.Error("a missing file reads")
	}
	// A device is refused by name before anything is read from it (input.Read).
	if _, err := ReadGemmPicks("/dev/zero"); err == nil || !strings.Contains(err.Error(), "/dev/zero") {
		t.Errorf("/dev/zero: %v", err)
	}
}

// A pick serves only its GPU and library version, and matches a heuristic result by every
// field of its configuration but the split, which it then sets.
func TestGemmPickLookupAndMatch(t *testing.T) {
	picks, err := parseGemmPicks("t", []byte("["+onePick+"]"))
	if err != nil {
		t.Fatal(err)
	}
	if n := len(picksFor(picks, "NVIDIA H100", 130100)); n != 0 {
		t.Errorf("another GPU gets %d picks", n)
	}
	if n := len(picksFor(picks, "NVIDIA H200", 130000)); n != 0 {
		t.Errorf("another cuBLASLt gets %d picks", n)
	}
	got := picksFor(picks, "NVIDIA H200", 130100)
	p, ok := got[GemmShape{8, 4096, 4096}]
	if !ok {
		t.Fatalf("pick not found: %v", got)
	}
	c := p.config()
	for _, x := range []struct {
		c    ltConfig
		want bool
	}{
		{c, true},
		{ltConfig{c.algo, c.tile, c.stages, 2, c.swizzle, c.custom, c.inner, c.cluster}, true},
		{ltConfig{c.algo, 11, c.stages, c.split, c.swizzle, c.custom, c.inner, c.cluster}, false},
		{ltConfig{c.algo, c.tile, 34, c.split, c.swizzle, c.custom, c.inner, c.cluster}, false},
		{ltConfig{c.algo, c.tile, c.stages, c.split, 1, c.custom, c.inner, c.cluster}, false},
		{ltConfig{c.algo, c.tile, c.stages, c.split, c.swizzle, c.custom, c.inner, 3}, false},
		{ltConfig{67, c.tile, c.stages, c.split, c.swizzle, c.custom, c.inner, c.cluster}, false},
	} {
		if p.matches(x.c) != x.want {
			t.Errorf("%+v matches %+v: %v, want %v", p, x.c, !x.want, x.want)
		}
	}
}

// GemmShapes lists each tensor-core GEMM shape of at most maxRows rows once, in the order the
// templates first run it, and leaves out other kernels and the odd K cuBLASLt cannot take.
func TestGemmShapes(t *testing.T) {
	params := []bundle.Param{{Name: bundle.GemmX, Type: "u64"}, {Name: bundle.GemmW, Type: "u64"}, {Name: bundle.GemmY, Type: "u64"}, {Name: bundle.GemmRows, Type: "u32"}}
	kernel := func(name, op string, k, n int) bundle.Kernel {
		return bundle.Kernel{Name: name, Op: op, Attrs: ops.EncodeAttrs(bundle.GemmTCAttrs{K: k, N: n}), Params: params}
	}
	node := func(kernel string, rows int) bundle.Node {
		return bundle.Node{Kernel: kernel, Args: []bundle.Slot{{Buffer: "x"}, {Buffer: "w"}, {Buffer: "y"}, {Const: uint64(rows)}}}
	}
	b := &bundle.Bundle{
		Kernels: []bundle.Kernel{kernel("tc", bundle.OpGemmTC, 64, 32), kernel("odd", bundle.OpGemmTC, 63, 32), kernel("gemv", "gemm", 64, 32)},
		Templates: []bundle.Template{
			{Name: "decode8", Nodes: []bundle.Node{node("gemv", 8), node("tc", 8), node("odd", 8), node("tc", 8)}},
			{Name: "decode128", Nodes: []bundle.Node{node("tc", 128)}},
			{Name: "prefill", Nodes: []bundle.Node{node("tc", 512)}},
		},
	}
	got, err := GemmShapes(b, 128)
	if err != nil {
		t.Fatal(err)
	}
	if want := []GemmShape{{8, 32, 64}, {128, 32, 64}}; !slices.Equal(got, want) {
		t.Errorf("shapes %v, want %v", got, want)
	}
	b.Templates[0].Nodes[1].Args = b.Templates[0].Nodes[1].Args[:3]
	if _, err := GemmShapes(b, 128); err == nil || !strings.Contains(err.Error(), "template decode8") {
		t.Errorf("a malformed GEMM node: %v", err)
	}
}
