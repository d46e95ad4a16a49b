#include "textflag.h"

// LOAD_SUMS and STORE_SUMS move the sixteen partial sums at DI (a *[4][4]float32) to and from
// X0..X3, four lanes each.
#define LOAD_SUMS MOVUPS 0(DI), X0; MOVUPS 16(DI), X1; MOVUPS 32(DI), X2; MOVUPS 48(DI), X3
#define STORE_SUMS MOVUPS X0, 0(DI); MOVUPS X1, 16(DI); MOVUPS X2, 32(DI); MOVUPS X3, 48(DI)

// ROW adds to acc, lane by lane, the products of a row's four elements at src+AX and b's in
// X4 (tmp holds the row's).
#define ROW(src, tmp, acc) MOVUPS (src)(AX*1), tmp; MULPS X4, tmp; ADDPS tmp, acc

// func dot4AccSSE(p *[4][4]float32, a0, a1, a2, a3, b *float32, groups int)
// X0..X3 hold p's rows, four lanes each; each group of four elements of b (X4) multiplies the
// same four elements of every row, and the products add to that row's lanes.
TEXT ·dot4AccSSE(SB), NOSPLIT, $0-56
	MOVQ p+0(FP), DI
	MOVQ a0+8(FP), R8
	MOVQ a1+16(FP), R9
	MOVQ a2+24(FP), R10
	MOVQ a3+32(FP), R11
	MOVQ b+40(FP), SI
	MOVQ groups+48(FP), CX
	LOAD_SUMS
	SHLQ $4, CX
	XORQ AX, AX
	TESTQ CX, CX
	JZ done

loop:
	MOVUPS (SI)(AX*1), X4
	ROW(R8, X5, X0)
	ROW(R9, X6, X1)
	ROW(R10, X7, X2)
	ROW(R11, X8, X3)
	ADDQ $16, AX
	CMPQ AX, CX
	JB loop

done:
	STORE_SUMS
	RET

// func widenBF16SSE(dst *float32, src *uint16, groups int)
// Interleaving eight bf16 values with zeros below each makes them the high halves of eight
// f32 values: bit for bit BF16ToF32.
TEXT ·widenBF16SSE(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ groups+16(FP), CX
	SHLQ $4, CX
	XORQ AX, AX
	TESTQ CX, CX
	JZ widened

widen:
	MOVOU (SI)(AX*1), X1
	PXOR X2, X2
	PXOR X3, X3
	PUNPCKLWL X1, X2
	PUNPCKHWL X1, X3
	MOVOU X2, (DI)(AX*2)
	MOVOU X3, 16(DI)(AX*2)
	ADDQ $16, AX
	CMPQ AX, CX
	JB widen

widened:
	RET

// COL adds to acc, lane by lane, the products of a's four elements in X4 and a column's four
// bf16 at src+DX, widened in u as widenBF16SSE widens them (w holds the column's words).
#define COL(src, w, u, acc) MOVQ (src)(DX*1), w; PXOR u, u; PUNPCKLWL w, u; MULPS X4, u; ADDPS u, acc

// func dotBF16x4SSE(p *[4][4]float32, a *float32, b0, b1, b2, b3 *uint16, groups int)
// X0..X3 hold the four columns' partial sums, four lanes each; each group of four elements
// of a (X4) multiplies the same four elements of every column, and the products add to that
// column's lanes. DX runs over the columns' bytes, a's twice as fast.
TEXT ·dotBF16x4SSE(SB), NOSPLIT, $0-56
	MOVQ p+0(FP), DI
	MOVQ a+8(FP), SI
	MOVQ b0+16(FP), R9
	MOVQ b1+24(FP), R10
	MOVQ b2+32(FP), R11
	MOVQ b3+40(FP), R12
	MOVQ groups+48(FP), CX
	LOAD_SUMS
	SHLQ $3, CX
	XORQ DX, DX
	TESTQ CX, CX
	JZ summed

cols:
	MOVUPS (SI)(DX*2), X4
	COL(R9, X5, X9, X0)
	COL(R10, X6, X10, X1)
	COL(R11, X7, X11, X2)
	COL(R12, X8, X12, X3)
	ADDQ $8, DX
	CMPQ DX, CX
	JB cols

summed:
	STORE_SUMS
	RET
