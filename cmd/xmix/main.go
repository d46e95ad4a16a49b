// Command xmix runs xmix bundles: batched generation with MI apps switched per request.
package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"xmix/bundle"
	"xmix/compile"
	"xmix/loader"
	"xmix/loader/cpu"
	"xmix/loader/cuda"
	"xmix/serve"
	"xmix/specs"
)

// started is when the process started (near enough: when this package was initialised),
// the zero of `xmix run`'s time to first token.
var started = time.Now()

func main() {
	if err := rootCmd().Execute(); err != nil {
		os.Exit(1)
	}
}

func rootCmd() *cobra.Command {
	root := &cobra.Command{
		Version: compile.Version(),
		Use:     "xmix",
		Short:   "Run LLM bundles with mechanistic-interpretability apps in the decode loop",
		Long: `xmix runs .xmb bundles built by xmixc. Every request names the apps it wants; apps
are switched per request inside one batch, without rebuilding anything.

With no bundle, 'xmix run' runs the embedded default model (a small Llama trained by this
project) with its two demo apps: a steering vector and a probe.`,
		SilenceUsage: true,
	}
	root.AddCommand(runCmd(), benchCmd(), tokenizeCmd(), logitsCmd(), infoCmd(), serveCmd(), tpWorkerCmd(), tuneGemmCmd())
	return root
}

type runFlags struct {
	prompts     []string
	apps        string
	maxTokens   int
	temperature float32
	topP        float32
	seed        uint64
	asJSON      bool
	backend     string
	gemm        string // who serves tensor-core GEMMs on cuda: auto, ptx, cublaslt
	gemmPicks   string // cuBLASLt's tuned algorithms: a file of xmix tune-gemm, none, or "" (the shipped table)
	guF32       bool   // cuda: cuBLASLt's gate/up GEMMs write f32 (cuda.Options.GuF32)
	ownThread   bool   // cuda: driver calls handed to the backend's own thread (cuda.Options.OwnThread)
	noSolo      bool   // cuda: templates' one-app node lists unused (cuda.Options.NoSolo)
	maxBatched  int    // token budget per step; 0: the bundle's
	loadReaders int    // goroutines reading weights into pinned staging on cuda; 0: default
	quiet       bool
	chat        bool
	sets        []string // app.scalar=value overrides for every prompt
	tpAddr      string   // rank 0 of a multi-process tensor-parallel group listens here (tpworker.go)
	tpTimeout   time.Duration
	trace       bool   // cuda: every kernel stamps the step trace (xmix bench --trace)
	loadProfile string // the Go CPU profile of the load goes here (--load-profile)
}

// overrides parses the --set flags into a request's scalar overrides; the engine checks the
// names against the bundle.
func (f runFlags) overrides() (map[string]float32, error) {
	if len(f.sets) == 0 {
		return nil, nil
	}
	m := map[string]float32{}
	for _, s := range f.sets {
		name, val, ok := strings.Cut(s, "=")
		if !ok || name == "" {
			return nil, fmt.Errorf("--set %q: want app.scalar=value, e.g. tiny-steer.op0.alpha=20", s)
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(val), 32)
		switch {
		case errors.Is(err, strconv.ErrRange):
			return nil, fmt.Errorf("--set %q: %s is out of float32 range (at most %.4g in magnitude)", s, val, math.MaxFloat32)
		case err != nil:
			return nil, fmt.Errorf("--set %q: %q is not a number", s, val)
		}
		m[strings.TrimSpace(name)] = float32(v)
	}
	return m, nil
}

