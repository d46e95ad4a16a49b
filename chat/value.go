package chat

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"
)

// value is a template value, modelled on the Python objects Jinja2 sees:
// nil (None), undefined, bool, int64, float64, string, list, tuple, *dict,
// *namespace and *function.
type value = any

// undefined is a missing variable, attribute or item. Like Jinja2's default
// Undefined it prints as "" and is falsy, but most operations on it fail.
type undefined struct{ name string }

type (
	list  []value
	tuple []value
)

// dict keeps insertion order, as Python dicts (and so json.dumps) do.
type dict struct {
	keys []string
	m    map[string]value
}

func newDict() *dict { return &dict{m: map[string]value{}} }

func (d *dict) set(k string, v value) {
	if _, ok := d.m[k]; !ok {
		d.keys = append(d.keys, k)
	}
	d.m[k] = v
}

func (d *dict) get(k string) (value, bool) {
	v, ok := d.m[k]
	return v, ok
}

// namespace is the mutable object namespace() returns; only it accepts
// attribute assignment.
type namespace struct{ d *dict }

// function is a callable value; call gets the render it runs in, for its budget.
type function struct {
	name string
	call func(r *renderer, args []value, kwargs *dict) (value, error)
}

func typeName(v value) string {
	switch v.(type) {
	case nil:
		return "NoneType"
	case undefined:
		return "Undefined"
	case bool:
		return "bool"
	case int64:
		return "int"
	case float64:
		return "float"
	case string:
		return "str"
	case list:
		return "list"
	case tuple:
		return "tuple"
	case *dict:
		return "dict"
	case *namespace:
		return "Namespace"
	case *function:
		return "function"
	case *loopState:
		return "LoopContext"
	}
	return fmt.Sprintf("%T", v)
}

func truthy(v value) bool {
	switch x := v.(type) {
	case nil, undefined:
		return false
	case bool:
		return x
	case int64:
		return x != 0
	case float64:
		return x != 0
	case string:
		return x != ""
	case list:
		return len(x) > 0
	case tuple:
		return len(x) > 0
	case *dict:
		return len(x.keys) > 0
	}
	return true
}

// str is Python's str(): what {{ }} prints. Printing a container costs its text.
func (r *renderer) str(v value) (string, error) {
	switch x := v.(type) {
	case undefined:
		return "", nil
	case string:
		return x, nil
	}
	return r.repr(v)
}

// repr is Python's repr(), which str() of containers uses for their items; it costs its text.
func (r *renderer) repr(v value) (string, error) {
	s, ok := reprUpTo(v, maxOutput)
	if err := r.spend(len(s)); err != nil {
		return "", err
	}
	if !ok {
		return "", fmt.Errorf("the text of a %s is longer than %d bytes", typeName(v), maxOutput)
	}
	return s, nil
}

// brief is v's repr for an error message: at most 80 bytes, "..." where it stops.
func brief(v value) string {
	s, ok := reprUpTo(v, 80)
	if !ok {
		s += "..."
	}
	return s
}

// reprUpTo is v's repr while it is at most limit bytes long; ok is false when it is longer,
// and s then its first limit bytes. The walk stops there.
func reprUpTo(v value, limit int) (s string, ok bool) {
	var b strings.Builder
	writeRepr(&b, v, 0, limit)
	if b.Len() > limit {
		return b.String()[:max(limit, 0)], false
	}
	return b.String(), true
}

// writeRepr stops at maxDepth: a namespace can hold itself, and Python
// also abbreviates recursive containers as "...". It writes nothing more once b holds
// more than limit bytes.
func writeRepr(b *strings.Builder, v value, depth, limit int) {
	if b.Len() > limit {
		return
	}
	if depth > maxDepth {
		b.WriteString("...")
		return
	}
	switch x := v.(type) {
	case nil:
		b.WriteString("None")
	case undefined:
		b.WriteString("Undefined")
	case bool:
		if x {
			b.WriteString("True")
		} else {
			b.WriteString("False")
		}
	case int64:
		b.WriteString(strconv.FormatInt(x, 10))
	case float64:
		b.WriteString(pyFloat(x))
	case string:
		b.WriteString(pyQuote(x))
	case list:
		writeSeq(b, "[", "]", x, depth, limit)
	case tuple:
		if len(x) == 1 {
			b.WriteString("(")
			writeRepr(b, x[0], depth+1, limit)
			b.WriteString(",)")
			return
		}
		writeSeq(b, "(", ")", x, depth, limit)
	case *dict:
		b.WriteString("{")
		for i, k := range x.keys {
			if i > 0 {
				b.WriteString(", ")
			}
			b.WriteString(pyQuote(k))
			b.WriteString(": ")
			writeRepr(b, x.m[k], depth+1, limit)
		}
		b.WriteString("}")
	case *namespace:
		b.WriteString("<Namespace ")
		writeRepr(b, x.d, depth+1, limit)
		b.WriteString(">")
	case *function:
		fmt.Fprintf(b, "<function %s>", x.name)
	default:
		fmt.Fprintf(b, "%v", x)
	}
}

