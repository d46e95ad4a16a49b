package cpu

import (
	"strings"
	"testing"

	"xmix/bundle"
)

// TestCheckMemory: a bundle whose buffers exceed the machine's memory is refused before
// anything is allocated, with both sizes named; one that fits, or an unknown memory, passes.
func TestCheckMemory(t *testing.T) {
	b := &bundle.Bundle{Manifest: bundle.Manifest{Buffers: []bundle.Buffer{
		{Name: "kv.k", Kind: bundle.KindKV, Dtype: "f32", Shape: []int{1 << 20, 1 << 10}},  // 4 GiB
		{Name: "act.x", Kind: bundle.KindActivation, Dtype: "bf16", Shape: []int{1 << 20}}, // 2 MiB
	}}}
	err := checkMemory(b, 2, 6<<30)
	if err == nil || !strings.Contains(err.Error(), "cpu: the bundle's buffers need 8.6 GB (2 rank(s)), more than this machine's 6.4 GB of memory") {
		t.Errorf("2 ranks in 6 GiB: %v", err)
	}
	if err := checkMemory(b, 1, 8<<30); err != nil {
		t.Errorf("1 rank in 8 GiB: %v", err)
	}
	if err := checkMemory(b, 64, 0); err != nil {
		t.Errorf("unknown memory: %v", err)
	}
	if physicalMemory() <= 0 {
		t.Log("this machine's memory is unknown")
	}
}
