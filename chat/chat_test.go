package chat

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// expected.json is written by testdata/gen/gen.py: Jinja2 renderings made
// with transformers' chat template environment.
type expectedFile struct {
	Now             string                     `json:"now"`
	SnippetVars     map[string]json.RawMessage `json:"snippet_vars"`
	SnippetMessages []msgJSON                  `json:"snippet_messages"`
	Cases           []struct {
		Name                string                     `json:"name"`
		Template            string                     `json:"template"`
		Messages            []msgJSON                  `json:"messages"`
		AddGenerationPrompt bool                       `json:"add_generation_prompt"`
		Vars                map[string]json.RawMessage `json:"vars"`
		Expected            string                     `json:"expected"`
	} `json:"cases"`
	Snippets []struct {
		Template string  `json:"template"`
		Expected *string `json:"expected"`
		Error    string  `json:"error"`
	} `json:"snippets"`
}

type msgJSON struct{ Role, Content string }

func loadExpected(t *testing.T) *expectedFile {
	t.Helper()
	data, err := os.ReadFile("testdata/expected.json")
	if err != nil {
		t.Fatal(err)
	}
	var f expectedFile
	if err := json.Unmarshal(data, &f); err != nil {
		t.Fatal(err)
	}
	return &f
}

func messages(ms []msgJSON) []Message {
	out := make([]Message, len(ms))
	for i, m := range ms {
		out[i] = Message(m)
	}
	return out
}

// rawVars passes JSON values through as json.RawMessage so objects keep
// their key order, as they do in Python dicts.
func rawVars(vs map[string]json.RawMessage) map[string]any {
	out := map[string]any{}
	for k, v := range vs {
		out[k] = v
	}
	return out
}

func fixedNow(t *testing.T, f *expectedFile) func() time.Time {
	now, err := time.Parse("2006-01-02T15:04:05", f.Now)
	if err != nil {
		t.Fatal(err)
	}
	return func() time.Time { return now }
}

func loadTemplate(t *testing.T, name string) *Template {
	t.Helper()
	switch name {
	case "llama3_2":
		src, err := os.ReadFile("testdata/llama3_2.jinja")
		if err != nil {
			t.Fatal(err)
		}
		tmpl, err := Parse(string(src))
		if err != nil {
			t.Fatal(err)
		}
		return tmpl
	}
	data, err := os.ReadFile("testdata/" + name + "_tokenizer_config.json")
	if err != nil {
		t.Fatal(err)
	}
	tmpl, _, _, err := FromTokenizerConfig(data)
	if err != nil {
		t.Fatal(err)
	}
	return tmpl
}

// diff names the first line where got and want part.
func diff(got, want string) string {
	g, w := strings.Split(got, "\n"), strings.Split(want, "\n")
	for i := 0; i < len(g) || i < len(w); i++ {
		var gl, wl string
		if i < len(g) {
			gl = g[i]
		}
		if i < len(w) {
			wl = w[i]
		}
		if gl != wl || i >= len(g) || i >= len(w) {
			return "line " + itoa(i+1) + ":\n got  " + quote(gl) + "\n want " + quote(wl)
		}
	}
	return "equal"
}

