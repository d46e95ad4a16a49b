package testsuite

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"xmix/bundle"
	"xmix/codegen"
	"xmix/compile"
	"xmix/ptx"
)

// TestPDLBundle (xmixc build --pdl, the default): every generated kernel begins by releasing
// the next grid and then waiting for the one ahead (a decode attention kernel waits once it
// has read the control block, an add+norm once it has asked L2 for its residual row), and is
// marked for early launch; an app's
// own PTX and the weight synthesiser (outside the graphs) are left as written; --pdl=false
// marks none. Every emulated run of TestEmulatedBundleMatchesReferenceOps but one is of such
// bundles.
func TestPDLBundle(t *testing.T) {
	custom := customScaleApp("1")
	// Without prefetching GEMVs (TestPrefetchBundle) and the one-row bucket's K/V prefetch
	// (TestAttentionPrefetchKV), early launch is the two instructions.
	plain := CompileWith(t, compile.Options{SerialLaunch: true}, SmallModel, custom)
	b := CompileWith(t, compile.Options{Prefetch: -1, AttnPrefetchOneRow: -1}, SmallModel, custom)
	if !b.Manifest.Build.PDL || plain.Manifest.Build.PDL {
		t.Fatalf("build info pdl: %v by default, %v with --pdl=false", b.Manifest.Build.PDL, plain.Manifest.Build.PDL)
	}
	if len(b.Kernels) != len(plain.Kernels) {
		t.Fatalf("%d kernels by default, %d with --pdl=false", len(b.Kernels), len(plain.Kernels))
	}
	early, kept, waitsItself := 0, 0, 0
	for i, k := range b.Kernels {
		if plain.Kernels[i].EarlyLaunch {
			t.Errorf("kernel %s is marked for early launch in a build with --pdl=false", k.Name)
		}
		m, err := ptx.Parse(k.PTX)
		if err != nil {
			t.Fatalf("kernel %s: %v", k.Name, err)
		}
		body := m.Kernels[0].Body
		starts := len(body) > 2 && body[0].Op == bundle.PriorGridLaunch && body[1].Op == bundle.PriorGridWait
		// A decode attention kernel waits itself, after reading the control block, and an
		// add+norm after asking L2 for its residual row.
		addNorm := k.Op == "row_norm" && strings.Contains(string(k.Attrs), `"load":"add"`)
		waitsLater := (k.Op == "attention" || addNorm) && len(body) > 2 && body[0].Op == bundle.PriorGridLaunch &&
			strings.Count(k.PTX, bundle.PriorGridWait+";") == 1
		switch k.Op {
		case "custom_ptx", "synth":
			if k.EarlyLaunch || starts || k.PTX != plain.Kernels[i].PTX {
				t.Errorf("kernel %s (%s) was rewritten for early launch", k.Name, k.Op)
			}
			kept++
		default:
			if !k.EarlyLaunch || !starts && !waitsLater {
				t.Errorf("kernel %s (%s): early launch %v, body starts %v", k.Name, k.Op, k.EarlyLaunch, body[:2])
			}
			if waitsLater && !starts {
				waitsItself++
			}
			if addNorm {
				// Beyond the two instructions, the residual's prefetches: nothing before the
				// wait reads or writes memory.
				before, _, _ := strings.Cut(k.PTX, bundle.PriorGridWait+";")
				if !strings.Contains(before, "prefetch.global.L2") || strings.Contains(before, "ld.global") || strings.Contains(before, "st.global") {
					t.Errorf("kernel %s: before its wait it should only ask L2 for the residual row:\n%s", k.Name, before)
				}
				early++
				continue
			}
			// The two instructions are the whole difference.
			stripped := strings.Replace(k.PTX, "\t"+bundle.PriorGridLaunch+";\n", "", 1)
			stripped = strings.Replace(stripped, "\t"+bundle.PriorGridWait+";\n", "", 1)
			if stripped != plain.Kernels[i].PTX {
				t.Errorf("kernel %s: the PTX differs from --pdl=false's beyond the two instructions", k.Name)
			}
			early++
		}
	}
	if early < 10 || kept != 2 || waitsItself == 0 {
		t.Fatalf("%d kernels rewritten, %d kept (want the custom kernel and the synthesiser), %d waiting later (want the decode attention)", early, kept, waitsItself)
	}
}

