package tokenizer

import "testing"

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
