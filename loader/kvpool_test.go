package loader_test

import (
	"slices"
	"strings"
	"testing"

	"xmix/loader"
	"xmix/testsuite"
)

// A page pool smaller than max_seqs x max_seq_len (serving.kv_cache_tokens): requests reserve
// their pages on admission, so those the pool cannot hold beside the running ones wait in the
// queue with slots free, and each generates what it generates alone.
func TestSmallKVPoolQueuesRequests(t *testing.T) {
	const spec = "max_seq_len: 128, max_seqs: 4, kv_block_size: 16"
	if !strings.Contains(testsuite.SmallModel, spec) {
		t.Fatalf("SmallModel's serving line changed: %q not found", spec)
	}
	small := strings.Replace(testsuite.SmallModel, spec, spec+", kv_cache_tokens: 128", 1)
	b := testsuite.Compile(t, small)
	be := testsuite.NewCPU(t, b)
	defer be.Close()
	e, err := loader.NewEngine(b, be)
	if err != nil {
		t.Fatal(err)
	}
	if l := e.Load(); l.Pages != 8 || l.Slots != 4 {
		t.Fatalf("a pool of 128 tokens in 16-token pages: %+v", l)
	}
	// Each request needs 5 of the 8 pages (prompt + 70 tokens), so one runs at a time.
	var reqs []loader.Request
	for _, p := range []string{"first", "second", "third"} {
		reqs = append(reqs, loader.Request{Prompt: p2ids(p), MaxTokens: 70, TopP: 1, IgnoreEOS: true})
	}
	var alone [][]int
	for _, r := range reqs {
		res, err := e.Generate([]loader.Request{r})
		if err != nil {
			t.Fatal(err)
		}
		alone = append(alone, res[0].Tokens)
	}
	var hs []*loader.Handle
	for _, r := range reqs {
		h, err := e.Submit(r)
		if err != nil {
			t.Fatal(err)
		}
		hs = append(hs, h)
	}
	queued := false
	for e.Busy() {
		if _, err := e.Step(); err != nil {
			t.Fatal(err)
		}
		l := e.Load()
		if l.Running > 1 {
			t.Fatalf("%d requests running on a pool that holds one: %+v", l.Running, l)
		}
		queued = queued || l.Queued > 0
	}
	if !queued {
		t.Fatal("no request ever waited for pages")
	}
	for i, h := range hs {
		if !slices.Equal(h.Result.Tokens, alone[i]) {
			t.Errorf("request %d after waiting for pages: %v, alone %v", i, h.Result.Tokens, alone[i])
		}
	}
}
