// Package ops is the living definition of every kernel xmix generates: for each op kind, a Go
// reference implementation that takes the same parameters as the generated PTX kernel. codegen
// binds each kernel to one of these (by name plus JSON attributes); the CPU backend executes
// them; the kernel tests compare the PTX, run in ptx/emu, against them.
package ops

import (
	"cmp"
	"encoding/json"
	"fmt"
	"math"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"sync"
	"unsafe"
)

// Arg is one kernel argument as the reference op sees it. A pointer parameter is Mem: the
// bytes from the pointed-to address to the end of its allocation. A scalar parameter is Bits
// (an f32 scalar holds math.Float32bits in the low 32 bits).
type Arg struct {
	Mem  []byte
	Bits uint64
}

// F32 views the argument's memory as float32 values.
func (a Arg) F32() []float32 { return view[float32](a.Mem) }

// U16 views the argument's memory as uint16 values (bf16 storage).
func (a Arg) U16() []uint16 { return view[uint16](a.Mem) }

// U32 views the argument's memory as uint32 values.
func (a Arg) U32() []uint32 { return view[uint32](a.Mem) }

// Float is the argument's scalar as float32.
func (a Arg) Float() float32 { return math.Float32frombits(uint32(a.Bits)) }

// Int is the argument's scalar as an int (u32 parameters).
func (a Arg) Int() int { return int(uint32(a.Bits)) }

func view[T any](b []byte) []T {
	var z T
	n := len(b) / int(unsafe.Sizeof(z))
	if n == 0 {
		return nil
	}
	return unsafe.Slice((*T)(unsafe.Pointer(&b[0])), n)
}

// Launch is the grid a kernel is launched with; reference ops may derive counts from it
// exactly as the PTX does.
type Launch struct {
	Grid   [3]int
	Block  [3]int
	Shared int
}

// Runner executes one bound kernel.
type Runner interface {
	Run(args []Arg, l Launch) error
}

// RunnerFunc adapts a function to Runner.
type RunnerFunc func(args []Arg, l Launch) error

// Run calls f.
func (f RunnerFunc) Run(args []Arg, l Launch) error { return f(args, l) }

// named is f with its errors prefixed by op, for runners whose messages do not name it.
func named(op string, f RunnerFunc) RunnerFunc {
	return func(args []Arg, l Launch) error {
		if err := f(args, l); err != nil {
			return fmt.Errorf("%s: %w", op, err)
		}
		return nil
	}
}

// Builder makes a Runner from an op's JSON attributes.
type Builder func(attrs []byte) (Runner, error)

var registry = map[string]Builder{}

// Register adds an op kind. It is called from init functions in this package only.
func Register(name string, b Builder) {
	if _, dup := registry[name]; dup {
		panic("ops: duplicate op " + name) // programming error, never input-driven
	}
	registry[name] = b
}

// Build returns the runner for op name with the given attributes.
func Build(name string, attrs []byte) (Runner, error) {
	b, ok := registry[name]
	if !ok {
		return nil, fmt.Errorf("unknown reference op %q (known: %v)", name, Names())
	}
	r, err := b(attrs)
	if err != nil {
		return nil, fmt.Errorf("op %s: %w", name, err)
	}
	return r, nil
}

// Names lists the registered ops, sorted.
func Names() []string {
	ns := make([]string, 0, len(registry))
	for n := range registry {
		ns = append(ns, n)
	}
	sort.Strings(ns)
	return ns
}

// DecodeAttrs unmarshals attrs strictly into v.
func DecodeAttrs(attrs []byte, v any) error {
	if err := json.Unmarshal(attrs, v); err != nil {
		return fmt.Errorf("bad attributes %s: %w", attrs, err)
	}
	return nil
}

// EncodeAttrs marshals v; struct field order makes it deterministic.
func EncodeAttrs(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic("ops: attrs not encodable: " + err.Error()) // attrs are plain structs
	}
	return b
}

// CheckArgs verifies the argument count and that pointer args hold at least the given bytes.
// need[i] < 0 marks a scalar.
func CheckArgs(op string, args []Arg, need ...int) error {
	if len(args) != len(need) {
		return fmt.Errorf("%s: %d arguments, want %d", op, len(args), len(need))
	}
	for i, n := range need {
		if n >= 0 && len(args[i].Mem) < n {
			return fmt.Errorf("%s: argument %d holds %d bytes, needs %d", op, i, len(args[i].Mem), n)
		}
	}
	return nil
}

// Workers is how many goroutines ParallelFor uses.
var Workers = runtime.GOMAXPROCS(0)

