package emu

import (
	"encoding/binary"
	"errors"
	"fmt"

	"xmix/ptx"
)

// The Hopper copy-engine instructions: mbarriers, bulk and tensor copies into shared memory,
// and mapa for the shared memory of the other blocks of a cluster. Copies happen whole at
// issue; an mbarrier waiter blocks (try_wait) until its phase completes.

// clusterShift is where mapa puts the target block's rank (plus one) in a shared address;
// the bits below it are the offset in that block's shared memory.
const clusterShift = 24

// async decodes mbarrier, cp.async.bulk[.tensor] and mapa (their forms are pinned by
// ptx.Validate).
func (d *decoder) async(in *inst, o ptx.Opcode, args []ptx.Operand) error {
	var err error
	switch in.op {
	case cMbarInit:
		switch {
		case o.Has("init"):
			if err := d.addr(in, args[0], o); err != nil {
				return err
			}
			in.a, err = d.value(args[1], ptx.U32)
			return err
		case o.Has("arrive"):
			in.op = cMbarArrive
			in.a = opnd{reg: -1}
			if o.Has("expect_tx") {
				if in.a, err = d.value(args[2], ptx.U32); err != nil {
					return err
				}
			}
		case o.Has("try_wait"):
			in.op = cMbarWait
			if in.a, err = d.value(args[2], ptx.U32); err != nil {
				return err
			}
		default:
			return fmt.Errorf("unsupported mbarrier form")
		}
		// An arrival on another CTA's mbarrier returns no state (its destination is the sink).
		if args[0] != ptx.Sink {
			if err := d.dst(in, args[0]); err != nil {
				return err
			}
		}
		return d.addr(in, args[1], o)
	case cBulk:
		in.ext = &asyncArgs{}
		if err := d.addr(in, args[0], o); err != nil {
			return err
		}
		mb := args[len(args)-1]
		if o.Has("multicast::cluster") {
			in.ext.multicast = true
			if in.ext.mask, err = d.value(mb, ptx.U16); err != nil {
				return err
			}
			mb = args[2]
		}
		if in.ext.mbar, in.ext.mbarOff, err = d.addrOf(mb); err != nil {
			return err
		}
		if o.Has("tensor") {
			in.op = cTensor
			ta, ok := args[1].(ptx.TensorAddr)
			if !ok || len(ta.Coords) != 2 {
				return fmt.Errorf("tensor copy needs a [map, {c0, c1}] source")
			}
			if in.ext.src, err = d.value(ta.Map, ptx.U64); err != nil {
				return err
			}
			for i, c := range ta.Coords {
				in.ext.coords[i] = opnd{reg: d.slot(c)}
			}
			return nil
		}
		if in.ext.src, in.ext.srcOff, err = d.addrOf(args[1]); err != nil {
			return err
		}
		in.a, err = d.value(args[2], ptx.U32)
		return err
	case cMapa:
		if err := d.dst(in, args[0]); err != nil {
			return err
		}
		if in.a, err = d.value(args[1], ptx.U32); err != nil {
			return err
		}
		in.b, err = d.value(args[2], ptx.U32)
		return err
	}
	return fmt.Errorf("unsupported instruction")
}

// addrOf decodes a further memory operand [base+off].
func (d *decoder) addrOf(a ptx.Operand) (opnd, int64, error) {
	ad, ok := a.(ptx.Addr)
	if !ok {
		return opnd{}, 0, fmt.Errorf("expected an address operand")
	}
	base, err := d.value(ad.Base, ptx.U64)
	return base, ad.Offset, err
}

// sharedSpan returns the n shared bytes at addr, aligned to align. A cluster address (from
// mapa) names another block's shared memory and is only valid where cluster is set.
func (b *block) sharedSpan(addr uint64, n, align int, cluster bool) ([]byte, error) {
	addr &= 0xffffffff
	mem := b.shared
	if tag := addr >> clusterShift; tag != 0 {
		if !cluster {
			return nil, fmt.Errorf("shared access at 0x%x uses a cluster address (from mapa): it needs .shared::cluster", addr)
		}
		if int(tag) > len(b.cl.blocks) {
			return nil, fmt.Errorf("cluster address 0x%x names rank %d of a %d-block cluster", addr, tag-1, len(b.cl.blocks))
		}
		mem = b.cl.blocks[tag-1].shared
		addr &= 1<<clusterShift - 1
	}
	if addr%uint64(align) != 0 {
		return nil, fmt.Errorf("misaligned %d-byte shared access at 0x%x (needs %d-byte alignment)", n, addr, align)
	}
	if addr+uint64(n) > uint64(len(mem)) {
		return nil, fmt.Errorf("shared access of %d bytes at 0x%x is outside the %d-byte shared window", n, addr, len(mem))
	}
	return mem[addr : addr+uint64(n)], nil
}

