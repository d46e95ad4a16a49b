//go:build !amd64

package ops

// dot4Acc is dot4AccGo where no vector form is written.
func dot4Acc(p *[4][4]float32, a0, a1, a2, a3, b []float32) { dot4AccGo(p, a0, a1, a2, a3, b) }

// widenBF16 is widenBF16Go where no vector form is written.
func widenBF16(dst []float32, src []uint16) { widenBF16Go(dst, src) }

// dotBF16x4 is dotBF16x4Go where no vector form is written.
func dotBF16x4(p *[4][4]float32, a []float32, b0, b1, b2, b3 []uint16) {
	dotBF16x4Go(p, a, b0, b1, b2, b3)
}
