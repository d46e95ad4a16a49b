package ops

// dot4Acc is dot4AccGo with SSE: each row's four partial sums are one vector, whose lanes
// take elements i+0..i+3 of each group of four as dot's four sums do, multiplied and added
// one rounding each (MULPS, ADDPS: no fused multiply-add), so the sums are dot's bit for bit
// and four products go at a time.
func dot4Acc(p *[4][4]float32, a0, a1, a2, a3, b []float32) {
	n := len(b)
	if n == 0 {
		return
	}
	a0, a1, a2, a3 = a0[:n], a1[:n], a2[:n], a3[:n]
	dot4AccSSE(p, &a0[0], &a1[0], &a2[0], &a3[0], &b[0], n/4)
}

// dot4AccSSE adds to p[r] the products of groups groups of four elements of row r (a0..a3)
// and b, lane by lane (dot_amd64.s).
//
//go:noescape
func dot4AccSSE(p *[4][4]float32, a0, a1, a2, a3, b *float32, groups int)

// widenBF16 is widenBF16Go with SSE for whole groups of eight (each bf16 is the high half of
// its f32, the low half zeros: PUNPCKLWL and PUNPCKHWL with a zero vector), the rest in Go.
func widenBF16(dst []float32, src []uint16) {
	n := len(src) &^ 7
	dst = dst[:len(src)]
	if n > 0 {
		widenBF16SSE(&dst[0], &src[0], n/8)
	}
	widenBF16Go(dst[n:], src[n:])
}

// widenBF16SSE widens groups groups of eight bf16 values at src into f32 at dst
// (dot_amd64.s).
//
//go:noescape
func widenBF16SSE(dst *float32, src *uint16, groups int)

// dotBF16x4 is dotBF16x4Go with SSE: each column's four partial sums are one vector, whose
// lanes take elements i+0..i+3 of each group of four as dotBF16's four sums do (each bf16
// widened as widenBF16 widens it, then MULPS and ADDPS: no fused multiply-add), so the sums
// are dotBF16's bit for bit and the four columns' sums go at a time.
func dotBF16x4(p *[4][4]float32, a []float32, b0, b1, b2, b3 []uint16) {
	n := len(a)
	if n == 0 {
		return
	}
	b0, b1, b2, b3 = b0[:n], b1[:n], b2[:n], b3[:n]
	dotBF16x4SSE(p, &a[0], &b0[0], &b1[0], &b2[0], &b3[0], n/4)
}

// dotBF16x4SSE adds to p[c] the products of groups groups of four elements of a and column c
// (b0..b3), lane by lane (dot_amd64.s).
//
//go:noescape
func dotBF16x4SSE(p *[4][4]float32, a *float32, b0, b1, b2, b3 *uint16, groups int)
