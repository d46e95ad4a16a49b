package passes

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"xmix/bundle"
	"xmix/safetensors"
)

// paramsFile writes tensors of f32 values (BF16 where the name ends in _bf16) to a
// safetensors file and returns its path.
func paramsFile(t *testing.T, tensors map[string][]float32) string {
	t.Helper()
	var ts []safetensors.Tensor
	for name, v := range tensors {
		var b []byte
		dtype := "F32"
		if strings.HasSuffix(name, "_bf16") {
			dtype = "BF16"
			for _, x := range v {
				b = binary.LittleEndian.AppendUint16(b, uint16(math.Float32bits(x)>>16))
			}
		} else {
			for _, x := range v {
				b = binary.LittleEndian.AppendUint32(b, math.Float32bits(x))
			}
		}
		ts = append(ts, safetensors.Tensor{Name: name, Dtype: dtype, Shape: []int{len(v)}, Data: b})
	}
	var out bytes.Buffer
	if err := safetensors.Write(&out, ts, nil); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "vectors.safetensors")
	if err := os.WriteFile(path, out.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestNonFiniteParamsAreRefused: a NaN or infinity in a safetensors vector or bias is an
// error at the param naming the file, the tensor and the first bad value, and a scalar whose
// product with its vector overflows f32 is an error at the scalar.
func TestNonFiniteParamsAreRefused(t *testing.T) {
	nan, inf := float32(math.NaN()), float32(math.Inf(1))
	file := paramsFile(t, map[string][]float32{
		"good":     {1, 2, 3, 4, 5, 6, 7, 8},
		"nan":      {1, 2, 3, 4, 5, nan, 7, nan},
		"inf":      {1, 2, -inf, 4, 5, 6, 7, 8},
		"big":      {1, 2, 3, 4, 5, 6, 7, 1e30},
		"inf_bf16": {inf},
	})
	app := func(params, op string) string {
		return fmt.Sprintf("app: a\nparams:\n%s\nbuffers: {h: {shape: [1]}}\nops:\n  - %s\n", params, op)
	}
	param := func(name, tensor string) string {
		return fmt.Sprintf("  %s: {file: %s, tensor: %s}", name, file, tensor)
	}
	for _, c := range []struct{ name, spec, want string }{
		{"NaN steering vector", app(param("v", "nan"), "write: {at: {layers: [1], hook: resid_post}, kernel: steer_add, args: {vector: v}}"),
			"a0.yaml:3:3: " + file + ": tensor nan: value 5 is NaN (every value of a param must be finite)"},
		{"infinite direction", app(param("d", "inf"), "write: {at: {layers: [1], hook: resid_post}, kernel: project_out, args: {direction: d}}"),
			file + ": tensor inf: value 2 is -Inf"},
		{"infinite probe bias", app(param("w", "good")+"\n"+param("b", "inf_bf16"), "read: {at: {layers: [0], hook: resid_post}, kernel: probe_linear, args: {w: w, bias: b}, into: h}"),
			"a0.yaml:4:3: " + file + ": tensor inf_bf16: value 0 is +Inf"},
		{"alpha times vector", app(param("v", "good"), "write: {at: {layers: [1], hook: resid_post}, kernel: steer_add, args: {vector: v, alpha: 1e38}}"),
			"a0.yaml:6:87: alpha 1e+38 times param v (largest value 8) overflows float32 in the residual stream's next RMSNorm (with this v, at most 1.292e+18 in magnitude)"},
		{"default alpha times vector", app(param("v", "big"), "write: {at: {layers: [1], hook: resid_post}, kernel: steer_add, args: {vector: v, alpha: 1e9}}"),
			"alpha 1e+09 times param v (largest value 1e+30) overflows float32"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := plan(t, c.spec)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("got %v\nwant %q", err, c.want)
			}
		})
	}
	p, err := plan(t, app(param("v", "good"), "write: {at: {layers: [1, 2], hook: resid_post}, kernel: steer_add, args: {vector: v, alpha: 3e17}}"))
	if err != nil {
		t.Fatal(err)
	}
	s := p.Apps[0].Scalars[0]
	if s.Scales != "app.a.param.v" || !s.Residual || s.Limit != bundle.ProductLimit([]float32{1, 2, 3, 4, 5, 6, 7, 8}, true) {
		t.Errorf("alpha %+v: want the limit of v in the residual stream", s)
	}
}
