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
	"xmix/safetensors"
)

// argKind says what an argument of a template accepts.
type argKind int

const (
	argVector argKind = iota // a param of the hook's width
	argScalar                // a number, or a param of one element; lives in the scalar table
	argWord                  // one of Words
	argHead                  // an attention head index of the model; becomes a column mask
	argCount                 // a whole number fixed at compile time (logit_lens's k): MIOp.K
)

// scalarSlot says which scalar index of an op a scalar argument binds.
type scalarSlot int

const (
	slotAlpha scalarSlot = iota // MIOp.Alpha: the template's first scalar
	slotBias                    // MIOp.Bias: its second
)

type argFact struct {
	Kind     argKind
	Required bool
	Default  float32
	Words    []string
	Unit     bool       // vector is normalised to unit length at compile time
	Omit     bool       // scalar: when absent the op does without it (index -1)
	Slot     scalarSlot // scalar: the index it binds
	// Scales, for a scalar, names the vector argument it multiplies: their product must
	// stay finite in f32, which bounds the scalar (Scalar.Limit).
	Scales string
	// Unless names an argument that replaces this scalar: with it given, the scalar is not
	// bound, and giving both is an error.
	Unless string
}

// TemplateFact is what the compiler knows about one MI kernel template.
type TemplateFact struct {
	Kind string // read or write
	Args map[string]argFact
	// OutCols is how many columns a read writes per row (0 for writes).
	OutCols func(op *MIOp) int
	// Max bounds an argCount argument.
	Max int
	// Heavy ops are not fused: they run as their own nodes, which exit at once when no row
	// of the batch enables the app (HostLens).
	Heavy bool
	// Hooks, when set, are the only hooks the template may sit at.
	Hooks []string
	// Check, when set, validates the bound op against its scalars; it returns a message and
	// a hint, or "" when the op is fine.
	Check func(op *MIOp, scalars []Scalar) (msg, hint string)
}

func (t TemplateFact) outWidth(op *MIOp) int {
	if t.OutCols == nil {
		return 0
	}
	return t.OutCols(op)
}

// elementwise are the templates the logits hook takes: its rows are vocabulary-wide, so its
// kernel spreads a row over many blocks and nothing may reduce over the whole row.
var elementwise = []string{"capture", "steer_add", "scale", "patch"}

// MaxLensK bounds logit_lens's k: its top-k runs k block-wide arg-max rounds.
const MaxLensK = 64

// Templates is the table of MI templates this compiler fuses. Names the frontend accepts
// but that are missing here are rejected with a hint.
var Templates = map[string]TemplateFact{
	"capture": {Kind: "read", Args: map[string]argFact{},
		OutCols: func(op *MIOp) int { return op.Width }},
	"probe_linear": {Kind: "read", Args: map[string]argFact{
		"w":          {Kind: argVector, Required: true},
		"bias":       {Kind: argScalar, Omit: true, Slot: slotBias},
		"activation": {Kind: argWord, Words: []string{"none", "sigmoid"}},
	}, OutCols: func(*MIOp) int { return 1 }},
	"steer_add": {Kind: "write", Args: map[string]argFact{
		"vector": {Kind: argVector, Required: true},
		"alpha":  {Kind: argScalar, Default: 1, Scales: "vector"},
	}},
	"project_out": {Kind: "write", Args: map[string]argFact{
		"direction": {Kind: argVector, Required: true, Unit: true},
	}},
	// steer_set: x += (value - x·d) d.
	"steer_set": {Kind: "write", Args: map[string]argFact{
		"direction": {Kind: argVector, Required: true, Unit: true},
		"value":     {Kind: argScalar},
	}},
	// clamp_projection: x += (clamp(x·d, min, max) - x·d) d; a missing bound is open.
	"clamp_projection": {Kind: "write", Args: map[string]argFact{
		"direction": {Kind: argVector, Required: true, Unit: true},
		"min":       {Kind: argScalar, Omit: true},
		"max":       {Kind: argScalar, Omit: true, Slot: slotBias},
	}, Check: checkClampBounds},
	// scale: x *= alpha, or x[i] *= vector[i].
	"scale": {Kind: "write", Args: map[string]argFact{
		"alpha":  {Kind: argScalar, Unless: "vector"},
		"vector": {Kind: argVector},
	}},
	// head_ablate: x[head*D : (head+1)*D] *= alpha on attn.z rows [heads*D].
	"head_ablate": {Kind: "write", Hooks: []string{"attn.z"}, Args: map[string]argFact{
		"head":  {Kind: argHead, Required: true},
		"alpha": {Kind: argScalar},
	}},
	// patch: x = vector.
	"patch": {Kind: "write", Args: map[string]argFact{
		"vector": {Kind: argVector, Required: true},
	}},
	// router_bias: logits += alpha * bias, before softmax and top-k (SteerMoE).
	"router_bias": {Kind: "write", Hooks: []string{"router_logits"}, Args: map[string]argFact{
		"bias":  {Kind: argVector, Required: true},
		"alpha": {Kind: argScalar, Default: 1, Scales: "bias"},
	}},
	// token_override: the sampled token becomes `token` (a run-time replaceable scalar, so a
	// request may override it); fused into the sampler.
	"token_override": {Kind: "write", Hooks: []string{"sampled"}, Args: map[string]argFact{
		"token": {Kind: argScalar, Required: true},
	}},
	// logit_lens: RMSNorm with the final norm's weight, the LM head, then the k largest
	// logits: into holds [2k] f32, the k token ids (as floats, exact below 2^24) by
	// descending logit (ties: lower id first), then their k logits.
	"logit_lens": {Kind: "read", Hooks: []string{"resid_post"}, Heavy: true, Max: MaxLensK, Args: map[string]argFact{
		"k": {Kind: argCount, Default: 5},
	}, OutCols: func(op *MIOp) int { return 2 * op.K }},
	// router_mask: logits[e] = -inf where mask[e] != 0: the expert is never picked.
	"router_mask": {Kind: "write", Hooks: []string{"router_logits"}, Args: map[string]argFact{
		"mask": {Kind: argVector, Required: true},
	}},
}

