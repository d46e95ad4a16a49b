package ops

import (
	"fmt"
	"math"

	"xmix/bundle"
)

func init() { Register(bundle.OpRopeKV, buildRopeKV) }

// KVAttrs describes the fused QKV activation and the paged KV cache that op "rope_kv" writes
// and op "attention" reads: bundle.KVShape's fields (a copy-engine GEMM with rope_kv names
// them too). A qkv row holds Heads query heads, then KVHeads key heads, then KVHeads value
// heads, each HeadDim f32 values. The caches are [num_blocks, BlockSize, KVHeads, HeadDim] in
// KVDtype; block_table is u32 [max_seqs, MaxBlocksPerSeq] page ids.
type KVAttrs bundle.KVShape

func (a KVAttrs) check() (elemSize int, err error) {
	if a.Heads <= 0 || a.KVHeads <= 0 || a.Heads%a.KVHeads != 0 {
		return 0, fmt.Errorf("heads %d, kv_heads %d: want positive, heads a multiple of kv_heads", a.Heads, a.KVHeads)
	}
	if a.HeadDim <= 0 || a.HeadDim%2 != 0 {
		return 0, fmt.Errorf("head_dim %d: want positive and even", a.HeadDim)
	}
	if a.BlockSize <= 0 || a.MaxBlocksPerSeq <= 0 {
		return 0, fmt.Errorf("block_size %d, max_blocks_per_seq %d: want positive", a.BlockSize, a.MaxBlocksPerSeq)
	}
	size, err := dtypeSize(a.KVDtype)
	if err != nil {
		return 0, fmt.Errorf("kv cache: %w", err)
	}
	return size, nil
}

// rowWidth is the number of f32 values in one qkv row.
func (a KVAttrs) rowWidth() int { return (a.Heads + 2*a.KVHeads) * a.HeadDim }

// kvView is the cache-addressing state shared by rope_kv and attention, checked once per call.
type kvView struct {
	KVAttrs
	size              int // bytes per cache element
	pos, seq, table   []uint32
	kcache, vcache    Arg
	blocks, tableRows int
}

func newKVView(op string, a KVAttrs, size, rows int, pos, seq, table, kc, vc Arg) (*kvView, error) {
	if len(pos.Mem) < 4*rows || len(seq.Mem) < 4*rows {
		return nil, fmt.Errorf("%s: pos/seq hold %d/%d bytes, need %d", op, len(pos.Mem), len(seq.Mem), 4*rows)
	}
	page := a.BlockSize * a.KVHeads * a.HeadDim * size
	v := &kvView{KVAttrs: a, size: size, pos: pos.U32(), seq: seq.U32(), table: table.U32(),
		kcache: kc, vcache: vc, blocks: min(len(kc.Mem), len(vc.Mem)) / page,
		tableRows: len(table.Mem) / (4 * a.MaxBlocksPerSeq)}
	for r := 0; r < rows; r++ {
		p, s := int(v.pos[r]), int(v.seq[r])
		if s >= v.tableRows {
			return nil, fmt.Errorf("%s: row %d: sequence slot %d outside the block table (%d slots)", op, r, s, v.tableRows)
		}
		if p/a.BlockSize >= a.MaxBlocksPerSeq {
			return nil, fmt.Errorf("%s: row %d: position %d beyond %d pages of %d", op, r, p, a.MaxBlocksPerSeq, a.BlockSize)
		}
		// Every page up to pos is read by attention; check them all here.
		for b := 0; b <= p/a.BlockSize; b++ {
			if pg := int(v.table[s*a.MaxBlocksPerSeq+b]); pg >= v.blocks {
				return nil, fmt.Errorf("%s: row %d: sequence %d page %d is block %d of %d", op, r, s, b, pg, v.blocks)
			}
		}
	}
	return v, nil
}

// slot is the cache token slot (page*BlockSize + offset) of position p of sequence slot s.
func (v *kvView) slot(s, p int) int {
	return int(v.table[s*v.MaxBlocksPerSeq+p/v.BlockSize])*v.BlockSize + p%v.BlockSize
}

// RopeKVAttrs are the attributes of op "rope_kv". The options add parameters after the eight
// of the plain op, in this order: bias when Bias, then q_norm and k_norm when QKNorm.
type RopeKVAttrs struct {
	KVAttrs
	// Bias adds bias [(Heads+2*KVHeads)*HeadDim] (stored in WDtype) to the whole row first:
	// Qwen2's q, k and v projection biases. The biased v is written back to the row too.
	Bias bool `json:"bias,omitempty"`
	// QKNorm RMS-normalises every q head with q_norm and every k head with k_norm
	// ([HeadDim] each, stored in WDtype; eps Eps) before rotating it: Qwen3's QK-norm.
	QKNorm bool    `json:"qk_norm,omitempty"`
	Eps    float32 `json:"eps,omitempty"`
	WDtype string  `json:"w_dtype,omitempty"`
}

// weightArg views a bias or norm weight argument of n elements.
func (a RopeKVAttrs) weightArg(arg Arg, n int) (weights, error) {
	switch a.WDtype {
	case "bf16":
		if len(arg.Mem) < 2*n {
			return weights{}, fmt.Errorf("holds %d bytes, needs %d", len(arg.Mem), 2*n)
		}
		return weights{bf16: arg.U16()}, nil
	case "f32":
		if len(arg.Mem) < 4*n {
			return weights{}, fmt.Errorf("holds %d bytes, needs %d", len(arg.Mem), 4*n)
		}
		return weights{f32: arg.F32()}, nil
	}
	return weights{}, fmt.Errorf("w_dtype %q: want f32 or bf16", a.WDtype)
}