func writeSeq(b *strings.Builder, open, close string, items []value, depth, limit int) {
	b.WriteString(open)
	for i, it := range items {
		if b.Len() > limit {
			return
		}
		if i > 0 {
			b.WriteString(", ")
		}
		writeRepr(b, it, depth+1, limit)
	}
	b.WriteString(close)
}

// pyFloat formats like Python's float repr: shortest round-trip digits,
// always a '.' or exponent, exponent form outside [1e-4, 1e16).
func pyFloat(f float64) string {
	switch {
	case math.IsInf(f, 1):
		return "inf"
	case math.IsInf(f, -1):
		return "-inf"
	case math.IsNaN(f):
		return "nan"
	}
	abs := math.Abs(f)
	if abs != 0 && (abs < 1e-4 || abs >= 1e16) {
		// Go's exponent form (1e+20, 1.5e-05) matches Python's.
		return strconv.FormatFloat(f, 'e', -1, 64)
	}
	s := strconv.FormatFloat(f, 'f', -1, 64)
	if !strings.Contains(s, ".") {
		s += ".0"
	}
	return s
}

// pyQuote is Python's repr of a str: single quotes unless the text holds a
// single quote and no double quote.
func pyQuote(s string) string {
	q := byte('\'')
	if strings.Contains(s, "'") && !strings.Contains(s, "\"") {
		q = '"'
	}
	var b strings.Builder
	b.WriteByte(q)
	for _, r := range s {
		switch {
		case r == rune(q) || r == '\\':
			b.WriteByte('\\')
			b.WriteRune(r)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r == '\t':
			b.WriteString(`\t`)
		case r < 0x20 || r == 0x7f:
			fmt.Fprintf(&b, `\x%02x`, r)
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte(q)
	return b.String()
}

// toJSON is json.dumps(v, ensure_ascii=False, indent=indent), the tojson
// filter transformers installs (no HTML escaping, keys in insertion order). It costs its
// text, and stops past maxOutput bytes.
func (r *renderer) toJSON(v value, indent string, useIndent bool) (string, error) {
	var b strings.Builder
	err := writeJSON(&b, v, indent, useIndent, 0)
	if err := r.spend(b.Len()); err != nil {
		return "", err
	}
	if err != nil {
		return "", err
	}
	return b.String(), nil
}

func writeJSON(b *strings.Builder, v value, indent string, useIndent bool, depth int) error {
	if depth > maxDepth {
		return fmt.Errorf("tojson: value nested deeper than %d", maxDepth)
	}
	if b.Len() > maxOutput {
		return fmt.Errorf("tojson: text longer than %d bytes", maxOutput)
	}
	newline := func(d int) {
		if useIndent {
			b.WriteByte('\n')
			for i := 0; i < d && b.Len() <= maxOutput; i++ {
				b.WriteString(indent)
			}
		}
	}
	sep := ", "
	if useIndent {
		sep = ","
	}
	switch x := v.(type) {
	case nil:
		b.WriteString("null")
	case bool:
		b.WriteString(strconv.FormatBool(x))
	case int64:
		b.WriteString(strconv.FormatInt(x, 10))
	case float64:
		switch {
		case math.IsNaN(x):
			b.WriteString("NaN")
		case math.IsInf(x, 1):
			b.WriteString("Infinity")
		case math.IsInf(x, -1):
			b.WriteString("-Infinity")
		default:
			b.WriteString(pyFloat(x))
		}
	case string:
		writeJSONString(b, x)
	case list, tuple:
		items := seqItems(x)
		if len(items) == 0 {
			b.WriteString("[]")
			return nil
		}
		b.WriteByte('[')
		for i, it := range items {
			if i > 0 {
				b.WriteString(sep)
			}
			newline(depth + 1)
			if err := writeJSON(b, it, indent, useIndent, depth+1); err != nil {
				return err
			}
		}
		newline(depth)
		b.WriteByte(']')
	case *dict:
		if len(x.keys) == 0 {
			b.WriteString("{}")
			return nil
		}
		b.WriteByte('{')
		for i, k := range x.keys {
			if i > 0 {
				b.WriteString(sep)
			}
			newline(depth + 1)
			writeJSONString(b, k)
			b.WriteString(": ")
			if err := writeJSON(b, x.m[k], indent, useIndent, depth+1); err != nil {
				return err
			}
		}
		newline(depth)
		b.WriteByte('}')
	default:
		return fmt.Errorf("tojson: %s is not JSON serializable", typeName(v))
	}
	return nil
}

func writeJSONString(b *strings.Builder, s string) {
	b.WriteByte('"')
	for _, r := range s {
		switch r {
		case '"':
			b.WriteString(`\"`)
		case '\\':
			b.WriteString(`\\`)
		case '\n':
			b.WriteString(`\n`)
		case '\r':
			b.WriteString(`\r`)
		case '\t':
			b.WriteString(`\t`)
		case '\b':
			b.WriteString(`\b`)
		case '\f':
			b.WriteString(`\f`)
		default:
			if r < 0x20 {
				fmt.Fprintf(b, `\u%04x`, r)
			} else {
				b.WriteRune(r)
			}
		}
	}
	b.WriteByte('"')
}

func seqItems(v value) []value {
	switch x := v.(type) {
	case list:
		return x
	case tuple:
		return x
	}
	return nil
}

// fromGo converts a caller's Go value into a template value. Go maps have no
// order, so their keys are sorted; pass json.RawMessage to keep the order of
// a JSON object (tool schemas, for instance).
func fromGo(v any) (value, error) {
	switch x := v.(type) {
	case nil:
		return nil, nil
	case bool, int64, float64, string, list, tuple, *dict, *namespace, *function:
		return x, nil
	case json.RawMessage:
		return decodeJSON(x)
	case Message:
		return messageDict(x), nil
	case int:
		return int64(x), nil
	case float32:
		return float64(x), nil
	case func(string) string:
		return &function{name: "func", call: func(_ *renderer, args []value, _ *dict) (value, error) {
			if len(args) != 1 {
				return nil, fmt.Errorf("expects 1 argument, got %d", len(args))
			}
			s, ok := args[0].(string)
			if !ok {
				return nil, fmt.Errorf("expects a string, got %s", typeName(args[0]))
			}
			return x(s), nil
		}}, nil
	}
	rv := reflect.ValueOf(v)
	switch rv.Kind() {
	case reflect.Bool:
		return rv.Bool(), nil
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return rv.Int(), nil
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		u := rv.Uint()
		if u > math.MaxInt64 {
			return nil, fmt.Errorf("integer %d out of range", u)
		}
		return int64(u), nil
	case reflect.Float32, reflect.Float64:
		return rv.Float(), nil
	case reflect.String:
		return rv.String(), nil
	case reflect.Slice, reflect.Array:
		out := make(list, rv.Len())
		for i := range out {
			e, err := fromGo(rv.Index(i).Interface())
			if err != nil {
				return nil, fmt.Errorf("[%d]: %w", i, err)
			}
			out[i] = e
		}
		return out, nil
	case reflect.Map:
		if rv.Type().Key().Kind() != reflect.String {
			return nil, fmt.Errorf("map keys must be strings, not %s", rv.Type().Key())
		}
		keys := make([]string, 0, rv.Len())
		for _, k := range rv.MapKeys() {
			keys = append(keys, k.String())
		}
		sort.Strings(keys)
		d := newDict()
		for _, k := range keys {
			e, err := fromGo(rv.MapIndex(reflect.ValueOf(k).Convert(rv.Type().Key())).Interface())
			if err != nil {
				return nil, fmt.Errorf("[%q]: %w", k, err)
			}
			d.set(k, e)
		}
		return d, nil
	case reflect.Pointer, reflect.Interface:
		if rv.IsNil() {
			return nil, nil
		}
		return fromGo(rv.Elem().Interface())
	}
	return nil, fmt.Errorf("unsupported Go type %T", v)
}

func messageDict(m Message) *dict {
	d := newDict()
	d.set("role", m.Role)
	d.set("content", m.Content)
	return d
}

// decodeJSON decodes JSON into template values, keeping object key order
// and integer-ness of numbers as Python's json.loads would.
func decodeJSON(data []byte) (value, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	v, err := decodeJSONValue(dec, 0)
	if err != nil {
		return nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("json: trailing data")
	}
	return v, nil
}

func decodeJSONValue(dec *json.Decoder, depth int) (value, error) {
	if depth > maxDepth {
		return nil, fmt.Errorf("json: nested deeper than %d", maxDepth)
	}
	tok, err := dec.Token()
	if err != nil {
		return nil, fmt.Errorf("json: %w", err)
	}
	switch t := tok.(type) {
	case json.Delim:
		switch t {
		case '[':
			out := list{}
			for dec.More() {
				v, err := decodeJSONValue(dec, depth+1)
				if err != nil {
					return nil, err
				}
				out = append(out, v)
			}
			_, err := dec.Token()
			return out, err
		case '{':
			d := newDict()
			for dec.More() {
				kt, err := dec.Token()
				if err != nil {
					return nil, fmt.Errorf("json: %w", err)
				}
				k, _ := kt.(string)
				v, err := decodeJSONValue(dec, depth+1)
				if err != nil {
					return nil, err
				}
				d.set(k, v)
			}
			_, err := dec.Token()
			return d, err
		}
		return nil, fmt.Errorf("json: unexpected %v", t)
	case json.Number:
		if i, err := t.Int64(); err == nil {
			return i, nil
		}
		f, err := t.Float64()
		if err != nil {
			return nil, fmt.Errorf("json: number %s: %w", t, err)
		}
		return f, nil
	case string, bool, nil:
		return t, nil
	}
	return nil, fmt.Errorf("json: unexpected token %v", tok)
}

// runeLen is Python's len() of a str: code points, not bytes.
func runeLen(s string) int { return utf8.RuneCountInString(s) }
