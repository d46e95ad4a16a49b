package cuda

import (
	"errors"
	"strings"
	"testing"

	"xmix/bundle"
)

// Without an NVIDIA driver (CI, laptops) the backend says so clearly instead of crashing.
func TestNoDriverIsAClearError(t *testing.T) {
	if _, err := Probe(); err == nil {
		t.Skip("this machine has a usable GPU")
	} else if !errors.Is(err, ErrNoDriver) {
		t.Skipf("a driver is present but unusable here: %v", err)
	}
	_, err := New(&bundle.Bundle{}, nil, Options{})
	if !errors.Is(err, ErrNoDriver) || !strings.Contains(err.Error(), "libcuda.so.1") {
		t.Fatalf("New without a driver: %v", err)
	}
}

func TestDriverErrorsName(t *testing.T) {
	e := &Error{Call: "cuMemAlloc_v2", Code: 2, Name: "CUDA_ERROR_OUT_OF_MEMORY", Desc: "out of memory"}
	if !errors.Is(e, ErrOutOfMemory) || errors.Is(e, ErrNoDevice) {
		t.Fatal("errors.Is must match on the result code")
	}
	if got := e.Error(); got != "cuMemAlloc_v2: CUDA_ERROR_OUT_OF_MEMORY (2): out of memory" {
		t.Fatalf("message %q", got)
	}
}
