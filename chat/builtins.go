package chat

import (
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode"
)

func fn(name string, call func(r *renderer, args []value, kw *dict) (value, error)) *function {
	return &function{name: name, call: call}
}

func wantArgs(args []value, lo, hi int) error {
	if len(args) < lo || len(args) > hi {
		if lo == hi {
			return fmt.Errorf("takes %d arguments, got %d", lo, len(args))
		}
		return fmt.Errorf("takes %d to %d arguments, got %d", lo, hi, len(args))
	}
	return nil
}

func wantString(v value, what string) (string, error) {
	s, ok := v.(string)
	if !ok {
		return "", fmt.Errorf("%s must be a string, not %s", what, typeName(v))
	}
	return s, nil
}

// substringArg is the one argument of str.find and str.count.
func substringArg(args []value) (string, error) {
	if err := wantArgs(args, 1, 1); err != nil {
		return "", err
	}
	return wantString(args[0], "substring")
}

// method returns the bound method obj.name, or nil when obj has none.
// Only side-effect-free methods exist, as in transformers' immutable sandbox.
func method(obj value, name string) *function {
	switch x := obj.(type) {
	case string:
		return stringMethod(x, name)
	case *dict:
		return dictMethod(x, name)
	}
	return nil
}

func stripArg(args []value) (string, bool, error) {
	if err := wantArgs(args, 0, 1); err != nil {
		return "", false, err
	}
	if len(args) == 0 || args[0] == nil {
		return "", false, nil
	}
	s, err := wantString(args[0], "chars")
	return s, true, err
}

func pyStrip(s, chars string, haveChars, left, right bool) string {
	isCut := unicode.IsSpace
	if haveChars {
		isCut = func(r rune) bool { return strings.ContainsRune(chars, r) }
	}
	if left {
		s = strings.TrimLeftFunc(s, isCut)
	}
	if right {
		s = strings.TrimRightFunc(s, isCut)
	}
	return s
}

// stringMethod is s.name, whose call costs s's bytes: every method scans or copies s.
func stringMethod(s, name string) *function {
	f := stringMethodOf(s, name)
	if f == nil {
		return nil
	}
	call := f.call
	f.call = func(r *renderer, args []value, kw *dict) (value, error) {
		if err := r.spend(len(s)); err != nil {
			return nil, err
		}
		return call(r, args, kw)
	}
	return f
}

func stringMethodOf(s, name string) *function {
	strip := func(left, right bool) *function {
		return fn(name, func(_ *renderer, args []value, _ *dict) (value, error) {
			chars, have, err := stripArg(args)
			if err != nil {
				return nil, err
			}
			return pyStrip(s, chars, have, left, right), nil
		})
	}
	affix := func(match func(s, p string) bool) *function {
		return fn(name, func(_ *renderer, args []value, _ *dict) (value, error) {
			if err := wantArgs(args, 1, 1); err != nil {
				return nil, err
			}
			switch p := args[0].(type) {
			case string:
				return match(s, p), nil
			case tuple:
				for _, e := range p {
					if ps, ok := e.(string); ok && match(s, ps) {
						return true, nil
					}
				}
				return false, nil
			}
			return nil, fmt.Errorf("argument must be str or a tuple of str, not %s", typeName(args[0]))
		})
	}
	switch name {
	case "strip":
		return strip(true, true)
	case "lstrip":
		return strip(true, false)
	case "rstrip":
		return strip(false, true)
	case "startswith":
		return affix(strings.HasPrefix)
	case "endswith":
		return affix(strings.HasSuffix)
	case "upper":
		return fn(name, func(*renderer, []value, *dict) (value, error) { return strings.ToUpper(s), nil })
	case "lower":
		return fn(name, func(*renderer, []value, *dict) (value, error) { return strings.ToLower(s), nil })
	case "title":
		return fn(name, func(*renderer, []value, *dict) (value, error) { return title(s), nil })
	case "capitalize":
		return fn(name, func(*renderer, []value, *dict) (value, error) { return capitalize(s), nil })
	case "split":
		return fn(name, func(_ *renderer, args []value, kw *dict) (value, error) { return split(s, args, kw) })
	case "replace":
		return fn(name, func(_ *renderer, args []value, _ *dict) (value, error) { return replace(s, args) })
	case "find":
		return fn(name, func(_ *renderer, args []value, _ *dict) (value, error) {
			sub, err := substringArg(args)
			if err != nil {
				return nil, err
			}
			i := strings.Index(s, sub)
			if i < 0 {
				return int64(-1), nil
			}
			return int64(runeLen(s[:i])), nil
		})
	case "count":
		return fn(name, func(_ *renderer, args []value, _ *dict) (value, error) {
			sub, err := substringArg(args)
			if err != nil {
				return nil, err
			}
			if sub == "" {
				return int64(runeLen(s) + 1), nil
			}
			return int64(strings.Count(s, sub)), nil
		})
	case "join":
		return fn(name, func(r *renderer, args []value, _ *dict) (value, error) {
			if err := wantArgs(args, 1, 1); err != nil {
				return nil, err
			}
			items, err := r.iterate(args[0])
			if err != nil {
				return nil, err
			}
			if err := r.spend(itemCost * len(items)); err != nil {
				return nil, err
			}
			parts := make([]string, len(items))
			for i, it := range items {
				if parts[i], err = wantString(it, "joined item"); err != nil {
					return nil, err
				}
			}
			return join(parts, s)
		})
	}
	return nil
}

