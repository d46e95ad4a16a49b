package loader_test

import (
	"slices"
	"testing"

	"xmix/loader"
	"xmix/testsuite"
)

// Cancel removes a queued and a running request at a step boundary: their slots and KV pages
// return to the pool, what they generated stays in their results, and the requests beside
// them generate exactly what they generate alone.
func TestCancelFreesSlotsAndPages(t *testing.T) {
	b := testsuite.Compile(t, testsuite.SmallModel)
	be := testsuite.NewCPU(t, b)
	defer be.Close()
	e, err := loader.NewEngine(b, be)
	if err != nil {
		t.Fatal(err)
	}
	idle := e.Load()
	if idle.Running != 0 || idle.Queued != 0 || idle.FreePages != idle.Pages || idle.Slots != b.Manifest.Model.MaxSeqs {
		t.Fatalf("idle engine: %+v", idle)
	}
	req := func(p string, n int) loader.Request {
		return loader.Request{Prompt: p2ids(p), MaxTokens: n, TopP: 1}
	}
	alone, err := e.Generate([]loader.Request{req("kept", 20)})
	if err != nil {
		t.Fatal(err)
	}
	// More requests than slots (4): the last two wait in the queue.
	var hs []*loader.Handle
	for i, p := range []string{"kept", "cancel running", "a", "b", "cancel queued"} {
		n := 20
		if i > 0 {
			n = 60
		}
		h, err := e.Submit(req(p, n))
		if err != nil {
			t.Fatal(err)
		}
		hs = append(hs, h)
	}
	for range 3 {
		if _, err := e.Step(); err != nil {
			t.Fatal(err)
		}
	}
	if l := e.Load(); l.Running != 4 || l.Queued != 1 {
		t.Fatalf("after 3 steps: %+v", l)
	}
	running, queued := hs[1], hs[4]
	before := e.Load().FreePages
	if !e.Cancel(running) || !running.Done || running.Result.Reason != loader.ReasonCancelled {
		t.Fatalf("cancel running: done %v reason %q", running.Done, running.Result.Reason)
	}
	got := len(running.Result.Tokens)
	if l := e.Load(); l.Running != 3 || l.FreePages <= before {
		t.Fatalf("after cancelling a running request: %+v (free pages before %d)", l, before)
	}
	if !e.Cancel(queued) || !queued.Done || queued.Result.Reason != loader.ReasonCancelled || len(queued.Result.Tokens) != 0 {
		t.Fatalf("cancel queued: %+v", queued.Result)
	}
	if e.Cancel(queued) || e.Cancel(running) {
		t.Fatal("a second Cancel reported a live request")
	}
	for e.Busy() {
		if _, err := e.Step(); err != nil {
			t.Fatal(err)
		}
	}
	if len(running.Result.Tokens) != got {
		t.Fatalf("the cancelled request went on generating: %d tokens, had %d", len(running.Result.Tokens), got)
	}
	if !slices.Equal(hs[0].Result.Tokens, alone[0].Tokens) {
		t.Fatalf("beside a cancelled request: %v, alone %v", hs[0].Result.Tokens, alone[0].Tokens)
	}
	if l := e.Load(); l != idle {
		t.Fatalf("after the run: %+v, idle was %+v", l, idle)
	}
	if e.Cancel(hs[0]) {
		t.Fatal("cancelling a finished request reported a live one")
	}
}

func p2ids(s string) []int {
	ids := make([]int, len(s))
	for i := range s {
		ids[i] = int(s[i])
	}
	return ids
}
