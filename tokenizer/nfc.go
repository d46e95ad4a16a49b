package tokenizer

//go:generate python3 mknfc.py

import (
	"sort"
	"strings"
	"sync"
	"unicode/utf8"
)

// Unicode Normalization Form C (UAX #15), needed because Qwen's tokenizer.json normalizes with
// NFC and golang.org/x/text is not among our dependencies. The tables come from nfc_tables.go.

// Hangul syllables compose and decompose by arithmetic rather than by table.
const (
	hangulSBase  = 0xAC00
	hangulLBase  = 0x1100
	hangulVBase  = 0x1161
	hangulTBase  = 0x11A7
	hangulLCount = 19
	hangulVCount = 21
	hangulTCount = 28
	hangulNCount = hangulVCount * hangulTCount
	hangulSCount = hangulLCount * hangulNCount
)

type nfcDataT struct {
	once    sync.Once
	decomp  map[rune][]rune // full (recursive) canonical decomposition
	compose map[[2]rune]rune
	// unstable holds the chars whose presence means a string may not already be in NFC:
	// chars that decompose and do not recompose to themselves, non-starters, and chars that
	// can combine with the char before them. unstableBMP is the same for U+0000-U+FFFF.
	unstable    map[rune]bool
	unstableBMP [0x10000 / 64]uint64
	cccBMP      [0x10000]uint8 // combining classes of U+0000-U+FFFF
}

func (d *nfcDataT) isUnstable(r rune) bool {
	if r < 0x10000 {
		return d.unstableBMP[r/64]&(1<<(r%64)) != 0
	}
	return d.unstable[r]
}

var nfcData nfcDataT

func loadNFC() {
	d := &nfcData
	raw := make(map[rune][]rune, len(canonicalDecomp))
	for _, m := range canonicalDecomp {
		if m[2] == 0 {
			raw[m[0]] = []rune{m[1]}
		} else {
			raw[m[0]] = []rune{m[1], m[2]}
		}
	}
	excluded := make(map[rune]bool, len(compositionExcluded))
	for _, c := range compositionExcluded {
		excluded[c] = true
	}
	d.decomp = make(map[rune][]rune, len(raw))
	d.compose = make(map[[2]rune]rune)
	d.unstable = make(map[rune]bool)
	var expand func(r rune) []rune
	expand = func(r rune) []rune {
		m, ok := raw[r]
		if !ok {
			return []rune{r}
		}
		var out []rune
		for _, c := range m {
			out = append(out, expand(c)...)
		}
		return out
	}
	for c, m := range raw {
		d.decomp[c] = expand(c)
		if len(m) == 2 && !excluded[c] {
			d.compose[[2]rune{m[0], m[1]}] = c
			d.unstable[m[1]] = true
		} else {
			d.unstable[c] = true
		}
	}
	for _, r := range combiningClasses {
		for c := r.lo; c <= r.hi; c++ {
			d.unstable[c] = true
			if c < 0x10000 {
				d.cccBMP[c] = r.class
			}
		}
	}
	// Hangul vowels and trailing consonants combine with the syllable or jamo before them.
	for c := rune(hangulVBase); c < hangulVBase+hangulVCount; c++ {
		d.unstable[c] = true
	}
	for c := rune(hangulTBase + 1); c < hangulTBase+hangulTCount; c++ {
		d.unstable[c] = true
	}
	d.unstable[utf8.RuneError] = true // stands for invalid UTF-8, which is replaced
	for c := range d.unstable {
		if c < 0x10000 {
			d.unstableBMP[c/64] |= 1 << (c % 64)
		}
	}
}

func combiningClass(r rune) uint8 {
	if r < 0x10000 {
		return nfcData.cccBMP[r]
	}
	i := sort.Search(len(combiningClasses), func(i int) bool { return combiningClasses[i].hi >= r })
	if i < len(combiningClasses) && combiningClasses[i].lo <= r {
		return combiningClasses[i].class
	}
	return 0
}

