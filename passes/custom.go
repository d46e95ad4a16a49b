package passes

import (
	"fmt"
	"strconv"
	"strings"

	"xmix/frontend"
	"xmix/ptx"
	"xmix/safetensors"
)

// HostCustom is a custom kernel's own node, launched right after the host kernel of its hook
// (not fused: the compiler cannot inline user PTX into its register-resident rows).
const HostCustom = "custom"

// CustomTemplate is the Template of every op that names a custom kernel.
const CustomTemplate = "custom"

// CustomABI is the fixed head of a custom kernel's parameter list. The kernel runs one block
// per token row (grid.x = rows) of CustomThreads threads over the hooked row
// x[row*stride+offset : +width] (f32), in place; ctl_mask is the per-row u32 app mask and the
// kernel must leave a row alone unless bit `bit` of its mask is set. After the head come the
// op's arguments in signature order: u64 for a vector param (f32[width], read-only), f32 for
// a scalar (passed by value, fixed at compile time).
var CustomABI = []ptx.Param{
	{Name: "x", T: ptx.U64}, {Name: "stride", T: ptx.U32}, {Name: "offset", T: ptx.U32},
	{Name: "width", T: ptx.U32}, {Name: "ctl_mask", T: ptx.U64}, {Name: "bit", T: ptx.U32},
}

// CustomThreads is the block size a custom kernel is launched with.
const CustomThreads = 128

// customHooks are the hooks a custom kernel may sit at: its node runs after the add+norm
// kernel that produced resid_post, which codegen then renormalises.
var customHooks = []string{"resid_post"}

// CustomArg is one argument of a custom op beyond the ABI head, as its kernel receives it.
type CustomArg struct {
	Name  string
	Type  ptx.Type // U64: Buf is the vector's buffer; F32: Value
	Buf   string
	Value float32
}

// maxPTXVersion is the newest PTX ISA the CUDA 12 drivers the GPU backend targets accept.
const maxPTXVersion = 8

// maxSM is the newest target the bundle's GPUs (sm_90) can run.
const maxSM = 90

// CheckCustomPTX checks a custom kernel's PTX against its declared signature: it parses and
// validates, declares .version <= 8.x and a .target of sm_90 or lower or sm_90a (Hopper's
// arch-specific instructions, e.g. wgmma), has the entry, calls no
// .func, declares no module variables, and the entry's parameters are exactly the signature.
// Errors say what differs; positions inside the text are ptx line:col.
func CheckCustomPTX(text, entry string, sig []ptx.Param) (*ptx.Module, error) {
	if err := scanModule(text); err != nil {
		return nil, err
	}
	m, err := ptx.Parse(text)
	if err != nil {
		return nil, fmt.Errorf("PTX does not parse: %w", err)
	}
	if major, _, _ := strings.Cut(m.Version, "."); !isAtMost(major, maxPTXVersion) {
		return nil, fmt.Errorf(".version %s is newer than the drivers accept (8.x at most)", m.Version)
	}
	sm, ok := strings.CutPrefix(m.Target, "sm_")
	if (!ok || !isAtMost(sm, maxSM)) && m.Target != ptx.ArchTarget {
		return nil, fmt.Errorf(".target %s: want sm_90 or lower (sm_XX), or %s", m.Target, ptx.ArchTarget)
	}
	if m.AddressSize != 64 {
		return nil, fmt.Errorf(".address_size %d: want 64", m.AddressSize)
	}
	k := m.Kernel(entry)
	if k == nil {
		var names []string
		for _, e := range m.Kernels {
			names = append(names, e.Name)
		}
		return nil, fmt.Errorf("no .entry %s in the PTX (entries: %s)", entry, strings.Join(names, ", "))
	}
	one := &ptx.Module{Version: m.Version, Target: m.Target, AddressSize: m.AddressSize, Kernels: []*ptx.Kernel{k}}
	if err := ptx.Validate(one); err != nil {
		return nil, fmt.Errorf("PTX does not validate: %w", err)
	}
	for i, in := range k.Body {
		if in.Op == "call" || strings.HasPrefix(in.Op, "call.") {
			return nil, fmt.Errorf("entry %s: instruction %d calls a function (no .func calls)", entry, i)
		}
	}
	if len(k.Params) != len(sig) {
		return nil, fmt.Errorf("entry %s has %d parameters (%s), the signature declares %d (%s)",
			entry, len(k.Params), paramList(k.Params), len(sig), paramList(sig))
	}
	for i, q := range k.Params {
		if q.Name != sig[i].Name || q.T != sig[i].T {
			return nil, fmt.Errorf("entry %s parameter %d is %s %s, the signature declares %s %s",
				entry, i, q.Name, q.T, sig[i].Name, sig[i].T)
		}
	}
	return one, nil
}

