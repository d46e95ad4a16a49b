package cuda

import (
	"slices"

	"xmix/bundle"
)

// Feeds: a GEMM server that reads bf16(x) (cuBLASLt, or a copy-engine GEMM with XBF16) runs
// after a cast of x into scratch. Where the launch ahead of the GEMM produces x itself and can
// write bf16 of it too (the gated copy-engine kernel's y_bf16; the gated activation's
// act_bf16, the add+norm's out_bf16 and the decode attention's z_bf16, bundle.BF16CopyOf),
// the loader points that copy at a scratch the GEMM's server reads and issues the GEMM with
// no cast: the same bits, since both round to nearest even as the cast does. The scratch is
// the cast's, or for the gated kernel, whose own x may sit in the cast's while it writes,
// the copy server's yb, which the copy-engine kernels and cuBLASLt alike read x from (so the
// 1B's down projection on cuBLASLt after the gated kernel of 64 and 128 rows has no cast:
// RATIONALE.md). Heavy nodes (a logit lens after an add+norm) may stand between the two
// (fedAt).

// fedAt is the node that a bf16 copy of x, written by the launch just before nodes[j],
// reaches: j, or the first node past heavy nodes (bundle.Node.SkipUnless: a logit lens's,
// which some graph variants run and some not) whose arguments name no part of x's buffer.
// Those read and write buffers of their own, and the GEMM among them casts into a scratch of
// its own (cublasLt.heavyXB), so in every variant the node past them finds the copy as it was
// written. Without this a logit lens deployed at a layer cost the q/k/v GEMM after it its feed
// in every graph that runs apps, lens or not (apps.sh's nnsight grid rows at 8 rows: about 1%
// of the step, session 66).
func fedAt(nodes []bundle.Node, j int, x bundle.Slot) int {
	for j < len(nodes) && nodes[j].SkipUnless != 0 &&
		!slices.ContainsFunc(nodes[j].Args, func(a bundle.Slot) bool { return a.Buffer == x.Buffer }) {
		j++
	}
	return j
}

// feedable says whether nodes[j] is a GEMM of m rows whose x is slot x that a server reading
// bf16(x) from xb (scratch of bytes) serves with no cast: the copy-engine kernel copyPair
// serves it and the node after it with (planPair), the bundle's plain copy-engine GEMM for
// it, where either reads bf16(x), or else, where xb is the cast's own scratch or the copy
// server's yb, cuBLASLt.
// copyPair and prepare serve such a node so, or say why they cannot. j is fedAt's: any other
// node between the two (an app's op on x, which some graphs run and some not) leaves
// nodes[j] its cast.
func (be *Backend) feedable(nodes []bundle.Node, j int, x bundle.Slot, m int, xb uintptr, bytes int64) (bool, error) {
	if j >= len(nodes) || xb == 0 || nodes[j].SkipUnless != 0 {
		return false, nil
	}
	n := nodes[j]
	g, ok, err := bundle.GemmOf(n, be.kernels[n.Kernel])
	if err != nil || !ok || g.Guard != 0 || g.M != m || n.Args[g.X] != x || int64(g.M)*int64(g.K)*2 > bytes {
		return false, err
	}
	w, err := be.slotValue(n.Args[g.W])
	if err != nil || w%16 != 0 {
		return false, err
	}
	if p, ok, err := be.planPair(nodes, j); err != nil || ok {
		// A pair whose kernel writes bf16 of its own output into the copy server's scratch
		// cannot read its x there.
		return ok && p.c.Attrs.XBF16 && !(p.c.Attrs.YBF16 && xb == be.copy.yb), err
	}
	if be.copy != nil {
		if _, c, ok, _ := be.copyGemmOf(n); ok {
			return c.Attrs.XBF16, nil // copyNode serves it, from bf16(x) or from x itself
		}
	}
	y, err := be.slotValue(n.Args[g.Y])
	if err != nil {
		return false, err
	}
	_, lt := be.gemm(n)
	return lt && be.lt != nil && be.ltReads(n, xb) && y%16 == 0, nil
}

// feedAhead is nodes[i] as prepare should launch it: where it writes the x of nodes[i+1], a
// GEMM that a server of bf16(x) takes from the cast's scratch (feedable), and can write a bf16
// copy of it too (bundle.BF16CopyOf: a gated activation without MI ops, an add+norm, a decode
// attention), the copy's argument points there, and fed is that scratch, which the GEMM (the
// next node, or the first past heavy nodes: fedAt) then reads with no cast; otherwise
// nodes[i] itself and fed 0. A gated activation's f32 output is dropped unless a node after
// the GEMM reads it (readAfter); the others' stay (the next add+norm, which writes out again,
// names it too).
func (be *Backend) feedAhead(nodes []bundle.Node, i int) (n bundle.Node, fed uintptr, err error) {
	n = nodes[i]
	if be.lt == nil || n.SkipUnless != 0 {
		return n, 0, nil
	}
	c, ok := bundle.BF16CopyOf(n, be.kernels[n.Kernel])
	if !ok {
		return n, 0, nil
	}
	j := fedAt(nodes, i+1, c.Out)
	if ok, err := be.feedable(nodes, j, c.Out, c.Rows, be.lt.xb, be.lt.xbBytes); err != nil || !ok {
		return n, 0, err
	}
	n.Args = slices.Clone(n.Args)
	n.Args[c.CopyArg] = bundle.Slot{Const: uint64(be.lt.xb)}
	if c.Droppable && !be.readAfter(nodes, j, c.Out) {
		n.Args[c.OutArg] = bundle.Slot{} // the copy alone
		be.f32Cut++
	}
	return n, be.lt.xb, nil
}

// readAfter says whether a node after nodes[j] reads what is in s before a node writes s
// whole again (one bundle.BF16CopyOf reads whose output is s, a gated activation, an add+norm
// or a decode attention, with no other argument naming s's buffer; any other node naming that
// buffer counts as a reader): the f32 output that nodes[j] reads as bf16 is dead otherwise. Every node of the list counts, whichever graphs
// run it (an app's op on the output in some).
func (be *Backend) readAfter(nodes []bundle.Node, j int, s bundle.Slot) bool {
	names := func(a bundle.Slot) bool { return a.Buffer == s.Buffer }
	for _, n := range nodes[j+1:] {
		if c, ok := bundle.BF16CopyOf(n, be.kernels[n.Kernel]); ok && c.Out == s &&
			!slices.ContainsFunc(slices.Delete(slices.Clone(n.Args), c.OutArg, c.OutArg+1), names) {
			return false
		}
		if slices.ContainsFunc(n.Args, names) {
			return true
		}
	}
	return false
}

// FedGemms is how many of the GEMM launches prepared read bf16(x) as the launch ahead wrote
// it, with no cast.
func (be *Backend) FedGemms() int { return be.fed }

// F32OutputsCut is how many of the launches feedAhead prepared write their bf16 copy and not
// their f32 output, which no node reads.
func (be *Backend) F32OutputsCut() int { return be.f32Cut }
