package frontend

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// ErrorList is every error found in one spec, sorted by position. Parse functions return it
// (never a partial value) so that a user fixes all mistakes in one round.
type ErrorList []*Error

func (l ErrorList) Error() string {
	lines := make([]string, len(l))
	for i, e := range l {
		lines[i] = e.Error()
	}
	return strings.Join(lines, "\n")
}

// Unwrap lets errors.As find the first *Error.
func (l ErrorList) Unwrap() []error {
	errs := make([]error, len(l))
	for i, e := range l {
		errs[i] = e
	}
	return errs
}

// maxInt bounds every integer in a spec so that products of dimensions cannot overflow later.
const maxInt = 1<<31 - 1

// parser walks a yaml.Node tree and collects errors instead of stopping at the first one.
type parser struct {
	file string
	dir  string // absolute directory of the spec
	errs ErrorList
	// keyOf maps each mapping value to its key, so that "missing key" errors point at the
	// `dims:` line rather than at the first key inside the block.
	keyOf map[*yaml.Node]*yaml.Node
}

func newParser(path string) (*parser, error) {
	dir, err := filepath.Abs(filepath.Dir(path))
	if err != nil {
		return nil, fmt.Errorf("%s: resolving its directory: %w", path, err)
	}
	return &parser{file: path, dir: dir, keyOf: map[*yaml.Node]*yaml.Node{}}, nil
}

func (p *parser) pos(n *yaml.Node) Pos {
	return Pos{File: p.file, Line: n.Line, Col: n.Column}
}

func (p *parser) errorf(n *yaml.Node, hint, format string, args ...any) {
	p.errs = append(p.errs, Errorf(p.pos(n), hint, format, args...))
}

func (p *parser) errorAt(pos Pos, hint, format string, args ...any) {
	p.errs = append(p.errs, Errorf(pos, hint, format, args...))
}

// result returns the collected errors, sorted by position, each once, or nil. A value
// anchored once and read through several aliases (`*anchor`) is checked at each, so its
// errors would otherwise repeat once per alias.
func (p *parser) result() error {
	if len(p.errs) == 0 {
		return nil
	}
	sort.SliceStable(p.errs, func(i, j int) bool {
		a, b := p.errs[i].Pos, p.errs[j].Pos
		if a.File != b.File {
			return a.File < b.File
		}
		if a.Line != b.Line {
			return a.Line < b.Line
		}
		return a.Col < b.Col
	})
	return slices.CompactFunc(p.errs, func(a, b *Error) bool { return *a == *b })
}

// resolve makes a relative path absolute against the spec's directory.
func (p *parser) resolve(path string) string {
	if filepath.IsAbs(path) {
		return filepath.Clean(path)
	}
	return filepath.Join(p.dir, path)
}

var yamlLineRE = regexp.MustCompile(`^yaml: line (\d+): (.*)$`)

// document parses data into its root mapping. yaml.v3 reports syntax errors as text with a line
// number only; they are turned into an *Error at that line.
func (p *parser) document(data []byte) *yaml.Node {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			p.errorAt(Pos{File: p.file, Line: 1, Col: 1}, "", "empty spec")
			return nil
		}
		p.syntaxError(err)
		return nil
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); err == nil {
		p.errorf(&extra, "keep one spec per file", "a second YAML document")
		return nil
	} else if !errors.Is(err, io.EOF) {
		p.syntaxError(err)
		return nil
	}
	if len(doc.Content) != 1 {
		p.errorAt(Pos{File: p.file, Line: 1, Col: 1}, "", "empty spec")
		return nil
	}
	p.indexKeys(doc.Content[0])
	root := deref(doc.Content[0])
	if root.Kind != yaml.MappingNode {
		p.errorf(root, "a spec is a mapping of key: value lines", "expected a mapping, got %s", describe(root))
		return nil
	}
	return root
}

// indexKeys fills keyOf. Aliases are not followed: their targets are indexed where anchored.
func (p *parser) indexKeys(n *yaml.Node) {
	switch n.Kind {
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			p.keyOf[n.Content[i+1]] = n.Content[i]
			p.indexKeys(n.Content[i+1])
		}
	case yaml.SequenceNode:
		for _, c := range n.Content {
			p.indexKeys(c)
		}
	}
}

// owner is where to report something missing from n: its key if it has one.
func (p *parser) owner(n *yaml.Node) *yaml.Node {
	if k, ok := p.keyOf[n]; ok {
		return k
	}
	return n
}

// yamlParserProblems are the messages of yaml.v3's parser (as opposed to its scanner). It reports
// their line 0-based, and the line where the enclosing construct began (e.g. the unclosed `[`).
var yamlParserProblems = map[string]bool{
	"did not find expected ',' or ']'":       true,
	"did not find expected ',' or '}'":       true,
	"did not find expected '-' indicator":    true,
	"did not find expected <document start>": true,
	"did not find expected <stream-start>":   true,
	"did not find expected key":              true,
	"did not find expected node content":     true,
	"found duplicate %TAG directive":         true,
	"found duplicate %YAML directive":        true,
	"found incompatible YAML document":       true,
	"found undefined tag handle":             true,
}

