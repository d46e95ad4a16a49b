package codegen

import (
	"math"
	"testing"

	"xmix/ops"
	"xmix/ptx"
)

func TestSynthMatchesReference(t *testing.T) {
	for _, dt := range []ptx.Type{ptx.BF16, ptx.F32} {
		k, err := Synth("synth_"+dt.String(), dt)
		if err != nil {
			t.Fatal(err)
		}
		const n = 1000
		key := uint64(7) ^ ops.NameHash("L0.wo")
		scale := ops.SynthScale(0.02)
		checkKernel(t, k, SynthLaunch(n), []targ{
			{name: "out", out: n, dtype: dt.String(), tol: 1e-9},
			scalarU32("n", n),
			{name: "key", bits: key, isVal: true},
			{name: "scale", bits: math.Float64bits(scale), isVal: true},
		})
	}
}
