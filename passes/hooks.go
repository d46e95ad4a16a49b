package passes

import "xmix/frontend"

// Host kinds: the kernel an MI op at a hook is fused into.
const (
	HostEmbed   = "embed"    // embedding gather + first RMSNorm (row_norm, Load embed)
	HostAddNorm = "add_norm" // residual add + RMSNorm (row_norm, Load add)
	HostSilu    = "silu_mul" // SiLU(gate)*up
	HostMI      = "mi"       // a standalone MI kernel over a GEMM or attention output
	HostRouter  = "router"   // the MoE router kernel, between its logits and top-k
	// HostLogits is the MI kernel over the logits, between the LM head and the sampler; its
	// rows are samples.
	HostLogits  = "logits"
	HostSampler = "sampler" // the sampler kernel, after it picks each sample's token
	// HostLens is a heavy read's own node(s) after the add+norm kernel of the layer's
	// resid_post (see Heavy in TemplateFact): not fused, skipped whole when no row enables it.
	HostLens = "lens"
)

// Roles of a hooked value inside a row_norm host kernel.
const (
	RoleDelta = "delta" // the value added to the residual (attn_out, mlp_out)
	RoleResid = "resid" // the residual after the add
	RoleNorm  = "norm"  // the normalised output (final_norm)
	RoleWhole = "whole" // the kernel's only hooked value (silu_mul, mi)
)

// HookFact is what the compiler knows about one hook name: its width, whether it exists per
// layer, its place in the forward order, and where MI ops on it are fused.
type HookFact struct {
	Name     string
	PerLayer bool
	Order    int // position inside a layer's forward (whole-model hooks: see Key)
	Width    func(m *frontend.Model) int
	Role     string
}

func hidden(m *frontend.Model) int { return m.Hidden }
func qWidth(m *frontend.Model) int { return m.Heads * m.HeadDim }
func kvWidth(m *frontend.Model) int {
	return m.KVHeads * m.HeadDim
}
func inter(m *frontend.Model) int   { return m.Intermediate }
func experts(m *frontend.Model) int { return m.Experts }
func vocab(m *frontend.Model) int   { return m.Vocab }
func one(*frontend.Model) int       { return 1 }

// Hooks is the Llama-family hook surface in forward order (DESIGN.md "Hook surface").
// router_logits fires on MoE models only (bindOp refuses it elsewhere). logits and sampled
// are in sample space: one row per sampled token row, not per token row.
var Hooks = []HookFact{
	{Name: "embed", Order: -1, Width: hidden, Role: RoleResid},
	{Name: "resid_pre", PerLayer: true, Order: 0, Width: hidden, Role: RoleResid},
	{Name: "attn.q", PerLayer: true, Order: 1, Width: qWidth, Role: RoleWhole},
	{Name: "attn.k", PerLayer: true, Order: 2, Width: kvWidth, Role: RoleWhole},
	{Name: "attn.v", PerLayer: true, Order: 3, Width: kvWidth, Role: RoleWhole},
	{Name: "attn.z", PerLayer: true, Order: 4, Width: qWidth, Role: RoleWhole},
	{Name: "attn_out", PerLayer: true, Order: 5, Width: hidden, Role: RoleDelta},
	{Name: "resid_mid", PerLayer: true, Order: 6, Width: hidden, Role: RoleResid},
	{Name: "router_logits", PerLayer: true, Order: 7, Width: experts, Role: RoleWhole},
	{Name: "mlp.act", PerLayer: true, Order: 8, Width: inter, Role: RoleWhole},
	{Name: "mlp_out", PerLayer: true, Order: 9, Width: hidden, Role: RoleDelta},
	{Name: "resid_post", PerLayer: true, Order: 10, Width: hidden, Role: RoleResid},
	{Name: "final_norm", Order: 100, Width: hidden, Role: RoleNorm},
	{Name: "logits", Order: 101, Width: vocab, Role: RoleWhole},
	{Name: "sampled", Order: 102, Width: one, Role: RoleWhole},
}

// hookFact returns the fact for name, or nil when this compiler cannot fire it.
func hookFact(name string) *HookFact {
	for i := range Hooks {
		if Hooks[i].Name == name {
			return &Hooks[i]
		}
	}
	return nil
}

// HookNames lists the hooks this compiler fires, in forward order.
func HookNames() []string {
	ns := make([]string, len(Hooks))
	for i, h := range Hooks {
		ns[i] = h.Name
	}
	return ns
}

// SiteKey orders hook sites in forward order: (layer, order). The embedding comes before
// layer 0; final_norm after the last layer.
type SiteKey struct {
	Layer int
	Order int
}

// Less reports whether a runs before b in the forward.
func (a SiteKey) Less(b SiteKey) bool {
	if a.Layer != b.Layer {
		return a.Layer < b.Layer
	}
	return a.Order < b.Order
}

func siteKey(h *HookFact, layer int, m *frontend.Model) SiteKey {
	switch {
	case h.Name == "embed":
		return SiteKey{Layer: -1, Order: 0}
	case !h.PerLayer:
		return SiteKey{Layer: m.Layers, Order: h.Order}
	default:
		return SiteKey{Layer: layer, Order: h.Order}
	}
}

// HostOf says which kernel hosts hook h at layer: the kind, and the layer whose forward
// launches it. resid_pre of layer L>0 and the residual/delta hooks after the MLP sit in the
// add+norm kernel that ends layer L-1 (it also computes layer L's input norm).
func HostOf(h string, layer, layers int) (kind string, hostLayer int) {
	switch h {
	case "embed":
		return HostEmbed, -1
	case "resid_pre":
		if layer == 0 {
			return HostEmbed, -1
		}
		return HostAddNorm, 2*(layer-1) + 1
	case "attn_out", "resid_mid":
		return HostAddNorm, 2 * layer
	case "mlp_out", "resid_post":
		return HostAddNorm, 2*layer + 1
	case "final_norm":
		return HostAddNorm, 2*(layers-1) + 1
	case "mlp.act":
		return HostSilu, layer
	case "router_logits":
		return HostRouter, layer
	case "logits":
		return HostLogits, -1
	case "sampled":
		return HostSampler, -1
	default: // attn.q, attn.k, attn.v, attn.z
		return HostMI, layer
	}
}
