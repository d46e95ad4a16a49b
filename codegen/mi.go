package codegen

// MIOp is one MI primitive placed at a hook, as passes hand it to codegen. It is fused into
// the kernel that produces the hooked value (or run by a standalone MI kernel over it). In a
// kernel, op i takes parameters named mi<i>_vec, mi<i>_scal, mi<i>_out and mi<i>_g<j> (the
// buffer an activation gate j reads); the template builder binds them to the buffers named
// here.
type MIOp struct {
	Template string // a key of ops.MITemplates
	Bit      int    // the app's bit in the per-row app mask (ctl_mask)
	Width    int    // elements of the hooked vector per row
	// Vec is the buffer of the op's vector: probe w, steer v, unit direction d (project_out,
	// steer_set, clamp_projection), scale factors, head_ablate's 0/1 column mask, patch values.
	Vec string
	// Pool, when set, is the buffer of PoolSlots per-request values of the vector: a row whose
	// ctl_vslot is not bundle.NoRow reads that slot's instead of Vec.
	Pool      string
	PoolSlots int
	Scal      string // buffer of the app's f32 scalar table
	// ScalStride > 0: Scal holds ScalRows rows of ScalStride scalars, one per sequence slot,
	// and a row reads its sequence's (ctl_seq); 0: Scal is one row for every row.
	ScalStride, ScalRows int
	// Alpha and Bias index the op's scalars in Scal, -1 when unused: Alpha is alpha
	// (steer_add, scale, head_ablate), value (steer_set) or min (clamp_projection); Bias is
	// bias (probe_linear) or max (clamp_projection).
	Alpha      int
	Bias       int
	Activation string // probe_linear: "" (identity) or "sigmoid"
	Out        string // reads: buffer of [rows, OutWidth] f32 the result lands in
	OutCol     int    // first column of this op's result in Out
	OutWidth   int
	// Fired, when set, is the app's fired buffer (rows of FiredWidth bytes): the op writes
	// byte FiredCol of each row with its app bit, 1 where it fired and 0 where not
	// (ops.MIOp.Fired). The kernel parameter points at the byte (a slot offset), so that the
	// kernels of an op's layers stay identical.
	Fired                string
	FiredCol, FiredWidth int
	Gates                []Gate // all must hold for the row, besides its app bit
}

// Gate is one per-row condition evaluated on the device inside the kernel.
type Gate struct {
	Kind string // activation | token_in | after_token | steps | positions
	// activation: Buf[row*Width+Col] Cmp threshold (Buf written earlier in the same forward);
	// the threshold is Scal[Thresh-1] of the row when Thresh > 0, else Value.
	Buf    string
	Col    int
	Width  int
	Cmp    string // > >= < <= == !=
	Value  float32
	Thresh int
	// after_token: bit Latch of the row's ctl_latch, which the host sets once a token of the
	// latch's set has appeared in the request at or before the row's position.
	Latch int
	// token_in: the row's current token (ctl_tokens) is one of Tokens
	Tokens []int
	// steps: From <= ctl_gen[row] < To (To 0 = open); positions: prompt | generated | all,
	// where ctl_gen[row] is -1 on prompt rows and the generation step otherwise.
	From, To  int
	Positions string
	// layers: bit Bit of the u32 at Scal[Word] of the row's scalars (the op's per-request
	// layer mask).
	Word, Bit int
}
