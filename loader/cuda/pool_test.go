package cuda

import (
	"fmt"
	"strings"
	"testing"

	"xmix/bundle"
	"xmix/loader"
	"xmix/testsuite"
)

// kvPoolBytes is what load sets aside for b's KV pool.
func kvPoolBytes(t *testing.T, b *bundle.Bundle) int64 {
	t.Helper()
	var kv int64
	for _, buf := range b.Manifest.Buffers {
		if buf.Kind != bundle.KindKV {
			continue
		}
		n, err := loader.BufferBytes(buf)
		if err != nil {
			t.Fatal(err)
		}
		kv += align(n)
	}
	return kv
}

// TestPoolAdvice: a bundle short of GPU memory is told the largest KV pool that fits, in whole
// pages: on a 2-layer cut of Llama-3.1-8B, rebuilt with that serving.kv_cache_tokens, the pool
// gives back at least the bytes it was short, and one page more would not. Where even a pool
// of max_seq_len tokens would not fit, or there is no pool, the advice says what to change
// instead.
func TestPoolAdvice(t *testing.T) {
	serving := "serving: {decode_buckets: [1, 8], prefill_chunks: [64], max_seq_len: 1024, max_seqs: 8, kv_block_size: 16, kv_cache_tokens: %d}\n"
	b := testsuite.Compile(t, testsuite.SpecCut(t, "llama-3.1-8b", fmt.Sprintf(serving, 8192)))
	kv := kvPoolBytes(t, b)
	short := kv / 3
	advice := poolAdvice(b.Manifest.Model, kv, short)
	var fit int
	if _, err := fmt.Sscanf(advice[strings.Index(advice, "at most ")+len("at most "):], "%d tokens", &fit); err != nil {
		t.Fatalf("advice %q: %v", advice, err)
	}
	if fit%16 != 0 || fit < 1024 || fit >= 8192 {
		t.Fatalf("advice %q: %d tokens, want whole pages between max_seq_len and the pool", advice, fit)
	}
	smaller := kvPoolBytes(t, testsuite.Compile(t, testsuite.SpecCut(t, "llama-3.1-8b", fmt.Sprintf(serving, fit))))
	perPage := kv / int64(b.Manifest.Model.KVBlocks)
	if kv-smaller < short || kv-smaller-perPage >= short {
		t.Errorf("a pool of %d tokens gives back %d bytes, want at least %d and less than one page (%d) more", fit, kv-smaller, short, perPage)
	}
	if a := poolAdvice(b.Manifest.Model, kv, kv*7/8); !strings.Contains(a, "even one of max_seq_len (1024) tokens would not fit") {
		t.Errorf("short of 7/8 of the pool: %q", a)
	}
	if a := poolAdvice(bundle.ModelConfig{}, 0, 1<<30); !strings.Contains(a, "no KV pool") {
		t.Errorf("no pool: %q", a)
	}
}
