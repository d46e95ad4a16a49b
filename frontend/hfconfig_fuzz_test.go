package frontend

import (
	"errors"
	"testing"
)

// FuzzHFConfig: any bytes given as a config.json either parse or are a positioned *Error;
// never a panic.
func FuzzHFConfig(f *testing.F) {
	f.Add([]byte(qwen3Config))
	for _, s := range []string{"", "{}", "null", "[]", `{"hidden_size": 1e400}`, `{"eos_token_id": [1, -2]}`,
		`{"rope_scaling": {"rope_type": "llama3", "factor": 8}}`, `{"rope_parameters": {"rope_theta": -1}}`,
		`{"num_hidden_layers": 2000000000, "hidden_size": 2000000000, "vocab_size": 9223372036854775807}`,
		`{"num_local_experts": 100000, "num_experts_per_tok": -1}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := parseHFConfig("fuzz/config.json", data)
		if err != nil {
			var e *Error
			if !errors.As(err, &e) || e.Pos.Line < 1 || e.Pos.Col < 1 {
				t.Fatalf("error %T %q is not a positioned *Error", err, err)
			}
			return
		}
		if c == nil {
			t.Fatal("no config and no error")
		}
	})
}
