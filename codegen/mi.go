package codegen

// MIOp is one MI primitive placed at a hook, as passes hand it to codegen. It is fused into
// the kernel that produces the hooked value (or run by a standalone MI kernel over it). In a
// kernel, op i takes parameters named mi<i>_vec, mi<i>_scal, mi<i>_out and mi<i>_g<j> (the
// buffer an activation gate j reads); the template builder binds them to the buffers named
// here.
type MIOp struct {
	Template   string // capture | probe_linear | steer_add | project_out
	Bit        int    // the app's bit in the per-row app mask (ctl_mask)
	Width      int    // elements of the hooked vector per row
	Vec        string // buffer of the op's vector: probe w, steer v, project d (unit length)
	Scal       string // buffer of the app's f32 scalar table
	Alpha      int    // index of alpha (steer_add) in Scal, -1 when unused
	Bias       int    // index of bias (probe_linear) in Scal, -1 when unused
	Activation string // probe_linear: "" (identity) or "sigmoid"
	Out        string // reads: buffer of [rows, OutWidth] f32 the result lands in
	OutCol     int    // first column of this op's result in Out
	OutWidth   int
	Gates      []Gate // all must hold for the row, besides its app bit
}

// Gate is one per-row condition evaluated on the device inside the kernel.
type Gate struct {
	Kind string // activation | token_in | steps | positions
	// activation: Buf[row*Width+Col] Cmp Value (Buf written earlier in the same forward)
	Buf   string
	Col   int
	Width int
	Cmp   string // > >= < <= == !=
	Value float32
	// token_in: the row's current token (ctl_tokens) is one of Tokens
	Tokens []int
	// steps: From <= ctl_gen[row] < To (To 0 = open); positions: prompt | generated | all,
	// where ctl_gen[row] is -1 on prompt rows and the generation step otherwise.
	From, To  int
	Positions string
}
