package ptx

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// Parse reads PTX text as printed by (*Module).Print, and hand-written PTX in the same subset,
// into a Module. Registers must be named as the printer names them (%r7, %fd2, declared with
// `.reg .b32 %r<8>;`) because a Reg is a class and an index. Errors name line:col.
func Parse(text string) (*Module, error) {
	toks, err := lex(text)
	if err != nil {
		return nil, err
	}
	p := &parser{toks: toks}
	return p.module()
}

type tokKind uint8

const (
	tEOF tokKind = iota
	tIdent
	tNum
	tPunct
)

type token struct {
	kind      tokKind
	text      string
	line, col int
}

func (t token) String() string {
	if t.kind == tEOF {
		return "end of input"
	}
	return strconv.Quote(t.text)
}

func isIdentStart(c byte) bool {
	return c == '_' || c == '$' || c == '%' || c == '.' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
}

func isIdentChar(c byte) bool {
	return isIdentStart(c) && c != '%' || c >= '0' && c <= '9'
}

// lex splits text into identifiers (opcodes and directives included, dots and all), numbers
// and single-character punctuation, dropping comments.
func lex(text string) ([]token, error) {
	var toks []token
	line, lineStart := 1, 0
	for i := 0; i < len(text); {
		c := text[i]
		col := i - lineStart + 1
		switch {
		case c == '\n':
			line++
			i++
			lineStart = i
		case c == ' ' || c == '\t' || c == '\r':
			i++
		case strings.HasPrefix(text[i:], "//"):
			for i < len(text) && text[i] != '\n' {
				i++
			}
		case strings.HasPrefix(text[i:], "/*"):
			end := strings.Index(text[i+2:], "*/")
			if end < 0 {
				return nil, fmt.Errorf("line %d:%d: unterminated comment", line, col)
			}
			for _, ch := range text[i : i+2+end+2] {
				if ch == '\n' {
					line++
				}
			}
			i += 2 + end + 2
			if nl := strings.LastIndexByte(text[:i], '\n'); nl >= 0 {
				lineStart = nl + 1
			}
		case c >= '0' && c <= '9':
			j := i + 1
			hex := len(text) > i+1 && strings.ContainsRune("xXfFdD", rune(text[i+1])) && c == '0'
			for j < len(text) && (isIdentChar(text[j]) ||
				!hex && (text[j] == '+' || text[j] == '-') && (text[j-1] == 'e' || text[j-1] == 'E')) {
				j++
			}
			toks = append(toks, token{tNum, text[i:j], line, col})
			i = j
		case isIdentStart(c):
			j := i + 1
			for j < len(text) && isIdentChar(text[j]) {
				j++
				// "::" inside a name joins it (state spaces such as .shared::cluster).
				if strings.HasPrefix(text[j:], "::") && j+2 < len(text) && isIdentChar(text[j+2]) && text[j+2] != '.' {
					j += 2
				}
			}
			toks = append(toks, token{tIdent, text[i:j], line, col})
			i = j
		case strings.IndexByte("(){}[]<>,;:@!+-|", c) >= 0:
			toks = append(toks, token{tPunct, text[i : i+1], line, col})
			i++
		default:
			return nil, fmt.Errorf("line %d:%d: unexpected character %q", line, col, c)
		}
	}
	toks = append(toks, token{kind: tEOF, line: line, col: len(text) - lineStart + 1})
	return toks, nil
}

type parser struct {
	toks []token
	i    int
}

func (p *parser) peek() token { return p.toks[p.i] }

func (p *parser) next() token {
	t := p.toks[p.i]
	if t.kind != tEOF {
		p.i++
	}
	return t
}

func (p *parser) errAt(t token, format string, args ...any) error {
	return fmt.Errorf("line %d:%d: %s", t.line, t.col, fmt.Sprintf(format, args...))
}

// accept consumes the next token when its text is s.
func (p *parser) accept(s string) bool {
	if t := p.peek(); t.kind != tEOF && t.text == s {
		p.i++
		return true
	}
	return false
}

func (p *parser) expect(s string) error {
	if t := p.peek(); t.kind == tEOF || t.text != s {
		return p.errAt(t, "expected %q, found %s", s, t)
	}
	p.i++
	return nil
}

