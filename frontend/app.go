package frontend

import (
	"fmt"
	"math"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"

	"xmix/input"
	"xmix/mi"
)

var (
	appKeys        = []string{"app", "params", "buffers", "kernels", "ops"}
	kernelKeys     = []string{"ptx", "entry", "signature"}
	paramKeys      = []string{"file", "tensor", "values", "random", "per_request"}
	bufferKeys     = []string{"shape", "dtype", "export"}
	opKinds        = []string{"read", "write"}
	opKeys         = []string{"at", "kernel", "args", "into", "when"}
	atKeys         = []string{"layers", "hook", "per_request"}
	whenKeys       = []string{"token_in", "after_token", "activation", "steps", "positions"}
	activationKeys = []string{"buffer", "op", "value"}
	stepsKeys      = []string{"from", "to"}
	comparisons    = []string{">", ">=", "<", "<=", "==", "!="}
	positionWords  = []string{"prompt", "generated", "all"}
	bufferDtypes   = []string{"f32", "bf16", "i32"}

	appNameRE    = regexp.MustCompile(`^[a-z0-9_-]+$`)
	identRE      = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
	layerRangeRE = regexp.MustCompile(`^\s*(\d+)\s*-\s*(\d+)\s*$`)
)

// maxLayers bounds a layer range when no model is given to check it against, so that a typo
// like "0-2000000000" cannot allocate gigabytes.
const maxLayers = 1 << 12

// maxElems bounds a buffer's element count.
const maxElems = 1 << 30

// LoadApp reads and parses an app spec file against model m.
func LoadApp(path string, m *Model) (*App, error) {
	data, err := input.Read(path, input.Spec)
	if err != nil {
		return nil, fmt.Errorf("app spec: %w", err)
	}
	return ParseApp(path, data, m)
}

// ParseApp parses an app spec. Hooks, layers and token ids are checked against m; with a nil m
// every family's hooks are accepted and layers and tokens are not range-checked. On error it
// returns an ErrorList with every problem found.
func ParseApp(path string, data []byte, m *Model) (*App, error) {
	p, err := newParser(path)
	if err != nil {
		return nil, err
	}
	root := p.document(data)
	if root == nil {
		return nil, p.result()
	}
	a := p.app(root, m)
	if err := p.result(); err != nil {
		return nil, err
	}
	return a, nil
}

// appParser holds what ops are checked against.
type appParser struct {
	*parser
	model   *Model // may be nil
	buffers []string
	custom  []string // names of the app's custom kernels
}

func (p *parser) app(root *yaml.Node, m *Model) *App {
	top := p.mapping(root, "app spec", appKeys)
	abs, err := filepath.Abs(p.file)
	if err != nil {
		abs = p.file
	}
	a := &App{Pos: p.pos(root), Path: abs, Dir: p.dir}
	p.require(top, "app spec", "app", "ops")
	if n := top.get("app"); n != nil {
		if s, ok := p.str(n, "app"); ok && !appNameRE.MatchString(s) {
			p.errorf(n, "use lower-case letters, digits, - and _", "app: bad name %q", s)
		} else {
			a.Name = s
		}
	}
	ap := &appParser{parser: p, model: m}
	if n := top.get("params"); n != nil {
		a.Params = ap.params(n)
	}
	if n := top.get("buffers"); n != nil {
		a.Buffers = ap.buffersOf(n)
	}
	for _, b := range a.Buffers {
		ap.buffers = append(ap.buffers, b.Name)
	}
	if n := top.get("kernels"); n != nil {
		a.Kernels = ap.kernels(n)
	}
	for _, k := range a.Kernels {
		ap.custom = append(ap.custom, k.Name)
	}
	if n := top.get("ops"); n != nil {
		a.Ops = ap.ops(n)
	}
	return a
}

func (p *appParser) name(k *yaml.Node, what string) bool {
	if !identRE.MatchString(k.Value) {
		p.errorf(k, "use letters, digits and _, not starting with a digit", "%s: bad name %q", what, k.Value)
		return false
	}
	return true
}

