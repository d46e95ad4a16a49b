package input

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// within runs f and fails the test if it has not returned after a few seconds: the cases
// here would otherwise read forever or block.
func within(t *testing.T, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() { defer close(done); f() }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("did not return")
	}
}

func TestReadRefusesWhatIsNotARegularFile(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "spec.yaml")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Skipf("no FIFOs here: %v", err)
	}
	for _, c := range []struct{ path, want string }{
		{"/dev/zero", "/dev/zero is a character device, not a regular file (a spec is read from a file)"},
		{fifo, fifo + " is a named pipe (FIFO), not a regular file"},
		{dir, dir + " is a directory, not a regular file"},
		{filepath.Join(dir, "missing.yaml"), "no such file"},
	} {
		within(t, func() {
			data, err := Read(c.path, Spec)
			if err == nil || !strings.Contains(err.Error(), c.want) || data != nil {
				t.Errorf("Read(%s): %d bytes, %v; want an error containing %q", c.path, len(data), err, c.want)
			}
		})
	}
}

func TestReadBoundsTheSize(t *testing.T) {
	dir := t.TempDir()
	small := Kind{"test file", 1000}
	for _, n := range []int{0, 1, 999, 1000} {
		p := filepath.Join(dir, "ok")
		want := bytes.Repeat([]byte{'x'}, n)
		os.WriteFile(p, want, 0o644)
		got, err := Read(p, small)
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("%d bytes: got %d bytes, %v", n, len(got), err)
		}
	}
	big := filepath.Join(dir, "big")
	os.WriteFile(big, make([]byte, 1001), 0o644)
	if _, err := Read(big, small); err == nil || err.Error() != big+" is larger than 1000 bytes, the most a test file may have" {
		t.Errorf("1001 bytes: %v", err)
	}
	// A file under /proc says it is empty and is not: the cap holds on what is read.
	if _, err := Read("/proc/self/maps", Kind{"maps", 16}); err == nil || !strings.Contains(err.Error(), "larger than 16 bytes") {
		t.Errorf("/proc/self/maps with a 16-byte cap: %v", err)
	}
	if got, err := Read("/proc/self/maps", Settings); err != nil || len(got) == 0 {
		t.Errorf("/proc/self/maps: %d bytes, %v", len(got), err)
	}
	if s := bytesText(Settings.Max); s != "64 MiB" {
		t.Errorf("Settings.Max reads %q", s)
	}
}

func TestOpenChecksTheDescriptor(t *testing.T) {
	f, size, err := Open("/proc/self/status", Settings)
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	if size != 0 {
		t.Errorf("size %d", size)
	}
	within(t, func() {
		if _, _, err := Open("/dev/stdin", Spec); err == nil {
			t.Error("/dev/stdin opened")
		}
	})
}
