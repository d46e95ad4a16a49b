package cuda

import (
	"bytes"
	_ "embed"
	"encoding/json"
	"fmt"

	"xmix/input"
)

// GemmPick is cuBLASLt's algorithm for one GEMM shape on one GPU and library version, chosen
// by timing (`xmix tune-gemm`, TuneGemms) among the library's own heuristic results and their
// split-K variants. The heuristic's first result is a model's estimate; at decode shapes (a
// few rows against a whole weight) another of its results is often faster: on the H200 the
// picks shortened Llama-3.1-8B's graph steps of 8-128 rows by about 1% and Llama-3.2-1B's of
// 128 rows by 1.9% (testsuite/gpu/RESULTS.md, session 25). A pick names its algorithm by
// configuration (algorithm, tile, stages, split-K), not by its rank, so a library that orders
// its results differently still finds it, and one that no longer offers it gets the first
// result. The choice is a table, not a timing at load: a run's GEMM numerics (split-K changes
// the order of the sums) then depend only on the table, the GPU and the library.
type GemmPick struct {
	Device   string `json:"device"`   // GPU name, as cuDeviceGetName reports it
	CublasLt int    `json:"cublaslt"` // cublasLtGetVersion
	M        int    `json:"m"`        // rows of x (the bucket)
	N        int    `json:"n"`        // columns of y (rows of w)
	K        int    `json:"k"`
	// The algorithm's configuration (cublasLtMatmulAlgoConfigAttributes_t): its id, tile,
	// stages, K splits (1: none), CTA swizzling, custom option, inner and cluster shapes.
	Algo    int `json:"algo"`
	Tile    int `json:"tile"`
	Stages  int `json:"stages"`
	Split   int `json:"split"`
	Swizzle int `json:"swizzle"`
	Custom  int `json:"custom"`
	Inner   int `json:"inner"`
	Cluster int `json:"cluster"`
	// What the tuning measured, µs a call with the weights cold: this pick and the
	// heuristic's first result. For reading only.
	Us          float64 `json:"us"`
	HeuristicUs float64 `json:"heuristic_us"`
}

// maxPickDim bounds a pick's m, n and k: no GEMM of a bundle comes near it, and a table
// entry past it is a typo.
const maxPickDim = 1 << 24

// maxSplitK bounds a pick's split: cuBLASLt offers far fewer.
const maxSplitK = 64

// pickKey identifies the GEMM a pick serves.
type pickKey struct {
	device  string
	version int
	m, n, k int
}

func (p GemmPick) key() pickKey { return pickKey{p.Device, p.CublasLt, p.M, p.N, p.K} }

// defaultGemmPicks is the table xmix ships: `xmix tune-gemm` on the GPUs it was measured on
// (testsuite/gpu/tune_gemm.sh writes it), the picks kept where they shortened the step. On
// the H100 80GB that is Llama-3.2-1B's gate/up and LM head at 8 and 16 rows (steps 1.0-1.3%
// shorter) and its 128-row set, q/k/v, gate/up, down and the LM head (0.5% shorter in
// session 83, 0.4-0.7% in session 82, where the set missed the keep rule by 0.1 point);
// Llama-3.1-8B's picks shortened its steps by 0.1-0.4%, under the 0.5% kept
// (testsuite/gpu/RESULTS.md, sessions 82-83).
//
//go:embed gemm_picks.json
var defaultGemmPicks []byte

// DefaultGemmPicks returns the shipped table.
func DefaultGemmPicks() ([]GemmPick, error) {
	return parseGemmPicks("the shipped table (loader/cuda/gemm_picks.json)", defaultGemmPicks)
}

// ReadGemmPicks reads a table `xmix tune-gemm` wrote.
func ReadGemmPicks(path string) ([]GemmPick, error) {
	data, err := input.Read(path, input.GemmPicks)
	if err != nil {
		return nil, err
	}
	return parseGemmPicks(path, data)
}

