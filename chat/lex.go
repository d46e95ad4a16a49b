package chat

import (
	"fmt"
	"strings"
)

// pos is a 1-based line:column in the template source.
type pos struct{ line, col int }

func (p pos) String() string { return fmt.Sprintf("%d:%d", p.line, p.col) }

type tokKind int

const (
	tText       tokKind = iota
	tVarBegin           // {{
	tVarEnd             // }}
	tBlockBegin         // {%
	tBlockEnd           // %}
	tName
	tString
	tInt
	tFloat
	tOp // operators and punctuation
	tEOF
)

type token struct {
	kind tokKind
	val  string
	pos  pos
}

// Error is a template that fails to parse or render, at a line:col of the
// template source.
type Error struct {
	Line, Col int
	Msg       string
}

func (e *Error) Error() string { return fmt.Sprintf("template %d:%d: %s", e.Line, e.Col, e.Msg) }

func errAt(p pos, format string, args ...any) error {
	return &Error{Line: p.line, Col: p.col, Msg: fmt.Sprintf(format, args...)}
}

// lexer splits a template into text and tag tokens with the whitespace
// rules transformers renders chat templates with: Jinja2 with
// trim_blocks=True, lstrip_blocks=True and keep_trailing_newline=False.
type lexer struct {
	src  string
	i    int
	toks []token
	// lineStarts holds the offset of every line start, for offset→line:col.
	lineStarts []int
}

func newLexer(src string) *lexer {
	l := &lexer{src: src, lineStarts: []int{0}}
	for i := 0; i < len(src); i++ {
		if src[i] == '\n' {
			l.lineStarts = append(l.lineStarts, i+1)
		}
	}
	return l
}

func (l *lexer) posOf(off int) pos {
	lo, hi := 0, len(l.lineStarts)-1
	for lo < hi {
		mid := (lo + hi + 1) / 2
		if l.lineStarts[mid] <= off {
			lo = mid
		} else {
			hi = mid - 1
		}
	}
	return pos{line: lo + 1, col: off - l.lineStarts[lo] + 1}
}

func isSpace(c byte) bool {
	return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'
}

func lex(src string) ([]token, error) {
	// Jinja2 drops one trailing newline of the source (keep_trailing_newline=False).
	src = strings.TrimSuffix(src, "\n")
	l := newLexer(src)
	lineStarting := true
	for l.i < len(src) {
		start := l.i
		next := indexTagOpen(src, l.i)
		text := src[l.i:]
		if next >= 0 {
			text = src[l.i:next]
		}
		if next < 0 {
			l.emit(tText, text, start)
			break
		}
		opener := src[next : next+2]
		sign := byte(0)
		if next+2 < len(src) && (src[next+2] == '-' || src[next+2] == '+') {
			sign = src[next+2]
		}
		switch {
		case sign == '-':
			text = strings.TrimRightFunc(text, func(r rune) bool { return r < 128 && isSpace(byte(r)) })
		case sign != '+' && opener != "{{":
			// lstrip_blocks: drop blanks between a line start and a block or comment tag.
			lpos := strings.LastIndexByte(text, '\n') + 1
			if (lpos > 0 || lineStarting) && strings.Trim(text[lpos:], " \t") == "" {
				text = text[:lpos]
			}
		}
		if text != "" {
			l.emit(tText, text, start)
		}
		l.i = next + 2
		if sign != 0 {
			l.i++
		}
		var err error
		switch opener {
		case "{#":
			err = l.comment(next)
		case "{{":
			l.emit(tVarBegin, "{{", next)
			err = l.tag(next, "}}", tVarEnd)
		default:
			l.emit(tBlockBegin, "{%", next)
			err = l.tag(next, "%}", tBlockEnd)
		}
		if err != nil {
			return nil, err
		}
		lineStarting = l.i > 0 && src[l.i-1] == '\n'
	}
	l.emit(tEOF, "", len(src))
	return l.toks, nil
}

func indexTagOpen(src string, from int) int {
	for i := from; i+1 < len(src); i++ {
		if src[i] == '{' && (src[i+1] == '{' || src[i+1] == '%' || src[i+1] == '#') {
			return i
		}
	}
	return -1
}

func (l *lexer) emit(k tokKind, v string, off int) {
	l.toks = append(l.toks, token{kind: k, val: v, pos: l.posOf(off)})
}

// closeTag consumes a tag end at l.i ("-%}", "+%}", "%}" and the like) and
// applies its whitespace rule; trim is whether a plain end eats one newline.
func (l *lexer) closeTag(end string, trim bool) bool {
	s := l.src[l.i:]
	switch {
	case strings.HasPrefix(s, "-"+end):
		l.i += 3
		for l.i < len(l.src) && isSpace(l.src[l.i]) {
			l.i++
		}
	case strings.HasPrefix(s, "+"+end) && end != "}}":
		l.i += 3
	case strings.HasPrefix(s, end):
		l.i += 2
		if trim && l.i < len(l.src) && l.src[l.i] == '\n' {
			l.i++
		}
	default:
		return false
	}
	return true
}

