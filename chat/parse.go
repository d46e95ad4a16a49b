package chat

import (
	"strconv"
)

// Statements.
type (
	node interface{}

	textNode   struct{ s string }
	outputNode struct{ x expr }
	ifNode     struct {
		conds  []expr
		bodies [][]node
		els    []node
	}
	forNode struct {
		pos      pos
		names    []string
		iter     expr
		filter   expr
		body     []node
		els      []node
		unpacked bool
	}
	// setNode assigns x to names (a tuple when several), or to attr of the
	// namespace held by names[0] when attr is set.
	setNode struct {
		pos   pos
		names []string
		attr  string
		x     expr
		body  []node // {% set x %}...{% endset %}
	}
	loopCtlNode struct{ brk bool }
)

// Expressions.
type (
	expr interface{ at() pos }

	literal struct {
		p pos
		v value
	}
	nameExpr struct {
		p    pos
		name string
	}
	attrExpr struct {
		p    pos
		obj  expr
		name string
	}
	indexExpr struct {
		p        pos
		obj, key expr
	}
	sliceExpr struct {
		p                      pos
		obj, start, stop, step expr
	}
	callExpr struct {
		p      pos
		fn     expr
		args   []expr
		kwargs []kwarg
	}
	filterExpr struct {
		p      pos
		x      expr
		name   string
		args   []expr
		kwargs []kwarg
	}
	testExpr struct {
		p      pos
		x      expr
		name   string
		args   []expr
		negate bool
	}
	binExpr struct {
		p    pos
		op   string
		l, r expr
	}
	unaryExpr struct {
		p  pos
		op string
		x  expr
	}
	condExpr struct {
		p               pos
		then, test, els expr
	}
	listExpr struct {
		p     pos
		items []expr
		tuple bool
	}
	dictExpr struct {
		p          pos
		keys, vals []expr
	}
	kwarg struct {
		name string
		x    expr
	}
)

func (e *literal) at() pos    { return e.p }
func (e *nameExpr) at() pos   { return e.p }
func (e *attrExpr) at() pos   { return e.p }
func (e *indexExpr) at() pos  { return e.p }
func (e *sliceExpr) at() pos  { return e.p }
func (e *callExpr) at() pos   { return e.p }
func (e *filterExpr) at() pos { return e.p }
func (e *testExpr) at() pos   { return e.p }
func (e *binExpr) at() pos    { return e.p }
func (e *unaryExpr) at() pos  { return e.p }
func (e *condExpr) at() pos   { return e.p }
func (e *listExpr) at() pos   { return e.p }
func (e *dictExpr) at() pos   { return e.p }

// maxDepth bounds parser recursion so hostile input errors out instead of
// exhausting the goroutine stack (which Go cannot recover from).
const maxDepth = 200

type parser struct {
	toks  []token
	i     int
	depth int
}

func parse(src string) ([]node, error) {
	toks, err := lex(src)
	if err != nil {
		return nil, err
	}
	p := &parser{toks: toks}
	body, end, err := p.body()
	if err != nil {
		return nil, err
	}
	if end != nil {
		return nil, errAt(end.pos, "unexpected {%% %s %%}", end.val)
	}
	return body, nil
}

func (p *parser) peek() token { return p.toks[p.i] }

func (p *parser) next() token {
	t := p.toks[p.i]
	if t.kind != tEOF {
		p.i++
	}
	return t
}

func (p *parser) isOp(op string) bool {
	t := p.peek()
	return t.kind == tOp && t.val == op
}

func (p *parser) isName(name string) bool {
	t := p.peek()
	return t.kind == tName && t.val == name
}

func (p *parser) expectOp(op string) error {
	t := p.next()
	if t.kind != tOp || t.val != op {
		return errAt(t.pos, "expected %q, found %s", op, describe(t))
	}
	return nil
}

func (p *parser) expectEnd() error {
	t := p.next()
	if t.kind != tBlockEnd {
		return errAt(t.pos, "expected end of tag, found %s", describe(t))
	}
	return nil
}

func describe(t token) string {
	switch t.kind {
	case tEOF:
		return "end of template"
	case tText:
		return "text"
	}
	return strconv.Quote(t.val)
}

func (p *parser) enter(at pos) error {
	p.depth++
	if p.depth > maxDepth {
		return errAt(at, "nesting deeper than %d", maxDepth)
	}
	return nil
}

func (p *parser) leave() { p.depth-- }

