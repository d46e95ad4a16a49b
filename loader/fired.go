package loader

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math/bits"
	"slices"
	"strings"

	"xmix/bundle"
)

// Proof of firing. For every op of every app a request enables, Result.Fired counts the
// (token row, layer) sites where the op actually changed or read the row in this request:
// the MI kernels write, on each row with the app's bit, a byte per site (1: fired, 0: its
// conditions, or a clamp already within bounds, left the row alone) into the app's fired
// buffer, which the engine reads after the step when some row enables the app. Custom
// kernels and logit lenses take no conditions; the engine counts their rows itself.

// FiredCount is how many sites one op fired at: Name is "app.opN".
type FiredCount struct {
	Name  string
	Sites int
}

// Fired are a request's counts, an entry per op of each enabled app, in manifest order.
type Fired []FiredCount

// Get returns the count of op name ("app.opN"), or -1 when the request has no such op.
func (f Fired) Get(name string) int {
	for _, c := range f {
		if c.Name == name {
			return c.Sites
		}
	}
	return -1
}

// MarshalJSON writes the counts as one object, name to count.
func (f Fired) MarshalJSON() ([]byte, error) {
	return marshalNamed(f == nil, len(f), func(i int) string { return f[i].Name }, func(i int) any { return f[i].Sites })
}

// UnmarshalJSON reads what MarshalJSON writes, keeping the order.
func (f *Fired) UnmarshalJSON(b []byte) error {
	out, err := unmarshalNamed(b, "fired", "op name to count", func(name string, dec *json.Decoder) (FiredCount, error) {
		c := FiredCount{Name: name}
		err := dec.Decode(&c.Sites)
		return c, err
	})
	if err != nil {
		return err
	}
	*f = out
	return nil
}

// firedApp is what the engine counts of one app.
type firedApp struct {
	bit    int
	buffer string // "" when no site is counted on the device
	width  int    // bytes per row of buffer (a byte per device site, in whole words)
	ops    []int  // the app's op indices, ascending: a request's entries in this order
	// The sites, by who counts them: the device on every row (rows) or on sampled rows only
	// (sampled), as runs of columns per op, and the host on every row with the bit (host).
	rows, sampled []firedRun
	host          []int // entries (indices into ops)
}

// firedRun is an op's device bytes [lo, hi) of a row: the codegen numbers an app's sites by
// op, then layer.
type firedRun struct{ entry, lo, hi int }

// initFired reads the apps' fired sites and checks their buffers.
func (e *Engine) initFired(bufs map[string]bundle.Buffer) error {
	for _, a := range e.B.Manifest.Apps {
		fa := firedApp{bit: a.Bit, buffer: a.FiredBuffer}
		for _, s := range a.Fired {
			if !slices.Contains(fa.ops, s.Op) {
				fa.ops = append(fa.ops, s.Op)
			}
			fa.width = max(fa.width, s.Column+1)
		}
		fa.width = (fa.width + 3) / 4 * 4
		slices.Sort(fa.ops)
		sites := slices.Clone(a.Fired) // by column, so that each op's columns form runs
		slices.SortStableFunc(sites, func(x, y bundle.FiredSite) int { return x.Column - y.Column })
		for _, s := range sites {
			entry := slices.Index(fa.ops, s.Op)
			runs := &fa.rows
			if s.Samples {
				runs = &fa.sampled
			}
			switch last := len(*runs) - 1; {
			case s.Column >= 0 && a.FiredBuffer == "" || s.Column < -1:
				return fmt.Errorf("app %s: fired site of op %d at column %d without a fired buffer", a.Name, s.Op, s.Column)
			case s.Column < 0:
				fa.host = append(fa.host, entry)
			case last >= 0 && (*runs)[last].entry == entry && (*runs)[last].hi == s.Column:
				(*runs)[last].hi++
			default:
				*runs = append(*runs, firedRun{entry, s.Column, s.Column + 1})
			}
		}
		if a.FiredBuffer != "" {
			fb, ok := bufs[a.FiredBuffer]
			if !ok || fb.Kind != bundle.KindOutput || fb.Dtype != "u32" || len(fb.Shape) != 2 || fb.Shape[0] < e.maxT || 4*fb.Shape[1] != fa.width {
				return fmt.Errorf("app %s: fired buffer %q is not an output buffer of [%d, %d] u32", a.Name, a.FiredBuffer, e.maxT, fa.width/4)
			}
		}
		e.fired = append(e.fired, fa)
	}
	return nil
}