func runCmd() *cobra.Command {
	var f runFlags
	c := &cobra.Command{
		Use:   "run [BUNDLE.xmb]",
		Short: "Generate text for one or more prompts (no bundle: the embedded default demo)",
		Example: `  xmix run
  xmix run tiny.xmb --prompt "Once upon a time" --prompt "The old man" --apps tiny-steer
  xmix run tiny.xmb --prompt "Hello" --temperature 0.8 --top-p 0.9 --seed 7 --json
  xmix run --apps tiny-steer --set tiny-steer.op0.alpha=20`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return runDefault(cmd.OutOrStdout(), f)
			}
			return runBundle(cmd.OutOrStdout(), args[0], f)
		},
	}
	c.Flags().StringArrayVarP(&f.prompts, "prompt", "p", nil, "prompt text (repeat for a batch)")
	c.Flags().StringVar(&f.apps, "apps", "", "comma-separated apps to enable for every prompt; app@N enables it for prompt N only (0-based)")
	c.Flags().IntVarP(&f.maxTokens, "max-tokens", "n", 64, "tokens to generate per prompt")
	c.Flags().Float32VarP(&f.temperature, "temperature", "t", 0, "sampling temperature (0 = greedy)")
	c.Flags().Float32Var(&f.topP, "top-p", 1, "nucleus sampling mass")
	c.Flags().Uint64Var(&f.seed, "seed", 0, "random seed for sampling")
	c.Flags().BoolVar(&f.asJSON, "json", false, "print results as JSON")
	f.addBackendFlags(c.Flags())
	c.Flags().BoolVar(&f.chat, "chat", false, "wrap each prompt as a user turn in the model's chat template")
	c.Flags().StringArrayVar(&f.sets, "set", nil, "override an app scalar for every prompt: app.scalar=value (repeatable; xmixc inspect lists the scalars)")
	return c
}

// addBackendFlags registers the flags every command that loads a bundle shares.
func (f *runFlags) addBackendFlags(fl *pflag.FlagSet) {
	fl.StringVar(&f.backend, "backend", "auto", "auto | cuda | cpu (auto: cuda when a GPU is present)")
	fl.StringVar(&f.gemm, "gemm", cuda.GemmAuto, "cuda: who serves the tensor-core GEMMs (batches of 8+ rows, prefill): auto (the bundle's copy-engine kernels where it carries one, cuBLASLt for the rest when it loads, else the bundle's PTX) | ptx | cublaslt; a bucket's gate/up fused with its activation (xmixc build --gated-tc-rows) is the bundle's kernel whichever")
	fl.StringVar(&f.gemmPicks, "gemm-picks", "", "cuda: cuBLASLt's algorithm per GEMM shape, a file `xmix tune-gemm` wrote, or none (the library's first choice everywhere); default: the table xmix ships, for the GPUs it was tuned on")
	fl.BoolVar(&f.guF32, "gu-f32", false, "cuda: a gate/up GEMM that cuBLASLt serves writes f32 for the gated activation after it, as before (for measuring); default: bf16, half the bytes written and read")
	fl.BoolVar(&f.noSolo, "no-app-solo", false, "cuda: a step whose rows enable one app runs the graph of every deployed app's ops, as before (for measuring); by default it runs that app's own graph (the bundle's solo node lists), so an app does not pay for the others deployed beside it")
	fl.BoolVar(&f.ownThread, "cuda-own-thread", false, "cuda: hand each step's driver calls to the backend's own locked thread and wait to be woken, as before (for measuring); by default they run on the thread of the goroutine that steps the engine, locked for the call with the CUDA context made current on it, which wakes no other thread: on an H100 the 8B's decode step 0.7-0.8% shorter, the 1B's 2.9-3.1% (testsuite/gpu/RESULTS.md, session 70)")
	fl.IntVar(&f.maxBatched, "max-batched-tokens", 0, "rows one step runs at most, decode and prompt rows together (vLLM's max_num_batched_tokens); 0: the bundle's serving.max_batched_tokens")
	fl.IntVar(&f.loadReaders, "load-readers", 0, "cuda: goroutines reading the checkpoint into pinned staging while earlier chunks are copied to the GPU (0: min(8, CPUs))")
	fl.StringVar(&f.loadProfile, "load-profile", "", "also write the host's Go CPU profile of the load (weights, kernels, graphs, engine) to this file, for `go tool pprof`: where the time before the first step goes")
	fl.BoolVarP(&f.quiet, "quiet", "q", false, "no progress output on stderr")
	f.addTPFlags(fl)
}