func (p *appParser) params(n *yaml.Node) []Param {
	pm := p.mapping(n, "params", nil)
	if pm == nil {
		return nil
	}
	var out []Param
	for _, e := range pm.entries {
		if !p.name(e.key, "params") {
			continue
		}
		what := "params." + e.key.Value
		par := Param{Pos: p.pos(e.key), Name: e.key.Value}
		fm := p.mapping(e.val, what, paramKeys)
		if fm == nil {
			continue
		}
		if n := fm.get("per_request"); n != nil {
			par.PerRequest, _ = p.boolean(n, what+".per_request")
		}
		file, values, random := fm.get("file"), fm.get("values"), fm.get("random")
		given := 0
		for _, n := range []*yaml.Node{file, values, random} {
			if n != nil {
				given++
			}
		}
		switch {
		case given > 1:
			p.errorf(e.key, "give one of file:, values: or random:", "%s: has more than one source", what)
			continue
		case given == 0:
			p.errorf(e.key, "give {file: x.safetensors, tensor: name}, {values: [...]} or {random: SEED}", "%s: needs file, values or random", what)
			continue
		case random != nil:
			seed, ok := p.number(random, what+".random")
			if !ok || seed < 0 || seed != math.Trunc(seed) {
				p.errorf(random, "a whole number seed, e.g. random: 7", "%s.random: not a seed", what)
				continue
			}
			s := uint64(seed)
			par.Random = &s
		case file != nil:
			s, ok := p.str(file, what+".file")
			if !ok {
				continue
			}
			if s == "" {
				p.errorf(file, "", "%s.file: path must not be empty", what)
				continue
			}
			// The tensor defaults to the param's own name, the usual case for vector files.
			par.File, par.Tensor = p.resolve(s), par.Name
			if t := fm.get("tensor"); t != nil {
				if par.Tensor, ok = p.str(t, what+".tensor"); !ok {
					continue
				}
			}
		default:
			if t := fm.get("tensor"); t != nil {
				p.errorf(t, "tensor: goes with file:", "%s: inline values take no tensor", what)
			}
			items, ok := p.list(values, what+".values", false)
			if !ok {
				continue
			}
			if len(items) == 0 {
				p.errorf(values, "", "%s.values: must not be empty", what)
				continue
			}
			for _, it := range items {
				v, _ := p.float32Number(it, what+".values")
				par.Values = append(par.Values, float32(v))
			}
		}
		out = append(out, par)
	}
	return out
}

func (p *appParser) buffersOf(n *yaml.Node) []Buffer {
	bm := p.mapping(n, "buffers", nil)
	if bm == nil {
		return nil
	}
	var out []Buffer
	for _, e := range bm.entries {
		if !p.name(e.key, "buffers") {
			continue
		}
		what := "buffers." + e.key.Value
		b := Buffer{Pos: p.pos(e.key), Name: e.key.Value, Dtype: "f32"}
		fm := p.mapping(e.val, what, bufferKeys)
		if fm == nil || !p.require(fm, what, "shape") {
			continue
		}
		shape, ok := p.ints(fm.get("shape"), what+".shape", false, p.positive)
		if ok {
			elems := 1
			for _, d := range shape {
				elems *= d
				if elems > maxElems {
					p.errorf(fm.get("shape"), "", "%s.shape: more than %d elements", what, maxElems)
					break
				}
			}
			b.Shape = shape
		}
		if d := fm.get("dtype"); d != nil {
			b.Dtype, _ = p.oneOf(d, what+".dtype", bufferDtypes)
		}
		if x := fm.get("export"); x != nil {
			b.Export, _ = p.boolean(x, what+".export")
		}
		out = append(out, b)
	}
	return out
}

func (p *appParser) ops(n *yaml.Node) []Op {
	items, ok := p.list(n, "ops", false)
	if !ok {
		return nil
	}
	if len(items) == 0 {
		p.errorf(n, "add at least one read or write", "ops: must not be empty")
		return nil
	}
	var out []Op
	for i, it := range items {
		what := fmt.Sprintf("ops[%d]", i)
		om := p.mapping(it, what, opKinds)
		if om == nil {
			continue
		}
		if len(om.entries) != 1 {
			p.errorf(it, "write `- read: {...}` or `- write: {...}` per list item", "%s: an op has exactly one key, read or write", what)
			continue
		}
		e := om.entries[0]
		if op, ok := p.op(e, what+"."+e.key.Value); ok {
			out = append(out, op)
		}
	}
	return out
}

