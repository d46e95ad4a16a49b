package main

import (
	"cmp"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"xmix/bundle"
	"xmix/loader"
	"xmix/loader/cuda"
)

type benchFlags struct {
	runFlags
	prompts     int
	promptLen   int
	newTokens   int
	online      bool
	requests    int
	rate        float64
	outputLen   int
	warmup      int
	runs        int
	appFraction float64
	decodeOnly  []int
	graphIters  int
	graphRounds int
	graphCtx    int
	attnSplits  int
	profile     bool
	roleCosts   bool
	traceFile   string
	cpuProfile  string
	// Over HTTP (benchurl.go): the server, its model, the workload's vocabulary and the
	// apps to enable through the xmix extension.
	url         string
	model       string
	vocab       int
	maxModelLen int
	xmixApps    string
	ignoreEOS   bool
	vectors     bool
}

func benchCmd() *cobra.Command {
	var f benchFlags
	c := &cobra.Command{
		Use:   "bench BUNDLE.xmb",
		Short: "Measure decode speed: offline (N prompts at once) or online (Poisson arrivals)",
		Long: `Offline (default): N prompts of P random tokens, T new tokens each, all submitted at once;
reports generated tokens/s and the mean decode step time, plus the graph replay time of each
decode bucket measured back to back on the device (no host work between replays).

Online (--online): the xMIx paper's workload. R requests arrive as a Poisson process at
--rate requests/s, or all at once with --rate 0 (or inf: vLLM's bench at request rate inf,
which the paper's figures used: the engine saturated, its schedule independent of timing);
prompt lengths follow a ShareGPT-like distribution, synthesized as a
log-normal with median 160 tokens and sigma 0.9, clipped to [8, 1024]; every request
generates exactly --output-len tokens. Reports mean and P99 inter-token latency, mean time to
first token and total token throughput (prompt + generated tokens / wall time). --warmup
runs are discarded, --runs are measured and averaged.

--apps enables apps on a --app-fraction of the requests (chosen at random, seeded).
Requests are greedy unless --temperature (and --top-p) say otherwise: the sampler's cost
grows with them (a nucleus search reads every logit some twenty times).

Over HTTP (--url http://HOST:PORT, no bundle): the online workload against any
OpenAI-compatible server (xmix serve, vLLM), streamed from /v1/completions with token-id
prompts and temperature 0 (or --temperature, --top-p); reports client-side TTFT (to the first chunk), ITL (between
chunks: mean, P50, P99) and throughput. The prompts are those the in-process bench draws
for a model of --vocab ids and the server's max_model_len, so both benches run the same
requests. --xmix-apps enables apps through the "xmix" extension on an --app-fraction of the
requests. --ignore-eos (both ways) has every request generate exactly its tokens, past any EOS
(the paper's setting, vLLM's --ignore-eos).`,
		Example: `  xmix bench l8.xmb --online --requests 250 --rate 0
  xmix bench --url http://127.0.0.1:8080 --requests 250 --rate 0 --output-len 128 --ignore-eos`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := f.checkSampling(); err != nil {
				return err
			}
			if f.url != "" {
				if len(args) > 0 {
					return fmt.Errorf("--url drives a server: give it or a bundle, not both")
				}
				if f.vectors {
					return fmt.Errorf("--vectors is for the in-process bench; over HTTP, per-request vectors ride the xmix extension")
				}
				if f.cpuProfile != "" {
					return fmt.Errorf("--cpu-profile profiles this process's host work, not a server's: run the bench in-process (BUNDLE.xmb), or profile the server itself")
				}
				if f.loadProfile != "" {
					return fmt.Errorf("--load-profile profiles this process's load of a bundle, and --url loads none: run the bench in-process (BUNDLE.xmb), or give --load-profile to xmix serve")
				}
				return benchURL(cmd.OutOrStdout(), f)
			}
			if len(args) == 0 {
				return fmt.Errorf("no bundle: give BUNDLE.xmb, or --url http://HOST:PORT to drive a server")
			}
			return runBench(cmd.OutOrStdout(), args[0], f)
		},
	}
	fl := c.Flags()
	fl.IntVar(&f.prompts, "prompts", 8, "offline: number of prompts (the batch)")
	fl.IntVar(&f.promptLen, "prompt-len", 128, "offline: tokens per prompt")
	fl.IntVar(&f.newTokens, "new-tokens", 128, "offline: tokens generated per prompt")
	fl.BoolVar(&f.online, "online", false, "run the online (Poisson arrivals) benchmark")
	fl.IntVar(&f.requests, "requests", 250, "online: number of requests")
	fl.Float64Var(&f.rate, "rate", 8, "online: mean arrival rate, requests per second (0 or inf: all at once)")
	fl.IntVar(&f.outputLen, "output-len", 128, "online: tokens generated per request")
	fl.IntVar(&f.warmup, "warmup", 1, "online: runs discarded before measuring")
	fl.IntVar(&f.runs, "runs", 3, "online: measured runs")
	fl.Float64Var(&f.appFraction, "app-fraction", 1, "share of requests that enable --apps, 0 to 1 (with --graph-context, of the full batch's rows)")
	fl.IntSliceVar(&f.decodeOnly, "graph-buckets", nil, "decode buckets to time as bare graph replays (default: all)")
	fl.IntVar(&f.graphIters, "graph-iters", 50, fmt.Sprintf("replays per bucket for the graph timing, 1 to %d", maxGraphIters))
	fl.IntVar(&f.graphRounds, "graph-rounds", 1, fmt.Sprintf("rounds of --graph-iters replays per bucket, 1 to %d; the graph time reported is the shortest round's mean (the peer grid takes 3, as torch_decode.py reports the best of three rounds)", maxGraphRounds))
	fl.IntVar(&f.graphCtx, "graph-context", 0, "time each decode graph (and --profile, --trace) with every row its own sequence at this context, as a full batch at that context runs, the first --app-fraction of the rows enabling --apps (0: the rows as the last step left them)")
	fl.IntVar(&f.attnSplits, "attn-splits", 0, "with --graph-context: cut every row's context over this many splits of the decode attention (1: none) instead of the split the engine picks (for measuring that choice; 0: the engine's)")
	fl.BoolVar(&f.profile, "profile", false, "also time every node of each timed decode bucket, summed by role, and of the warm-up request's prefill steps, with their GEMMs' TFLOP/s (cuda)")
	fl.StringVar(&f.traceFile, "trace", "", "cuda: also write to this file, as JSON, when each kernel of every timed decode bucket's graph began, waited for the kernel ahead and ended (its CTAs' last warps; thread 0's end and each warp's lag behind it beside) in one replay (every kernel is instrumented for it, so this run's other timings are not the bundle's; cuBLASLt's kernels carry no times)")
	fl.StringVar(&f.cpuProfile, "cpu-profile", "", "online, in-process: also write the host's Go CPU profile of the online runs (warm-up included) to this file, for `go tool pprof`: where the host's time between steps goes")
	fl.BoolVar(&f.roleCosts, "role-costs", false, "also time each timed decode bucket's graph captured without each node role in turn: a role's cost inside the graph, early launch's overlap included, is the graph's time less that (cuda; the replays without a role compute garbage, the times are real)")
	fl.StringVar(&f.apps, "apps", "", "comma-separated apps to enable")
	fl.Uint64Var(&f.seed, "seed", 1, "seed for prompts, arrivals and app choice")
	fl.BoolVar(&f.asJSON, "json", false, "print results as JSON")
	fl.StringVar(&f.url, "url", "", "drive the OpenAI-compatible server at this URL instead of a bundle in-process (the online workload)")
	fl.StringVar(&f.model, "model", "", "--url: the model to ask for (default: the first of the server's /v1/models)")
	fl.IntVar(&f.vocab, "vocab", 32000, "--url: the prompts' token ids are drawn below min(this, 32000), as the in-process bench draws them")
	fl.IntVar(&f.maxModelLen, "max-model-len", 0, "--url: the model's context, bounding the prompts (default: the server's max_model_len)")
	fl.StringVar(&f.xmixApps, "xmix-apps", "", "--url: comma-separated apps to enable through the xmix extension")
	fl.BoolVar(&f.vectors, "vectors", false, "in-process: requests that enable apps bring their own random value for each per_request vector param of those apps (rows read the bundle's vector slots, not the compiled values)")
	fl.Float32Var(&f.temperature, "temperature", 0, "every request's sampling temperature (0: greedy), in-process and --url; the decode graphs are timed with every row sampling so")
	fl.Float32Var(&f.topP, "top-p", 1, "every request's nucleus mass (0 or 1: no nucleus cut); with --temperature above 0 the sampler searches the nucleus each step")
	fl.BoolVar(&f.ignoreEOS, "ignore-eos", false, "every request generates exactly its tokens, past any EOS (ignore_eos; in-process and --url)")
	f.addBackendFlags(fl)
	return c
}

