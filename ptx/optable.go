package ptx

import (
	"fmt"
	"strings"
)

// Opcode is an opcode split at its dots: "cvt.rn.bf16.f32" has Base "cvt", Mods ["rn"] and
// Types [BF16, F32]. Parts that name a PTX type are types, everything else is a modifier;
// both keep their order.
type Opcode struct {
	Base  string
	Mods  []string
	Types []Type
}

// ParseOpcode splits op into its base, modifiers and type suffixes. It never fails: whether
// the parts make sense is Validate's business.
func ParseOpcode(op string) Opcode {
	parts := strings.Split(op, ".")
	o := Opcode{Base: parts[0]}
	for _, p := range parts[1:] {
		if t, ok := ParseType(p); ok {
			o.Types = append(o.Types, t)
		} else {
			o.Mods = append(o.Mods, p)
		}
	}
	return o
}

// Has reports whether mod is one of the opcode's modifiers.
func (o Opcode) Has(mod string) bool {
	for _, m := range o.Mods {
		if m == mod {
			return true
		}
	}
	return false
}

// Vec is the vector width named by a .v2 or .v4 modifier, 1 for a scalar access.
func (o Opcode) Vec() int {
	switch {
	case o.Has("v2"):
		return 2
	case o.Has("v4"):
		return 4
	}
	return 1
}

// Type is the opcode's first type suffix (the destination type of cvt), 0 when it has none.
func (o Opcode) Type() Type {
	if len(o.Types) == 0 {
		return 0
	}
	return o.Types[0]
}

// typeSet is a bit set of Types.
type typeSet uint32

func types(ts ...Type) typeSet {
	var s typeSet
	for _, t := range ts {
		s |= 1 << t
	}
	return s
}

func (s typeSet) has(t Type) bool { return s&(1<<t) != 0 }

var (
	intTypes   = types(B16, B32, B64, U16, U32, U64, S16, S32, S64)
	floatTypes = types(F32, F64)
	bitTypes   = types(Pred, B16, B32, B64)
	memTypes   = types(B8, B16, B32, B64, U8, U16, U32, U64, S8, S16, S32, S64, F16, F32, F64)
	atomTypes  = types(B32, B64, U32, U64, S32, S64, F32, F64)
	cvtTypes   = types(U8, U16, U32, U64, S8, S16, S32, S64, F16, BF16, F32, F64)
)

// opFacts describes one base opcode: how many operands it takes, how many of the leading ones
// it writes, which type suffixes and modifiers it accepts, and which operand is an address.
type opFacts struct {
	nargs  []int
	ndst   int
	ntypes int // type suffixes required
	types  typeSet
	addr   int // index of the memory operand, -1 for none
	mods   string
}

const (
	roundMods = " rn rz rm rp ftz sat "
	cmpMods   = " eq ne lt le gt ge lo ls hi hs equ neu ltu leu gtu geu num nan "
	ordering  = " relaxed acquire release acq_rel weak volatile cta gpu sys "
	cacheMods = " ca cg cs lu cv nc wb wt "
)