// join is strings.Join, refused before it is built past maxOutput bytes (the length of
// parts and a separator that fit in memory fits an int).
func join(parts []string, sep string) (value, error) {
	n := len(sep) * max(len(parts)-1, 0)
	for _, p := range parts {
		n += len(p)
	}
	if err := checkLen(n); err != nil {
		return nil, err
	}
	return strings.Join(parts, sep), nil
}

// title is Python's str.title: a cased letter after an uncased character (or at the start)
// takes its title case, every other one its lower case.
func title(s string) string {
	var b strings.Builder
	prevCased := false
	for _, r := range s {
		if prevCased {
			b.WriteRune(unicode.ToLower(r))
		} else {
			b.WriteRune(unicode.ToTitle(r))
		}
		prevCased = unicode.IsUpper(r) || unicode.IsLower(r) || unicode.IsTitle(r)
	}
	return b.String()
}

// titleWords is Jinja2's title filter, which is not str.title: the text is cut into words
// at runs of whitespace, '-', '(', '{', '[' and '<' alone, and each word's first character is
// upper-cased and the rest lower-cased ("it's" -> "It's", "a,b" -> "A,b").
func titleWords(s string) string {
	var b strings.Builder
	start := true
	for _, r := range s {
		switch {
		case unicode.IsSpace(r) || strings.ContainsRune("-({[<", r):
			b.WriteRune(r)
			start = true
		case start:
			b.WriteRune(unicode.ToUpper(r))
			start = false
		default:
			b.WriteRune(unicode.ToLower(r))
		}
	}
	return b.String()
}

func capitalize(s string) string {
	for i, r := range s {
		if i == 0 {
			return string(unicode.ToUpper(r)) + strings.ToLower(s[len(string(r)):])
		}
	}
	return s
}

