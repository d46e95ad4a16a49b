package loader

import (
	"fmt"
	"math"
	"slices"
	"strings"

	"xmix/bundle"
)

// Per-request vectors. An app param declared per_request has, besides its compiled
// (default) buffer, a pool of VectorSlots device slots (bundle.Vector.Slots). A request that
// brings values (Request.Vectors) holds one slot from admission to its end: the engine writes
// into that slot of every per-request vector of the apps it enables either the request's
// value or the current default, and points its rows' ctl.vslot at it; the MI kernels read
// the slot instead of the default on those rows. Rows without a slot read the default
// buffers, exactly as a bundle without per-request params does. When every slot is held, a
// request that needs one waits in the queue (FIFO: requests behind it wait too);
// VectorSlots tells a server how many are left before it submits.

// prVector is one per-request vector buffer of the bundle (a param used both raw and as a
// unit direction has two).
type prVector struct {
	app         *appCtl
	param       string
	buffer      string // the compiled default
	slots       string // the pool, [VectorSlots, width] f32
	width       int
	unit        bool
	key         string // "app.param", as requests name it
	defaultData []byte // the current default, as the buffer holds it, for slots to copy
}

// vectorPool is the engine's view of the slots.
type vectorPool struct {
	total int
	free  []int // free slot indices, used from the end
	vecs  []*prVector
}

// initVectors finds the per-request vectors of the bundle and checks their pools.
func (e *Engine) initVectors(bufs map[string]bundle.Buffer) error {
	c := e.cfg
	var params map[string][]byte
	for _, a := range e.apps {
		for _, v := range a.vectors {
			if v.Slots == "" {
				continue
			}
			sb, ok := bufs[v.Slots]
			if !ok || sb.Kind != bundle.KindSlots || sb.Dtype != "f32" || len(sb.Shape) != 2 || sb.Shape[0] != c.VectorSlots || sb.Shape[1] != v.Width {
				return fmt.Errorf("app %s vector %s: slots %q are not a slots buffer of [%d, %d] f32", a.name, v.Param, v.Slots, c.VectorSlots, v.Width)
			}
			if params == nil {
				var err error
				if params, err = ParamTensors(e.B); err != nil {
					return err
				}
			}
			raw, ok := params[v.Buffer]
			if !ok || len(raw) != 4*v.Width {
				return fmt.Errorf("app %s vector %s: no default of %d values in the params section", a.name, v.Param, v.Width)
			}
			e.pool.vecs = append(e.pool.vecs, &prVector{app: a, param: v.Param, buffer: v.Buffer, slots: v.Slots, width: v.Width,
				unit: v.Unit, defaultData: raw, key: a.name + "." + v.Param})
		}
	}
	if len(e.pool.vecs) == 0 {
		return nil
	}
	if vs, ok := bufs[bundle.CtlVSlot]; !ok || vs.Kind != bundle.KindControl || vs.Dtype != "u32" {
		return fmt.Errorf("bundle has per-request vectors but no u32 control buffer %s", bundle.CtlVSlot)
	}
	if c.VectorSlots <= 0 || c.VectorSlots > c.MaxSeqs {
		return fmt.Errorf("bundle has %d vector slots for %d sequences", c.VectorSlots, c.MaxSeqs)
	}
	e.pool.total = c.VectorSlots
	for i := c.VectorSlots - 1; i >= 0; i-- {
		e.pool.free = append(e.pool.free, i)
	}
	return nil
}

// VectorSlots reports the per-request vector slots: how many a request submitted now would
// find free once the requests already waiting for one have theirs (0: it would wait, and a
// server may answer 429 instead), and how many the bundle has (0: it has no per_request
// params).
func (e *Engine) VectorSlots() (available, total int) {
	waiting := 0
	for _, s := range e.queue {
		if s.vecs != nil {
			waiting++
		}
	}
	return max(0, len(e.pool.free)-waiting), e.pool.total
}

// PerRequestVectors lists the names requests give per-request vectors by ("app.param"),
// with their widths.
func (e *Engine) PerRequestVectors() map[string]int {
	out := map[string]int{}
	for _, v := range e.pool.vecs {
		out[v.key] = v.width
	}
	return out
}

// resolveVectors checks a request's vectors: each names a per_request param of an app the
// request enables, has that param's width and only finite values (a direction also a
// non-zero norm). It returns them by pool vector, normalised where the buffer is a unit
// direction, or nil when the request brings none.
func (e *Engine) resolveVectors(r *Request, mask uint32) (map[*prVector][]float32, error) {
	if len(r.Vectors) == 0 {
		return nil, nil
	}
	var names []string // in manifest order, once each (a direction has a raw and a unit buffer)
	for _, v := range e.pool.vecs {
		if !slices.Contains(names, v.key) {
			names = append(names, v.key)
		}
	}
	out := map[*prVector][]float32{}
	for name, vals := range r.Vectors {
		appName, _, _ := strings.Cut(name, ".")
		found := false
		for _, v := range e.pool.vecs {
			if v.key != name {
				continue
			}
			found = true
			if mask&(1<<uint(v.app.bit)) == 0 {
				return nil, fmt.Errorf("vector %s: the request does not enable app %s (add it to apps)", name, appName)
			}
			if len(vals) != v.width {
				return nil, fmt.Errorf("vector %s: %d values, the app's kernels need %d", name, len(vals), v.width)
			}
			data, err := checkVector(vals, v.unit)
			if err != nil {
				return nil, fmt.Errorf("vector %s: %w", name, err)
			}
			out[v] = data
		}
		if !found {
			if len(names) == 0 {
				return nil, fmt.Errorf("vector %s: this bundle has no per_request params", name)
			}
			return nil, fmt.Errorf("vector %s is not a per_request param of a deployed app (per-request vectors: %s)", name, strings.Join(names, ", "))
		}
	}
	return out, nil
}