// timer is implemented by backends that can time bare graph replays (cuda).
type timer interface {
	Time(template, n int) (float64, error)
}

// roleTimer is implemented by backends that can time a template's graph captured without
// some of its nodes (cuda).
type roleTimer interface {
	timer
	TimeWithout(template, n int, leave func(label string) bool) (float64, error)
}

// stepTracer is implemented by backends that can trace a template's graph (cuda, loaded
// with runFlags.trace).
type stepTracer interface {
	Trace(template int) ([]cuda.TraceSpan, error)
}

// registerCounter is implemented by backends that compile kernels on the GPU (cuda): a
// thread's registers in each kernel, which decide what of a kernel launched early fits an SM
// beside the kernel ahead.
type registerCounter interface {
	KernelRegisters() map[string]int
}

// hostGapper is implemented by backends that see the host's time between steps (cuda):
// from one step's return from its wait on the GPU to the next step's launch.
type hostGapper interface {
	HostGaps() (time.Duration, int)
	ResetHostGaps()
}

// profiler is implemented by backends that can time each node of a template (cuda).
type profiler interface {
	Profile(template int) ([]cuda.NodeTime, error)
}

// hostGapUs is the mean host gap in us since g's reset, 0 where there is none (g nil, or no
// step followed another).
func hostGapUs(g hostGapper) float64 {
	if g == nil {
		return 0
	}
	total, n := g.HostGaps()
	if n == 0 {
		return 0
	}
	return total.Seconds() * 1e6 / float64(n)
}

// The cuda backend has every measuring method the bench asks backends for: a signature that
// drifted would otherwise leave its figures out of the results without a word.
var _ interface {
	roleTimer
	stepTracer
	registerCounter
	hostGapper
	profiler
} = (*cuda.Backend)(nil)

// nodeRole names what a node does regardless of its layer: "L3.qkv" -> "qkv",
// "slot5.add_norm" -> "add_norm".
func nodeRole(label string) string {
	if i := strings.IndexByte(label, '.'); i >= 0 && (label[0] == 'L' || strings.HasPrefix(label, "slot")) {
		return label[i+1:]
	}
	return label
}

// checkSampling checks --temperature and --top-p as the engine checks a request's
// (loader.CheckSampling), naming the flag as `xmix run` does.
func (f benchFlags) checkSampling() error {
	var bad *loader.RequestError
	if err := loader.CheckSampling(f.temperature, f.topP); errors.As(err, &bad) {
		return fmt.Errorf("%s: %w", requestFlags[bad.Field], err)
	}
	return nil
}

// checkRate reads --rate: a positive rate, or 0 and inf for every request at once.
func (f *benchFlags) checkRate() error {
	if math.IsNaN(f.rate) || f.rate < 0 {
		return fmt.Errorf("--rate %v: give the mean arrival rate in requests per second, or 0 (inf) for every request at once", f.rate)
	}
	if math.IsInf(f.rate, 1) {
		f.rate = 0
	}
	return nil
}

// Bounds of bench's counts: a million replays of the largest step take minutes, a hundred
// rounds of them hours; a hundred thousand requests of the longest prompts are gigabytes of
// prompt tokens drawn up front.
const (
	maxGraphIters, maxGraphRounds    = 1_000_000, 100
	maxBenchRequests, maxBenchTokens = 100_000, 1 << 20
	maxBenchRuns                     = 100
)

// countFlag is one of bench's count flags, its value and its bounds.
type countFlag struct {
	name     string
	value    int
	lo, hi   int
	counting string
}