func parseGemmPicks(name string, data []byte) ([]GemmPick, error) {
	var picks []GemmPick
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&picks); err != nil {
		return nil, fmt.Errorf("%s: %w (want a JSON list of picks as xmix tune-gemm writes it)", name, err)
	}
	seen := map[pickKey]bool{}
	for i, p := range picks {
		if err := p.check(); err != nil {
			return nil, fmt.Errorf("%s: pick %d: %w", name, i, err)
		}
		if seen[p.key()] {
			return nil, fmt.Errorf("%s: pick %d: a second pick for %dx%dx%d on %s, cuBLASLt %d: keep one", name, i, p.M, p.N, p.K, p.Device, p.CublasLt)
		}
		seen[p.key()] = true
	}
	return picks, nil
}

func (p GemmPick) check() error {
	switch {
	case p.Device == "" || p.CublasLt <= 0:
		return fmt.Errorf("device %q, cublaslt %d: name the GPU and the cuBLASLt version it was tuned on", p.Device, p.CublasLt)
	case p.M <= 0 || p.N <= 0 || p.K <= 0 || p.M > maxPickDim || p.N > maxPickDim || p.K > maxPickDim:
		return fmt.Errorf("shape %dx%dx%d: m, n and k must be 1 to %d", p.M, p.N, p.K, maxPickDim)
	case min(p.Algo, p.Tile, p.Stages, p.Swizzle, p.Custom, p.Inner, p.Cluster) < 0:
		return fmt.Errorf("algo %d, tile %d, stages %d, swizzle %d, custom %d, inner %d, cluster %d: none may be negative",
			p.Algo, p.Tile, p.Stages, p.Swizzle, p.Custom, p.Inner, p.Cluster)
	case p.Split < 1 || p.Split > maxSplitK:
		return fmt.Errorf("split %d: must be 1 to %d", p.Split, maxSplitK)
	}
	return nil
}

// gemmPicks indexes the picks for one GPU and library version.
type gemmPicks map[GemmShape]GemmPick

// picksFor keeps the picks tuned on device with cuBLASLt version.
func picksFor(all []GemmPick, device string, version int) gemmPicks {
	m := gemmPicks{}
	for _, p := range all {
		if p.Device == device && p.CublasLt == version {
			m[GemmShape{p.M, p.N, p.K}] = p
		}
	}
	return m
}

// ltConfig is one of cuBLASLt's algorithm configurations (GemmPick's fields).
type ltConfig struct{ algo, tile, stages, split, swizzle, custom, inner, cluster int }

func (c ltConfig) String() string {
	return fmt.Sprintf("algo %d tile %d stages %d split %d", c.algo, c.tile, c.stages, c.split)
}

// config is the configuration p names.
func (p GemmPick) config() ltConfig {
	return ltConfig{p.Algo, p.Tile, p.Stages, p.Split, p.Swizzle, p.Custom, p.Inner, p.Cluster}
}

// Algorithm names p's algorithm, as tune-gemm prints it.
func (p GemmPick) Algorithm() string { return p.config().String() }

// pick is the GemmPick of configuration c for shape s on device with cuBLASLt version, with
// what tuning measured (config's inverse).
func (c ltConfig) pick(device string, version int, s GemmShape, us, heuristicUs float64) GemmPick {
	return GemmPick{Device: device, CublasLt: version, M: s.M, N: s.N, K: s.K,
		Algo: c.algo, Tile: c.tile, Stages: c.stages, Split: c.split, Swizzle: c.swizzle, Custom: c.custom,
		Inner: c.inner, Cluster: c.cluster, Us: us, HeuristicUs: heuristicUs}
}

// matches says whether a heuristic result of configuration c serves pick p: the same but
// for the split, which is then set to p's.
func (p GemmPick) matches(c ltConfig) bool {
	c.split = p.Split
	return c == p.config()
}
