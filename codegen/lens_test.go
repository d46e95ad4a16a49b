package codegen

import (
	"math"
	"math/rand/v2"
	"testing"

	"xmix/ops"
	"xmix/ptx"
	"xmix/ptx/emu"
)

func fill(n int, v float32) []float32 {
	out := make([]float32, n)
	for i := range out {
		out[i] = v
	}
	return out
}

// TestLensKernels runs both lens kernels, emulated and on the reference, over rows of which
// some enable the app, then with the app's bit clear in any_mask: nothing may be written.
func TestLensKernels(t *testing.T) {
	const rows, outW = 4, 12
	r := rand.New(rand.NewPCG(51, 52))
	for _, wdt := range []ptx.Type{ptx.BF16, ptx.F32} {
		c := LensConfig{Hidden: 96, Vocab: 300, Eps: 1e-5, WDtype: wdt, Bit: 3, K: 5, OutWidth: outW, OutCol: 1}
		lk, err := LensLogits("lens_logits_test", c)
		if err != nil {
			t.Fatal(err)
		}
		tk, err := LensTopK("lens_topk_test", c)
		if err != nil {
			t.Fatal(err)
		}
		mask := []uint32{1 << 3, 1, 1<<3 | 1, 0}
		resid := randF32(r, rows*c.Hidden, 2)
		w, head := randF32(r, c.Hidden, 1), randF32(r, c.Vocab*c.Hidden, 0.2)
		wa, ha := targ{name: "w", f32: w}, targ{name: "head", f32: head}
		if wdt == ptx.BF16 {
			wa, ha = targ{name: "w", bf16: w}, targ{name: "head", bf16: head}
		}
		logits := fill(rows*c.Vocab, -3)
		for _, any := range []uint32{1<<3 | 1, 1} {
			la := []targ{{name: "any_mask", u32: []uint32{any}}, {name: "ctl_mask", u32: mask}, {name: "resid", f32: resid},
				wa, ha, {name: "out", f32: fill(rows*c.Vocab, -3), out: rows * c.Vocab}, scalarU32("rows", rows)}
			checkKernel(t, lk, c.LogitsLaunch(), la)
			got := emulateVals(t, lk, c.LogitsLaunch(), la)[5]
			for i, v := range got {
				if written := any&(1<<3) != 0 && mask[i/c.Vocab]&(1<<3) != 0; written != (v != -3) {
					t.Fatalf("any_mask %b: logit %d of row %d is %v (written: %v)", any, i%c.Vocab, i/c.Vocab, v, written)
				}
			}
			// Top-k over the logits the kernel wrote, with a tie and a NaN planted in row 0.
			if any&(1<<3) != 0 {
				logits = got
				logits[7], logits[8], logits[9] = 40, 40, float32(math.NaN())
			}
			out := fill(rows*outW, -9)
			ta := []targ{{name: "any_mask", u32: []uint32{any}}, {name: "ctl_mask", u32: mask},
				{name: "logits", f32: logits}, {name: "out", f32: out, out: len(out)}}
			checkKernel(t, tk, c.TopKLaunch(rows), ta)
			res := emulate(t, tk, c.TopKLaunch(rows), ta)[3]
			for row := range rows {
				o := res[row*outW : (row+1)*outW]
				if any&(1<<3) == 0 || mask[row]&(1<<3) == 0 {
					for _, v := range o {
						if v != -9 {
							t.Fatalf("any_mask %b: row %d written: %v", any, row, o)
						}
					}
					continue
				}
				ids, vals := ops.TopK(logits[row*c.Vocab:(row+1)*c.Vocab], c.K)
				for j := range c.K {
					if o[1+j] != float32(ids[j]) || o[1+c.K+j] != vals[j] {
						t.Fatalf("row %d pick %d: id %v logit %v, want %d %v", row, j, o[1+j], o[1+c.K+j], ids[j], vals[j])
					}
				}
				if row == 0 && (o[1] != 7 || o[2] != 8) {
					t.Fatalf("row 0: ids %v, want the tie 7, 8 first", o[1:1+c.K])
				}
			}
		}
	}
}

// emulateVals is emulate for kernels with scalar parameters (their entries come back nil).
func emulateVals(t *testing.T, k *Kernel, l ops.Launch, args []targ) [][]float32 {
	t.Helper()
	mod, err := ptx.Parse(k.PTX)
	if err != nil {
		t.Fatalf("%s: parse: %v", k.Name, err)
	}
	mem := emu.NewMemory()
	params := make([]uint64, len(args))
	for i, a := range args {
		if a.isVal {
			params[i] = a.bits
			continue
		}
		init := a.bytesOf()
		params[i] = mem.Alloc(len(init))
		copy(mem.Bytes(params[i]), init)
	}
	if err := emu.Run(mod, k.Name, emu.Launch{Grid: l.Grid, Block: l.Block}, mem, params); err != nil {
		t.Fatalf("%s: emulate: %v", k.Name, err)
	}
	outs := make([][]float32, len(args))
	for i, a := range args {
		if !a.isVal {
			outs[i] = append([]float32(nil), ops.Arg{Mem: mem.Bytes(params[i])}.F32()...)
		}
	}
	return outs
}
