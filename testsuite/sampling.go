package testsuite

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"

	"xmix/bundle"
	"xmix/loader"
)

// eosApp is app "eos": the logits hook adds 100 to EOS id 257 of SmallModel, so that greedy
// decoding ends at once.
func eosApp() string {
	v := make([]float32, 300)
	v[257] = 100
	return "app: eos\nparams: {e: {values: " + yamlList(v) + "}}\nops:\n  - write: {at: {hook: logits}, kernel: steer_add, args: {vector: e}}\n"
}

// CheckSamplerFeatures: logprobs and top logprobs are the log-softmax of the logits each
// token was sampled from (the top one the greedy token, in order), for the requests that ask
// only; min_tokens keeps EOS out until that many tokens (its logprob still reported); ignore_eos
// goes past it; bad values are refused by name.
func CheckSamplerFeatures(t *testing.T, nb NewBackend) {
	b := Compile(t, SmallModel, eosApp())
	var rec *LogitRecorder
	record := func(t testing.TB, b *bundle.Bundle) loader.Backend {
		rec = &LogitRecorder{Backend: nb(t, b), Vocab: 300}
		return rec
	}
	ask := loader.Request{Prompt: []int{10, 20, 30}, MaxTokens: 5, TopLogprobs: 3}
	got := Generate(t, record, b, []loader.Request{ask})[0]
	plain := Generate(t, nb, b, []loader.Request{{Prompt: ask.Prompt, MaxTokens: 5}})[0]
	if !slices.Equal(got.Tokens, plain.Tokens) || plain.Logprobs != nil || len(got.Logprobs) != len(got.Tokens) {
		t.Fatalf("tokens %v (%d logprobs), without logprobs %v (%d)", got.Tokens, len(got.Logprobs), plain.Tokens, len(plain.Logprobs))
	}
	for i, lp := range got.Logprobs {
		logits := rec.Steps[i]
		m := math.Inf(-1)
		for _, v := range logits {
			m = math.Max(m, float64(v))
		}
		var sum float64
		for _, v := range logits {
			sum += math.Exp(float64(v) - m)
		}
		want := func(tok int) float64 { return float64(logits[tok]) - m - math.Log(sum) }
		if lp.Token != got.Tokens[i] || math.Abs(float64(lp.Logprob)-want(lp.Token)) > 1e-4 || len(lp.Top) != 3 {
			t.Fatalf("token %d: %+v, want token %d logprob %v and 3 top", i, lp, got.Tokens[i], want(got.Tokens[i]))
		}
		for j, top := range lp.Top {
			if math.Abs(float64(top.Logprob)-want(top.Token)) > 1e-4 || j > 0 && top.Logprob > lp.Top[j-1].Logprob {
				t.Fatalf("token %d top %d: %+v, log-softmax %v", i, j, top, want(top.Token))
			}
		}
		if lp.Top[0].Token != lp.Token {
			t.Fatalf("token %d: greedy token %d is not the top one %d", i, lp.Token, lp.Top[0].Token)
		}
	}

	eos := loader.Request{Prompt: []int{10, 20, 30}, Apps: []string{"eos"}, MaxTokens: 6}
	minTok, ignore := eos, eos
	minTok.MinTokens, minTok.Logprobs, minTok.TopLogprobs = 3, true, 1
	ignore.IgnoreEOS = true
	res := Generate(t, nb, b, []loader.Request{eos, minTok, ignore, ask})
	if !slices.Equal(res[0].Tokens, []int{257}) || res[0].Reason != loader.ReasonStop {
		t.Fatalf("with the EOS push: tokens %v (%s), want [257] (eos)", res[0].Tokens, res[0].Reason)
	}
	if m := res[1].Tokens; len(m) != 4 || slices.Contains(m[:3], 257) || m[3] != 257 || res[1].Reason != loader.ReasonStop {
		t.Fatalf("min_tokens 3: tokens %v (%s), want 3 tokens then EOS", m, res[1].Reason)
	}
	for i, lp := range res[1].Logprobs[:3] {
		if lp.Top[0].Token != 257 {
			t.Fatalf("min_tokens token %d: top %+v: the banned EOS is still the most likely", i, lp.Top)
		}
	}
	if len(res[2].Tokens) != 6 || res[2].Tokens[0] != 257 || res[2].Reason != loader.ReasonLength {
		t.Fatalf("ignore_eos: tokens %v (%s), want 6 tokens from EOS on", res[2].Tokens, res[2].Reason)
	}
	if !slices.Equal(res[3].Tokens, got.Tokens) || fmt.Sprint(res[3].Logprobs) != fmt.Sprint(got.Logprobs) {
		t.Fatalf("logprobs in a batch: %v %v, alone %v %v", res[3].Tokens, res[3].Logprobs, got.Tokens, got.Logprobs)
	}

	be := nb(t, b)
	defer be.Close()
	eng, err := loader.NewEngine(b, be)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		r    loader.Request
		want string
	}{
		{loader.Request{Prompt: []int{1}, MaxTokens: 2, TopLogprobs: 21}, "top_logprobs 21: want 0 to 20"},
		{loader.Request{Prompt: []int{1}, MaxTokens: 2, TopLogprobs: -1}, "top_logprobs -1"},
		{loader.Request{Prompt: []int{1}, MaxTokens: 2, MinTokens: 3}, "min_tokens 3: want 0 to max_tokens (2)"},
	} {
		if _, err := eng.Submit(c.r); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want %q", c.r, err, c.want)
		}
	}
}