func (p *appParser) op(e entry, what string) (Op, bool) {
	nerr := len(p.errs)
	op := Op{Pos: p.pos(e.key), Kind: e.key.Value}
	bm := p.mapping(e.val, what, opKeys)
	if bm == nil || !p.require(bm, what, "at", "kernel") {
		return op, false
	}
	p.at(bm.get("at"), what+".at", &op)

	kn := bm.get("kernel")
	op.KernelPos = p.pos(kn)
	if s, ok := p.str(kn, what+".kernel"); ok {
		switch name, isCustom := strings.CutPrefix(s, CustomPrefix); {
		case contains(mi.Names(), s):
			op.Kernel = s
		case contains(p.custom, name):
			op.Kernel = CustomPrefix + name
		case isCustom:
			p.errorf(kn, Suggest(name, p.custom, "kernels: of this app"), "%s: custom kernel %q is not declared under kernels:", what, name)
		default:
			p.errorf(kn, Suggest(s, mi.Names(), "kernels"), "%s: unknown kernel %q", what, s)
		}
	}

	if n := bm.get("args"); n != nil {
		op.Args = p.args(n, what+".args")
	}

	into := bm.get("into")
	switch {
	case op.Kind == "write" && into != nil:
		p.errorAt(bm.keyPos(p.parser, "into"), "only read ops fill a buffer", "%s: a write takes no into", what)
	case op.Kind == "read" && into == nil:
		p.errorf(e.key, "add into: naming one of buffers:", "%s: a read needs into", what)
	case into != nil:
		op.IntoPos = p.pos(into)
		op.Into, _ = p.buffer(into, what+".into")
	}

	if n := bm.get("when"); n != nil {
		op.When = p.when(n, what+".when")
	}
	return op, len(p.errs) == nerr
}

// buffer reads a reference to a declared buffer.
func (p *appParser) buffer(n *yaml.Node, what string) (string, bool) {
	s, ok := p.str(n, what)
	if !ok {
		return "", false
	}
	if !contains(p.buffers, s) {
		hint := "declare it under buffers:"
		if len(p.buffers) > 0 {
			hint = Suggest(s, p.buffers, "buffers")
		}
		p.errorf(n, hint, "%s: unknown buffer %q", what, s)
		return "", false
	}
	return s, true
}

func (p *appParser) at(n *yaml.Node, what string, op *Op) {
	am := p.mapping(n, what, atKeys)
	if am == nil || !p.require(am, what, "hook") {
		return
	}
	hn := am.get("hook")
	op.HookPos = p.pos(hn)
	hook, ok := p.str(hn, what+".hook")
	if !ok {
		return
	}
	// Which hooks there are, and which are per layer, is the model family's graph's to say
	// (package models); resolve-hooks checks the name against it.
	op.Hook = hook
	if ln := am.get("layers"); ln != nil {
		op.LayersPos = p.pos(ln)
		op.Layers, op.AllLayers = p.layers(ln, what+".layers")
	}
	if n := am.get("per_request"); n != nil {
		op.PerRequestPos = p.pos(n)
		op.LayersPerRequest, _ = p.boolean(n, what+".per_request")
	}
}

// layers reads N, [N, M, ...], "A-B" (inclusive) or all.
func (p *appParser) layers(n *yaml.Node, what string) ([]int, bool) {
	const hint = `use N, [N, M], "A-B" or all`
	switch {
	case n.Kind == yaml.ScalarNode && n.Tag == "!!str" && n.Value == "all":
		return nil, true
	case n.Kind == yaml.ScalarNode && n.Tag == "!!str":
		m := layerRangeRE.FindStringSubmatch(n.Value)
		if m == nil {
			p.errorf(n, hint, "%s: bad layer range %q", what, n.Value)
			return nil, false
		}
		lo, err1 := strconv.Atoi(m[1])
		hi, err2 := strconv.Atoi(m[2])
		if err1 != nil || err2 != nil || lo > hi {
			p.errorf(n, "the first layer comes first: \"A-B\" with A <= B", "%s: bad layer range %q", what, n.Value)
			return nil, false
		}
		if !p.layerInRange(n, what, lo) || !p.layerInRange(n, what, hi) {
			return nil, false
		}
		out := make([]int, 0, hi-lo+1)
		for l := lo; l <= hi; l++ {
			out = append(out, l)
		}
		return out, false
	case n.Kind == yaml.ScalarNode && n.Tag == "!!int":
		l, ok := p.natural(n, what)
		if !ok || !p.layerInRange(n, what, l) {
			return nil, false
		}
		return []int{l}, false
	case n.Kind == yaml.SequenceNode:
		items, _ := p.list(n, what, false)
		if len(items) == 0 {
			p.errorf(n, hint, "%s: must not be empty", what)
			return nil, false
		}
		var out []int
		seen := map[int]bool{}
		for _, it := range items {
			l, ok := p.natural(it, what)
			if !ok || !p.layerInRange(it, what, l) {
				continue
			}
			if seen[l] {
				p.errorf(it, "list each layer once", "%s: layer %d given twice", what, l)
				continue
			}
			seen[l] = true
			out = append(out, l)
		}
		return out, false
	}
	p.errorf(n, hint, "%s: expected layers, got %s", what, describe(n))
	return nil, false
}

