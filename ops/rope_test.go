package ops

import (
	"math"
	"math/rand/v2"
	"testing"
)

// fwdTable gives each of seqs sequences maxBlocks distinct pages, shuffled over the pool.
func fwdTable(r *rand.Rand, seqs, maxBlocks int) []uint32 {
	t := make([]uint32, seqs*maxBlocks)
	for i, p := range r.Perm(len(t)) {
		t[i] = uint32(p)
	}
	return t
}

func TestRopeKVMatchesFloat64(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for _, dt := range []string{"f32", "bf16"} {
		a := KVAttrs{Heads: 4, KVHeads: 2, HeadDim: 8, BlockSize: 4, MaxBlocksPerSeq: 3, KVDtype: dt}
		const rows, seqs, maxPos = 5, 2, 12
		half, w := a.HeadDim/2, a.rowWidth()
		qkv := fwdRand(r, rows*w)
		cos, sin := fwdRand(r, maxPos*half), fwdRand(r, maxPos*half)
		pos, seq := []uint32{0, 5, 11, 3, 7}, []uint32{0, 1, 1, 0, 0}
		table := fwdTable(r, seqs, a.MaxBlocksPerSeq)
		size, _ := dtypeSize(dt)
		cacheLen := seqs * a.MaxBlocksPerSeq * a.BlockSize * a.KVHeads * a.HeadDim
		kc, vc := Arg{Mem: make([]byte, size*cacheLen)}, Arg{Mem: make([]byte, size*cacheLen)}
		qa := fwdF32Arg(qkv)
		run, err := Build("rope_kv", EncodeAttrs(a))
		if err != nil {
			t.Fatal(err)
		}
		args := []Arg{qa, fwdF32Arg(cos), fwdF32Arg(sin), fwdU32Arg(pos), fwdU32Arg(seq), fwdU32Arg(table), kc, vc}
		if err := run.Run(args, Launch{Grid: [3]int{rows, 1, 1}}); err != nil {
			t.Fatal(err)
		}
		want := make([]float64, rows*w)
		wantK, wantV := make([]float64, cacheLen), make([]float64, cacheLen)
		gotK, gotV := make([]float32, cacheLen), make([]float32, cacheLen)
		for i := range cacheLen {
			gotK[i], gotV[i] = loadElem(kc, size, i), loadElem(vc, size, i)
		}
		for row := range rows {
			p := int(pos[row])
			for h := range a.Heads + 2*a.KVHeads {
				x := qkv[row*w+h*a.HeadDim:]
				o := want[row*w+h*a.HeadDim:]
				for i := range half {
					if h >= a.Heads+a.KVHeads { // v heads pass through
						o[i], o[i+half] = float64(x[i]), float64(x[i+half])
						continue
					}
					c, s := float64(cos[p*half+i]), float64(sin[p*half+i])
					o[i] = float64(x[i])*c - float64(x[i+half])*s
					o[i+half] = float64(x[i+half])*c + float64(x[i])*s
				}
			}
			page := int(table[int(seq[row])*a.MaxBlocksPerSeq+p/a.BlockSize])
			base := (page*a.BlockSize + p%a.BlockSize) * a.KVHeads * a.HeadDim
			kv := a.KVHeads * a.HeadDim
			copy(wantK[base:base+kv], want[row*w+a.Heads*a.HeadDim:])
			copy(wantV[base:base+kv], want[row*w+a.Heads*a.HeadDim+kv:])
		}
		if e := fwdRelErr(qa.F32(), want); e > 1e-6 {
			t.Errorf("%s: qkv relative error %g", dt, e)
		}
		tol := 1e-6
		if dt == "bf16" {
			tol = 1e-2
		}
		if e := fwdRelErr(gotK, wantK); e > tol {
			t.Errorf("%s: k cache relative error %g", dt, e)
		}
		if e := fwdRelErr(gotV, wantV); e > tol {
			t.Errorf("%s: v cache relative error %g", dt, e)
		}
		// A position past the sequence's pages is an error, not a panic.
		pos[1] = uint32(a.MaxBlocksPerSeq * a.BlockSize)
		args[3] = fwdU32Arg(pos)
		if err := run.Run(args, Launch{Grid: [3]int{rows, 1, 1}}); err == nil {
			t.Errorf("%s: position beyond the block table accepted", dt)
		}
	}
}

func TestKVAttrsCheck(t *testing.T) {
	for _, a := range []KVAttrs{
		{Heads: 6, KVHeads: 4, HeadDim: 8, BlockSize: 4, MaxBlocksPerSeq: 1, KVDtype: "f32"},
		{Heads: 4, KVHeads: 4, HeadDim: 7, BlockSize: 4, MaxBlocksPerSeq: 1, KVDtype: "f32"},
		{Heads: 4, KVHeads: 4, HeadDim: 8, BlockSize: 4, MaxBlocksPerSeq: 1, KVDtype: "i8"},
	} {
		if _, err := Build("rope_kv", EncodeAttrs(a)); err == nil {
			t.Errorf("%+v accepted", a)
		}
	}
}