func checkClampBounds(op *MIOp, scalars []Scalar) (string, string) {
	switch {
	case op.Alpha < 0 && op.Bias < 0:
		return "clamp_projection needs min, max or both", "add args: {min: ..., max: ...}"
	case op.Alpha >= 0 && op.Bias >= 0 && scalars[op.Alpha].Value > scalars[op.Bias].Value:
		return fmt.Sprintf("clamp_projection: min %v is above max %v", scalars[op.Alpha].Value, scalars[op.Bias].Value),
			"swap min and max"
	}
	return "", ""
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
	t := Templates[op.Template]
	if t.Kind != op.Kind {
		return frontend.Errorf(spec.Pos, fmt.Sprintf("use `%s:` for %s", t.Kind, op.Template),
			"kernel %s is a %s, not a %s", op.Template, t.Kind, op.Kind)
	}
	if t.Hooks != nil && !contains(t.Hooks, op.Hook) {
		return frontend.Errorf(spec.HookPos, "hooks of "+op.Template+": "+strings.Join(t.Hooks, ", "),
			"kernel %s cannot sit at hook %s", op.Template, op.Hook)
	}
	switch m := p.Model; {
	case op.Hook == "logits" && !contains(elementwise, op.Template):
		return frontend.Errorf(spec.KernelPos, "templates at logits: "+strings.Join(elementwise, ", "),
			"kernel %s cannot sit at hook logits (its rows are vocabulary-wide, %d columns)", op.Template, m.Vocab)
	case op.Hook == "sampled" && op.Template != "token_override":
		return frontend.Errorf(spec.KernelPos, "templates at sampled: token_override",
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
		case argVector:
			if !has {
				continue
			}
			buf, err := bindVector(p, a, op, arg, f.Unit, files, vectorIndex)
			if err != nil {
				return err
			}
			op.Vec, op.VecPerRequest = buf, a.vector(buf).PerRequest
		case argHead:
			buf, err := bindHead(p, a, op, arg, vectorIndex)
			if err != nil {
				return err
			}
			op.Vec = buf
		case argScalar:
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
			if f.Slot == slotBias {
				op.Bias = idx
			} else {
				op.Alpha = idx
			}
		case argCount:
			n := float64(f.Default)
			if has {
				if arg.Number == nil || *arg.Number != math.Trunc(*arg.Number) || *arg.Number < 1 || *arg.Number > float64(t.Max) {
					return frontend.Errorf(arg.Pos, fmt.Sprintf("give a whole number from 1 to %d", t.Max),
						"argument %s of %s must be a whole number from 1 to %d", name, op.Template, t.Max)
				}
				n = *arg.Number
			}
			op.K = int(n)
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
	for _, name := range argNames(t) {
		if f := t.Args[name]; f.Kind == argScalar && f.Scales != "" && op.Alpha >= 0 && op.Vec != "" {
			at := spec.KernelPos
			if arg, has := given[name]; has {
				at = arg.Pos
			}
			if err := boundProduct(a, op, given[f.Scales].Word, at); err != nil {
				return err
			}
		}
	}
	if op.Template == "token_override" {
		if v := a.Scalars[op.Alpha].Value; v != float32(math.Trunc(float64(v))) || v < 0 || v >= float32(p.Model.Vocab) {
			return frontend.Errorf(spec.KernelPos, fmt.Sprintf("model %q has tokens 0-%d", p.Model.Name, p.Model.Vocab-1),
				"token_override: token %v is not a token id", v)
		}
	}
	if t.Check != nil {
		if msg, hint := t.Check(op, a.Scalars); msg != "" {
			return frontend.Errorf(spec.KernelPos, hint, "%s", msg)
		}
	}
	if t.Kind == "read" {
		e := a.export(spec.Into)
		if e == nil {
			return frontend.Errorf(spec.IntoPos, "declare it under buffers:", "buffer %q is not declared", spec.Into)
		}
		n := t.outWidth(op)
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
