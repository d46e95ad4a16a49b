package gpu

import (
	"os"
	"strings"
	"testing"

	"xmix/loader/cuda"
	"xmix/testsuite"
)

// EXPERIMENT, kept only in history (RESULTS.md "Session 29"): the 8-row copy-engine GEMM against the CPU.
func TestExpTMAMatchesCPU(t *testing.T) {
	needGPU(t)
	if os.Getenv("XMIX_EXP_TMA") == "" {
		t.Skip("XMIX_EXP_TMA unset")
	}
	spec := strings.Replace(llama1BCut(t), "decode_buckets: [1, 2, 4], prefill_chunks: [64], max_seq_len: 256, max_seqs: 4", "decode_buckets: [8], prefill_chunks: [64], max_seq_len: 256, max_seqs: 8", 1)
	b := testsuite.Compile(t, spec)
	agreementWith(t, cuda.GemmPTX, "exp-tma-short", b, []int{791, 4062, 14198, 39935, 35308, 927}, 64, false)
	agreementWith(t, cuda.GemmPTX, "exp-tma-long", b, longPrompt(32000), 64, false)
	os.Unsetenv("XMIX_EXP_TMA")
	agreementWith(t, cuda.GemmPTX, "exp-tma-off-long", b, longPrompt(32000), 64, false)
	for k, v := range results {
		if strings.HasPrefix(k, "agreement.exp-tma") {
			t.Logf("%s: %v", k, v)
		}
	}
}
