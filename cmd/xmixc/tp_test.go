package main

import (
	"path/filepath"
	"strings"
	"testing"
)

// TestBuildTP: --tp 2 writes a tensor-parallel bundle that inspect says is one, and a degree
// that does not divide the heads is refused naming the field.
func TestBuildTP(t *testing.T) {
	dir := t.TempDir()
	spec := write(t, dir, "m.yaml", strings.Replace(model, "heads: 2, kv_heads: 1", "heads: 2, kv_heads: 2", 1))
	out := filepath.Join(dir, "m.xmb")
	if _, err := xmixc(t, "build", spec, "--tp", "2", "-q", "-o", out); err != nil {
		t.Fatal(err)
	}
	text, err := xmixc(t, "inspect", out)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(text, "tp        2 ranks") {
		t.Errorf("inspect does not show the degree:\n%s", text)
	}
	_, err = xmixc(t, "build", spec, "--tp", "3", "-q", "-o", out)
	if err == nil || !strings.Contains(err.Error(), "heads 2 is not divisible by 3") || !strings.Contains(err.Error(), "--tp 1 or 2") {
		t.Errorf("--tp 3: %v", err)
	}
}
