// Package specs holds the shipped model and app specs, and embeds the default model (tiny)
// with its two demo apps so that `xmix run` works with nothing downloaded.
package specs

import (
	"embed"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

//go:embed models/tiny.yaml models/tiny/chat_template.jinja apps/tiny-steer.yaml apps/tiny-probe.yaml models/tiny/model.safetensors models/tiny/vectors.safetensors
var defaultFS embed.FS

// ScaleTwoPTX is the example custom kernel apps/custom/scale2.ptx (x *= 2 on the rows whose
// app bit is set), shipped for users and used by the tests of the custom-kernel ABI.
//
//go:embed apps/custom/scale2.ptx
var ScaleTwoPTX string

// Default names the embedded default model and its demo apps, relative to an extracted tree.
var Default = struct {
	Model string
	Steer string
	Probe string
}{"models/tiny.yaml", "apps/tiny-steer.yaml", "apps/tiny-probe.yaml"}

// Extract writes the embedded default specs and weights under dir.
func Extract(dir string) error {
	return fs.WalkDir(defaultFS, ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		dst := filepath.Join(dir, path)
		if d.IsDir() {
			return os.MkdirAll(dst, 0o755)
		}
		data, err := defaultFS.ReadFile(path)
		if err != nil {
			return err
		}
		if err := os.WriteFile(dst, data, 0o644); err != nil {
			return fmt.Errorf("extracting the default model: %w", err)
		}
		return nil
	})
}