func (p *parser) ident(what string) (token, error) {
	t := p.next()
	if t.kind != tIdent {
		return t, p.errAt(t, "expected %s, found %s", what, t)
	}
	return t, nil
}

func (p *parser) int(what string) (int, token, error) {
	t := p.next()
	if t.kind != tNum {
		return 0, t, p.errAt(t, "expected %s, found %s", what, t)
	}
	v, err := strconv.ParseInt(t.text, 0, 64)
	if err != nil || v < 0 || v > math.MaxInt32 {
		return 0, t, p.errAt(t, "bad %s %s", what, t)
	}
	return int(v), t, nil
}

func (p *parser) typ() (Type, error) {
	t := p.next()
	ty, ok := ParseType(t.text)
	if t.kind != tIdent || !strings.HasPrefix(t.text, ".") || !ok {
		return 0, p.errAt(t, "expected a type such as .f32, found %s", t)
	}
	return ty, nil
}

func (p *parser) module() (*Module, error) {
	m := &Module{}
	// Dynamic shared arrays declared at module scope (`.extern .shared ... name[];`, where
	// the JIT wants them) belong to the entry that follows them.
	pending := &Kernel{}
	for {
		t := p.next()
		switch t.text {
		case "":
			if m.Version == "" {
				return nil, p.errAt(t, "missing .version")
			}
			if m.Target == "" {
				return nil, p.errAt(t, "missing .target")
			}
			return m, nil
		case ".version":
			v := p.next()
			if v.kind != tNum {
				return nil, p.errAt(v, "expected a version number, found %s", v)
			}
			m.Version = v.text
		case ".target":
			var names []string
			for {
				n, err := p.ident("a target name")
				if err != nil {
					return nil, err
				}
				names = append(names, n.text)
				if !p.accept(",") {
					break
				}
			}
			m.Target = strings.Join(names, ", ")
		case ".address_size":
			n, _, err := p.int("address size")
			if err != nil {
				return nil, err
			}
			m.AddressSize = n
		case ".visible", ".weak":
			if err := p.expect(".entry"); err != nil {
				return nil, err
			}
			fallthrough
		case ".entry":
			k, err := p.kernel()
			if err != nil {
				return nil, err
			}
			if m.Kernel(k.Name) != nil {
				return nil, p.errAt(t, "duplicate entry %s", k.Name)
			}
			k.Shared = append(pending.Shared, k.Shared...)
			pending = &Kernel{}
			m.Kernels = append(m.Kernels, k)
		case ".extern":
			if err := p.expect(".shared"); err != nil {
				return nil, err
			}
			if err := p.sharedDecl(pending, true); err != nil {
				return nil, err
			}
		default:
			return nil, p.errAt(t, "unsupported module-level statement %s (expected .version, .target, .address_size, .extern .shared or .entry)", t)
		}
	}
}

func (p *parser) kernel() (*Kernel, error) {
	name, err := p.ident("an entry name")
	if err != nil {
		return nil, err
	}
	k := &Kernel{Name: name.text, RegDecls: map[string]int{}}
	if err := p.expect("("); err != nil {
		return nil, err
	}
	for !p.accept(")") {
		if len(k.Params) > 0 {
			if err := p.expect(","); err != nil {
				return nil, err
			}
		}
		if err := p.expect(".param"); err != nil {
			return nil, err
		}
		align := 0
		if p.accept(".align") {
			a, _, err := p.int("alignment")
			if err != nil {
				return nil, err
			}
			align = a
		}
		ty, err := p.typ()
		if err != nil {
			return nil, err
		}
		pn, err := p.ident("a parameter name")
		if err != nil {
			return nil, err
		}
		q := Param{Name: pn.text, T: ty}
		if t := p.peek(); t.text == "[" {
			p.next()
			if q.Len, _, err = p.int("parameter length"); err != nil {
				return nil, err
			}
			if err := p.expect("]"); err != nil {
				return nil, err
			}
			if ty != B8 || q.Len <= 0 {
				return nil, p.errAt(t, "array parameters must be .b8 with a positive length")
			}
			q.Align = max(align, 1)
		} else if align != 0 {
			return nil, p.errAt(pn, "only array parameters take .align")
		}
		k.Params = append(k.Params, q)
	}
	for !p.accept("{") {
		t := p.next()
		switch t.text {
		case ".maxntid", ".reqntid":
			n, _, err := p.int("thread count")
			if err != nil {
				return nil, err
			}
			if t.text == ".maxntid" {
				k.MaxNTid = n
			}
			for p.accept(",") {
				if _, _, err := p.int("thread count"); err != nil {
					return nil, err
				}
			}
		case ".reqnctapercluster":
			if err := p.cluster(k); err != nil {
				return nil, err
			}
		case ".minnctapersm", ".maxnreg":
			n, _, err := p.int("count")
			if err != nil {
				return nil, err
			}
			if t.text == ".minnctapersm" {
				k.MinBlocks = n
			} else {
				k.MaxNReg = n
			}
		default:
			return nil, p.errAt(t, "expected \"{\" or a performance directive, found %s", t)
		}
	}
	return k, p.body(k)
}

