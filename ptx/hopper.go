package ptx

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
)

// Hopper (sm_90) instructions of the copy-engine GEMM: mbarriers, bulk and tensor copies into
// shared memory, thread-block clusters (mapa, barrier.cluster) and the fences they need. Each
// is accepted in exactly the spellings listed in asyncForms; anything else with the same base
// opcode is an error that lists them.

// TensorAddr is a tensor copy's source [map, {c0, c1}]: Map is the 64-bit address of the tensor
// map, Coords the element coordinates, innermost first.
type TensorAddr struct {
	Map    Operand
	Coords Vec
}

func (a TensorAddr) operand() string {
	if a.Map == nil {
		return "[<nil>, " + a.Coords.operand() + "]"
	}
	return "[" + a.Map.operand() + ", " + a.Coords.operand() + "]"
}

// Cluster special registers: the CTA's rank in its cluster and the cluster's size.
const (
	ClusterCtaRank  Special = "%cluster_ctarank"
	ClusterNCtaRank Special = "%cluster_nctarank"
)

// Operand kinds of an async form, one letter each:
//
//	s  shared address: [reg32+off] or [shared array+off]
//	g  global (generic) address: [reg64+off]
//	t  tensor source [reg64, {reg32, reg32}]
//	u  32-bit register or integer immediate
//	a  shared address value: 32-bit register or shared array symbol
//	d  32-bit destination register
//	D  64-bit destination register
//	P  predicate destination
//	8  the immediate 128
type asyncForm struct {
	kinds   string
	version string // the PTX ISA version that introduced the form
}

var asyncForms = map[string]asyncForm{
	"mbarrier.init.shared::cta.b64":                                               {"su", "7.8"},
	"mbarrier.arrive.shared::cta.b64":                                             {"Ds", "7.8"},
	"mbarrier.arrive.expect_tx.shared::cta.b64":                                   {"Dsu", "7.8"},
	"mbarrier.try_wait.parity.shared::cta.b64":                                    {"Psu", "7.8"},
	"cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes":           {"sgus", "7.8"},
	"cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes": {"sts", "7.8"},
	"mapa.shared::cluster.u32":                                                    {"dau", "7.8"},
	"barrier.cluster.arrive":                                                      {"", "7.8"},
	"barrier.cluster.arrive.release":                                              {"", "8.0"},
	"barrier.cluster.wait":                                                        {"", "7.8"},
	"barrier.cluster.wait.acquire":                                                {"", "8.0"},
	"fence.mbarrier_init.release.cluster":                                         {"", "8.0"},
	"fence.proxy.async.shared::cta":                                               {"", "8.0"},
	"fence.proxy.tensormap::generic.acquire.gpu":                                  {"g8", "8.3"},
}

// isAsync reports whether o is one of the opcodes only asyncForms spells.
func isAsync(o Opcode) bool {
	switch o.Base {
	case "mbarrier", "cp", "mapa":
		return true
	case "barrier":
		return o.Has("cluster")
	case "fence":
		return o.Has("proxy") || o.Has("mbarrier_init")
	}
	return false
}

// formsOf lists the accepted spellings with base opcode base, sorted.
func formsOf(base string) []string {
	var fs []string
	for op := range asyncForms {
		if ParseOpcode(op).Base == base {
			fs = append(fs, op)
		}
	}
	sort.Strings(fs)
	return fs
}

// asyncInstr validates an instruction that isAsync: the exact spelling, then each operand.
func (c *kernelCheck) asyncInstr(i int, in Instr, o Opcode) {
	f, ok := asyncForms[in.Op]
	if !ok {
		c.ierr(i, in, "unsupported form of %s; supported: %s", o.Base, strings.Join(formsOf(o.Base), ", "))
		return
	}
	if len(in.Args) != len(f.kinds) {
		c.ierr(i, in, "%s takes %d operands, has %d", in.Op, len(f.kinds), len(in.Args))
		return
	}
	for j, a := range in.Args {
		if a == nil {
			c.ierr(i, in, "operand %d is nil", j)
			continue
		}
		if msg := c.asyncOperand(i, in, f.kinds[j], a); msg != "" {
			c.ierr(i, in, "operand %d: %s", j, msg)
		}
	}
}

func isReg32(r Reg) bool { return classOf(r.T) == "r" }
func isReg64(r Reg) bool { return classOf(r.T) == "rd" }

