package emu

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/bits"

	"xmix/ptx"
)

// Registers hold raw bits in a uint64. Writers may leave junk above a value's width, so
// every reader masks or sign-extends to the width of the type it reads with.

func width(t ptx.Type) int {
	if t == ptx.Pred {
		return 1
	}
	return t.Bits()
}

func mask(t ptx.Type) uint64 {
	if w := width(t); w < 64 {
		return 1<<w - 1
	}
	return math.MaxUint64
}

func isFloat(t ptx.Type) bool { return t == ptx.F32 || t == ptx.F64 }

func isSigned(t ptx.Type) bool {
	return t == ptx.S8 || t == ptx.S16 || t == ptx.S32 || t == ptx.S64
}

func sx(v uint64, w int) int64 { return int64(v<<(64-w)) >> (64 - w) }

// getF reads a float operand of type t (f32, f64, f16 or bf16) as float64, exactly.
func getF(t ptx.Type, v uint64) float64 {
	switch t {
	case ptx.F32:
		return float64(math.Float32frombits(uint32(v)))
	case ptx.BF16:
		return float64(math.Float32frombits(uint32(uint16(v)) << 16))
	case ptx.F16:
		return float64(f16ToF32(uint16(v)))
	}
	return math.Float64frombits(v)
}

// putF rounds x to type t. Sums, products, quotients and square roots of f32 values computed
// in float64 and rounded once to f32 are correctly rounded, so this matches f32 hardware.
func putF(t ptx.Type, x float64) uint64 {
	switch t {
	case ptx.F32:
		return uint64(math.Float32bits(float32(x)))
	case ptx.BF16:
		return uint64(f32ToBF16(float32(x)))
	case ptx.F16:
		return uint64(f32ToF16(float32(x)))
	}
	return math.Float64bits(x)
}

// putFRounded rounds x to float type t as cvt's .rn, .rz, .rm or .rp (mode) does: the nearest
// value of t, or where that lies past x in the wrong direction the next one toward x (one unit
// less in magnitude where it is farther from zero than x, else one more; the sign bit is the
// top one, so that is the bits minus or plus one).
func putFRounded(t ptx.Type, x float64, mode uint8) uint64 {
	r := putF(t, x)
	v := getF(t, r)
	if mode == rndNearest || math.IsNaN(x) || v == x {
		return r
	}
	if mode == rndZero && math.Abs(v) < math.Abs(x) || mode == rndDown && v < x || mode == rndUp && v > x {
		return r
	}
	if math.Abs(v) > math.Abs(x) {
		return r - 1
	}
	return r + 1
}

var errDivZero = errors.New("integer division by zero")