func (f runFlags) progress(format string, a ...any) {
	if !f.quiet {
		fmt.Fprintf(os.Stderr, format+"\n", a...)
	}
}

// session is a loaded bundle ready to generate.
type session struct {
	b   *bundle.Bundle
	be  loader.Backend
	eng *loader.Engine
	tok loader.Tokenizer
}

// openBackend loads b on the backend kind names: cuda, cpu, or auto (cuda when a driver
// and a GPU are present, else cpu), saying which it picked and why.
func openBackend(kind string, b *bundle.Bundle, w *loader.Weights, f runFlags) (loader.Backend, error) {
	switch f.gemm {
	case "", cuda.GemmAuto, cuda.GemmPTX, cuda.GemmCublasLt: // "": library callers that leave it unset
	default:
		return nil, fmt.Errorf("unknown --gemm %q: use auto, ptx or cublaslt", f.gemm)
	}
	if f.loadReaders < 0 || f.loadReaders > 256 {
		return nil, fmt.Errorf("--load-readers %d: give 1-256 reader goroutines, or 0 for the default", f.loadReaders)
	}
	picks, err := f.readGemmPicks()
	if err != nil {
		return nil, err
	}
	if f.tpAddr != "" {
		return openGroup(kind, b, w, f)
	}
	opts := cuda.Options{Progress: f.progress, Gemm: f.gemm, LoadReaders: f.loadReaders, GemmPicks: picks, Trace: f.trace, GuF32: f.guF32,
		OwnThread: f.ownThread, NoSolo: f.noSolo}
	switch kind {
	case "cpu":
		return cpu.New(b, w, f.progress)
	case "cuda":
		return cuda.New(b, w, opts)
	case "auto":
		dev, err := cuda.Probe()
		if err != nil {
			f.progress("backend: cpu, %d threads (no usable GPU: %v)", runtime.GOMAXPROCS(0), err)
			return cpu.New(b, w, f.progress)
		}
		f.progress("backend: cuda on %s", dev)
		return cuda.New(b, w, opts)
	}
	return nil, fmt.Errorf("unknown backend %q: use auto, cuda or cpu", kind)
}

// readGemmPicks reads --gemm-picks: nil for the shipped table, empty for none.
func (f runFlags) readGemmPicks() ([]cuda.GemmPick, error) {
	switch f.gemmPicks {
	case "":
		return nil, nil
	case "none":
		return []cuda.GemmPick{}, nil
	}
	picks, err := cuda.ReadGemmPicks(f.gemmPicks)
	if err != nil {
		return nil, fmt.Errorf("--gemm-picks: %w", err)
	}
	return picks, nil
}

// openFile reads the bundle at path and loads it, with weights resolved beside it.
func openFile(path string, f runFlags) (*session, error) {
	f.progress("loading %s", path)
	b, err := bundle.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return open(b, filepath.Dir(path), f)
}

// open loads b, with --load-profile's profile of it where asked.
func open(b *bundle.Bundle, baseDir string, f runFlags) (*session, error) {
	if f.maxBatched != 0 { // checked before gigabytes of weights are loaded
		if err := bundle.CheckMaxBatchedTokens(f.maxBatched, b.PrefillChunks(), b.Manifest.Model.MaxSeqs); err != nil {
			return nil, fmt.Errorf("--max-batched-tokens: %w", err)
		}
	}
	stop, err := startCPUProfile("--load-profile", f.loadProfile)
	if err != nil {
		return nil, err
	}
	s, err := load(b, baseDir, f)
	if err := errors.Join(err, stop()); err != nil {
		if s != nil {
			s.be.Close()
		}
		return nil, err
	}
	return s, nil
}