func split(s string, args []value, kw *dict) (value, error) {
	if err := wantArgs(args, 0, 2); err != nil {
		return nil, err
	}
	var sep value
	if len(args) > 0 {
		sep = args[0]
	} else if v, ok := kw.get("sep"); ok {
		sep = v
	}
	maxSplit := int64(-1)
	if len(args) > 1 {
		n, ok := asInt(args[1])
		if !ok {
			return nil, fmt.Errorf("maxsplit must be an integer")
		}
		maxSplit = n
	} else if v, ok := kw.get("maxsplit"); ok {
		n, ok := asInt(v)
		if !ok {
			return nil, fmt.Errorf("maxsplit must be an integer")
		}
		maxSplit = n
	}
	var parts []string
	if sep == nil {
		if err := checkItems(fields(s)); err != nil {
			return nil, err
		}
		parts = strings.Fields(s)
		if maxSplit >= 0 && int64(len(parts)) > maxSplit+1 {
			// Python keeps the untouched remainder of the string intact.
			rest := s
			parts = parts[:0]
			for i := int64(0); i < maxSplit; i++ {
				rest = strings.TrimLeftFunc(rest, unicode.IsSpace)
				j := strings.IndexFunc(rest, unicode.IsSpace)
				parts = append(parts, rest[:j])
				rest = rest[j:]
			}
			parts = append(parts, strings.TrimLeftFunc(rest, unicode.IsSpace))
		}
	} else {
		sepStr, err := wantString(sep, "separator")
		if err != nil {
			return nil, err
		}
		if sepStr == "" {
			return nil, fmt.Errorf("empty separator")
		}
		n := int64(strings.Count(s, sepStr))
		if maxSplit >= 0 {
			n = min(n, maxSplit)
		}
		if err := checkItems(int(min(n+1, maxItems+1))); err != nil {
			return nil, err
		}
		parts = strings.SplitN(s, sepStr, int(max(maxSplit+1, -1)))
		if maxSplit < 0 {
			parts = strings.Split(s, sepStr)
		}
	}
	out := make(list, len(parts))
	for i, p := range parts {
		out[i] = p
	}
	return out, nil
}

func replace(s string, args []value) (value, error) {
	if err := wantArgs(args, 2, 3); err != nil {
		return nil, err
	}
	old, err := wantString(args[0], "old")
	if err != nil {
		return nil, err
	}
	repl, err := wantString(args[1], "new")
	if err != nil {
		return nil, err
	}
	n := -1
	if len(args) == 3 {
		c, ok := asInt(args[2])
		if !ok {
			return nil, fmt.Errorf("count must be an integer")
		}
		n = int(max(c, -1))
	}
	// The result's length, refused before it is built: each replacement adds
	// len(repl)-len(old) bytes, and an empty old matches between every two characters.
	count := strings.Count(s, old)
	if n >= 0 {
		count = min(count, n)
	}
	if grow := len(repl) - len(old); grow > 0 {
		if err := checkLen(len(s) + count*grow); err != nil {
			return nil, err
		}
	}
	return strings.Replace(s, old, repl, n), nil
}

// fields is how many words strings.Fields finds in s, counted before any is built.
func fields(s string) int {
	n, in := 0, false
	for _, c := range s {
		space := unicode.IsSpace(c)
		if !space && !in {
			n++
		}
		in = !space
	}
	return n
}

func dictMethod(d *dict, name string) *function {
	switch name {
	case "items":
		return fn(name, func(*renderer, []value, *dict) (value, error) { return dictItems(d), nil })
	case "keys":
		return fn(name, func(*renderer, []value, *dict) (value, error) {
			out := make(list, len(d.keys))
			for i, k := range d.keys {
				out[i] = k
			}
			return out, nil
		})
	case "values":
		return fn(name, func(*renderer, []value, *dict) (value, error) {
			out := make(list, len(d.keys))
			for i, k := range d.keys {
				out[i] = d.m[k]
			}
			return out, nil
		})
	case "get":
		return fn(name, func(_ *renderer, args []value, _ *dict) (value, error) {
			if err := wantArgs(args, 1, 2); err != nil {
				return nil, err
			}
			if k, ok := args[0].(string); ok {
				if v, ok := d.get(k); ok {
					return v, nil
				}
			}
			if len(args) == 2 {
				return args[1], nil
			}
			return nil, nil
		})
	}
	return nil
}

func dictItems(d *dict) list {
	out := make(list, len(d.keys))
	for i, k := range d.keys {
		out[i] = tuple{k, d.m[k]}
	}
	return out
}