func itoa(i int) string { return strconv.Itoa(i) }
func quote(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

func TestRealTemplates(t *testing.T) {
	f := loadExpected(t)
	if len(f.Cases) == 0 {
		t.Fatal("no cases in expected.json")
	}
	templates := map[string]*Template{}
	for _, c := range f.Cases {
		t.Run(c.Name, func(t *testing.T) {
			tmpl := templates[c.Template]
			if tmpl == nil {
				tmpl = loadTemplate(t, c.Template)
				tmpl.Now = fixedNow(t, f)
				templates[c.Template] = tmpl
			}
			got, err := tmpl.Render(messages(c.Messages), c.AddGenerationPrompt, rawVars(c.Vars))
			if err != nil {
				t.Fatal(err)
			}
			if got != c.Expected {
				t.Errorf("rendering differs from Jinja2 at %s", diff(got, c.Expected))
			}
		})
	}
}

func TestSnippets(t *testing.T) {
	f := loadExpected(t)
	vars := rawVars(f.SnippetVars)
	msgs := messages(f.SnippetMessages)
	for _, s := range f.Snippets {
		tmpl, perr := Parse(s.Template)
		if perr == nil {
			tmpl.Now = fixedNow(t, f)
		}
		switch s.Error {
		case "":
			if perr != nil {
				t.Errorf("%q: %v", s.Template, perr)
				continue
			}
			got, err := tmpl.Render(msgs, false, vars)
			if err != nil {
				t.Errorf("%q: %v", s.Template, err)
				continue
			}
			if got != *s.Expected {
				t.Errorf("%q:\n got  %q\n want %q", s.Template, got, *s.Expected)
			}
		case "parse", "unsupported":
			var te *Error
			if !errors.As(perr, &te) || te.Line < 1 || te.Col < 1 {
				t.Errorf("%q: want a parse error with line:col, got %v", s.Template, perr)
			}
		case "render":
			if perr != nil {
				t.Errorf("%q: want a render error, got parse error %v", s.Template, perr)
				continue
			}
			_, err := tmpl.Render(msgs, false, vars)
			var te *Error
			if !errors.As(err, &te) || te.Line < 1 || te.Col < 1 {
				t.Errorf("%q: want a render error with line:col, got %v", s.Template, err)
			}
		default:
			t.Fatalf("unknown error kind %q", s.Error)
		}
	}
}

func TestFromTokenizerConfig(t *testing.T) {
	data, err := os.ReadFile("testdata/llama3_1_tokenizer_config.json")
	if err != nil {
		t.Fatal(err)
	}
	_, bos, eos, err := FromTokenizerConfig(data)
	if err != nil {
		t.Fatal(err)
	}
	if bos != "<|begin_of_text|>" || eos != "<|eot_id|>" {
		t.Errorf("bos, eos = %q, %q", bos, eos)
	}

	data, err = os.ReadFile("testdata/qwen3_tokenizer_config.json")
	if err != nil {
		t.Fatal(err)
	}
	if _, bos, eos, err = FromTokenizerConfig(data); err != nil {
		t.Fatal(err)
	}
	if bos != "" || eos != "<|im_end|>" {
		t.Errorf("qwen3 bos, eos = %q, %q; want \"\" (null), <|im_end|>", bos, eos)
	}

	named := `{"chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "{{ bos_token }}D"}],
		"bos_token": {"content": "<s>", "lstrip": false}, "eos_token": "</s>"}`
	tmpl, bos, eos, err := FromTokenizerConfig([]byte(named))
	if err != nil {
		t.Fatal(err)
	}
	if bos != "<s>" || eos != "</s>" {
		t.Errorf("bos, eos = %q, %q", bos, eos)
	}
	got, err := tmpl.Render(nil, false, map[string]any{"bos_token": bos})
	if err != nil || got != "<s>D" {
		t.Errorf("default template renders %q, %v; want \"<s>D\"", got, err)
	}

	for _, bad := range []string{
		`{}`,
		`{"chat_template": 3}`,
		`{"chat_template": [{"name": "tool_use", "template": "x"}]}`,
		`{"chat_template": "{% if %}"}`,
		`{"chat_template": "x", "bos_token": 5}`,
		`not json`,
	} {
		if _, _, _, err := FromTokenizerConfig([]byte(bad)); err == nil {
			t.Errorf("%s: no error", bad)
		}
	}
}

func TestErrorPositions(t *testing.T) {
	for _, c := range []struct {
		src       string
		line, col int
		msg       string
	}{
		{"ab\n  {{ x | nosuch }}", 2, 10, "unknown filter"},
		{"{% if true %}\n{% for x in y %}\n{% endif %}", 3, 4, "endif"},
		{"{% if true %}", 1, 4, "never closed"},
		{"{{ 1 +* 2 }}", 1, 7, "unexpected"},
		{"\n\n   {{ 'a' ! }}", 3, 11, "unexpected character"},
		{"{% macro m() %}", 1, 4, "unsupported statement"},
		{"{{ messages[9].role }}", 1, 16, `"messages[9]" is undefined`},
		{"x{{ raise_exception('no tools') }}", 1, 20, "no tools"},
		{"{{ 1 is nosuchtest }}", 1, 9, "unknown test"},
	} {
		tmpl, err := Parse(c.src)
		if err == nil {
			_, err = tmpl.Render(nil, false, nil)
		}
		var te *Error
		if !errors.As(err, &te) {
			t.Errorf("%q: want *Error, got %v", c.src, err)
			continue
		}
		if te.Line != c.line || te.Col != c.col || !strings.Contains(te.Msg, c.msg) {
			t.Errorf("%q: got %v; want %d:%d ...%s...", c.src, err, c.line, c.col, c.msg)
		}
	}
}

func TestGoVars(t *testing.T) {
	tmpl, err := Parse(`{{ m | tojson }} {{ l }} {{ n + 1 }} {{ f }} {{ up('x') }} {{ msgs[0].role }}`)
	if err != nil {
		t.Fatal(err)
	}
	got, err := tmpl.Render(nil, false, map[string]any{
		"m":    map[string]any{"z": 1, "a": []string{"x"}},
		"l":    []int{1, 2},
		"n":    uint8(41),
		"f":    0.5,
		"up":   strings.ToUpper,
		"msgs": []Message{{Role: "user", Content: "hi"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"a": ["x"], "z": 1} [1, 2] 42 0.5 X user`; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	if _, err := tmpl.Render(nil, false, map[string]any{"m": make(chan int)}); err == nil {
		t.Error("a channel variable gave no error")
	}
}

func TestLimits(t *testing.T) {
	deep := strings.Repeat("(", 1000) + "1" + strings.Repeat(")", 1000)
	if _, err := Parse("{{ " + deep + " }}"); err == nil || !strings.Contains(err.Error(), "nesting") {
		t.Errorf("deep nesting: %v", err)
	}
	// Each template would hang, exhaust memory, panic or print a wrapped-around integer
	// without its limit; each must fail with the limit's error, at the construct's position.
	doubling := func(init, next string) string {
		return "{% set ns = namespace(a=" + init + ") %}{% for i in range(80) %}{% set ns.a = " + next + " %}{% endfor %}{{ ns.a }}"
	}
	const twoDicts = "{% set ns = namespace(a={}, b={}) %}{% for i in range(80) %}{% set ns.a = {'a': ns.a, 'b': ns.a} %}{% set ns.b = {'a': ns.b, 'b': ns.b} %}{% endfor %}"
	const big = "{% set s = 'x' * 60000000 %}"
	for _, c := range []struct{ name, src, want string }{
		{"runaway loop", "{% for i in range(2000) %}{% for j in range(2000) %}{% endfor %}{% endfor %}", "1:30: more than 1000000 loop iterations"},
		{"self-referencing namespace", "{% set ns = namespace() %}{% set ns.self = ns %}{{ ns }}{{ ns | tojson }}", "not JSON serializable"},
		{"huge repetition", "{{ 'x' * 100000000000 }}", "1:8: string longer than 67108864 bytes"},
		{"list doubled by +", doubling("[1]", "ns.a + ns.a"), "list longer than 1000000 items"},
		{"string doubled by +", doubling("'x'", "ns.a + ns.a"), "string longer than 67108864 bytes"},
		{"string doubled by ~", doubling("'x'", "ns.a ~ ns.a"), "string longer than 67108864 bytes"},
		{"list doubled by *", doubling("[1]", "ns.a * 2"), "list longer than 1000000 items"},
		{"string squared by replace", doubling("'xx'", "ns.a|replace('x', ns.a)"), "filter replace: string longer than 67108864 bytes"},
		{"string squared by .replace", doubling("'xx'", "ns.a.replace('x', ns.a)"), "replace: string longer than 67108864 bytes"},
		{"shared dict printed", doubling("{}", "{'a': ns.a, 'b': ns.a}"), "the text of a dict is longer than 67108864 bytes"},
		{"shared list printed by |string", doubling("[]", "[ns.a, ns.a]") + "{{ ns.a|string }}", "the text of a list is longer than 67108864 bytes"},
		{"shared dict to JSON", "{% set ns = namespace(a={}) %}{% for i in range(80) %}{% set ns.a = {'a': ns.a, 'b': ns.a} %}{% endfor %}{{ ns.a|tojson }}", "tojson: text longer than 67108864 bytes"},
		{"shared dicts compared", twoDicts + "{{ ns.a == ns.b }}", "works through more than 256 MiB"},
		{"shared dicts searched", twoDicts + "{{ ns.a in [ns.b] }}", "works through more than 256 MiB"},
		{"big string copied in a loop", big + "{% for i in range(1000000) %}{% set t = s ~ '' %}{% endfor %}", "works through more than 256 MiB"},
		{"big string indexed in a loop", big + "{% for i in range(1000000) %}{% set t = s[5] %}{% endfor %}", "works through more than 256 MiB"},
		{"big string searched in a loop", big + "{% for i in range(1000000) %}{% set t = s.find('y') %}{% endfor %}", "works through more than 256 MiB"},
		{"big string measured in a loop", big + "{% for i in range(1000000) %}{% set t = s|length %}{% endfor %}", "works through more than 256 MiB"},
		{"big string iterated", big + "{% for c in s %}{% endfor %}", "more than 1000000 characters cannot be iterated"},
		{"long list searched in a loop", "{% set l = range(1000000)|list %}{% for i in range(1000000) %}{% set t = 5 in l %}{% endfor %}", "works through more than 256 MiB"},
		{"split into too many items", "{{ (',' * 2000000).split(',') }}", "list longer than 1000000 items"},
		{"whitespace split into too many items", "{{ (' a' * 2000000).split() }}", "list longer than 1000000 items"},
		{"join too long", "{% set l = ['x' * 60000000, 'x' * 60000000] %}{{ l|join }}", "filter join: string longer than 67108864 bytes"},
		{"huge JSON indent", "{{ {'a': 1}|tojson(indent=100000000000) }}", "indent: string longer than 67108864 bytes"},
		{"power past 64 bits", "{{ 2 ** 100 }}", "1:6: integer overflow"},
		{"sum past 64 bits", "{{ 9223372036854775807 + 1 }}", "integer overflow"},
		{"difference past 64 bits", "{{ -9223372036854775807 - 2 }}", "integer overflow"},
		{"product past 64 bits", "{{ 4611686018427387904 * 2 }}", "integer overflow"},
		{"negated minimum", "{{ -(-9223372036854775807 - 1) }}", "integer overflow"},
		{"minimum floor-divided by -1", "{{ (-9223372036854775807 - 1) // -1 }}", "integer overflow"},
		{"abs of the minimum", "{{ (-9223372036854775807 - 1)|abs }}", "integer overflow"},
		{"float past 64 bits to int", "{{ 1e300|int }}", "integer overflow"},
	} {
		tmpl, err := Parse(c.src)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if out, err := tmpl.Render(nil, false, nil); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %.40q, %v; want an error with %q", c.name, out, err, c.want)
		}
	}
}

// TestLimitsKeepPython: the bounded forms of range, slicing, indexing, splitting, replacing
// and integer arithmetic give Python's results at their edges.
func TestLimitsKeepPython(t *testing.T) {
	for src, want := range map[string]string{
		"{{ range(9223372036854775806, 9223372036854775807, 5)|list }}":                                                              "[9223372036854775806]",
		"{{ range(-9223372036854775807 - 1, 9223372036854775807, 4611686018427387904)|list }}":                                       "[-9223372036854775808, -4611686018427387904, 0, 4611686018427387904]",
		"{{ range(5, -5, -3)|list }}{{ range(3, 3)|list }}{{ range(0)|list }}":                                                       "[5, 2, -1, -4][][]",
		"{{ 'abcdef'[::-2] }} {{ 'héllo'[1:3] }} {{ 'héllo'[-4] }} {{ 'abc'[5:1:-1] }}":                                              "fdb él é c",
		"{{ [1, 2, 3, 4][1:] }} {{ (1, 2, 3)[::-1] }} {{ [1, 2][5:] }} {{ [1, 2, 3][::9223372036854775807] }}":                       "[2, 3, 4] (3, 2, 1) [] [1]",
		"{{ 'a,b,c'.split(',', 1) }} {{ ' a  b '.split() }} {{ 'xax'.replace('x', 'yy', 1) }} {{ 'ab'.replace('', '-') }}":           "['a', 'b,c'] ['a', 'b'] yyax -a-b-",
		"{{ 2 ** 62 }} {{ (-2) ** 63 }} {{ -9223372036854775807 - 1 }} {{ 3037000499 * 3037000499 }} {{ 1 ** 9223372036854775807 }}": "4611686018427387904 -9223372036854775808 -9223372036854775808 9223372030926249001 1",
		"{{ -7 // 2 }} {{ 7 % -3 }} {{ 2.9|int }} {{ -2.9|int }} {{ 'nan'|float|int }}":                                              "-4 -2 2 -2 0",
		"{{ [[1], {'a': (2,)}] == [[1], {'a': (2,)}] }} {{ 'b' in ['a', 'b'] }} {{ ['a', 'b']|join('-') }}":                          "True True a-b",
	} {
		tmpl, err := Parse(src)
		if err != nil {
			t.Fatalf("%s: %v", src, err)
		}
		if got, err := tmpl.Render(nil, false, nil); err != nil || got != want {
			t.Errorf("%s: got %q, %v; want %q", src, got, err, want)
		}
	}
}

// TestLargestRequestRenders: conversations as large as xmix serve reads (8 MiB of body)
// render under every real template within the work budget: four messages of 2 MiB, and
// 100,000 short ones (a template that reads messages|length in its loop over the messages
// must not pay for the list each time).
func TestLargestRequestRenders(t *testing.T) {
	content := strings.Repeat("The quick brown fox jumps over the lazy dog. ", 8<<20/45/4)
	long := []Message{{"system", content}, {"user", content}, {"assistant", content}, {"user", content}}
	many := make([]Message, 100_000)
	for i := range many {
		many[i] = Message{[]string{"user", "assistant"}[i%2], "hi"}
	}
	for _, name := range []string{"llama3_1", "llama3_2", "qwen3"} {
		tmpl := loadTemplate(t, name)
		for _, msgs := range [][]Message{long, many} {
			out, err := tmpl.Render(msgs, true, map[string]any{"date_string": "26 Jul 2024", "bos_token": "<s>"})
			if text := len(msgs) * len(msgs[0].Content); err != nil || len(out) < text {
				t.Errorf("%s, %d messages: %d bytes, %v", name, len(msgs), len(out), err)
			}
		}
	}
}

func FuzzParse(f *testing.F) {
	for _, name := range []string{"llama3_1", "qwen3"} {
		data, err := os.ReadFile("testdata/" + name + "_tokenizer_config.json")
		if err != nil {
			f.Fatal(err)
		}
		var cfg struct {
			ChatTemplate string `json:"chat_template"`
		}
		if err := json.Unmarshal(data, &cfg); err != nil {
			f.Fatal(err)
		}
		f.Add(cfg.ChatTemplate)
	}
	src, err := os.ReadFile("testdata/llama3_2.jinja")
	if err != nil {
		f.Fatal(err)
	}
	f.Add(string(src))
	for _, s := range []string{"{{ a[1:2:3] | f(x=1) is not defined }}", "{% set ns.a, b %}", "{{ {'a': [1, (2,)]} }}", "{#", "{%- if -%}", "{{ 'a\\u00e9' }}"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, src string) {
		tmpl, err := Parse(src)
		if err != nil {
			var te *Error
			if !errors.As(err, &te) || te.Line < 1 || te.Col < 1 {
				t.Fatalf("error without position: %v", err)
			}
			return
		}
		// Rendering must not panic either; errors are fine.
		_, _ = tmpl.Render([]Message{{Role: "user", Content: "hi"}}, true, map[string]any{"bos_token": "<s>"})
	})
}

// TestReadConfig: add_bos_token is read when given (Qwen3: false), nil when not (Llama 3.1,
// whose tokenizer.json post-processor adds the BOS); a config without a chat template
// (a base model) is read without error.
func TestReadConfig(t *testing.T) {
	for name, want := range map[string]string{"llama3_1": "<nil>", "qwen3": "false"} {
		data, err := os.ReadFile("testdata/" + name + "_tokenizer_config.json")
		if err != nil {
			t.Fatal(err)
		}
		c, err := ReadConfig(data)
		if err != nil {
			t.Fatal(err)
		}
		got := "<nil>"
		if c.AddBOS != nil {
			got = fmt.Sprint(*c.AddBOS)
		}
		if got != want || c.Template == "" {
			t.Errorf("%s: add_bos_token %s (want %s), template of %d bytes", name, got, want, len(c.Template))
		}
	}
	c, err := ReadConfig([]byte(`{"bos_token": "<s>", "add_bos_token": true}`))
	if err != nil || c.Template != "" || c.BOS != "<s>" || c.AddBOS == nil || !*c.AddBOS {
		t.Errorf("base model config: %+v, %v", c, err)
	}
}
