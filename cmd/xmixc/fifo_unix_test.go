//go:build unix

package main

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"xmix/bundle"
)

// TestBuildIntoAPipeKeepsIt: -o naming something that is not a file (here a FIFO, as
// /dev/null is a device) gets the bundle written into it and stays what it was; renamed over,
// as a file is, /dev/null became a file when root ran build -o /dev/null.
func TestBuildIntoAPipeKeepsIt(t *testing.T) {
	dir := t.TempDir()
	m := write(t, dir, "m.yaml", model)
	fifo := filepath.Join(dir, "out")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Skipf("no FIFO here: %v", err)
	}
	got := make(chan []byte, 1)
	go func() {
		data, _ := os.ReadFile(fifo)
		got <- data
	}()
	if _, err := xmixc(t, "build", m, "-q", "-o", fifo); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(fifo); err != nil || st.Mode()&os.ModeNamedPipe == 0 {
		t.Fatalf("-o FIFO left %v (%v), want the FIFO", st.Mode(), err)
	}
	select {
	case data := <-got:
		if b, err := bundle.Unmarshal(data); err != nil || b.Manifest.Model.Name != "m" {
			t.Fatalf("what the pipe carried: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("nothing came through the pipe")
	}
}