// body parses statements up to the end of input or a block tag whose
// keyword it does not handle itself (endif, else, ...); that keyword token
// is returned with the parser positioned after it, its tag still open.
func (p *parser) body() ([]node, *token, error) {
	var out []node
	for {
		t := p.next()
		switch t.kind {
		case tEOF:
			return out, nil, nil
		case tText:
			out = append(out, &textNode{t.val})
		case tVarBegin:
			x, err := p.tuple()
			if err != nil {
				return nil, nil, err
			}
			if t := p.next(); t.kind != tVarEnd {
				return nil, nil, errAt(t.pos, "expected }}, found %s", describe(t))
			}
			out = append(out, &outputNode{x})
		case tBlockBegin:
			kw := p.next()
			if kw.kind != tName {
				return nil, nil, errAt(kw.pos, "expected a statement keyword, found %s", describe(kw))
			}
			n, err := p.statement(kw)
			if err != nil {
				return nil, nil, err
			}
			if n == nil {
				return out, &kw, nil
			}
			out = append(out, n)
		default:
			return nil, nil, errAt(t.pos, "unexpected %s", describe(t))
		}
	}
}

// statement parses the statement opened by kw, or returns nil for a
// keyword that closes or splits an enclosing block.
func (p *parser) statement(kw token) (node, error) {
	switch kw.val {
	case "if":
		if err := p.enter(kw.pos); err != nil {
			return nil, err
		}
		defer p.leave()
		return p.ifStmt(kw)
	case "for":
		if err := p.enter(kw.pos); err != nil {
			return nil, err
		}
		defer p.leave()
		return p.forStmt(kw)
	case "set":
		if err := p.enter(kw.pos); err != nil {
			return nil, err
		}
		defer p.leave()
		return p.setStmt(kw)
	case "break", "continue":
		return &loopCtlNode{brk: kw.val == "break"}, p.expectEnd()
	case "generation":
		// transformers' AssistantTracker tag: it only marks the span of
		// assistant tokens, so the body renders as-is.
		if err := p.expectEnd(); err != nil {
			return nil, err
		}
		if err := p.enter(kw.pos); err != nil {
			return nil, err
		}
		defer p.leave()
		body, end, err := p.body()
		if err != nil {
			return nil, err
		}
		if err := p.closeBlock(kw, end, "endgeneration"); err != nil {
			return nil, err
		}
		return &ifNode{conds: []expr{&literal{kw.pos, true}}, bodies: [][]node{body}}, nil
	case "elif", "else", "endif", "endfor", "endset", "endgeneration":
		return nil, nil
	}
	return nil, errAt(kw.pos, "unsupported statement %q", kw.val)
}

func (p *parser) closeBlock(open token, end *token, want string) error {
	if end == nil {
		return errAt(open.pos, "{%% %s %%} is never closed with {%% %s %%}", open.val, want)
	}
	if end.val != want {
		return errAt(end.pos, "unexpected {%% %s %%} inside {%% %s %%} (want %s)", end.val, open.val, want)
	}
	return p.expectEnd()
}

func (p *parser) ifStmt(kw token) (node, error) {
	n := &ifNode{}
	for {
		cond, err := p.tuple()
		if err != nil {
			return nil, err
		}
		if err := p.expectEnd(); err != nil {
			return nil, err
		}
		body, end, err := p.body()
		if err != nil {
			return nil, err
		}
		n.conds = append(n.conds, cond)
		n.bodies = append(n.bodies, body)
		if end == nil {
			return nil, errAt(kw.pos, "{%% if %%} is never closed with {%% endif %%}")
		}
		switch end.val {
		case "elif":
			continue
		case "else":
			if err := p.expectEnd(); err != nil {
				return nil, err
			}
			els, end2, err := p.body()
			if err != nil {
				return nil, err
			}
			n.els = els
			return n, p.closeBlock(kw, end2, "endif")
		default:
			return n, p.closeBlock(kw, end, "endif")
		}
	}
}

func (p *parser) forStmt(kw token) (node, error) {
	n := &forNode{pos: kw.pos}
	for {
		t := p.next()
		if t.kind != tName {
			return nil, errAt(t.pos, "expected a loop variable, found %s", describe(t))
		}
		n.names = append(n.names, t.val)
		if !p.isOp(",") {
			break
		}
		p.next()
		n.unpacked = true
	}
	if t := p.next(); t.kind != tName || t.val != "in" {
		return nil, errAt(t.pos, "expected \"in\", found %s", describe(t))
	}
	iter, err := p.or()
	if err != nil {
		return nil, err
	}
	n.iter = iter
	if p.isName("if") {
		p.next()
		if n.filter, err = p.or(); err != nil {
			return nil, err
		}
	}
	if err := p.expectEnd(); err != nil {
		return nil, err
	}
	body, end, err := p.body()
	if err != nil {
		return nil, err
	}
	n.body = body
	if end != nil && end.val == "else" {
		if err := p.expectEnd(); err != nil {
			return nil, err
		}
		if n.els, end, err = p.body(); err != nil {
			return nil, err
		}
	}
	return n, p.closeBlock(kw, end, "endfor")
}

