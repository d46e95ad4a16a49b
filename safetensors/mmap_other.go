//go:build !unix

package safetensors

// mapFile reads the whole file: this platform has no syscall.Mmap.
func mapFile(path string) ([]byte, func() error, error) { return readWhole(path) }

// Prefetch does nothing where files are read whole.
func Prefetch(b []byte) {}
