package frontend

import (
	"errors"
	"strings"
	"testing"
)

// checkResult is what both fuzz targets assert: exactly one of a value and an error, and every
// error a positioned *Error.
func checkResult(t *testing.T, ok bool, err error) {
	t.Helper()
	if ok == (err != nil) {
		t.Fatalf("got value=%v and err=%v; want exactly one", ok, err)
	}
	if err == nil {
		return
	}
	var list ErrorList
	if !errors.As(err, &list) || len(list) == 0 {
		t.Fatalf("error %T %q is not a non-empty ErrorList", err, err)
	}
	for _, e := range list {
		if e.Pos.Line < 1 || e.Pos.Col < 1 {
			t.Fatalf("error without a position: %q", e)
		}
	}
}

var modelSeeds = []string{
	tinyModel,
	"model: x\nfamily: llama\ndims: {hidden: 8, intermediate: 16, layers: 1, heads: 2, vocab: 260}\nweights: {synthetic: {seed: 1, std: 0.5}}\ntokenizer: bytes\nbos: 256\n",
	"model: x\nfamily: llama\ndims: &d {hidden: 8}\nserving: *d\n",
	"model: [\n",
	"dims:\n  hidden: -1\n  heads: 0\n  <<: {a: 1}\n",
	"a: &a [*a]\n",
	"- 1\n- 2\n",
	"---\n---\n",
	"model: x\nconfig: /dev/zero\n",
	"model: x\nfamily: llama\ndims: {hidden: 1e400, layers: 0x10}\nserving: {decode_buckets: [8, 4], max_seq_len: 3}\n",
	strings.Replace(tinyModel, "kv_heads: 2", "kv_heads: 3", 1),
}

func FuzzParseModel(f *testing.F) {
	for _, s := range modelSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := ParseModel("fuzz/model.yaml", data)
		checkResult(t, m != nil, err)
	})
}

var appSeeds = []string{
	refusalApp,
	"app: a\nops:\n  - write: {at: {layers: all, hook: resid_pre}, kernel: project_out, args: {dir: d}}\nparams:\n  d: {values: [1, 2]}\n",
	"app: a\nops: [{read: {at: {hook: sampled}, kernel: capture, into: b}}]\nbuffers: {b: {shape: [1, 2], dtype: i32}}\n",
	"app: a\nops:\n  - write: {at: {layers: \"0-99999999999\", hook: resid_post}, kernel: scale}\n",
	"app: a\nops:\n  - write: {at: {layers: \"0-1000000\", hook: resid_post}, kernel: scale, when: {steps: [1]}}\n",
	"app: a\nops: [{write: {}, read: {}}, 3, [x]]\n",
	"app: a\nops: [{write: {at: {hook: logits}, kernel: scale, when: {token_in: [-1], steps: {from: 4, to: 2}}}}]\n",
	"app: A B\nparams: {x: {file: f, values: [1]}, 9y: {}}\nbuffers: {b: {shape: [99999, 99999, 99999]}}\nops: []\n",
	"app: [\n",
	"",
}

func FuzzParseApp(f *testing.F) {
	for _, s := range appSeeds {
		f.Add([]byte(s))
	}
	m, err := ParseModel("fuzz/tiny.yaml", []byte(tinyModel))
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		a, err := ParseApp("fuzz/app.yaml", data, m)
		checkResult(t, a != nil, err)
		// Without a model only the range guard stands between a layer range and memory.
		a, err = ParseApp("fuzz/app.yaml", data, nil)
		checkResult(t, a != nil, err)
	})
}
