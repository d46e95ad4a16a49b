package loader_test

import (
	"encoding/binary"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"xmix/bundle"
	"xmix/loader"
	"xmix/testsuite"
)

// stepLog is a backend that runs nothing and records each step: its template and, per row,
// the sequence slot it belongs to, its position and whether it is sampled (the padding
// sequence's rows left out).
type stepLog struct {
	*nullBackend
	b     *bundle.Bundle
	ctl   map[string][]uint32
	steps []loggedStep
}

type loggedStep struct {
	template string
	slots    []int // slot of every real row, in row order
	pos      []int
	sampled  []bool
}

func (l *stepLog) Write(name string, off int64, data []byte) error {
	if name == bundle.CtlSeq || name == bundle.CtlPos || name == bundle.CtlOutRow {
		var v []uint32
		for i := 0; i+4 <= len(data); i += 4 {
			v = append(v, binary.LittleEndian.Uint32(data[i:]))
		}
		l.ctl[name] = v
	}
	return l.nullBackend.Write(name, off, data)
}

func (l *stepLog) Step(t int) error {
	s := loggedStep{template: l.b.Templates[t].Name}
	for i, q := range l.ctl[bundle.CtlSeq] {
		if int(q) != l.b.Manifest.Model.MaxSeqs {
			s.slots = append(s.slots, int(q))
			s.pos = append(s.pos, int(l.ctl[bundle.CtlPos][i]))
			s.sampled = append(s.sampled, l.ctl[bundle.CtlOutRow][i] != 0xFFFFFFFF)
		}
	}
	l.steps = append(l.steps, s)
	return nil
}

// chunked is the small test model with other prefill chunks and budget.
func chunked(t *testing.T, serving string) *bundle.Bundle {
	t.Helper()
	const old = "prefill_chunks: [16]"
	if !strings.Contains(testsuite.SmallModel, old) {
		t.Fatalf("SmallModel lacks %q", old)
	}
	return testsuite.Compile(t, strings.Replace(testsuite.SmallModel, old, serving, 1))
}