// async runs mbarrier.init/arrive, the bulk copies and mapa.
func (b *block) async(in *inst, r []uint64) error {
	switch in.op {
	case cMbarInit:
		p, err := b.sharedSpan(rv(r, in.base)+uint64(in.off), 8, 8, in.space == spCluster)
		if err != nil {
			return err
		}
		n := uint32(rv(r, in.a))
		if n < 1 || n > maxArrivals {
			return fmt.Errorf("mbarrier.init with count %d (want 1..%d)", n, maxArrivals)
		}
		binary.LittleEndian.PutUint64(p, mbar{pending: n, expected: n}.encode())
	case cMbarArrive:
		p, err := b.sharedSpan(rv(r, in.base)+uint64(in.off), 8, 8, in.space == spCluster)
		if err != nil {
			return err
		}
		old := binary.LittleEndian.Uint64(p)
		m, err := decodeMbar(old)
		if err != nil {
			return err
		}
		if err := m.addTx(int64(uint32(rv(r, in.a)))); err != nil {
			return err
		}
		if m.pending == 0 {
			return errors.New("mbarrier arrival beyond its expected count in this phase")
		}
		m.pending--
		m.complete()
		binary.LittleEndian.PutUint64(p, m.encode())
		if in.hasDst {
			r[in.d[0]] = old
		}
	case cBulk:
		return b.bulkCopy(in, r)
	case cTensor:
		return b.tensorCopy(in, r)
	case cMapa:
		addr, rank := rv(r, in.a)&(1<<clusterShift-1), uint32(rv(r, in.b))
		if int(rank) >= len(b.cl.blocks) {
			return fmt.Errorf("mapa to rank %d of a %d-block cluster", rank, len(b.cl.blocks))
		}
		if addr > uint64(len(b.shared)) {
			return fmt.Errorf("mapa of 0x%x, outside the %d-byte shared window", addr, len(b.shared))
		}
		r[in.d[0]] = uint64(rank+1)<<clusterShift | addr
	}
	return nil
}

// mbarWait is try_wait.parity: whether the phase of the given parity has completed (then
// the predicate is set; otherwise the thread waits).
func (b *block) mbarWait(in *inst, r []uint64) (bool, error) {
	p, err := b.sharedSpan(rv(r, in.base)+uint64(in.off), 8, 8, in.space == spCluster)
	if err != nil {
		return false, err
	}
	m, err := decodeMbar(binary.LittleEndian.Uint64(p))
	if err != nil {
		return false, err
	}
	if m.phase == uint8(rv(r, in.a)&1) {
		return false, nil
	}
	r[in.d[0]] = 1
	return true, nil
}

// completeTx counts n bytes as arrived at the mbarrier at shared address mbar (of any
// block of the cluster).
func (b *block) completeTx(mbar uint64, n int) error {
	p, err := b.sharedSpan(mbar, 8, 8, true)
	if err != nil {
		return fmt.Errorf("the copy's mbarrier: %w", err)
	}
	m, err := decodeMbar(binary.LittleEndian.Uint64(p))
	if err != nil {
		return fmt.Errorf("the copy's mbarrier: %w", err)
	}
	if err := m.addTx(-int64(n)); err != nil {
		return err
	}
	m.complete()
	binary.LittleEndian.PutUint64(p, m.encode())
	return nil
}

// bulkCopy is cp.async.bulk: size bytes from global to shared memory, both 16-byte
// aligned, then complete_tx(size) on the mbarrier.
func (b *block) bulkCopy(in *inst, r []uint64) error {
	size := int(uint32(rv(r, in.a)))
	src := rv(r, in.ext.src) + uint64(in.ext.srcOff)
	dst := rv(r, in.base) + uint64(in.off)
	switch {
	case size == 0 || size%16 != 0:
		return fmt.Errorf("bulk copy of %d bytes (want a positive multiple of 16)", size)
	case src%16 != 0:
		return fmt.Errorf("bulk copy from misaligned global address 0x%x (needs 16-byte alignment)", src)
	}
	from, err := b.mem.span(src, size, 16, &b.last)
	if err != nil {
		return err
	}
	return b.deliver(dst, rv(r, in.ext.mbar)+uint64(in.ext.mbarOff), from, 16)
}

