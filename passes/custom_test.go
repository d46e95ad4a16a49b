package passes

import (
	"fmt"
	"strings"
	"testing"
)

// customApp is an app with one custom kernel k whose PTX (entry `entry`, for target) declares
// the ABI head plus ptxExtra and does nothing; sigExtra is its declared signature past the
// head and op its one op.
func customApp(target, entry string, ptxExtra, sigExtra []string, op string) string {
	params := []string{".param .u64 x", ".param .u32 stride", ".param .u32 offset", ".param .u32 width",
		".param .u64 ctl_mask", ".param .u32 bit"}
	for _, e := range ptxExtra {
		params = append(params, ".param ."+e)
	}
	text := fmt.Sprintf(".version 8.0\n.target %s\n.address_size 64\n.visible .entry %s(\n%s\n)\n{\n\tret;\n}\n",
		target, entry, strings.Join(params, ",\n"))
	sig := []string{"x u64", "stride u32", "offset u32", "width u32", "ctl_mask u64", "bit u32"}
	sig = append(sig, sigExtra...)
	return fmt.Sprintf(`app: c
params: {v: {values: [1, 2, 3, 4, 5, 6, 7, 8]}, short: {values: [1, 2]}}
kernels:
  k:
    entry: k
    signature: ["%s"]
    ptx: |
      %s
ops:
  - %s
`, strings.Join(sig, `", "`), strings.ReplaceAll(strings.TrimSpace(text), "\n", "\n      "), op)
}

// ptxParams turns "v u64" into the PTX spelling "u64 v".
func ptxParams(sig ...string) []string {
	var out []string
	for _, s := range sig {
		f := strings.Fields(s)
		out = append(out, f[1]+" "+f[0])
	}
	return out
}

func TestCustomOpBinds(t *testing.T) {
	for _, c := range []struct{ kernel, target string }{{"custom:k", "sm_80"}, {"k", "sm_80"}, {"k", "sm_90a"}} {
		src := customApp(c.target, "k", ptxParams("v u64", "alpha f32"), []string{"v u64", "alpha f32"},
			fmt.Sprintf("write: {at: {layers: [1, 3], hook: resid_post}, kernel: %s, args: {v: v, alpha: 2.5}}", c.kernel))
		p, err := plan(t, src)
		if err != nil {
			t.Fatal(err)
		}
		if len(p.Ops) != 2 {
			t.Fatalf("%d ops, want 2", len(p.Ops))
		}
		for _, op := range p.Ops {
			if op.Template != CustomTemplate || op.Host != HostCustom || op.Node.Layer != op.Layer || op.Custom.Name != "k" {
				t.Fatalf("op %+v not placed as a custom node", op)
			}
			a := op.CustomArgs
			if len(a) != 2 || a[0].Name != "v" || a[0].Buf != "app.c.param.v" || a[1].Name != "alpha" || a[1].Value != 2.5 {
				t.Fatalf("arguments %+v", a)
			}
		}
		if v := p.Apps[0].Vectors; len(v) != 1 || len(v[0].Data) != 8 {
			t.Fatalf("vectors %+v", v)
		}
	}
}

func TestCustomOpErrors(t *testing.T) {
	const at = "write: {at: {layers: [0], hook: resid_post}, kernel: custom:k}"
	cases := []struct{ name, app, want string }{
		{"bad ptx", strings.Replace(customApp("sm_90", "k", nil, nil, at), "ret;", "frobnicate.f32 %f1;", 1),
			"kernel k: PTX does not"},
		{"wrong signature", customApp("sm_90", "k", ptxParams("w u64"), []string{"v u64"},
			"write: {at: {layers: [0], hook: resid_post}, kernel: k, args: {v: v}}"),
			"entry k parameter 6 is w u64, the signature declares v u64"},
		{"wrong abi", strings.Replace(customApp("sm_90", "k", nil, nil, at), `"bit u32"`, `"bit u64"`, 1),
			"signature parameter 5 is bit u64, the ABI wants bit u32"},
		{"missing entry", customApp("sm_90", "other", nil, nil, at), "no .entry k in the PTX (entries: other)"},
		{"wrong target", customApp("sm_100", "k", nil, nil, at), ".target sm_100: want sm_90 or lower (sm_XX), or sm_90a"},
		{"wrong arch target", customApp("sm_80a", "k", nil, nil, at), ".target sm_80a: want sm_90 or lower (sm_XX), or sm_90a"},
		{"missing argument", customApp("sm_90", "k", ptxParams("v u64"), []string{"v u64"}, at),
			"kernel k declares parameter v, the op gives no such argument"},
		{"extra argument", customApp("sm_90", "k", nil, nil,
			"write: {at: {layers: [0], hook: resid_post}, kernel: k, args: {v: v}}"), `kernel k has no parameter "v"`},
		{"vector width", customApp("sm_90", "k", ptxParams("v u64"), []string{"v u64"},
			"write: {at: {layers: [0], hook: resid_post}, kernel: k, args: {v: short}}"),
			"param short has 2 elements, hook resid_post needs 8"},
		{"hook", customApp("sm_90", "k", nil, nil, "write: {at: {layers: [0], hook: attn.z}, kernel: k}"),
			"custom kernel k cannot sit at hook attn.z"},
		{"per-request vector", strings.Replace(customApp("sm_90", "k", ptxParams("v u64"), []string{"v u64"},
			"write: {at: {layers: [0], hook: resid_post}, kernel: k, args: {v: v}}"), "8]}", "8], per_request: true}", 1),
			"param v is per_request: custom kernels take compiled vectors only"},
		{"per-request layers", customApp("sm_90", "k", nil, nil, "write: {at: {layers: [0], hook: resid_post, per_request: true}, kernel: k}"),
			"kernel custom:k takes no per-request layers"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := plan(t, c.app)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want it to contain %q", err, c.want)
			}
			if !strings.Contains(err.Error(), ".yaml:") {
				t.Fatalf("error %v does not name file:line:col", err)
			}
		})
	}
}
