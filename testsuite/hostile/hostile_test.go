// Package hostile runs the hostile inputs of issue 13 against the real binaries: the CLIs
// with bad flags, special files and damaged specs, and a running `xmix serve` with bad
// requests. TestHostileInputs checks what each now does (exit code or HTTP status, the
// message, no panic, no hang, memory bounded, the server serving on). With -table it instead
// records what a given build does, for testsuite/ROBUSTNESS.md:
//
//	go test ./testsuite/hostile -run TestHostileInputs -args -bin DIR -table OUT.md
//
// where DIR holds xmix and xmixc binaries (another build, e.g. before a fix); without -bin
// the binaries are built from this tree.
package hostile

import (
	"bytes"
	"context"
	"encoding/binary"
	"flag"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"xmix/safetensors"
	"xmix/specs"
)

var (
	binDir  = flag.String("bin", "", "directory of the xmix and xmixc binaries to run (default: build this tree)")
	tableTo = flag.String("table", "", "write the observed behaviour as a markdown table here instead of checking it")
)

// memLimit is the address-space limit of every process run (ulimit -v): a case that
// allocates without bound ends there (a fatal out-of-memory) instead of taking the machine.
const memLimit = 4 << 30

// caseTimeout ends a case that hangs.
const caseTimeout = 20 * time.Second

// cliCase is one command line: its arguments after the binary ({d} is the fixtures
// directory), and what it must now do.
type cliCase struct {
	name string
	bin  string // xmix or xmixc
	args string
	code int    // exit code
	want string // in stderr (or stdout)
}

// httpCase is one request body to POST to /v1/completions, repeated n times (1 if 0).
type httpCase struct {
	name string
	body string
	n    int
	code int
	want string
}