// globals are the functions every template sees: Jinja2's defaults that
// chat templates use, plus the two transformers adds.
func (t *Template) globals() map[string]value {
	return map[string]value{
		"range": fn("range", builtinRange),
		"namespace": fn("namespace", func(r *renderer, args []value, kw *dict) (value, error) {
			d := newDict()
			for _, a := range args {
				src, ok := a.(*dict)
				if !ok {
					return nil, fmt.Errorf("positional argument must be a dict, not %s", typeName(a))
				}
				if err := r.spend(size(src)); err != nil {
					return nil, err
				}
				for _, k := range src.keys {
					d.set(k, src.m[k])
				}
			}
			for _, k := range kw.keys {
				d.set(k, kw.m[k])
			}
			return &namespace{d: d}, nil
		}),
		"dict": fn("dict", func(_ *renderer, args []value, kw *dict) (value, error) {
			if err := wantArgs(args, 0, 0); err != nil {
				return nil, err
			}
			return kw, nil
		}),
		"raise_exception": fn("raise_exception", func(r *renderer, args []value, _ *dict) (value, error) {
			msg := ""
			if len(args) > 0 {
				var err error
				if msg, err = r.str(args[0]); err != nil {
					return nil, err
				}
			}
			return nil, fmt.Errorf("%s", msg)
		}),
		"strftime_now": fn("strftime_now", func(_ *renderer, args []value, _ *dict) (value, error) {
			if err := wantArgs(args, 1, 1); err != nil {
				return nil, err
			}
			f, err := wantString(args[0], "format")
			if err != nil {
				return nil, err
			}
			now := time.Now
			if t.Now != nil {
				now = t.Now
			}
			return strftime(now(), f)
		}),
	}
}

func builtinRange(_ *renderer, args []value, _ *dict) (value, error) {
	if err := wantArgs(args, 1, 3); err != nil {
		return nil, err
	}
	var n [3]int64
	for i, a := range args {
		v, ok := asInt(a)
		if !ok {
			return nil, fmt.Errorf("arguments must be integers, not %s", typeName(a))
		}
		n[i] = v
	}
	start, stop, step := int64(0), n[0], int64(1)
	if len(args) > 1 {
		start, stop = n[0], n[1]
	}
	if len(args) == 3 {
		step = n[2]
	}
	if step == 0 {
		return nil, fmt.Errorf("step must not be zero")
	}
	// The count in unsigned arithmetic: stop-start may not fit 64 signed bits, and stepping
	// past stop could wrap around.
	var count uint64
	switch {
	case step > 0 && start < stop:
		count = (uint64(stop-start)-1)/uint64(step) + 1
	case step < 0 && start > stop:
		count = (uint64(start-stop)-1)/uint64(-step) + 1
	}
	if count > maxIterations {
		return nil, fmt.Errorf("more than %d items", maxIterations)
	}
	out := make(list, count)
	for i := range out {
		out[i] = start + int64(i)*step
	}
	return out, nil
}

// strftime formats t with the C/Python directives chat templates use.
func strftime(t time.Time, f string) (string, error) {
	var b strings.Builder
	for i := 0; i < len(f); i++ {
		if f[i] != '%' || i+1 == len(f) {
			b.WriteByte(f[i])
			continue
		}
		i++
		switch f[i] {
		case 'd':
			fmt.Fprintf(&b, "%02d", t.Day())
		case 'e':
			fmt.Fprintf(&b, "%2d", t.Day())
		case 'm':
			fmt.Fprintf(&b, "%02d", int(t.Month()))
		case 'b':
			b.WriteString(t.Month().String()[:3])
		case 'B':
			b.WriteString(t.Month().String())
		case 'y':
			fmt.Fprintf(&b, "%02d", t.Year()%100)
		case 'Y':
			fmt.Fprintf(&b, "%d", t.Year())
		case 'H':
			fmt.Fprintf(&b, "%02d", t.Hour())
		case 'I':
			h := t.Hour() % 12
			if h == 0 {
				h = 12
			}
			fmt.Fprintf(&b, "%02d", h)
		case 'M':
			fmt.Fprintf(&b, "%02d", t.Minute())
		case 'S':
			fmt.Fprintf(&b, "%02d", t.Second())
		case 'p':
			if t.Hour() < 12 {
				b.WriteString("AM")
			} else {
				b.WriteString("PM")
			}
		case 'a':
			b.WriteString(t.Weekday().String()[:3])
		case 'A':
			b.WriteString(t.Weekday().String())
		case 'j':
			fmt.Fprintf(&b, "%03d", t.YearDay())
		case '%':
			b.WriteByte('%')
		default:
			return "", fmt.Errorf("unsupported directive %%%c", f[i])
		}
	}
	return b.String(), nil
}

