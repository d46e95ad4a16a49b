// Package input opens and reads every file xmix is given — specs, settings JSON, tokenizers,
// PTX, params and weights, bundles — through one bounded reader: only regular files, each
// kind of file capped at a size no real one comes near, and an error that names the file.
//
// It is its own leaf package, imported by frontend, passes, bundle, tokenizer, chat,
// safetensors and loader, because the rule is one for all of them: a device or a FIFO given
// where a file belongs (/dev/zero reads forever, a FIFO blocks forever) or a file far larger
// than its kind must fail at once, before anything is allocated from it, wherever it enters.
package input

import (
	"fmt"
	"io"
	"io/fs"
	"os"
	"syscall"
)

// Kind is one class of input file: what it is called in errors, and the most bytes one may
// have. The caps are far above any real file of the kind and far below what would exhaust a
// host's memory when read whole.
type Kind struct {
	What string
	Max  int64
}

// The kinds of input file.
var (
	// Spec is a model or app spec (YAML); the shipped ones are a few KiB.
	Spec = Kind{"spec", 16 << 20}
	// Settings is a JSON settings file of a checkpoint: config.json, generation_config.json,
	// tokenizer_config.json (Llama 3's, with its chat template, is 55 KiB), or the shard
	// index model.safetensors.index.json (tens of KiB even for 400B models).
	Settings = Kind{"settings file", 64 << 20}
	// Tokenizer is a Hugging Face tokenizer.json (Qwen3's, the largest shipped, is 11 MiB).
	Tokenizer = Kind{"tokenizer", 512 << 20}
	// PTX is a custom kernel's PTX text.
	PTX = Kind{"PTX file", 64 << 20}
	// Params is a safetensors file of app parameters (steering vectors, probes, biases).
	Params = Kind{"params file", 4 << 30}
	// Bundle is an .xmb bundle, read whole; weights embedded in one make it large.
	Bundle = Kind{"bundle", 64 << 30}
	// Weights is a safetensors weights file (memory-mapped where the platform can).
	Weights = Kind{"weights file", 1 << 40}
	// GemmPicks is a table of cuBLASLt algorithms `xmix tune-gemm` wrote (about 400 bytes a
	// GEMM shape).
	GemmPicks = Kind{"GEMM picks file", 16 << 20}
)

// Open opens path for reading after checking that it is a regular file of at most k.Max
// bytes; it returns the file and its size. A device, FIFO, socket or directory is refused
// before it is opened (opening a FIFO would block until a writer comes), and checked again
// on the open descriptor, which is opened non-blocking so that a file swapped for a FIFO in
// between cannot hang it either.
func Open(path string, k Kind) (*os.File, int64, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, 0, err
	}
	if err := check(path, st, k); err != nil {
		return nil, 0, err
	}
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, 0, err
	}
	if st, err = f.Stat(); err == nil {
		err = check(path, st, k)
	}
	if err != nil {
		f.Close()
		return nil, 0, err
	}
	return f, st.Size(), nil
}

// Read reads the whole regular file at path, of at most k.Max bytes.
func Read(path string, k Kind) ([]byte, error) {
	f, size, err := Open(path, k)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	// The size is a hint, not a promise (a file may grow while it is read, and files under
	// /proc report 0): read to the end, at most one byte past the cap.
	data := make([]byte, 0, size+1)
	for int64(len(data)) <= k.Max {
		if len(data) == cap(data) {
			data = append(data, 0)[:len(data)]
		}
		room := min(int64(cap(data)), k.Max+1)
		n, err := f.Read(data[len(data):room])
		data = data[:len(data)+n]
		if err == io.EOF {
			return data, nil
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
	}
	return nil, tooLarge(path, k)
}

func check(path string, st fs.FileInfo, k Kind) error {
	if !st.Mode().IsRegular() {
		return fmt.Errorf("%s is %s, not a regular file (a %s is read from a file)", path, describe(st.Mode()), k.What)
	}
	if st.Size() > k.Max {
		return tooLarge(path, k)
	}
	return nil
}

func tooLarge(path string, k Kind) error {
	return fmt.Errorf("%s is larger than %s, the most a %s may have", path, bytesText(k.Max), k.What)
}

// describe names what a non-regular file is.
func describe(m fs.FileMode) string {
	switch {
	case m.IsDir():
		return "a directory"
	case m&fs.ModeNamedPipe != 0:
		return "a named pipe (FIFO)"
	case m&fs.ModeSocket != 0:
		return "a socket"
	case m&fs.ModeCharDevice != 0:
		return "a character device"
	case m&fs.ModeDevice != 0:
		return "a block device"
	}
	return "a special file"
}

// bytesText writes a power-of-two size as KiB, MiB, GiB or TiB.
func bytesText(n int64) string {
	for _, u := range []struct {
		unit string
		size int64
	}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if n >= u.size && n%u.size == 0 {
			return fmt.Sprintf("%d %s", n/u.size, u.unit)
		}
	}
	return fmt.Sprintf("%d bytes", n)
}
