package testsuite

import (
	"slices"
	"strings"
	"testing"

	"xmix/loader"
)

var newCPU = NewCPU

// TestCPU runs the shared end-to-end suite on the CPU backend.
func TestCPU(t *testing.T) {
	for _, c := range Checks {
		t.Run(c.Name, func(t *testing.T) { c.Run(t, newCPU) })
	}
}

// TestCPUFused runs the suite on bundles built with every fusion: the layers whose hooks
// carry an app's ops keep their kernels apart and the others fuse, and every check (exact
// writes, rows without apps as the app-free bundle's, batch as solo) holds as it does unfused.
func TestCPUFused(t *testing.T) {
	Fuse = []string{"all"}
	defer func() { Fuse = nil }()
	for _, c := range Checks {
		t.Run(c.Name, func(t *testing.T) { c.Run(t, newCPU) })
	}
}

func TestCPUExportsOnlyForAppRows(t *testing.T) {
	b := Compile(t, SmallModel, captureApp(0, 128))
	res := Generate(t, newCPU, b, []loader.Request{
		{Prompt: []int{1, 2, 3}, Apps: []string{"cap"}, MaxTokens: 5},
		{Prompt: []int{4, 5}, MaxTokens: 5},
	})
	// BOS + 3 prompt rows + 4 decode rows (the 5th token is sampled but never fed back).
	if n := len(res[0].Rows); n != 8 {
		t.Fatalf("request 0 has %d rows, want 8", n)
	}
	for i, row := range res[0].Rows {
		if row.Pos != i || len(row.Exports.Get("cap.x")) != 128 {
			t.Fatalf("row %d: pos %d, %d values exported", i, row.Pos, len(row.Exports.Get("cap.x")))
		}
	}
	for _, row := range res[1].Rows {
		if len(row.Exports) != 0 {
			t.Fatalf("request without the app got exports %v", row.Exports)
		}
	}
	// TokenExportsOnly: the rows that sampled a token (the last prompt row, every decode
	// row) keep the same reads; the prompt's other rows come without any.
	only := Generate(t, newCPU, b, []loader.Request{{Prompt: []int{1, 2, 3}, Apps: []string{"cap"}, MaxTokens: 5, TokenExportsOnly: true}})[0]
	if len(only.Rows) != len(res[0].Rows) {
		t.Fatalf("%d rows with TokenExportsOnly, %d without", len(only.Rows), len(res[0].Rows))
	}
	for i, row := range only.Rows {
		got, want := row.Exports.Get("cap.x"), res[0].Rows[i].Exports.Get("cap.x")
		if i < only.PromptTokens-1 {
			want = nil
		}
		if row.Pos != i || !slices.Equal(got, want) {
			t.Fatalf("TokenExportsOnly row %d: pos %d, %d values, want %d", i, row.Pos, len(got), len(want))
		}
	}
}

func TestSubmitRefusesWhatCanNeverFit(t *testing.T) {
	b := Compile(t, SmallModel)
	eng, err := loader.NewEngine(b, newCPU(t, b))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		req  loader.Request
		want string
	}{
		{loader.Request{Prompt: make([]int, 100), MaxTokens: 40}, "exceeds the bundle's max_seq_len 128"},
		{loader.Request{Prompt: []int{300}, MaxTokens: 1}, "outside the vocabulary"},
		{loader.Request{Prompt: []int{1}, Apps: []string{"nope"}, MaxTokens: 1}, `app "nope" is not deployed`},
	} {
		if _, err := eng.Submit(c.req); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Submit: %v, want %q", err, c.want)
		}
	}
}
