package emu

import (
	"encoding/binary"
	"fmt"
	"math"

	"xmix/ptx"
)

// wgmma.mma_async.sync.aligned.m64nNk16.f32.bf16.bf16 {d0..d(N/2-1)}, descA, descB, scale-d,
// imm-scale-a, imm-scale-b, 0, 0 computes D[64xN] = A[64x16] . B^T + (scale-d ? D : 0) for a
// warpgroup, four consecutive warps (threads 128i..128i+127). A (64 rows of 16 k) and B (N
// rows of 16 k) are K-major bf16 in the block's shared memory, each described by a 64-bit
// matrix descriptor (PTX ISA, "Matrix Descriptor Format"); imm-scale -1 negates an operand.
// Warp w of the warpgroup (w = warp % 4) owns rows 16w..16w+15 of D, lane l's register i
// holding
//
//	row = 16w + l/4 + 8*((i/2)%2),  col = 8*(i/4) + 2*(l%4) + i%2.
//
// On a GPU the MMA runs asynchronously: wgmma.fence orders register accesses before it,
// commit_group closes a group of MMAs and wait_group waits for groups to finish. Here each
// warp computes its 16 rows when all its lanes reach the instruction, like mma.sync, so the
// results are in the registers at issue and the three are no-ops. The emulator therefore
// cannot catch a kernel that reads the accumulators before wait_group, nor one that writes
// the operands with st.shared without fence.proxy.async before the MMA.
//
// As in mma.go, the products are exact in float64 and the sum is formed there too, then
// rounded once to f32; the tensor cores' own accumulation may differ in the last bits.

// Bits of inst.mode for wgmma: which operands imm-scale negates.
const (
	wgNegA uint8 = 1 << iota
	wgNegB
)

// wgmma decodes the wgmma forms (pinned by ptx.Validate). fence, commit_group and
// wait_group become no-ops (see above); mma_async keeps its accumulator slots in frag, the
// descriptors in a and b, scale-d in c.
func (d *decoder) wgmma(in *inst, o ptx.Opcode, args []ptx.Operand) error {
	if !o.Has("mma_async") {
		in.op = cNop
		return nil
	}
	if len(args) != 8 {
		return fmt.Errorf("wgmma.mma_async takes 8 operands, has %d", len(args))
	}
	acc, ok := args[0].(ptx.Vec)
	if !ok || len(acc) < 4 || len(acc) > 128 {
		return fmt.Errorf("wgmma.mma_async needs a vector of 4..128 accumulators")
	}
	for _, r := range acc {
		in.frag = append(in.frag, d.slot(r))
	}
	var err error
	if in.a, err = d.value(args[1], ptx.U64); err != nil {
		return fmt.Errorf("operand 1: %w", err)
	}
	if in.b, err = d.value(args[2], ptx.U64); err != nil {
		return fmt.Errorf("operand 2: %w", err)
	}
	if in.c, err = d.value(args[3], ptx.Pred); err != nil {
		return fmt.Errorf("operand 3: %w", err)
	}
	for j, neg := range []uint8{wgNegA, wgNegB} {
		switch args[4+j] {
		case ptx.Imm(-1):
			in.mode |= neg
		case ptx.Imm(1):
		default:
			return fmt.Errorf("operand %d: imm-scale must be 1 or -1", 4+j)
		}
	}
	if args[6] != ptx.Imm(0) || args[7] != ptx.Imm(0) {
		return fmt.Errorf("only K-major operands (imm-trans-a = imm-trans-b = 0) are supported")
	}
	return nil
}

// wgmmaD maps lane's accumulator register i to its (row, col) in D, row counted from the
// warp's first row (16w).
func wgmmaD(lane, i int) (int, int) {
	return lane>>2 + 8*(i>>1&1), 8*(i>>2) + 2*(lane&3) + i&1
}

// Shared-memory matrix descriptor layouts (bits 62-63).
const (
	layoutInterleave uint64 = iota // no swizzle: 8x16-byte core matrices
	layoutSwizzle128
	layoutSwizzle64
	layoutSwizzle32
)

var layoutNames = [...]string{"no swizzle", "the 128-byte swizzle", "the 64-byte swizzle", "the 32-byte swizzle"}

// descReserved are the descriptor bits PTX leaves reserved: set, they mean a misencoded
// descriptor rather than a feature.
const descReserved = 3<<14 | 3<<30 | 7<<46 | 0x3ff<<52

// smemDesc is a decoded matrix descriptor, in bytes.
type smemDesc struct {
	raw             uint64
	start, lbo, sbo uint64
	layout          uint64
}

// decodeDesc reads a descriptor: start address, leading- and stride-dimension byte offsets
// (each 14 bits of the value >> 4), base offset and layout. Only base offset 0 and the
// layouts none and 128-byte swizzle are modelled; the others are errors, not guesses.
func decodeDesc(v uint64) (smemDesc, error) {
	d := smemDesc{raw: v, start: v & 0x3fff << 4, lbo: v >> 16 & 0x3fff << 4, sbo: v >> 32 & 0x3fff << 4, layout: v >> 62}
	if base := v >> 49 & 7; base != 0 {
		return d, fmt.Errorf("base offset %d is not supported (only 0: the swizzle pattern starts at a 1024-byte boundary)", base)
	}
	if r := v & descReserved; r != 0 {
		return d, fmt.Errorf("reserved bits 0x%x are set", r)
	}
	if d.layout != layoutInterleave && d.layout != layoutSwizzle128 {
		return d, fmt.Errorf("layout %d (%s) is not supported (only 0, no swizzle, and 1, the 128-byte swizzle)", d.layout, layoutNames[d.layout])
	}
	return d, nil
}

