package chat

import (
	"errors"
	"fmt"
	"math"
	"strings"
)

type scope struct {
	vars   map[string]value
	parent *scope
}

func (s *scope) lookup(name string) (value, bool) {
	for ; s != nil; s = s.parent {
		if v, ok := s.vars[name]; ok {
			return v, true
		}
	}
	return nil, false
}

type renderer struct {
	out strings.Builder
	*budget
}

// loopSignal carries {% break %} and {% continue %} up to their loop.
type loopSignal struct{ brk bool }

func (loopSignal) Error() string { return "loop control outside a loop" }

func (r *renderer) nodes(s *scope, ns []node) error {
	for _, n := range ns {
		if err := r.node(s, n); err != nil {
			return err
		}
	}
	return nil
}

func (r *renderer) write(p pos, s string) error {
	if r.out.Len()+len(s) > maxOutput {
		return errAt(p, "output larger than %d bytes", maxOutput)
	}
	r.out.WriteString(s)
	return nil
}

func (r *renderer) node(s *scope, n node) error {
	switch n := n.(type) {
	case *textNode:
		return r.write(pos{}, n.s)
	case *outputNode:
		v, err := r.eval(s, n.x)
		if err != nil {
			return err
		}
		text, err := r.str(v)
		if err != nil {
			return errAt(n.x.at(), "%v", err)
		}
		return r.write(n.x.at(), text)
	case *ifNode:
		for i, c := range n.conds {
			v, err := r.eval(s, c)
			if err != nil {
				return err
			}
			if truthy(v) {
				return r.nodes(s, n.bodies[i])
			}
		}
		return r.nodes(s, n.els)
	case *forNode:
		return r.forLoop(s, n)
	case *setNode:
		return r.set(s, n)
	case *loopCtlNode:
		return loopSignal{brk: n.brk}
	}
	return fmt.Errorf("internal: unknown node %T", n)
}

func (r *renderer) set(s *scope, n *setNode) error {
	var v value
	if n.body != nil {
		sub := &renderer{budget: r.budget}
		if err := sub.nodes(s, n.body); err != nil {
			return err
		}
		v = sub.out.String()
	} else {
		var err error
		if v, err = r.eval(s, n.x); err != nil {
			return err
		}
	}
	if n.attr != "" {
		obj, _ := s.lookup(n.names[0])
		ns, ok := obj.(*namespace)
		if !ok {
			return errAt(n.pos, "cannot assign attribute on non-namespace object %s", typeName(obj))
		}
		ns.d.set(n.attr, v)
		return nil
	}
	return r.bindNames(s, n.names, len(n.names) > 1, v, n.pos)
}

// bindNames assigns v to one name, or unpacks it over several (set a, b = ...; for a, b in).
func (r *renderer) bindNames(s *scope, names []string, unpacked bool, v value, at pos) error {
	if !unpacked {
		s.vars[names[0]] = v
		return nil
	}
	items, err := r.unpack(v, len(names))
	if err != nil {
		return errAt(at, "%v", err)
	}
	for i, name := range names {
		s.vars[name] = items[i]
	}
	return nil
}

func (r *renderer) unpack(v value, n int) ([]value, error) {
	items, ok, err := r.sequence(v)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, fmt.Errorf("cannot unpack %s into %d names", typeName(v), n)
	}
	if len(items) != n {
		return nil, fmt.Errorf("cannot unpack %d values into %d names", len(items), n)
	}
	return items, nil
}