func (p *parser) setStmt(kw token) (node, error) {
	n := &setNode{pos: kw.pos}
	t := p.next()
	if t.kind != tName {
		return nil, errAt(t.pos, "expected a variable name, found %s", describe(t))
	}
	n.names = []string{t.val}
	switch {
	case p.isOp("."):
		p.next()
		a := p.next()
		if a.kind != tName {
			return nil, errAt(a.pos, "expected an attribute name, found %s", describe(a))
		}
		n.attr = a.val
	case p.isOp(","):
		for p.isOp(",") {
			p.next()
			t := p.next()
			if t.kind != tName {
				return nil, errAt(t.pos, "expected a variable name, found %s", describe(t))
			}
			n.names = append(n.names, t.val)
		}
	}
	if p.peek().kind == tBlockEnd && n.attr == "" && len(n.names) == 1 {
		p.next()
		body, end, err := p.body()
		if err != nil {
			return nil, err
		}
		n.body = body
		return n, p.closeBlock(kw, end, "endset")
	}
	if err := p.expectOp("="); err != nil {
		return nil, err
	}
	x, err := p.tuple()
	if err != nil {
		return nil, err
	}
	n.x = x
	return n, p.expectEnd()
}

// tuple parses an expression, or a bare tuple when commas follow.
func (p *parser) tuple() (expr, error) {
	start := p.peek().pos
	first, err := p.expr()
	if err != nil {
		return nil, err
	}
	if !p.isOp(",") {
		return first, nil
	}
	items := []expr{first}
	for p.isOp(",") {
		p.next()
		if p.endsTuple() {
			break
		}
		x, err := p.expr()
		if err != nil {
			return nil, err
		}
		items = append(items, x)
	}
	return &listExpr{p: start, items: items, tuple: true}, nil
}

func (p *parser) endsTuple() bool {
	t := p.peek()
	return t.kind == tVarEnd || t.kind == tBlockEnd || t.kind == tEOF || t.kind == tOp && (t.val == ")" || t.val == "]" || t.val == "}" || t.val == "=")
}

func (p *parser) expr() (expr, error) {
	at := p.peek().pos
	if err := p.enter(at); err != nil {
		return nil, err
	}
	defer p.leave()
	x, err := p.or()
	if err != nil {
		return nil, err
	}
	for p.isName("if") {
		p.next()
		test, err := p.or()
		if err != nil {
			return nil, err
		}
		var els expr
		if p.isName("else") {
			p.next()
			if els, err = p.or(); err != nil {
				return nil, err
			}
		}
		x = &condExpr{p: at, then: x, test: test, els: els}
	}
	return x, nil
}

func (p *parser) or() (expr, error)  { return p.leftAssoc("or", p.and) }
func (p *parser) and() (expr, error) { return p.leftAssoc("and", p.not) }

// leftAssoc parses operand (op operand)* into a left-leaning chain of binary expressions.
func (p *parser) leftAssoc(op string, operand func() (expr, error)) (expr, error) {
	x, err := operand()
	for err == nil && p.isName(op) {
		t := p.next()
		var r expr
		if r, err = operand(); err == nil {
			x = &binExpr{p: t.pos, op: op, l: x, r: r}
		}
	}
	return x, err
}

func (p *parser) not() (expr, error) {
	if p.isName("not") {
		t := p.next()
		if err := p.enter(t.pos); err != nil {
			return nil, err
		}
		defer p.leave()
		x, err := p.not()
		if err != nil {
			return nil, err
		}
		return &unaryExpr{p: t.pos, op: "not", x: x}, nil
	}
	return p.compare()
}

var compareOps = map[string]bool{"==": true, "!=": true, "<": true, "<=": true, ">": true, ">=": true}