var opTable = map[string]opFacts{
	"mov":      {[]int{2}, 1, 1, intTypes | floatTypes | types(Pred), -1, ""},
	"ld":       {[]int{2}, 1, 1, memTypes, 1, " global shared shared::cta shared::cluster param local const v2 v4 " + cacheMods + ordering},
	"st":       {[]int{2}, 0, 1, memTypes, 0, " global shared shared::cta shared::cluster local v2 v4 " + cacheMods + ordering},
	"cvta":     {[]int{2}, 1, 1, types(U32, U64), -1, " to global shared local const param "},
	"add":      {[]int{3}, 1, 1, intTypes | floatTypes, -1, roundMods + " cc "},
	"sub":      {[]int{3}, 1, 1, intTypes | floatTypes, -1, roundMods + " cc "},
	"mul":      {[]int{3}, 1, 1, intTypes | floatTypes, -1, roundMods + " lo hi wide "},
	"mad":      {[]int{4}, 1, 1, intTypes | floatTypes, -1, roundMods + " lo hi wide "},
	"fma":      {[]int{4}, 1, 1, floatTypes, -1, roundMods},
	"div":      {[]int{3}, 1, 1, intTypes | floatTypes, -1, roundMods + " approx full "},
	"rem":      {[]int{3}, 1, 1, intTypes, -1, ""},
	"min":      {[]int{3}, 1, 1, intTypes | floatTypes, -1, " ftz NaN "},
	"max":      {[]int{3}, 1, 1, intTypes | floatTypes, -1, " ftz NaN "},
	"neg":      {[]int{2}, 1, 1, types(S16, S32, S64) | floatTypes, -1, " ftz "},
	"abs":      {[]int{2}, 1, 1, types(S16, S32, S64) | floatTypes, -1, " ftz "},
	"not":      {[]int{2}, 1, 1, bitTypes, -1, ""},
	"and":      {[]int{3}, 1, 1, bitTypes, -1, ""},
	"or":       {[]int{3}, 1, 1, bitTypes, -1, ""},
	"xor":      {[]int{3}, 1, 1, bitTypes, -1, ""},
	"shl":      {[]int{3}, 1, 1, types(B16, B32, B64), -1, ""},
	"shr":      {[]int{3}, 1, 1, intTypes, -1, ""},
	"popc":     {[]int{2}, 1, 1, types(B32, B64), -1, ""},
	"clz":      {[]int{2}, 1, 1, types(B32, B64), -1, ""},
	"sqrt":     {[]int{2}, 1, 1, floatTypes, -1, roundMods + " approx "},
	"rsqrt":    {[]int{2}, 1, 1, floatTypes, -1, " approx ftz "},
	"rcp":      {[]int{2}, 1, 1, floatTypes, -1, roundMods + " approx "},
	"ex2":      {[]int{2}, 1, 1, types(F32), -1, " approx ftz "},
	"lg2":      {[]int{2}, 1, 1, types(F32), -1, " approx ftz "},
	"sin":      {[]int{2}, 1, 1, types(F32), -1, " approx ftz "},
	"cos":      {[]int{2}, 1, 1, types(F32), -1, " approx ftz "},
	"tanh":     {[]int{2}, 1, 1, types(F32), -1, " approx "},
	"setp":     {[]int{3, 4}, 1, 1, intTypes | floatTypes, -1, cmpMods + " and or xor ftz "},
	"selp":     {[]int{4}, 1, 1, intTypes | floatTypes, -1, ""},
	"cvt":      {[]int{2, 3}, 1, 2, cvtTypes, -1, roundMods + " rni rzi rmi rpi relu bf16x2 "},
	"shfl":     {[]int{5}, 1, 1, types(B32), -1, " sync bfly down up idx "},
	"bar":      {[]int{1, 2}, 0, 0, 0, -1, " sync warp cta aligned "},
	"barrier":  {[]int{1, 2}, 0, 0, 0, -1, " sync cta aligned "},
	"atom":     {[]int{3, 4}, 1, 1, atomTypes, 1, " global shared add min max exch cas and or xor inc dec " + ordering},
	"red":      {[]int{2}, 0, 1, atomTypes, 0, " global shared add min max and or xor inc dec " + ordering},
	"membar":   {[]int{0}, 0, 0, 0, -1, " gl cta sys "},
	"prefetch": {[]int{1}, 0, 0, 0, 0, " global local L1 L2 "},
	"fence":    {[]int{0}, 0, 0, 0, -1, " sc acq_rel cta gpu sys "},
	"bra":      {[]int{1}, 0, 0, 0, -1, " uni "},
	"ret":      {[]int{0}, 0, 0, 0, -1, " uni "},
	"exit":     {[]int{0}, 0, 0, 0, -1, ""},
	"trap":     {[]int{0}, 0, 0, 0, -1, ""},
	// Programmatic dependent launch (sm_90): let the next grid launch / wait for the one ahead.
	"griddepcontrol": {[]int{0}, 0, 0, 0, -1, " launch_dependents wait "},
	// Only the tensor-core shape the GEMM uses: m16n8k16, A row-major bf16, B column-major
	// bf16, f32 accumulators (modRule pins the rest).
	"mma": {[]int{4}, 1, 4, types(F32, BF16), -1, " sync aligned m16n8k16 row col "},
	// Byte permute, default mode only: d's byte i is byte c[4i+3:4i] of {b, a} (the decode
	// attention packs two positions' bf16 of one dim into one word with it).
	"prmt": {[]int{4}, 1, 1, types(B32), -1, ""},
}