func (r *renderer) forLoop(s *scope, n *forNode) error {
	it, err := r.eval(s, n.iter)
	if err != nil {
		return err
	}
	items, err := r.iterate(it)
	if err != nil {
		return errAt(n.iter.at(), "%v", err)
	}
	bind := func(sc *scope, item value) error { return r.bindNames(sc, n.names, n.unpacked, item, n.pos) }
	if n.filter != nil {
		var kept []value
		for _, item := range items {
			sc := &scope{vars: map[string]value{}, parent: s}
			if err := bind(sc, item); err != nil {
				return err
			}
			ok, err := r.eval(sc, n.filter)
			if err != nil {
				return err
			}
			if truthy(ok) {
				kept = append(kept, item)
			}
		}
		items = kept
	}
	if len(items) == 0 {
		return r.nodes(s, n.els)
	}
	for i, item := range items {
		r.steps++
		if r.steps > maxIterations {
			return errAt(n.pos, "more than %d loop iterations", maxIterations)
		}
		// Each iteration gets a fresh scope: as in Jinja2, a {% set %} in a
		// loop body is gone by the next iteration and after the loop.
		sc := &scope{vars: map[string]value{"loop": &loopState{items, i}}, parent: s}
		if err := bind(sc, item); err != nil {
			return err
		}
		err := r.nodes(sc, n.body)
		var sig loopSignal
		if errors.As(err, &sig) {
			if sig.brk {
				break
			}
			continue
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// loopState is the loop variable; its attributes are computed on access
// because most loops read few of them.
type loopState struct {
	items []value
	i     int
}

func (l *loopState) attr(name string) value {
	n := len(l.items)
	switch name {
	case "index":
		return int64(l.i + 1)
	case "index0":
		return int64(l.i)
	case "revindex":
		return int64(n - l.i)
	case "revindex0":
		return int64(n - l.i - 1)
	case "first":
		return l.i == 0
	case "last":
		return l.i == n-1
	case "length":
		return int64(n)
	case "previtem":
		if l.i > 0 {
			return l.items[l.i-1]
		}
	case "nextitem":
		if l.i < n-1 {
			return l.items[l.i+1]
		}
	case "cycle":
		return fn("cycle", func(_ *renderer, args []value, _ *dict) (value, error) {
			if len(args) == 0 {
				return nil, fmt.Errorf("no items for cycling given")
			}
			return args[l.i%len(args)], nil
		})
	}
	return undefined{"loop." + name}
}

// sequence is the items of a list or a tuple, or a string's characters, as Python unpacks and
// iterates them; ok is false for any other value. A string's characters are built, at their
// cost, and at most maxItems of them.
func (r *renderer) sequence(v value) (items []value, ok bool, err error) {
	switch x := v.(type) {
	case list:
		return x, true, nil
	case tuple:
		return x, true, nil
	case string:
		n := runeLen(x)
		if n > maxItems {
			return nil, true, fmt.Errorf("a string of more than %d characters cannot be iterated or unpacked", maxItems)
		}
		if err := r.spend(len(x) + itemCost*n); err != nil {
			return nil, true, err
		}
		items = make([]value, 0, n)
		for _, c := range x {
			items = append(items, string(c))
		}
		return items, true, nil
	}
	return nil, false, nil
}

// iterate lists what a for loop walks over: dicts yield their keys and
// strings their characters, as in Python.
func (r *renderer) iterate(v value) ([]value, error) {
	switch x := v.(type) {
	case undefined:
		return nil, nil
	case *dict:
		if err := r.spend(size(x)); err != nil {
			return nil, err
		}
		out := make([]value, len(x.keys))
		for i, k := range x.keys {
			out[i] = k
		}
		return out, nil
	}
	items, ok, err := r.sequence(v)
	if err != nil || ok {
		return items, err
	}
	return nil, fmt.Errorf("%s object is not iterable", typeName(v))
}

// eval evaluates e. What an operator (but and and or, which yield an operand), a call, a
// filter, a slice or a literal list or dict yields costs its size; what a builtin scans
// without building it costs where it scans (a string method its string, for instance).
func (r *renderer) eval(s *scope, e expr) (value, error) {
	v, err := r.evalExpr(s, e)
	if err != nil {
		return nil, err
	}
	switch e := e.(type) {
	case *binExpr:
		if e.op == "and" || e.op == "or" {
			break
		}
		if err := r.spend(size(v)); err != nil {
			return nil, errAt(e.at(), "%v", err)
		}
	case *callExpr, *filterExpr, *sliceExpr, *listExpr, *dictExpr:
		if err := r.spend(size(v)); err != nil {
			return nil, errAt(e.at(), "%v", err)
		}
	}
	return v, nil
}

func (r *renderer) evalExpr(s *scope, e expr) (value, error) {
	switch e := e.(type) {
	case *literal:
		return e.v, nil
	case *nameExpr:
		if v, ok := s.lookup(e.name); ok {
			return v, nil
		}
		return undefined{e.name}, nil
	case *attrExpr:
		obj, err := r.eval(s, e.obj)
		if err != nil {
			return nil, err
		}
		if u, ok := obj.(undefined); ok {
			return nil, errAt(e.p, "%s is undefined (reading .%s)", u.describe(), e.name)
		}
		if m := method(obj, e.name); m != nil {
			return m, nil
		}
		return named(item(obj, e.name), e), nil
	case *indexExpr:
		obj, err := r.eval(s, e.obj)
		if err != nil {
			return nil, err
		}
		key, err := r.eval(s, e.key)
		if err != nil {
			return nil, err
		}
		if u, ok := obj.(undefined); ok {
			return nil, errAt(e.p, "%s is undefined (reading [%s])", u.describe(), brief(key))
		}
		v, err := r.index(obj, key)
		if err != nil {
			return nil, errAt(e.p, "%v", err)
		}
		return named(v, e), nil
	case *sliceExpr:
		return r.slice(s, e)
	case *callExpr:
		return r.call(s, e)
	case *filterExpr:
		return r.filter(s, e)
	case *testExpr:
		return r.test(s, e)
	case *binExpr:
		return r.binary(s, e)
	case *unaryExpr:
		v, err := r.eval(s, e.x)
		if err != nil {
			return nil, err
		}
		switch e.op {
		case "not":
			return !truthy(v), nil
		case "-":
			switch x := v.(type) {
			case int64:
				if x == math.MinInt64 {
					return nil, errAt(e.p, "%v", errOverflow)
				}
				return -x, nil
			case float64:
				return -x, nil
			case bool:
				return -boolInt(x), nil
			}
		case "+":
			switch x := v.(type) {
			case int64, float64:
				return x, nil
			case bool:
				return boolInt(x), nil
			}
		}
		return nil, errAt(e.p, "bad operand type for unary %s: %s", e.op, typeName(v))
	case *condExpr:
		t, err := r.eval(s, e.test)
		if err != nil {
			return nil, err
		}
		if truthy(t) {
			return r.eval(s, e.then)
		}
		if e.els == nil {
			return undefined{"else branch"}, nil
		}
		return r.eval(s, e.els)
	case *listExpr:
		out := make([]value, len(e.items))
		for i, x := range e.items {
			v, err := r.eval(s, x)
			if err != nil {
				return nil, err
			}
			out[i] = v
		}
		if e.tuple {
			return tuple(out), nil
		}
		return list(out), nil
	case *dictExpr:
		d := newDict()
		for i := range e.keys {
			k, err := r.eval(s, e.keys[i])
			if err != nil {
				return nil, err
			}
			ks, ok := k.(string)
			if !ok {
				return nil, errAt(e.keys[i].at(), "dict keys must be strings here, not %s", typeName(k))
			}
			v, err := r.eval(s, e.vals[i])
			if err != nil {
				return nil, err
			}
			d.set(ks, v)
		}
		return d, nil
	}
	return nil, fmt.Errorf("internal: unknown expression %T", e)
}

// named labels an undefined result with the expression that produced it,
// so that a later error can say which lookup came up empty.
func named(v value, e expr) value {
	if _, ok := v.(undefined); ok {
		return undefined{exprName(e)}
	}
	return v
}

func exprName(e expr) string {
	switch e := e.(type) {
	case *nameExpr:
		return e.name
	case *attrExpr:
		return exprName(e.obj) + "." + e.name
	case *indexExpr:
		if l, ok := e.key.(*literal); ok {
			return exprName(e.obj) + "[" + brief(l.v) + "]"
		}
		return exprName(e.obj) + "[...]"
	}
	return "value"
}

func (u undefined) describe() string {
	if u.name == "" {
		return "value"
	}
	return fmt.Sprintf("%q", u.name)
}

func boolInt(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

// item is obj.name or obj[name] for a string key: Jinja2 falls back from
// one to the other, so both spellings read dict keys.
func item(obj value, name string) value {
	switch x := obj.(type) {
	case *dict:
		if v, ok := x.get(name); ok {
			return v
		}
	case *namespace:
		if v, ok := x.d.get(name); ok {
			return v
		}
	case *loopState:
		return x.attr(name)
	}
	return undefined{name}
}

// index is obj[key]. A string's character is found by walking the string, at its cost.
func (r *renderer) index(obj, key value) (value, error) {
	if k, ok := key.(string); ok {
		if v := item(obj, k); !isUndefined(v) {
			return v, nil
		}
		if m := method(obj, k); m != nil {
			return m, nil
		}
		return undefined{k}, nil
	}
	i, ok := asInt(key)
	if !ok {
		return undefined{brief(key)}, nil
	}
	switch x := obj.(type) {
	case list:
		return at(x, i, key), nil
	case tuple:
		return at(x, i, key), nil
	case string:
		if err := r.spend(len(x)); err != nil {
			return nil, err
		}
		n := int64(runeLen(x))
		if i < 0 {
			i += n
		}
		if i < 0 || i >= n {
			return undefined{brief(key)}, nil
		}
		for _, c := range x {
			if i == 0 {
				return string(c), nil
			}
			i--
		}
	}
	return undefined{brief(key)}, nil
}

// at is items[i], counting from the end for a negative i; undefined, named by key, outside.
func at(items []value, i int64, key value) value {
	if i < 0 {
		i += int64(len(items))
	}
	if i < 0 || i >= int64(len(items)) {
		return undefined{brief(key)}
	}
	return items[i]
}

func isUndefined(v value) bool {
	_, ok := v.(undefined)
	return ok
}

// asInt accepts ints and bools (a Python bool is an int).
func asInt(v value) (int64, bool) {
	switch x := v.(type) {
	case int64:
		return x, true
	case bool:
		return boolInt(x), true
	}
	return 0, false
}

func (r *renderer) slice(s *scope, e *sliceExpr) (value, error) {
	obj, err := r.eval(s, e.obj)
	if err != nil {
		return nil, err
	}
	var bounds [3]*int64
	for i, x := range []expr{e.start, e.stop, e.step} {
		if x == nil {
			continue
		}
		v, err := r.eval(s, x)
		if err != nil {
			return nil, err
		}
		if v == nil {
			continue
		}
		n, ok := asInt(v)
		if !ok {
			return nil, errAt(x.at(), "slice indices must be integers, not %s", typeName(v))
		}
		bounds[i] = &n
	}
	var items []value
	var chars []rune // a string's, which its slice is built of
	isStr := false
	switch x := obj.(type) {
	case list:
		items = x
	case tuple:
		items = x
	case string:
		if err := r.spend(len(x)); err != nil {
			return nil, errAt(e.p, "%v", err)
		}
		chars, isStr = []rune(x), true
	default:
		return nil, errAt(e.p, "%s object is not sliceable", typeName(obj))
	}
	sl, err := pySlice(max(len(items), len(chars)), bounds)
	if err != nil {
		return nil, errAt(e.p, "%v", err)
	}
	if isStr {
		out := make([]rune, 0, sl.n)
		for k, j := 0, sl.start; k < sl.n; k, j = k+1, j+sl.step {
			out = append(out, chars[j])
		}
		return string(out), nil
	}
	out := make([]value, 0, sl.n)
	for k, j := 0, sl.start; k < sl.n; k, j = k+1, j+sl.step {
		out = append(out, items[j])
	}
	if _, ok := obj.(tuple); ok {
		return tuple(out), nil
	}
	return list(out), nil
}

// pyRange is the indices a slice selects: n of them, from start in steps of step.
type pyRange struct{ start, step, n int }

// pySlice is the indices Python's seq[start:stop:step] selects of a sequence of n items.
func pySlice(n int, b [3]*int64) (pyRange, error) {
	step := int64(1)
	if b[2] != nil {
		step = *b[2]
	}
	if step == 0 {
		return pyRange{}, fmt.Errorf("slice step cannot be zero")
	}
	ln := int64(n)
	clamp := func(p *int64, def, lo, hi int64) int64 {
		if p == nil {
			return def
		}
		v := *p
		if v < 0 {
			v += ln
			if v < lo {
				v = lo
			}
		} else if v > hi {
			v = hi
		}
		return v
	}
	// Bounds are clamped to [-1, n], so the span and the count below fit 64 bits.
	if step > 0 {
		start, stop := clamp(b[0], 0, 0, ln), clamp(b[1], ln, 0, ln)
		if start >= stop {
			return pyRange{}, nil
		}
		return pyRange{int(start), int(step), int((uint64(stop-start)-1)/uint64(step)) + 1}, nil
	}
	start, stop := clamp(b[0], ln-1, -1, ln-1), clamp(b[1], -1, -1, ln-1)
	if b[1] == nil {
		stop = -1
	}
	if start <= stop {
		return pyRange{}, nil
	}
	return pyRange{int(start), int(step), int((uint64(start-stop)-1)/uint64(-step)) + 1}, nil
}

func (r *renderer) args(s *scope, args []expr, kwargs []kwarg) ([]value, *dict, error) {
	vals := make([]value, len(args))
	for i, a := range args {
		v, err := r.eval(s, a)
		if err != nil {
			return nil, nil, err
		}
		vals[i] = v
	}
	kw := newDict()
	for _, k := range kwargs {
		v, err := r.eval(s, k.x)
		if err != nil {
			return nil, nil, err
		}
		kw.set(k.name, v)
	}
	return vals, kw, nil
}

func (r *renderer) call(s *scope, e *callExpr) (value, error) {
	fn, err := r.eval(s, e.fn)
	if err != nil {
		return nil, err
	}
	args, kw, err := r.args(s, e.args, e.kwargs)
	if err != nil {
		return nil, err
	}
	f, ok := fn.(*function)
	if !ok {
		if u, isU := fn.(undefined); isU {
			return nil, errAt(e.p, "%s is undefined and cannot be called", u.describe())
		}
		return nil, errAt(e.p, "%s object is not callable", typeName(fn))
	}
	v, err := f.call(r, args, kw)
	if err != nil {
		var te *Error
		if errors.As(err, &te) {
			return nil, err
		}
		return nil, errAt(e.p, "%s: %v", f.name, err)
	}
	return v, nil
}

func (r *renderer) binary(s *scope, e *binExpr) (value, error) {
	l, err := r.eval(s, e.l)
	if err != nil {
		return nil, err
	}
	switch e.op {
	case "and":
		if !truthy(l) {
			return l, nil
		}
		return r.eval(s, e.r)
	case "or":
		if truthy(l) {
			return l, nil
		}
		return r.eval(s, e.r)
	}
	rv, err := r.eval(s, e.r)
	if err != nil {
		return nil, err
	}
	v, err := r.binop(e.op, l, rv)
	if err != nil {
		return nil, errAt(e.p, "%v", err)
	}
	return v, nil
}

func (r *renderer) binop(op string, lv, rv value) (value, error) {
	switch op {
	case "==", "!=":
		eq, err := r.equal(lv, rv)
		return eq == (op == "=="), err
	case "<", "<=", ">", ">=":
		c, err := r.compare(lv, rv, op)
		if err != nil {
			return nil, err
		}
		switch op {
		case "<":
			return c < 0, nil
		case "<=":
			return c <= 0, nil
		case ">":
			return c > 0, nil
		}
		return c >= 0, nil
	case "in", "not in":
		in, err := r.contains(rv, lv)
		if err != nil {
			return nil, err
		}
		return in == (op == "in"), nil
	case "~":
		ls, err := r.str(lv)
		if err != nil {
			return nil, err
		}
		rs, err := r.str(rv)
		if err != nil {
			return nil, err
		}
		if err := checkLen(len(ls) + len(rs)); err != nil {
			return nil, err
		}
		return ls + rs, nil
	}
	for _, v := range []value{lv, rv} {
		if u, ok := v.(undefined); ok {
			return nil, fmt.Errorf("%s is undefined (operand of %s)", u.describe(), op)
		}
	}
	if op == "+" {
		switch a := lv.(type) {
		case string:
			if b, ok := rv.(string); ok {
				if err := checkLen(len(a) + len(b)); err != nil {
					return nil, err
				}
				return a + b, nil
			}
			return nil, fmt.Errorf("can only concatenate str (not %q) to str", typeName(rv))
		case list:
			if b, ok := rv.(list); ok {
				if err := checkItems(len(a) + len(b)); err != nil {
					return nil, err
				}
				return append(append(list{}, a...), b...), nil
			}
		case tuple:
			if b, ok := rv.(tuple); ok {
				if err := checkItems(len(a) + len(b)); err != nil {
					return nil, err
				}
				return append(append(tuple{}, a...), b...), nil
			}
		}
	}
	if op == "*" {
		if out, ok, err := repeat(lv, rv); ok {
			return out, err
		}
		if out, ok, err := repeat(rv, lv); ok {
			return out, err
		}
	}
	return arith(op, lv, rv)
}

// repeat is seq * n for a string or a list seq; ok is false for other operands.
func repeat(seq, n value) (value, bool, error) {
	k, ok := asInt(n)
	if !ok {
		return nil, false, nil
	}
	k = max(k, 0)
	switch x := seq.(type) {
	case string:
		if len(x) > 0 && k > int64(maxOutput/len(x)) {
			return nil, true, checkLen(maxOutput + 1)
		}
		return strings.Repeat(x, int(k)), true, nil
	case list:
		if len(x) > 0 && k > int64(maxItems/len(x)) {
			return nil, true, checkItems(maxItems + 1)
		}
		out := make(list, 0, len(x)*int(k))
		for i := int64(0); i < k; i++ {
			out = append(out, x...)
		}
		return out, true, nil
	}
	return nil, false, nil
}

func asNumber(v value) (i int64, f float64, isFloat, ok bool) {
	switch x := v.(type) {
	case int64:
		return x, float64(x), false, true
	case bool:
		return boolInt(x), float64(boolInt(x)), false, true
	case float64:
		return 0, x, true, true
	}
	return 0, 0, false, false
}

func arith(op string, l, r value) (value, error) {
	li, lf, lfl, ok1 := asNumber(l)
	ri, rf, rfl, ok2 := asNumber(r)
	if !ok1 || !ok2 {
		return nil, fmt.Errorf("unsupported operand type(s) for %s: %q and %q", op, typeName(l), typeName(r))
	}
	if op == "/" {
		if rf == 0 {
			return nil, fmt.Errorf("division by zero")
		}
		return lf / rf, nil
	}
	if lfl || rfl {
		switch op {
		case "+":
			return lf + rf, nil
		case "-":
			return lf - rf, nil
		case "*":
			return lf * rf, nil
		case "**":
			return math.Pow(lf, rf), nil
		case "//", "%":
			if rf == 0 {
				return nil, fmt.Errorf("float division by zero")
			}
			q := math.Floor(lf / rf)
			if op == "//" {
				return q, nil
			}
			return lf - q*rf, nil
		}
	}
	switch op {
	case "+":
		return addInt(li, ri)
	case "-":
		return subInt(li, ri)
	case "*":
		return mulInt(li, ri)
	case "**":
		if ri < 0 {
			return math.Pow(lf, rf), nil
		}
		return powInt(li, ri)
	case "//", "%":
		if ri == 0 {
			return nil, fmt.Errorf("integer division or modulo by zero")
		}
		if li == math.MinInt64 && ri == -1 && op == "//" {
			return nil, errOverflow
		}
		q := li / ri
		if (li%ri != 0) && ((li < 0) != (ri < 0)) {
			q--
		}
		if op == "//" {
			return q, nil
		}
		return li - q*ri, nil
	}
	return nil, fmt.Errorf("unknown operator %s", op)
}

// Python's integers have no bound; a template's are 64 bits, and arithmetic that leaves them
// fails instead of wrapping around.
var errOverflow = errors.New("integer overflow: the result does not fit in 64 bits")

func addInt(a, b int64) (value, error) {
	if c := a + b; (c > a) == (b > 0) {
		return c, nil
	}
	return nil, errOverflow
}

func subInt(a, b int64) (value, error) {
	if c := a - b; (c < a) == (b > 0) {
		return c, nil
	}
	return nil, errOverflow
}

func mulInt(a, b int64) (value, error) {
	c, err := mul64(a, b)
	if err != nil {
		return nil, err
	}
	return c, nil
}

func mul64(a, b int64) (int64, error) {
	if a == 0 || b == 0 {
		return 0, nil
	}
	c := a * b
	if c/b != a || a == -1 && b == math.MinInt64 || b == -1 && a == math.MinInt64 {
		return 0, errOverflow
	}
	return c, nil
}

// powInt is base**exp for exp >= 0, by squaring.
func powInt(base, exp int64) (value, error) {
	out := int64(1)
	for {
		if exp&1 == 1 {
			var err error
			if out, err = mul64(out, base); err != nil {
				return nil, err
			}
		}
		exp >>= 1
		if exp == 0 {
			return out, nil
		}
		var err error
		if base, err = mul64(base, base); err != nil {
			return nil, err
		}
	}
}

// equal is Python's ==. Walking a container costs its items, and a string compared with
// one of its length costs its bytes.
func (r *renderer) equal(a, b value) (bool, error) {
	if ai, af, _, ok := asNumber(a); ok {
		if bi, bf, _, ok := asNumber(b); ok {
			_, aIsF := a.(float64)
			_, bIsF := b.(float64)
			if aIsF || bIsF {
				return af == bf, nil
			}
			return ai == bi, nil
		}
		return false, nil
	}
	switch x := a.(type) {
	case nil:
		return b == nil, nil
	case undefined:
		return isUndefined(b), nil
	case string:
		y, ok := b.(string)
		if !ok || len(x) != len(y) {
			return false, nil
		}
		return x == y, r.spend(len(x))
	case list:
		if y, ok := b.(list); ok && len(x) == len(y) {
			return r.equalSeq(x, y)
		}
		return false, nil
	case tuple:
		if y, ok := b.(tuple); ok && len(x) == len(y) {
			return r.equalSeq(x, y)
		}
		return false, nil
	case *dict:
		y, ok := b.(*dict)
		if !ok || len(x.keys) != len(y.keys) {
			return false, nil
		}
		if err := r.spend(size(x)); err != nil {
			return false, err
		}
		for _, k := range x.keys {
			yv, ok := y.get(k)
			if !ok {
				return false, nil
			}
			if eq, err := r.equal(x.m[k], yv); !eq || err != nil {
				return false, err
			}
		}
		return true, nil
	}
	return a == b, nil
}

func (r *renderer) equalSeq(a, b []value) (bool, error) {
	if err := r.spend(itemCost * len(a)); err != nil {
		return false, err
	}
	for i := range a {
		if eq, err := r.equal(a[i], b[i]); !eq || err != nil {
			return false, err
		}
	}
	return true, nil
}

// compare orders two numbers or two strings (at the shorter string's cost).
func (r *renderer) compare(a, b value, op string) (int, error) {
	if _, af, _, ok := asNumber(a); ok {
		if _, bf, _, ok := asNumber(b); ok {
			switch {
			case af < bf:
				return -1, nil
			case af > bf:
				return 1, nil
			}
			return 0, nil
		}
	}
	if x, ok := a.(string); ok {
		if y, ok := b.(string); ok {
			return strings.Compare(x, y), r.spend(min(len(x), len(y)))
		}
	}
	return 0, fmt.Errorf("%q not supported between instances of %q and %q", op, typeName(a), typeName(b))
}

// contains is Python's x in container: a string's search costs its bytes, a list's its items
// compared.
func (r *renderer) contains(container, x value) (bool, error) {
	switch c := container.(type) {
	case string:
		s, ok := x.(string)
		if !ok {
			return false, fmt.Errorf("'in <string>' requires string as left operand, not %s", typeName(x))
		}
		return strings.Contains(c, s), r.spend(len(c))
	case list:
		return r.containsSeq(c, x)
	case tuple:
		return r.containsSeq(c, x)
	case *dict:
		s, ok := x.(string)
		if !ok {
			return false, nil
		}
		_, in := c.get(s)
		return in, nil
	case undefined:
		return false, fmt.Errorf("%s is undefined (right operand of in)", c.describe())
	}
	return false, fmt.Errorf("argument of type %q is not iterable", typeName(container))
}

func (r *renderer) containsSeq(items []value, x value) (bool, error) {
	if err := r.spend(itemCost * len(items)); err != nil {
		return false, err
	}
	for _, it := range items {
		if eq, err := r.equal(it, x); eq || err != nil {
			return eq, err
		}
	}
	return false, nil
}