// startFired gives a request an entry per op of each app it enables.
func (e *Engine) startFired(s *seqState) {
	for i, fa := range e.fired {
		if s.mask&(1<<uint(fa.bit)) == 0 || len(fa.ops) == 0 {
			continue
		}
		if s.firedAt == nil {
			s.firedAt = make([]int, len(e.fired))
		}
		s.firedAt[i] = len(s.res.Fired)
		for _, op := range fa.ops {
			s.res.Fired = append(s.res.Fired, FiredCount{Name: fmt.Sprintf("%s.op%d", e.B.Manifest.Apps[i].Name, op)})
		}
	}
}

// collectFired adds the step's fired sites to each row's request. It runs every step for
// every app some row enables (six apps, 64 rows: about 7000 sites), so each row's bytes are
// counted eight at a time.
func (e *Engine) collectFired(rows []stepRow, n int) error {
	for i := range e.fired {
		fa := &e.fired[i]
		bit := uint32(1) << uint(fa.bit)
		on := false
		for _, r := range rows {
			if r.s.mask&bit != 0 {
				on = true
				break
			}
		}
		if !on {
			continue
		}
		var bytes []byte
		if fa.buffer != "" {
			bytes = e.scratch.firedBytes(n * fa.width)
			if err := e.Be.Read(fa.buffer, bytes); err != nil {
				return err
			}
		}
		// A request's rows are consecutive (a prompt chunk) or alone (decode): each run of
		// them is counted, then added to its request once.
		for lo := 0; lo < len(rows); {
			s, hi := rows[lo].s, lo+1
			for hi < len(rows) && rows[hi].s == s {
				hi++
			}
			if s.mask&bit != 0 {
				counts := s.res.Fired[s.firedAt[i]:]
				for _, c := range fa.rows {
					n := 0
					for ri := lo; ri < hi; ri++ {
						n += countFired(bytes[ri*fa.width+c.lo : ri*fa.width+c.hi])
					}
					counts[c.entry].Sites += n
				}
				for ri := lo; ri < hi && len(fa.sampled) > 0; ri++ {
					if rows[ri].sample >= 0 {
						for _, c := range fa.sampled {
							counts[c.entry].Sites += countFired(bytes[ri*fa.width+c.lo : ri*fa.width+c.hi])
						}
					}
				}
				for _, entry := range fa.host {
					counts[entry].Sites += hi - lo
				}
			}
			lo = hi
		}
	}
	return nil
}

// countFired counts the fired sites among b's bytes (each 0 or 1), eight at a time.
func countFired(b []byte) int {
	n := 0
	for len(b) >= 8 {
		n += bits.OnesCount64(binary.LittleEndian.Uint64(b) & 0x0101010101010101)
		b = b[8:]
	}
	for _, x := range b {
		n += int(x & 1)
	}
	return n
}

// StopWhen ends a request when an export of its rows crosses a threshold: Export names a
// one-value export of an app the request enables ("app.buffer"), Op is one of
// > >= < <= == !=. It is tested on the rows that sample a token (the last prompt row and
// every generated one): the token sampled there is the request's last, with reason
// "stop_when".
type StopWhen struct {
	Export string
	Op     string
	Value  float32
}

// resolveStop checks a request's StopWhen and returns a copy of it.
func (e *Engine) resolveStop(w *StopWhen, mask uint32) (*StopWhen, error) {
	if w == nil {
		return nil, nil
	}
	switch w.Op {
	case ">", ">=", "<", "<=", "==", "!=":
	default:
		return nil, fmt.Errorf("stop_when: op %q is not one of >, >=, <, <=, ==, !=", w.Op)
	}
	var names []string
	for _, x := range e.exports {
		if mask&(1<<uint(x.bit)) == 0 {
			continue
		}
		names = append(names, x.key)
		if x.key != w.Export {
			continue
		}
		if x.width != 1 {
			return nil, fmt.Errorf("stop_when: export %s has %d values per token; it needs one (a probe's score)", w.Export, x.width)
		}
		stop := *w
		return &stop, nil
	}
	if len(names) == 0 {
		return nil, fmt.Errorf("stop_when: export %s: the request enables no app with exports", w.Export)
	}
	return nil, fmt.Errorf("stop_when: export %s is not an export of the apps the request enables (exports: %s)", w.Export, strings.Join(names, ", "))
}

// crossed says whether the row's export crosses the threshold (false when the row has no
// value of it).
func (w *StopWhen) crossed(x Exports) bool {
	v := x.Get(w.Export)
	if len(v) == 0 {
		return false
	}
	switch w.Op {
	case ">":
		return v[0] > w.Value
	case ">=":
		return v[0] >= w.Value
	case "<":
		return v[0] < w.Value
	case "<=":
		return v[0] <= w.Value
	case "==":
		return v[0] == w.Value
	}
	return v[0] != w.Value
}
