package tokenizer

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// testdata/nfc.json pairs inputs with their NFC as computed by ICU (node's String.normalize).
func TestNFC(t *testing.T) {
	var cases [][2]string
	readJSON(t, "testdata/nfc.json", &cases)
	if len(cases) < 1000 {
		t.Fatalf("only %d NFC cases", len(cases))
	}
	bad := 0
	for _, c := range cases {
		if got := nfc(c[0]); got != c[1] {
			if bad++; bad <= 10 {
				t.Errorf("nfc(%+q) = %+q, want %+q", c[0], got, c[1])
			}
		}
	}
	if bad > 0 {
		t.Errorf("%d of %d cases differ (tables are Unicode %s)", bad, len(cases), nfcUnicodeVersion)
	}
}

func TestNFCUnchanged(t *testing.T) {
	for _, s := range []string{"", "plain ASCII", "déjà vu", "한국어", "日本語", "ﬁ ½ Ⅻ", "👍🏽"} {
		if got := nfc(s); got != s {
			t.Errorf("nfc(%q) = %q, want it unchanged", s, got)
		}
	}
	if got := nfc("e\u0301\xff"); got != "é\uFFFD" {
		t.Errorf("nfc of invalid UTF-8 = %q", got)
	}
}

// TestCanonicalOrder: runs past insertionRun, sorted by counting, come out as a stable sort by
// combining class does, like the runs sorted by insertion.
func TestCanonicalOrder(t *testing.T) {
	nfcData.once.Do(loadNFC)
	// Non-starters of classes 1, 7, 9, 202, 216, 220, 230 and 233, two of some classes (their
	// order must survive the sort).
	marks := []rune{0x0334, 0x093C, 0x094D, 0x0327, 0x031B, 0x0316, 0x0301, 0x0300, 0x035C, 0x0317}
	rng := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{0, 1, 2, insertionRun, insertionRun + 1, 100, 5000} {
		for range 20 {
			run := make([]rune, n)
			for i := range run {
				run[i] = marks[rng.IntN(len(marks))]
			}
			want := slices.Clone(run)
			slices.SortStableFunc(want, func(a, b rune) int { return int(combiningClass(a)) - int(combiningClass(b)) })
			canonicalOrder(run)
			if !slices.Equal(run, want) {
				t.Fatalf("run of %d: %+q, want %+q", n, string(run), string(want))
			}
		}
	}
}

// TestNFCLongRun: a million alternating marks after one letter (4 MB of request text) are put
// in order in linear time; sorted by insertion, as every run was before, they took minutes.
func TestNFCLongRun(t *testing.T) {
	const n = 1_000_000
	got := nfc("a" + strings.Repeat("\u0301\u0316", n))
	// U+0316 (class 220) sorts before U+0301 (230); the first U+0301 then composes with the a.
	if want := "\u00e1" + strings.Repeat("\u0316", n) + strings.Repeat("\u0301", n-1); got != want {
		t.Errorf("nfc of a long run: %d bytes, want %d", len(got), len(want))
	}
}