// TestPrefetchBundle (xmixc build --prefetch): with early launch, every CUDA-core GEMV (the
// fused ones too) and every tensor-core GEMM reads weights before it waits for the grid ahead
// (the GEMVs as L2 prefetches; the tensor-core GEMMs their first step into registers,
// ld.global.nc, and L2 prefetches for the rest of the bytes asked for, none at this small
// model's rows), the build info says how much, and every other kernel is the one of a build
// without it; without early launch nothing prefetches, whatever was asked.
func TestPrefetchBundle(t *testing.T) {
	const bytes = 2048
	none := CompileWith(t, compile.Options{Prefetch: -1, Fuse: []string{"all"}}, SmallModel)
	b := CompileWith(t, compile.Options{Prefetch: bytes, Fuse: []string{"all"}}, SmallModel)
	serial := CompileWith(t, compile.Options{Prefetch: bytes, SerialLaunch: true}, SmallModel)
	if b.Manifest.Build.Prefetch != bytes || none.Manifest.Build.Prefetch != 0 || serial.Manifest.Build.Prefetch != 0 {
		t.Fatalf("build info prefetch: %d, %d without, %d with --pdl=false", b.Manifest.Build.Prefetch, none.Manifest.Build.Prefetch, serial.Manifest.Build.Prefetch)
	}
	if len(b.Kernels) != len(none.Kernels) {
		t.Fatalf("%d kernels, %d without prefetch", len(b.Kernels), len(none.Kernels))
	}
	gemvs := map[string]int{}
	for i, k := range b.Kernels {
		prefetches := strings.Contains(k.PTX, "prefetch.global.L2") || readsBeforeWait(t, k.PTX, "ld.global.nc.")
		// The CUDA-core GEMVs and the tensor-core GEMMs both read weights early.
		gemv := strings.HasPrefix(k.Name, "gemm_k") || k.Op == bundle.OpGemmTC
		switch {
		case gemv && !prefetches:
			t.Errorf("GEMV %s (%s) reads no weights before the wait", k.Name, k.Op)
		case !gemv && k.PTX != none.Kernels[i].PTX:
			t.Errorf("kernel %s (%s) differs from a build without prefetch", k.Name, k.Op)
		case gemv:
			m, err := ptx.Parse(k.PTX)
			if err != nil {
				t.Fatalf("kernel %s: %v", k.Name, err)
			}
			body := m.Kernels[0].Body
			if body[0].Op != bundle.PriorGridLaunch || strings.Count(k.PTX, bundle.PriorGridWait+";") != 1 {
				t.Errorf("GEMV %s: starts %s, %d waits", k.Name, body[0].Op, strings.Count(k.PTX, bundle.PriorGridWait+";"))
			}
			gemvs[k.Op]++
		}
	}
	for _, op := range []string{"gemm", "gemm_rope_kv", "gemm_gated", bundle.OpGemmTC} {
		if gemvs[op] == 0 {
			t.Errorf("no %s GEMV in the bundle (%v)", op, gemvs)
		}
	}
	for _, k := range serial.Kernels {
		if strings.Contains(k.PTX, "prefetch.global.L2") || strings.Contains(k.PTX, bundle.PriorGridWait) {
			t.Errorf("kernel %s of a --pdl=false build prefetches or waits", k.Name)
		}
	}
}