// TestRopeKVBiasQKNorm checks the Qwen options against a float64 forward: bias on the whole
// row, then RMSNorm of each q and k head, then the rotation.
func TestRopeKVBiasQKNorm(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for _, opt := range []struct{ bias, norm bool }{{true, false}, {false, true}, {true, true}} {
		a := RopeKVAttrs{KVAttrs: KVAttrs{Heads: 4, KVHeads: 2, HeadDim: 8, BlockSize: 4, MaxBlocksPerSeq: 2, KVDtype: "f32"},
			Bias: opt.bias, QKNorm: opt.norm, Eps: 1e-6, WDtype: "bf16"}
		const rows, maxPos = 3, 8
		half, w, d := a.HeadDim/2, a.rowWidth(), a.HeadDim
		qkv := fwdRand(r, rows*w)
		cos, sin := fwdRand(r, maxPos*half), fwdRand(r, maxPos*half)
		pos, seq := []uint32{0, 5, 7}, []uint32{0, 1, 0}
		table := fwdTable(r, 2, a.MaxBlocksPerSeq)
		cacheLen := 2 * a.MaxBlocksPerSeq * a.BlockSize * a.KVHeads * d
		kc, vc := Arg{Mem: make([]byte, 4*cacheLen)}, Arg{Mem: make([]byte, 4*cacheLen)}
		// bf16-exact weights, so the float64 forward sees what the op reads.
		round := func(v []float32) []float32 {
			for i := range v {
				v[i] = BF16ToF32(F32ToBF16(v[i]))
			}
			return v
		}
		bias, qn, kn := round(fwdRand(r, w)), round(fwdRand(r, d)), round(fwdRand(r, d))
		qa := fwdF32Arg(qkv)
		args := []Arg{qa, fwdF32Arg(cos), fwdF32Arg(sin), fwdU32Arg(pos), fwdU32Arg(seq), fwdU32Arg(table), kc, vc}
		if opt.bias {
			args = append(args, fwdBF16Arg(bias))
		}
		if opt.norm {
			args = append(args, fwdBF16Arg(qn), fwdBF16Arg(kn))
		}
		run, err := Build("rope_kv", EncodeAttrs(a))
		if err != nil {
			t.Fatal(err)
		}
		if err := run.Run(args, Launch{Grid: [3]int{rows, 1, 1}}); err != nil {
			t.Fatal(err)
		}
		want := make([]float64, rows*w)
		wantV := make([]float64, cacheLen)
		for row := range rows {
			x := make([]float64, w)
			for i := range x {
				x[i] = float64(qkv[row*w+i])
				if opt.bias {
					x[i] += float64(bias[i])
				}
			}
			p := int(pos[row])
			for h := range a.Heads + a.KVHeads {
				hx := x[h*d : (h+1)*d]
				if opt.norm {
					nw := qn
					if h >= a.Heads {
						nw = kn
					}
					var ss float64
					for _, v := range hx {
						ss += v * v
					}
					rs := 1 / math.Sqrt(ss/float64(d)+1e-6)
					for i := range hx {
						hx[i] *= rs * float64(nw[i])
					}
				}
				for i := range half {
					c, s := float64(cos[p*half+i]), float64(sin[p*half+i])
					x0, x1 := hx[i], hx[i+half]
					hx[i], hx[i+half] = x0*c-x1*s, x1*c+x0*s
				}
			}
			copy(want[row*w:], x)
			page := int(table[int(seq[row])*a.MaxBlocksPerSeq+p/a.BlockSize])
			base := (page*a.BlockSize + p%a.BlockSize) * a.KVHeads * d
			copy(wantV[base:base+a.KVHeads*d], x[(a.Heads+a.KVHeads)*d:])
		}
		// The row holds q and k rotated and v biased; the v cache holds the biased v.
		if e := fwdRelErr(qa.F32(), want); e > 1e-6 {
			t.Errorf("%+v: qkv relative error %g", opt, e)
		}
		gotV := make([]float32, cacheLen)
		for i := range gotV {
			gotV[i] = loadElem(vc, 4, i)
		}
		if e := fwdRelErr(gotV, wantV); e > 1e-6 {
			t.Errorf("%+v: v cache relative error %g", opt, e)
		}
		if err := run.Run(args[:len(args)-1], Launch{Grid: [3]int{rows, 1, 1}}); err == nil {
			t.Errorf("%+v: a missing option argument accepted", opt)
		}
	}
	if _, err := Build("rope_kv", EncodeAttrs(RopeKVAttrs{KVAttrs: KVAttrs{Heads: 1, KVHeads: 1, HeadDim: 2, BlockSize: 1,
		MaxBlocksPerSeq: 1, KVDtype: "f32"}, QKNorm: true, WDtype: "f32"})); err == nil {
		t.Error("qk-norm without eps accepted")
	}
}