// tensorCopy is cp.async.bulk.tensor.2d: the map's box at element (c0, c1), written densely
// row by row, then (a map with the 128-byte swizzle) each 16-byte chunk moved as the GPU
// moves it: address bits 4-6 XORed with bits 7-9, within a destination 1024-byte aligned;
// elements outside the tensor read as zero. The whole box counts toward the mbarrier, as on
// the GPU. A multicast copy writes the box to each CTA of the cluster its mask names, at the
// same shared offset, and counts it toward the mbarrier at the same offset in each.
func (b *block) tensorCopy(in *inst, r []uint64) error {
	maddr := rv(r, in.ext.src)
	if maddr%64 != 0 {
		return fmt.Errorf("tensor map at misaligned address 0x%x (needs 64-byte alignment)", maddr)
	}
	raw, err := b.mem.span(maddr, 128, 64, &b.last)
	if err != nil {
		return fmt.Errorf("tensor map: %w", err)
	}
	tm, err := readTensorMap(raw)
	if err != nil {
		return fmt.Errorf("tensor map at 0x%x: %w", maddr, err)
	}
	c0, c1 := int64(int32(rv(r, in.ext.coords[0]))), int64(int32(rv(r, in.ext.coords[1])))
	eb, rowBytes := int64(tm.elem), int64(tm.box[0]*tm.elem)
	total := int(rowBytes) * tm.box[1]
	dense := make([]byte, total)
	for i := range int64(tm.box[1]) {
		out := dense[i*rowBytes : (i+1)*rowBytes]
		row := c1 + i
		lo, hi := max(c0, 0), min(c0+int64(tm.box[0]), int64(tm.dims[0]))
		if row < 0 || row >= int64(tm.dims[1]) || lo >= hi {
			continue
		}
		from, err := b.mem.span(tm.base+uint64(row*tm.stride+lo*eb), int((hi-lo)*eb), int(eb), &b.last)
		if err != nil {
			return fmt.Errorf("tensor map's data: %w", err)
		}
		copy(out[(lo-c0)*eb:], from)
	}
	box, align := dense, 128
	if tm.swizzle != 0 {
		box, align = make([]byte, total), swizzleAlign
		for o := 0; o < total; o += 16 {
			p := o ^ (o>>7&7)<<4
			copy(box[p:p+16], dense[o:o+16])
		}
	}
	dst, mbar := rv(r, in.base)+uint64(in.off), rv(r, in.ext.mbar)+uint64(in.ext.mbarOff)
	if !in.ext.multicast {
		return b.deliver(dst, mbar, box, align)
	}
	mask := uint16(rv(r, in.ext.mask))
	if mask == 0 || int(mask)>>len(b.cl.blocks) != 0 {
		return fmt.Errorf("multicast mask 0x%x: want ranks of the %d-block cluster, at least one", mask, len(b.cl.blocks))
	}
	// The offsets within a CTA's shared memory: any rank mapa put in them is not the target.
	low := uint64(1)<<clusterShift - 1
	for rank, target := range b.cl.blocks {
		if mask&(1<<rank) != 0 {
			if err := target.deliver(dst&low, mbar&low, box, align); err != nil {
				return fmt.Errorf("multicast to rank %d: %w", rank, err)
			}
		}
	}
	return nil
}

// deliver writes a copy's bytes at shared address dst (aligned to align) and counts them
// toward the mbarrier at mbar.
func (b *block) deliver(dst, mbar uint64, data []byte, align int) error {
	to, err := b.sharedSpan(dst, len(data), align, true)
	if err != nil {
		return err
	}
	copy(to, data)
	return b.completeTx(mbar, len(data))
}

// swizzleAlign is the alignment a swizzled box's shared destination needs: the 128-byte
// swizzle's pattern repeats every 1024 bytes.
const swizzleAlign = 1024

// An mbarrier is 8 bytes of shared memory. The emulator keeps, from bit 0: the pending
// arrivals (20 bits), the expected arrivals (20 bits, 0 = not initialized), the transaction
// count (23 bits, signed) and the current phase's parity (bit 63).
type mbar struct {
	pending, expected uint32
	tx                int32
	phase             uint8
}

const (
	maxArrivals = 1<<20 - 1
	maxTx       = 1<<20 - 1
)

func decodeMbar(v uint64) (mbar, error) {
	m := mbar{
		pending:  uint32(v & maxArrivals),
		expected: uint32(v >> 20 & maxArrivals),
		tx:       int32(int64(v<<1) >> 41),
		phase:    uint8(v >> 63),
	}
	if m.expected == 0 {
		return m, errors.New("mbarrier is not initialized (mbarrier.init)")
	}
	return m, nil
}

func (m mbar) encode() uint64 {
	return uint64(m.pending) | uint64(m.expected)<<20 | uint64(uint32(m.tx))&(1<<23-1)<<40 | uint64(m.phase)<<63
}

// addTx adds n to the transaction count, which must stay within the hardware's range.
func (m *mbar) addTx(n int64) error {
	tx := int64(m.tx) + n
	if tx < -maxTx || tx > maxTx {
		return fmt.Errorf("mbarrier transaction count %d outside ±%d", tx, maxTx)
	}
	m.tx = int32(tx)
	return nil
}