// checkCounts checks every count flag against its bounds before the bundle is opened or any
// request drawn: a count of 0 ran nothing and reported zeros (or 0/0 ms), a negative one
// panicked, a huge one allocated without end.
func (f benchFlags) checkCounts() error {
	for _, c := range []countFlag{
		{"--prompts", f.prompts, 1, maxBenchRequests, "prompts"},
		{"--prompt-len", f.promptLen, 1, maxBenchTokens, "tokens a prompt"},
		{"--new-tokens", f.newTokens, 1, maxBenchTokens, "tokens a prompt generates"},
		{"--requests", f.requests, 1, maxBenchRequests, "requests"},
		{"--output-len", f.outputLen, 1, maxBenchTokens, "tokens a request generates"},
		{"--warmup", f.warmup, 0, maxBenchRuns, "runs discarded"},
		{"--runs", f.runs, 1, maxBenchRuns, "runs measured"},
		{"--graph-iters", f.graphIters, 1, maxGraphIters, "replays a timing"},
		{"--graph-rounds", f.graphRounds, 1, maxGraphRounds, "rounds"},
		{"--graph-context", f.graphCtx, 0, maxBenchTokens, "positions (0: the rows as the last step left them)"},
		{"--max-model-len", f.maxModelLen, 0, maxBenchTokens, "tokens (0: the server's max_model_len)"},
	} {
		if c.value < c.lo || c.value > c.hi {
			return fmt.Errorf("%s %d: want %d to %d %s", c.name, c.value, c.lo, c.hi, c.counting)
		}
	}
	return nil
}

// checkBundleCounts checks the counts that the bundle bounds, before any request is drawn:
// every prompt and its tokens must fit max_seq_len (the engine adds BOS), and each bucket of
// --graph-buckets must be one of the bundle's decode buckets.
func (f benchFlags) checkBundleCounts(b *bundle.Bundle) error {
	m := b.Manifest.Model
	if !f.online && f.promptLen+1+f.newTokens > m.MaxSeqLen {
		return fmt.Errorf("--prompt-len %d + BOS + --new-tokens %d = %d tokens: the bundle's max_seq_len is %d", f.promptLen, f.newTokens, f.promptLen+1+f.newTokens, m.MaxSeqLen)
	}
	var buckets []int
	for _, t := range b.Templates {
		if t.Kind == bundle.Decode {
			buckets = append(buckets, t.Tokens)
		}
	}
	for _, n := range f.decodeOnly {
		if !slices.Contains(buckets, n) {
			return fmt.Errorf("--graph-buckets %d: not a decode bucket of the bundle (it has %v)", n, buckets)
		}
	}
	return nil
}

// checkAppFraction checks --app-fraction: a share of the requests (and of a --graph-context
// batch's rows), 0 to 1.
func (f benchFlags) checkAppFraction() error {
	if math.IsNaN(f.appFraction) || f.appFraction < 0 || f.appFraction > 1 {
		return fmt.Errorf("--app-fraction %v: want the share of requests that enable the apps, from 0 to 1", f.appFraction)
	}
	return nil
}

// rngs are the benchmark's two random streams. Prompts and arrivals draw from one, the app
// coin from another, so a run with apps replays exactly the workload of a run without.
func (f benchFlags) rngs() benchRNG {
	return benchRNG{work: rand.New(rand.NewPCG(f.seed, 1)), apps: rand.New(rand.NewPCG(f.seed, 2))}
}

func runBench(w io.Writer, path string, f benchFlags) error {
	if f.online {
		if err := f.checkRate(); err != nil {
			return err
		}
	}
	if err := f.checkAppFraction(); err != nil {
		return err
	}
	if err := f.checkCounts(); err != nil {
		return err
	}
	if f.xmixApps != "" {
		return fmt.Errorf("--xmix-apps goes with --url; in-process, --apps enables apps")
	}
	if f.vectors && f.apps == "" {
		return fmt.Errorf("--vectors gives per-request values to the apps of --apps: name them")
	}
	if f.roleCosts && f.online {
		return fmt.Errorf("--role-costs times the offline bench's decode graphs: leave out --online")
	}
	if f.traceFile != "" && f.online {
		return fmt.Errorf("--trace follows the offline bench's decode graphs: leave out --online")
	}
	if f.cpuProfile != "" {
		if !f.online {
			return fmt.Errorf("--cpu-profile profiles the host during the online runs: add --online")
		}
		if err := checkOutFile(f.cpuProfile); err != nil {
			return fmt.Errorf("--cpu-profile %s: %w", f.cpuProfile, err)
		}
	}
	f.trace = f.traceFile != ""
	if f.trace {
		if err := checkOutFile(f.traceFile); err != nil { // before the bench, not after it
			return fmt.Errorf("--trace %s: %w", f.traceFile, err)
		}
	}
	if f.attnSplits != 0 && (f.attnSplits < 0 || f.graphCtx <= 0) {
		return fmt.Errorf("--attn-splits %d: give a count of at least 1, and --graph-context N: it sets the splits of a full batch at that context", f.attnSplits)
	}
	s, err := openFile(path, f.runFlags)
	if err != nil {
		return err
	}
	defer s.be.Close()
	if err := f.checkBundleCounts(s.b); err != nil {
		return err
	}
	if _, ok := s.be.(roleTimer); f.roleCosts && !ok {
		return fmt.Errorf("--role-costs: the %s backend cannot time graphs (use --backend cuda)", f.backend)
	}
	if _, ok := s.be.(stepTracer); f.trace && !ok {
		return fmt.Errorf("--trace: the %s backend cannot trace graphs (use --backend cuda)", f.backend)
	}
	b := s.b
	var apps []string
	if f.apps != "" {
		apps = strings.Split(f.apps, ",")
	}
	rng := f.rngs()
	out := map[string]any{"bundle": filepath.Base(path), "backend": s.be.Name(), "model": b.Manifest.Model.Name, "apps": apps, "app_fraction": f.appFraction,
		"temperature": f.temperature, "top_p": f.topP}
	if f.online {
		stop, err := startCPUProfile("--cpu-profile", f.cpuProfile)
		if err != nil {
			return err
		}
		res, err := benchOnline(s, f, apps, rng)
		if err := errors.Join(err, stop()); err != nil {
			return err
		}
		out["online"] = res
	} else {
		res, err := benchOffline(s, f, apps, rng)
		if err != nil {
			return err
		}
		out["offline"] = res
		if g, err := graphTimes(s, f); err != nil {
			return err
		} else if g != nil {
			out["graph_ms"] = g
			if fl := graphFloors(s, f); fl != nil {
				out["graph_floor_ms"] = fl
			}
		}
		if p, err := profileTimes(s, f); err != nil {
			return err
		} else if p != nil {
			out["profile_ms"] = p
		}
		if c, err := roleCosts(s, f); err != nil {
			return err
		} else if c != nil {
			out["role_cost_ms"] = c
		}
		if err := writeTraces(s, f); err != nil {
			return err
		}
	}
	if rc, ok := s.be.(registerCounter); ok {
		out["kernel_registers"] = rc.KernelRegisters()
	}
	return writeResults(w, out)
}

