package emu

import (
	"fmt"
	"math"
)

// mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {d0..d3}, {a0..a3}, {b0,b1}, {c0..c3}
// computes D[16x8] = A[16x16] . B[16x8] + C, with the matrices spread over the warp as the PTX
// ISA lays them out ("Matrix Fragments for mma.m16n8k16 with floating point type"). With
// g = laneid>>2 (groupID) and t = laneid%4 (threadID_in_group), a lane holds:
//
//	A: four .b32 registers with elements a0..a7, two per register, the lower-numbered in the
//	   low half (register j holds a(2j) and a(2j+1)):
//	     row(ai) = g      for i in {0,1,4,5},  g+8 for i in {2,3,6,7}
//	     col(ai) = 2t + (i&1) + 8*(i>=4)
//	B: two .b32 registers with b0..b3, likewise packed:
//	     row(bi) = 2t + (i&1) + 8*(i>=2),  col(bi) = g
//	C, D: four f32 registers c0..c3:
//	     row(ci) = g + 8*(i>=2),  col(ci) = 2t + (i&1)
//
// Each output is C plus a 16-term dot product of bf16 values. The products are exact in
// float64 and the sum is formed there too, then rounded once to f32; tensor cores accumulate
// with their own (unspecified) internal precision and order, so hardware may differ from
// this in the last bits of a result.

// mmaA, mmaB and mmaC map a lane's fragment element i to its (row, col) in A, B and C/D.
func mmaA(lane, i int) (int, int) {
	g, t := lane>>2, lane&3
	return g + 8*(i>>1&1), 2*t + i&1 + 8*(i>>2)
}

func mmaB(lane, i int) (int, int) {
	g, t := lane>>2, lane&3
	return 2*t + i&1 + 8*(i>>1), g
}

func mmaC(lane, i int) (int, int) {
	g, t := lane>>2, lane&3
	return g + 8*(i>>1), 2*t + i&1
}

func bf16Half(word uint64, i int) float64 {
	return float64(math.Float32frombits(uint32(uint16(word>>(16*(i&1)))) << 16))
}

// mma resolves the mma at pc, which every lane of the warp [lo,hi) waits on. The instruction
// is .aligned: the warp must be whole and every lane must execute it.
func (b *block) mma(lo, hi int, pc int32) error {
	in := &b.p.code[pc]
	for t := lo; t < hi; t++ {
		if b.state[t] != stShfl || hi-lo != 32 {
			return b.errorAt(lo, pc, fmt.Errorf("mma.sync.aligned needs all 32 lanes of the warp, %d of %d are here", b.waiting(lo, hi), 32))
		}
	}
	var A [16][16]float64
	var B [16][8]float64
	var C [16][8]float64
	for lane := range 32 {
		r := b.threadRegs(lo + lane)
		for i := range 8 {
			row, col := mmaA(lane, i)
			A[row][col] = bf16Half(r[in.frag[i/2]], i)
		}
		for i := range 4 {
			row, col := mmaB(lane, i)
			B[row][col] = bf16Half(r[in.frag[4+i/2]], i)
		}
		for i := range 4 {
			row, col := mmaC(lane, i)
			C[row][col] = float64(math.Float32frombits(uint32(r[in.frag[6+i]])))
		}
	}
	// Every lane's sources are read above, so a destination may alias a source.
	for lane := range 32 {
		t := lo + lane
		r := b.threadRegs(t)
		for i := range 4 {
			row, col := mmaC(lane, i)
			dot := 0.0
			for k := range 16 {
				dot += A[row][k] * B[k][col]
			}
			r[in.d[i]] = uint64(math.Float32bits(float32(C[row][col] + dot)))
		}
		b.state[t] = stRun
		b.pc[t]++
	}
	return nil
}

func (b *block) waiting(lo, hi int) int {
	n := 0
	for t := lo; t < hi; t++ {
		if b.state[t] == stShfl {
			n++
		}
	}
	return n
}