// readsBeforeWait says whether the kernel's PTX has an instruction whose op starts with op
// before it waits for the grid ahead.
func readsBeforeWait(t *testing.T, src, op string) bool {
	t.Helper()
	m, err := ptx.Parse(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, in := range m.Kernels[0].Body {
		switch {
		case in.Op == bundle.PriorGridWait:
			return false
		case strings.HasPrefix(in.Op, op):
			return true
		}
	}
	return false
}

// TestPDLNonCoherentInputs: a kernel launched early reads through the non-coherent path
// (ld.global.nc) only buffers that no node of its template writes: weights, compiled vectors,
// the host's control words and tables; before its wait it reads only such buffers too, and
// writes nothing. ptxas moves ld.global.nc above griddepcontrol.wait (it
// may: the path promises the bytes do not change while the kernel runs), and a kernel
// launched early runs while the grid ahead still writes. An add+norm whose app prefetches
// came before its wait read the down projection's delta so, stale, on the H200 (session 17);
// the CPU backend and the emulator, which run the grids one after another, cannot see it.
func TestPDLNonCoherentInputs(t *testing.T) {
	tiny, err := filepath.Glob("../specs/apps/tiny/tiny-app*.yaml")
	if err != nil || len(tiny) == 0 {
		t.Fatalf("tiny apps: %v (%d)", err, len(tiny))
	}
	tinyBundle, err := compile.Build("../specs/models/tiny.yaml", tiny, compile.Options{})
	if err != nil {
		t.Fatal(err)
	}
	patch := "app: patch\nparams: {s: {random: 3}}\nops:\n" +
		"  - write: {at: {layers: [1], hook: resid_post}, kernel: patch, args: {vector: s}, when: {positions: generated}}\n"
	lens := "app: lens\nbuffers: {top: {shape: [10], export: true}}\nops:\n" +
		"  - read: {at: {layers: [1], hook: resid_post}, kernel: logit_lens, args: {k: 5}, into: top}\n"
	bundles := map[string]*bundle.Bundle{
		"tiny with its six apps":                tinyBundle,
		"small with a custom kernel and a lens": Compile(t, SmallModel, customScaleApp("1, 2"), patch, lens),
		"small-mixtral with router ops":         Compile(t, SmallMixtral, routerApp("router_bias", "bias", []float32{0.25, 0, -0.5, 30})),
	}
	for name, b := range bundles {
		flows := map[string]paramFlow{}
		early := map[string]bool{}
		for _, k := range b.Kernels {
			flows[k.Name] = traceParams(t, k.Name, k.PTX)
			early[k.Name] = k.EarlyLaunch
		}
		checked, earlyChecked := 0, 0
		for _, tpl := range b.Templates {
			for _, nodes := range [][]bundle.Node{tpl.Nodes, tpl.Plain} {
				written := map[string]string{}
				for _, n := range nodes {
					for i := range flows[n.Kernel].stored {
						if i < len(n.Args) && n.Args[i].Buffer != "" {
							written[n.Args[i].Buffer] = n.Label
						}
					}
				}
				for _, n := range nodes {
					if !early[n.Kernel] {
						continue
					}
					f := flows[n.Kernel]
					if f.earlyStore {
						t.Errorf("%s, template %s: node %s (%s) writes to global memory before it waits", name, tpl.Name, n.Label, n.Kernel)
					}
					// notWritten fails each of reads (parameters by index) bound to a buffer a
					// node of the template writes, and counts the reads it checked.
					notWritten := func(reads map[int]string, how string) (count int) {
						for i, param := range reads {
							if i >= len(n.Args) {
								continue
							}
							if by, ok := written[n.Args[i].Buffer]; ok {
								t.Errorf("%s, template %s: node %s (%s) reads %s (buffer %s, written by node %s) %s", name, tpl.Name, n.Label, n.Kernel, param, n.Args[i].Buffer, by, how)
							}
							count++
						}
						return count
					}
					earlyChecked += notWritten(f.early, "before it waits")
					checked += notWritten(f.ncRead, "with ld.global.nc")
				}
			}
		}
		if checked == 0 {
			t.Errorf("%s: no ld.global.nc read of a node launched early: the check shows nothing", name)
		}
		if earlyChecked == 0 {
			t.Errorf("%s: no read before a wait (the decode attention's control block): the check shows nothing", name)
		}
	}
}

// paramFlow is what a kernel does with the buffers its parameters point at: the parameters
// (by index, with their names) an address of ld.global.nc derives from, and those a store or
// an atomic's address derives from.
type paramFlow struct {
	ncRead, stored map[int]string
	// early are the parameters read (ld.global) or written before the kernel's first
	// griddepcontrol.wait in program order; earlyStore says whether anything is written there.
	early      map[int]string
	earlyStore bool
}

// traceParams follows each u64 parameter through the registers computed from it (every
// definition of a register counts, so a register reused in a loop carries all its sources).
func traceParams(t *testing.T, name, src string) paramFlow {
	t.Helper()
	m, err := ptx.Parse(src)
	if err != nil {
		t.Fatalf("kernel %s: %v", name, err)
	}
	k := m.Kernels[0]
	index := map[string]int{}
	for i, p := range k.Params {
		index[p.Name] = i
	}
	from := map[ptx.Reg]map[int]bool{}
	sources := func(o ptx.Operand) map[int]bool {
		out := map[int]bool{}
		var add func(o ptx.Operand)
		add = func(o ptx.Operand) {
			switch v := o.(type) {
			case ptx.Reg:
				for i := range from[v] {
					out[i] = true
				}
			case ptx.Addr:
				add(v.Base)
			case ptx.Vec:
				for _, r := range v {
					add(r)
				}
			}
		}
		add(o)
		return out
	}
	for changed := true; changed; {
		changed = false
		for _, in := range k.Body {
			if len(in.Args) == 0 {
				continue
			}
			dst, ok := in.Args[0].(ptx.Reg)
			if !ok || strings.HasPrefix(in.Op, "ld.global") || strings.HasPrefix(in.Op, "ld.shared") {
				continue // a value loaded from memory is no parameter's pointer
			}
			var got map[int]bool
			if strings.HasPrefix(in.Op, "ld.param") {
				a, _ := in.Args[1].(ptx.Addr)
				if s, ok := a.Base.(ptx.Sym); ok {
					if i, ok := index[string(s)]; ok {
						got = map[int]bool{i: true}
					}
				}
			} else {
				got = map[int]bool{}
				for _, o := range in.Args[1:] {
					for i := range sources(o) {
						got[i] = true
					}
				}
			}
			if from[dst] == nil {
				from[dst] = map[int]bool{}
			}
			for i := range got {
				if !from[dst][i] {
					from[dst][i], changed = true, true
				}
			}
		}
	}
	f := paramFlow{ncRead: map[int]string{}, stored: map[int]string{}, early: map[int]string{}}
	waited := false
	for _, in := range k.Body {
		var into map[int]string
		var addr ptx.Operand
		store := false
		switch {
		case in.Op == bundle.PriorGridWait:
			waited = true
			continue
		case strings.HasPrefix(in.Op, "ld.global.nc"):
			into, addr = f.ncRead, in.Args[1]
		case strings.HasPrefix(in.Op, "ld.global"):
			addr = in.Args[1] // counts only before the wait
		case strings.HasPrefix(in.Op, "st.global"):
			into, addr, store = f.stored, in.Args[0], true
		case strings.HasPrefix(in.Op, "atom.global"):
			into, addr, store = f.stored, in.Args[1], true
		case strings.HasPrefix(in.Op, "red.global"):
			into, addr, store = f.stored, in.Args[0], true
		default:
			continue
		}
		for i := range sources(addr) {
			if into != nil {
				into[i] = k.Params[i].Name
			}
			if !waited {
				f.early[i] = k.Params[i].Name
			}
		}
		f.earlyStore = f.earlyStore || store && !waited
	}
	return f
}

// TestPreloadVectorsByBucket: launched early, an add+norm kernel with MI ops loads its ops'
// compiled vectors into registers before it waits for the grid ahead in templates of 8 rows
// and more (codegen's preloadMinRows), and in smaller ones only asks L2 for them; the
// bundle carries both kernels. Those loads are read-only (ld.global.nc) by default and
// coherent (ld.global, kernels *_pvc) with --mi-preload-coherent; the preloading kernels
// alone carry .maxnreg N (kernels *_nrN), N codegen.DefaultMIPreloadRegs unless the build
// names another bound or none, and in templates of more than 128 rows (here a 256-row
// prefill chunk) codegen.DefaultMIPreloadRegsMultiWave unless the build names another or N.
func TestPreloadVectorsByBucket(t *testing.T) {
	model := strings.Replace(SmallModel, "prefill_chunks: [16], max_seq_len: 128", "prefill_chunks: [16, 256], max_seq_len: 256", 1)
	for _, c := range []struct {
		coherent bool
		opt      int // compile.Options.MIPreloadRegs
		regs     int // the bound the build records and the kernels carry
		optMulti int // compile.Options.MIPreloadRegsMultiWave
		multi    int // the bound the kernels of templates of more than 128 rows carry
	}{
		{false, 0, codegen.DefaultMIPreloadRegs, 0, codegen.DefaultMIPreloadRegsMultiWave},
		{true, 0, codegen.DefaultMIPreloadRegs, 0, codegen.DefaultMIPreloadRegsMultiWave},
		{false, -1, 0, 0, codegen.DefaultMIPreloadRegsMultiWave}, {true, -1, 0, -1, 0}, {true, 40, 40, -1, 40}, {false, 0, codegen.DefaultMIPreloadRegs, 24, 24},
	} {
		coherent := c.coherent
		b := CompileWith(t, compile.Options{MIPreloadCoherent: coherent, MIPreloadRegs: c.opt, MIPreloadRegsMultiWave: c.optMulti}, model, steerAt("steer", randVec(7, 128), 2, ""))
		if b.Manifest.Build.MIPreloadCoherent != coherent || b.Manifest.Build.MIPreloadRegs != c.regs || c.optMulti >= 0 && b.Manifest.Build.MIPreloadRegsMultiWave != c.multi {
			t.Fatalf("build info mi_preload_coherent %v mi_preload_regs %d mi_preload_regs_multi_wave %d, want %+v", b.Manifest.Build.MIPreloadCoherent, b.Manifest.Build.MIPreloadRegs, b.Manifest.Build.MIPreloadRegsMultiWave, c)
		}
		sawMulti := false
		load, other := "ld.global.nc.f32", "ld.global.f32"
		if coherent {
			load, other = other, load
		}
		kernels := map[string]bundle.Kernel{}
		for _, k := range b.Kernels {
			kernels[k.Name] = k
		}
		preloads := map[bool]int{}
		for _, tpl := range b.Templates {
			for _, n := range tpl.Nodes {
				k := kernels[n.Kernel]
				if k.Op != "row_norm" || !strings.Contains(k.Name, "_mi_") {
					continue // no MI op, so no compiled vector to ask for
				}
				pre := readsBeforeWait(t, k.PTX, load)
				if want := tpl.Tokens >= 8; pre != want {
					t.Errorf("%s %s: kernel %s loads its vectors (%s) before the wait: %v, want %v", tpl.Name, n.Label, k.Name, load, pre, want)
				}
				if readsBeforeWait(t, k.PTX, other) {
					t.Errorf("%s %s: kernel %s has %s before the wait", tpl.Name, n.Label, k.Name, other)
				}
				suffix := "_pv"
				if coherent {
					suffix += "c"
				}
				regs := c.regs
				if tpl.Tokens > 128 {
					regs, sawMulti = c.multi, sawMulti || pre
				}
				if regs > 0 {
					suffix += fmt.Sprintf("_nr%d", regs)
				}
				if pre && !strings.HasSuffix(k.Name, suffix) {
					t.Errorf("%s %s: kernel %s preloads, want the suffix %s", tpl.Name, n.Label, k.Name, suffix)
				}
				bound := strings.Contains(k.PTX, ".maxnreg")
				if want := pre && regs > 0; bound != want || want && !strings.Contains(k.PTX, fmt.Sprintf("\n.maxnreg %d\n", regs)) {
					t.Errorf("%s %s: kernel %s (preloads %v) bounds its registers: %v, want .maxnreg %d: %v", tpl.Name, n.Label, k.Name, pre, bound, regs, want)
				}
				preloads[pre]++
			}
		}
		if !sawMulti {
			t.Fatalf("%+v: no preloading kernel in a template of more than 128 rows", c)
		}
		if preloads[true] == 0 || preloads[false] == 0 {
			t.Fatalf("coherent %v: add+norm nodes with MI vectors: %d preload, %d do not; want both", coherent, preloads[true], preloads[false])
		}
	}
}
