package cpu

import (
	"errors"
	"fmt"
	"sync"

	"xmix/bundle"
	"xmix/ops"
)

// Tensor parallelism in one process: each rank replays the template on its own goroutine
// over its own buffers, exactly as a GPU rank replays its graph, and meets the others only
// at collective nodes. An in-process communicator stands in for NCCL: a barrier, and sums
// added in rank order so every rank gets the same bits on every run.

// collective is a Collective node bound to this rank's memory.
type collective struct {
	op         string
	in, out    []float32
	rows, cols int
}

func (rk *rank) bindCollective(c *bundle.Collective) (*collective, error) {
	view := func(name string, n int) ([]float32, error) {
		mem, ok := rk.bufs[name]
		if !ok || 4*n > len(mem) {
			return nil, fmt.Errorf("collective %s: buffer %q is missing or smaller than %d f32", c.Op, name, n)
		}
		return ops.Arg{Mem: mem}.F32()[:n], nil
	}
	n := c.Rows * c.Cols
	outN := n
	switch c.Op {
	case bundle.AllReduceSum:
	case bundle.AllGatherCols:
		outN = n * rk.tp
	default:
		return nil, fmt.Errorf("unknown collective %q", c.Op)
	}
	in, err := view(c.In, n)
	if err != nil {
		return nil, err
	}
	out, err := view(c.Out, outN)
	if err != nil {
		return nil, err
	}
	return &collective{op: c.Op, in: in, out: out, rows: c.Rows, cols: c.Cols}, nil
}

// exchanger is how a rank meets the others at collective nodes: in one process (comm) or
// through rank 0 over TCP (hub on rank 0, spoke on the others, in group.go). Every kind
// adds in rank order, so all give the same bits.
type exchanger interface {
	allReduceSum(id int, x []float32) error
	allGatherCols(id int, in, out []float32, rows, cols int) error
}

// run performs the exchange for rank id.
func (c *collective) run(cm exchanger, id int) error {
	if cm == nil {
		return fmt.Errorf("collective %s outside a tensor-parallel step", c.op)
	}
	if c.op == bundle.AllReduceSum {
		return cm.allReduceSum(id, c.in)
	}
	return cm.allGatherCols(id, c.in, c.out, c.rows, c.cols)
}

// comm connects the ranks of one step. Every collective is publish, barrier, read the
// others, barrier: the second barrier keeps a rank from publishing its next buffer while
// another still reads the last one.
type comm struct {
	n       int
	mu      sync.Mutex
	cond    *sync.Cond
	arrived int
	round   int
	err     error
	shared  [][]float32 // each rank's published buffer
}

func newComm(n int) *comm {
	c := &comm{n: n, shared: make([][]float32, n)}
	c.cond = sync.NewCond(&c.mu)
	return c
}

// errAborted is what ranks waiting at a barrier get once another rank failed.
var errAborted = errors.New("another rank failed")

// barrier returns once every rank has reached it, or errAborted once one has failed.
func (c *comm) barrier() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return c.err
	}
	round := c.round
	if c.arrived++; c.arrived == c.n {
		c.arrived = 0
		c.round++
		c.cond.Broadcast()
		return nil
	}
	for round == c.round && c.err == nil {
		c.cond.Wait()
	}
	if round == c.round {
		return c.err
	}
	return nil
}

// abort releases every rank waiting at a barrier, and every later one, with errAborted.
func (c *comm) abort() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.err = errAborted
	c.cond.Broadcast()
}

// exchange publishes x as rank id's buffer and runs read once every rank has published,
// keeping every buffer published until every rank has read.
func (c *comm) exchange(id int, x []float32, read func(all [][]float32)) error {
	c.shared[id] = x
	if err := c.barrier(); err != nil {
		return err
	}
	read(c.shared)
	return c.barrier()
}

// allReduceSum replaces x on every rank by the sum over ranks, added in rank order.
func (c *comm) allReduceSum(id int, x []float32) error {
	var sum []float32
	err := c.exchange(id, x, func(all [][]float32) { sum = sumInRankOrder(all, len(x)) })
	if err != nil {
		return err
	}
	copy(x, sum)
	return nil
}

// sumInRankOrder adds the first n elements of every rank's part, rank 0 first, from zero:
// the one order every exchanger uses, so in-process and multi-process runs agree bit for bit.
func sumInRankOrder(all [][]float32, n int) []float32 {
	sum := make([]float32, n)
	for _, part := range all {
		for i, v := range part[:n] {
			sum[i] += v
		}
	}
	return sum
}

// gatherCols writes out[row, r*cols+j] = all[r][row, j].
func gatherCols(all [][]float32, out []float32, rows, cols int) {
	n := len(all)
	for r, part := range all {
		for row := range rows {
			copy(out[(row*n+r)*cols:(row*n+r+1)*cols], part[row*cols:(row+1)*cols])
		}
	}
}

// allGatherCols writes out[row, r*cols+j] = rank r's in[row, j].
func (c *comm) allGatherCols(id int, in, out []float32, rows, cols int) error {
	return c.exchange(id, in, func(all [][]float32) { gatherCols(all, out, rows, cols) })
}

// stepRanks replays template t on every rank at once, one goroutine each. The first rank
// to fail aborts the others, so none waits forever at a barrier; its error is returned. A
// rank that panics aborts them too, and its panic is raised again here, once all have ended
// (ops.WorkerPanics).
func stepRanks(ranks []*rank, t int) error {
	c := newComm(len(ranks))
	errs := make([]error, len(ranks))
	var wg sync.WaitGroup
	var panics ops.WorkerPanics
	for i, rk := range ranks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer panics.Catch(c.abort)
			if errs[i] = rk.step(t, c); errs[i] != nil {
				c.abort()
			}
		}()
	}
	wg.Wait()
	panics.Raise()
	for i, err := range errs {
		if err != nil && !errors.Is(err, errAborted) {
			return fmt.Errorf("rank %d: %w", i, err)
		}
	}
	for i, err := range errs {
		if err != nil {
			return fmt.Errorf("rank %d: %w", i, err)
		}
	}
	return nil
}
