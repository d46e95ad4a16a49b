package ir

import "xmix/mi"

// MI is one MI op at one hook site as the graph carries it: the op as its kernel takes it
// (mi.Op: template, app bit, width per rank, scalar indices, output columns, gates), its
// site, and the buffers it reads and writes. In a kernel, op i takes parameters named
// mi<i>_vec, mi<i>_pool, mi<i>_scal, mi<i>_out, mi<i>_fired and mi<i>_g<j> (the buffer
// activation gate j reads, Gates[j].Buf); lowering binds them to the buffers named here.
type MI struct {
	mi.Op
	// Site: the op's app, its index in the app's ops, and the hook it sits at.
	App     string
	OpIndex int
	Site    Hook
	// Vec is the buffer of the op's vector: probe w, steer v, unit direction d (project_out,
	// steer_set, clamp_projection), scale factors, head_ablate's 0/1 column mask, patch values.
	Vec string
	// Pool, when set, is the buffer of the PoolSlots per-request values of the vector.
	Pool string
	// Scal is the buffer of the app's f32 scalar table (ScalRows rows of ScalStride).
	Scal string
	// Out is the buffer of [rows, OutWidth] f32 a read's result lands in (from OutCol).
	Out string
	// Fired, when set, is the app's fired buffer (rows of FiredWidth bytes): the op writes
	// byte FiredCol of each row with its app bit, 1 where it fired and 0 where not. The
	// kernel parameter points at the byte (a slot offset), so that the kernels of an op's
	// layers stay identical.
	Fired    string
	FiredCol int
	K        int // logit_lens: how many top tokens it reports
	// Custom is the app's own kernel (Template "custom").
	Custom *Custom
}

// Custom is an app's PTX kernel: its text, entry and declared signature, and the op's
// arguments past the fixed head of the signature.
type Custom struct {
	Name      string // the app's name for the kernel
	PTX       string
	Entry     string
	Signature []Param
	Args      []CustomArg
}

// Param is one declared kernel parameter: its name and PTX type name.
type Param struct {
	Name, Type string
}

// CustomArg is one argument of a custom op beyond the ABI head: a vector (Buf, Type u64)
// or an f32 scalar (Value).
type CustomArg struct {
	Name  string
	Type  string
	Buf   string
	Value float32
}