// alu computes the result of every instruction that only reads and writes registers.
func alu(in *inst, r []uint64) (uint64, error) {
	t := in.t
	a, b := rv(r, in.a), rv(r, in.b)
	m, w := in.m, int(in.w)
	if in.flt {
		x, y := getF(t, a), getF(t, b)
		switch in.op {
		case cMov:
			return a & m, nil
		case cAdd:
			return putF(t, x+y), nil
		case cSub:
			return putF(t, x-y), nil
		case cMul:
			return putF(t, x*y), nil
		case cMad, cFma:
			return putF(t, math.FMA(x, y, getF(t, rv(r, in.c)))), nil
		case cDiv:
			return putF(t, x/y), nil
		case cMin, cMax:
			return fminmax(t, in.op == cMax, a, b, x, y), nil
		case cNeg:
			return (a ^ (m>>1 + 1)) & m, nil
		case cAbs:
			return a & (m >> 1), nil
		case cSqrt:
			return putF(t, math.Sqrt(x)), nil
		case cRsqrt:
			return putF(t, 1/math.Sqrt(x)), nil
		case cRcp:
			return putF(t, 1/x), nil
		case cEx2:
			return putF(t, math.Exp2(x)), nil
		case cLg2:
			return putF(t, math.Log2(x)), nil
		case cSin:
			return putF(t, math.Sin(x)), nil
		case cCos:
			return putF(t, math.Cos(x)), nil
		case cTanh:
			return putF(t, math.Tanh(x)), nil
		case cSetp:
			return setp(in, compareF(in.mode, x, y), r), nil
		case cSelp:
			return sel(in, r, a, b) & m, nil
		case cCvt:
			return cvt(in, a), nil
		case cCvtPack:
			// The first source goes to the upper half (PTX ISA, cvt: "the value converted
			// from input a is stored in the upper half of d").
			return putFRounded(ptx.BF16, x, in.mode)<<16 | putFRounded(ptx.BF16, y, in.mode), nil
		}
		return 0, fmt.Errorf("not supported for type .%s", t)
	}
	switch in.op {
	case cMov:
		return a & m, nil
	case cAdd:
		return (a + b) & m, nil
	case cSub:
		return (a - b) & m, nil
	case cMul:
		return (a * b) & m, nil
	case cMad:
		return (a*b + rv(r, in.c)) & m, nil
	case cMulHi, cMadHi:
		v := mulHi(t, a, b)
		if in.op == cMadHi {
			v += rv(r, in.c)
		}
		return v & m, nil
	case cMulWide, cMadWide:
		wm := mask(wideOf(t))
		v := (a & m) * (b & m)
		if in.sgn {
			v = uint64(sx(a, w) * sx(b, w))
		}
		if in.op == cMadWide {
			v += rv(r, in.c)
		}
		return v & wm, nil
	case cDiv, cRem:
		if b&m == 0 {
			return 0, errDivZero
		}
		if in.sgn {
			x, y := sx(a, w), sx(b, w)
			if in.op == cDiv {
				return uint64(x/y) & m, nil
			}
			return uint64(x%y) & m, nil
		}
		if in.op == cDiv {
			return (a & m) / (b & m), nil
		}
		return (a & m) % (b & m), nil
	case cMin, cMax:
		less := a&m < b&m
		if in.sgn {
			less = sx(a, w) < sx(b, w)
		}
		if less == (in.op == cMin) {
			return a & m, nil
		}
		return b & m, nil
	case cNeg:
		return -a & m, nil
	case cAbs:
		if v := sx(a, w); v < 0 {
			return uint64(-v) & m, nil
		}
		return a & m, nil
	case cNot:
		return ^a & m, nil
	case cAnd:
		return a & b & m, nil
	case cOr:
		return (a | b) & m, nil
	case cXor:
		return (a ^ b) & m, nil
	case cShl:
		if n := uint32(b); n < uint32(w) {
			return (a << n) & m, nil
		}
		return 0, nil
	case cShr:
		n := uint32(b)
		if in.sgn {
			return uint64(sx(a, w)>>min(n, uint32(w-1))) & m, nil
		}
		if n < uint32(w) {
			return (a & m) >> n, nil
		}
		return 0, nil
	case cPopc:
		return uint64(bits.OnesCount64(a & m)), nil
	case cClz:
		return uint64(bits.LeadingZeros64(a&m) - (64 - w)), nil
	case cSetp:
		return setp(in, compareI(in, a, b), r), nil
	case cSelp:
		return sel(in, r, a, b) & m, nil
	case cCvt:
		return cvt(in, a), nil
	case cPack:
		h := uint(w / 2)
		return (a&(1<<h-1) | b<<h) & m, nil
	case cPrmt:
		return prmt(a, b, rv(r, in.c)), nil
	}
	return 0, fmt.Errorf("not supported for type .%s", t)
}

// prmt is PTX's default-mode byte permute: byte i of the result is byte s of {b, a} (a bytes
// 0-3, b bytes 4-7), s the low three bits of selector nibble i, or that byte's sign bit
// replicated when the nibble's high bit is set.
func prmt(a, b, sel uint64) uint64 {
	src := b<<32 | a&0xFFFFFFFF
	var d uint64
	for i := range 4 {
		n := sel >> (4 * i) & 0xF
		x := src >> (8 * (n & 7)) & 0xFF
		if n&8 != 0 {
			x = 0
			if src>>(8*(n&7)+7)&1 != 0 {
				x = 0xFF
			}
		}
		d |= x << (8 * i)
	}
	return d
}