func (p *parser) body(k *Kernel) error {
	depth := 1
	for {
		t := p.peek()
		switch {
		case t.kind == tEOF:
			return p.errAt(t, "kernel %s: missing \"}\"", k.Name)
		case t.text == "{":
			p.next()
			depth++
		case t.text == "}":
			p.next()
			if depth--; depth == 0 {
				return nil
			}
		case t.text == ".reg":
			p.next()
			if err := p.regDecl(k); err != nil {
				return err
			}
		case t.text == ".shared", t.text == ".extern":
			p.next()
			if t.text == ".extern" {
				if err := p.expect(".shared"); err != nil {
					return err
				}
			}
			if err := p.sharedDecl(k, t.text == ".extern"); err != nil {
				return err
			}
		case t.kind == tIdent && p.toks[p.i+1].text == ":":
			if strings.HasPrefix(t.text, ".") || strings.HasPrefix(t.text, "%") {
				return p.errAt(t, "bad label name %s", t)
			}
			p.i += 2
			k.Body = append(k.Body, Instr{Label: t.text})
		default:
			in, err := p.instr()
			if err != nil {
				return err
			}
			k.Body = append(k.Body, in)
		}
	}
}

// regDecl reads `.f32 %f<N>, ...;` (declaring %f0..%f(N-1)) or `.f32 %f3;`.
func (p *parser) regDecl(k *Kernel) error {
	if _, err := p.typ(); err != nil {
		return err
	}
	for {
		t, err := p.ident("a register name")
		if err != nil {
			return err
		}
		if !strings.HasPrefix(t.text, "%") {
			return p.errAt(t, "register name %s must start with %%", t)
		}
		if p.accept("<") {
			class := t.text[1:]
			if _, ok := classBits[class]; !ok {
				return p.errAt(t, "unknown register class %s (want one of %%p %%rs %%r %%rd %%f %%fd)", t)
			}
			n, nt, err := p.int("register count")
			if err != nil {
				return err
			}
			if n < 1 {
				return p.errAt(nt, "register count must be at least 1")
			}
			if err := p.expect(">"); err != nil {
				return err
			}
			k.RegDecls[class] = max(k.RegDecls[class], n-1)
		} else {
			r, err := regOperand(t.text)
			if err != nil {
				return p.errAt(t, "%v", err)
			}
			c := classOf(r.T)
			k.RegDecls[c] = max(k.RegDecls[c], r.N)
		}
		if !p.accept(",") {
			return p.expect(";")
		}
	}
}

// cluster reads the sizes after .reqnctapercluster: clusters run along x only.
func (p *parser) cluster(k *Kernel) error {
	n, _, err := p.int("cluster size")
	if err != nil {
		return err
	}
	k.ClusterX = n
	for p.accept(",") {
		m, t, err := p.int("cluster size")
		if err != nil {
			return err
		}
		if m != 1 {
			return p.errAt(t, "clusters are supported along x only (y and z sizes must be 1)")
		}
	}
	return nil
}