func (p *parser) syntaxError(err error) {
	msg := strings.TrimPrefix(err.Error(), "yaml: ")
	line := 0
	if m := yamlLineRE.FindStringSubmatch(err.Error()); m != nil {
		if n, convErr := strconv.Atoi(m[1]); convErr == nil {
			line = n
		}
		msg = m[2]
	}
	if yamlParserProblems[msg] {
		line++
	}
	line = max(line, 1)
	p.errorAt(Pos{File: p.file, Line: line, Col: 1}, "", "malformed YAML: %s", msg)
}

// deref follows aliases so that `*anchor` reads like the anchored value.
func deref(n *yaml.Node) *yaml.Node {
	for n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	return n
}

func isNull(n *yaml.Node) bool {
	return n.Kind == yaml.ScalarNode && n.Tag == "!!null"
}

// describe names what a node is, for "expected X, got Y" messages.
func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		switch n.Tag {
		case "!!null":
			return "nothing"
		case "!!int", "!!float":
			return "the number " + n.Value
		case "!!bool":
			return "the boolean " + n.Value
		case "!!str":
			return strconv.Quote(n.Value)
		}
		return n.Tag + " " + strconv.Quote(n.Value)
	}
	return "an unexpected YAML node"
}

// entry is one key: value pair of a mapping.
type entry struct {
	key, val *yaml.Node
}

// mapping is a checked YAML mapping: keys are unique strings.
type mapping struct {
	node    *yaml.Node
	entries []entry // in file order
	byKey   map[string]entry
}

func (m *mapping) get(key string) *yaml.Node {
	if e, ok := m.byKey[key]; ok {
		return e.val
	}
	return nil
}

func (m *mapping) keyPos(p *parser, key string) Pos {
	if e, ok := m.byKey[key]; ok {
		return p.pos(e.key)
	}
	return p.pos(m.node)
}

// mapping checks that n is a mapping (null counts as empty) and reports duplicate keys and,
// when allowed is non-nil, keys outside allowed with the nearest valid one as a hint. Entries
// with bad keys are dropped; the result is nil only when n is not a mapping at all.
func (p *parser) mapping(n *yaml.Node, what string, allowed []string) *mapping {
	n = deref(n)
	m := &mapping{node: n, byKey: map[string]entry{}}
	if isNull(n) {
		return m
	}
	if n.Kind != yaml.MappingNode {
		p.errorf(n, "", "%s: expected a mapping, got %s", what, describe(n))
		return nil
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := deref(n.Content[i]), n.Content[i+1]
		if k.Kind != yaml.ScalarNode || isNull(k) {
			p.errorf(k, "keys are plain words", "%s: expected a key, got %s", what, describe(k))
			continue
		}
		if k.Value == "<<" {
			p.errorf(k, "write the keys out", "%s: merge keys (<<) are not supported", what)
			continue
		}
		if prev, dup := m.byKey[k.Value]; dup {
			p.errorf(k, fmt.Sprintf("first given at line %d", prev.key.Line), "%s: duplicate key %q", what, k.Value)
			continue
		}
		if allowed != nil && !contains(allowed, k.Value) {
			p.errorf(k, Suggest(k.Value, allowed, "valid keys"), "%s: unknown key %q", what, k.Value)
			continue
		}
		e := entry{key: k, val: deref(v)}
		m.entries = append(m.entries, e)
		m.byKey[k.Value] = e
	}
	return m
}

// require reports each of keys missing from m.
func (p *parser) require(m *mapping, what string, keys ...string) bool {
	ok := true
	for _, k := range keys {
		if _, found := m.byKey[k]; !found {
			p.errorf(p.owner(m.node), "", "%s: missing key %q", what, k)
			ok = false
		}
	}
	return ok
}

func (p *parser) str(n *yaml.Node, what string) (string, bool) {
	if n.Kind != yaml.ScalarNode || n.Tag != "!!str" {
		p.errorf(n, "", "%s: expected a word, got %s", what, describe(n))
		return "", false
	}
	return n.Value, true
}

// oneOf reads a word that must be one of choices.
func (p *parser) oneOf(n *yaml.Node, what string, choices []string) (string, bool) {
	s, ok := p.str(n, what)
	if !ok {
		return "", false
	}
	if !contains(choices, s) {
		p.errorf(n, Suggest(s, choices, "choose from"), "%s: unknown value %q", what, s)
		return "", false
	}
	return s, true
}

func (p *parser) integer(n *yaml.Node, what string) (int, bool) {
	if s := overflowText(n); s != "" {
		p.errorf(n, fmt.Sprintf("at most %d", maxInt), "%s: integer %s is out of range", what, s)
		return 0, false
	}
	if n.Kind != yaml.ScalarNode || n.Tag != "!!int" {
		p.errorf(n, "", "%s: expected an integer, got %s", what, describe(n))
		return 0, false
	}
	var v int64
	if err := n.Decode(&v); err != nil || v > maxInt || v < -maxInt {
		p.errorf(n, fmt.Sprintf("at most %d", maxInt), "%s: integer %s is out of range", what, n.Value)
		return 0, false
	}
	return int(v), true
}

