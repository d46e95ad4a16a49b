package mi

// router_bias: logits += alpha * bias, before the router's softmax and top-k (SteerMoE):
// steer_add at the router's logits.
func init() {
	Register(Template{
		Name: "router_bias", Kind: Write, Vec: true, Writes: true, Alpha: Required, Hooks: []string{"router_logits"},
		Args: map[string]Arg{
			"bias":  {Kind: Vector, Required: true},
			"alpha": {Kind: Scalar, Default: 1, Scales: "bias"},
		},
		Ref:  steerAdd,
		Emit: emitSteerAdd,
	})
}