func (p *parser) compare() (expr, error) {
	x, err := p.math1()
	if err != nil {
		return nil, err
	}
	// Chained comparisons (a < b < c) become a conjunction, as in Python;
	// the middle operand is evaluated twice, harmless without side effects.
	var chain expr
	for {
		t := p.peek()
		op := ""
		switch {
		case t.kind == tOp && compareOps[t.val]:
			op = t.val
			p.next()
		case t.kind == tName && t.val == "in":
			op = "in"
			p.next()
		case t.kind == tName && t.val == "not" && p.toks[p.i+1].kind == tName && p.toks[p.i+1].val == "in":
			op = "not in"
			p.i += 2
		default:
			if chain != nil {
				return chain, nil
			}
			return x, nil
		}
		r, err := p.math1()
		if err != nil {
			return nil, err
		}
		c := &binExpr{p: t.pos, op: op, l: x, r: r}
		if chain == nil {
			chain = c
		} else {
			chain = &binExpr{p: t.pos, op: "and", l: chain, r: c}
		}
		x = r
	}
}

func (p *parser) binary(next func() (expr, error), ops ...string) (expr, error) {
	x, err := next()
	if err != nil {
		return nil, err
	}
	for {
		t := p.peek()
		match := false
		for _, op := range ops {
			if t.kind == tOp && t.val == op {
				match = true
			}
		}
		if !match {
			return x, nil
		}
		p.next()
		r, err := next()
		if err != nil {
			return nil, err
		}
		x = &binExpr{p: t.pos, op: t.val, l: x, r: r}
	}
}

func (p *parser) math1() (expr, error)  { return p.binary(p.concat, "+", "-") }
func (p *parser) concat() (expr, error) { return p.binary(p.math2, "~") }
func (p *parser) math2() (expr, error)  { return p.binary(p.pow, "*", "/", "//", "%") }
func (p *parser) pow() (expr, error)    { return p.binary(p.unaryFiltered, "**") }

func (p *parser) unaryFiltered() (expr, error) {
	x, err := p.unary()
	if err != nil {
		return nil, err
	}
	return p.filters(x)
}

func (p *parser) unary() (expr, error) {
	t := p.peek()
	if t.kind == tOp && (t.val == "-" || t.val == "+") {
		p.next()
		if err := p.enter(t.pos); err != nil {
			return nil, err
		}
		defer p.leave()
		x, err := p.unary()
		if err != nil {
			return nil, err
		}
		return &unaryExpr{p: t.pos, op: t.val, x: x}, nil
	}
	x, err := p.primary()
	if err != nil {
		return nil, err
	}
	return p.postfix(x)
}

func (p *parser) postfix(x expr) (expr, error) {
	for {
		t := p.peek()
		if t.kind != tOp {
			return x, nil
		}
		switch t.val {
		case ".":
			p.next()
			a := p.next()
			switch a.kind {
			case tName:
				x = &attrExpr{p: a.pos, obj: x, name: a.val}
			case tInt:
				n, _ := strconv.ParseInt(a.val, 10, 64)
				x = &indexExpr{p: a.pos, obj: x, key: &literal{a.pos, n}}
			default:
				return nil, errAt(a.pos, "expected an attribute name after '.', found %s", describe(a))
			}
		case "[":
			p.next()
			var err error
			if x, err = p.subscript(t.pos, x); err != nil {
				return nil, err
			}
		case "(":
			p.next()
			args, kwargs, err := p.args()
			if err != nil {
				return nil, err
			}
			x = &callExpr{p: t.pos, fn: x, args: args, kwargs: kwargs}
		default:
			return x, nil
		}
	}
}

func (p *parser) subscript(at pos, obj expr) (expr, error) {
	var parts [3]expr
	n, colons := 0, 0
	for {
		if p.isOp("]") {
			p.next()
			break
		}
		if p.isOp(":") {
			p.next()
			colons++
			n++
			if n > 2 {
				return nil, errAt(at, "too many ':' in slice")
			}
			continue
		}
		if parts[n] != nil {
			return nil, errAt(p.peek().pos, "expected ':' or ']', found %s", describe(p.peek()))
		}
		x, err := p.expr()
		if err != nil {
			return nil, err
		}
		parts[n] = x
	}
	if colons == 0 {
		if parts[0] == nil {
			return nil, errAt(at, "empty subscript")
		}
		return &indexExpr{p: at, obj: obj, key: parts[0]}, nil
	}
	return &sliceExpr{p: at, obj: obj, start: parts[0], stop: parts[1], step: parts[2]}, nil
}

// args parses a call's arguments after its "(".
func (p *parser) args() ([]expr, []kwarg, error) {
	var args []expr
	var kwargs []kwarg
	err := p.commaList(")", func() error {
		t := p.peek()
		if t.kind == tName && p.toks[p.i+1].kind == tOp && p.toks[p.i+1].val == "=" {
			p.i += 2
			x, err := p.expr()
			if err != nil {
				return err
			}
			kwargs = append(kwargs, kwarg{t.val, x})
			return nil
		}
		if len(kwargs) > 0 {
			return errAt(t.pos, "positional argument after keyword argument")
		}
		x, err := p.expr()
		if err != nil {
			return err
		}
		args = append(args, x)
		return nil
	})
	return args, kwargs, err
}