// writeResults prints a benchmark's results as indented JSON.
func writeResults(w io.Writer, out any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(out)
}

func randomPrompt(rng *rand.Rand, n, vocab int) []int {
	p := make([]int, n)
	for i := range p {
		p[i] = rng.IntN(min(vocab, 32000))
	}
	return p
}

// benchRNG holds the benchmark's two random streams.
type benchRNG struct{ work, apps *rand.Rand }

func appsForRequest(rng *rand.Rand, apps []string, frac float64) []string {
	if len(apps) > 0 && rng.Float64() < frac {
		return apps
	}
	return nil
}

// appMask is the control mask bits of the comma-separated apps (bench --apps) in bundle b.
func appMask(b *bundle.Bundle, apps string) (uint32, error) {
	var bits uint32
	for name := range strings.SplitSeq(apps, ",") {
		if name == "" {
			continue
		}
		i := slices.IndexFunc(b.Manifest.Apps, func(a bundle.App) bool { return a.Name == name })
		if i < 0 {
			names := make([]string, len(b.Manifest.Apps))
			for j, a := range b.Manifest.Apps {
				names[j] = a.Name
			}
			return 0, fmt.Errorf("--apps: the bundle has no app %q (it has: %s)", name, strings.Join(names, ", "))
		}
		bits |= 1 << b.Manifest.Apps[i].Bit
	}
	return bits, nil
}

// addVectors gives every request that enables an app a random value (seeded; norm about 1)
// for each per_request vector param of that app, widths by "app.param" as the engine lists
// them: --vectors, so that rows read the bundle's vector slots rather than the compiled values.
func addVectors(rng *rand.Rand, widths map[string]int, reqs []loader.Request) {
	keys := slices.Sorted(maps.Keys(widths))
	for i := range reqs {
		r := &reqs[i]
		for _, key := range keys {
			if !slices.Contains(r.Apps, key[:strings.LastIndex(key, ".")]) {
				continue
			}
			v := make([]float32, widths[key])
			for j := range v {
				v[j] = float32(rng.NormFloat64() / math.Sqrt(float64(len(v))))
			}
			if r.Vectors == nil {
				r.Vectors = map[string][]float32{}
			}
			r.Vectors[key] = v
		}
	}
}

type offlineResult struct {
	Prompts        int     `json:"prompts"`
	PromptLen      int     `json:"prompt_len"`
	NewTokens      int     `json:"new_tokens"`
	Seconds        float64 `json:"seconds"`
	TokensPerSec   float64 `json:"generated_tok_per_s"`
	DecodeSteps    int     `json:"decode_steps"`
	DecodeStepMs   float64 `json:"decode_step_ms"`
	DecodeTokPerS  float64 `json:"decode_tok_per_s"`
	PrefillSteps   int     `json:"prefill_steps"`
	PrefillSeconds float64 `json:"prefill_seconds"`
	// HostGapUs (cuda): the mean time from one step's return from its wait on the GPU to the
	// next step's launch, over the run's steps: what the GPU idles while the host hands the
	// results back, does the engine's work and hands the next step over.
	HostGapUs float64 `json:"host_gap_us,omitempty"`
	// The decode floor: bytes every decode step must read (weights streamed once, plus the
	// KV cache at the mean context) over the measured 4.2 TB/s of an H200.
	WeightBytes    int64   `json:"weight_bytes"`
	KVBytesPerStep int64   `json:"kv_bytes_per_step"`
	FloorMs        float64 `json:"floor_ms"`
	PctOfFloor     float64 `json:"pct_of_floor"`
	// PrefillProfile (--profile, cuda): the warm-up request's prefill steps, each template's
	// nodes timed one by one, by template name.
	PrefillProfile map[string]prefillProfile `json:"prefill_profile,omitempty"`
}

// MeasuredBF16Peak is the H200's dense bf16 matmul rate of FACTS.md (770-800 TFLOP/s on
// random data; the lower end), which prefill GEMMs are held against (issue 14: >= 60%).
const MeasuredBF16Peak = 770e12

// prefillProfile is one prefill step's nodes timed one by one (launch gaps included): time by
// role, and its tensor-core GEMMs alone: their time, the FLOPs they do (2*M*N*K over every row
// of the template, padding included) and the rate, also as a share of MeasuredBF16Peak.
type prefillProfile struct {
	Tokens      int                `json:"tokens"`
	Roles       map[string]float64 `json:"roles_ms"`
	StepMs      float64            `json:"step_ms"`
	GemmMs      float64            `json:"gemm_ms"`
	GemmTFLOPs  float64            `json:"gemm_tflop"`
	GemmTFLOPS  float64            `json:"gemm_tflop_per_s"`
	GemmPctPeak float64            `json:"gemm_pct_of_peak"`
}

// summarizePrefill folds node times of template ti into a prefillProfile, reading each GEMM
// node's M, N and K from the bundle (bundle.GemmOf).
func summarizePrefill(b *bundle.Bundle, ti int, nodes []cuda.NodeTime) (prefillProfile, error) {
	t := b.Templates[ti]
	kernels := b.KernelsByName()
	flops := map[string]float64{}
	for _, n := range t.Nodes {
		g, ok, err := bundle.GemmOf(n, kernels[n.Kernel])
		if err != nil {
			return prefillProfile{}, err
		}
		if ok {
			flops[n.Label] = 2 * float64(g.M) * float64(g.N) * float64(g.K)
		}
	}
	p := prefillProfile{Tokens: t.Tokens, Roles: map[string]float64{}}
	var gemmFlops float64
	for _, n := range nodes {
		p.Roles[nodeRole(n.Label)] += n.Ms
		p.StepMs += n.Ms
		if f, ok := flops[n.Label]; ok {
			p.GemmMs += n.Ms
			gemmFlops += f
		}
	}
	p.GemmTFLOPs = gemmFlops / 1e12
	if p.GemmMs > 0 {
		p.GemmTFLOPS = gemmFlops / (p.GemmMs / 1000) / 1e12
		p.GemmPctPeak = 100 * p.GemmTFLOPS * 1e12 / MeasuredBF16Peak
	}
	return p, nil
}

// MeasuredBandwidth is the H200 device-to-device copy bandwidth of FACTS.md (bytes/s).
const MeasuredBandwidth = 4.2e12

// weightBytes counts the weight bytes a decode step streams: every weight buffer except an
// untied embedding table, of which a step reads only the rows of its tokens.
func weightBytes(b *bundle.Bundle) int64 {
	var n int64
	for _, buf := range b.Manifest.Buffers {
		if buf.Kind != bundle.KindWeight || (buf.Name == "embed" && !b.Manifest.Model.TieEmbeddings) {
			continue
		}
		sz, _ := loader.BufferBytes(buf)
		n += sz
	}
	return n
}

