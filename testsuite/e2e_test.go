package testsuite

import (
	"testing"

	"xmix/loader"
)

var newCPU = NewCPU

func TestCPUSteerAddIsExact(t *testing.T)  { CheckSteerExact(t, newCPU) }
func TestCPUProjectOut(t *testing.T)       { CheckProjectOut(t, newCPU) }
func TestCPUProbeLinear(t *testing.T)      { CheckProbe(t, newCPU) }
func TestCPUBatchMatchesSolo(t *testing.T) { CheckBatchMatchesSolo(t, newCPU) }
func TestCPUSteerSet(t *testing.T)         { CheckSteerSet(t, newCPU) }
func TestCPUClampProjection(t *testing.T)  { CheckClampProjection(t, newCPU) }
func TestCPUScaleIsExact(t *testing.T)     { CheckScale(t, newCPU) }
func TestCPUHeadAblate(t *testing.T)       { CheckHeadAblate(t, newCPU) }
func TestCPUPatch(t *testing.T)            { CheckPatch(t, newCPU) }
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
		if row.Pos != i || len(row.Exports["cap.x"]) != 128 {
			t.Fatalf("row %d: pos %d, %d values exported", i, row.Pos, len(row.Exports["cap.x"]))
		}
	}
	for _, row := range res[1].Rows {
		if len(row.Exports) != 0 {
			t.Fatalf("request without the app got exports %v", row.Exports)
		}
	}
}
