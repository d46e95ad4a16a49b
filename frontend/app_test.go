package frontend

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// testModel is the tiny model the app tests check against: 6 layers, vocab 258.
func testModel(t *testing.T) *Model {
	t.Helper()
	m, err := ParseModel(filepath.Join(t.TempDir(), "tiny.yaml"), []byte(tinyModel))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

const refusalApp = `app: conditional-refusal
params:
  harm_dir:   {file: vectors.safetensors, tensor: harm_dir}
  small:      {values: [0.1, 0.2, 0.3]}
buffers:
  harm: {shape: [1], dtype: f32, export: true}
ops:
  - read:  {at: {layers: [4], hook: resid_post}, kernel: probe_linear,
            args: {w: harm_dir, bias: -0.3, activation: sigmoid}, into: harm}
  - write: {at: {layers: "2-5", hook: resid_post}, kernel: steer_add,
            args: {vector: small, alpha: 4},
            when: {activation: {buffer: harm, op: ">", value: 0.5}, token_in: [10, 20],
                   steps: [2, 8], positions: generated}}
  - write:
      at: {hook: logits}
      kernel: scale
      when: {after_token: 65, steps: {from: 3}}
  - read: {at: {layers: all, hook: attn.z}, kernel: capture, into: harm}
`

func f64(v float64) *float64 { return &v }

func TestParseAppValid(t *testing.T) {
	m := testModel(t)
	dir := t.TempDir()
	path := filepath.Join(dir, "refusal.yaml")
	a, err := ParseApp(path, []byte(refusalApp), m)
	if err != nil {
		t.Fatal(err)
	}
	at := func(line, col int) Pos { return Pos{File: path, Line: line, Col: col} }
	want := &App{
		Pos: at(1, 1), Path: path, Dir: dir, Name: "conditional-refusal",
		Params: []Param{
			{Pos: at(3, 3), Name: "harm_dir", File: filepath.Join(dir, "vectors.safetensors"), Tensor: "harm_dir"},
			{Pos: at(4, 3), Name: "small", Values: []float32{0.1, 0.2, 0.3}},
		},
		Buffers: []Buffer{{Pos: at(6, 3), Name: "harm", Shape: []int{1}, Dtype: "f32", Export: true}},
		Ops: []Op{
			{
				Pos: at(8, 5), Kind: "read", Layers: []int{4}, LayersPos: at(8, 26),
				Hook: "resid_post", HookPos: at(8, 37), Kernel: "probe_linear", KernelPos: at(8, 58),
				Args: []Arg{
					{Pos: at(9, 20), Name: "w", Word: "harm_dir"},
					{Pos: at(9, 33), Name: "bias", Number: f64(-0.3)},
					{Pos: at(9, 45), Name: "activation", Word: "sigmoid"},
				},
				Into: "harm", IntoPos: at(9, 73),
			},
			{
				Pos: at(10, 5), Kind: "write", Layers: []int{2, 3, 4, 5}, LayersPos: at(10, 26),
				Hook: "resid_post", HookPos: at(10, 39), Kernel: "steer_add", KernelPos: at(10, 60),
				Args: []Arg{
					{Pos: at(11, 20), Name: "vector", Word: "small"},
					{Pos: at(11, 35), Name: "alpha", Number: f64(4)},
				},
				When: []Cond{
					{Pos: at(12, 20), Kind: "activation", Buffer: "harm", Cmp: ">", Value: 0.5},
					{Pos: at(12, 69), Kind: "token_in", Tokens: []int{10, 20}},
					{Pos: at(13, 20), Kind: "steps", From: 2, To: 8},
					{Pos: at(13, 35), Kind: "positions", Positions: "generated"},
				},
			},
			{
				Pos: at(14, 5), Kind: "write", Hook: "logits", HookPos: at(15, 18),
				Kernel: "scale", KernelPos: at(16, 15),
				When: []Cond{
					{Pos: at(17, 14), Kind: "after_token", Tokens: []int{65}},
					{Pos: at(17, 31), Kind: "steps", From: 3},
				},
			},
			{
				Pos: at(18, 5), Kind: "read", AllLayers: true, LayersPos: at(18, 25),
				Hook: "attn.z", HookPos: at(18, 36), Kernel: "capture", KernelPos: at(18, 53),
				Into: "harm", IntoPos: at(18, 68),
			},
		},
	}
	if !reflect.DeepEqual(a.Params, want.Params) {
		t.Errorf("params:\ngot  %+v\nwant %+v", a.Params, want.Params)
	}
	if !reflect.DeepEqual(a.Buffers, want.Buffers) {
		t.Errorf("buffers:\ngot  %+v\nwant %+v", a.Buffers, want.Buffers)
	}
	if len(a.Ops) != len(want.Ops) {
		t.Fatalf("got %d ops, want %d", len(a.Ops), len(want.Ops))
	}
	for i := range a.Ops {
		if !reflect.DeepEqual(a.Ops[i], want.Ops[i]) {
			t.Errorf("op %d:\ngot  %+v\nwant %+v", i, a.Ops[i], want.Ops[i])
		}
	}
	a.Params, a.Buffers, a.Ops = want.Params, want.Buffers, want.Ops
	if !reflect.DeepEqual(a, want) {
		t.Errorf("app:\ngot  %+v\nwant %+v", a, want)
	}
}

func TestParseAppLayerForms(t *testing.T) {
	m := testModel(t)
	cases := []struct {
		layers string
		want   []int
		all    bool
	}{
		{"3", []int{3}, false},
		{"[0, 5, 2]", []int{0, 5, 2}, false},
		{`"1-3"`, []int{1, 2, 3}, false},
		{`"4 - 4"`, []int{4}, false},
		{"all", nil, true},
	}
	for _, c := range cases {
		text := "app: a\nops:\n  - write: {at: {layers: " + c.layers + ", hook: resid_pre}, kernel: scale}\n"
		a, err := ParseApp("a.yaml", []byte(text), m)
		if err != nil {
			t.Errorf("layers %s: %v", c.layers, err)
			continue
		}
		if op := a.Ops[0]; !reflect.DeepEqual(op.Layers, c.want) || op.AllLayers != c.all {
			t.Errorf("layers %s: got %v all=%v, want %v all=%v", c.layers, op.Layers, op.AllLayers, c.want, c.all)
		}
	}
}

// TestParseAppPerRequest: per_request: on a param and in an op's at: are read.
func TestParseAppPerRequest(t *testing.T) {
	a, err := ParseApp("a.yaml", []byte(`app: a
params: {v: {values: [1, 2], per_request: true}, w: {values: [3]}}
ops:
  - write: {at: {layers: "1-3", hook: resid_post, per_request: true}, kernel: steer_add, args: {vector: v}}
  - write: {at: {layers: 2, hook: resid_post}, kernel: steer_add, args: {vector: w}}
`), testModel(t))
	if err != nil {
		t.Fatal(err)
	}
	if !a.Params[0].PerRequest || a.Params[1].PerRequest || !a.Ops[0].LayersPerRequest || a.Ops[1].LayersPerRequest {
		t.Fatalf("params %+v ops %+v", a.Params, a.Ops)
	}
}

func TestParseAppErrors(t *testing.T) {
	m := testModel(t)
	parse := func(path string, data []byte) error { _, err := ParseApp(path, data, m); return err }
	const head = "app: a\nbuffers:\n  harm: {shape: [1]}\nops:\n"
	// op builds a spec whose only op is on line 5.
	op := func(body string) string { return head + "  - " + body + "\n" }
	cases := []struct {
		name, text string
		want       []string
	}{
		{"malformed", op("write: {at: {hook: logits}, kernel: scale"), []string{"s.yaml:", "malformed YAML"}},
		{"unknown top key", "app: a\nopz: []\n", []string{`s.yaml:2:1: app spec: unknown key "opz" (did you mean "ops"?`, `s.yaml:1:1: app spec: missing key "ops"`}},
		{"bad name", "app: Bad Name\nops: [{write: {at: {hook: logits}, kernel: scale}}]\n", []string{`s.yaml:1:6: app: bad name "Bad Name"`}},
		{"empty ops", "app: a\nops: []\n", []string{"s.yaml:2:6: ops: must not be empty"}},
		{"two kinds", op("{read: {}, write: {}}"), []string{"s.yaml:5:5: ops[0]: an op has exactly one key, read or write"}},
		{"kind typo", op("wrte: {at: {hook: logits}, kernel: scale}"), []string{`s.yaml:5:5: ops[0]: unknown key "wrte" (did you mean "write"?`}},
		{"unknown op key", op("write: {at: {hook: logits}, kernal: scale}"),
			[]string{`s.yaml:5:33: ops[0].write: unknown key "kernal" (did you mean "kernel"?`, `s.yaml:5:5: ops[0].write: missing key "kernel"`}},
		{"layer out of range", op("write: {at: {layers: [1, 6], hook: resid_post}, kernel: scale}"),
			[]string{`s.yaml:5:30: ops[0].write.at.layers: layer 6 is out of range (model "tiny" has layers 0-5)`}},
		{"range out of range", op(`write: {at: {layers: "3-9", hook: resid_post}, kernel: scale}`), []string{`s.yaml:5:26: ops[0].write.at.layers: layer 9 is out of range (model "tiny" has layers 0-5)`}},
		{"bad range", op(`write: {at: {layers: "3..5", hook: resid_post}, kernel: scale}`),
			[]string{`s.yaml:5:26: ops[0].write.at.layers: bad layer range "3..5" (use N, [N, M], "A-B" or all)`}},
		{"reversed range", op(`write: {at: {layers: "5-3", hook: resid_post}, kernel: scale}`), []string{`bad layer range "5-3"`}},
		{"duplicate layer", op("write: {at: {layers: [2, 2], hook: resid_post}, kernel: scale}"), []string{"layer 2 given twice"}},
		{"missing hook", op("write: {at: {layers: 1}, kernel: scale}"), []string{`s.yaml:5:13: ops[0].write.at: missing key "hook"`}},
		{"per-request layers not a bool", op("write: {at: {layers: 1, hook: resid_post, per_request: 1}, kernel: scale}"),
			[]string{"s.yaml:5:60: ops[0].write.at.per_request: expected a boolean"}},
		{"per-request param not a bool", "app: a\nparams: {v: {values: [1], per_request: yes}}\nops:\n  - write: {at: {hook: logits}, kernel: scale}\n",
			[]string{"s.yaml:2:40: params.v.per_request: expected a boolean"}},
		{"unknown kernel", op("write: {at: {hook: logits}, kernel: steer_ad}"),
			[]string{`s.yaml:5:41: ops[0].write: unknown kernel "steer_ad" (did you mean "steer_add"? kernels: capture,`}},
		{"read without into", op("read: {at: {hook: logits}, kernel: capture}"), []string{"s.yaml:5:5: ops[0].read: a read needs into (add into: naming one of buffers:)"}},
		{"write with into", op("write: {at: {hook: logits}, kernel: scale, into: harm}"), []string{"s.yaml:5:48: ops[0].write: a write takes no into"}},
		{"unknown buffer", op("read: {at: {hook: logits}, kernel: capture, into: hram}"), []string{`s.yaml:5:55: ops[0].read.into: unknown buffer "hram" (did you mean "harm"?`}},
		{"arg list", op("write: {at: {hook: logits}, kernel: scale, args: {v: [1, 2]}}"), []string{"s.yaml:5:58: ops[0].write.args.v: expected a number or a word, got a list"}},
		{"when key", op("write: {at: {hook: logits}, kernel: scale, when: {token: [1]}}"), []string{`s.yaml:5:55: ops[0].write.when: unknown key "token"`}},
		{"when cmp", op(`write: {at: {hook: logits}, kernel: scale, when: {activation: {buffer: harm, op: "=>", value: 1}}}`),
			[]string{`ops[0].write.when.activation.op: unknown value "=>"`}},
		{"when buffer", op(`write: {at: {hook: logits}, kernel: scale, when: {activation: {buffer: x, op: ">", value: 1}}}`),
			[]string{`ops[0].write.when.activation.buffer: unknown buffer "x"`}},
		{"when token range", op("write: {at: {hook: logits}, kernel: scale, when: {token_in: [300]}}"),
			[]string{`s.yaml:5:65: ops[0].write.when.token_in: token 300 is not a token id of the model (model "tiny" has vocab 258)`}},
		{"when steps", op("write: {at: {hook: logits}, kernel: scale, when: {steps: [5, 2]}}"), []string{"ops[0].write.when.steps: to 2 is not after from 5"}},
		{"when positions", op("write: {at: {hook: logits}, kernel: scale, when: {positions: promt}}"), []string{`unknown value "promt" (did you mean "prompt"?`}},
		{"when empty", op("write: {at: {hook: logits}, kernel: scale, when: {}}"), []string{"s.yaml:5:48: ops[0].write.when: no conditions"}},
		{"param both", "app: a\nparams:\n  p: {file: f.safetensors, values: [1]}\nops: [{write: {at: {hook: logits}, kernel: scale}}]\n",
			[]string{"s.yaml:3:3: params.p: has more than one source"}},
		{"param neither", "app: a\nparams:\n  p: {tensor: t}\nops: [{write: {at: {hook: logits}, kernel: scale}}]\n",
			[]string{"s.yaml:3:3: params.p: needs file, values or random"}},
		{"param values type", "app: a\nparams:\n  p: {values: [1, x]}\nops: [{write: {at: {hook: logits}, kernel: scale}}]\n",
			[]string{`s.yaml:3:19: params.p.values: expected a number, got "x"`}},
		{"buffer shape", "app: a\nbuffers:\n  b: {shape: [0]}\nops: [{write: {at: {hook: logits}, kernel: scale}}]\n",
			[]string{"s.yaml:3:15: buffers.b.shape: must be a positive integer, got 0"}},
		{"buffer empty shape", "app: a\nbuffers:\n  b: {shape: []}\nops: [{write: {at: {hook: logits}, kernel: scale}}]\n",
			[]string{"s.yaml:3:14: buffers.b.shape: must not be empty"}},
		{"buffer no shape", "app: a\nbuffers:\n  b: {dtype: f32}\nops: [{write: {at: {hook: logits}, kernel: scale}}]\n",
			[]string{`s.yaml:3:3: buffers.b: missing key "shape"`}},
		{"buffer export type", "app: a\nbuffers:\n  b: {shape: [1], export: yes please}\nops: [{write: {at: {hook: logits}, kernel: scale}}]\n",
			[]string{`s.yaml:3:27: buffers.b.export: expected a boolean, got "yes please"`}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := specError(t, parse, c.text)
			for _, w := range c.want {
				if !strings.Contains(got, w) {
					t.Errorf("error\n%s\nlacks %q", got, w)
				}
			}
		})
	}
}