func benchOffline(s *session, f benchFlags, apps []string, rng benchRNG) (offlineResult, error) {
	vocab := s.b.Manifest.Model.Vocab
	var reqs []loader.Request
	for range f.prompts {
		reqs = append(reqs, loader.Request{Prompt: randomPrompt(rng.work, f.promptLen, vocab), MaxTokens: f.newTokens, IgnoreEOS: f.ignoreEOS,
			Temperature: f.temperature, TopP: f.topP, Apps: appsForRequest(rng.apps, apps, f.appFraction)})
	}
	if f.vectors {
		addVectors(rng.apps, s.eng.PerRequestVectors(), reqs)
	}
	// One short warm-up pass so first-touch costs stay out of the figures. With --profile, its
	// prefill steps (a lone prompt of --prompt-len tokens) are also timed node by node, once
	// per template, after the step has run once with its own control words.
	pre := map[string]prefillProfile{}
	if p, ok := s.be.(profiler); ok && f.profile {
		s.eng.AfterStep = func(ti int) error {
			t := s.b.Templates[ti]
			if _, done := pre[t.Name]; done || t.Kind != bundle.Prefill {
				return nil
			}
			if _, err := p.Profile(ti); err != nil { // warm-up
				return err
			}
			nodes, err := p.Profile(ti)
			if err != nil {
				return err
			}
			if pre[t.Name], err = summarizePrefill(s.b, ti, nodes); err != nil {
				return err
			}
			f.progress("prefill %s: GEMMs %.1f TFLOP/s (%.0f%% of %.0f)", t.Name, pre[t.Name].GemmTFLOPS, pre[t.Name].GemmPctPeak, MeasuredBF16Peak/1e12)
			return nil
		}
	}
	_, err := s.eng.Generate(reqs[:1])
	s.eng.AfterStep = nil
	if err != nil {
		return offlineResult{}, err
	}
	s.eng.Stats = loader.Stats{}
	gaps, _ := s.be.(hostGapper)
	if gaps != nil {
		gaps.ResetHostGaps()
	}
	start := time.Now()
	res, err := s.eng.Generate(reqs)
	if err != nil {
		return offlineResult{}, err
	}
	el := time.Since(start).Seconds()
	n := 0
	for _, r := range res {
		n += len(r.Tokens)
	}
	st := s.eng.Stats
	r := offlineResult{Prompts: f.prompts, PromptLen: f.promptLen, NewTokens: f.newTokens, Seconds: el,
		TokensPerSec: float64(n) / el, DecodeSteps: st.DecodeSteps, PrefillSteps: st.PrefillSteps,
		PrefillSeconds: st.PrefillTime.Seconds()}
	if len(pre) > 0 {
		r.PrefillProfile = pre
	}
	r.HostGapUs = hostGapUs(gaps)
	m := s.b.Manifest.Model
	batch := min(f.prompts, m.MaxSeqs)
	if st.DecodeSteps > 0 {
		r.DecodeStepMs = st.DecodeTime.Seconds() * 1000 / float64(st.DecodeSteps)
		r.DecodeTokPerS = float64(batch) / (r.DecodeStepMs / 1000)
	}
	ctx := int64(f.promptLen + 1 + f.newTokens/2)
	r.WeightBytes = weightBytes(s.b)
	r.KVBytesPerStep = int64(batch) * ctx * kvBytesPerPosition(m)
	r.FloorMs = floorMs(r.WeightBytes + r.KVBytesPerStep)
	if r.DecodeStepMs > 0 {
		r.PctOfFloor = 100 * r.FloorMs / r.DecodeStepMs
	}
	f.progress("offline: %d prompts x %d tokens: %.1f tok/s, decode step %.3f ms", f.prompts, f.newTokens, r.TokensPerSec, r.DecodeStepMs)
	if r.HostGapUs > 0 {
		f.progress("offline: %.1f us of host work between steps (from a step's return to the next launch)", r.HostGapUs)
	}
	return r, nil
}

// kvBytesPerPosition is what a row's decode step reads of its KV cache per position of its
// context: K and V of every layer (a sliding-window layer's counted whole, so the floor is a
// bound).
func kvBytesPerPosition(m bundle.ModelConfig) int64 {
	elem := int64(4)
	if m.KVDtype == "bf16" {
		elem = 2
	}
	return int64(m.Layers) * 2 * int64(m.KVHeads*m.HeadDim) * elem
}

// floorMs is the time to read bytes at MeasuredBandwidth: a step's floor.
func floorMs(bytes int64) float64 { return float64(bytes) / MeasuredBandwidth * 1000 }

// graphFloors is each timed decode bucket's floor at --graph-context: the weights once and
// every row's KV cache at that context, the bytes its graph must read (none without
// --graph-context, where the rows are as the last step left them).
func graphFloors(s *session, f benchFlags) map[string]float64 {
	if f.graphCtx <= 0 {
		return nil
	}
	out := map[string]float64{}
	w, perPos := weightBytes(s.b), kvBytesPerPosition(s.b.Manifest.Model)
	for _, i := range timedBuckets(s, f) {
		t := s.b.Templates[i]
		out[t.Name] = floorMs(w + int64(t.Tokens)*int64(f.graphCtx)*perPos)
	}
	return out
}

// graphTimes times bare replays of each decode template (cuda only): the shortest of
// --graph-rounds rounds' means.
func graphTimes(s *session, f benchFlags) (map[string]float64, error) {
	tm, ok := s.be.(timer)
	if !ok {
		return nil, nil
	}
	out := map[string]float64{}
	for _, i := range timedBuckets(s, f) {
		t := s.b.Templates[i]
		if err := fullBatch(s, i, f); err != nil {
			return nil, err
		}
		if _, err := tm.Time(i, 3); err != nil {
			return nil, err
		}
		ms := math.Inf(1)
		for range f.graphRounds {
			round, err := tm.Time(i, f.graphIters)
			if err != nil {
				return nil, err
			}
			ms = min(ms, round)
		}
		out[t.Name] = ms
		f.progress("graph %s: %.4f ms per replay", t.Name, ms)
	}
	return out, nil
}

