package cuda

import (
	"errors"
	"fmt"
	"unsafe"

	"github.com/ebitengine/purego"
)

// driver holds the CUDA driver API entry points, resolved from libcuda.so.1 at run time so
// that binaries build without cgo and start on machines with no GPU.
type driver struct {
	lib uintptr
	fn  map[string]uintptr
}

// driverSymbols is every entry point the backend calls; a missing one is reported at load.
var driverSymbols = []string{
	"cuInit", "cuDriverGetVersion", "cuDeviceGetCount", "cuDeviceGet", "cuDeviceGetName",
	"cuDeviceGetAttribute", "cuDeviceTotalMem_v2", "cuDevicePrimaryCtxRetain",
	"cuDevicePrimaryCtxRelease_v2", "cuCtxSetCurrent", "cuCtxSynchronize", "cuMemGetInfo_v2",
	"cuModuleLoadDataEx", "cuModuleGetFunction", "cuModuleUnload", "cuFuncSetAttribute", "cuFuncGetAttribute",
	"cuMemAlloc_v2", "cuMemFree_v2", "cuMemAllocHost_v2", "cuMemFreeHost",
	"cuMemcpyHtoD_v2", "cuMemcpyDtoH_v2", "cuMemcpyHtoDAsync_v2", "cuMemcpyDtoHAsync_v2",
	"cuMemsetD8_v2", "cuStreamCreate", "cuStreamDestroy_v2", "cuStreamSynchronize",
	"cuStreamBeginCapture_v2", "cuStreamEndCapture", "cuLaunchKernel", "cuLaunchKernelEx",
	"cuGraphInstantiateWithFlags", "cuGraphLaunch", "cuGraphDestroy", "cuGraphExecDestroy",
	"cuGraphGetNodes", "cuEventCreate", "cuEventRecord", "cuEventSynchronize", "cuEventQuery",
	"cuEventElapsedTime", "cuEventDestroy_v2", "cuGetErrorName", "cuGetErrorString",
	"cuTensorMapEncodeTiled",
}

// ErrNoDriver means libcuda could not be loaded: no NVIDIA driver on this machine.
var ErrNoDriver = errors.New("no NVIDIA driver (libcuda.so.1 not found)")

func loadDriver() (*driver, error) {
	var lib uintptr
	var err error
	for _, name := range []string{"libcuda.so.1", "libcuda.so"} {
		if lib, err = purego.Dlopen(name, purego.RTLD_NOW|purego.RTLD_GLOBAL); err == nil {
			break
		}
	}
	if lib == 0 {
		return nil, fmt.Errorf("%w: %v", ErrNoDriver, err)
	}
	d := &driver{lib: lib, fn: map[string]uintptr{}}
	for _, s := range driverSymbols {
		p, err := purego.Dlsym(lib, s)
		if err != nil || p == 0 {
			return nil, fmt.Errorf("libcuda.so.1 lacks %s: the NVIDIA driver is too old (need CUDA 12.0 or newer)", s)
		}
		d.fn[s] = p
	}
	return d, nil
}

// call invokes a driver function and turns a non-zero CUresult into an error.
//
// uintptrescapes: callers pass pointers converted to uintptr (out-parameters such as &p of
// cuMemAlloc, host buffers). Without it those may stay on a goroutine stack, which moves when
// it grows inside the call, and the library writes or reads the old address. The likely cause
// of one CUDA_ERROR_INVALID_VALUE from cuMemcpyHtoD seen on the H200 in 22 Mixtral loads: a
// cuMemAlloc that wrote its pointer to the old stack, leaving p zero.
//
//go:uintptrescapes
func (d *driver) call(name string, args ...uintptr) error {
	r, _, _ := purego.SyscallN(d.fn[name], args...)
	if code := int32(r); code != 0 {
		return &Error{Call: name, Code: int(code), Name: d.errName(code), Desc: d.errString(code)}
	}
	return nil
}

func (d *driver) errName(code int32) string {
	var p *byte
	if r, _, _ := purego.SyscallN(d.fn["cuGetErrorName"], uintptr(code), uintptr(unsafe.Pointer(&p))); r != 0 || p == nil {
		return "CUDA_ERROR_UNKNOWN"
	}
	return cString(p)
}

func (d *driver) errString(code int32) string {
	var p *byte
	if r, _, _ := purego.SyscallN(d.fn["cuGetErrorString"], uintptr(code), uintptr(unsafe.Pointer(&p))); r != 0 || p == nil {
		return ""
	}
	return cString(p)
}

func cString(p *byte) string {
	var b []byte
	for q := unsafe.Pointer(p); *(*byte)(q) != 0; q = unsafe.Add(q, 1) {
		b = append(b, *(*byte)(q))
	}
	return string(b)
}

// Error is a failed driver call.
type Error struct {
	Call string
	Code int
	Name string
	Desc string
}

func (e *Error) Error() string {
	return fmt.Sprintf("%s: %s (%d): %s", e.Call, e.Name, e.Code, e.Desc)
}

// Is lets errors.Is match on the result code alone.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Code == e.Code && t.Call == ""
}

// Result codes the backend treats specially.
var (
	ErrOutOfMemory = &Error{Code: 2}
	ErrNoDevice    = &Error{Code: 100}
	errNotReady    = &Error{Code: 600} // CUDA_ERROR_NOT_READY: cuEventQuery of work still running
)