func sel(in *inst, r []uint64, a, b uint64) uint64 {
	if rv(r, in.c)&1 != 0 {
		return a
	}
	return b
}

func mulHi(t ptx.Type, a, b uint64) uint64 {
	w := width(t)
	if w == 64 {
		hi, _ := bits.Mul64(a, b)
		if isSigned(t) {
			// The signed high word differs from the unsigned one by the operands' sign terms.
			if int64(a) < 0 {
				hi -= b
			}
			if int64(b) < 0 {
				hi -= a
			}
		}
		return hi
	}
	if isSigned(t) {
		return uint64((sx(a, w) * sx(b, w)) >> w)
	}
	m := mask(t)
	return ((a & m) * (b & m)) >> w
}

// fminmax follows PTX min/max: a NaN operand yields the other one, and -0 is below +0.
func fminmax(t ptx.Type, isMax bool, a, b uint64, x, y float64) uint64 {
	switch {
	case math.IsNaN(x):
		return b & mask(t)
	case math.IsNaN(y):
		return a & mask(t)
	case x == y:
		// Equal values differ only in the sign of zero: min takes the negative one.
		if (math.Signbit(x) && !isMax) || (!math.Signbit(x) && isMax) {
			return a & mask(t)
		}
		return b & mask(t)
	case (x < y) != isMax:
		return a & mask(t)
	}
	return b & mask(t)
}

func setp(in *inst, v bool, r []uint64) uint64 {
	if in.bop != boolNone {
		c := rv(r, in.c)&1 != 0
		switch in.bop {
		case boolAnd:
			v = v && c
		case boolOr:
			v = v || c
		case boolXor:
			v = v != c
		}
	}
	if v {
		return 1
	}
	return 0
}

// compareF is IEEE: ordered comparisons are false when either side is NaN, the unordered
// forms (equ, ltu, ...) true.
func compareF(mode uint8, x, y float64) bool {
	nan := math.IsNaN(x) || math.IsNaN(y)
	switch mode {
	case cmpEq:
		return !nan && x == y
	case cmpNe:
		return !nan && x != y
	case cmpLt, cmpLo:
		return !nan && x < y
	case cmpLe, cmpLs:
		return !nan && x <= y
	case cmpGt, cmpHi:
		return !nan && x > y
	case cmpGe, cmpHs:
		return !nan && x >= y
	case cmpEqu:
		return nan || x == y
	case cmpNeu:
		return nan || x != y
	case cmpLtu:
		return nan || x < y
	case cmpLeu:
		return nan || x <= y
	case cmpGtu:
		return nan || x > y
	case cmpGeu:
		return nan || x >= y
	case cmpNum:
		return !nan
	}
	return nan
}

func compareI(in *inst, a, b uint64) bool {
	m, w := in.m, int(in.w)
	ua, ub := a&m, b&m
	var sa, sb int64
	if in.sgn {
		sa, sb = sx(a, w), sx(b, w)
	} else {
		// Unsigned order: flip the top bit so signed comparison orders them as unsigned.
		sa, sb = int64(ua^1<<63), int64(ub^1<<63)
	}
	switch in.mode {
	case cmpEq:
		return ua == ub
	case cmpNe:
		return ua != ub
	case cmpLt:
		return sa < sb
	case cmpLe:
		return sa <= sb
	case cmpGt:
		return sa > sb
	case cmpGe:
		return sa >= sb
	case cmpLo:
		return ua < ub
	case cmpLs:
		return ua <= ub
	case cmpHi:
		return ua > ub
	case cmpHs:
		return ua >= ub
	}
	return false
}

func isFloatish(t ptx.Type) bool { return isFloat(t) || t == ptx.F16 || t == ptx.BF16 }