// profileTimes sums each timed decode bucket's node times by role.
func profileTimes(s *session, f benchFlags) (map[string]map[string]float64, error) {
	p, ok := s.be.(profiler)
	if !ok || !f.profile {
		return nil, nil
	}
	out := map[string]map[string]float64{}
	for _, i := range timedBuckets(s, f) {
		t := s.b.Templates[i]
		if err := fullBatch(s, i, f); err != nil {
			return nil, err
		}
		if _, err := p.Profile(i); err != nil { // warm-up
			return nil, err
		}
		nodes, err := p.Profile(i)
		if err != nil {
			return nil, err
		}
		roles := map[string]float64{}
		for _, n := range nodes {
			roles[nodeRole(n.Label)] += n.Ms
		}
		out[t.Name] = roles
	}
	return out, nil
}

// roleCosts (--role-costs) times each timed decode bucket's graph, then the graph captured
// without each node role in turn (roles in the order their first nodes run), then the whole
// graph again, and returns each role's cost: the mean of the two whole-graph times less the
// time without it.
func roleCosts(s *session, f benchFlags) (map[string]map[string]float64, error) {
	if !f.roleCosts {
		return nil, nil
	}
	rt := s.be.(roleTimer) // runBench checked it
	out := map[string]map[string]float64{}
	for _, i := range timedBuckets(s, f) {
		t := s.b.Templates[i]
		if err := fullBatch(s, i, f); err != nil {
			return nil, err
		}
		var roles []string
		for _, n := range t.Nodes {
			if r := nodeRole(n.Label); !slices.Contains(roles, r) {
				roles = append(roles, r)
			}
		}
		costs, err := roleCostsOf(rt, i, f.graphIters, roles)
		if err != nil {
			return nil, fmt.Errorf("--role-costs, template %s: %w", t.Name, err)
		}
		out[t.Name] = costs
		f.progress("role costs %s (ms inside the graph): %s", t.Name, costsText(costs))
	}
	return out, nil
}

// writeTraces (--trace FILE) traces each timed decode bucket's graph, every row at
// --graph-context where given, and writes {template: spans} to FILE as JSON.
func writeTraces(s *session, f benchFlags) error {
	if !f.trace {
		return nil
	}
	st := s.be.(stepTracer) // runBench checked it
	out := map[string][]cuda.TraceSpan{}
	for _, i := range timedBuckets(s, f) {
		t := s.b.Templates[i]
		if err := fullBatch(s, i, f); err != nil {
			return err
		}
		spans, err := st.Trace(i)
		if err != nil {
			return fmt.Errorf("--trace, template %s: %w", t.Name, err)
		}
		out[t.Name] = spans
		var end float64
		for _, sp := range spans {
			end = max(end, sp.Ended)
		}
		f.progress("trace %s: %d launches, %.1f µs from the first CTA to the last", t.Name, len(spans), end)
	}
	data, err := json.MarshalIndent(out, "", " ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(f.traceFile, append(data, '\n'), 0o644); err != nil {
		return fmt.Errorf("--trace: %w", err)
	}
	return nil
}

// costsText lists role costs largest first: "gate_up 1.969, down 1.044, ...".
func costsText(costs map[string]float64) string {
	roles := slices.SortedFunc(maps.Keys(costs), func(a, b string) int { return cmp.Compare(costs[b], costs[a]) })
	parts := make([]string, len(roles))
	for i, r := range roles {
		parts[i] = fmt.Sprintf("%s %.3f", r, costs[r])
	}
	return strings.Join(parts, ", ")
}

// roleCostsOf is roleCosts for template ti: n replays per timing, after a warm-up of each
// (TimeWithout warms up on the graph it captures).
func roleCostsOf(rt roleTimer, ti, n int, roles []string) (map[string]float64, error) {
	whole := func() (float64, error) {
		if _, err := rt.Time(ti, 3); err != nil {
			return 0, err
		}
		return rt.Time(ti, n)
	}
	before, err := whole()
	if err != nil {
		return nil, err
	}
	without := make([]float64, len(roles))
	for k, role := range roles {
		leave := func(label string) bool { return nodeRole(label) == role }
		if without[k], err = rt.TimeWithout(ti, n, leave); err != nil {
			return nil, fmt.Errorf("role %s: %w", role, err)
		}
	}
	after, err := whole()
	if err != nil {
		return nil, err
	}
	costs := map[string]float64{}
	for k, role := range roles {
		costs[role] = (before+after)/2 - without[k]
	}
	return costs, nil
}

