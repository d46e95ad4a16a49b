package cuda

import (
	"slices"
	"testing"

	"xmix/bundle"
)

func labels(ls []launch) []string {
	var out []string
	for _, l := range ls {
		out = append(out, l.label)
	}
	return out
}

// Every subset of a template's heavy apps gets its own variant, which holds exactly the
// heavy nodes of that subset; heavy apps past the cap stay in every variant.
func TestVariantsLeaveOutUnusedHeavyNodes(t *testing.T) {
	tmpl := bundle.Template{Nodes: []bundle.Node{
		{Label: "norm"}, {Label: "lens_a", SkipUnless: 1 << 3}, {Label: "lens_b", SkipUnless: 1 << 7}, {Label: "head"},
	}}
	vbits := variantBits(tmpl)
	if !slices.Equal(vbits, []uint32{1 << 3, 1 << 7}) {
		t.Fatalf("variant bits %v", vbits)
	}
	var all []launch
	for _, n := range tmpl.Nodes {
		all = append(all, launch{label: n.Label, skipUnless: n.SkipUnless})
	}
	want := [][]string{{"norm", "head"}, {"norm", "lens_a", "head"}, {"norm", "lens_b", "head"}, {"norm", "lens_a", "lens_b", "head"}}
	for v, w := range want {
		if got := labels(variantNodes(all, vbits, v)); !slices.Equal(got, w) {
			t.Errorf("variant %d: %v, want %v", v, got, w)
		}
	}

	var many []bundle.Node
	for bit := range maxVariantBits + 2 {
		many = append(many, bundle.Node{Label: "lens", SkipUnless: 1 << bit})
	}
	vbits = variantBits(bundle.Template{Nodes: many})
	if len(vbits) != maxVariantBits {
		t.Fatalf("%d variant bits, want the cap %d", len(vbits), maxVariantBits)
	}
	all = nil
	for _, n := range many {
		all = append(all, launch{label: n.Label, skipUnless: n.SkipUnless})
	}
	if got := len(variantNodes(all, vbits, 0)); got != 2 {
		t.Fatalf("variant 0 keeps %d nodes, want the 2 past the cap", got)
	}
}