func TestParseAppSortsErrors(t *testing.T) {
	text := "app: a\nops:\n  - write: {at: {hook: logits, layers: 40}, kernel: nope}\n  - read: {at: {hook: logits}, kernel: capture}\n"
	_, err := ParseApp("s.yaml", []byte(text), testModel(t))
	lines := strings.Split(err.Error(), "\n")
	want := []string{"s.yaml:3:40:", "s.yaml:3:53:", "s.yaml:4:5:"}
	if len(lines) != len(want) {
		t.Fatalf("got %d errors, want %d:\n%s", len(lines), len(want), err)
	}
	for i, w := range want {
		if !strings.HasPrefix(lines[i], w) {
			t.Errorf("error %d = %q, want it at %s", i, lines[i], w)
		}
	}
}

func TestParseAppWithoutModel(t *testing.T) {
	a, err := ParseApp("a.yaml", []byte("app: a\nops: [{write: {at: {layers: 40, hook: resid_post}, kernel: scale}}]\n"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(a.Ops[0].Layers, []int{40}) {
		t.Errorf("layers = %v, want [40]", a.Ops[0].Layers)
	}
}

func TestParseAppAliasesAndMoEWithoutModel(t *testing.T) {
	text := "app: a\nparams:\n  x: &v {values: [1, 2]}\n  y: *v\nops:\n  - write: {at: {layers: 0, hook: router_logits}, kernel: router_bias, args: {bias: y}}\n"
	a, err := ParseApp("a.yaml", []byte(text), nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(a.Params) != 2 || !reflect.DeepEqual(a.Params[1].Values, []float32{1, 2}) {
		t.Errorf("params = %+v, want y to repeat x's values", a.Params)
	}
}

func TestParseAppCustomKernels(t *testing.T) {
	dir := t.TempDir()
	ptxText := ".version 8.0\n.target sm_90\n.address_size 64\n"
	if err := writeFile(filepath.Join(dir, "k.ptx"), ptxText); err != nil {
		t.Fatal(err)
	}
	src := `app: c
kernels:
  fromfile: {ptx: k.ptx, entry: k1, signature: [x u64, bit u32]}
  inline:
    entry: k2
    signature: ["alpha f32"]
    ptx: |
      .version 8.0
      .target sm_90
ops:
  - write: {at: {layers: [1], hook: resid_post}, kernel: custom:fromfile}
  - write: {at: {layers: [2], hook: resid_post}, kernel: inline}
`
	a, err := ParseApp(filepath.Join(dir, "c.yaml"), []byte(src), testModel(t))
	if err != nil {
		t.Fatal(err)
	}
	if len(a.Kernels) != 2 {
		t.Fatalf("%d kernels", len(a.Kernels))
	}
	k := a.Kernels[0]
	if k.Name != "fromfile" || k.PTX != ptxText || k.File != filepath.Join(dir, "k.ptx") || k.Entry != "k1" ||
		len(k.Signature) != 2 || k.Signature[1] != (SigParam{Pos: k.Signature[1].Pos, Name: "bit", Type: "u32"}) {
		t.Fatalf("kernel %+v", k)
	}
	if k := a.Kernels[1]; k.File != "" || !strings.HasPrefix(k.PTX, ".version 8.0\n.target sm_90") {
		t.Fatalf("inline kernel %+v", k)
	}
	if a.Ops[0].Kernel != "custom:fromfile" || a.Ops[1].Kernel != "custom:inline" {
		t.Fatalf("op kernels %q, %q", a.Ops[0].Kernel, a.Ops[1].Kernel)
	}
}

func TestParseAppCustomKernelErrors(t *testing.T) {
	for _, c := range []struct{ name, kernels, kernel, want string }{
		{"undeclared", "k: {ptx: \"x\\ny\", entry: k, signature: []}", "custom:nope", `custom kernel "nope" is not declared`},
		{"bad signature", "k: {ptx: \"x\\ny\", entry: k, signature: [x]}", "k", `kernels.k.signature[0]: bad parameter "x"`},
		{"bad type", "k: {ptx: \"x\\ny\", entry: k, signature: [x f64]}", "k", `bad parameter "x f64"`},
		{"missing file", "k: {ptx: gone.ptx, entry: k, signature: []}", "k", "kernels.k.ptx:"},
		{"missing entry", "k: {ptx: \"x\\ny\", signature: []}", "k", "entry"},
		{"built-in name", "scale: {ptx: \"x\\ny\", entry: k, signature: []}", "scale", `"scale" is a built-in kernel`},
	} {
		t.Run(c.name, func(t *testing.T) {
			src := "app: c\nkernels:\n  " + c.kernels + "\nops:\n  - write: {at: {layers: [1], hook: resid_post}, kernel: " + c.kernel + "}\n"
			_, err := ParseApp(filepath.Join(t.TempDir(), "c.yaml"), []byte(src), testModel(t))
			if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "c.yaml:") {
				t.Fatalf("error %v, want one at c.yaml:line:col containing %q", err, c.want)
			}
		})
	}
}

func writeFile(path, text string) error { return os.WriteFile(path, []byte(text), 0o644) }

// TestParseAppErrorOncePerAnchor: a bad value anchored once and read through three aliases is
// reported once, at the anchor.
func TestParseAppErrorOncePerAnchor(t *testing.T) {
	text := "app: a\nparams:\n  x: &bad {values: [1, 2]}\n  y: {values: [*bad, *bad, *bad]}\nops: []\n"
	_, err := ParseApp("a.yaml", []byte(text), nil)
	var list ErrorList
	if !errors.As(err, &list) {
		t.Fatalf("got %v, want an ErrorList", err)
	}
	n := 0
	for _, e := range list {
		if strings.Contains(e.Msg, "params.y.values: expected a number, got a mapping") {
			n++
		}
	}
	if n != 1 {
		t.Errorf("the alias's error %d times, want once:\n%v", n, err)
	}
}