func logSteps(t *testing.T, b *bundle.Bundle, budget int, reqs []loader.Request) []loggedStep {
	t.Helper()
	nb, err := newNullBackend(b)
	if err != nil {
		t.Fatal(err)
	}
	be := &stepLog{nullBackend: nb, b: b, ctl: map[string][]uint32{}}
	e, err := loader.NewEngine(b, be)
	if err != nil {
		t.Fatal(err)
	}
	if budget > 0 {
		if err := e.SetMaxBatchedTokens(budget); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := e.Generate(reqs); err != nil {
		t.Fatal(err)
	}
	return be.steps
}

func prompt(n, seed int) []int {
	p := make([]int, n)
	for i := range p {
		p[i] = 1 + (seed*31+i*7)%250
	}
	return p
}

// A short prompt runs the smallest chunk that holds it, not the largest one; a prompt just
// past a chunk runs that chunk full and its last row in the next step rather than a chunk
// that is mostly padding.
func TestShortPromptsRunShortChunks(t *testing.T) {
	b := chunked(t, "prefill_chunks: [8, 16, 64]")
	for _, c := range []struct {
		prompt int
		want   []string // templates of the steps that run prompt rows, then the first decode step
	}{
		{6, []string{"prefill_t8 7", "decode_b1 1"}}, // BOS + 6 tokens
		{16, []string{"prefill_t16 16", "prefill_t8 1", "decode_b1 1"}},
		{60, []string{"prefill_t64 61", "decode_b1 1"}},
	} {
		steps := logSteps(t, b, 0, []loader.Request{{Prompt: prompt(c.prompt, 1), MaxTokens: 2}})
		var got []string
		for _, s := range steps[:len(c.want)] {
			got = append(got, fmt.Sprintf("%s %d", s.template, len(s.slots)))
		}
		if !reflect.DeepEqual(got, c.want) {
			t.Errorf("%d-token prompt: steps %v, want %v", c.prompt, got, c.want)
		}
	}
}

// Under a token budget no step runs more rows than the budget, every step that runs prompt
// rows first gives each decoding sequence its row (decoding never waits behind a prompt),
// and every request still gets all its tokens.
func TestBudgetBoundsStepsAndDecodingNeverStalls(t *testing.T) {
	b := chunked(t, "prefill_chunks: [4, 8, 16, 64]")
	var reqs []loader.Request
	for i, n := range []int{3, 50, 20, 41, 9, 33} {
		reqs = append(reqs, loader.Request{Prompt: prompt(n, i), MaxTokens: 6})
	}
	for _, budget := range []int{4, 8, 16, 64} {
		steps := logSteps(t, b, budget, reqs)
		// The null backend samples token 0, never EOS: a request ends after MaxTokens
		// sampled rows. sampled[slot] counts them since the slot's request began (position 0).
		sampled := map[int]int{}
		prefills, tokens := 0, 0
		for i, s := range steps {
			if len(s.slots) > budget {
				t.Fatalf("budget %d: step %d (%s) runs %d rows", budget, i, s.template, len(s.slots))
			}
			if strings.HasPrefix(s.template, "prefill") {
				prefills++
				rows := map[int]int{}
				for _, q := range s.slots {
					rows[q]++
				}
				for q, n := range sampled {
					if n > 0 && n < 6 && rows[q] != 1 { // q is decoding
						t.Fatalf("budget %d: step %d (%s) gives decoding slot %d %d rows, want 1", budget, i, s.template, q, rows[q])
					}
				}
			}
			for k, q := range s.slots {
				if s.pos[k] == 0 {
					sampled[q] = 0
				}
				if s.sampled[k] {
					sampled[q]++
					tokens++
				}
			}
		}
		if prefills < 2 || tokens != 6*len(reqs) {
			t.Fatalf("budget %d: %d prefill steps, %d tokens sampled, want several and %d", budget, prefills, tokens, 6*len(reqs))
		}
	}
}

// The token budget of a bundle comes from its spec; a budget at run time above the largest
// chunk or below max_seqs is refused with the fix, and so is a bundle that records one.
func TestMaxBatchedTokensChecked(t *testing.T) {
	b := chunked(t, "prefill_chunks: [4, 8, 16, 64], max_batched_tokens: 16")
	nb, err := newNullBackend(b)
	if err != nil {
		t.Fatal(err)
	}
	e, err := loader.NewEngine(b, nb)
	if err != nil {
		t.Fatal(err)
	}
	if got := e.MaxBatchedTokens(); got != 16 {
		t.Fatalf("budget from the spec: %d, want 16", got)
	}
	for _, c := range []struct {
		n    int
		want string
	}{
		{65, "max_batched_tokens 65 is more than the largest prefill chunk 64"},
		{3, "max_batched_tokens 3 is below max_seqs 4: a step must hold one decode row of every running sequence (raise it to at least 4); this bundle's prefill chunks are [4 8 16 64]"},
	} {
		if err := e.SetMaxBatchedTokens(c.n); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("budget %d: %v, want %q", c.n, err, c.want)
		}
	}
	if e.MaxBatchedTokens() != 16 {
		t.Fatalf("a refused budget changed it to %d", e.MaxBatchedTokens())
	}
	b.Manifest.Model.MaxBatchedTokens = 100
	if _, err := loader.NewEngine(b, nb); err == nil || !strings.Contains(err.Error(), "bundle serving: max_batched_tokens 100") {
		t.Fatalf("bundle with budget 100: %v", err)
	}
	if err := bundle.Verify(b); err == nil || !strings.Contains(err.Error(), "manifest: max_batched_tokens 100") {
		t.Fatalf("Verify of a bundle with budget 100: %v", err)
	}
}

