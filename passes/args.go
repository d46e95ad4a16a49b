package passes

import (
	"errors"
	"fmt"
	"math"
	"os"
	"sort"
	"strings"

	"xmix/frontend"
	"xmix/safetensors"
)

// argKind says what an argument of a template accepts.
type argKind int

const (
	argVector argKind = iota // a param of the hook's width
	argScalar                // a number, or a param of one element; lives in the scalar table
	argWord                  // one of Words
)

type argFact struct {
	Kind     argKind
	Required bool
	Default  float32
	Words    []string
	Unit     bool // vector is normalised to unit length at compile time
	Omit     bool // scalar: when absent the op does without it (index -1)
}

// TemplateFact is what the compiler knows about one MI kernel template.
type TemplateFact struct {
	Kind string // read or write
	Args map[string]argFact
	// OutCols is how many columns a read writes per row (0 for writes).
	OutCols func(width int) int
}

func (t TemplateFact) outWidth(width int) int {
	if t.OutCols == nil {
		return 0
	}
	return t.OutCols(width)
}

// Templates is the table of MI templates this compiler fuses. Names the frontend accepts
// but that are missing here (steer_set, clamp_projection, ...) are rejected with a hint.
var Templates = map[string]TemplateFact{
	"capture": {Kind: "read", Args: map[string]argFact{},
		OutCols: func(w int) int { return w }},
	"probe_linear": {Kind: "read", Args: map[string]argFact{
		"w":          {Kind: argVector, Required: true},
		"bias":       {Kind: argScalar, Omit: true},
		"activation": {Kind: argWord, Words: []string{"none", "sigmoid"}},
	}, OutCols: func(int) int { return 1 }},
	"steer_add": {Kind: "write", Args: map[string]argFact{
		"vector": {Kind: argVector, Required: true},
		"alpha":  {Kind: argScalar, Default: 1},
	}},
	"project_out": {Kind: "write", Args: map[string]argFact{
		"direction": {Kind: argVector, Required: true, Unit: true},
	}},
}

// TemplateNames lists the fused templates, sorted.
func TemplateNames() []string {
	ns := make([]string, 0, len(Templates))
	for n := range Templates {
		ns = append(ns, n)
	}
	sort.Strings(ns)
	return ns
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
		for _, op := range p.Ops {
			if op.App != a {
				continue
			}
			spec := a.Spec.Ops[op.OpIndex]
			if err := bindOp(p, a, op, spec, files, scalarIndex, vectorIndex, cols); err != nil {
				errs = append(errs, err)
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
	t := Templates[op.Template]
	if t.Kind != op.Kind {
		return frontend.Errorf(spec.Pos, fmt.Sprintf("use `%s:` for %s", t.Kind, op.Template),
			"kernel %s is a %s, not a %s", op.Template, t.Kind, op.Kind)
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
		case argVector:
			buf, err := bindVector(p, a, op, arg, f.Unit, files, vectorIndex)
			if err != nil {
				return err
			}
			op.Vec = buf
		case argScalar:
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
			switch name {
			case "alpha":
				op.Alpha = idx
			case "bias":
				op.Bias = idx
			}
		case argWord:
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
	if t.Kind == "read" {
		e := a.export(spec.Into)
		if e == nil {
			return frontend.Errorf(spec.IntoPos, "declare it under buffers:", "buffer %q is not declared", spec.Into)
		}
		n := t.outWidth(op.Width)
		op.Out, op.OutCol, op.OutWidth = e.Buffer, cols[e], e.Width
		cols[e] += n
		if cols[e] > e.Width {
			return frontend.Errorf(e.Pos, fmt.Sprintf("give it at least %d elements", cols[e]),
				"buffer %s has %d elements; the reads into it write more", e.Name, e.Width)
		}
	}
	return nil
}

func argNames(t TemplateFact) []string {
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
	data, err := paramData(a, arg, files)
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
	buf := "app." + a.Name + "." + key
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

// scalarValue reads a scalar argument: a number, or a param with exactly one element.
func scalarValue(a *AppPlan, arg frontend.Arg, files map[string]*safetensors.File) (float32, error) {
	if arg.Number != nil {
		return float32(*arg.Number), nil
	}
	data, err := paramData(a, arg, files)
	if err != nil {
		return 0, err
	}
	if len(data) != 1 {
		return 0, frontend.Errorf(arg.Pos, "give a number or a one-element param",
			"param %s has %d elements, argument %s is a scalar", arg.Word, len(data), arg.Name)
	}
	return data[0], nil
}

// paramData loads the tensor a param reference names.
func paramData(a *AppPlan, arg frontend.Arg, files map[string]*safetensors.File) ([]float32, error) {
	var prm *frontend.Param
	for i := range a.Spec.Params {
		if a.Spec.Params[i].Name == arg.Word {
			prm = &a.Spec.Params[i]
		}
	}
	if prm == nil {
		names := make([]string, len(a.Spec.Params))
		for i, q := range a.Spec.Params {
			names[i] = q.Name
		}
		return nil, frontend.Errorf(arg.Pos, "declared params: "+strings.Join(names, ", "),
			"param %q is not declared in app %s", arg.Word, a.Name)
	}
	if prm.File == "" {
		return prm.Values, nil
	}
	f, ok := files[prm.File]
	if !ok {
		data, err := os.ReadFile(prm.File)
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
	return v, nil
}
