package frontend

import "testing"

func TestNearest(t *testing.T) {
	choices := []string{"hidden", "heads", "head_dim", "to", "from", "resid_post", "resid_pre"}
	cases := []struct{ in, want string }{
		{"hiden", "hidden"},
		{"hidden", "hidden"},
		{"haeds", "heads"},
		{"resid_pots", "resid_post"},
		{"residpre", "resid_pre"},
		{"xx", ""},    // as far from "to" as it is long: not a typo
		{"vocab", ""}, // unrelated
		{"headdim", "head_dim"},
		{"", ""},
	}
	for _, c := range cases {
		if got := nearest(c.in, choices); got != c.want {
			t.Errorf("nearest(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

func TestLevenshtein(t *testing.T) {
	cases := []struct {
		a, b string
		want int
	}{{"", "", 0}, {"a", "", 1}, {"kitten", "sitting", 3}, {"attn.z", "attn.q", 1}, {"ü", "u", 1}}
	for _, c := range cases {
		if got := levenshtein(c.a, c.b); got != c.want {
			t.Errorf("levenshtein(%q, %q) = %d, want %d", c.a, c.b, got, c.want)
		}
	}
}