func (p *appParser) layerInRange(n *yaml.Node, what string, l int) bool {
	if p.model != nil && p.model.Layers > 0 {
		if l >= p.model.Layers {
			p.errorf(n, fmt.Sprintf("model %q has layers 0-%d", p.model.Name, p.model.Layers-1),
				"%s: layer %d is out of range", what, l)
			return false
		}
		return true
	}
	if l >= maxLayers {
		p.errorf(n, fmt.Sprintf("at most %d layers", maxLayers), "%s: layer %d is out of range", what, l)
		return false
	}
	return true
}

// args reads name: number-or-word pairs; which names a kernel needs is checked by the passes.
func (p *appParser) args(n *yaml.Node, what string) []Arg {
	am := p.mapping(n, what, nil)
	if am == nil {
		return nil
	}
	var out []Arg
	for _, e := range am.entries {
		if !p.name(e.key, what) {
			continue
		}
		a := Arg{Pos: p.pos(e.key), Name: e.key.Value}
		v := e.val
		switch {
		case v.Kind == yaml.ScalarNode && (v.Tag == "!!int" || v.Tag == "!!float" || overflowText(v) != ""):
			// Every number an op takes becomes an f32 (a scalar) or a small count.
			x, ok := p.float32Number(v, what+"."+a.Name)
			if !ok {
				continue
			}
			a.Number = &x
		case v.Kind == yaml.ScalarNode && v.Tag == "!!str" && v.Value != "":
			a.Word = v.Value
		default:
			p.errorf(v, "put vectors and lists under params: and name them here",
				"%s.%s: expected a number or a word, got %s", what, a.Name, describe(v))
			continue
		}
		out = append(out, a)
	}
	return out
}

func (p *appParser) when(n *yaml.Node, what string) []Cond {
	wm := p.mapping(n, what, whenKeys)
	if wm == nil {
		return nil
	}
	var out []Cond
	for _, e := range wm.entries {
		c := Cond{Pos: p.pos(e.key), Kind: e.key.Value}
		cw := what + "." + c.Kind
		ok := true
		switch c.Kind {
		case "token_in", "after_token":
			c.Tokens, ok = p.ints(e.val, cw, true, p.natural)
			if ok && p.model != nil && p.model.Vocab > 0 {
				for _, t := range c.Tokens {
					if t >= p.model.Vocab {
						p.errorf(e.val, fmt.Sprintf("model %q has vocab %d", p.model.Name, p.model.Vocab),
							"%s: token %d is not a token id of the model", cw, t)
						ok = false
					}
				}
			}
		case "activation":
			ok = p.activation(e.val, cw, &c)
		case "steps":
			ok = p.steps(e.val, cw, &c)
		case "positions":
			c.Positions, ok = p.oneOf(e.val, cw, positionWords)
		}
		if ok {
			out = append(out, c)
		}
	}
	if len(wm.entries) == 0 && len(wm.node.Content) == 0 {
		p.errorf(p.owner(wm.node), "remove when: for an unconditional op", "%s: no conditions", what)
	}
	return out
}

func (p *appParser) activation(n *yaml.Node, what string, c *Cond) bool {
	am := p.mapping(n, what, activationKeys)
	if am == nil || !p.require(am, what, activationKeys...) {
		return false
	}
	var ok [3]bool
	c.Buffer, ok[0] = p.buffer(am.get("buffer"), what+".buffer")
	c.Cmp, ok[1] = p.oneOf(am.get("op"), what+".op", comparisons)
	c.Value, ok[2] = p.float32Number(am.get("value"), what+".value")
	return ok[0] && ok[1] && ok[2]
}