// cvt converts a from in.t2 to in.t.
func cvt(in *inst, a uint64) uint64 {
	dst, src := in.t, in.t2
	if isFloatish(src) {
		x := getF(src, a)
		if in.bop != 0 || !isFloatish(dst) {
			x = roundInt(in.mode, x)
		}
		if isFloatish(dst) {
			if in.sat {
				x = math.Max(0, math.Min(1, x))
			}
			if in.bop != 0 {
				return putF(dst, x) // an integer already: .rni and the like
			}
			return putFRounded(dst, x, in.mode)
		}
		return floatToInt(dst, x)
	}
	var x float64
	v := a & mask(src)
	if isSigned(src) {
		v = uint64(sx(a, width(src)))
		x = float64(int64(v))
	} else {
		x = float64(v)
	}
	if isFloatish(dst) {
		// float64 is exact below 2^53; int64->float32 must round once, not twice.
		if dst == ptx.F32 {
			if isSigned(src) {
				return uint64(math.Float32bits(float32(int64(v))))
			}
			return uint64(math.Float32bits(float32(v)))
		}
		return putF(dst, x)
	}
	return v & mask(dst)
}

func roundInt(mode uint8, x float64) float64 {
	switch mode {
	case rndZero:
		return math.Trunc(x)
	case rndDown:
		return math.Floor(x)
	case rndUp:
		return math.Ceil(x)
	}
	return math.RoundToEven(x)
}

// floatToInt saturates as PTX does: out-of-range values clamp, NaN becomes 0.
func floatToInt(t ptx.Type, x float64) uint64 {
	w := width(t)
	if math.IsNaN(x) {
		return 0
	}
	if isSigned(t) {
		lim := math.Ldexp(1, w-1)
		switch {
		case x >= lim:
			return uint64(1<<(w-1)-1) & mask(t)
		case x < -lim:
			return uint64(1) << (w - 1) & mask(t)
		}
		return uint64(int64(x)) & mask(t)
	}
	switch {
	case x <= 0:
		return 0
	case x >= math.Ldexp(1, w):
		return mask(t)
	}
	return uint64(x) & mask(t)
}

// f32ToBF16 rounds to nearest even, keeping NaNs NaN (same as ops.F32ToBF16).
func f32ToBF16(f float32) uint16 {
	b := math.Float32bits(f)
	if b&0x7fffffff > 0x7f800000 {
		return uint16(b>>16) | 0x40
	}
	return uint16((b + 0x7fff + (b>>16)&1) >> 16)
}

func f16ToF32(h uint16) float32 {
	sign := uint32(h>>15) << 31
	exp, man := uint32(h>>10)&0x1f, uint32(h&0x3ff)
	switch exp {
	case 0:
		f := float32(man) / (1 << 24)
		if sign != 0 {
			f = -f
		}
		return f
	case 31:
		return math.Float32frombits(sign | 0x7f800000 | man<<13)
	}
	return math.Float32frombits(sign | (exp+112)<<23 | man<<13)
}

// f32ToF16 rounds to nearest even; float64 holds every step exactly.
func f32ToF16(f float32) uint16 {
	sign := uint16(math.Float32bits(f)>>16) & 0x8000
	x := math.Abs(float64(f))
	switch {
	case math.IsNaN(x):
		return sign | 0x7e00
	case x >= 65520: // halfway between the largest half, 65504, and 2^16 rounds up to inf
		return sign | 0x7c00
	case x < math.Ldexp(1, -14):
		// Subnormal: units of 2^-24; rounding up to 1024 lands on the smallest normal.
		return sign | uint16(math.RoundToEven(x*(1<<24)))
	}
	_, e := math.Frexp(x) // x = frac * 2^e, frac in [0.5, 1)
	e--
	mant := math.RoundToEven(math.Ldexp(x, 10-e))
	if mant == 2048 {
		mant, e = 1024, e+1
	}
	return sign | uint16(e+15)<<10 | uint16(mant-1024)
}

// access returns the bytes of in's memory operand: n bytes, naturally aligned.
func (b *block) access(in *inst, r []uint64, n int) ([]byte, error) {
	addr := rv(r, in.base) + uint64(in.off)
	if in.space != spGlobal {
		addr &= 0xffffffff
		if addr%uint64(n) == 0 && addr+uint64(n) <= uint64(len(b.shared)) {
			return b.shared[addr : addr+uint64(n)], nil // this block's, aligned, inside
		}
		return b.sharedSpan(addr, n, n, in.space == spCluster)
	}
	return b.mem.span(addr, n, n, &b.last)
}