// commaList parses items separated by commas (a trailing one allowed) up to and including
// the closing operator.
func (p *parser) commaList(close string, item func() error) error {
	for n := 0; !p.isOp(close); n++ {
		if n > 0 {
			if err := p.expectOp(","); err != nil {
				return err
			}
			if p.isOp(close) {
				break
			}
		}
		if err := item(); err != nil {
			return err
		}
	}
	p.next()
	return nil
}

func (p *parser) filters(x expr) (expr, error) {
	for {
		switch {
		case p.isOp("|"):
			p.next()
			t := p.next()
			if t.kind != tName {
				return nil, errAt(t.pos, "expected a filter name, found %s", describe(t))
			}
			f := &filterExpr{p: t.pos, x: x, name: t.val}
			if p.isOp("(") {
				p.next()
				var err error
				if f.args, f.kwargs, err = p.args(); err != nil {
					return nil, err
				}
			}
			x = f
		case p.isName("is"):
			p.next()
			te := &testExpr{p: p.peek().pos, x: x}
			if p.isName("not") {
				p.next()
				te.negate = true
			}
			t := p.next()
			if t.kind != tName {
				return nil, errAt(t.pos, "expected a test name, found %s", describe(t))
			}
			te.name = t.val
			switch nt := p.peek(); {
			case nt.kind == tOp && nt.val == "(":
				p.next()
				args, kwargs, err := p.args()
				if err != nil {
					return nil, err
				}
				if len(kwargs) > 0 {
					return nil, errAt(nt.pos, "tests take no keyword arguments")
				}
				te.args = args
			case nt.kind == tString || nt.kind == tInt || nt.kind == tFloat ||
				nt.kind == tName && nt.val != "else" && nt.val != "or" && nt.val != "and" && nt.val != "if" ||
				nt.kind == tOp && (nt.val == "[" || nt.val == "{"):
				// Jinja2 allows one bare argument: "x is divisibleby 3".
				a, err := p.primary()
				if err != nil {
					return nil, err
				}
				if a, err = p.postfix(a); err != nil {
					return nil, err
				}
				te.args = []expr{a}
			}
			x = te
		default:
			return x, nil
		}
	}
}

func (p *parser) primary() (expr, error) {
	t := p.next()
	if err := p.enter(t.pos); err != nil {
		return nil, err
	}
	defer p.leave()
	switch t.kind {
	case tName:
		switch t.val {
		case "true", "True":
			return &literal{t.pos, true}, nil
		case "false", "False":
			return &literal{t.pos, false}, nil
		case "none", "None":
			return &literal{t.pos, nil}, nil
		}
		return &nameExpr{p: t.pos, name: t.val}, nil
	case tString:
		s := t.val
		// Adjacent literals concatenate, as in Python.
		for p.peek().kind == tString {
			s += p.next().val
		}
		return &literal{t.pos, s}, nil
	case tInt:
		n, err := strconv.ParseInt(t.val, 10, 64)
		if err != nil {
			return nil, errAt(t.pos, "integer %s out of range", t.val)
		}
		return &literal{t.pos, n}, nil
	case tFloat:
		f, err := strconv.ParseFloat(t.val, 64)
		if err != nil {
			return nil, errAt(t.pos, "bad number %s", t.val)
		}
		return &literal{t.pos, f}, nil
	case tOp:
		switch t.val {
		case "(":
			if p.isOp(")") {
				p.next()
				return &listExpr{p: t.pos, tuple: true}, nil
			}
			x, err := p.tuple()
			if err != nil {
				return nil, err
			}
			return x, p.expectOp(")")
		case "[":
			l := &listExpr{p: t.pos}
			err := p.commaList("]", func() error {
				x, err := p.expr()
				l.items = append(l.items, x)
				return err
			})
			return l, err
		case "{":
			d := &dictExpr{p: t.pos}
			err := p.commaList("}", func() error {
				k, err := p.expr()
				if err != nil {
					return err
				}
				if err := p.expectOp(":"); err != nil {
					return err
				}
				v, err := p.expr()
				d.keys, d.vals = append(d.keys, k), append(d.vals, v)
				return err
			})
			return d, err
		}
	}
	return nil, errAt(t.pos, "unexpected %s", describe(t))
}