// typeCount is how many type suffixes o must carry: cvt to a packed pair (.bf16x2, a
// modifier to ParseOpcode) names only its source type.
func typeCount(o Opcode, f opFacts) int {
	if o.Base == "cvt" && o.Has("bf16x2") {
		return 1
	}
	return f.ntypes
}

// vecLen is the number of registers operand j of o must be a brace vector of, 0 where it
// is a scalar. mov packs two halves into one register ({lo, hi}); mma takes its fragments as
// vectors {d0..d3}, {a0..a3}, {b0, b1}, {c0..c3}.
func vecLen(o Opcode, j int) int {
	switch o.Base {
	case "ld", "st":
		if v := o.Vec(); v > 1 && j == 1-o.addrIndex() {
			return v
		}
	case "mov":
		if j == 1 && (o.Type() == B32 || o.Type() == B64) {
			return 2
		}
	case "mma":
		return [4]int{4, 4, 2, 4}[j]
	}
	return 0
}

func (o Opcode) addrIndex() int {
	if o.Base == "st" {
		return 0
	}
	return 1
}

// classOf is the register class a type's registers belong to ("f" for F32).
func classOf(t Type) string { return typeFacts[t].class }

// classBits is the declared width of each register class.
var classBits = map[string]int{"p": 1, "rs": 16, "r": 32, "rd": 64, "f": 32, "fd": 64}

// classType is the Type the parser gives a register of each class: the class's declared type.
var classType = map[string]Type{"p": Pred, "rs": B16, "r": B32, "rd": B64, "f": F32, "fd": F64}

// fits reports whether a register of class c may be an operand of type t. Untyped b-registers
// take any type of their size, f-registers only float and bit types; loads, stores and cvt may
// use a wider register for an integer type (wide is true there).
func fits(c string, t Type, wide bool) bool {
	if t == Pred || c == "p" {
		return t == Pred && c == "p"
	}
	if (c == "f" || c == "fd") && !floatTypes.has(t) && !bitTypes.has(t) {
		return false
	}
	rb, tb := classBits[c], t.Bits()
	if wide && !floatTypes.has(t) {
		return rb >= tb
	}
	return rb == tb
}

// count is how many of the space-separated modifiers in set o carries.
func (o Opcode) count(set string) int {
	n := 0
	for _, m := range o.Mods {
		if strings.Contains(" "+set+" ", " "+m+" ") {
			n++
		}
	}
	return n
}

