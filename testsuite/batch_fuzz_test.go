package testsuite

import (
	"reflect"
	"slices"
	"strings"
	"testing"

	"xmix/loader"
)

// fuzzRequests decodes up to five requests from data: each a prompt of 1-48 tokens, 1-16 new
// tokens, and from its flags the steering app, sampling with a seed, min_tokens and
// ignore_eos. Prompt and generation fit max_seq_len 128, so every request is valid.
func fuzzRequests(data []byte) []loader.Request {
	next := func() int {
		if len(data) == 0 {
			return 0
		}
		b := int(data[0])
		data = data[1:]
		return b
	}
	reqs := make([]loader.Request, 1+next()%5)
	for i := range reqs {
		r := &reqs[i]
		r.Prompt = make([]int, 1+next()%48)
		for j := range r.Prompt {
			r.Prompt[j] = next() % 258 // the bytes, BOS and EOS
		}
		r.MaxTokens = 1 + next()%16
		flags := next()
		if flags&1 != 0 {
			r.Apps = []string{"steer"}
		}
		if flags&2 != 0 {
			r.Temperature, r.TopP, r.Seed = 0.9, 0.95, uint64(next())
		}
		if flags&4 != 0 {
			r.MinTokens = next() % (r.MaxTokens + 1)
		}
		r.IgnoreEOS = flags&8 != 0
	}
	return reqs
}

// FuzzBatchMatchesSolo: requests run together get what each gets alone, tokens and logprobs
// bit for bit, whatever their number, lengths, apps and sampling: a differential test of the
// scheduler (prefill chunks shared with decode rows, buckets, requests queued for sequence
// slots and for KV pages, in a pool that holds one full-length sequence) on the CPU backend.
// Its prefill chunks are of 4 rows, under codegen.TensorCoreRows, so that every template
// computes a row's bits the same: a tensor-core template's GEMMs take x as two bf16 halves
// (op gemm_tc), so a request whose decode row shared a 16-row chunk with another's prompt got
// other bits than alone (the fuzzer found one whose sampled token flipped), as on the GPU,
// where such a step runs cuBLASLt's GEMMs in bf16. Mixed steps trade that for throughput, as
// vLLM's do; CheckBatchMatchesSolo holds the engine to it where no decode row shares a chunk.
func FuzzBatchMatchesSolo(f *testing.F) {
	for _, s := range []string{"\x04\x20abcdefghijklmnopqrstuvwxyz0123456\x0f\x03\x10hello\x08\x05\x02\x07\x30xyz", "\x00\x01A\x00\x00", "\x02\x2fThe quick brown fox jumps over the lazy dog, twice!\x0f\x0e\x09\x05\x01a\x0f\x0f"} {
		f.Add([]byte(s))
	}
	model := strings.Replace(SmallModel, "prefill_chunks: [16], max_seq_len: 128, max_seqs: 4, kv_block_size: 16}", "prefill_chunks: [4], max_seq_len: 128, max_seqs: 4, kv_block_size: 16, kv_cache_tokens: 128}", 1)
	b := Compile(f, model, `app: steer
params: {v: {random: 4}}
ops:
  - write: {at: {layers: "0-2", hook: resid_post}, kernel: steer_add, args: {vector: v, alpha: 3}}
`)
	be := NewCPU(f, b)
	defer be.Close()
	eng, err := loader.NewEngine(b, be)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		reqs := fuzzRequests(data)
		for i := range reqs {
			reqs[i].Logprobs = true // each step's logprob too, bit for bit
		}
		batch, err := eng.Generate(reqs)
		if err != nil {
			t.Fatalf("%+v: %v", reqs, err)
		}
		for i, req := range reqs {
			solo, err := eng.Generate([]loader.Request{req})
			if err != nil {
				t.Fatalf("request %d alone (%+v): %v", i, req, err)
			}
			got, want := batch[i], solo[0]
			if !slices.Equal(got.Tokens, want.Tokens) || !reflect.DeepEqual(got.Logprobs, want.Logprobs) || got.Reason != want.Reason || len(got.Tokens) > req.MaxTokens {
				t.Fatalf("request %d of %d (%+v): batched %v (%s), alone %v (%s)", i, len(reqs), req, got.Tokens, got.Reason, want.Tokens, want.Reason)
			}
		}
		if l := eng.Load(); l.Running != 0 || l.Queued != 0 || l.FreePages != l.Pages {
			t.Fatalf("after the requests: %+v", l)
		}
	})
}
