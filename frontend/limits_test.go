package frontend

import (
	"strconv"
	"strings"
	"testing"
)

// numbers is "1, 2, ..., n".
func numbers(n int) string {
	s := make([]string, n)
	for i := range s {
		s[i] = strconv.Itoa(i + 1)
	}
	return strings.Join(s, ", ")
}

// TestSizesAreBoundedAtTheirPosition: every size a model spec gives is checked against its
// limit where it is written, before anything is sized from it.
func TestSizesAreBoundedAtTheirPosition(t *testing.T) {
	parse := func(path string, data []byte) error { _, err := ParseModel(path, data); return err }
	with := func(old, new string) string {
		if !strings.Contains(tinyModel, old) {
			t.Fatalf("tinyModel lacks %q", old)
		}
		return strings.Replace(tinyModel, old, new, 1)
	}
	for _, c := range []struct{ name, text, want string }{
		{"layers", with("layers: 6", "layers: 2000000000"), "s.yaml:6:11: dims.layers: 2000000000 is more than this compiler supports (at most 4096)"},
		{"hidden", with("hidden: 256", "hidden: 2000000000"), "s.yaml:4:11: dims.hidden: 2000000000 is more than this compiler supports (at most 32768: a row of the residual stream is held in registers)"},
		{"vocab", with("vocab: 258", "vocab: 2000000000"), "s.yaml:9:10: dims.vocab: 2000000000 is more than this compiler supports (at most 16777215: token ids are held exactly in f32)"},
		{"intermediate", with("intermediate: 768", "intermediate: 2000000000"), "s.yaml:5:17: dims.intermediate: 2000000000 is more than this compiler supports (at most 1048576)"},
		{"heads", with("heads: 8", "heads: 2048"), "s.yaml:7:10: dims.heads: 2048 is more than this compiler supports (at most 1024)"},
		{"kv heads", with("kv_heads: 2", "kv_heads: 4096"), "s.yaml:8:13: dims.kv_heads: 4096 is more than this compiler supports"},
		{"head dim", with("kv_heads: 2", "kv_heads: 2\n  head_dim: 512"), "s.yaml:9:13: dims.head_dim: 512 is more than this compiler supports (at most 256"},
		{"1e400", with("layers: 6", "layers: 1e400"), "s.yaml:6:11: dims.layers: integer 1e400 is out of range"},
		{"rms eps", with("tie_embeddings: true", "rms_eps: 1e39"), "dims.rms_eps: 1e+39 is out of float32 range"},
		{"max seq len", with("max_seq_len: 512", "max_seq_len: 2000000000"), "s.yaml:17:16: serving.max_seq_len: 2000000000 is more than this compiler supports (at most 1048576)"},
		{"bucket", with("[1, 2, 4, 8]", "[1, 2000000000]"), "s.yaml:16:19: serving.decode_buckets: 2000000000 is more than this compiler supports (at most 65536 rows per step)"},
		{"many buckets", with("[1, 2, 4, 8]", "["+numbers(65)+"]"), "serving.decode_buckets: 65 sizes is more than this compiler supports (at most 64: each becomes a template)"},
		{"max seqs", with("max_seqs: 8", "max_seqs: 70000"), "s.yaml:18:13: serving.max_seqs: 70000 is more than this compiler supports"},
		{"resident", strings.Replace(with("max_seq_len: 512", "max_seq_len: 1048576"), "max_seqs: 8", "max_seqs: 64", 1),
			"s.yaml:18:13: serving: max_seqs 64 x max_seq_len 1048576 = 67108864 tokens of KV cache is more than this compiler supports"},
		{"block size", with("max_seq_len: 512", "max_seq_len: 512\n  kv_block_size: 24"), "serving.kv_block_size 24 is not a power of two"},
		{"synthetic std", with("weights: tiny/model.safetensors", "weights: {synthetic: {std: 1e39}}"), "s.yaml:11:28: weights.synthetic.std: 1e39 is out of float32 range"},
		{"eos", with("eos: [257]", "eos: ["+numbers(1025)+"]"), "eos: 1025 ids is more than this compiler supports (at most 1024)"},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := specError(t, parse, c.text); !strings.Contains(got, c.want) {
				t.Errorf("error\n%s\nlacks %q", got, c.want)
			}
		})
	}
}

// TestAppNumbersFitFloat32: every number an app gives becomes an f32; one out of its range
// is an error at the number, never a word (1e400 reads as a string to YAML) or an infinity.
func TestAppNumbersFitFloat32(t *testing.T) {
	m := testModel(t)
	parse := func(path string, data []byte) error { _, err := ParseApp(path, data, m); return err }
	const head = "app: a\nbuffers:\n  harm: {shape: [1]}\nparams:\n  v: {values: [1, 2]}\nops:\n"
	for _, c := range []struct{ name, op, want string }{
		{"1e400", "write: {at: {hook: logits}, kernel: scale, args: {alpha: 1e400}}", "s.yaml:7:62: ops[0].write.args.alpha: 1e400 is out of float32 range (at most 3.403e+38 in magnitude)"},
		{"-1e400", "write: {at: {hook: logits}, kernel: scale, args: {alpha: -1e400}}", "ops[0].write.args.alpha: -1e400 is out of float32 range"},
		{"1e39", "write: {at: {hook: logits}, kernel: scale, args: {alpha: 1e39}}", "s.yaml:7:62: ops[0].write.args.alpha: 1e39 is out of float32 range"},
		{"nan", "write: {at: {hook: logits}, kernel: scale, args: {alpha: .nan}}", "ops[0].write.args.alpha: expected a finite number, got .nan"},
		{"hex", "write: {at: {hook: logits}, kernel: scale, args: {alpha: 0x7fffffffffffffffff}}", "0x7fffffffffffffffff is out of float32 range"},
		{"threshold", "write: {at: {hook: logits}, kernel: scale, when: {activation: {buffer: harm, op: '>', value: 1e39}}}", "ops[0].write.when.activation.value: 1e39 is out of float32 range"},
		{"values", "write: {at: {hook: logits}, kernel: scale}\nparams:\n  w: {values: [1, 1e39]}", "params.w.values: 1e39 is out of float32 range"},
	} {
		t.Run(c.name, func(t *testing.T) {
			text := head + "  - " + c.op + "\n"
			if strings.Contains(c.op, "\nparams:") {
				text = "app: a\nops:\n  - " + c.op + "\n"
			}
			if got := specError(t, parse, text); !strings.Contains(got, c.want) {
				t.Errorf("error\n%s\nlacks %q", got, c.want)
			}
		})
	}
	// Quoted, it is a word: a param name, refused by the passes if there is none.
	a, err := ParseApp("s.yaml", []byte(head+"  - write: {at: {hook: logits}, kernel: scale, args: {alpha: '1e400'}}\n"), m)
	if err != nil || a.Ops[0].Args[0].Word != "1e400" {
		t.Errorf("quoted 1e400: %v %+v", err, a)
	}
}