type filterFunc func(r *renderer, x value, args []value, kw *dict) (value, error)

var filters map[string]filterFunc

func init() {
	filters = map[string]filterFunc{
		"trim": func(r *renderer, x value, args []value, _ *dict) (value, error) {
			s, err := wantString(x, "trim input")
			if err != nil {
				return nil, err
			}
			if err := r.spend(len(s)); err != nil {
				return nil, err
			}
			chars, have, err := stripArg(args)
			if err != nil {
				return nil, err
			}
			return pyStrip(s, chars, have, true, true), nil
		},
		"length":     filterLength,
		"count":      filterLength,
		"tojson":     filterToJSON,
		"string":     func(r *renderer, x value, _ []value, _ *dict) (value, error) { return r.str(x) },
		"upper":      stringFilter(strings.ToUpper),
		"lower":      stringFilter(strings.ToLower),
		"title":      stringFilter(titleWords),
		"capitalize": stringFilter(capitalize),
		"default":    filterDefault,
		"d":          filterDefault,
		"replace": func(r *renderer, x value, args []value, _ *dict) (value, error) {
			s, err := wantString(x, "replace input")
			if err != nil {
				return nil, err
			}
			if err := r.spend(len(s)); err != nil {
				return nil, err
			}
			return replace(s, args)
		},
		"items": func(_ *renderer, x value, _ []value, _ *dict) (value, error) {
			switch d := x.(type) {
			case undefined:
				return list{}, nil
			case *dict:
				return dictItems(d), nil
			}
			return nil, fmt.Errorf("can only get item pairs from a mapping, not %s", typeName(x))
		},
		"join": func(r *renderer, x value, args []value, kw *dict) (value, error) {
			items, err := r.iterate(x)
			if err != nil {
				return nil, err
			}
			sep := ""
			if len(args) > 0 {
				if sep, err = wantString(args[0], "separator"); err != nil {
					return nil, err
				}
			}
			attr, hasAttr, err := r.attribute(kw)
			if err != nil {
				return nil, err
			}
			if err := r.spend(itemCost * len(items)); err != nil {
				return nil, err
			}
			parts := make([]string, len(items))
			for i, it := range items {
				if hasAttr {
					it = item(it, attr)
				}
				if parts[i], err = r.str(it); err != nil {
					return nil, err
				}
			}
			return join(parts, sep)
		},
		"first": func(r *renderer, x value, _ []value, _ *dict) (value, error) {
			items, err := r.iterate(x)
			if err != nil || len(items) == 0 {
				return undefined{"first item"}, err
			}
			return items[0], nil
		},
		"last": func(r *renderer, x value, _ []value, _ *dict) (value, error) {
			items, err := r.iterate(x)
			if err != nil || len(items) == 0 {
				return undefined{"last item"}, err
			}
			return items[len(items)-1], nil
		},
		"list": func(r *renderer, x value, _ []value, _ *dict) (value, error) {
			items, err := r.iterate(x)
			return list(append([]value{}, items...)), err
		},
		"reverse": func(r *renderer, x value, _ []value, _ *dict) (value, error) {
			if s, ok := x.(string); ok {
				rs := []rune(s)
				for i, j := 0, len(rs)-1; i < j; i, j = i+1, j-1 {
					rs[i], rs[j] = rs[j], rs[i]
				}
				return string(rs), nil
			}
			items, err := r.iterate(x)
			if err != nil {
				return nil, err
			}
			out := make(list, len(items))
			for i, it := range items {
				out[len(items)-1-i] = it
			}
			return out, nil
		},
		"int": func(r *renderer, x value, _ []value, _ *dict) (value, error) {
			switch v := x.(type) {
			case int64:
				return v, nil
			case bool:
				return boolInt(v), nil
			case float64:
				return floatInt(v)
			case string:
				if err := r.spend(len(v)); err != nil {
					return nil, err
				}
				if n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64); err == nil {
					return n, nil
				}
				if f, err := strconv.ParseFloat(strings.TrimSpace(v), 64); err == nil {
					return floatInt(f)
				}
			}
			return int64(0), nil
		},
		"float": func(r *renderer, x value, _ []value, _ *dict) (value, error) {
			if _, f, _, ok := asNumber(x); ok {
				return f, nil
			}
			if s, ok := x.(string); ok {
				if err := r.spend(len(s)); err != nil {
					return nil, err
				}
				if f, err := strconv.ParseFloat(strings.TrimSpace(s), 64); err == nil {
					return f, nil
				}
			}
			return 0.0, nil
		},
		"abs": func(_ *renderer, x value, _ []value, _ *dict) (value, error) {
			switch v := x.(type) {
			case int64:
				if v == math.MinInt64 {
					return nil, errOverflow
				}
				return max(v, -v), nil
			case float64:
				return max(v, -v), nil
			}
			return nil, fmt.Errorf("bad operand type for abs(): %s", typeName(x))
		},
		"safe":       func(_ *renderer, x value, _ []value, _ *dict) (value, error) { return x, nil },
		"select":     selectFilter(false, false),
		"reject":     selectFilter(true, false),
		"selectattr": selectFilter(false, true),
		"rejectattr": selectFilter(true, true),
		"map":        filterMap,
		"sort":       filterSort,
	}
}

