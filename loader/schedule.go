package loader

import (
	"fmt"

	"xmix/bundle"
)

// stepCostRows is what a step costs beyond its rows, counted in rows: every step reads all
// the weights once whatever its rows (Llama-3.1-8B on the H200: about 4.5 ms, the time of
// some 80 rows of prefill at 17k tokens/s; on the CPU backend a few rows). It makes a chunk
// mostly of padding lose to a smaller one filled completely, and a nearly full chunk win over
// splitting its rows into several smaller steps.
const stepCostRows = 64

// plan picks the rows of the next step and the template that runs them. While prompts are
// pending it runs a prefill chunk: one decode row for every running sequence first (so
// decoding never stalls behind a long prompt), then prompt rows, no more rows than the
// step's token budget, in the chunk prefillChunk picks. Otherwise a decode template with one
// row per running sequence, in the smallest bucket that holds them.
func (e *Engine) plan(active []*seqState) (bundle.Template, []stepRow) {
	sc := &e.scratch
	rows := emptied(sc.rows)
	defer func() { sc.rows = rows }() // rows grown past the scratch's capacity are kept too
	decoding, prefilling := emptied(sc.decoding), emptied(sc.prefilling)
	pending := 0 // prompt rows not yet run
	for _, s := range active {
		if s.fed < s.promptN {
			prefilling = append(prefilling, s)
			pending += s.promptN - s.fed
		} else {
			decoding = append(decoding, s)
		}
	}
	sc.decoding, sc.prefilling = decoding, prefilling
	if len(prefilling) == 0 {
		t := e.decode[len(e.decode)-1]
		for _, c := range e.decode {
			if c.Tokens >= len(active) {
				t = c
				break
			}
		}
		// More sequences than the largest bucket: rotate who goes first.
		start := e.Stats.DecodeSteps % len(active)
		for i := range min(len(active), t.Tokens) {
			s := active[(start+i)%len(active)]
			rows = append(rows, stepRow{s: s, pos: s.fed, sample: i})
			s.fed++
		}
		e.Stats.DecodeSteps++
		return t, rows
	}
	t := e.prefillChunk(len(decoding), pending)
	limit := min(t.Tokens, e.budget)
	nS := 0
	for _, s := range decoding {
		if nS == t.Samples || len(rows) == limit {
			break
		}
		rows = append(rows, stepRow{s: s, pos: s.fed, sample: nS})
		s.fed++
		nS++
	}
	for _, s := range prefilling {
		for s.fed < s.promptN && len(rows) < limit {
			r := stepRow{s: s, pos: s.fed, sample: -1}
			if s.fed == s.promptN-1 {
				if nS == t.Samples {
					break
				}
				r.sample = nS
				nS++
			}
			rows = append(rows, r)
			s.fed++
		}
	}
	for _, c := range e.prefill { // a prompt held back for want of a sample slot leaves fewer rows
		if c.Tokens >= len(rows) && c.Samples >= nS {
			t = c
			break
		}
	}
	e.Stats.PrefillSteps++
	return t, rows
}

// prefillChunk picks the prefill template of a step with decode decoding sequences and
// pending prompt rows: among the chunks that hold a row for every decoding sequence and at
// least one prompt row, the one that runs the most prompt rows for what it costs, prompt
// rows / (chunk + stepCostRows), where a step's rows are what the chunk, the token budget and
// the work allow; a tie goes to more rows. The decode rows run whichever chunk is picked, so
// only the prompt rows beside them tell chunks apart: a prompt that arrives beside a large
// decoding batch gets as many rows as the budget holds, not the few left in the smallest chunk
// above the batch. A short prompt alone runs in the smallest chunk that holds it, a burst of
// prompts fills the largest chunk within the budget, and a remainder just past a chunk runs
// that chunk full and the rest in the next step instead of a chunk mostly of padding. The
// budget holds a prompt row beside every decode row: it is at least max_seqs.
func (e *Engine) prefillChunk(decode, pending int) bundle.Template {
	best, bestRows, bestScore := e.prefill[len(e.prefill)-1], 0, -1.0
	for _, c := range e.prefill {
		if c.Tokens <= decode {
			continue
		}
		rows := min(c.Tokens, e.budget, decode+pending)
		score := float64(rows-decode) / float64(c.Tokens+stepCostRows)
		if score > bestScore || (score == bestScore && rows > bestRows) {
			best, bestRows, bestScore = c, rows, score
		}
	}
	return best
}

// MaxBatchedTokens is the token budget of a step: the most rows, decode and prompt rows
// together, that one forward runs.
func (e *Engine) MaxBatchedTokens() int { return e.budget }

// SetMaxBatchedTokens changes the token budget of every step from the next one on (the
// bundle's serving.max_batched_tokens is the default). A budget above the largest prefill
// chunk, or below max_seqs, is refused.
func (e *Engine) SetMaxBatchedTokens(n int) error {
	chunks := e.B.PrefillChunks()
	if err := bundle.CheckMaxBatchedTokens(n, chunks, e.cfg.MaxSeqs); err != nil {
		return fmt.Errorf("%w; this bundle's prefill chunks are %v", err, chunks)
	}
	e.budget = n
	return nil
}
