package cpu

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"

	"xmix/ops"
)

// concurrently runs fn for every rank at once, rank id exchanging through comm(id), and
// returns their errors.
func concurrently(n int, comm func(id int) exchanger, fn func(c exchanger, id int) error) []error {
	errs := make([]error, n)
	var wg sync.WaitGroup
	for id := range n {
		c := comm(id)
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[id] = fn(c, id)
		}()
	}
	wg.Wait()
	return errs
}

// onRanks runs fn for every rank of a fresh in-process communicator at once and returns
// their errors.
func onRanks(_ *testing.T, n int, fn func(c exchanger, id int) error) []error {
	c := newComm(n)
	return concurrently(n, func(int) exchanger { return c }, fn)
}

// transports are the two ways ranks exchange: goroutines of one process, and processes
// linked through rank 0 over TCP (here over loopback). Both must give the same bits.
var transports = []struct {
	name string
	run  func(t *testing.T, n int, fn func(c exchanger, id int) error) []error
}{{"in process", onRanks}, {"tcp", overTCP}}

// TestAllReduceSumRankOrder: over many collectives in a row, every rank gets the bits of
// adding the ranks' values in rank order ((1e8 + 1) - 1e8 is 0 in float32; other orders
// give 1); both transports give the same bits.
func TestAllReduceSumRankOrder(t *testing.T) {
	vals := []float32{1e8, 1, -1e8}
	negZero := float32(math.Copysign(0, -1))
	const rounds = 20
	for _, tr := range transports {
		got := make([][]float32, len(vals))
		errs := tr.run(t, len(vals), func(c exchanger, id int) error {
			for r := range rounds {
				x := []float32{vals[id] * float32(r+1), float32(id), negZero}
				if err := c.allReduceSum(id, x); err != nil {
					return err
				}
				got[id] = append(got[id], x...)
			}
			return nil
		})
		for id, err := range errs {
			if err != nil {
				t.Fatalf("%s: rank %d: %v", tr.name, id, err)
			}
		}
		for id := range vals {
			for r := range rounds {
				a, b, c := vals[0]*float32(r+1), vals[1]*float32(r+1), vals[2]*float32(r+1)
				var zero float32 // sums start from +0, as in the communicators
				want := []float32{(a + b) + c, 0 + 1 + 2, ((zero + negZero) + negZero) + negZero}
				for i, w := range want {
					if g := got[id][3*r+i]; math.Float32bits(g) != math.Float32bits(w) {
						t.Fatalf("%s: rank %d round %d element %d: %v, want %v", tr.name, id, r, i, g, w)
					}
				}
			}
		}
	}
}

// TestAllGatherCols: rank r's columns land at r*cols of every row, on every rank.
func TestAllGatherCols(t *testing.T) {
	const n, rows, cols = 3, 2, 2
	for _, tr := range transports {
		outs := make([][]float32, n)
		errs := tr.run(t, n, func(c exchanger, id int) error {
			in := []float32{float32(10 * id), float32(10*id + 1), float32(10*id + 2), float32(10*id + 3)}
			outs[id] = make([]float32, rows*cols*n)
			return c.allGatherCols(id, in, outs[id], rows, cols)
		})
		want := "[0 1 10 11 20 21 2 3 12 13 22 23]"
		for id := range n {
			if errs[id] != nil {
				t.Fatalf("%s: %v", tr.name, errs[id])
			}
			if got := fmt.Sprint(outs[id]); got != want {
				t.Errorf("%s: rank %d: %s, want %s", tr.name, id, got, want)
			}
		}
	}
}

// TestStepRanksAbortsOnError: a rank that fails before a collective releases the others
// (no rank waits forever) and its error, not theirs, is reported.
func TestStepRanksAbortsOnError(t *testing.T) {
	var ranks []*rank
	for id := range 3 {
		fail := ops.RunnerFunc(func([]ops.Arg, ops.Launch) error {
			if id == 1 {
				return errors.New("bad input")
			}
			return nil
		})
		x := make([]float32, 4)
		ranks = append(ranks, rankOf(id, 3, nil, boundNode{label: "k", run: fail},
			boundNode{label: "reduce", coll: &collective{op: "all_reduce_sum", in: x, out: x, rows: 1, cols: 4}}))
	}
	err := stepRanks(ranks, 0)
	if err == nil || !strings.Contains(err.Error(), "rank 1: node k: bad input") {
		t.Fatalf("error %v, want rank 1's", err)
	}
}

// TestWriteRefusesShardedBuffer: the host cannot write a buffer whose ranks hold parts.
func TestWriteRefusesShardedBuffer(t *testing.T) {
	be := &Backend{ranks: []*rank{{bufs: map[string][]byte{"w": make([]byte, 8)}}, {bufs: map[string][]byte{"w": make([]byte, 8)}}},
		sharded: map[string]bool{"w": true}}
	if err := be.Write("w", 0, make([]byte, 8)); err == nil || !strings.Contains(err.Error(), "cut across 2 tensor-parallel ranks") {
		t.Fatalf("Write: %v", err)
	}
}
