// Package loader turns a bundle into a running model: it loads weights, drives a backend
// (loader/cpu, later loader/cuda) through the bundle's templates, and runs the batched decode
// loop with per-request apps. It never imports the compiler: the bundle is the contract.
package loader

import (
	"encoding/binary"
	"fmt"
	"math"
	"unsafe"

	"xmix/bundle"
)

// Backend executes one bundle's templates on some device.
type Backend interface {
	// Name says what runs the model ("cpu", "cuda H200").
	Name() string
	// Write copies host bytes into a named buffer at a byte offset (control blocks, tables).
	// It is done with data when it returns: the engine reuses it for the next write.
	Write(buffer string, offset int64, data []byte) error
	// Read copies the start of a named buffer into dst (sampled tokens, exports).
	Read(buffer string, dst []byte) error
	// Step replays template t (index into the bundle's templates) once.
	Step(t int) error
	Close() error
}

// DtypeSize is the byte width of a bundle buffer dtype, as an error for unknown ones.
func DtypeSize(dtype string) (int, error) {
	if n, ok := bundle.DtypeSize(dtype); ok {
		return n, nil
	}
	return 0, fmt.Errorf("unknown dtype %q (known: f32, bf16, u32)", dtype)
}

// BufferBytes is the size of a buffer in bytes.
func BufferBytes(b bundle.Buffer) (int64, error) {
	sz, err := DtypeSize(b.Dtype)
	if err != nil {
		return 0, fmt.Errorf("buffer %s: %w", b.Name, err)
	}
	n := int64(sz)
	for _, d := range b.Shape {
		if d <= 0 {
			return 0, fmt.Errorf("buffer %s: shape %v has a non-positive dimension", b.Name, b.Shape)
		}
		n *= int64(d)
		if n > 1<<40 {
			return 0, fmt.Errorf("buffer %s: shape %v is too large", b.Name, b.Shape)
		}
	}
	return n, nil
}

func putU32s(v []uint32) []byte { return appendU32s(nil, v) }

func putF32s(v []float32) []byte { return appendF32s(nil, v) }

// appendU32s appends v little-endian to dst.
func appendU32s(dst []byte, v []uint32) []byte {
	for _, x := range v {
		dst = binary.LittleEndian.AppendUint32(dst, x)
	}
	return dst
}

// appendF32s appends v little-endian to dst.
func appendF32s(dst []byte, v []float32) []byte {
	for _, x := range v {
		dst = binary.LittleEndian.AppendUint32(dst, math.Float32bits(x))
	}
	return dst
}

func getF32s(b []byte) []float32 {
	v := make([]float32, len(b)/4)
	decodeF32s(v, b)
	return v
}

// hostLittleEndian: Go's float32 in memory is the f32 bytes a bundle's buffers hold.
var hostLittleEndian = binary.NativeEndian.Uint16([]byte{1, 0}) == 1

// decodeF32s fills dst from the little-endian f32 bytes of src: a plain copy on a
// little-endian host, where wide exports (capture every layer: 512 KB per row) would
// otherwise spend the step decoding; a decode elsewhere.
func decodeF32s(dst []float32, src []byte) {
	if hostLittleEndian {
		copy(unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(dst))), 4*len(dst)), src)
		return
	}
	for i := range dst {
		dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(src[4*i:]))
	}
}