// load is open's work: the weights onto the backend, the engine and the tokenizer.
func load(b *bundle.Bundle, baseDir string, f runFlags) (*session, error) {
	start := time.Now()
	w, err := loader.OpenWeights(b, baseDir)
	if err != nil {
		return nil, err
	}
	defer w.Close()
	be, err := openBackend(f.backend, b, w, f)
	if err != nil {
		return nil, err
	}
	f.progress("%s: loaded in %.2fs", be.Name(), time.Since(start).Seconds())
	eng, err := loader.NewEngine(b, be)
	if err != nil {
		return nil, err
	}
	if f.maxBatched != 0 {
		if err := eng.SetMaxBatchedTokens(f.maxBatched); err != nil {
			return nil, fmt.Errorf("--max-batched-tokens: %w", err)
		}
	}
	tok, err := loader.NewTokenizer(b)
	if err != nil {
		return nil, err
	}
	return &session{b: b, be: be, eng: eng, tok: tok}, nil
}

// startCPUProfile starts the Go CPU profile into path (none when path is ""); stop ends it
// and closes the file. flag names the option in errors.
func startCPUProfile(flag, path string) (stop func() error, err error) {
	if path == "" {
		return func() error { return nil }, nil
	}
	if err := checkOutFile(path); err != nil {
		return nil, fmt.Errorf("%s %s: %w", flag, path, err)
	}
	fh, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", flag, err)
	}
	if err := pprof.StartCPUProfile(fh); err != nil {
		fh.Close()
		return nil, fmt.Errorf("%s %s: %w", flag, path, err)
	}
	return func() error {
		pprof.StopCPUProfile()
		if err := fh.Close(); err != nil {
			return fmt.Errorf("%s %s: %w", flag, path, err)
		}
		return nil
	}, nil
}

// checkOutFile says why path cannot take a results file: it is a folder, or its folder is
// missing or a file.
func checkOutFile(path string) error {
	if fi, err := os.Stat(path); err == nil && fi.IsDir() {
		return fmt.Errorf("a folder: give a file path")
	}
	dir := filepath.Dir(path)
	fi, err := os.Stat(dir)
	switch {
	case err != nil:
		return fmt.Errorf("its folder %s does not exist", dir)
	case !fi.IsDir():
		return fmt.Errorf("%s, where its folder should be, is a file", dir)
	}
	return nil
}

// appsFor parses --apps into per-prompt app lists.
func appsFor(spec string, n int) ([][]string, error) {
	out := make([][]string, n)
	if spec == "" {
		return out, nil
	}
	for _, item := range strings.Split(spec, ",") {
		name, idx, found := strings.Cut(strings.TrimSpace(item), "@")
		if !found {
			for i := range out {
				out[i] = append(out[i], name)
			}
			continue
		}
		k, err := strconv.Atoi(idx) // the whole index: "0@1" or "1x" is not 0 or 1
		if err != nil || k < 0 || k >= n {
			return nil, fmt.Errorf("--apps %q: prompt index %q is not in 0-%d", item, idx, n-1)
		}
		out[k] = append(out[k], name)
	}
	return out, nil
}

func runBundle(w io.Writer, path string, f runFlags) error {
	if len(f.prompts) == 0 {
		return fmt.Errorf("no prompt: add --prompt TEXT (repeat it for a batch)")
	}
	s, err := openFile(path, f)
	if err != nil {
		return err
	}
	defer s.be.Close()
	apps, err := appsFor(f.apps, len(f.prompts))
	if err != nil {
		return err
	}
	return s.generate(w, f, f.prompts, apps)
}

// runDefault builds the embedded default model with its demo apps and shows one prompt
// generated three ways in one batch: no app, the steering app, the probe.
func runDefault(w io.Writer, f runFlags) error {
	s, cleanup, err := openDefault(f)
	if cleanup != nil {
		defer cleanup()
	}
	if err != nil {
		return err
	}
	defer s.be.Close()
	prompts := f.prompts
	if len(prompts) == 0 {
		prompts = []string{"Tom walked home in the rain. He felt"}
	}
	var all []string
	var apps [][]string
	for _, p := range prompts {
		for _, a := range [][]string{nil, {"tiny-steer"}, {"tiny-probe"}} {
			all = append(all, p)
			apps = append(apps, a)
		}
	}
	if f.apps != "" {
		if apps, err = appsFor(f.apps, len(prompts)); err != nil {
			return err
		}
		all = prompts
	}
	return s.generate(w, f, all, apps)
}