func elemBytes(t ptx.Type) int { return max(t.Bytes(), 1) }

func getMem(t ptx.Type, p []byte) uint64 {
	var v uint64
	switch len(p) {
	case 1:
		v = uint64(p[0])
	case 2:
		v = uint64(binary.LittleEndian.Uint16(p))
	case 4:
		v = uint64(binary.LittleEndian.Uint32(p))
	default:
		v = binary.LittleEndian.Uint64(p)
	}
	if isSigned(t) {
		return uint64(sx(v, 8*len(p)))
	}
	return v
}

func putMem(p []byte, v uint64) {
	switch len(p) {
	case 1:
		p[0] = byte(v)
	case 2:
		binary.LittleEndian.PutUint16(p, uint16(v))
	case 4:
		binary.LittleEndian.PutUint32(p, uint32(v))
	default:
		binary.LittleEndian.PutUint64(p, v)
	}
}

// load runs ld; early says the thread has not yet waited for the grid ahead, so that a
// global load is recorded where the memory records (Memory.EarlyLoads).
func (b *block) load(in *inst, r []uint64, early bool) error {
	es := elemBytes(in.t)
	p, err := b.access(in, r, es*int(in.nvec))
	if err != nil {
		return err
	}
	if early && in.space == spGlobal {
		b.mem.loadEarly(rv(r, in.base)+uint64(in.off), es*int(in.nvec))
	}
	for i := range int(in.nvec) {
		r[in.d[i]] = getMem(in.t, p[i*es:(i+1)*es])
	}
	return nil
}

func (b *block) prefetch(in *inst, r []uint64) error {
	return b.mem.prefetch(rv(r, in.base) + uint64(in.off))
}

func (b *block) store(in *inst, r []uint64) error {
	es := elemBytes(in.t)
	if in.nvec == 0 {
		p, err := b.access(in, r, es)
		if err == nil {
			putMem(p, rv(r, in.a))
		}
		return err
	}
	p, err := b.access(in, r, es*int(in.nvec))
	if err != nil {
		return err
	}
	for i := range int(in.nvec) {
		putMem(p[i*es:(i+1)*es], r[in.d[i]])
	}
	return nil
}

// atomic performs atom/red. Global atomics hold the run-wide lock, so that blocks running in
// parallel see each read-modify-write whole; shared ones need none since a block runs on
// one goroutine.
func (b *block) atomic(in *inst, r []uint64) error {
	t := in.t
	p, err := b.access(in, r, elemBytes(t))
	if err != nil {
		return err
	}
	if in.space == spGlobal {
		b.atomMu.Lock()
		defer b.atomMu.Unlock()
	}
	old := getMem(t, p) & mask(t)
	x, y := rv(r, in.a)&mask(t), rv(r, in.b)&mask(t)
	var v uint64
	switch in.mode {
	case atomAdd:
		v = old + x
		if isFloat(t) {
			v = putF(t, getF(t, old)+getF(t, x))
		}
	case atomMin, atomMax:
		tmp := *in
		tmp.op, tmp.a, tmp.b = cMin, opnd{reg: 0}, opnd{reg: 1}
		if in.mode == atomMax {
			tmp.op = cMax
		}
		v, _ = alu(&tmp, []uint64{old, x})
		if isFloat(t) {
			v = fminmax(t, in.mode == atomMax, old, x, getF(t, old), getF(t, x))
		}
	case atomExch:
		v = x
	case atomCas:
		v = old
		if old == x {
			v = y
		}
	case atomAnd:
		v = old & x
	case atomOr:
		v = old | x
	case atomXor:
		v = old ^ x
	case atomInc:
		v = old + 1
		if old >= x {
			v = 0
		}
	case atomDec:
		v = old - 1
		if old == 0 || old > x {
			v = x
		}
	}
	putMem(p, v&mask(t))
	if in.hasDst {
		r[in.d[0]] = old
	}
	return nil
}
