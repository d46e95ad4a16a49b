package main

import (
	"bytes"
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"xmix/bundle"
	"xmix/compile"
)

// asXmix, set in a child's environment, makes the test binary run as the xmix command, so
// tests launch real rank processes without building a binary.
const asXmix = "XMIX_TEST_RUN_AS_XMIX"

func TestMain(m *testing.M) {
	if os.Getenv(asXmix) == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// xmixProc is the test binary started as 'xmix args...'.
func xmixProc(args ...string) (*exec.Cmd, *bytes.Buffer, *bytes.Buffer) {
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), asXmix+"=1")
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	return cmd, &out, &errb
}

// freeAddr is a loopback address no one listens on now.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// tinyTP2 writes the embedded model with its two demo apps, built at tp 2, to a file.
func tinyTP2(t *testing.T) string {
	t.Helper()
	b, err := compile.Build("../../specs/models/tiny.yaml",
		[]string{"../../specs/apps/tiny-steer.yaml", "../../specs/apps/tiny-probe.yaml"},
		compile.Options{TP: 2, EmbedWeights: true})
	if err != nil {
		t.Fatal(err)
	}
	data, err := bundle.Marshal(b)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "tiny-tp2.xmb")
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// results is the "results" part of 'xmix run --json': tokens, text and every export, whose
// floats print with exactly the digits that tell float32s apart.
func results(t *testing.T, out []byte) string {
	t.Helper()
	var v struct {
		Results json.RawMessage `json:"results"`
	}
	if err := json.Unmarshal(out, &v); err != nil || len(v.Results) == 0 {
		t.Fatalf("run --json printed %q: %v", out, err)
	}
	return string(v.Results)
}

// TestTPProcesses: the tp 2 bundle run as two OS processes (the worker started first, so it
// dials before rank 0 listens) gives the tokens and exports of the in-process tp 2 run, bit
// for bit, and the worker exits cleanly when rank 0 is done.
func TestTPProcesses(t *testing.T) {
	path := tinyTP2(t)
	runArgs := []string{"run", path, "--json", "-q", "-n", "12", "--prompt", "Tom walked home", "--prompt", "The old man",
		"--apps", "tiny-steer@0,tiny-probe"}
	var ref bytes.Buffer
	f := runFlags{backend: "cpu", quiet: true, asJSON: true, maxTokens: 12, prompts: []string{"Tom walked home", "The old man"},
		apps: "tiny-steer@0,tiny-probe", topP: 1}
	if err := runBundle(&ref, path, f); err != nil {
		t.Fatal(err)
	}

	addr := freeAddr(t)
	worker, _, werr := xmixProc("tp-worker", path, "--rank", "1", "--tp-addr", addr, "--tp-timeout", "20s")
	if err := worker.Start(); err != nil {
		t.Fatal(err)
	}
	defer worker.Process.Kill()
	time.Sleep(100 * time.Millisecond)
	rank0, out, rerr := xmixProc(append(runArgs, "--tp-addr", addr, "--tp-timeout", "20s")...)
	if err := rank0.Run(); err != nil {
		t.Fatalf("rank 0: %v\n%s", err, rerr)
	}
	if err := worker.Wait(); err != nil {
		t.Fatalf("worker after rank 0 finished: %v\n%s", err, werr)
	}
	if got, want := results(t, out.Bytes()), results(t, ref.Bytes()); got != want {
		t.Errorf("two processes:\n%s\nin process:\n%s", got, want)
	}
	if !strings.Contains(out.String(), `"backend": "cpu tp=2 (2 processes)"`) {
		t.Errorf("rank 0 did not run as a group: %s", out)
	}
}

// TestTPWorkerWithoutRankZero: a worker whose rank 0 never comes exits at its timeout with
// an error naming its rank and the address, instead of hanging.
func TestTPWorkerWithoutRankZero(t *testing.T) {
	path := tinyTP2(t)
	addr := freeAddr(t)
	worker, _, werr := xmixProc("tp-worker", path, "--rank", "1", "--tp-addr", addr, "--tp-timeout", "300ms")
	start := time.Now()
	err := worker.Run()
	if err == nil || !strings.Contains(werr.String(), "rank 1: rank 0 at "+addr+" did not answer within 300ms") {
		t.Fatalf("worker: %v\n%s", err, werr)
	}
	if el := time.Since(start); el > 10*time.Second {
		t.Errorf("worker gave up after %s", el)
	}
}

// A negative --tp-timeout is refused, on a worker and on rank 0, naming the flag (it was
// taken for the default).
func TestTPTimeoutNegative(t *testing.T) {
	path := tinyTP2(t)
	addr := freeAddr(t)
	for _, args := range [][]string{{"tp-worker", path, "--rank", "1"}, {"run", path, "-q", "--backend", "cpu", "-p", "Hi"}} {
		out, err := xmix(t, append(args, "--tp-addr", addr, "--tp-timeout", "-2s")...)
		if err == nil || !strings.Contains(out, "--tp-timeout -2s: want 0 (the default, 1m0s) or more") {
			t.Errorf("%v: err %v, output %q", args[0], err, out)
		}
	}
}

// TestTPWorkerKilled: a worker process killed after joining fails rank 0's next generation
// at once, with an error naming rank 1 and its address, instead of hanging.
func TestTPWorkerKilled(t *testing.T) {
	path := tinyTP2(t)
	addr := freeAddr(t)
	worker, _, _ := xmixProc("tp-worker", path, "--rank", "1", "--tp-addr", addr, "--tp-timeout", "20s")
	if err := worker.Start(); err != nil {
		t.Fatal(err)
	}
	b, err := bundle.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	s, err := open(b, filepath.Dir(path), runFlags{backend: "cpu", quiet: true, tpAddr: addr, tpTimeout: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer s.be.Close()
	worker.Process.Kill()
	worker.Wait()
	start := time.Now()
	var out bytes.Buffer
	err = s.generate(&out, runFlags{quiet: true, maxTokens: 4}, []string{"Hello"}, [][]string{nil})
	if err == nil || !strings.Contains(err.Error(), "rank 1 at 127.0.0.1:") {
		t.Fatalf("generate with a dead worker: %v", err)
	}
	t.Logf("rank 0: %v", err)
	if el := time.Since(start); el > 5*time.Second {
		t.Errorf("rank 0 noticed after %s", el)
	}
}