// steps reads {from, to} or [from, to]: the generation-step window [from, to), to 0 = open.
func (p *appParser) steps(n *yaml.Node, what string, c *Cond) bool {
	var from, to *yaml.Node
	switch n.Kind {
	case yaml.SequenceNode:
		if len(n.Content) != 2 {
			p.errorf(n, "write [from, to] or {from: A, to: B}", "%s: expected two steps, got %d", what, len(n.Content))
			return false
		}
		from, to = deref(n.Content[0]), deref(n.Content[1])
	default:
		sm := p.mapping(n, what, stepsKeys)
		if sm == nil {
			return false
		}
		if len(sm.entries) == 0 {
			p.errorf(n, "write [from, to] or {from: A, to: B}", "%s: give from, to or both", what)
			return false
		}
		from, to = sm.get("from"), sm.get("to")
	}
	ok := true
	if from != nil {
		c.From, ok = p.natural(from, what+".from")
	}
	if to != nil {
		var good bool
		c.To, good = p.natural(to, what+".to")
		ok = ok && good
		if good && c.To != 0 && c.To <= c.From {
			p.errorf(to, "the window is [from, to); to: 0 leaves it open", "%s: to %d is not after from %d", what, c.To, c.From)
			ok = false
		}
	}
	return ok
}

// CustomPrefix marks an op's kernel as one of its app's custom kernels: "custom:<name>". An
// op may also name the kernel bare; Op.Kernel always carries the prefix.
const CustomPrefix = "custom:"

// CustomKernel is a user kernel given as PTX text with a declared signature. The frontend only
// reads it; codegen.CheckCustom checks the PTX against the signature and the ABI.
type CustomKernel struct {
	Pos       Pos
	Name      string
	PTX       string // the module text
	PTXPos    Pos
	File      string // absolute path when the text came from a file, else ""
	Entry     string
	EntryPos  Pos
	Signature []SigParam
	SigPos    Pos
}

// SigParam is one declared kernel parameter: "name type".
type SigParam struct {
	Pos  Pos
	Name string
	Type string // u32, u64 or f32
}

// sigTypes are the parameter types a custom kernel's signature may declare.
var sigTypes = []string{"u32", "u64", "f32"}

func (p *appParser) kernels(n *yaml.Node) []CustomKernel {
	km := p.mapping(n, "kernels", nil)
	if km == nil {
		return nil
	}
	var out []CustomKernel
	for _, e := range km.entries {
		if !p.name(e.key, "kernels") {
			continue
		}
		what := "kernels." + e.key.Value
		if contains(mi.Names(), e.key.Value) {
			p.errorf(e.key, "pick a name that is not a built-in kernel", "%s: %q is a built-in kernel", what, e.key.Value)
			continue
		}
		fm := p.mapping(e.val, what, kernelKeys)
		if fm == nil || !p.require(fm, what, "ptx", "entry", "signature") {
			continue
		}
		k := CustomKernel{Pos: p.pos(e.key), Name: e.key.Value}
		ok := true
		src := fm.get("ptx")
		k.PTXPos = p.pos(src)
		if s, good := p.str(src, what+".ptx"); !good {
			ok = false
		} else if !strings.Contains(s, "\n") && strings.HasSuffix(strings.TrimSpace(s), ".ptx") {
			k.File = p.resolve(strings.TrimSpace(s))
			data, err := input.Read(k.File, input.PTX)
			if err != nil {
				p.errorf(src, "check the ptx: path (relative to the app spec)", "%s.ptx: %v", what, err)
				ok = false
			}
			k.PTX = string(data)
		} else {
			k.PTX = s
		}
		en := fm.get("entry")
		k.EntryPos = p.pos(en)
		if s, good := p.str(en, what+".entry"); good && identRE.MatchString(s) {
			k.Entry = s
		} else {
			if good {
				p.errorf(en, "name the .entry of the PTX", "%s.entry: bad name %q", what, s)
			}
			ok = false
		}
		sn := fm.get("signature")
		k.SigPos = p.pos(sn)
		items, good := p.list(sn, what+".signature", false)
		if !good {
			continue
		}
		for i, it := range items {
			sw := fmt.Sprintf("%s.signature[%d]", what, i)
			s, good := p.str(it, sw)
			if !good {
				ok = false
				continue
			}
			f := strings.Fields(s)
			if len(f) != 2 || !identRE.MatchString(f[0]) || !contains(sigTypes, f[1]) {
				p.errorf(it, "write \"name type\" with type u32, u64 or f32", "%s: bad parameter %q", sw, s)
				ok = false
				continue
			}
			k.Signature = append(k.Signature, SigParam{Pos: p.pos(it), Name: f[0], Type: f[1]})
		}
		if ok {
			out = append(out, k)
		}
	}
	return out
}