// sharedDecl reads `[.align A] .type name[N];`, or `[.align A] .type name[];` after .extern.
func (p *parser) sharedDecl(k *Kernel, extern bool) error {
	s := Shared{Align: 0, Len: 1, Extern: extern}
	if extern {
		s.Len = 0
	}
	if p.accept(".align") {
		a, _, err := p.int("alignment")
		if err != nil {
			return err
		}
		s.Align = a
	}
	ty, err := p.typ()
	if err != nil {
		return err
	}
	s.T = ty
	if s.Align == 0 {
		s.Align = ty.Bytes()
	}
	n, err := p.ident("a shared array name")
	if err != nil {
		return err
	}
	s.Name = n.text
	if extern {
		if err := p.expect("["); err != nil {
			return err
		}
		if err := p.expect("]"); err != nil {
			return err
		}
	} else if p.accept("[") {
		if s.Len, _, err = p.int("array length"); err != nil {
			return err
		}
		if err := p.expect("]"); err != nil {
			return err
		}
	}
	k.Shared = append(k.Shared, s)
	return p.expect(";")
}

func (p *parser) instr() (Instr, error) {
	var in Instr
	if p.accept("@") {
		in.GuardNeg = p.accept("!")
		t, err := p.ident("a predicate register")
		if err != nil {
			return in, err
		}
		r, err := regOperand(t.text)
		if err != nil {
			return in, p.errAt(t, "%v", err)
		}
		in.Guard = &r
	}
	op := p.next()
	if op.kind != tIdent || strings.HasPrefix(op.text, ".") || strings.HasPrefix(op.text, "%") {
		return in, p.errAt(op, "expected an instruction, found %s", op)
	}
	in.Op = op.text
	if p.accept(";") {
		return in, nil
	}
	for {
		a, err := p.operand()
		if err != nil {
			return in, err
		}
		in.Args = append(in.Args, a)
		if p.accept(";") {
			return in, nil
		}
		if err := p.expect(","); err != nil {
			return in, err
		}
	}
}

func (p *parser) operand() (Operand, error) {
	t := p.next()
	switch {
	case t.text == "[":
		return p.address()
	case t.text == "{":
		return p.vector()
	case t.text == "-":
		n := p.next()
		if n.kind != tNum {
			return nil, p.errAt(n, "expected a number after \"-\", found %s", n)
		}
		v, err := number(n.text)
		if err != nil {
			return nil, p.errAt(n, "%v", err)
		}
		switch v := v.(type) {
		case Imm:
			return -v, nil
		case F32Imm:
			if strings.HasPrefix(strings.ToLower(n.text), "0f") {
				return nil, p.errAt(t, "write a negative hex float as its own bits")
			}
			return -v, nil
		}
	case t.kind == tNum:
		v, err := number(t.text)
		if err != nil {
			return nil, p.errAt(t, "%v", err)
		}
		return v, nil
	case t.kind == tIdent && strings.HasPrefix(t.text, "%"):
		if p.peek().text == "|" {
			return nil, p.errAt(p.peek(), "the d|p destination form is not supported")
		}
		if isSpecial(t.text) {
			return Special(t.text), nil
		}
		r, err := regOperand(t.text)
		if err != nil {
			return nil, p.errAt(t, "%v", err)
		}
		return r, nil
	case t.kind == tIdent && !strings.HasPrefix(t.text, "."):
		return Sym(t.text), nil
	}
	return nil, p.errAt(t, "expected an operand, found %s", t)
}

// address reads the rest of `[base]`, `[base+off]`, `[base+-off]` or a tensor source
// `[map, {c0, c1}]`.
func (p *parser) address() (Operand, error) {
	bt, err := p.ident("an address base (register or symbol)")
	if err != nil {
		return nil, err
	}
	var base Operand = Sym(bt.text)
	if strings.HasPrefix(bt.text, "%") {
		r, err := regOperand(bt.text)
		if err != nil {
			return nil, p.errAt(bt, "%v", err)
		}
		base = r
	} else if strings.HasPrefix(bt.text, ".") {
		return nil, p.errAt(bt, "bad address base %s", bt)
	}
	if p.accept(",") {
		if err := p.expect("{"); err != nil {
			return nil, err
		}
		v, err := p.vector()
		if err != nil {
			return nil, err
		}
		return TensorAddr{Map: base, Coords: v}, p.expect("]")
	}
	a := Addr{Base: base}
	if t := p.peek(); t.text == "+" || t.text == "-" {
		p.next()
		neg := t.text == "-"
		if t.text == "+" && p.accept("-") {
			neg = true
		}
		nt := p.next()
		v, err := number(nt.text)
		off, ok := v.(Imm)
		if nt.kind != tNum || err != nil || !ok {
			return nil, p.errAt(nt, "expected an integer offset, found %s", nt)
		}
		if neg {
			off = -off
		}
		a.Offset = int64(off)
	}
	return a, p.expect("]")
}