// asyncOperand checks one operand against its kind letter; "" means fine. Undeclared
// registers are reported by c.reg itself.
func (c *kernelCheck) asyncOperand(i int, in Instr, kind byte, a Operand) string {
	reg := func(r Reg, ok func(Reg) bool, what string) string {
		if !c.reg(i, in, r) || ok(r) {
			return ""
		}
		return fmt.Sprintf("register %s must be %s", r, what)
	}
	switch kind {
	case 's', 'g':
		ad, ok := a.(Addr)
		if !ok {
			return "must be an address [..]"
		}
		switch b := ad.Base.(type) {
		case Reg:
			if kind == 's' {
				return reg(b, isReg32, "a 32-bit register (a shared address)")
			}
			return reg(b, isReg64, "a 64-bit register (a global address)")
		case Sym:
			if kind == 's' && c.shared[string(b)] {
				return ""
			}
			if kind == 's' {
				return fmt.Sprintf("shared array %s does not exist", b)
			}
			return fmt.Sprintf("symbol %s cannot be a global address", b)
		}
		return "address base must be a register or a symbol"
	case 't':
		ta, ok := a.(TensorAddr)
		if !ok {
			return "must be a tensor source [map, {c0, c1}]"
		}
		m, ok := ta.Map.(Reg)
		if !ok {
			return "tensor map must be a 64-bit register"
		}
		if msg := reg(m, isReg64, "a 64-bit register (the tensor map's address)"); msg != "" {
			return msg
		}
		if len(ta.Coords) != 2 {
			return fmt.Sprintf("a 2-D tensor copy takes 2 coordinates, has %d", len(ta.Coords))
		}
		for _, r := range ta.Coords {
			if msg := reg(r, isReg32, "a 32-bit register (a coordinate)"); msg != "" {
				return msg
			}
		}
		return ""
	case 'u':
		switch a := a.(type) {
		case Imm:
			return ""
		case Reg:
			return reg(a, isReg32, "a 32-bit register")
		}
		return "must be a 32-bit register or an integer immediate"
	case 'a':
		switch a := a.(type) {
		case Sym:
			if !c.shared[string(a)] {
				return fmt.Sprintf("shared array %s does not exist", a)
			}
			return ""
		case Reg:
			return reg(a, isReg32, "a 32-bit register (a shared address)")
		}
		return "must be a 32-bit register or a shared array"
	case 'd', 'D', 'P':
		r, ok := a.(Reg)
		if !ok {
			return "destination must be a register"
		}
		switch kind {
		case 'd':
			return reg(r, isReg32, "a 32-bit register")
		case 'D':
			return reg(r, isReg64, "a 64-bit register")
		}
		return reg(r, func(r Reg) bool { return r.T == Pred }, "a predicate")
	case '8':
		if a != Imm(128) {
			return "must be the immediate 128 (a tensor map's size)"
		}
		return ""
	}
	return fmt.Sprintf("unknown operand kind %q", kind)
}

// isSharedSpace reports whether o names the shared state space in any of its spellings.
func isSharedSpace(o Opcode) bool {
	return o.Has("shared") || o.Has("shared::cta") || o.Has("shared::cluster")
}

// version numbers compare as major.minor; an unreadable one compares as 0.0.
func versionLess(a, b string) bool {
	pa, pb := versionParts(a), versionParts(b)
	return pa[0] < pb[0] || pa[0] == pb[0] && pa[1] < pb[1]
}

func versionParts(v string) [2]int {
	maj, min, _ := strings.Cut(v, ".")
	x, _ := strconv.Atoi(maj)
	y, _ := strconv.Atoi(min)
	return [2]int{x, y}
}

// MinVersion is the lowest PTX ISA version the module's contents need ("" when nothing beyond
// the oldest version xmix knows): clusters and shared::cluster accesses need 7.8, the tensor
// map fence 8.3.
func (m *Module) MinVersion() string {
	need := ""
	bump := func(v string) {
		if need == "" || versionLess(need, v) {
			need = v
		}
	}
	for _, k := range m.Kernels {
		if k.ClusterX > 0 {
			bump("7.8")
		}
		for _, in := range k.Body {
			if f, ok := asyncForms[in.Op]; ok {
				bump(f.version)
			} else if strings.Contains(in.Op, "shared::c") {
				bump("7.8")
			}
		}
	}
	return need
}

// printVersion is the version Print declares: the module's, raised to what its contents need.
func (m *Module) printVersion() string {
	if need := m.MinVersion(); need != "" && versionLess(m.Version, need) {
		return need
	}
	return m.Version
}

// maxCluster is the largest portable cluster size.
const maxCluster = 8