// fullBatch (--graph-context n, n > 0) writes the control words of a decode step of template ti
// in which every row is its own sequence slot at context n, each over its own KV pages: what
// a full batch at that context runs, which the last step of an offline run is not (requests
// whose prefill finished first also finish decoding first, and the last steps run few rows).
// It then runs that step once, which sends the words to the device (graph timing and
// profiling replay what the device holds). The cache holds whatever earlier steps left
// there: right for timing only, and the engine must not step afterwards (its block table is
// overwritten). f.attnSplits > 0 (--attn-splits) cuts each context over that many splits of
// the attention instead of the engine's choice (AttnSplit.Chunk). Every row samples with
// --temperature and --top-p, and the first --app-fraction of the rows enable --apps, so the
// graph replayed is the one a step with those apps runs. Each row is generating after a
// --prompt-len prompt (ctl.gen, which apps' steps gates read); its token and its apps' latch
// words stay as the last step left them.
func fullBatch(s *session, ti int, f benchFlags) error {
	n, splits := f.graphCtx, f.attnSplits
	if n == 0 {
		if splits != 0 {
			return fmt.Errorf("--attn-splits %d: the splits of a full batch, so give --graph-context too", splits)
		}
		return nil
	}
	t := s.b.Templates[ti]
	m := s.b.Manifest.Model
	rows, perSeq := t.Tokens, (m.MaxSeqLen+m.KVBlockSize-1)/m.KVBlockSize
	pages := (n + m.KVBlockSize - 1) / m.KVBlockSize
	switch {
	case n < 0 || n > m.MaxSeqLen:
		return fmt.Errorf("--graph-context %d: want 1..%d (the bundle's max_seq_len)", n, m.MaxSeqLen)
	case rows > m.MaxSeqs:
		return fmt.Errorf("--graph-context: bucket %s has %d rows, more than the bundle's %d sequence slots", t.Name, rows, m.MaxSeqs)
	case rows*pages > m.KVBlocks-m.KVPadPages:
		return fmt.Errorf("--graph-context %d: %d rows need %d KV pages, the bundle has %d", n, rows, rows*pages, m.KVBlocks-m.KVPadPages)
	}
	enc := func(v []uint32) []byte {
		b := make([]byte, 4*len(v))
		for i, x := range v {
			binary.LittleEndian.PutUint32(b[4*i:], x)
		}
		return b
	}
	bits, err := appMask(s.b, f.apps)
	if err != nil {
		return err
	}
	// Every row samples: row r is sample r (ctl.out_row) and sample r reads row r (ctl.s_row).
	pos, seq, mask, sample, gen := make([]uint32, rows), make([]uint32, rows), make([]uint32, rows), make([]uint32, rows), make([]uint32, rows)
	for r := range sample {
		sample[r] = uint32(r)
		gen[r] = uint32(max(0, n-1-(f.promptLen+1))) // position less the prompt and its BOS
	}
	withApps := int(math.Round(f.appFraction * float64(rows)))
	for r := range withApps {
		mask[r] = bits
	}
	var any uint32 // ctl.any_mask: the apps of any row
	if withApps > 0 {
		any = bits
	}
	table := make([]uint32, perSeq)
	for r := range rows {
		pos[r], seq[r] = uint32(n-1), uint32(r)
		for j := range pages {
			table[j] = uint32(r*pages + j)
		}
		if err := s.be.Write(bundle.KVBlockTable, int64(4*r*perSeq), enc(table)); err != nil {
			return err
		}
	}
	for _, w := range []struct {
		buf string
		v   []uint32
	}{{bundle.CtlPos, pos}, {bundle.CtlSeq, seq}, {bundle.CtlMask, mask}, {bundle.CtlOutRow, sample}, {bundle.CtlGen, gen}} {
		if err := s.be.Write(w.buf, 0, enc(w.v)); err != nil {
			return err
		}
	}
	if hasBuffer(s.b, bundle.CtlSRow) {
		if err := s.be.Write(bundle.CtlSRow, 0, enc(sample)); err != nil {
			return err
		}
	}
	temp, topP := make([]uint32, rows), make([]uint32, rows)
	for r := range rows {
		temp[r], topP[r] = math.Float32bits(f.temperature), math.Float32bits(f.topP)
	}
	for _, w := range []struct {
		buf string
		v   []uint32
	}{{bundle.CtlTemperature, temp}, {bundle.CtlTopP, topP}} {
		if err := s.be.Write(w.buf, 0, enc(w.v)); err != nil {
			return err
		}
	}
	if hasBuffer(s.b, bundle.CtlAnyMask) {
		if err := s.be.Write(bundle.CtlAnyMask, 0, enc([]uint32{any})); err != nil {
			return err
		}
	}
	if a := t.AttnSplit; a != nil {
		chunk := a.Chunk(n, rows)
		if splits != 0 {
			if splits < 0 || splits > a.MaxSplits {
				return fmt.Errorf("--attn-splits %d: bucket %s's attention takes 1..%d splits", splits, t.Name, a.MaxSplits)
			}
			chunk = a.SplitChunk(n, splits)
		}
		if err := s.be.Write(a.Buffer, 0, enc([]uint32{uint32(chunk)})); err != nil {
			return err
		}
	}
	if err := s.be.Step(ti); err != nil {
		return fmt.Errorf("--graph-context %d: %s: %w", n, t.Name, err)
	}
	return nil
}

func hasBuffer(b *bundle.Bundle, name string) bool {
	for _, buf := range b.Manifest.Buffers {
		if buf.Name == name {
			return true
		}
	}
	return false
}

// timedBuckets are the decode templates --graph-buckets selects (all when it is empty).
func timedBuckets(s *session, f benchFlags) []int {
	var out []int
	for i, t := range s.b.Templates {
		if t.Kind == bundle.Decode && (len(f.decodeOnly) == 0 || slices.Contains(f.decodeOnly, t.Tokens)) {
			out = append(out, i)
		}
	}
	return out
}

// latency is what one run of the online workload measured, in-process or over HTTP.
type latency struct {
	MeanITLms    float64 `json:"mean_itl_ms"`
	P50ITLms     float64 `json:"p50_itl_ms"`
	P99ITLms     float64 `json:"p99_itl_ms"`
	MeanTTFTms   float64 `json:"mean_ttft_ms"`
	TokPerS      float64 `json:"total_tok_per_s"`
	OutTokPerS   float64 `json:"output_tok_per_s"`
	Seconds      float64 `json:"seconds"`
	Requests     int     `json:"requests"`
	PromptTokens int     `json:"prompt_tokens"`
	OutputTokens int     `json:"output_tokens"`
}

// timing is what one request of a run saw: when it was submitted and when each generated
// token came back.
type timing struct {
	submitted time.Time
	tokens    []time.Time
	prompt    int // prompt tokens, as the workload drew them
}

// measure summarizes a run of el seconds: ITL over every pair of consecutive tokens of a
// request, TTFT from submission, throughput over prompt and generated tokens.
func measure(ts []timing, el float64) latency {
	var itls, ttfts []float64
	total, prompts := 0, 0
	for _, t := range ts {
		prompts += t.prompt
		total += t.prompt + len(t.tokens)
		if len(t.tokens) > 0 {
			ttfts = append(ttfts, t.tokens[0].Sub(t.submitted).Seconds()*1000)
		}
		for k := 1; k < len(t.tokens); k++ {
			itls = append(itls, t.tokens[k].Sub(t.tokens[k-1]).Seconds()*1000)
		}
	}
	return latency{MeanITLms: mean(itls), P50ITLms: percentile(itls, 0.5), P99ITLms: percentile(itls, 0.99), MeanTTFTms: mean(ttfts),
		TokPerS: float64(total) / el, OutTokPerS: float64(total-prompts) / el, Seconds: el, Requests: len(ts), PromptTokens: prompts,
		OutputTokens: total - prompts}
}

// meanLatency averages the measured runs.
func meanLatency(runs []latency) latency {
	var m latency
	n := float64(len(runs))
	for _, r := range runs {
		m.MeanITLms += r.MeanITLms / n
		m.P50ITLms += r.P50ITLms / n
		m.P99ITLms += r.P99ITLms / n
		m.MeanTTFTms += r.MeanTTFTms / n
		m.TokPerS += r.TokPerS / n
		m.OutTokPerS += r.OutTokPerS / n
		m.Seconds += r.Seconds / n
		m.Requests = r.Requests
		m.PromptTokens = r.PromptTokens
		m.OutputTokens = r.OutputTokens
	}
	return m
}