// modRule reports what is wrong with o's choice of modifiers beyond their being known: the
// groups of which PTX wants exactly one (a comparison for setp, a mode for integer mul) and
// the rounding that float arithmetic and conversions must or must not name. "" means fine.
func modRule(o Opcode) string {
	t := o.Type()
	flt := floatTypes.has(t)
	one := func(set, what string) string {
		if o.count(set) != 1 {
			return fmt.Sprintf("needs exactly one %s (.%s)", what, strings.ReplaceAll(set, " ", "/."))
		}
		return ""
	}
	switch o.Base {
	case "griddepcontrol":
		return one("launch_dependents wait", "action")
	case "setp":
		if s := one(strings.TrimSpace(cmpMods), "comparison"); s != "" {
			return s
		}
		if o.count("and or xor") > 1 {
			return "takes at most one of .and/.or/.xor"
		}
	case "mul", "mad":
		if flt {
			if o.count("lo hi wide") > 0 {
				return "float multiply takes no .lo/.hi/.wide"
			}
			if o.Base == "mad" && o.count("rn rz rm rp") != 1 {
				return "mad on floats needs a rounding modifier (.rn/.rz/.rm/.rp)"
			}
			return ""
		}
		if s := one("lo hi wide", "mode"); s != "" {
			return s
		}
		if o.Has("wide") && t.Bits() == 64 {
			return ".wide needs a 16- or 32-bit type"
		}
	case "fma":
		return one("rn rz rm rp", "rounding modifier")
	case "div", "sqrt", "rcp":
		if t == F32 {
			set := "approx rn rz rm rp"
			if o.Base == "div" {
				set += " full"
			}
			return one(set, "rounding or precision modifier")
		}
		if t == F64 {
			return one("rn rz rm rp", "rounding modifier")
		}
	case "rsqrt", "ex2", "lg2", "sin", "cos", "tanh":
		return one("approx", "precision modifier")
	case "shfl":
		if !o.Has("sync") {
			return "needs .sync"
		}
		return one("bfly down up idx", "mode")
	case "bar", "barrier":
		if !o.Has("sync") {
			return "needs .sync"
		}
	case "atom", "red":
		if o.count("global shared") > 1 {
			return "names more than one state space"
		}
		return one("add min max exch cas and or xor inc dec", "operation")
	case "ld", "st":
		if o.count("global shared shared::cta shared::cluster param local const") > 1 {
			return "names more than one state space"
		}
		if o.count("v2 v4") > 1 {
			return "names more than one vector width"
		}
	case "cvt":
		return cvtRule(o)
	case "mma":
		if strings.Join(o.Mods, ".") != "sync.aligned.m16n8k16.row.col" {
			return "supports only .sync.aligned.m16n8k16.row.col"
		}
		if o.Types[0] != F32 || o.Types[1] != BF16 || o.Types[2] != BF16 || o.Types[3] != F32 {
			return "supports only .f32.bf16.bf16.f32"
		}
	}
	return ""
}

// cvtRule applies PTX's rounding rules for cvt: float to integer needs an integer rounding
// (.rzi...), integer to float and narrowing float conversions need a float rounding (.rn...),
// and no other conversion may name one.
func cvtRule(o Opcode) string {
	if o.Has("bf16x2") {
		// cvt.rn.bf16x2.f32 d, a, b: the only packed conversion supported.
		if o.Types[0] != F32 || len(o.Mods) != 2 || !o.Has("rn") {
			return "packed conversion supports only .rn.bf16x2.f32"
		}
		return ""
	}
	dst, src := o.Types[0], o.Types[1]
	isF := func(t Type) bool { return floatTypes.has(t) || t == F16 || t == BF16 }
	fr, ir := o.count("rn rz rm rp"), o.count("rni rzi rmi rpi")
	switch {
	case fr+ir > 1:
		return "names more than one rounding modifier"
	case isF(src) && !isF(dst):
		if ir != 1 {
			return "float to integer needs .rni/.rzi/.rmi/.rpi"
		}
	case !isF(src) && isF(dst):
		if fr != 1 {
			return "integer to float needs .rn/.rz/.rm/.rp"
		}
	case isF(src) && isF(dst):
		narrowing := dst.Bits() < src.Bits() || dst.Bits() == src.Bits() && dst != src
		if narrowing && fr != 1 {
			return "a narrowing float conversion needs .rn/.rz/.rm/.rp"
		}
		if !narrowing && fr != 0 {
			return "a widening float conversion takes no rounding modifier"
		}
		if ir != 0 && dst != src {
			return "integer rounding needs the same float type on both sides"
		}
	case fr+ir > 0:
		return "integer to integer conversion takes no rounding modifier"
	}
	return ""
}
