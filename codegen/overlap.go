package codegen

import (
	"fmt"
	"slices"

	"xmix/bundle"
	"xmix/ptx"
)

// The reference ops of the kernels earlyLaunch leaves alone: an app's own PTX (which need
// not wait for the grid ahead) and the weight synthesiser (launched outside the graphs).
const (
	customOp = "custom_ptx"
	synthOp  = "synth"
)

// earlyLaunch rewrites a generated kernel for Hopper's programmatic dependent launch
// (BuildInfo.PDL): its body starts by letting the grid after it launch (bundle.PriorGridLaunch)
// and then waits, before it reads a parameter or touches memory, for the grid ahead to end
// and its writes to be visible (bundle.PriorGridWait). Launched so, the next kernel's blocks
// are resident and waiting when this one ends, and the gap between two launches (a few µs,
// some 300 times per decode step of an 8B model) no longer adds to the step. The wait keeps
// every kernel's view of memory what it is when the launches run one after another, so the
// result is the same bit for bit; the emulator runs both instructions as no-ops. A kernel that
// waits itself (a GEMV that first prefetches its weights, GemmConfig.Prefetch) gets only the
// launch, and one that lets the next grid launch itself (the copy-engine GEMM, once its W is
// read) keeps both where they are.
func earlyLaunch(k *Kernel) (*Kernel, error) {
	m, err := ptx.Parse(k.PTX)
	if err != nil {
		return nil, fmt.Errorf("early launch: %w", err)
	}
	if len(m.Kernels) != 1 {
		return nil, fmt.Errorf("early launch: %d entries in one kernel's module", len(m.Kernels))
	}
	e := m.Kernels[0]
	if slices.ContainsFunc(e.Body, func(in ptx.Instr) bool { return in.Op == bundle.PriorGridLaunch }) {
		if !slices.ContainsFunc(e.Body, func(in ptx.Instr) bool { return in.Op == bundle.PriorGridWait }) {
			return nil, fmt.Errorf("early launch: the kernel lets the next grid launch but never waits for the one ahead")
		}
		out := *k
		out.EarlyLaunch = true
		return &out, nil
	}
	head := []ptx.Instr{{Op: bundle.PriorGridLaunch}}
	if !slices.ContainsFunc(e.Body, func(in ptx.Instr) bool { return in.Op == bundle.PriorGridWait }) {
		head = append(head, ptx.Instr{Op: bundle.PriorGridWait})
	}
	e.Body = append(head, e.Body...)
	text, err := m.Print()
	if err != nil {
		return nil, fmt.Errorf("early launch: %w", err)
	}
	out := *k
	out.PTX, out.EarlyLaunch = text, true
	return &out, nil
}