// vector reads the rest of `{%r1, %r2, ...}`.
func (p *parser) vector() (Vec, error) {
	var v Vec
	for {
		rt, err := p.ident("a register")
		if err != nil {
			return nil, err
		}
		r, err := regOperand(rt.text)
		if err != nil {
			return nil, p.errAt(rt, "%v", err)
		}
		v = append(v, r)
		if p.accept("}") {
			return v, nil
		}
		if err := p.expect(","); err != nil {
			return nil, err
		}
	}
}

// number parses an integer (decimal, 0x hex, optional U suffix) or a float (0fXXXXXXXX or
// decimal with a point or exponent).
func number(s string) (Operand, error) {
	l := strings.ToLower(s)
	switch {
	case strings.HasPrefix(l, "0f") && len(l) == 10:
		b, err := strconv.ParseUint(l[2:], 16, 32)
		if err != nil {
			return nil, fmt.Errorf("bad f32 literal %s", s)
		}
		return F32Imm(math.Float32frombits(uint32(b))), nil
	case strings.HasPrefix(l, "0d"):
		return nil, fmt.Errorf("f64 literal %s is not supported", s)
	case strings.HasPrefix(l, "0x"):
		v, err := strconv.ParseUint(strings.TrimSuffix(l[2:], "u"), 16, 64)
		if err != nil {
			return nil, fmt.Errorf("bad integer %s", s)
		}
		return Imm(int64(v)), nil
	case strings.ContainsAny(l, ".e"):
		v, err := strconv.ParseFloat(l, 32)
		if err != nil {
			return nil, fmt.Errorf("bad number %s", s)
		}
		return F32Imm(float32(v)), nil
	}
	v, err := strconv.ParseUint(strings.TrimSuffix(l, "u"), 10, 64)
	if err != nil {
		return nil, fmt.Errorf("bad integer %s", s)
	}
	return Imm(int64(v)), nil
}

var specials = map[string]bool{
	"%laneid": true, "%warpid": true, "%nwarpid": true, "%smid": true, "%nsmid": true,
	"%clock": true, "%clock64": true, "%lanemask_lt": true, "%lanemask_eq": true,
	"%cluster_ctarank": true, "%cluster_nctarank": true, "%globaltimer": true,
}

func isSpecial(s string) bool {
	if specials[s] {
		return true
	}
	for _, p := range []string{"%tid.", "%ntid.", "%ctaid.", "%nctaid."} {
		if rest, ok := strings.CutPrefix(s, p); ok {
			return rest == "x" || rest == "y" || rest == "z"
		}
	}
	return false
}

var errRegName = errors.New("registers are named %<class><index> with class p, rs, r, rd, f or fd")

// regOperand maps a printed register name (%rd12) back to a Reg; the type is the class's
// declared type, which prints the same.
func regOperand(s string) (Reg, error) {
	name, ok := strings.CutPrefix(s, "%")
	i := strings.IndexAny(name, "0123456789")
	if !ok || i <= 0 {
		return Reg{}, fmt.Errorf("bad register %s: %w", s, errRegName)
	}
	t, ok := classType[name[:i]]
	n, err := strconv.Atoi(name[i:])
	if !ok || err != nil || n < 0 {
		return Reg{}, fmt.Errorf("bad register %s: %w", s, errRegName)
	}
	return Reg{T: t, N: n}, nil
}

// String renders the instruction as one line of PTX, the way Print does (without the tab
// and the semicolon); a label renders as "name:".
func (in Instr) String() string {
	if in.Label != "" {
		return in.Label + ":"
	}
	var b strings.Builder
	if in.Guard != nil {
		b.WriteString("@")
		if in.GuardNeg {
			b.WriteString("!")
		}
		b.WriteString(in.Guard.operand())
		b.WriteString(" ")
	}
	b.WriteString(in.Op)
	for j, a := range in.Args {
		if j == 0 {
			b.WriteString(" ")
		} else {
			b.WriteString(", ")
		}
		if a == nil {
			b.WriteString("<nil>")
		} else {
			b.WriteString(a.operand())
		}
	}
	return b.String()
}