type onlineRun struct {
	latency
	// What the scheduler ran: steps, the prefill ones among them, and padding rows.
	Steps        int `json:"steps"`
	PrefillSteps int `json:"prefill_steps"`
	PaddedRows   int `json:"padded_rows"`
	// HostGapUs (cuda): the mean time from a step's return from the GPU to the next step's
	// launch (offlineResult.HostGapUs).
	HostGapUs float64 `json:"host_gap_us,omitempty"`
	// TokensSHA256 digests every request's generated tokens in request order: runs whose
	// math is the same (another schedule, another arrival timing) give the same digest.
	TokensSHA256 string `json:"tokens_sha256,omitempty"`
}

type onlineResult struct {
	Rate float64 `json:"rate"`
	// MaxBatchedTokens is the token budget of every step the runs used.
	MaxBatchedTokens int         `json:"max_batched_tokens"`
	Requests         int         `json:"requests"`
	OutputLen        int         `json:"output_len"`
	Warmup           int         `json:"warmup_runs"`
	Runs             []onlineRun `json:"runs"`
	Mean             onlineRun   `json:"mean"`
}

// shareGPTLen draws a prompt length: log-normal, median 160 tokens, sigma 0.9, in [8, 1024].
func shareGPTLen(rng *rand.Rand, maxLen int) int {
	n := int(math.Exp(math.Log(160) + 0.9*rng.NormFloat64()))
	return max(8, min(n, 1024, maxLen))
}

// arrival is one request of the online workload: when it arrives and what it asks.
type arrival struct {
	at  time.Duration
	req loader.Request
}

// onlineWorkload draws the paper's workload for a model of maxSeqLen tokens and vocab ids,
// once, so every run (in-process or over HTTP) replays the same requests and arrival times.
func onlineWorkload(f benchFlags, apps []string, rng benchRNG, maxSeqLen, vocab int) ([]arrival, error) {
	maxPrompt := maxSeqLen - f.outputLen - 1
	if maxPrompt < 8 {
		return nil, fmt.Errorf("max_seq_len %d leaves no room for prompts with --output-len %d", maxSeqLen, f.outputLen)
	}
	var work []arrival
	var t float64
	for range f.requests {
		if f.rate > 0 {
			t += rng.work.ExpFloat64() / f.rate
		} else {
			rng.work.ExpFloat64() // the same prompts whatever the rate
		}
		work = append(work, arrival{time.Duration(t * float64(time.Second)), loader.Request{
			Prompt: randomPrompt(rng.work, shareGPTLen(rng.work, maxPrompt), vocab), MaxTokens: f.outputLen, IgnoreEOS: f.ignoreEOS,
			Temperature: f.temperature, TopP: f.topP, Apps: appsForRequest(rng.apps, apps, f.appFraction)}})
	}
	return work, nil
}

func benchOnline(s *session, f benchFlags, apps []string, rng benchRNG) (onlineResult, error) {
	m := s.b.Manifest.Model
	work, err := onlineWorkload(f, apps, rng, m.MaxSeqLen, m.Vocab)
	if err != nil {
		return onlineResult{}, err
	}
	if f.vectors {
		reqs := make([]loader.Request, len(work))
		for i := range work {
			reqs[i] = work[i].req
		}
		addVectors(rng.apps, s.eng.PerRequestVectors(), reqs)
		for i := range work {
			work[i].req = reqs[i]
		}
	}
	res := onlineResult{Rate: f.rate, Requests: f.requests, OutputLen: f.outputLen, Warmup: f.warmup, MaxBatchedTokens: s.eng.MaxBatchedTokens()}
	gaps, _ := s.be.(hostGapper)
	for run := 0; run < f.warmup+f.runs; run++ {
		before := s.eng.Stats
		if gaps != nil {
			gaps.ResetHostGaps()
		}
		start := time.Now()
		var hs []*loader.Handle
		next := 0
		for next < len(work) || s.eng.Busy() {
			now := time.Since(start)
			for next < len(work) && work[next].at <= now {
				h, err := s.eng.Submit(work[next].req)
				if err != nil {
					return res, err
				}
				h.Submitted = start.Add(work[next].at)
				hs = append(hs, h)
				next++
			}
			worked, err := s.eng.Step()
			if err != nil {
				return res, err
			}
			if !worked && next < len(work) {
				time.Sleep(min(time.Millisecond, work[next].at-time.Since(start)))
			}
		}
		el := time.Since(start).Seconds()
		ts := make([]timing, len(hs))
		digest := sha256.New()
		for i, h := range hs {
			fmt.Fprintln(digest, h.Result.Tokens)
			ts[i] = timing{submitted: h.Submitted, tokens: h.TokenTimes, prompt: len(work[i].req.Prompt)}
		}
		r := onlineRun{latency: measure(ts, el),
			Steps: s.eng.Stats.Steps - before.Steps, PrefillSteps: s.eng.Stats.PrefillSteps - before.PrefillSteps,
			PaddedRows: s.eng.Stats.PaddedRows - before.PaddedRows, HostGapUs: hostGapUs(gaps), TokensSHA256: hex.EncodeToString(digest.Sum(nil))}
		kind := "measured"
		if run < f.warmup {
			kind = "warm-up"
		} else {
			res.Runs = append(res.Runs, r)
		}
		f.progress("online run %d (%s): mean ITL %.3f ms, P99 ITL %.3f ms, mean TTFT %.2f ms, %.0f tok/s",
			run, kind, r.MeanITLms, r.P99ITLms, r.MeanTTFTms, r.TokPerS)
	}
	var lats []latency
	for _, r := range res.Runs {
		lats = append(lats, r.latency)
		res.Mean.Steps += r.Steps
		res.Mean.PrefillSteps += r.PrefillSteps
		res.Mean.PaddedRows += r.PaddedRows
		res.Mean.HostGapUs += r.HostGapUs
	}
	res.Mean.latency = meanLatency(lats)
	if n := len(res.Runs); n > 0 {
		res.Mean.TokensSHA256 = res.Runs[0].TokensSHA256 // the mean has a digest when every run agrees
		for _, r := range res.Runs {
			if r.TokensSHA256 != res.Mean.TokensSHA256 {
				res.Mean.TokensSHA256 = ""
			}
		}
		res.Mean.Steps, res.Mean.PrefillSteps, res.Mean.PaddedRows = res.Mean.Steps/n, res.Mean.PrefillSteps/n, res.Mean.PaddedRows/n
		res.Mean.HostGapUs /= float64(n)
	}
	return res, nil
}

func mean(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	var s float64
	for _, x := range xs {
		s += x
	}
	return s / float64(len(xs))
}

func percentile(xs []float64, p float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	ys := append([]float64(nil), xs...)
	sort.Float64s(ys)
	return ys[min(len(ys)-1, int(math.Ceil(p*float64(len(ys))))-1)]
}