// floatInt is Jinja's int filter of a float: truncated toward zero, 0 for a NaN (Python's
// ValueError, which the filter turns into its default); past 64 bits it fails, where Python's
// int would grow and Go's conversion would give an arbitrary value.
func floatInt(f float64) (value, error) {
	switch {
	case math.IsNaN(f):
		return int64(0), nil
	case f >= -(1<<63) && f < 1<<63:
		return int64(f), nil
	}
	return nil, fmt.Errorf("%v: %w", f, errOverflow)
}

func stringFilter(f func(string) string) filterFunc {
	return func(r *renderer, x value, _ []value, _ *dict) (value, error) {
		s, err := r.str(x)
		if err != nil {
			return nil, err
		}
		if err := r.spend(len(s)); err != nil {
			return nil, err
		}
		return f(s), nil
	}
}

// attribute is a filter's attribute= argument as the item name it reads.
func (r *renderer) attribute(kw *dict) (name string, ok bool, err error) {
	v, ok := kw.get("attribute")
	if !ok {
		return "", false, nil
	}
	name, err = r.str(v)
	return name, true, err
}

func filterLength(r *renderer, x value, _ []value, _ *dict) (value, error) {
	switch v := x.(type) {
	case undefined:
		return int64(0), nil
	case string:
		return int64(runeLen(v)), r.spend(len(v))
	case list:
		return int64(len(v)), nil
	case tuple:
		return int64(len(v)), nil
	case *dict:
		return int64(len(v.keys)), nil
	}
	return nil, fmt.Errorf("object of type %s has no len()", typeName(x))
}

func filterDefault(_ *renderer, x value, args []value, kw *dict) (value, error) {
	if err := wantArgs(args, 0, 2); err != nil {
		return nil, err
	}
	def := value("")
	if len(args) > 0 {
		def = args[0]
	} else if v, ok := kw.get("default_value"); ok {
		def = v
	}
	boolean := false
	if len(args) > 1 {
		boolean = truthy(args[1])
	} else if v, ok := kw.get("boolean"); ok {
		boolean = truthy(v)
	}
	if isUndefined(x) || boolean && !truthy(x) {
		return def, nil
	}
	return x, nil
}

