package loader

import (
	"fmt"
	"runtime"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"xmix/bundle"
	"xmix/safetensors"
)

// source makes the bytes of one buffer for one rank: its parts of checkpoint tensors,
// converted to the buffer's dtype, or synthetic values. Any run of whole elements can be made
// on its own, so several readers fill one buffer at once and a device gets it in chunks.
type source struct {
	buf   bundle.Buffer
	esz   int
	size  int64
	ts    []*safetensors.Tensor
	parts []part
	first []int     // the buffer element where each part starts
	synth *synthGen // synthetic weights instead of parts
}

// source prepares buffer buf of rank: the same checks as FillRank, before anything is read.
func (w *Weights) source(buf bundle.Buffer, rank int) (*source, error) {
	if err := checkRank(rank, w.tp); err != nil {
		return nil, fmt.Errorf("buffer %s: %w", buf.Name, err)
	}
	if w.synth != nil {
		size, err := BufferBytes(buf)
		if err != nil {
			return nil, err
		}
		esz, _ := DtypeSize(buf.Dtype)
		g := newSynthGen(buf, w.synth, w.tp, rank)
		return &source{buf: buf, esz: esz, size: size, synth: &g}, nil
	}
	ts, err := w.ck.Sources(buf)
	if err != nil {
		return nil, err
	}
	ms := make([]matrix, len(ts))
	for i, t := range ts {
		ms[i] = asMatrix(t.Shape)
	}
	return partsSource(buf, ts, shardParts(buf.Shard, ms, w.tp, rank))
}

// partsSource is the source of buf made of parts of tensors ts; the parts must lie inside
// their tensors and fill the buffer exactly.
func partsSource(buf bundle.Buffer, ts []*safetensors.Tensor, parts []part) (*source, error) {
	size, err := BufferBytes(buf)
	if err != nil {
		return nil, err
	}
	esz, _ := DtypeSize(buf.Dtype)
	s := &source{buf: buf, esz: esz, size: size, ts: ts, parts: parts, first: make([]int, len(parts))}
	n := 0
	for i, p := range parts {
		t := ts[p.t]
		tsz, ok := safetensors.DtypeSize(t.Dtype)
		if !ok || (p.lo+p.n)*tsz > len(t.Data) {
			return nil, fmt.Errorf("weight tensor %s: elements [%d,%d) outside its %d bytes of %s", t.Name, p.lo, p.lo+p.n, len(t.Data), t.Dtype)
		}
		s.first[i] = n
		n += p.n
	}
	if int64(n)*int64(esz) != size {
		return nil, fmt.Errorf("buffer %s of shape %v: %d bytes, its tensors fill %d", buf.Name, buf.Shape, size, int64(n)*int64(esz))
	}
	return s, nil
}

// fill writes the buffer's bytes [off, off+len(dst)) into dst; both ends fall on elements.
func (s *source) fill(off int64, dst []byte) error {
	esz := int64(s.esz)
	if off < 0 || off%esz != 0 || int64(len(dst))%esz != 0 || off+int64(len(dst)) > s.size {
		return fmt.Errorf("buffer %s: bytes [%d,%d) are not whole elements of its %d bytes", s.buf.Name, off, off+int64(len(dst)), s.size)
	}
	lo, n := int(off/esz), len(dst)/s.esz
	if s.synth != nil {
		s.synth.fill(lo, s.esz, dst)
		return nil
	}
	k := sort.Search(len(s.first), func(k int) bool { return s.first[k] > lo }) - 1
	for at := 0; at < n; k++ {
		p, t := s.parts[k], s.ts[s.parts[k].t]
		skip := lo + at - s.first[k]
		m := min(p.n-skip, n-at)
		tsz, _ := safetensors.DtypeSize(t.Dtype)
		from := (p.lo + skip) * tsz
		view := &safetensors.Tensor{Name: t.Name, Dtype: t.Dtype, Shape: []int{m}, Data: t.Data[from : from+m*tsz]}
		if len(view.Data) >= prefetchBytes {
			safetensors.Prefetch(view.Data)
		}
		if err := convert(view, s.buf.Dtype, dst[at*s.esz:(at+m)*s.esz]); err != nil {
			return fmt.Errorf("weight tensor %s: %w", t.Name, err)
		}
		at += m
	}
	return nil
}

// prefetchBytes is the smallest run of a tensor that fill asks the kernel to read ahead at
// once (safetensors.Prefetch): a cold checkpoint then reads in runs of up to a chunk instead
// of a readahead window per page fault; smaller runs (one row of a column-cut shard) are not
// worth a system call each.
const prefetchBytes = 1 << 20

// LoadOptions configure FillAll and Upload.
type LoadOptions struct {
	// Readers is how many goroutines read and convert the checkpoint at once (0:
	// DefaultReaders).
	Readers int
	// Progress gets a line at every tenth of the bytes and at the end: bytes, GB/s, time
	// left (may be nil).
	Progress func(format string, args ...any)
	// chunk overrides ChunkBytes for FillAll, every progressEvery (tests cut small buffers
	// into many chunks and want every progress line).
	chunk int
	every time.Duration
}

