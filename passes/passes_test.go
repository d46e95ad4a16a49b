package passes

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"xmix/frontend"
)

const testModel = `model: t
family: llama
dims: {hidden: 8, intermediate: 16, layers: 4, heads: 2, kv_heads: 1, head_dim: 4, vocab: 300}
weights: {synthetic: {seed: 1, std: 0.02}}
tokenizer: bytes
bos: 256
eos: [257]
`

func plan(t *testing.T, apps ...string) (*Program, error) {
	t.Helper()
	m, as, err := parseSpecs(t, testModel, apps...)
	if err != nil {
		return nil, err
	}
	return Run(m, as, Options{Verify: true})
}

// parseSpecs parses a model spec text and app spec texts against it.
func parseSpecs(t *testing.T, model string, apps ...string) (*frontend.Model, []*frontend.App, error) {
	t.Helper()
	dir := t.TempDir()
	m, err := frontend.ParseModel(filepath.Join(dir, "m.yaml"), []byte(model))
	if err != nil {
		t.Fatal(err)
	}
	var as []*frontend.App
	for i, src := range apps {
		a, err := frontend.ParseApp(filepath.Join(dir, "a"+string(rune('0'+i))+".yaml"), []byte(src), m)
		if err != nil {
			return nil, nil, err
		}
		as = append(as, a)
	}
	return m, as, nil
}

func TestPlanPlacesOpsInForwardOrder(t *testing.T) {
	p, err := plan(t, `app: s
params:
  v: {values: [1, 2, 3, 4, 5, 6, 7, 8]}
  d: {values: [0, 0, 0, 2, 0, 0, 0, 0]}
buffers:
  score: {shape: [2]}
ops:
  - write: {at: {layers: [2], hook: resid_post}, kernel: steer_add, args: {vector: v, alpha: 2}}
  - read: {at: {layers: "0-1", hook: resid_mid}, kernel: probe_linear, args: {w: v, bias: 0.5}, into: score}
  - write: {at: {hook: final_norm}, kernel: project_out, args: {direction: d}}
  - write: {at: {layers: [1], hook: attn.z}, kernel: steer_add, args: {vector: v}}
`)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, op := range p.Ops {
		got = append(got, op.Hook+"@"+string(rune('0'+op.Layer+1))+":"+op.Host)
	}
	want := "resid_mid@1:add_norm attn.z@2:mi resid_mid@2:add_norm resid_post@3:add_norm final_norm@0:add_norm"
	if strings.Join(got, " ") != want {
		t.Fatalf("order/placement:\n got %s\nwant %s", strings.Join(got, " "), want)
	}
	// The two probe layers write consecutive columns of one buffer.
	if p.Ops[0].OutCol != 0 || p.Ops[2].OutCol != 1 || p.Ops[0].OutWidth != 2 {
		t.Fatalf("probe columns: %d %d width %d", p.Ops[0].OutCol, p.Ops[2].OutCol, p.Ops[0].OutWidth)
	}
	// project_out's direction is normalised; scalars: alpha (2), bias (0.5), default alpha (1).
	a := p.Apps[0]
	for _, v := range a.Vectors {
		if strings.HasSuffix(v.Name, ".unit") && v.Data[3] != 1 {
			t.Fatalf("unit direction: %v", v.Data)
		}
	}
	if len(a.Scalars) != 3 || a.Scalars[0].Value != 2 || a.Scalars[1].Value != 0.5 || a.Scalars[2].Value != 1 {
		t.Fatalf("scalars: %+v", a.Scalars)
	}
	// final_norm is the last add+norm kernel's normalised output, resid_post(2) its residual.
	if p.Ops[4].Node.Name != "L3.mlp_residual" || p.Ops[3].Node.Name != "L2.mlp_residual" {
		t.Fatalf("host nodes: final %s, resid_post(2) %s", p.Ops[4].Node.Name, p.Ops[3].Node.Name)
	}
}

