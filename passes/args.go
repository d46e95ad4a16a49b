package passes

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
	"strings"

	"xmix/bundle"
	"xmix/frontend"
	"xmix/input"
	"xmix/ir"
	"xmix/mi"
	"xmix/safetensors"
)

// templateOf is op's template; a custom kernel's is empty (no facts: its kernel is its own).
func templateOf(op *MIOp) *mi.Template {
	if t, ok := mi.Lookup(op.Template); ok {
		return t
	}
	return &mi.Template{Name: op.Template}
}

// outWidth is how many columns of its buffer a read writes per row.
func outWidth(t *mi.Template, op *MIOp) int {
	if t.OutCols == nil {
		return 0
	}
	return t.OutCols(op.Width, op.K)
}

// templatesAt lists the templates that name hook among theirs, sorted.
func templatesAt(hook string) []string {
	var out []string
	for _, n := range mi.Names() {
		if t, _ := mi.Lookup(n); contains(t.Hooks, hook) {
			out = append(out, n)
		}
	}
	return out
}

// bindArgs checks each op's arguments against its template, loads the vectors it names,
// fills the app's scalar table and assigns output columns of reads.
func bindArgs(p *Program) error {
	var errs []error
	files := map[string]*safetensors.File{}
	cols := map[*Export]int{}
	for _, a := range p.Apps {
		scalarIndex := map[string]int{}
		vectorIndex := map[string]string{}
		// An op over several layers would fail the same way at each; report it once.
		failed := map[int]bool{}
		for _, op := range p.Ops {
			if op.App != a || failed[op.OpIndex] {
				continue
			}
			spec := a.Spec.Ops[op.OpIndex]
			if op.Custom != nil {
				if err := bindCustom(p, a, op, spec, files, vectorIndex); err != nil {
					errs = append(errs, err)
					failed[op.OpIndex] = true
				}
				continue
			}
			if err := bindOp(p, a, op, spec, files, scalarIndex, vectorIndex, cols); err != nil {
				errs = append(errs, err)
				failed[op.OpIndex] = true
			}
		}
		for i := range a.Exports {
			e := &a.Exports[i]
			if got, used := cols[e]; used && got != e.Width {
				errs = append(errs, frontend.Errorf(e.Pos, fmt.Sprintf("set shape: [%d]", got),
					"buffer %s has %d elements but its reads write %d per token", e.Name, e.Width, got))
			}
		}
	}
	return errors.Join(errs...)
}

