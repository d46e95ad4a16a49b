//go:build unix

package safetensors

import (
	"syscall"

	"xmix/input"
)

// mapFile maps path read-only. Empty files, files too large for an int and filesystems that
// refuse mmap fall back to reading the file.
func mapFile(path string) ([]byte, func() error, error) {
	fd, size, err := input.Open(path, input.Weights)
	if err != nil {
		return nil, nil, err
	}
	defer fd.Close() // a mapping outlives its descriptor
	if size <= 0 || size != int64(int(size)) {
		return readWhole(path)
	}
	data, err := syscall.Mmap(int(fd.Fd()), 0, int(size), syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		return readWhole(path)
	}
	return data, func() error { return syscall.Munmap(data) }, nil
}