func TestPlanErrors(t *testing.T) {
	cases := []struct{ name, app, want string }{
		{"unknown hook", `app: a
ops:
  - write: {at: {layers: [1], hook: resid_pots}, kernel: scale}
`, `a0.yaml:3:37: unknown hook "resid_pots" (model "t", family llama) (did you mean "resid_post"? hooks the model can fire: embed, resid_pre, attn.q, attn.k, attn.v, attn.z, attn_out, resid_mid, mlp.act, mlp_out, resid_post, final_norm, logits, sampled)`},
		{"moe hook on llama", `app: a
ops:
  - write: {at: {layers: [1], hook: router_logits}, kernel: router_bias}
`, `unknown hook "router_logits"`},
		{"per-layer hook without layers", `app: a
ops:
  - write: {at: {hook: mlp.act}, kernel: scale}
`, "a0.yaml:3:24: hook mlp.act is per layer and needs layers"},
		{"whole-model hook with layers", `app: a
ops:
  - write: {at: {layers: 1, hook: logits}, kernel: scale}
`, "a0.yaml:3:26: hook logits is a whole-model hook and takes no layers"},
		{"per-request layers on a whole-model hook", `app: a
ops:
  - write: {at: {hook: logits, per_request: true}, kernel: scale}
`, "a0.yaml:3:45: hook logits is a whole-model hook: a request has no layers of it to choose"},
		{"wrong vector length", `app: a
params: {v: {values: [1, 2, 3]}}
ops:
  - write: {at: {layers: [0], hook: resid_post}, kernel: steer_add, args: {vector: v}}
`, "param v has 3 elements, hook resid_post needs 8"},
		{"token_override off sampled", `app: a
ops:
  - write: {at: {layers: [0], hook: resid_post}, kernel: token_override, args: {token: 1}}
`, "kernel token_override cannot sit at hook resid_post (hooks of token_override: sampled)"},
		{"token_override of no token", `app: a
ops:
  - write: {at: {hook: sampled}, kernel: token_override, args: {token: 2.5}}
`, "token_override: token 2.5 is not a token id"},
		{"token_override without token", `app: a
ops:
  - write: {at: {hook: sampled}, kernel: token_override}
`, `needs argument "token"`},
		{"steer at sampled", `app: a
params: {v: {values: [1]}}
ops:
  - write: {at: {hook: sampled}, kernel: steer_add, args: {vector: v}}
`, "kernel steer_add cannot sit at hook sampled"},
		{"lens k too large", `app: a
buffers: {h: {shape: [200]}}
ops:
  - read: {at: {layers: [0], hook: resid_post}, kernel: logit_lens, args: {k: 100}, into: h}
`, "must be a whole number from 1 to 64"},
		{"lens buffer too small", `app: a
buffers: {h: {shape: [4]}}
ops:
  - read: {at: {layers: [0], hook: resid_post}, kernel: logit_lens, into: h}
`, "buffer h has 4 elements"},
		{"lens under a condition", `app: a
buffers: {h: {shape: [10]}}
ops:
  - read: {at: {layers: [0], hook: resid_post}, kernel: logit_lens, into: h, when: {steps: {from: 1}}}
`, "takes no when: conditions"},
		{"steer_set without direction", `app: a
ops:
  - write: {at: {layers: [0], hook: resid_post}, kernel: steer_set, args: {value: 1}}
`, `needs argument "direction"`},
		{"head out of range", `app: a
ops:
  - write: {at: {layers: [0], hook: attn.z}, kernel: head_ablate, args: {head: 2}}
`, `head 2 out of range (model "t" has heads 0-1)`},
		{"head not whole", `app: a
ops:
  - write: {at: {layers: [0], hook: attn.z}, kernel: head_ablate, args: {head: 0.5}}
`, "must be a whole head index"},
		{"head_ablate off attn.z", `app: a
ops:
  - write: {at: {layers: [0], hook: resid_post}, kernel: head_ablate, args: {head: 0}}
`, "kernel head_ablate cannot sit at hook resid_post (hooks of head_ablate: attn.z)"},
		{"scale with alpha and vector", `app: a
params: {v: {values: [1, 2, 3, 4, 5, 6, 7, 8]}}
ops:
  - write: {at: {layers: [0], hook: resid_post}, kernel: scale, args: {vector: v, alpha: 2}}
`, "takes alpha or vector, not both"},
		{"clamp without bounds", `app: a
params: {d: {values: [1, 2, 3, 4, 5, 6, 7, 8]}}
ops:
  - write: {at: {layers: [0], hook: resid_post}, kernel: clamp_projection, args: {direction: d}}
`, "needs min, max or both"},
		{"clamp bounds swapped", `app: a
params: {d: {values: [1, 2, 3, 4, 5, 6, 7, 8]}}
ops:
  - write: {at: {layers: [0], hook: resid_post}, kernel: clamp_projection, args: {direction: d, min: 1, max: -1}}
`, "min 1 is above max -1"},
		{"patch of the wrong width", `app: a
params: {v: {values: [1, 2, 3, 4]}}
ops:
  - write: {at: {layers: [0], hook: resid_post}, kernel: patch, args: {vector: v}}
`, "param v has 4 elements, hook resid_post needs 8"},
		{"missing arg", `app: a
ops:
  - write: {at: {layers: [0], hook: resid_post}, kernel: steer_add}
`, `needs argument "vector"`},
		{"unknown arg", `app: a
params: {v: {values: [1, 2, 3, 4, 5, 6, 7, 8]}}
ops:
  - write: {at: {layers: [0], hook: resid_post}, kernel: steer_add, args: {vector: v, beta: 1}}
`, `takes no argument "beta"`},
		{"gate before writer", `app: a
params: {v: {values: [1, 2, 3, 4, 5, 6, 7, 8]}}
buffers: {h: {shape: [1]}}
ops:
  - read: {at: {layers: [3], hook: resid_post}, kernel: probe_linear, args: {w: v}, into: h}
  - write: {at: {layers: [1], hook: resid_post}, kernel: steer_add, args: {vector: v},
            when: {activation: {buffer: h, op: ">", value: 0.5}}}
`, "buffer h is not written before resid_post at layer 1 in the forward"},
		{"gate before writer, whole-model hook", `app: a
params: {v: {values: [1, 2, 3, 4, 5, 6, 7, 8]}}
buffers: {h: {shape: [1]}}
ops:
  - read: {at: {layers: [0], hook: resid_post}, kernel: probe_linear, args: {w: v}, into: h}
  - write: {at: {hook: embed}, kernel: steer_add, args: {vector: v},
            when: {activation: {buffer: h, op: ">", value: 0.5}}}
`, "buffer h is not written before embed in the forward"},
		{"buffer too small", `app: a
params: {v: {values: [1, 2, 3, 4, 5, 6, 7, 8]}}
buffers: {h: {shape: [1]}}
ops:
  - read: {at: {layers: [0, 1], hook: resid_post}, kernel: probe_linear, args: {w: v}, into: h}
`, "buffer h has 1 elements"},
		{"logits and tokens into one buffer", `app: a
buffers: {h: {shape: [308]}}
ops:
  - read: {at: {hook: logits}, kernel: capture, into: h}
  - read: {at: {layers: [0], hook: resid_post}, kernel: capture, into: h}
`, "is filled at hook logits (sampled rows) and at token hooks"},
		{"gate on a lens", `app: a
params: {v: {values: [1, 2, 3, 4, 5, 6, 7, 8]}}
buffers: {h: {shape: [2]}}
ops:
  - read: {at: {layers: [0], hook: resid_post}, kernel: logit_lens, args: {k: 1}, into: h}
  - write: {at: {layers: [2], hook: resid_post}, kernel: steer_add, args: {vector: v},
            when: {activation: {buffer: h, op: ">", value: 0.5}}}
`, "which a logit_lens fills"},
		{"probe at logits", `app: a
params: {v: {random: 1}}
buffers: {h: {shape: [1]}}
ops:
  - read: {at: {hook: logits}, kernel: probe_linear, args: {w: v}, into: h}
`, "kernel probe_linear cannot sit at hook logits"},
		{"per-request scalar", `app: a
params: {s: {values: [2], per_request: true}, v: {random: 1}}
ops:
  - write: {at: {layers: [0], hook: resid_post}, kernel: steer_add, args: {vector: v, alpha: s}}
`, "param s is per_request, but argument alpha is a scalar: only vector arguments take per-request values"},
		{"per-request lens layers", `app: a
buffers: {h: {shape: [4]}}
ops:
  - read: {at: {layers: [0, 1], hook: resid_post, per_request: true}, kernel: logit_lens, args: {k: 1}, into: h}
`, "kernel logit_lens takes no per-request layers in this version of xmixc"},
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

func TestVectorFromSafetensorsMissingTensor(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "v.safetensors"), []byte("not a safetensors file"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := plan(t, `app: a
params: {v: {file: `+filepath.Join(dir, "v.safetensors")+`, tensor: x}}
ops:
  - write: {at: {layers: [0], hook: resid_post}, kernel: steer_add, args: {vector: v}}
`)
	if err == nil || !strings.Contains(err.Error(), "safetensors") {
		t.Fatalf("got %v", err)
	}
}

// TestBindWriteTemplates binds each newer writing template and checks what codegen receives:
// the vector buffer, the scalar indices and their values, and head_ablate's column mask.
func TestBindWriteTemplates(t *testing.T) {
	p, err := plan(t, `app: w
params:
  d: {values: [0, 3, 0, 4, 0, 0, 0, 0]}
  f: {values: [1, 2, 3, 4, 5, 6, 7, 8]}
  z: {values: [1, 1, 1, 1, 1, 1, 1, 1]}
ops:
  - write: {at: {layers: [0], hook: resid_post}, kernel: steer_set, args: {direction: d, value: 1.5}}
  - write: {at: {layers: [0], hook: resid_post}, kernel: clamp_projection, args: {direction: d, max: 0.25}}
  - write: {at: {layers: [0], hook: resid_post}, kernel: scale, args: {alpha: 0.5}}
  - write: {at: {layers: [0], hook: resid_post}, kernel: scale, args: {vector: f}}
  - write: {at: {layers: [1], hook: attn.z}, kernel: head_ablate, args: {head: 1}}
  - write: {at: {layers: [2], hook: resid_mid}, kernel: patch, args: {vector: z},
            when: {positions: generated}}
`)
	if err != nil {
		t.Fatal(err)
	}
	a := p.Apps[0]
	scalar := func(i int) float32 { return a.Scalars[i].Value }
	vector := func(buf string) []float32 {
		for _, v := range a.Vectors {
			if v.Buffer == buf {
				return v.Data
			}
		}
		t.Fatalf("no vector for buffer %q", buf)
		return nil
	}
	byIndex := map[int]*MIOp{}
	for _, op := range p.Ops {
		byIndex[op.OpIndex] = op
	}
	set, clamp, scale, scaleVec, head, patch := byIndex[0], byIndex[1], byIndex[2], byIndex[3], byIndex[4], byIndex[5]
	if set.Alpha < 0 || scalar(set.Alpha) != 1.5 || set.Bias != -1 || vector(set.Vec)[1] != 0.6 {
		t.Errorf("steer_set: alpha %d bias %d vec %v", set.Alpha, set.Bias, vector(set.Vec))
	}
	if clamp.Vec != set.Vec || clamp.Alpha != -1 || clamp.Bias < 0 || scalar(clamp.Bias) != 0.25 {
		t.Errorf("clamp_projection: vec %s (steer_set's %s), min %d, max %d", clamp.Vec, set.Vec, clamp.Alpha, clamp.Bias)
	}
	if scale.Vec != "" || scale.Alpha < 0 || scalar(scale.Alpha) != 0.5 {
		t.Errorf("scale by alpha: vec %q alpha %d", scale.Vec, scale.Alpha)
	}
	if scaleVec.Alpha != -1 || vector(scaleVec.Vec)[7] != 8 {
		t.Errorf("scale by vector: alpha %d vec %q", scaleVec.Alpha, scaleVec.Vec)
	}
	// attn.z of the test model is 2 heads of 4: head 1 is columns 4-7; alpha defaults to 0.
	if got := fmt.Sprint(vector(head.Vec)); got != "[0 0 0 0 1 1 1 1]" || scalar(head.Alpha) != 0 || head.Host != HostMI {
		t.Errorf("head_ablate: mask %s alpha %v host %s", got, scalar(head.Alpha), head.Host)
	}
	if patch.Alpha != -1 || len(patch.Gates) != 1 || patch.Gates[0].Positions != "generated" {
		t.Errorf("patch: alpha %d gates %+v", patch.Alpha, patch.Gates)
	}
}

// TestBindErrorOncePerOp: an op over several layers that fails to bind is reported once.
func TestBindErrorOncePerOp(t *testing.T) {
	_, err := plan(t, `app: a
ops:
  - write: {at: {layers: "0-3", hook: attn.z}, kernel: head_ablate, args: {head: 7}}
`)
	if err == nil || strings.Count(err.Error(), "out of range") != 1 {
		t.Fatalf("error %v, want one out-of-range report", err)
	}
}

func TestParamAndBufferMayShareAName(t *testing.T) {
	p, err := plan(t, `app: a
params: {harm: {values: [1, 2, 3, 4, 5, 6, 7, 8]}}
buffers: {harm: {shape: [1]}}
ops:
  - read: {at: {layers: [0], hook: resid_post}, kernel: probe_linear, args: {w: harm}, into: harm}
`)
	if err != nil {
		t.Fatal(err)
	}
	if op := p.Ops[0]; op.Vec == op.Out {
		t.Fatalf("param and buffer got the same device buffer %q", op.Vec)
	}
}

// TestRunTimeControl: activation thresholds become app scalars named op<i>.threshold (one per
// op, whatever its layers), after_token sets get latch bits shared by equal sets across
// apps, and vectors remember the param they hold.
func TestRunTimeControl(t *testing.T) {
	p, err := plan(t, `app: a
params:
  v: {values: [1, 2, 3, 4, 5, 6, 7, 8]}
buffers:
  h: {shape: [1]}
ops:
  - read: {at: {layers: [0], hook: resid_post}, kernel: probe_linear, args: {w: v}, into: h}
  - write: {at: {layers: "1-2", hook: resid_post}, kernel: steer_add, args: {vector: v, alpha: 3},
            when: {activation: {buffer: h, op: ">", value: 0.25}, after_token: [65, 66]}}
  - write: {at: {layers: [3], hook: resid_post}, kernel: project_out, args: {direction: v}, when: {after_token: [70]}}
`, `app: b
params:
  v: {values: [1, 2, 3, 4, 5, 6, 7, 8]}
ops:
  - write: {at: {layers: [1], hook: resid_post}, kernel: steer_add, args: {vector: v}, when: {after_token: [66, 65, 65]}}
`)
	if err != nil {
		t.Fatal(err)
	}
	a := p.Apps[0]
	if got := fmt.Sprint(a.Scalars); got != "[{op1.alpha 3 app.a.param.v true 1.2915303e+18} {op1.threshold 0.25  false 0}]" {
		t.Fatalf("app a scalars %s", got)
	}
	if got := fmt.Sprint(p.Latches); got != "[[65 66] [70]]" {
		t.Fatalf("latches %s", got)
	}
	for _, op := range p.Ops {
		for _, g := range op.Gates {
			switch {
			case g.Kind == "activation" && g.Thresh != 2:
				t.Errorf("%s layer %d: threshold scalar %d, want 1", op.App.Name, op.Layer, g.Thresh-1)
			case g.Kind == "after_token" && g.Latch != map[string]int{"project_out": 1}[op.Template]:
				t.Errorf("%s %s layer %d: latch %d", op.App.Name, op.Template, op.Layer, g.Latch)
			}
		}
	}
	var params []string
	for _, v := range a.Vectors {
		params = append(params, fmt.Sprintf("%s:%s:%v", v.Name, v.Param, v.Unit))
	}
	if got := strings.Join(params, " "); got != "v:v:false v.unit:v:true" {
		t.Fatalf("vectors %s", got)
	}
}

func TestRandomParamFitsTheHook(t *testing.T) {
	p, err := plan(t, `app: a
params: {r: {random: 7}}
ops:
  - write: {at: {layers: [0], hook: resid_post}, kernel: steer_add, args: {vector: r}}
  - write: {at: {layers: [1], hook: mlp.act}, kernel: project_out, args: {direction: r}}
`)
	if err != nil {
		t.Fatal(err)
	}
	widths := map[int]bool{}
	for _, v := range p.Apps[0].Vectors {
		var n float64
		for _, x := range v.Data {
			n += float64(x) * float64(x)
		}
		if n < 0.999 || n > 1.001 {
			t.Fatalf("vector %s has squared norm %g, want 1", v.Name, n)
		}
		widths[len(v.Data)] = true
	}
	if !widths[8] || !widths[16] {
		t.Fatalf("random vectors have widths %v, want the hooks' 8 and 16", widths)
	}
}

// TestTailPlacement: ops at logits, sampled and logit_lens land in their hosts.
func TestTailPlacement(t *testing.T) {
	p, err := plan(t, `app: a
params: {v: {random: 1}}
buffers: {top: {shape: [6]}, l: {shape: [300]}}
ops:
  - read: {at: {layers: [2], hook: resid_post}, kernel: logit_lens, args: {k: 3}, into: top}
  - write: {at: {hook: logits}, kernel: steer_add, args: {vector: v}}
  - read: {at: {hook: logits}, kernel: capture, into: l}
  - write: {at: {hook: sampled}, kernel: token_override, args: {token: 5}, when: {steps: {from: 2}}}
`)
	if err != nil {
		t.Fatal(err)
	}
	want := []struct {
		host, node string
		width      int
	}{{HostLens, "L2.resid_post.a.op0", 8}, {HostLogits, "logits", 300}, {HostLogits, "logits", 300}, {HostSampler, "sample", 1}}
	if len(p.Ops) != len(want) {
		t.Fatalf("%d ops, want %d", len(p.Ops), len(want))
	}
	for i, w := range want {
		op := p.Ops[i]
		if op.Host != w.host || op.Node.Name != w.node || op.Width != w.width {
			t.Errorf("op %d (%s): host %s/%s width %d, want %s/%s width %d", i, op.Template, op.Host, op.Node.Name, op.Width, w.host, w.node, w.width)
		}
	}
	if p.Ops[0].K != 3 || p.Ops[0].OutWidth != 6 || len(p.Ops[3].Gates) != 1 || p.Ops[3].Alpha < 0 {
		t.Errorf("lens k %d into %d; override gates %v token scalar %d", p.Ops[0].K, p.Ops[0].OutWidth, p.Ops[3].Gates, p.Ops[3].Alpha)
	}
}

// TestHookOrder: ops at one hook run apps in build order, then each app's ops in spec order,
// whatever order the apps list their sites in; a logit lens at the same site comes last.
func TestHookOrder(t *testing.T) {
	p, err := plan(t, `app: a
params: {d: {values: [1, 0, 0, 0, 0, 0, 0, 0]}}
buffers: {x: {shape: [8]}, y: {shape: [8]}, top: {shape: [2]}}
ops:
  - read: {at: {layers: [1], hook: resid_post}, kernel: logit_lens, args: {k: 1}, into: top}
  - read: {at: {layers: [1], hook: resid_post}, kernel: capture, into: x}
  - write: {at: {layers: [1], hook: resid_post}, kernel: project_out, args: {direction: d}}
  - read: {at: {layers: [1], hook: resid_post}, kernel: capture, into: y}
`, `app: b
params: {v: {values: [1, 1, 1, 1, 1, 1, 1, 1]}}
ops:
  - write: {at: {layers: [2, 1], hook: resid_post}, kernel: steer_add, args: {vector: v}}
`)
	if err != nil {
		t.Fatal(err)
	}
	order := p.HookOrder()
	var got []string
	for i, op := range p.Ops {
		got = append(got, fmt.Sprintf("L%d#%d:%s.op%d", op.Layer, order[i], op.App.Name, op.OpIndex))
	}
	// p.Ops is in forward order (the lens sorts with its site, by app and op index); HookOrder
	// says when each runs there: the lens after the fused ops.
	want := "L1#5:a.op0 L1#1:a.op1 L1#2:a.op2 L1#3:a.op3 L1#4:b.op0 L2#1:b.op0"
	if strings.Join(got, " ") != want {
		t.Fatalf("hook order\n got %s\nwant %s", strings.Join(got, " "), want)
	}
}

// TestPerRequestPlan: a per_request param's vectors (raw and unit) are marked and the ops
// that read them say so; an op with per-request layers gets a mask after the app's scalars
// and a layers gate per site on its layer's bit.
func TestPerRequestPlan(t *testing.T) {
	p, err := plan(t, `app: a
params: {v: {random: 1, per_request: true}, w: {random: 2}}
ops:
  - write: {at: {layers: [1, 3], hook: resid_post, per_request: true}, kernel: steer_add, args: {vector: v, alpha: 2}}
  - write: {at: {layers: [2], hook: resid_post}, kernel: project_out, args: {direction: v}}
  - write: {at: {layers: [2], hook: resid_post}, kernel: steer_add, args: {vector: w}}
`)
	if err != nil {
		t.Fatal(err)
	}
	a := p.Apps[0]
	var pr []string
	for _, v := range a.Vectors {
		if v.PerRequest {
			pr = append(pr, v.Name)
		}
	}
	if strings.Join(pr, " ") != "v v.unit" || !p.PerRequestVectors() || p.VectorSlots != 8 {
		t.Fatalf("per-request vectors %v, slots %d", pr, p.VectorSlots)
	}
	if len(a.LayerMasks) != 1 || a.LayerMasks[0].Col != len(a.Scalars) || a.LayerMasks[0].Words != 1 || fmt.Sprint(a.LayerMasks[0].Layers) != "[1 3]" || a.TableWidth() != len(a.Scalars)+1 {
		t.Fatalf("layer masks %+v, %d scalars, table width %d", a.LayerMasks, len(a.Scalars), a.TableWidth())
	}
	for _, op := range p.Ops {
		gated := len(op.Gates) == 1 && op.Gates[0].Kind == "layers" && op.Gates[0].Word == len(a.Scalars) && op.Gates[0].Bit == op.Layer
		if op.VecPerRequest != (op.OpIndex != 2) || gated != (op.OpIndex == 0) {
			t.Errorf("op %d at layer %d: per-request vector %v, gates %+v", op.OpIndex, op.Layer, op.VecPerRequest, op.Gates)
		}
	}
}