// progressEvery is the least time between two progress lines of a load: a load of a
// second or less says only how it went.
const progressEvery = 500 * time.Millisecond

// DefaultReaders is the readers of a load: enough to keep a host-to-device link of about
// 50 GB/s busy from the page cache (a reader copies about 5-10 GB/s), at most the CPUs.
func DefaultReaders() int { return min(8, runtime.GOMAXPROCS(0)) }

// ChunkBytes is the most bytes of a buffer one read makes at once: big enough that a
// host-to-device copy of it runs at the link's speed, small enough that a few per reader
// stay in flight in little staging memory.
const ChunkBytes = 8 << 20

func (o LoadOptions) readers(jobs int) int {
	n := o.Readers
	if n <= 0 {
		n = DefaultReaders()
	}
	return max(1, min(n, jobs))
}

// loadJob is one chunk of one buffer: bytes [off, off+n) of sources[buf].
type loadJob struct {
	buf int
	off int64
	n   int
}

// planLoad prepares every buffer's source and cuts the buffers into chunks of at most chunk
// bytes, in buffer order, so that the readers go through the checkpoint roughly in file order.
func (w *Weights) planLoad(bufs []bundle.Buffer, rank int, chunk int) ([]*source, []loadJob, int64, error) {
	srcs := make([]*source, len(bufs))
	var jobs []loadJob
	var total int64
	for i, buf := range bufs {
		s, err := w.source(buf, rank)
		if err != nil {
			return nil, nil, 0, err
		}
		srcs[i] = s
		step := int64(chunk) / int64(s.esz) * int64(s.esz)
		if step <= 0 {
			return nil, nil, 0, fmt.Errorf("load chunks of %d bytes cannot hold an element of buffer %s", chunk, buf.Name)
		}
		for off := int64(0); off < s.size; off += step {
			jobs = append(jobs, loadJob{buf: i, off: off, n: int(min(step, s.size-off))})
		}
		total += s.size
	}
	return srcs, jobs, total, nil
}

// FillAll fills dsts[i] with the bytes of bufs[i] for rank (each len(dsts[i]) = its size),
// reading with several goroutines at once; see LoadOptions.
func (w *Weights) FillAll(bufs []bundle.Buffer, rank int, dsts [][]byte, opt LoadOptions) error {
	if len(dsts) != len(bufs) {
		return fmt.Errorf("FillAll: %d buffers, %d destinations", len(bufs), len(dsts))
	}
	chunk := opt.chunk
	if chunk <= 0 {
		chunk = ChunkBytes
	}
	srcs, jobs, total, err := w.planLoad(bufs, rank, chunk)
	if err != nil {
		return err
	}
	for i, s := range srcs {
		if int64(len(dsts[i])) != s.size {
			return fmt.Errorf("buffer %s: %d bytes given, it has %d", bufs[i].Name, len(dsts[i]), s.size)
		}
	}
	m := newMeter(total, opt)
	var next atomic.Int64
	var failed atomic.Bool
	done := make(chan int, 64)
	errs := make(chan error, 1)
	var wg sync.WaitGroup
	for range opt.readers(len(jobs)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !failed.Load() {
				i := int(next.Add(1) - 1)
				if i >= len(jobs) {
					return
				}
				j := jobs[i]
				if err := srcs[j.buf].fill(j.off, dsts[j.buf][j.off:j.off+int64(j.n)]); err != nil {
					if !failed.Swap(true) {
						errs <- err
					}
					return
				}
				done <- j.n
			}
		}()
	}
	go func() { wg.Wait(); close(done) }()
	for n := range done {
		m.add(n)
	}
	select {
	case err := <-errs:
		return err
	default:
	}
	m.finish(opt.readers(len(jobs)))
	return nil
}

// WeightChunk is bytes [Off, Off+len(Data)) of buffer Buf, staged in host memory.
type WeightChunk struct {
	Buf  int // index into the buffers given to Upload
	Off  int64
	Data []byte
}

// Uploader is a device's side of Upload: it copies staged chunks to its buffers
// asynchronously and reports their completion in the order it was given them.
type Uploader interface {
	// Staging is the host memory chunks are staged in (pinned, on a GPU): equal slices,
	// each a chunk; Upload never has more chunks in flight than slices.
	Staging() [][]byte
	// Upload starts copying c.Data to its buffer. c.Data must stay untouched until the
	// upload completes.
	Upload(c WeightChunk) error
	// Done reports whether the oldest unfinished upload has completed; with wait it blocks
	// until it has.
	Done(wait bool) (bool, error)
}