func buildRopeKV(attrs []byte) (Runner, error) {
	var a RopeKVAttrs
	if err := DecodeAttrs(attrs, &a); err != nil {
		return nil, err
	}
	size, err := a.check()
	if err != nil {
		return nil, fmt.Errorf("rope_kv: %w", err)
	}
	if a.Bias || a.QKNorm {
		if _, err := a.weightArg(Arg{}, 0); err != nil {
			return nil, fmt.Errorf("rope_kv: %w", err)
		}
	}
	if a.QKNorm && !(a.Eps > 0) {
		return nil, fmt.Errorf("rope_kv: qk-norm eps %g: want positive", a.Eps)
	}
	nargs := 8
	if a.Bias {
		nargs++
	}
	if a.QKNorm {
		nargs += 2
	}
	return RunnerFunc(func(args []Arg, l Launch) error {
		rows := l.Grid[0]
		d := a.HeadDim
		need := make([]int, nargs)
		copy(need, []int{4 * rows * a.rowWidth(), 0, 0, 4 * rows, 4 * rows, 0, 0, 0})
		if err := CheckArgs("rope_kv", args, need...); err != nil {
			return err
		}
		var bias, qn, kn weights
		next := 8
		if a.Bias {
			if bias, err = a.weightArg(args[next], a.rowWidth()); err != nil {
				return fmt.Errorf("rope_kv: bias %w", err)
			}
			next++
		}
		if a.QKNorm {
			if qn, err = a.weightArg(args[next], d); err != nil {
				return fmt.Errorf("rope_kv: q_norm %w", err)
			}
			if kn, err = a.weightArg(args[next+1], d); err != nil {
				return fmt.Errorf("rope_kv: k_norm %w", err)
			}
		}
		v, err := newKVView("rope_kv", a.KVAttrs, size, rows, args[3], args[4], args[5], args[6], args[7])
		if err != nil {
			return err
		}
		cos, sin := args[1].F32(), args[2].F32()
		if err := v.checkTables(cos, sin, rows); err != nil {
			return fmt.Errorf("rope_kv: %w", err)
		}
		a.ropeRows(args[0].F32(), cos, sin, v, rows, bias, qn, kn, func(int) bool { return true })
		return nil
	}), nil
}

// checkTables checks that the cos and sin tables hold the positions of the first rows rows.
func (v *kvView) checkTables(cos, sin []float32, rows int) error {
	for r := range rows {
		if need := (int(v.pos[r]) + 1) * v.HeadDim / 2; need > len(cos) || need > len(sin) {
			return fmt.Errorf("row %d: position %d beyond the cos/sin tables", r, v.pos[r])
		}
	}
	return nil
}

// ropeRows does rope_kv's work on the first rows rows of qkv, the cos and sin tables checked
// to cover their positions: each row biased, its q and k heads normalised and rotated in
// place, and, where write(r) holds, its k and v heads written into v's caches at the row's
// position.
func (a RopeKVAttrs) ropeRows(qkv, cos, sin []float32, v *kvView, rows int, bias, qn, kn weights, write func(r int) bool) {
	half, d := a.HeadDim/2, a.HeadDim
	ParallelFor(rows, func(lo, hi int) {
		for r := lo; r < hi; r++ {
			p := int(v.pos[r])
			c, s := cos[p*half:(p+1)*half], sin[p*half:(p+1)*half]
			row := qkv[r*a.rowWidth() : (r+1)*a.rowWidth()]
			if a.Bias {
				for i := range row {
					row[i] += bias.at(i)
				}
			}
			for h := 0; h < a.Heads+a.KVHeads; h++ {
				x := row[h*d : (h+1)*d]
				if a.QKNorm {
					w := qn
					if h >= a.Heads {
						w = kn
					}
					headNorm(x, w, a.Eps)
				}
				for i := 0; i < half; i++ {
					x0, x1 := x[i], x[i+half]
					x[i] = float32(x0*c[i]) - float32(x1*s[i])
					x[i+half] = float32(x1*c[i]) + float32(x0*s[i])
				}
			}
			if !write(r) {
				continue
			}
			base := v.slot(int(v.seq[r]), p) * a.KVHeads * d
			kv := a.KVHeads * d
			for i := 0; i < kv; i++ {
				storeElem(v.kcache, v.size, base+i, row[a.Heads*d+i])
				storeElem(v.vcache, v.size, base+i, row[a.Heads*d+kv+i])
			}
		}
	})
}

// headNorm is RMSNorm over one head in the order the RopeKV kernel sums: the squares of
// elements i and i+HeadDim/2 paired, the pairs added in i order, all in float32.
func headNorm(x []float32, w weights, eps float32) {
	half := len(x) / 2
	var ss float32
	for i := 0; i < half; i++ {
		ss += float32(x[i]*x[i]) + float32(x[i+half]*x[i+half])
	}
	mean := float32(ss*(1/float32(len(x)))) + eps
	r := float32(1 / math.Sqrt(float64(mean)))
	for i, v := range x {
		x[i] = float32(v*r) * w.at(i)
	}
}