func bindOp(p *Program, a *AppPlan, op *MIOp, spec frontend.Op, files map[string]*safetensors.File,
	scalarIndex map[string]int, vectorIndex map[string]string, cols map[*Export]int) error {
	t := templateOf(op)
	if string(t.Kind) != op.Kind {
		return frontend.Errorf(spec.Pos, fmt.Sprintf("use `%s:` for %s", t.Kind, op.Template),
			"kernel %s is a %s, not a %s", op.Template, t.Kind, op.Kind)
	}
	if t.Hooks != nil && !contains(t.Hooks, op.Hook) {
		return frontend.Errorf(spec.HookPos, "hooks of "+op.Template+": "+strings.Join(t.Hooks, ", "),
			"kernel %s cannot sit at hook %s", op.Template, op.Hook)
	}
	switch m := p.Model; {
	case op.Hook == "logits" && !t.Elementwise:
		return frontend.Errorf(spec.KernelPos, "templates at logits: "+strings.Join(mi.ElementwiseNames(), ", "),
			"kernel %s cannot sit at hook logits (its rows are vocabulary-wide, %d columns)", op.Template, m.Vocab)
	case op.Hook == "sampled" && !contains(t.Hooks, op.Hook):
		// The sampler's output: only templates made for the sampler sit there.
		return frontend.Errorf(spec.KernelPos, "templates at sampled: "+strings.Join(templatesAt(op.Hook), ", "),
			"kernel %s cannot sit at hook sampled", op.Template)
	}
	for _, c := range spec.When {
		switch {
		case t.Heavy:
			return frontend.Errorf(c.Pos, "enable the app per request instead",
				"kernel %s takes no when: conditions in this version of xmixc", op.Template)
		case c.Kind == "activation" && op.Hook == "sampled":
			// The sampler finds its token row's control words, but not yet its reads.
			return frontend.Errorf(c.Pos, "use token_in, after_token, steps or positions here",
				"kernel %s at %s takes no activation condition in this version of xmixc", op.Template, op.Hook)
		}
	}
	given := map[string]frontend.Arg{}
	for _, arg := range spec.Args {
		if _, known := t.Args[arg.Name]; !known {
			return frontend.Errorf(arg.Pos, "arguments of "+op.Template+": "+strings.Join(argNames(t), ", "),
				"kernel %s takes no argument %q", op.Template, arg.Name)
		}
		given[arg.Name] = arg
	}
	for _, name := range argNames(t) {
		f := t.Args[name]
		arg, has := given[name]
		if !has {
			if f.Required {
				return frontend.Errorf(spec.KernelPos, fmt.Sprintf("add args: {%s: ...}", name),
					"kernel %s needs argument %q", op.Template, name)
			}
		}
		switch f.Kind {
		case mi.Vector:
			if !has {
				continue
			}
			buf, err := bindVector(p, a, op, arg, f.Unit, files, vectorIndex)
			if err != nil {
				return err
			}
			op.Vec, op.VecPerRequest = buf, a.vector(buf).PerRequest
		case mi.Head:
			buf, err := bindHead(p, a, op, arg, vectorIndex)
			if err != nil {
				return err
			}
			op.Vec = buf
		case mi.Scalar:
			if _, replaced := given[f.Unless]; f.Unless != "" && replaced {
				if has {
					return frontend.Errorf(arg.Pos, "give "+name+" or "+f.Unless,
						"kernel %s takes %s or %s, not both", op.Template, name, f.Unless)
				}
				continue
			}
			if !has && f.Omit {
				continue
			}
			key := fmt.Sprintf("op%d.%s", op.OpIndex, name)
			idx, done := scalarIndex[key]
			if !done {
				v := f.Default
				if has {
					var err error
					if v, err = scalarValue(a, arg, files); err != nil {
						return err
					}
				}
				idx = len(a.Scalars)
				scalarIndex[key] = idx
				a.Scalars = append(a.Scalars, Scalar{Name: key, Value: v})
			}
			if f.Slot == mi.SlotBias {
				op.Bias = idx
			} else {
				op.Alpha = idx
			}
		case mi.Count:
			n := float64(f.Default)
			if has {
				if arg.Number == nil || *arg.Number != math.Trunc(*arg.Number) || *arg.Number < 1 || *arg.Number > float64(t.Max) {
					return frontend.Errorf(arg.Pos, fmt.Sprintf("give a whole number from 1 to %d", t.Max),
						"argument %s of %s must be a whole number from 1 to %d", name, op.Template, t.Max)
				}
				n = *arg.Number
			}
			op.K = int(n)
		case mi.Word:
			if !has {
				continue
			}
			if !contains(f.Words, arg.Word) {
				return frontend.Errorf(arg.Pos, "one of "+strings.Join(f.Words, ", "),
					"%s: %q is not a valid %s", op.Template, arg.Word, name)
			}
			if name == "activation" && arg.Word != "none" {
				op.Activation = arg.Word
			}
		}
	}
	for _, name := range argNames(t) {
		if f := t.Args[name]; f.Kind == mi.Scalar && f.Scales != "" && op.Alpha >= 0 && op.Vec != "" {
			at := spec.KernelPos
			if arg, has := given[name]; has {
				at = arg.Pos
			}
			if err := boundProduct(a, op, given[f.Scales].Word, at); err != nil {
				return err
			}
		}
	}
	if t.Check != nil {
		c := mi.CheckArgs{Alpha: op.Alpha, Bias: op.Bias, Model: p.Model.Name, Vocab: p.Model.Vocab}
		for _, s := range a.Scalars {
			c.Scalars = append(c.Scalars, s.Value)
		}
		if msg, hint := t.Check(c); msg != "" {
			return frontend.Errorf(spec.KernelPos, hint, "%s", msg)
		}
	}
	if t.Kind == mi.Read {
		e := a.export(spec.Into)
		if e == nil {
			return frontend.Errorf(spec.IntoPos, "declare it under buffers:", "buffer %q is not declared", spec.Into)
		}
		n := outWidth(t, op)
		op.Out, op.OutCol, op.OutWidth = e.Buffer, cols[e], e.Width
		cols[e] += n
		if cols[e] > e.Width {
			return frontend.Errorf(e.Pos, fmt.Sprintf("give it at least %d elements", cols[e]),
				"buffer %s has %d elements; the reads into it write more", e.Name, e.Width)
		}
	}
	return nil
}

func argNames(t *mi.Template) []string {
	ns := make([]string, 0, len(t.Args))
	for n := range t.Args {
		ns = append(ns, n)
	}
	sort.Strings(ns)
	return ns
}

func contains(ws []string, w string) bool {
	for _, x := range ws {
		if x == w {
			return true
		}
	}
	return false
}

