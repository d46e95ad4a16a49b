package frontend

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestLoadModelAndApp(t *testing.T) {
	dir := t.TempDir()
	mp := filepath.Join(dir, "models", "tiny.yaml")
	ap := filepath.Join(dir, "apps", "refusal.yaml")
	for path, text := range map[string]string{mp: tinyModel, ap: refusalApp} {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	m, err := LoadModel(mp)
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(dir, "models", "tiny", "model.safetensors"); m.Weights.Path != want {
		t.Errorf("weights path = %s, want %s", m.Weights.Path, want)
	}
	a, err := LoadApp(ap, m)
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(dir, "apps", "vectors.safetensors"); a.Params[0].File != want {
		t.Errorf("param file = %s, want %s", a.Params[0].File, want)
	}
	if _, err := LoadModel(filepath.Join(dir, "missing.yaml")); err == nil || !strings.Contains(err.Error(), "missing.yaml") {
		t.Errorf("loading a missing spec: got %v, want an error naming it", err)
	}
}

// TestShippedSpecs keeps the specs in the repository parseable.
func TestShippedSpecs(t *testing.T) {
	models, _ := filepath.Glob("../specs/models/*.yaml")
	apps, _ := filepath.Glob("../specs/apps/*.yaml")
	for _, p := range models {
		if _, err := LoadModel(p); err != nil {
			t.Errorf("%v", err)
		}
	}
	for _, p := range apps {
		if _, err := LoadApp(p, nil); err != nil {
			t.Errorf("%v", err)
		}
	}
}