// scanModule refuses module-level declarations other than entries before parsing, so that
// the error names them instead of a parse failure.
func scanModule(text string) error {
	depth := 0
	for n, line := range strings.Split(text, "\n") {
		if i := strings.Index(line, "//"); i >= 0 {
			line = line[:i]
		}
		f := strings.Fields(line)
		if depth == 0 && len(f) > 0 {
			switch f[0] {
			case ".func", ".extern", ".global", ".const", ".weak":
				if f[0] != ".weak" || (len(f) > 1 && f[1] != ".entry") {
					return fmt.Errorf("ptx line %d: module-level %s: a custom kernel is one .entry with no .func or module variables", n+1, f[0])
				}
			}
		}
		depth += strings.Count(line, "{") - strings.Count(line, "}")
	}
	return nil
}

func isAtMost(s string, limit int) bool {
	v, err := strconv.Atoi(s)
	return err == nil && v >= 0 && v <= limit
}

func paramList(ps []ptx.Param) string {
	s := make([]string, len(ps))
	for i, q := range ps {
		s[i] = q.Name + " " + q.T.String()
	}
	return strings.Join(s, ", ")
}

// customKernel finds the custom kernel an op names ("custom:<name>"), or nil.
func customKernel(a *frontend.App, kernel string) *frontend.CustomKernel {
	name, ok := strings.CutPrefix(kernel, frontend.CustomPrefix)
	if !ok {
		return nil
	}
	for i := range a.Kernels {
		if a.Kernels[i].Name == name {
			return &a.Kernels[i]
		}
	}
	return nil
}

// bindCustom checks a custom op against its kernel (PTX, signature, hook, arguments) and
// binds its arguments: vectors to buffers of the hook's width, scalars to values.
func bindCustom(p *Program, a *AppPlan, op *MIOp, spec frontend.Op, files map[string]*safetensors.File,
	vectorIndex map[string]string) error {
	k := op.Custom
	switch {
	case op.Kind != "write":
		return frontend.Errorf(spec.Pos, "use `write:` for a custom kernel", "custom kernel %s: only writes are supported", k.Name)
	case !contains(customHooks, op.Hook):
		return frontend.Errorf(spec.HookPos, "hooks of custom kernels: "+strings.Join(customHooks, ", "),
			"custom kernel %s cannot sit at hook %s", k.Name, op.Hook)
	case len(spec.When) > 0:
		return frontend.Errorf(spec.When[0].Pos, "test conditions inside the kernel, or enable the app per request",
			"custom kernel %s takes no when: conditions", k.Name)
	}
	sig := make([]ptx.Param, len(k.Signature))
	for i, s := range k.Signature {
		t, _ := ptx.ParseType(s.Type) // the frontend admits u32, u64 and f32 only
		sig[i] = ptx.Param{Name: s.Name, T: t}
	}
	for i, want := range CustomABI {
		if i >= len(sig) || sig[i] != want {
			pos := k.SigPos
			got := "nothing"
			if i < len(sig) {
				pos, got = k.Signature[i].Pos, sig[i].Name+" "+sig[i].T.String()
			}
			return frontend.Errorf(pos, "a custom kernel's signature begins with: "+paramList(CustomABI),
				"kernel %s: signature parameter %d is %s, the ABI wants %s %s", k.Name, i, got, want.Name, want.T)
		}
	}
	given := map[string]frontend.Arg{}
	for _, arg := range spec.Args {
		given[arg.Name] = arg
	}
	used := map[string]bool{}
	for i, s := range sig[len(CustomABI):] {
		sp := k.Signature[len(CustomABI)+i]
		arg, has := given[s.Name]
		if !has {
			return frontend.Errorf(spec.KernelPos, fmt.Sprintf("add args: {%s: ...}", s.Name),
				"kernel %s declares parameter %s, the op gives no such argument", k.Name, s.Name)
		}
		used[s.Name] = true
		ca := CustomArg{Name: s.Name, Type: s.T}
		switch s.T {
		case ptx.U64:
			if prm := param(a, arg.Word); prm != nil && prm.PerRequest {
				return frontend.Errorf(arg.Pos, "use the param in a built-in kernel, or drop per_request:",
					"param %s is per_request: custom kernels take compiled vectors only (their ABI has no per-request slot)", arg.Word)
			}
			buf, err := bindVector(p, a, op, arg, false, files, vectorIndex)
			if err != nil {
				return err
			}
			ca.Buf = buf
		case ptx.F32:
			v, err := scalarValue(a, arg, files)
			if err != nil {
				return err
			}
			ca.Value = v
		default:
			return frontend.Errorf(sp.Pos, "declare u64 (a vector param) or f32 (a scalar)",
				"kernel %s: argument parameter %s is %s", k.Name, s.Name, s.T)
		}
		op.CustomArgs = append(op.CustomArgs, ca)
	}
	for _, arg := range spec.Args {
		if !used[arg.Name] {
			return frontend.Errorf(arg.Pos, "declare it in the kernel's signature or remove it",
				"kernel %s has no parameter %q", k.Name, arg.Name)
		}
	}
	if _, err := CheckCustomPTX(k.PTX, k.Entry, sig); err != nil {
		pos := k.PTXPos
		if strings.HasPrefix(err.Error(), "no .entry") {
			pos = k.EntryPos
		}
		where := "inline PTX"
		if k.File != "" {
			where = k.File
		}
		return frontend.Errorf(pos, "fix the PTX ("+where+") or the declared signature", "kernel %s: %v", k.Name, err)
	}
	return nil
}