// bindVector resolves a param reference to a device buffer holding its data, checking its
// length against the hook's width.
func bindVector(p *Program, a *AppPlan, op *MIOp, arg frontend.Arg, unit bool,
	files map[string]*safetensors.File, index map[string]string) (string, error) {
	if arg.Number != nil || arg.Word == "" {
		return "", frontend.Errorf(arg.Pos, "name a param declared under params:", "argument %s must name a vector param", arg.Name)
	}
	key := arg.Word
	if unit {
		key += ".unit"
	}
	if buf, ok := index[key]; ok {
		return buf, checkWidth(a, arg, buf, op)
	}
	data, err := paramData(a, arg, files, op.Width)
	if err != nil {
		return "", err
	}
	if len(data) != op.Width {
		return "", frontend.Errorf(arg.Pos, fmt.Sprintf("hook %s of model %q has width %d", op.Hook, p.Model.Name, op.Width),
			"param %s has %d elements, hook %s needs %d", arg.Word, len(data), op.Hook, op.Width)
	}
	if unit {
		var n float64
		for _, v := range data {
			n += float64(v) * float64(v)
		}
		if n == 0 {
			return "", frontend.Errorf(arg.Pos, "give a non-zero direction", "param %s is all zeros", arg.Word)
		}
		inv := 1 / math.Sqrt(n)
		unitData := make([]float32, len(data))
		for i, v := range data {
			unitData[i] = float32(float64(v) * inv)
		}
		data = unitData
	}
	buf := "app." + a.Name + ".param." + key
	a.Vectors = append(a.Vectors, Vector{Name: key, Buffer: buf, Data: data, Param: arg.Word, Unit: unit,
		PerRequest: param(a, arg.Word).PerRequest})
	index[key] = buf
	return buf, nil
}

// vector is the app's vector held in buffer buf.
func (a *AppPlan) vector(buf string) *Vector {
	for i := range a.Vectors {
		if a.Vectors[i].Buffer == buf {
			return &a.Vectors[i]
		}
	}
	return nil
}

// param is the app's param called name, or nil.
func param(a *AppPlan, name string) *frontend.Param {
	for i := range a.Spec.Params {
		if a.Spec.Params[i].Name == name {
			return &a.Spec.Params[i]
		}
	}
	return nil
}

// bindHead turns a head index into a 0/1 mask over that head's columns of attn.z
// ([heads*head_dim]), the vector head_ablate multiplies by alpha where it is set.
func bindHead(p *Program, a *AppPlan, op *MIOp, arg frontend.Arg, index map[string]string) (string, error) {
	m := p.Model
	if arg.Number == nil || *arg.Number != math.Trunc(*arg.Number) {
		return "", frontend.Errorf(arg.Pos, fmt.Sprintf("model %q has heads 0-%d", m.Name, m.Heads-1),
			"argument %s must be a whole head index", arg.Name)
	}
	h := *arg.Number
	if h < 0 || h >= float64(m.Heads) {
		return "", frontend.Errorf(arg.Pos, fmt.Sprintf("model %q has heads 0-%d", m.Name, m.Heads-1),
			"head %v out of range", h)
	}
	// Param names are identifiers, so a key with a dot cannot collide with one.
	key := fmt.Sprintf("head%d.mask", int(h))
	if buf, ok := index[key]; ok {
		return buf, nil
	}
	if op.Width != m.Heads*m.HeadDim {
		return "", fmt.Errorf("head_ablate at %s: width %d is not heads*head_dim %d", op.Hook, op.Width, m.Heads*m.HeadDim)
	}
	data := make([]float32, op.Width)
	for i := int(h) * m.HeadDim; i < (int(h)+1)*m.HeadDim; i++ {
		data[i] = 1
	}
	buf := "app." + a.Name + ".param." + key
	a.Vectors = append(a.Vectors, Vector{Name: key, Buffer: buf, Data: data})
	index[key] = buf
	return buf, nil
}

func checkWidth(a *AppPlan, arg frontend.Arg, buf string, op *MIOp) error {
	for _, v := range a.Vectors {
		if v.Buffer == buf && len(v.Data) != op.Width {
			return frontend.Errorf(arg.Pos, "use one param per hook width",
				"param %s has %d elements, hook %s needs %d", arg.Word, len(v.Data), op.Hook, op.Width)
		}
	}
	return nil
}