// Upload streams the bytes of bufs for rank to a device: readers fill the uploader's
// staging chunks from the checkpoint (several at once, in any order, converting dtypes and
// cutting ranks' parts), while the calling goroutine hands each filled chunk to up and
// gives chunks whose copy has completed back to the readers. Reading, conversion and the
// copies of different chunks overlap across tensors and shards. Upload returns when every
// copy has completed, or at the first error once no reader touches the staging memory and
// no copy it started is left running.
func (w *Weights) Upload(bufs []bundle.Buffer, rank int, up Uploader, opt LoadOptions) error {
	staging := up.Staging()
	if len(staging) == 0 || len(staging[0]) == 0 {
		return fmt.Errorf("upload: no staging memory")
	}
	srcs, jobs, total, err := w.planLoad(bufs, rank, len(staging[0]))
	if err != nil {
		return err
	}
	readers := opt.readers(len(jobs))
	free := make(chan []byte, len(staging))
	for _, s := range staging {
		free <- s
	}
	ready := make(chan WeightChunk, len(staging))
	stop := make(chan struct{})
	var stopOnce sync.Once
	var readErr error
	halt := func(err error) {
		stopOnce.Do(func() { readErr = err; close(stop) })
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	for range readers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= len(jobs) {
					return
				}
				j := jobs[i]
				var b []byte
				select {
				case b = <-free:
				case <-stop:
					return
				}
				if err := srcs[j.buf].fill(j.off, b[:j.n]); err != nil {
					halt(err)
					return
				}
				select {
				case ready <- WeightChunk{Buf: j.buf, Off: j.off, Data: b[:j.n]}:
				case <-stop:
					return
				}
			}
		}()
	}
	readersDone := make(chan struct{})
	go func() { wg.Wait(); close(ready); close(readersDone) }()

	m := newMeter(total, opt)
	var inflight []WeightChunk
	retire := func(wait bool) (bool, error) {
		ok, err := up.Done(wait)
		if err != nil || !ok {
			return false, err
		}
		c := inflight[0]
		inflight = inflight[1:]
		m.add(len(c.Data))
		free <- c.Data[:cap(c.Data)]
		return true, nil
	}
	// fail stops the readers and waits for them and for the copies in flight, so that the
	// caller may free the staging memory.
	fail := func(err error) error {
		halt(err)
		for range ready {
		}
		<-readersDone
		for len(inflight) > 0 {
			if _, werr := retire(true); werr != nil {
				break
			}
		}
		return err
	}
	for {
		for len(inflight) > 0 {
			ok, err := retire(false)
			if err != nil {
				return fail(err)
			}
			if !ok {
				break
			}
		}
		var c WeightChunk
		var more bool
		if len(inflight) > 0 {
			select {
			case c, more = <-ready:
			default:
				// Nothing read yet: wait on the oldest copy instead of spinning.
				if _, err := retire(true); err != nil {
					return fail(err)
				}
				continue
			}
		} else {
			c, more = <-ready
		}
		if !more {
			break
		}
		if err := up.Upload(c); err != nil {
			return fail(fmt.Errorf("uploading %s: %w", bufs[c.Buf].Name, err))
		}
		inflight = append(inflight, c)
	}
	<-readersDone
	for len(inflight) > 0 {
		if _, err := retire(true); err != nil {
			return fail(err)
		}
	}
	if readErr != nil {
		return readErr
	}
	m.finish(readers)
	return nil
}

// meter reports a load's progress: a line at every tenth of the bytes (at most one per
// progressEvery) with the rate so far and the time left at that rate, and a last line with
// the whole load's rate.
type meter struct {
	total, done, next int64
	start, last       time.Time
	every             time.Duration
	progress          func(string, ...any)
}

func newMeter(total int64, opt LoadOptions) *meter {
	p := opt.Progress
	if p == nil {
		p = func(string, ...any) {}
	}
	every := opt.every
	if every == 0 {
		every = progressEvery
	}
	now := time.Now()
	return &meter{total: total, next: total / 10, start: now, last: now, every: every, progress: p}
}

func (m *meter) add(n int) {
	m.done += int64(n)
	if m.done < m.next || m.done >= m.total {
		return
	}
	for m.next <= m.done {
		m.next += max(1, m.total/10)
	}
	now := time.Now()
	if now.Sub(m.last) < m.every {
		return
	}
	m.last = now
	el := now.Sub(m.start).Seconds()
	rate := float64(m.done) / max(el, 1e-9)
	m.progress("weights: %3.0f%% (%.2f of %.2f GB), %.1f GB/s, %.1f s left",
		100*float64(m.done)/float64(m.total), float64(m.done)/1e9, float64(m.total)/1e9, rate/1e9, float64(m.total-m.done)/rate)
}

func (m *meter) finish(readers int) {
	el := time.Since(m.start).Seconds()
	m.progress("weights: %.2f GB in %.2f s (%.1f GB/s, %d readers)", float64(m.total)/1e9, el, float64(m.total)/max(el, 1e-9)/1e9, readers)
}