// ParallelFor runs fn over [0,n) split into contiguous chunks across Workers goroutines. A
// panic in fn is raised again on the caller's goroutine once every chunk has ended
// (WorkerPanics), where the engine's recover makes it the step's error.
func ParallelFor(n int, fn func(lo, hi int)) {
	w := Workers
	if w > n {
		w = n
	}
	if w <= 1 {
		if n > 0 {
			fn(0, n)
		}
		return
	}
	var wg sync.WaitGroup
	var panics WorkerPanics
	chunk := (n + w - 1) / w
	for lo := 0; lo < n; lo += chunk {
		hi := min(lo+chunk, n)
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer panics.Catch(nil)
			fn(lo, hi)
		}()
	}
	wg.Wait()
	panics.Raise()
}

// WorkerPanics holds the first panic of a group of goroutines, so that the goroutine that
// waits for them raises it again: a panic left on a goroutine of its own ends the process,
// where on the engine's goroutine its recover makes it one step's error and the server goes
// on (loader.Engine.Step).
type WorkerPanics struct {
	mu    sync.Mutex
	first *WorkerPanic
}

// WorkerPanic is a panic caught on a worker goroutine: its value and where it happened.
type WorkerPanic struct {
	Value any
	At    string // file:line of the innermost frame outside the runtime
}

func (p WorkerPanic) String() string { return fmt.Sprintf("%v (at %s)", p.Value, p.At) }

// Catch, deferred by a worker goroutine, recovers its panic and keeps the group's first;
// onPanic (if not nil) then runs, e.g. to release the goroutines waiting for this one.
func (ps *WorkerPanics) Catch(onPanic func()) {
	p := recover()
	if p == nil {
		return
	}
	wp := WorkerPanic{Value: p, At: cmp.Or(PanicSite(1), "unknown")}
	ps.mu.Lock()
	if ps.first == nil {
		ps.first = &wp
	}
	ps.mu.Unlock()
	if onPanic != nil {
		onPanic()
	}
}

// PanicSite is file:line of the innermost frame outside the runtime where the panic being
// recovered happened, "" if none: called by a function that a deferred function called
// skip-1 frames up (1: by the deferred function itself).
func PanicSite(skip int) string {
	pcs := make([]uintptr, 32)
	frames := runtime.CallersFrames(pcs[:runtime.Callers(skip+2, pcs)])
	for {
		f, more := frames.Next()
		if !strings.HasPrefix(f.Function, "runtime.") {
			return fmt.Sprintf("%s:%d", filepath.Base(f.File), f.Line)
		}
		if !more {
			return ""
		}
	}
}

// Raise panics with the first panic caught, if any; call it once every worker has ended.
func (ps *WorkerPanics) Raise() {
	if ps.first != nil {
		panic(*ps.first)
	}
}

// BF16ToF32 widens a bf16 bit pattern.
func BF16ToF32(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }

// bf16CopyArg is argument i (name: bundle.BF16CopyOf's out_bf16, z_bf16 or act_bf16) where a
// kernel may also store bf16 of its n outputs: nil where it is empty (the constant 0, no
// copy), else its first n elements.
func bf16CopyArg(name string, i int, a Arg, n int) ([]uint16, error) {
	switch {
	case len(a.Mem) == 0:
		return nil, nil
	case len(a.Mem) < 2*n:
		return nil, fmt.Errorf("argument %d (%s) holds %d bytes, needs %d", i, name, len(a.Mem), 2*n)
	}
	return a.U16()[:n], nil
}

// checkF32Out checks a kernel's f32 output beside its bf16 copy (copyOf, as bf16CopyArg read
// it): out holds n values, or, where the kernel may drop it (optional), is empty while the
// copy is not (the copy alone).
func checkF32Out(name string, out Arg, n int, optional bool, copyOf []uint16) error {
	switch {
	case len(out.Mem) == 0 && optional && copyOf == nil:
		return fmt.Errorf("%s and its bf16 copy are both empty: nothing to write", name)
	case len(out.Mem) == 0 && optional:
		return nil
	case len(out.Mem) < 4*n:
		return fmt.Errorf("%s holds %d bytes, needs %d", name, len(out.Mem), 4*n)
	}
	return nil
}

// putBF16 stores bf16 of each value of src into dst, as the backend's cast would.
func putBF16(dst []uint16, src []float32) {
	for i, v := range src {
		dst[i] = F32ToBF16(v)
	}
}

// F32ToBF16 rounds to nearest even, as cvt.rn.bf16.f32 does.
func F32ToBF16(f float32) uint16 {
	b := math.Float32bits(f)
	if b&0x7fffffff > 0x7f800000 { // NaN stays NaN
		return uint16(b>>16) | 0x40
	}
	return uint16((b + 0x7fff + (b>>16)&1) >> 16)
}