// Rows are computed independently of the step they run in, so on the CPU backend the
// schedule changes nothing where the math is the same: with every template at 8 rows or
// more (below 8 rows the GEMMs keep f32 activations, from 8 they run the tensor-core
// kernel's math), the same prompts give the same tokens and the same exported reads, bit
// for bit, with one 64-row chunk (every prefill step the whole chunk, as before chunk
// buckets) and with small chunks under several budgets.
func TestScheduleKeepsTheMath(t *testing.T) {
	probe := `app: p
params: {w: {values: [` + strings.TrimSuffix(strings.Repeat("0.25, -0.5, ", 64), ", ") + `]}}
buffers: {score: {shape: [1], export: true}}
ops:
  - read: {at: {layers: [1], hook: resid_post}, kernel: probe_linear, args: {w: w, bias: 0.1}, into: score}
`
	var reqs []loader.Request
	for i, n := range []int{5, 40, 17, 2, 23, 70, 9, 31, 12, 3} {
		reqs = append(reqs, loader.Request{Prompt: prompt(n, i+10), MaxTokens: 5, Apps: []string{"p"}})
	}
	run := func(chunks string, budget int) ([]loader.Result, loader.Stats) {
		const old = "serving: {decode_buckets: [1, 2, 4], prefill_chunks: [16], max_seq_len: 128, max_seqs: 4,"
		if !strings.Contains(testsuite.SmallModel, old) {
			t.Fatalf("SmallModel lacks %q", old)
		}
		serving := "serving: {decode_buckets: [8], prefill_chunks: " + chunks + ", max_seq_len: 128, max_seqs: 8,"
		b := testsuite.Compile(t, strings.Replace(testsuite.SmallModel, old, serving, 1), probe)
		be := testsuite.NewCPU(t, b)
		defer be.Close()
		e, err := loader.NewEngine(b, be)
		if err != nil {
			t.Fatal(err)
		}
		if budget > 0 {
			if err := e.SetMaxBatchedTokens(budget); err != nil {
				t.Fatal(err)
			}
		}
		res, err := e.Generate(reqs)
		if err != nil {
			t.Fatal(err)
		}
		return res, e.Stats
	}
	ref, refStats := run("[64]", 0)
	if len(ref[1].Rows) != 41+5-1 || ref[1].Rows[3].Exports.Get("p.score") == nil {
		t.Fatalf("reference run: %d rows, exports %v", len(ref[1].Rows), ref[1].Rows[3].Exports)
	}
	for _, c := range []struct {
		chunks string
		budget int
	}{{"[8, 16, 32, 64]", 0}, {"[8, 16, 32, 64]", 8}, {"[8, 32, 128]", 16}, {"[8, 32, 128]", 128}} {
		got, st := run(c.chunks, c.budget)
		if st.PrefillSteps == refStats.PrefillSteps && st.PaddedRows == refStats.PaddedRows {
			t.Errorf("chunks %s, budget %d: %d prefill steps and %d padding rows, as with one 64-row chunk: the schedule did not change", c.chunks, c.budget, st.PrefillSteps, st.PaddedRows)
		}
		for i := range ref {
			if !reflect.DeepEqual(got[i].Tokens, ref[i].Tokens) || got[i].Reason != ref[i].Reason || len(got[i].Rows) != len(ref[i].Rows) {
				t.Errorf("chunks %s, budget %d: request %d: tokens %v (%s, %d rows), with one 64-row chunk %v (%s, %d rows)", c.chunks, c.budget, i,
					got[i].Tokens, got[i].Reason, len(got[i].Rows), ref[i].Tokens, ref[i].Reason, len(ref[i].Rows))
				continue
			}
			for k := range ref[i].Rows {
				if g, w := got[i].Rows[k], ref[i].Rows[k]; !reflect.DeepEqual(g, w) {
					t.Errorf("chunks %s, budget %d: request %d row %d: %+v, with one 64-row chunk %+v", c.chunks, c.budget, i, k, g, w)
					break
				}
			}
		}
	}
}

// A prompt that arrives while other sequences decode runs all its rows in the next step
// when the budget holds them, even when a chunk just above the decoding batch exists: that
// chunk would give it the one or few rows left beside the decode rows, step after step.
func TestPromptNeverWaitsBehindDecoding(t *testing.T) {
	const old = "serving: {decode_buckets: [1, 2, 4], prefill_chunks: [16], max_seq_len: 128, max_seqs: 4,"
	if !strings.Contains(testsuite.SmallModel, old) {
		t.Fatalf("SmallModel lacks %q", old)
	}
	for _, c := range []struct {
		serving        string
		decoding, late int // sequences decoding, tokens of the late prompt
	}{
		{"serving: {decode_buckets: [1, 2, 4, 8], prefill_chunks: [8, 64], max_seq_len: 128, max_seqs: 9,", 8, 2},
		{"serving: {decode_buckets: [1, 2, 4, 8, 16], prefill_chunks: [16, 64], max_seq_len: 128, max_seqs: 16,", 15, 9},
		{"serving: {decode_buckets: [1, 2, 4, 8, 16], prefill_chunks: [16, 64], max_seq_len: 128, max_seqs: 16,", 15, 40},
	} {
		b := testsuite.Compile(t, strings.Replace(testsuite.SmallModel, old, c.serving, 1))
		nb, err := newNullBackend(b)
		if err != nil {
			t.Fatal(err)
		}
		e, err := loader.NewEngine(b, nb)
		if err != nil {
			t.Fatal(err)
		}
		var running []*loader.Handle
		for i := range c.decoding {
			h, err := e.Submit(loader.Request{Prompt: prompt(3, i), MaxTokens: 60})
			if err != nil {
				t.Fatal(err)
			}
			running = append(running, h)
		}
		for len(running[c.decoding-1].Result.Tokens) == 0 { // until every prompt is in
			if _, err := e.Step(); err != nil {
				t.Fatal(err)
			}
		}
		late, err := e.Submit(loader.Request{Prompt: prompt(c.late, 99), MaxTokens: 4})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := e.Step(); err != nil {
			t.Fatal(err)
		}
		if len(late.Result.Tokens) != 1 {
			t.Errorf("%s a %d-token prompt beside %d decoding sequences: %d tokens after one step, want its first",
				c.serving, c.late, c.decoding, len(late.Result.Tokens))
		}
	}
}