// addr is the shared address of element (row, k), k < 16, of a K-major bf16 operand.
// Under the 128-byte swizzle a row of 8 is 128 bytes, groups of 8 rows are SBO apart, and the
// 16-byte chunk holding an address moves by its bits 4-6 XORed with bits 7-9 (the layout a
// swizzled tensor copy writes; a k-step inside the 128-byte row adds 32 to the start). With
// no swizzle the operand is made of 8-row x 16-byte core matrices, 128 contiguous bytes each,
// SBO apart along the rows and LBO apart along k.
func (d smemDesc) addr(row, k int) uint64 {
	r, kk := uint64(row), uint64(k)
	if d.layout == layoutSwizzle128 {
		lin := d.start + r/8*d.sbo + r%8*128 + 2*kk
		return lin ^ (lin>>7&7)<<4
	}
	return d.start + r/8*d.sbo + kk/8*d.lbo + r%8*16 + kk%8*2
}

// wgmmaRows reads rows row0..row0+len(dst)-1 of the operand that desc describes, naming the
// operand in errors.
func (b *block) wgmmaRows(dst [][16]float64, desc uint64, row0 int, which string) error {
	d, err := decodeDesc(desc)
	if err != nil {
		return fmt.Errorf("wgmma operand %s: descriptor 0x%016x: %w", which, desc, err)
	}
	for i := range dst {
		for k := range 16 {
			p, err := b.sharedSpan(d.addr(row0+i, k), 2, 2, false)
			if err != nil {
				return fmt.Errorf("wgmma operand %s (descriptor 0x%016x) row %d k %d: %w", which, desc, row0+i, k, err)
			}
			dst[i][k] = float64(math.Float32frombits(uint32(binary.LittleEndian.Uint16(p)) << 16))
		}
	}
	return nil
}

// wgmma resolves the wgmma.mma_async at pc, which every lane of the warp [lo,hi) waits on:
// the warp computes its 16 rows of D. The instruction is .aligned: the warp must be whole,
// every lane must execute it with the same descriptors and scale-d, and the block must hold
// the warp's whole warpgroup. (That the other three warps execute it too is not checked:
// each warp resolves on its own.)
func (b *block) wgmma(lo, hi int, pc int32) error {
	in := &b.p.code[pc]
	for t := lo; t < hi; t++ {
		if b.state[t] != stShfl || hi-lo != 32 {
			return b.errorAt(lo, pc, fmt.Errorf("wgmma.mma_async.sync.aligned needs all 32 lanes of the warp, %d of %d are here", b.waiting(lo, hi), 32))
		}
	}
	if g := lo / 128; b.n < 128*(g+1) {
		return b.errorAt(lo, pc, fmt.Errorf("wgmma needs the 4 warps of warpgroup %d (threads %d..%d); the block has %d threads", g, 128*g, 128*g+127, b.n))
	}
	r0 := b.threadRegs(lo)
	da, db, sd := rv(r0, in.a), rv(r0, in.b), rv(r0, in.c)&1
	for t := lo + 1; t < hi; t++ {
		r := b.threadRegs(t)
		if a, bb, s := rv(r, in.a), rv(r, in.b), rv(r, in.c)&1; a != da || bb != db || s != sd {
			return b.errorAt(t, pc, fmt.Errorf("descriptors 0x%016x, 0x%016x and scale-d %d differ from lane 0's 0x%016x, 0x%016x and %d: wgmma's operands must be the same in every lane", a, bb, s, da, db, sd))
		}
	}
	w := lo / 32 % 4
	n := 2 * len(in.frag)
	var A [16][16]float64
	var B [256][16]float64
	if err := b.wgmmaRows(A[:], da, 16*w, "A"); err != nil {
		return b.errorAt(lo, pc, err)
	}
	if err := b.wgmmaRows(B[:n], db, 0, "B"); err != nil {
		return b.errorAt(lo, pc, err)
	}
	sign := 1.0
	if in.mode&wgNegA != 0 {
		sign = -sign
	}
	if in.mode&wgNegB != 0 {
		sign = -sign
	}
	for lane := range 32 {
		t := lo + lane
		r := b.threadRegs(t)
		for i, s := range in.frag {
			row, col := wgmmaD(lane, i)
			dot := 0.0
			for k := range 16 {
				dot += A[row][k] * B[col][k]
			}
			acc := 0.0
			if sd != 0 {
				acc = float64(math.Float32frombits(uint32(r[s])))
			}
			r[s] = uint64(math.Float32bits(float32(acc + sign*dot)))
		}
		b.state[t] = stRun
		b.pc[t]++
	}
	return nil
}