var cliCases = []cliCase{
	{"run -n 9223372036854775807", "xmix", "run -q -n 9223372036854775807", 1, "--max-tokens: prompt (37 tokens, BOS included) + max_tokens (9223372036854775807)"},
	{"run -n 10000000000", "xmix", "run -q -n 10000000000", 1, "--max-tokens: prompt (37 tokens, BOS included) + max_tokens (10000000000)"},
	{"run -n -1", "xmix", "run -q -n -1", 1, "--max-tokens: max_tokens -1: must be at least 1"},
	{"run --temperature NaN", "xmix", "run -q --temperature NaN", 1, "--temperature: temperature NaN: want a finite number >= 0"},
	{"run --temperature -1", "xmix", "run -q --temperature -1", 1, "--temperature: temperature -1"},
	{"run --top-p 2", "xmix", "run -q --top-p 2", 1, "--top-p: top_p 2: want a number in [0, 1]"},
	{"run --set alpha=NaN", "xmix", "run -q --apps tiny-steer --set tiny-steer.op0.alpha=NaN", 1, `--set: override "tiny-steer.op0.alpha": NaN is not a finite number`},
	{"run --set alpha=+Inf", "xmix", "run -q --apps tiny-steer --set tiny-steer.op0.alpha=+Inf", 1, `+Inf is not a finite number`},
	{"run --set alpha=1e38", "xmix", "run -q --apps tiny-steer --set tiny-steer.op0.alpha=1e38", 1, "1e+38 times the app's param happy overflows float32 (at most 3.89e+18 in magnitude)"},
	{"run --set alpha=1e39", "xmix", "run -q --apps tiny-steer --set tiny-steer.op0.alpha=1e39", 1, "1e39 is out of float32 range"},
	{"run: logits overflow at run time", "xmix", "run -q {d}/blowup.xmb -p Once -n 8 --apps blowup", 1, "request 0: generation step 3: the logits at position 7 are not finite"},
	{"run /dev/zero (bundle)", "xmix", "run -q /dev/zero -p x", 1, "/dev/zero is a character device, not a regular file (a bundle is read from a file)"},
	{"run FIFO (bundle)", "xmix", "run -q {d}/fifo -p x", 1, "fifo is a named pipe (FIFO), not a regular file (a bundle"},
	{"run DIR (bundle)", "xmix", "run -q {d} -p x", 1, "is a directory, not a regular file"},
	{"tokenize FIFO (tokenizer.json)", "xmix", "tokenize {d}/fifo.json x", 1, "fifo.json is a named pipe (FIFO), not a regular file (a tokenizer is read"},
	{"build /dev/zero (model spec)", "xmixc", "build -q /dev/zero -o {d}/o.xmb", 1, "model spec: /dev/zero is a character device, not a regular file"},
	{"build FIFO (model spec)", "xmixc", "build -q {d}/fifo -o {d}/o.xmb", 1, "model spec: " + "{d}/fifo is a named pipe (FIFO)"},
	{"build FIFO (app spec)", "xmixc", "build -q {d}/tiny.yaml {d}/fifo -o {d}/o.xmb", 1, "app spec: {d}/fifo is a named pipe (FIFO)"},
	{"build FIFO (params file)", "xmixc", "build -q {d}/tiny.yaml {d}/fifo-params.yaml -o {d}/o.xmb", 1, "cannot read params file: {d}/fifo is a named pipe (FIFO), not a regular file (a params file"},
	{"build FIFO (tokenizer file)", "xmixc", "build -q {d}/fifo-tok.yaml -o {d}/o.xmb", 1, "tokenizer: {d}/fifo is a named pipe (FIFO), not a regular file (a tokenizer"},
	{"build FIFO (custom-kernel PTX)", "xmixc", "build -q {d}/tiny.yaml {d}/fifo-ptx.yaml -o {d}/o.xmb", 1, "kernels.k.ptx: {d}/k.ptx is a named pipe (FIFO), not a regular file (a PTX file"},
	{"build dims.layers: 2000000000", "xmixc", "build -q {d}/layers.yaml -o {d}/o.xmb", 1, "layers.yaml:3:48: dims.layers: 2000000000 is more than this compiler supports (at most 4096)"},
	{"build dims.hidden: 2000000000", "xmixc", "build -q {d}/hidden.yaml -o {d}/o.xmb", 1, "hidden.yaml:3:16: dims.hidden: 2000000000 is more than this compiler supports (at most 32768"},
	{"build dims.vocab: 2000000000", "xmixc", "build -q {d}/vocab.yaml -o {d}/o.xmb", 1, "dims.vocab: 2000000000 is more than this compiler supports (at most 16777215"},
	{"build serving.max_seq_len: 2000000000", "xmixc", "build -q {d}/seqlen.yaml -o {d}/o.xmb", 1, "serving.max_seq_len: 2000000000 is more than this compiler supports (at most 1048576)"},
	{"build NaN in a steering vector", "xmixc", "build -q {d}/tiny.yaml {d}/nan-vector.yaml -o {d}/o.xmb", 1, "bad.safetensors: tensor v: value 3 is NaN (every value of a param must be finite)"},
	{"build +Inf in a steering vector", "xmixc", "build -q {d}/tiny.yaml {d}/inf-vector.yaml -o {d}/o.xmb", 1, "bad.safetensors: tensor inf: value 0 is +Inf"},
	{"build NaN in a probe bias", "xmixc", "build -q {d}/tiny.yaml {d}/nan-bias.yaml -o {d}/o.xmb", 1, "bad.safetensors: tensor b: value 0 is NaN"},
	{"build alpha: 1e400", "xmixc", "build -q {d}/tiny.yaml {d}/alpha-1e400.yaml -o {d}/o.xmb", 1, "ops[0].write.args.alpha: 1e400 is out of float32 range"},
	{"build alpha: 1e39", "xmixc", "build -q {d}/tiny.yaml {d}/alpha-1e39.yaml -o {d}/o.xmb", 1, "ops[0].write.args.alpha: 1e39 is out of float32 range"},
	{"build alpha: 1e38 x vector", "xmixc", "build -q {d}/tiny.yaml {d}/alpha-1e38.yaml -o {d}/o.xmb", 1, "alpha 1e+38 times param happy (largest value"},
	{"build -o DIR", "xmixc", "build -q {d}/tiny.yaml -o {d}/outdir", 1, "-o {d}/outdir is a directory: give the bundle's file name"},
}