// checkVector refuses non-finite values and returns the values a buffer holds: v, or v
// normalised to unit length for a direction.
func checkVector(v []float32, unit bool) ([]float32, error) {
	var n float64
	for i, f := range v {
		if math.IsNaN(float64(f)) || math.IsInf(float64(f), 0) {
			return nil, fmt.Errorf("value %d is %v; want finite numbers", i, f)
		}
		n += float64(f) * float64(f)
	}
	if !unit {
		return v, nil
	}
	if n == 0 || math.IsInf(n, 0) {
		return nil, fmt.Errorf("it is a direction: it needs a finite, non-zero norm")
	}
	inv := 1 / math.Sqrt(n)
	out := make([]float32, len(v))
	for i, f := range v {
		out[i] = float32(float64(f) * inv)
	}
	return out, nil
}

// takeVectorSlot gives s a slot, when it brings vectors, and fills it; admit has checked
// that one is free.
func (e *Engine) takeVectorSlot(s *seqState) error {
	if s.vecs == nil {
		return nil
	}
	s.vslot = e.pool.free[len(e.pool.free)-1]
	e.pool.free = e.pool.free[:len(e.pool.free)-1]
	for _, v := range e.pool.vecs {
		if s.mask&(1<<uint(v.app.bit)) != 0 {
			if err := e.writeSlot(s, v); err != nil {
				return err
			}
		}
	}
	return nil
}

// writeSlot writes s's value of v into its slot: its own, or the current default.
func (e *Engine) writeSlot(s *seqState, v *prVector) error {
	data := v.defaultData
	if own, ok := s.vecs[v]; ok {
		data = putF32s(own)
	}
	if err := e.Be.Write(v.slots, int64(4*s.vslot*v.width), data); err != nil {
		return fmt.Errorf("vector %s slot %d: %w", v.key, s.vslot, err)
	}
	return nil
}

// releaseVectorSlot returns s's slot to the pool.
func (e *Engine) releaseVectorSlot(s *seqState) {
	if s.vslot >= 0 {
		e.pool.free = append(e.pool.free, s.vslot)
		s.vslot = -1
	}
}

// setDefaultVector records a replaced default of a per-request buffer and copies it into
// the slots of running requests that enable its app without bringing their own value, so
// that they see the new default from the next step, as rows without a slot do.
func (e *Engine) setDefaultVector(buffer string, data []float32) error {
	for _, v := range e.pool.vecs {
		if v.buffer != buffer {
			continue
		}
		v.defaultData = putF32s(data)
		for _, s := range e.slots {
			if s == nil || s.vslot < 0 || s.mask&(1<<uint(v.app.bit)) == 0 {
				continue
			}
			if _, own := s.vecs[v]; !own {
				if err := e.writeSlot(s, v); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// layerKey names an op's layer mask as requests do: "app.opN".
func layerKey(a *appCtl, m bundle.LayerMask) string { return fmt.Sprintf("%s.op%d", a.name, m.Op) }

// resolveLayers checks a request's Layers: each names an op with a per-request layer mask
// of an app the request enables, and lists only layers the op was compiled at.
func (e *Engine) resolveLayers(req map[string][]int, mask uint32) (map[string][]int, error) {
	if len(req) == 0 {
		return nil, nil
	}
	type target struct {
		app *appCtl
		m   bundle.LayerMask
	}
	targets := map[string]target{}
	var names []string
	for _, a := range e.apps {
		for _, m := range a.masks {
			targets[layerKey(a, m)] = target{a, m}
			names = append(names, layerKey(a, m))
		}
	}
	out := map[string][]int{}
	for name, layers := range req {
		t, ok := targets[name]
		switch {
		case !ok && len(names) == 0:
			return nil, fmt.Errorf("layers %s: no deployed op takes per-request layers (mark one at: {per_request: true})", name)
		case !ok:
			return nil, fmt.Errorf("layers %s: not an op with per-request layers (ops: %s)", name, strings.Join(names, ", "))
		case mask&(1<<uint(t.app.bit)) == 0:
			return nil, fmt.Errorf("layers %s: the request does not enable app %s (add it to apps)", name, t.app.name)
		}
		for _, l := range layers {
			if !slices.Contains(t.m.Layers, l) {
				return nil, fmt.Errorf("layers %s: layer %d is not one the op was compiled at (%v)", name, l, t.m.Layers)
			}
		}
		out[name] = layers
	}
	return out, nil
}