// boundProduct records that op's scalar Alpha multiplies its vector (param word) and refuses
// a value whose product with it overflows f32, or, at a hook of the residual stream, whose
// product makes the next RMSNorm's sum of squares overflow.
func boundProduct(a *AppPlan, op *MIOp, word string, at frontend.Pos) error {
	var data []float32
	for _, v := range a.Vectors {
		if v.Buffer == op.Vec {
			data = v.Data
		}
	}
	residual := op.Value.Class == ir.Residual || op.Value.Class == ir.Delta
	s := &a.Scalars[op.Alpha]
	s.Scales, s.Residual, s.Limit = op.Vec, residual, bundle.ProductLimit(data, residual)
	if v := s.Value; math.Abs(float64(v)) > float64(s.Limit) {
		_, name, _ := strings.Cut(s.Name, ".")
		what := "overflows float32"
		if residual {
			what = "overflows float32 in the residual stream's next RMSNorm"
		}
		return frontend.Errorf(at, fmt.Sprintf("with this %s, at most %.4g in magnitude", word, s.Limit),
			"%s %g times param %s (largest value %.4g) %s", name, v, word, bundle.MaxAbs(data), what)
	}
	return nil
}

// finite refuses a param whose values are not all finite, naming the first bad one.
func finite(prm *frontend.Param, v []float32) error {
	for i, x := range v {
		if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
			return frontend.Errorf(prm.Pos, "every value of a param must be finite",
				"%s: tensor %s: value %d is %v", prm.File, prm.Tensor, i, x)
		}
	}
	return nil
}

// scalarValue reads a scalar argument: a number, or a param with exactly one element.
func scalarValue(a *AppPlan, arg frontend.Arg, files map[string]*safetensors.File) (float32, error) {
	if arg.Number != nil {
		return float32(*arg.Number), nil
	}
	if prm := param(a, arg.Word); prm != nil && prm.PerRequest {
		return 0, frontend.Errorf(arg.Pos, "requests override scalars by name (app.opN.arg); drop per_request: from the param",
			"param %s is per_request, but argument %s is a scalar: only vector arguments take per-request values", arg.Word, arg.Name)
	}
	data, err := paramData(a, arg, files, 1)
	if err != nil {
		return 0, err
	}
	if len(data) != 1 {
		return 0, frontend.Errorf(arg.Pos, "give a number or a one-element param",
			"param %s has %d elements, argument %s is a scalar", arg.Word, len(data), arg.Name)
	}
	return data[0], nil
}

// paramData loads the tensor a param reference names; a random param is drawn at width.
func paramData(a *AppPlan, arg frontend.Arg, files map[string]*safetensors.File, width int) ([]float32, error) {
	prm := param(a, arg.Word)
	if prm == nil {
		names := make([]string, len(a.Spec.Params))
		for i, q := range a.Spec.Params {
			names[i] = q.Name
		}
		return nil, frontend.Errorf(arg.Pos, "declared params: "+strings.Join(names, ", "),
			"param %q is not declared in app %s", arg.Word, a.Name)
	}
	if prm.Random != nil {
		return randomUnit(*prm.Random, width), nil
	}
	if prm.File == "" {
		return prm.Values, nil
	}
	f, ok := files[prm.File]
	if !ok {
		data, err := input.Read(prm.File, input.Params)
		if err != nil {
			return nil, frontend.Errorf(prm.Pos, "check the file: path (relative to the app spec)", "cannot read params file: %v", err)
		}
		if f, err = safetensors.Parse(data); err != nil {
			return nil, frontend.Errorf(prm.Pos, "the file must be a safetensors file", "%s: %v", prm.File, err)
		}
		files[prm.File] = f
	}
	t, ok := f.Tensors[prm.Tensor]
	if !ok {
		return nil, frontend.Errorf(prm.Pos, "tensors in the file: "+strings.Join(f.Names, ", "),
			"tensor %q is not in %s", prm.Tensor, prm.File)
	}
	v, err := t.Float32s()
	if err != nil {
		return nil, frontend.Errorf(prm.Pos, "store it as F32, F16 or BF16", "tensor %s: %v", prm.Tensor, err)
	}
	if err := finite(prm, v); err != nil {
		return nil, err
	}
	return v, nil
}

// randomUnit is a deterministic Gaussian vector of length n scaled to unit norm.
func randomUnit(seed uint64, n int) []float32 {
	r := rand.New(rand.NewPCG(seed, 0x786d6978))
	v := make([]float64, n)
	var norm float64
	for i := range v {
		v[i] = r.NormFloat64()
		norm += v[i] * v[i]
	}
	out := make([]float32, n)
	for i := range v {
		out[i] = float32(v[i] / math.Sqrt(norm))
	}
	return out
}
