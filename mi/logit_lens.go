package mi

// MaxLensK bounds logit_lens's k: its top-k runs k block-wide arg-max rounds.
const MaxLensK = 64

// logit_lens: RMSNorm with the final norm's weight, the LM head, then the k largest logits:
// into holds [2k] f32, the k token ids (as floats, exact below 2^24) by descending logit
// (ties: lower id first), then their k logits. A heavy read: its own kernels (codegen/lens.go,
// ops lens_*) run it, skipped whole when no row of the step enables the app; under tensor
// parallelism it would need the whole LM head, which is cut by vocabulary across ranks.
func init() {
	Register(Template{
		Name: "logit_lens", Kind: Read, Hooks: []string{"resid_post"}, Heavy: true, Max: MaxLensK, RunsIn: "lens",
		Args:    map[string]Arg{"k": {Kind: Count, Default: 5}},
		OutCols: func(_, k int) int { return 2 * k },
	})
}