// openDefault compiles the embedded default model with its two demo apps and loads it;
// cleanup removes the files it extracted.
func openDefault(f runFlags) (*session, func(), error) {
	dir, err := os.MkdirTemp("", "xmix-default-")
	if err != nil {
		return nil, nil, err
	}
	cleanup := func() { os.RemoveAll(dir) }
	if err := specs.Extract(dir); err != nil {
		return nil, cleanup, err
	}
	f.progress("compiling the embedded default model (tiny) with tiny-steer and tiny-probe")
	b, err := compile.Build(filepath.Join(dir, specs.Default.Model),
		[]string{filepath.Join(dir, specs.Default.Steer), filepath.Join(dir, specs.Default.Probe)},
		compile.Options{EmbedWeights: true})
	if err != nil {
		return nil, cleanup, err
	}
	s, err := open(b, dir, f)
	return s, cleanup, err
}

// jsonResult is one prompt's result under --json, in the server's vocabulary: its keys,
// finish reasons, usage and "xmix" object are those of a completion's response.
type jsonResult struct {
	Prompt string       `json:"prompt"`
	Apps   []string     `json:"apps"`
	Text   string       `json:"text"`
	Tokens []int        `json:"tokens"`
	Reason string       `json:"finish_reason"`
	Error  string       `json:"error,omitempty"` // why it ended early (finish_reason nonfinite or error)
	Usage  jsonUsage    `json:"usage"`
	Xmix   jsonXmix     `json:"xmix"`
	Rows   []loader.Row `json:"rows,omitempty"` // every forward row, prompt ones included
}

type jsonUsage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
}

type jsonXmix struct {
	Exports serve.Exports `json:"exports"` // per generated token
	Fired   loader.Fired  `json:"fired"`   // sites per op of each enabled app
}

func (s *session) generate(w io.Writer, f runFlags, prompts []string, apps [][]string) error {
	overrides, err := f.overrides()
	if err != nil {
		return err
	}
	reqs := make([]loader.Request, len(prompts))
	for i, p := range prompts {
		ids := s.tok.Encode(p)
		if f.chat {
			var err error
			if ids, err = chatPrompt(s.b.Manifest.Model, s.tok, p); err != nil {
				return err
			}
		}
		reqs[i] = loader.Request{Prompt: ids, Verbatim: f.chat, Apps: apps[i], MaxTokens: f.maxTokens,
			Temperature: f.temperature, TopP: f.topP, Seed: f.seed + uint64(i), Overrides: overrides}
		// The check the server makes, reported by the flag that set the field.
		if err := s.eng.Check(&reqs[i]); err != nil {
			var bad *loader.RequestError
			if errors.As(err, &bad) && requestFlags[bad.Field] != "" {
				if bad.Field == "prompt" || bad.Field == "apps" {
					return fmt.Errorf("%s (prompt %d): %w", requestFlags[bad.Field], i, err)
				}
				return fmt.Errorf("%s: %w", requestFlags[bad.Field], err)
			}
			return fmt.Errorf("prompt %d: %w", i, err)
		}
	}
	start := time.Now()
	res, genErr := s.eng.Generate(reqs)
	if res == nil {
		return genErr
	}
	el := time.Since(start)
	n := 0
	for _, r := range res {
		n += len(r.Tokens)
	}
	st := s.eng.Stats
	f.progress("generated %d tokens for %d prompts in %.2fs (%.0f tok/s; %d steps: %d prefill, %d decode)",
		n, len(prompts), el.Seconds(), float64(n)/el.Seconds(), st.Steps, st.PrefillSteps, st.DecodeSteps)
	if !st.FirstToken.IsZero() {
		f.progress("first token %.2f s after start (prompts submitted at %.2f s)", st.FirstToken.Sub(started).Seconds(), start.Sub(started).Seconds())
	}
	if f.asJSON {
		out := make([]jsonResult, len(res))
		for i, r := range res {
			out[i] = jsonResult{Prompt: prompts[i], Apps: apps[i], Text: s.tok.Decode(r.Tokens), Tokens: r.Tokens, Reason: r.Reason, Error: r.Error,
				Usage: jsonUsage{PromptTokens: r.PromptTokens, CompletionTokens: len(r.Tokens), TotalTokens: r.PromptTokens + len(r.Tokens)},
				Xmix:  jsonXmix{Exports: serve.ResultExports(s.b, apps[i], r), Fired: r.Fired}, Rows: r.Rows}
			if out[i].Xmix.Fired == nil {
				out[i].Xmix.Fired = loader.Fired{}
			}
			if out[i].Apps == nil {
				out[i].Apps = []string{}
			}
		}
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		if err := enc.Encode(map[string]any{"backend": s.be.Name(), "results": out}); err != nil {
			return err
		}
		return genErr
	}
	for i, r := range res {
		label := "no apps"
		if len(apps[i]) > 0 {
			label = strings.Join(apps[i], "+")
		}
		text := s.tok.Decode(r.Tokens)
		fmt.Fprintf(w, "── %s ──\n%s%s\n", label, prompts[i], text)
		if r.Error != "" {
			fmt.Fprintf(w, "  [%s: %s]\n", r.Reason, r.Error)
		}
		printExports(w, s.tok, r)
		fmt.Fprintln(w)
	}
	return genErr
}