func filterToJSON(r *renderer, x value, args []value, kw *dict) (value, error) {
	if err := wantArgs(args, 0, 1); err != nil {
		return nil, err
	}
	indent := value(nil)
	if len(args) == 1 {
		indent = args[0]
	}
	for _, k := range kw.keys {
		v := kw.m[k]
		switch {
		case k == "indent":
			indent = v
		case k == "ensure_ascii" && !truthy(v), k == "sort_keys" && !truthy(v):
			// The defaults: nothing to change.
		default:
			return nil, fmt.Errorf("unsupported argument %s=%s", k, brief(v))
		}
	}
	switch n := indent.(type) {
	case nil:
		return r.toJSON(x, "", false)
	case int64:
		if err := checkLen(int(min(n, maxOutput+1))); err != nil {
			return nil, fmt.Errorf("indent: %w", err)
		}
		return r.toJSON(x, strings.Repeat(" ", int(max(n, 0))), true)
	case string:
		return r.toJSON(x, n, true)
	}
	return nil, fmt.Errorf("indent must be an integer or string, not %s", typeName(indent))
}

func selectFilter(reject, byAttr bool) filterFunc {
	return func(r *renderer, x value, args []value, _ *dict) (value, error) {
		items, err := r.iterate(x)
		if err != nil {
			return nil, err
		}
		attr := ""
		if byAttr {
			if len(args) == 0 {
				return nil, fmt.Errorf("missing attribute name")
			}
			if attr, err = wantString(args[0], "attribute"); err != nil {
				return nil, err
			}
			args = args[1:]
		}
		if err := r.spend(itemCost * len(items)); err != nil {
			return nil, err
		}
		testName := ""
		if len(args) > 0 {
			if testName, err = wantString(args[0], "test name"); err != nil {
				return nil, err
			}
			args = args[1:]
		}
		out := list{}
		for _, it := range items {
			subject := it
			if byAttr {
				subject = item(it, attr)
			}
			ok := truthy(subject)
			if testName != "" {
				if ok, err = r.runTest(testName, subject, args); err != nil {
					return nil, err
				}
			}
			if ok != reject {
				out = append(out, it)
			}
		}
		return out, nil
	}
}

