package cuda

import (
	"testing"

	"xmix/bundle"
	"xmix/loader"
)

// TestOutCopiesFollowTheStepsApps: a step copies back the sampled tokens always, and an
// export (or fired) buffer only when some row enables its app, and then only the template's
// rows.
func TestOutCopiesFollowTheStepsApps(t *testing.T) {
	b := &bundle.Bundle{Manifest: bundle.Manifest{
		Buffers: []bundle.Buffer{
			{Name: "probe.score", Kind: bundle.KindOutput, Dtype: "f32", Shape: []int{512, 1}},
			{Name: "act.resid", Kind: bundle.KindActivation, Dtype: "f32", Shape: []int{512, 64}},
			{Name: "cap.L3", Kind: bundle.KindOutput, Dtype: "f32", Shape: []int{512, 64}},
			{Name: bundle.OutSampled, Kind: bundle.KindOutput, Dtype: "u32", Shape: []int{8}},
			{Name: "probe.fired", Kind: bundle.KindOutput, Dtype: "u32", Shape: []int{512, 1}}, // 3 sites: a word a row
		},
		Apps: []bundle.App{
			{Name: "probe", Bit: 0, Exports: []bundle.Export{{Name: "score", Buffer: "probe.score", Width: 1}},
				FiredBuffer: "probe.fired", Fired: []bundle.FiredSite{{Column: 0}, {Column: 2}, {Column: -1}, {Column: 1}}},
			{Name: "capture", Bit: 3, Exports: []bundle.Export{{Name: "L3", Buffer: "cap.L3", Width: 64}}},
		}},
		Templates: []bundle.Template{{Name: "decode_b8", Tokens: 8}, {Name: "prefill_512", Tokens: 512}},
	}
	out := arena{offset: map[string]int64{}, sizes: map[string]int64{}}
	for _, buf := range b.Manifest.Buffers {
		n, err := loader.BufferBytes(buf)
		if err != nil {
			t.Fatal(err)
		}
		if buf.Kind == bundle.KindOutput {
			place(&out, buf.Name, n)
		}
	}
	plan := planOutCopies(b, out)
	copied := func(tmpl int, any uint32) map[int64]int64 {
		got := map[int64]int64{}
		for _, c := range plan[tmpl] {
			if c.wanted(any, func(string, int) bool { return false }) {
				got[c.off] = c.bytes
			}
		}
		return got
	}
	sampled, score, capture, fired := out.offset[bundle.OutSampled], out.offset["probe.score"], out.offset["cap.L3"], out.offset["probe.fired"]
	for _, c := range []struct {
		tmpl int
		any  uint32
		want map[int64]int64
	}{
		{0, 0, map[int64]int64{sampled: 32}},
		{0, 1 << 0, map[int64]int64{sampled: 32, score: 8 * 4, fired: 8 * 4}},
		{0, 1 << 3, map[int64]int64{sampled: 32, capture: 8 * 64 * 4}},
		{0, 1<<0 | 1<<3 | 1<<5, map[int64]int64{sampled: 32, score: 8 * 4, capture: 8 * 64 * 4, fired: 8 * 4}},
		{1, 1 << 3, map[int64]int64{sampled: 32, capture: 512 * 64 * 4}},
	} {
		got := copied(c.tmpl, c.any)
		if len(got) != len(c.want) {
			t.Fatalf("template %d, apps %b: copies %v, want %v", c.tmpl, c.any, got, c.want)
		}
		for off, n := range c.want {
			if got[off] != n {
				t.Fatalf("template %d, apps %b: copies %v, want %v", c.tmpl, c.any, got, c.want)
			}
		}
	}
}

// TestLogprobsCopiedWhenAsked: out.logprobs comes back only when a sample of the step asks
// (ctl.logprobs), and then only the template's samples' rows.
func TestLogprobsCopiedWhenAsked(t *testing.T) {
	b := &bundle.Bundle{Manifest: bundle.Manifest{Buffers: []bundle.Buffer{
		{Name: bundle.OutLogprobs, Kind: bundle.KindOutput, Dtype: "f32", Shape: []int{128, 41}},
	}}, Templates: []bundle.Template{{Name: "decode_b8", Tokens: 8, Samples: 8}}}
	out := arena{offset: map[string]int64{}, sizes: map[string]int64{}}
	place(&out, bundle.OutLogprobs, 128*41*4)
	plan := planOutCopies(b, out)
	if len(plan[0]) != 1 || plan[0][0].bytes != 8*41*4 {
		t.Fatalf("plan %+v, want the 8 samples' rows", plan[0])
	}
	for _, asked := range []bool{false, true} {
		var gotBuf string
		var gotWords int
		wanted := plan[0][0].wanted(0xFFFFFFFF, func(buf string, words int) bool { gotBuf, gotWords = buf, words; return asked })
		if wanted != asked || gotBuf != bundle.CtlLogprobs || gotWords != 8 {
			t.Fatalf("asked %v: wanted %v, asked %s for %d words", asked, wanted, gotBuf, gotWords)
		}
	}
}
