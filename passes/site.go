package passes

import "xmix/ir"

// Host kinds: the kernel an MI op at a hook runs in (place-mi), by the op of its node.
const (
	HostEmbed   = "embed"    // embedding gather + first RMSNorm
	HostAddNorm = "add_norm" // residual add + RMSNorm
	HostSilu    = "silu_mul" // the gated MLP's activation
	HostMI      = "mi"       // a standalone MI kernel over a GEMM or attention output
	HostRouter  = "router"   // the MoE router kernel, between its logits and top-k
	// HostLogits is the MI kernel over the logits, between the LM head and the sampler; its
	// rows are samples.
	HostLogits  = "logits"
	HostSampler = "sampler" // the sampler kernel, after it picks each sample's token
	// HostLens is a heavy read's own node(s) after the add+norm kernel of the layer's
	// resid_post (mi.Template.Heavy): not fused, skipped whole when no row enables it.
	HostLens = "lens"
)

// Roles of a hooked value in its host kernel: the groups of ir.OpFact.
const (
	RoleDelta = "delta" // the value added to the residual (attn_out, mlp_out)
	RoleResid = "resid" // the residual after the add
	RoleNorm  = "norm"  // the normalised output (final_norm)
	RoleWhole = "whole" // the kernel's only hooked value (silu_mul, mi)
)

// hostKinds name the host an op's node is, by the node's op (a standalone MI node over
// sampled rows is the logits kernel).
var hostKinds = map[ir.Op]string{
	ir.OpEmbedNorm: HostEmbed, ir.OpAddNorm: HostAddNorm, ir.OpActivation: HostSilu, ir.OpMI: HostMI,
	ir.OpRouter: HostRouter, ir.OpSample: HostSampler, ir.OpCustom: HostCustom, ir.OpLens: HostLens,
}

// SiteKey orders hook sites in forward order: the hook value's place among the graph's
// values, then the hook's among the value's names (a layer's resid_post before the next
// one's resid_pre).
type SiteKey struct {
	Value int
	Hook  int
}

// Less reports whether a runs before b in the forward.
func (a SiteKey) Less(b SiteKey) bool {
	if a.Value != b.Value {
		return a.Value < b.Value
	}
	return a.Hook < b.Hook
}

// hookSite is where hook h is in graph g: its value and key, nil when g does not fire it.
func hookSite(g *ir.Graph, h ir.Hook) (*ir.Value, SiteKey) {
	for i, v := range g.Values() {
		for j, x := range v.Hooks {
			if x == h {
				return v, SiteKey{Value: i, Hook: j}
			}
		}
	}
	return nil, SiteKey{}
}