// complete ends the phase once every arrival and every byte is in.
func (m *mbar) complete() {
	if m.pending == 0 && m.tx == 0 {
		m.phase ^= 1
		m.pending = m.expected
	}
}

// tensorMapMagic starts every map TensorMap2D makes.
const tensorMapMagic = "xmixTM2D"

type tensorMap struct {
	base    uint64
	dims    [2]int
	stride  int64
	box     [2]int
	elem    int
	swizzle int
}

// TensorMap2D encodes a 2-D tensor map in the emulator's own 128-byte format, the
// stand-in for the driver's cuTensorMapEncodeTiled: a tensor of dims[1] rows of dims[0]
// elements of elemBytes each at base (16-byte aligned), rows rowStride bytes apart (a
// multiple of 16), copied in boxes of box[0] elements by box[1] rows (each 1..256, a box row
// a multiple of 16 bytes), swizzled in shared memory when swizzle is 128 (the driver's
// CU_TENSOR_MAP_SWIZZLE_128B, for box rows of exactly 128 bytes) and written densely when it
// is 0. Store it in global memory, 64-byte aligned, and pass its address to
// cp.async.bulk.tensor.
func TensorMap2D(base uint64, dims [2]int, rowStride int, box [2]int, elemBytes, swizzle int) ([128]byte, error) {
	var out [128]byte
	tm := tensorMap{base: base, dims: dims, stride: int64(rowStride), box: box, elem: elemBytes, swizzle: swizzle}
	if err := tm.check(); err != nil {
		return out, fmt.Errorf("emu: TensorMap2D: %w", err)
	}
	copy(out[:8], tensorMapMagic)
	le := binary.LittleEndian
	le.PutUint64(out[8:], base)
	le.PutUint32(out[16:], uint32(dims[0]))
	le.PutUint32(out[20:], uint32(dims[1]))
	le.PutUint64(out[24:], uint64(rowStride))
	le.PutUint32(out[32:], uint32(box[0]))
	le.PutUint32(out[36:], uint32(box[1]))
	le.PutUint32(out[40:], uint32(elemBytes))
	le.PutUint32(out[44:], uint32(swizzle))
	return out, nil
}

func (tm tensorMap) check() error {
	switch {
	case tm.elem != 1 && tm.elem != 2 && tm.elem != 4 && tm.elem != 8:
		return fmt.Errorf("element size %d (want 1, 2, 4 or 8)", tm.elem)
	case tm.base%16 != 0:
		return fmt.Errorf("base 0x%x is not 16-byte aligned", tm.base)
	case tm.dims[0] < 1 || tm.dims[1] < 1 || tm.dims[0] > 1<<31-1 || tm.dims[1] > 1<<31-1:
		return fmt.Errorf("dimensions %v (want 1..2^31-1 each)", tm.dims)
	case tm.stride%16 != 0 || tm.stride < int64(tm.dims[0]*tm.elem) || tm.stride >= 1<<40:
		return fmt.Errorf("row stride %d (want a multiple of 16, at least a row's %d bytes)", tm.stride, tm.dims[0]*tm.elem)
	case tm.box[0] < 1 || tm.box[1] < 1 || tm.box[0] > 256 || tm.box[1] > 256:
		return fmt.Errorf("box %v (want 1..256 each)", tm.box)
	case tm.box[0]*tm.elem%16 != 0:
		return fmt.Errorf("box row of %d bytes (want a multiple of 16)", tm.box[0]*tm.elem)
	case tm.swizzle != 0 && tm.swizzle != 128:
		return fmt.Errorf("swizzle %d (want 0 or 128 bytes)", tm.swizzle)
	case tm.swizzle != 0 && tm.box[0]*tm.elem != tm.swizzle:
		// The driver takes shorter rows too; how it lays them out is not modelled here.
		return fmt.Errorf("box row of %d bytes under the %d-byte swizzle (want exactly %d)", tm.box[0]*tm.elem, tm.swizzle, tm.swizzle)
	}
	return nil
}

func readTensorMap(raw []byte) (tensorMap, error) {
	if string(raw[:8]) != tensorMapMagic {
		return tensorMap{}, errors.New("not a map made by emu.TensorMap2D (bad magic)")
	}
	le := binary.LittleEndian
	tm := tensorMap{
		base:    le.Uint64(raw[8:]),
		dims:    [2]int{int(le.Uint32(raw[16:])), int(le.Uint32(raw[20:]))},
		stride:  int64(le.Uint64(raw[24:])),
		box:     [2]int{int(le.Uint32(raw[32:])), int(le.Uint32(raw[36:]))},
		elem:    int(le.Uint32(raw[40:])),
		swizzle: int(le.Uint32(raw[44:])),
	}
	if err := tm.check(); err != nil {
		return tm, fmt.Errorf("corrupt: %w", err)
	}
	return tm, nil
}