// positive reads an integer >= 1.
func (p *parser) positive(n *yaml.Node, what string) (int, bool) {
	v, ok := p.integer(n, what)
	if ok && v < 1 {
		p.errorf(n, "", "%s: must be a positive integer, got %d", what, v)
		return 0, false
	}
	return v, ok
}

// natural reads an integer >= 0.
func (p *parser) natural(n *yaml.Node, what string) (int, bool) {
	v, ok := p.integer(n, what)
	if ok && v < 0 {
		p.errorf(n, "", "%s: must not be negative, got %d", what, v)
		return 0, false
	}
	return v, ok
}

func (p *parser) number(n *yaml.Node, what string) (float64, bool) {
	if s := overflowText(n); s != "" {
		p.errorf(n, "", "%s: %s is out of range, not a finite number", what, s)
		return 0, false
	}
	if n.Kind != yaml.ScalarNode || (n.Tag != "!!int" && n.Tag != "!!float") {
		p.errorf(n, "", "%s: expected a number, got %s", what, describe(n))
		return 0, false
	}
	var v float64
	if err := n.Decode(&v); err != nil || math.IsNaN(v) || math.IsInf(v, 0) {
		p.errorf(n, "", "%s: expected a finite number, got %s", what, n.Value)
		return 0, false
	}
	return v, true
}

func (p *parser) boolean(n *yaml.Node, what string) (bool, bool) {
	if n.Kind != yaml.ScalarNode || n.Tag != "!!bool" {
		p.errorf(n, "use true or false", "%s: expected a boolean, got %s", what, describe(n))
		return false, false
	}
	var v bool
	if err := n.Decode(&v); err != nil {
		p.errorf(n, "use true or false", "%s: expected a boolean, got %s", what, n.Value)
		return false, false
	}
	return v, true
}

// list reads a sequence, or a single item as a list of one when single is set.
func (p *parser) list(n *yaml.Node, what string, single bool) ([]*yaml.Node, bool) {
	if n.Kind == yaml.SequenceNode {
		items := make([]*yaml.Node, len(n.Content))
		for i, c := range n.Content {
			items[i] = deref(c)
		}
		return items, true
	}
	if single && n.Kind == yaml.ScalarNode && !isNull(n) {
		return []*yaml.Node{n}, true
	}
	p.errorf(n, "", "%s: expected a list, got %s", what, describe(n))
	return nil, false
}

// ints reads a non-empty list of integers (or one integer when single is set), each checked by
// elem (p.integer, p.natural or p.positive).
func (p *parser) ints(n *yaml.Node, what string, single bool, elem func(*yaml.Node, string) (int, bool)) ([]int, bool) {
	items, ok := p.list(n, what, single)
	if !ok {
		return nil, false
	}
	if len(items) == 0 {
		p.errorf(n, "", "%s: must not be empty", what)
		return nil, false
	}
	out := make([]int, 0, len(items))
	for _, it := range items {
		v, ok1 := elem(it, what)
		ok = ok && ok1
		out = append(out, v)
	}
	return out, ok
}

// ascending checks that a list read from n is strictly ascending (so also unique).
func (p *parser) ascending(n *yaml.Node, what string, vs []int) bool {
	for i := 1; i < len(vs); i++ {
		if vs[i] <= vs[i-1] {
			p.errorf(n, "list each value once, smallest first", "%s: %d after %d is not ascending", what, vs[i], vs[i-1])
			return false
		}
	}
	return true
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// Suggest builds a hint naming the nearest of choices to s (when it is plausibly a typo) and
// listing all of them.
func Suggest(s string, choices []string, listName string) string {
	all := listName + ": " + strings.Join(choices, ", ")
	if near := nearest(s, choices); near != "" {
		return fmt.Sprintf("did you mean %q? %s", near, all)
	}
	return all
}

// nearest returns the choice closest to s by edit distance, or "" when none is close enough to
// be a typo.
func nearest(s string, choices []string) string {
	best, bestD := "", -1
	for _, c := range choices {
		d := levenshtein(s, c)
		if bestD < 0 || d < bestD {
			best, bestD = c, d
		}
	}
	// Up to a third of the word may be wrong (at least two letters), but never all of it.
	limit := min(max(2, len(best)/3), len([]rune(best))-1, len([]rune(s))-1)
	if bestD < 0 || bestD > limit {
		return ""
	}
	return best
}

func levenshtein(a, b string) int {
	ra, rb := []rune(a), []rune(b)
	prev := make([]int, len(rb)+1)
	cur := make([]int, len(rb)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(ra); i++ {
		cur[0] = i
		for j := 1; j <= len(rb); j++ {
			cost := 1
			if ra[i-1] == rb[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(rb)]
}