func filterMap(r *renderer, x value, args []value, kw *dict) (value, error) {
	items, err := r.iterate(x)
	if err != nil {
		return nil, err
	}
	out := make(list, len(items))
	attr, hasAttr, err := r.attribute(kw)
	if err != nil {
		return nil, err
	}
	if hasAttr {
		def, hasDef := kw.get("default")
		for i, it := range items {
			v := item(it, attr)
			if isUndefined(v) && hasDef {
				v = def
			}
			out[i] = v
		}
		return out, nil
	}
	if len(args) == 0 {
		return nil, fmt.Errorf("map needs a filter name or attribute=")
	}
	name, err := wantString(args[0], "filter name")
	if err != nil {
		return nil, err
	}
	f, ok := filters[name]
	if !ok {
		return nil, fmt.Errorf("unknown filter %q", name)
	}
	for i, it := range items {
		if out[i], err = f(r, it, args[1:], newDict()); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func filterSort(r *renderer, x value, args []value, kw *dict) (value, error) {
	items, err := r.iterate(x)
	if err != nil {
		return nil, err
	}
	out := append(list{}, items...)
	reverse := len(args) > 0 && truthy(args[0])
	if v, ok := kw.get("reverse"); ok {
		reverse = truthy(v)
	}
	attr, hasAttr, err := r.attribute(kw)
	if err != nil {
		return nil, err
	}
	key := func(v value) value {
		if hasAttr {
			return item(v, attr)
		}
		return v
	}
	var cmpErr error
	sort.SliceStable(out, func(i, j int) bool {
		c, err := r.compare(key(out[i]), key(out[j]), "<")
		if err != nil && cmpErr == nil {
			cmpErr = err
		}
		if reverse {
			return c > 0
		}
		return c < 0
	})
	return out, cmpErr
}

func (r *renderer) filter(s *scope, e *filterExpr) (value, error) {
	x, err := r.eval(s, e.x)
	if err != nil {
		return nil, err
	}
	f, ok := filters[e.name]
	if !ok {
		return nil, errAt(e.p, "unknown filter %q", e.name)
	}
	args, kw, err := r.args(s, e.args, e.kwargs)
	if err != nil {
		return nil, err
	}
	v, err := f(r, x, args, kw)
	if err != nil {
		return nil, errAt(e.p, "filter %s: %v", e.name, err)
	}
	return v, nil
}

func (r *renderer) test(s *scope, e *testExpr) (value, error) {
	x, err := r.eval(s, e.x)
	if err != nil {
		return nil, err
	}
	args, _, err := r.args(s, e.args, nil)
	if err != nil {
		return nil, err
	}
	ok, err := r.runTest(e.name, x, args)
	if err != nil {
		return nil, errAt(e.p, "test %s: %v", e.name, err)
	}
	return ok != e.negate, nil
}

func (r *renderer) runTest(name string, x value, args []value) (bool, error) {
	one := func() (value, error) {
		if len(args) != 1 {
			return nil, fmt.Errorf("takes 1 argument, got %d", len(args))
		}
		return args[0], nil
	}
	switch name {
	case "defined":
		return !isUndefined(x), nil
	case "undefined":
		return isUndefined(x), nil
	case "none":
		return x == nil, nil
	case "string":
		_, ok := x.(string)
		return ok, nil
	case "mapping":
		_, ok := x.(*dict)
		return ok, nil
	case "iterable":
		switch x.(type) {
		case string, list, tuple, *dict:
			return true, nil
		}
		return false, nil
	case "sequence":
		switch x.(type) {
		case string, list, tuple, *dict:
			return true, nil
		}
		return false, nil
	case "number":
		_, _, _, ok := asNumber(x)
		return ok, nil
	case "integer":
		_, ok := x.(int64)
		return ok, nil
	case "float":
		_, ok := x.(float64)
		return ok, nil
	case "boolean":
		_, ok := x.(bool)
		return ok, nil
	case "true":
		b, ok := x.(bool)
		return ok && b, nil
	case "false":
		b, ok := x.(bool)
		return ok && !b, nil
	case "callable":
		switch x.(type) {
		case *function, undefined: // Jinja2's Undefined is callable (a call fails)
			return true, nil
		}
		return false, nil
	case "lower", "upper":
		// Jinja2's: str(x).islower() (isupper()): some cased character, and all of them
		// of that case.
		s, err := r.str(x)
		if err != nil {
			return false, err
		}
		is := unicode.IsLower
		if name == "upper" {
			is = unicode.IsUpper
		}
		cased := false
		for _, c := range s {
			if unicode.IsUpper(c) || unicode.IsLower(c) || unicode.IsTitle(c) {
				if !is(c) {
					return false, r.spend(len(s))
				}
				cased = true
			}
		}
		return cased, r.spend(len(s))
	case "odd", "even":
		n, ok := x.(int64)
		if !ok {
			return false, fmt.Errorf("needs an integer, not %s", typeName(x))
		}
		return (n%2 != 0) == (name == "odd"), nil
	case "divisibleby":
		a, err := one()
		if err != nil {
			return false, err
		}
		n, ok1 := asInt(x)
		d, ok2 := asInt(a)
		if !ok1 || !ok2 || d == 0 {
			return false, fmt.Errorf("needs nonzero integers")
		}
		return n%d == 0, nil
	case "eq", "equalto", "==", "sameas", "ne", "!=":
		a, err := one()
		if err != nil {
			return false, err
		}
		eq, err := r.equal(x, a)
		return eq == (name != "ne" && name != "!="), err
	case "lt", "le", "gt", "ge", "<", "<=", ">", ">=":
		a, err := one()
		if err != nil {
			return false, err
		}
		op := map[string]string{"lt": "<", "le": "<=", "gt": ">", "ge": ">="}[name]
		if op == "" {
			op = name
		}
		v, err := r.binop(op, x, a)
		return err == nil && v == true, err
	case "in":
		a, err := one()
		if err != nil {
			return false, err
		}
		return r.contains(a, x)
	}
	return false, fmt.Errorf("unknown test %q", name)
}