func (l *lexer) comment(open int) error {
	for l.i < len(l.src) {
		if l.closeTag("#}", true) {
			return nil
		}
		l.i++
	}
	return errAt(l.posOf(open), "unclosed comment")
}

// tag lexes the expression tokens of a {{ }} or {% %} tag. An end marker
// only closes the tag outside brackets, so dict literals may contain "}}".
func (l *lexer) tag(open int, end string, endKind tokKind) error {
	depth := 0
	for {
		for l.i < len(l.src) && isSpace(l.src[l.i]) {
			l.i++
		}
		if l.i >= len(l.src) {
			return errAt(l.posOf(open), "unclosed tag %q", l.src[open:open+2])
		}
		start := l.i
		if depth == 0 && l.closeTag(end, end == "%}") {
			l.emit(endKind, end, start)
			return nil
		}
		c := l.src[l.i]
		switch {
		case c == '\'' || c == '"':
			s, err := l.str()
			if err != nil {
				return err
			}
			l.emit(tString, s, start)
		case c >= '0' && c <= '9':
			l.number(start)
		case c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z':
			for l.i < len(l.src) && isNameChar(l.src[l.i]) {
				l.i++
			}
			l.emit(tName, l.src[start:l.i], start)
		default:
			op := matchOp(l.src[l.i:])
			if op == "" {
				return errAt(l.posOf(start), "unexpected character %q", c)
			}
			switch op {
			case "(", "[", "{":
				depth++
			case ")", "]", "}":
				if depth == 0 {
					return errAt(l.posOf(start), "unexpected %q", op)
				}
				depth--
			}
			l.i += len(op)
			l.emit(tOp, op, start)
		}
	}
}

func isNameChar(c byte) bool {
	return c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
}

var ops = []string{"//", "**", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<", ">", "=", "(", ")", "[", "]", "{", "}", ",", ".", ":", "|"}

func matchOp(s string) string {
	for _, op := range ops {
		if strings.HasPrefix(s, op) {
			return op
		}
	}
	return ""
}

func (l *lexer) number(start int) {
	for l.i < len(l.src) && (l.src[l.i] >= '0' && l.src[l.i] <= '9' || l.src[l.i] == '_') {
		l.i++
	}
	kind := tInt
	if l.i+1 < len(l.src) && l.src[l.i] == '.' && l.src[l.i+1] >= '0' && l.src[l.i+1] <= '9' {
		kind = tFloat
		l.i++
		for l.i < len(l.src) && l.src[l.i] >= '0' && l.src[l.i] <= '9' {
			l.i++
		}
	}
	if l.i < len(l.src) && (l.src[l.i] == 'e' || l.src[l.i] == 'E') {
		j := l.i + 1
		if j < len(l.src) && (l.src[j] == '+' || l.src[j] == '-') {
			j++
		}
		if j < len(l.src) && l.src[j] >= '0' && l.src[j] <= '9' {
			kind = tFloat
			for l.i = j; l.i < len(l.src) && l.src[l.i] >= '0' && l.src[l.i] <= '9'; l.i++ {
			}
		}
	}
	l.emit(kind, strings.ReplaceAll(l.src[start:l.i], "_", ""), start)
}

// str reads a Python string literal with its backslash escapes.
func (l *lexer) str() (string, error) {
	start := l.i
	q := l.src[l.i]
	l.i++
	var b strings.Builder
	for l.i < len(l.src) {
		c := l.src[l.i]
		switch {
		case c == q:
			l.i++
			return b.String(), nil
		case c == '\\' && l.i+1 < len(l.src):
			l.i++
			e := l.src[l.i]
			l.i++
			switch e {
			case 'n':
				b.WriteByte('\n')
			case 't':
				b.WriteByte('\t')
			case 'r':
				b.WriteByte('\r')
			case '0':
				b.WriteByte(0)
			case '\\', '\'', '"':
				b.WriteByte(e)
			case '\n':
				// A backslash-newline continues the literal on the next line.
			case 'u', 'x', 'U':
				n := map[byte]int{'x': 2, 'u': 4, 'U': 8}[e]
				if l.i+n > len(l.src) {
					return "", errAt(l.posOf(l.i-2), "truncated \\%c escape", e)
				}
				var r rune
				for _, h := range l.src[l.i : l.i+n] {
					d := hexVal(byte(h))
					if d < 0 {
						return "", errAt(l.posOf(l.i-2), "bad \\%c escape", e)
					}
					r = r*16 + rune(d)
				}
				l.i += n
				b.WriteRune(r)
			default:
				// Python keeps unknown escapes verbatim.
				b.WriteByte('\\')
				b.WriteByte(e)
			}
		default:
			b.WriteByte(c)
			l.i++
		}
	}
	return "", errAt(l.posOf(start), "unterminated string")
}

func hexVal(c byte) int {
	switch {
	case c >= '0' && c <= '9':
		return int(c - '0')
	case c >= 'a' && c <= 'f':
		return int(c-'a') + 10
	case c >= 'A' && c <= 'F':
		return int(c-'A') + 10
	}
	return -1
}