var httpCases = []httpCase{
	{"max_tokens 9223372036854775807", `{"prompt": "hi", "max_tokens": 9223372036854775807}`, 0, 400, "max_tokens (9223372036854775807)"},
	{"max_tokens 1e10", `{"prompt": "hi", "max_tokens": 10000000000}`, 0, 400, "max_tokens (10000000000)"},
	{"max_tokens 3e8, ten times", `{"prompt": "hi", "max_tokens": 300000000}`, 10, 400, "max_tokens (300000000)"},
	{"body null", `null`, 0, 400, "the request body is null; it must be a JSON object"},
	{"body []", `[]`, 0, 400, "the request body is a JSON array; it must be an object"},
	{"body \"x\"", `"x"`, 0, 400, "the request body is a JSON string; it must be an object"},
	{"temperature -1", `{"prompt": "hi", "temperature": -1}`, 0, 400, "temperature -1"},
	{"top_p 2", `{"prompt": "hi", "top_p": 2}`, 0, 400, "top_p 2"},
	{"set alpha 3e38", `{"prompt": "hi", "xmix": {"apps": ["tiny-steer"], "set": {"tiny-steer.op0.alpha": 3e38}}}`, 0, 400, "3e+38 times the app's param happy overflows float32"},
	{"set alpha 1e38", `{"prompt": "hi", "xmix": {"apps": ["tiny-steer"], "set": {"tiny-steer.op0.alpha": 1e38}}}`, 0, 400, "1e+38 times the app's param happy overflows float32"},
	{"body of 9 MB", `{"prompt": "` + strings.Repeat("a", 9<<20) + `"}`, 0, 413, "the request body is larger than"},
}

