//go:build unix

package safetensors

import (
	"syscall"
	"unsafe"

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

// Prefetch asks the kernel to start reading the pages of b, part of a mapped file, now and
// all at once (MADV_WILLNEED): a copy out of a cold mapping otherwise faults the file in a
// readahead window at a time. The advice is only advice: an error changes nothing.
func Prefetch(b []byte) {
	if len(b) == 0 {
		return
	}
	page := uintptr(syscall.Getpagesize())
	start := uintptr(unsafe.Pointer(&b[0]))
	aligned := start &^ (page - 1)
	_, _, _ = syscall.Syscall(syscall.SYS_MADVISE, aligned, start-aligned+uintptr(len(b)), syscall.MADV_WILLNEED)
}
