package cuda

import (
	"errors"
	"fmt"
	"unsafe"

	"xmix/loader"
)

// Weights reach the GPU through pinned staging (loader.Upload does the reading): a few
// chunks of page-locked host memory that reader goroutines fill from the checkpoint while
// the copy engine sends the chunks filled before them, each copy followed by an event that
// says when its chunk may be refilled. Copying from pageable memory (what a plain
// cuMemcpyHtoD of a Go slice does) makes the driver stage every byte through its own small
// pinned buffer, one synchronous copy at a time, and left reading and copying serial: 7.7 s
// from the page cache to the first token of an 8B checkpoint (issue 14), about 2 GB/s.
//
// Registering the checkpoint's memory map with the driver (cuMemHostRegister, read-only)
// would save the host copy, but it pins the whole mapping up front (every page read before
// the first copy starts: a cold load would read serially first), it needs the bytes exactly
// as the device holds them (no dtype conversion, no tensor-parallel cut, no stacking of
// tensors from different shards), and it fails on filesystems and kernels that refuse to pin
// file pages. Staging works for every checkpoint and keeps pinned memory small.

// stagingChunks is how many staging chunks a load with readers readers uses: two per
// reader (one being filled while the other is read or copied) and two for the copy engine.
func stagingChunks(readers int) int { return 2*readers + 2 }

// stagedUpload is the device side of loader.Upload: copies on the backend's stream from
// pinned chunks, one event per chunk in flight, completed in issue order.
type stagedUpload struct {
	d       *driver
	stream  uintptr
	host    unsafe.Pointer // pinned: len(staging) chunks of loader.ChunkBytes
	staging [][]byte
	dst     []uintptr // device address of each buffer of the load
	events  []uintptr // a ring: events[head], ... are the uploads in flight, oldest first
	head, n int
}

// newStagedUpload allocates chunks pinned chunks and their events for a load into dst.
func (be *Backend) newStagedUpload(dst []uintptr, chunks int) (*stagedUpload, error) {
	d := be.d
	u := &stagedUpload{d: d, stream: be.stream, dst: dst}
	size := uintptr(chunks) * loader.ChunkBytes
	if err := d.call("cuMemAllocHost_v2", uintptr(unsafe.Pointer(&u.host)), size); err != nil {
		return nil, fmt.Errorf("allocating %d MiB of pinned staging memory: %w", size>>20, err)
	}
	for i := range chunks {
		u.staging = append(u.staging, unsafe.Slice((*byte)(unsafe.Add(u.host, i*loader.ChunkBytes)), loader.ChunkBytes))
		var ev uintptr
		if err := d.call("cuEventCreate", uintptr(unsafe.Pointer(&ev)), cuEventDisableTiming); err != nil {
			return nil, errors.Join(err, u.close())
		}
		u.events = append(u.events, ev)
	}
	return u, nil
}

// CU_EVENT_DISABLE_TIMING: the events only order copies, and untimed ones are cheaper.
const cuEventDisableTiming = 2

// Staging implements loader.Uploader.
func (u *stagedUpload) Staging() [][]byte { return u.staging }

// Upload implements loader.Uploader.
func (u *stagedUpload) Upload(c loader.WeightChunk) error {
	if u.n == len(u.events) {
		return fmt.Errorf("%d uploads in flight, the staging has %d chunks", u.n+1, len(u.events))
	}
	if c.Buf < 0 || c.Buf >= len(u.dst) || len(c.Data) == 0 {
		return fmt.Errorf("upload of %d bytes to buffer %d of %d", len(c.Data), c.Buf, len(u.dst))
	}
	if err := u.d.call("cuMemcpyHtoDAsync_v2", u.dst[c.Buf]+uintptr(c.Off), uintptr(unsafe.Pointer(&c.Data[0])), uintptr(len(c.Data)), u.stream); err != nil {
		return err
	}
	if err := u.d.call("cuEventRecord", u.events[(u.head+u.n)%len(u.events)], u.stream); err != nil {
		return err
	}
	u.n++
	return nil
}

// Done implements loader.Uploader.
func (u *stagedUpload) Done(wait bool) (bool, error) {
	if u.n == 0 {
		return false, errors.New("no upload in flight")
	}
	ev := u.events[u.head]
	if wait {
		if err := u.d.call("cuEventSynchronize", ev); err != nil {
			return false, err
		}
	} else if err := u.d.call("cuEventQuery", ev); errors.Is(err, errNotReady) {
		return false, nil
	} else if err != nil {
		return false, err
	}
	u.head, u.n = (u.head+1)%len(u.events), u.n-1
	return true, nil
}

// close waits for the stream, so that no copy still reads the staging memory, and frees
// the events and the pinned chunks.
func (u *stagedUpload) close() error {
	errs := []error{u.d.call("cuStreamSynchronize", u.stream)}
	for _, ev := range u.events {
		errs = append(errs, u.d.call("cuEventDestroy_v2", ev))
	}
	if u.host != nil {
		errs = append(errs, u.d.call("cuMemFreeHost", uintptr(u.host)))
	}
	u.events, u.staging, u.host = nil, nil, nil
	return errors.Join(errs...)
}