// TestHostileInputs: see the package comment.
func TestHostileInputs(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the binaries")
	}
	bins := *binDir
	if bins == "" {
		bins = t.TempDir()
		build := exec.Command("go", "build", "-o", bins+"/", "xmix/cmd/xmix", "xmix/cmd/xmixc")
		if out, err := build.CombinedOutput(); err != nil {
			t.Fatalf("go build: %v\n%s", err, out)
		}
	}
	d := fixtures(t, bins)
	var rows []string
	record := func(name, got string) {
		rows = append(rows, fmt.Sprintf("| %s | %s |", name, got))
	}
	for _, c := range cliCases {
		args := strings.Fields(strings.ReplaceAll(c.args, "{d}", d))
		r := run(t, filepath.Join(bins, c.bin), args...)
		want := strings.ReplaceAll(c.want, "{d}", d)
		record(c.bin+" "+c.name, r.describe(d))
		if *tableTo == "" && (r.code != c.code || !strings.Contains(r.out, want) || r.crashed()) {
			t.Errorf("%s %s: %s\nwant exit %d and %q", c.bin, c.name, r.describe(d), c.code, want)
		}
	}
	srv := startServer(t, bins, d)
	for _, c := range httpCases {
		got := srv.post(t, c)
		record("serve: "+c.name, got)
	}
	// A client that sends half a body and waits.
	if *tableTo != "" {
		record("serve: half a body, then silence", srv.halfBody(t, 75*time.Second))
	}
	after := srv.rss()
	code, body := srv.postBody(`{"prompt": "Once", "max_tokens": 8}`)
	record("serve: a normal request after all of the above", fmt.Sprintf("%d, %d bytes; server RSS after the hostile set %.0f MB (%.0f MB before it)", code, len(body), float64(after)/1e6, float64(srv.start)/1e6))
	if *tableTo == "" {
		if code != 200 {
			t.Errorf("a normal request after the hostile set: %d %s", code, body)
		}
		if after > srv.start+512<<20 {
			t.Errorf("server RSS %d MB after the hostile set, %d MB before", after>>20, srv.start>>20)
		}
	}
	if *tableTo != "" {
		out := "| case | observed |\n|---|---|\n" + strings.Join(rows, "\n") + "\n"
		if err := os.WriteFile(*tableTo, []byte(out), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// result is how one process ended.
type result struct {
	code    int // exit code; -1: killed (signal), -2: timed out
	out     string
	elapsed time.Duration
}

func (r result) crashed() bool {
	return r.code == 2 || r.code < 0 || strings.Contains(r.out, "panic:") || strings.Contains(r.out, "fatal error:")
}

// describe is the table cell: how it ended and its first line of error.
func (r result) describe(d string) string {
	line := ""
	for _, l := range strings.Split(r.out, "\n") {
		l = strings.TrimSpace(l)
		if strings.HasPrefix(l, "Error:") || strings.HasPrefix(l, "panic:") || strings.HasPrefix(l, "fatal error:") {
			line = l
			break
		}
	}
	if line == "" {
		line = strings.TrimSpace(firstLines(r.out, 2))
	}
	line = strings.ReplaceAll(line, d, "D")
	if len(line) > 160 {
		line = line[:160] + "..."
	}
	line = strings.ReplaceAll(line, "|", "\\|")
	line = strings.ReplaceAll(line, "\n", " / ")
	switch r.code {
	case -2:
		return fmt.Sprintf("**hung**: killed after %s", caseTimeout)
	case -1:
		return fmt.Sprintf("**killed** (%s): %s", r.elapsed.Round(time.Millisecond), line)
	}
	return fmt.Sprintf("exit %d (%s): %s", r.code, r.elapsed.Round(time.Millisecond), line)
}

func firstLines(s string, n int) string {
	lines := strings.SplitN(s, "\n", n+1)
	return strings.Join(lines[:min(n, len(lines))], "\n")
}

// run runs bin with args under the memory limit and the case timeout.
func run(t *testing.T, bin string, args ...string) result {
	ctx, cancel := context.WithTimeout(context.Background(), caseTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", append([]string{"-c", fmt.Sprintf(`ulimit -v %d; exec "$@"`, memLimit>>10), "run", bin}, args...)...)
	cmd.Env = append(os.Environ(), "GOTRACEBACK=single")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	start := time.Now()
	err := cmd.Run()
	r := result{out: out.String(), elapsed: time.Since(start)}
	switch e := err.(type) {
	case nil:
	case *exec.ExitError:
		r.code = e.ExitCode()
		if ctx.Err() != nil {
			r.code = -2
		}
	default:
		t.Fatalf("%s: %v", bin, err)
	}
	return r
}

// fixtures writes the specs, files and bundles the cases name, and returns their directory.
func fixtures(t *testing.T, bins string) string {
	d := t.TempDir()
	if err := specs.Extract(d); err != nil {
		t.Fatal(err)
	}
	tiny := filepath.Join(d, specs.Default.Model)
	write := func(name, text string) {
		if err := os.WriteFile(filepath.Join(d, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{"fifo", "fifo.json", "k.ptx"} {
		if err := syscall.Mkfifo(filepath.Join(d, name), 0o644); err != nil {
			t.Skipf("no FIFOs: %v", err)
		}
	}
	if err := os.Mkdir(filepath.Join(d, "outdir"), 0o755); err != nil {
		t.Fatal(err)
	}
	// Model specs beside models/ so that their relative weights path holds.
	dims := "dims: {hidden: 256, intermediate: 768, layers: 6, heads: 8, kv_heads: 2, head_dim: 32,\n       vocab: 258, tie_embeddings: true}\n"
	base := "model: tiny\nfamily: llama\n" + dims + "weights: models/tiny/model.safetensors\ntokenizer: bytes\nbos: 256\neos: [257]\nserving: {decode_buckets: [1, 2, 4, 8], prefill_chunks: [64], max_seq_len: 512, max_seqs: 8}\n"
	write("tiny.yaml", base)
	write("layers.yaml", strings.Replace(base, "layers: 6", "layers: 2000000000", 1))
	write("hidden.yaml", strings.Replace(base, "{hidden: 256", "{hidden: 2000000000", 1))
	write("vocab.yaml", strings.Replace(base, "vocab: 258", "vocab: 2000000000", 1))
	write("seqlen.yaml", strings.Replace(base, "max_seq_len: 512", "max_seq_len: 2000000000", 1))
	write("fifo-tok.yaml", strings.Replace(base, "tokenizer: bytes", "tokenizer: {hf: fifo}", 1))
	write("fifo-params.yaml", "app: p\nparams: {v: {file: fifo, tensor: v}}\nops:\n  - write: {at: {layers: [1], hook: resid_post}, kernel: steer_add, args: {vector: v}}\n")
	write("fifo-ptx.yaml", "app: c\nkernels:\n  k: {ptx: k.ptx, entry: k, signature: [\"x u64\", \"stride u32\", \"offset u32\", \"width u32\", \"ctl_mask u64\", \"bit u32\"]}\nops:\n  - write: {at: {layers: [2], hook: resid_post}, kernel: custom:k}\n")
	// Params files with NaN and infinities.
	vec := make([]float32, 256)
	for i := range vec {
		vec[i] = 0.01
	}
	nanVec := append([]float32(nil), vec...)
	nanVec[3] = float32(math.NaN())
	infVec := append([]float32(nil), vec...)
	infVec[0] = float32(math.Inf(1))
	writeTensors(t, filepath.Join(d, "bad.safetensors"), map[string][]float32{"v": nanVec, "inf": infVec, "w": vec, "b": {float32(math.NaN())}})
	steer := func(param, tensor, alpha string) string {
		return fmt.Sprintf("app: s\nparams: {%s: {file: %s, tensor: %s}}\nops:\n  - write: {at: {layers: [3], hook: resid_post}, kernel: steer_add, args: {vector: %s, alpha: %s}}\n", param, "bad.safetensors", tensor, param, alpha)
	}
	write("nan-vector.yaml", steer("v", "v", "1"))
	write("inf-vector.yaml", steer("v", "inf", "1"))
	write("nan-bias.yaml", "app: p\nparams: {w: {file: bad.safetensors, tensor: w}, b: {file: bad.safetensors, tensor: b}}\nbuffers: {h: {shape: [1], export: true}}\nops:\n  - read: {at: {layers: [3], hook: resid_post}, kernel: probe_linear, args: {w: w, bias: b}, into: h}\n")
	write("alpha-1e400.yaml", "app: s\nparams: {happy: {file: models/tiny/vectors.safetensors, tensor: happy_dir}}\nops:\n  - write: {at: {layers: [3], hook: resid_post}, kernel: steer_add, args: {vector: happy, alpha: 1e400}}\n")
	write("alpha-1e39.yaml", "app: s\nparams: {happy: {file: models/tiny/vectors.safetensors, tensor: happy_dir}}\nops:\n  - write: {at: {layers: [3], hook: resid_post}, kernel: steer_add, args: {vector: happy, alpha: 1e39}}\n")
	write("alpha-1e38.yaml", "app: s\nparams: {happy: {file: models/tiny/vectors.safetensors, tensor: happy_dir}}\nops:\n  - write: {at: {layers: [3], hook: resid_post}, kernel: steer_add, args: {vector: happy, alpha: 1e38}}\n")
	write("blowup.yaml", "app: blowup\nops:\n  - write: {at: {hook: logits}, kernel: scale, args: {alpha: 1e30}, when: {steps: {from: 2}}}\n  - write: {at: {hook: logits}, kernel: scale, args: {alpha: 1e30}, when: {steps: {from: 2}}}\n")
	for _, b := range []struct {
		out  string
		apps []string
	}{
		{"tiny.xmb", []string{specs.Default.Steer, specs.Default.Probe}},
		{"blowup.xmb", []string{"blowup.yaml"}},
	} {
		args := []string{"build", "-q", "--embed-weights", tiny}
		for _, a := range b.apps {
			args = append(args, filepath.Join(d, a))
		}
		if r := run(t, filepath.Join(bins, "xmixc"), append(args, "-o", filepath.Join(d, b.out))...); r.code != 0 {
			t.Fatalf("building %s: %s", b.out, r.out)
		}
	}
	return d
}

func writeTensors(t *testing.T, path string, tensors map[string][]float32) {
	var ts []safetensors.Tensor
	for name, v := range tensors {
		var b []byte
		for _, x := range v {
			b = binary.LittleEndian.AppendUint32(b, math.Float32bits(x))
		}
		ts = append(ts, safetensors.Tensor{Name: name, Dtype: "F32", Shape: []int{len(v)}, Data: b})
	}
	var out bytes.Buffer
	if err := safetensors.Write(&out, ts, nil); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, out.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}

// server is a running `xmix serve` of the fixtures' tiny.xmb, restarted when a case kills it.
type server struct {
	bins, d string
	cmd     *exec.Cmd
	out     *bytes.Buffer
	addr    string
	start   int64 // RSS once it serves
}

func startServer(t *testing.T, bins, d string) *server {
	s := &server{bins: bins, d: d}
	s.launch(t)
	t.Cleanup(func() { s.stop() })
	return s
}

func (s *server) launch(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s.addr = ln.Addr().String()
	ln.Close()
	s.out = &bytes.Buffer{}
	s.cmd = exec.Command("bash", "-c", fmt.Sprintf(`ulimit -v %d; exec "$@"`, memLimit>>10), "serve",
		filepath.Join(s.bins, "xmix"), "serve", filepath.Join(s.d, "tiny.xmb"), "--backend", "cpu", "-q", "--addr", s.addr)
	s.cmd.Stdout, s.cmd.Stderr = s.out, s.out
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if resp, err := http.Get("http://" + s.addr + "/healthz"); err == nil {
			resp.Body.Close()
			if code, _ := s.postBody(`{"prompt": "warm", "max_tokens": 4}`); code == 200 {
				s.start = s.rss()
				return
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("xmix serve did not come up:\n%s", s.out)
}

func (s *server) alive() bool {
	return s.cmd.ProcessState == nil && syscall.Kill(s.cmd.Process.Pid, 0) == nil && s.ping()
}

func (s *server) ping() bool {
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get("http://" + s.addr + "/healthz")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return true
}

func (s *server) stop() {
	if s.cmd != nil && s.cmd.Process != nil {
		s.cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { s.cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			s.cmd.Process.Kill()
			<-done
		}
	}
}

// rss is the server's resident set in bytes.
func (s *server) rss() int64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", s.cmd.Process.Pid))
	if err != nil {
		return 0
	}
	m := regexp.MustCompile(`VmRSS:\s+(\d+) kB`).FindSubmatch(data)
	if m == nil {
		return 0
	}
	kb, _ := strconv.ParseInt(string(m[1]), 10, 64)
	return kb << 10
}

func (s *server) postBody(body string) (int, string) {
	c := http.Client{Timeout: caseTimeout}
	resp, err := c.Post("http://"+s.addr+"/v1/completions", "application/json", strings.NewReader(body))
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(data)
}

// post sends c and describes what happened; a server that died is described and restarted.
func (s *server) post(t *testing.T, c httpCase) string {
	n := max(1, c.n)
	var code int
	var body string
	start := time.Now()
	for range n {
		code, body = s.postBody(c.body)
		if code == 0 {
			break
		}
	}
	el := time.Since(start).Round(time.Millisecond)
	if !s.alive() {
		s.cmd.Wait()
		died := firstMatch(s.out.String(), `(?m)^(panic: .*|fatal error: .*)$`)
		s.launch(t)
		return fmt.Sprintf("**server died** (%s): %s", el, died)
	}
	body = strings.TrimSpace(body)
	if len(body) > 160 {
		body = body[:160] + "..."
	}
	desc := fmt.Sprintf("%d (%s): %s", code, el, strings.ReplaceAll(body, "|", "\\|"))
	if n > 1 {
		desc += fmt.Sprintf("; server RSS %.0f MB", float64(s.rss())/1e6)
	}
	if *tableTo == "" && (code != c.code || !strings.Contains(body, c.want)) {
		t.Errorf("serve %s: %s\nwant %d and %q", c.name, desc, c.code, c.want)
	}
	return desc
}

func firstMatch(s, re string) string {
	if m := regexp.MustCompile(re).FindString(s); m != "" {
		return m
	}
	return "(no message)"
}

// halfBody sends a request whose body stops halfway and says how long the server keeps
// the connection open, up to wait.
func (s *server) halfBody(t *testing.T, wait time.Duration) string {
	conn, err := net.Dial("tcp", s.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"prompt\": ")
	start := time.Now()
	conn.SetReadDeadline(start.Add(wait))
	reply, err := io.ReadAll(conn)
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		return fmt.Sprintf("**connection held open** (still open after %s)", wait)
	}
	return fmt.Sprintf("closed after %s (%q)", time.Since(start).Round(time.Second), firstLines(string(reply), 1))
}