// requestFlags are the flags of `xmix run` that set each field loader.Engine.Check names.
var requestFlags = map[string]string{
	"max_tokens": "--max-tokens", "temperature": "--temperature", "top_p": "--top-p",
	"prompt": "--prompt", "apps": "--apps", "set": "--set",
}

// printExports prints each exported scalar read under the text it was read at, one digit
// per token (0 = 0.0-0.1 ... 9 = 0.9-1.0), followed by the mean.
func printExports(w io.Writer, tok loader.Tokenizer, r loader.Result) {
	var names []string // in the order the reads first appear: the manifest's
	for _, row := range r.Rows {
		for _, x := range row.Exports {
			if !slices.Contains(names, x.Name) {
				names = append(names, x.Name)
			}
		}
	}
	for _, name := range names {
		var text, digits strings.Builder
		var sum float64
		var cnt int
		for _, row := range r.Rows {
			v := row.Exports.Get(name)
			if len(v) == 0 {
				continue
			}
			ch := tok.Decode([]int{row.Token})
			if len(ch) != 1 || ch[0] < ' ' || ch[0] > '~' {
				ch = " "
			}
			text.WriteString(ch)
			d := int(v[0] * 10)
			d = max(0, min(9, d))
			digits.WriteByte(byte('0' + d))
			sum += float64(v[0])
			cnt++
		}
		if cnt == 0 {
			continue
		}
		fmt.Fprintf(w, "  %s per token (digit = score x 10), mean %.3f:\n  %s\n  %s\n", name, sum/float64(cnt), text.String(), digits.String())
	}
}

func infoCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "info",
		Short: "Show what this xmix can run on this machine",
		RunE: func(cmd *cobra.Command, args []string) error {
			w := cmd.OutOrStdout()
			fmt.Fprintf(w, "xmix (%s), %s/%s, %d CPU threads\n", compile.Compiler, runtime.GOOS, runtime.GOARCH, runtime.GOMAXPROCS(0))
			if dev, err := cuda.Probe(); err != nil {
				fmt.Fprintf(w, "gpu: none usable (%v)\nbackends: cpu\n", err)
			} else {
				fmt.Fprintf(w, "gpu: %s, driver %d\nbackends: cuda, cpu\n", dev, dev.Driver)
				if err := cuda.ProbeCublasLt(); err != nil {
					fmt.Fprintf(w, "gemm: PTX kernels (%v)\n", err)
				} else {
					fmt.Fprintln(w, "gemm: cuBLASLt for batches of 8+ rows and prefill (--gemm auto)")
				}
			}
			return nil
		},
	}
}
