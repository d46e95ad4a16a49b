// Package models holds one graph builder per model family: the family's forward, top to
// bottom in one file, with its Hugging Face tensor names beside the nodes that read them,
// composed of the shared blocks of blocks.go. A builder names every hook value (DESIGN.md
// "Hook surface"): what an app can attach to is what the builder names.
package models

import (
	"fmt"
	"sort"
	"strings"

	"xmix/frontend"
	"xmix/ir"
)

// builders are the families this compiler builds, by frontend.Model.Family.
var builders = map[string]func(*ir.Builder, *frontend.Model) *ir.Graph{
	"llama":   llama,
	"mistral": llama,
	"qwen2":   qwen2,
	"qwen3":   qwen3,
	"mixtral": mixtral,
	"gemma2":  gemma2,
}

// Build writes m's forward as a graph.
func Build(m *frontend.Model) (*ir.Graph, error) {
	build, ok := builders[m.Family]
	if !ok {
		return nil, fmt.Errorf("model %s: family %s has no graph builder (families: %s)", m.Name, m.Family, strings.Join(Families(), ", "))
	}
	wdt := ir.BF16
	if m.Dtype == "f32" {
		wdt = ir.F32
	}
	return build(ir.NewBuilder(m.Name, m.Family, wdt), m), nil
}

// Families lists the families with a builder, sorted.
func Families() []string {
	var out []string
	for f := range builders {
		out = append(out, f)
	}
	sort.Strings(out)
	return out
}