// nfc returns s in Normalization Form C. Invalid UTF-8 becomes U+FFFD; HF tokenizers cannot
// be given invalid UTF-8 at all (its input is a Rust &str).
func nfc(s string) string {
	i := 0
	for i < len(s) && s[i] < utf8.RuneSelf {
		i++
	}
	if i == len(s) {
		return s
	}
	nfcData.once.Do(loadNFC)
	d := &nfcData
	stable := true
	for _, r := range s[i:] {
		if d.isUnstable(r) {
			stable = false
			break
		}
	}
	if stable {
		return s
	}

	// Decompose fully.
	buf := make([]rune, 0, len(s))
	for _, r := range s {
		if r >= hangulSBase && r < hangulSBase+hangulSCount {
			si := r - hangulSBase
			buf = append(buf, hangulLBase+si/hangulNCount, hangulVBase+(si%hangulNCount)/hangulTCount)
			if t := si % hangulTCount; t != 0 {
				buf = append(buf, hangulTBase+t)
			}
			continue
		}
		if m, ok := d.decomp[r]; ok {
			buf = append(buf, m...)
			continue
		}
		buf = append(buf, r)
	}

	// Put each run of non-starters in canonical order (a stable sort by combining class).
	for i := 0; i < len(buf); {
		if combiningClass(buf[i]) == 0 {
			i++
			continue
		}
		j := i
		for j < len(buf) && combiningClass(buf[j]) != 0 {
			j++
		}
		canonicalOrder(buf[i:j])
		i = j
	}

	// Compose: each char joins the last starter unless a char in between blocks it.
	out := buf[:0]
	starter := -1
	var lastClass uint8
	for _, c := range buf {
		cc := combiningClass(c)
		if starter >= 0 && (len(out)-1 == starter || (lastClass != 0 && lastClass < cc)) {
			if comp, ok := composePair(out[starter], c); ok {
				out[starter] = comp
				continue
			}
		}
		if cc == 0 {
			starter = len(out)
		}
		lastClass = cc
		out = append(out, c)
	}
	var b strings.Builder
	b.Grow(len(s))
	for _, r := range out {
		b.WriteRune(r)
	}
	return b.String()
}

// insertionRun is the longest run of non-starters canonicalOrder sorts by insertion.
const insertionRun = 32

// canonicalOrder puts a run of non-starters in canonical order: a stable sort by combining
// class. Real text has runs of a few marks, sorted in place by insertion; a longer run (a
// request of thousands of alternating marks) is sorted by counting, in time linear in its
// length, where insertion would take its square (minutes for a few MB).
func canonicalOrder(run []rune) {
	if len(run) <= insertionRun {
		for k := 1; k < len(run); k++ {
			c, cc := run[k], combiningClass(run[k])
			m := k
			for m > 0 && combiningClass(run[m-1]) > cc {
				run[m] = run[m-1]
				m--
			}
			run[m] = c
		}
		return
	}
	var start [257]int
	for _, c := range run {
		start[int(combiningClass(c))+1]++
	}
	for k := 1; k < len(start); k++ {
		start[k] += start[k-1]
	}
	sorted := make([]rune, len(run))
	for _, c := range run {
		cc := combiningClass(c)
		sorted[start[cc]] = c
		start[cc]++
	}
	copy(run, sorted)
}

func composePair(a, b rune) (rune, bool) {
	if a >= hangulLBase && a < hangulLBase+hangulLCount && b >= hangulVBase && b < hangulVBase+hangulVCount {
		return hangulSBase + ((a-hangulLBase)*hangulVCount+(b-hangulVBase))*hangulTCount, true
	}
	if a >= hangulSBase && a < hangulSBase+hangulSCount && (a-hangulSBase)%hangulTCount == 0 &&
		b > hangulTBase && b < hangulTBase+hangulTCount {
		return a + (b - hangulTBase), true
	}
	c, ok := nfcData.compose[[2]rune{a, b}]
	return c, ok
}
