#!/usr/bin/env python3
"""Issue 16's Gemma 2 GPU check: random Gemma2ForCausalLM checkpoints of Gemma-2-2B's
dimensions written by transformers itself (save_pretrained, bf16 safetensors; norm weights
drawn around 0 so that RMSNorm's (1 + w) is exercised), loaded by xmix as `hf: dir` and run on
the CUDA backend; transformers runs the same bf16 weights in fp32 with eager attention (the
implementation that soft-caps scores). Compared at every position:
  - logits: relative L2 error < 2e-2, and the same top-1 (a position where transformers' own
    top two are closer than xmix's error there counts as a tie, and is listed);
  - every layer's output (xmix capture of resid_post at all layers, transformers' decoder
    layer outputs by forward hooks: hidden_states[l+1]): relative L2 error < 2e-2.
Cuts: 2 layers with the real window (4096), 2 layers with a window of 16 (it binds in a
40-token sequence, in prefill and in decode), and the full 26 layers. Each bundle runs with
the prompt fed one token at a time (decode kernels) and with all but the last 8 tokens
prefilled (tensor-core prefill attention, head dim 256), under both GEMM servers.
Runs on the GPU machine from the repository root with .dev/gpu carried:
    python3 testsuite/gpu/gemma2_compare.py OUT_DIR        (CUTS=name,name to choose)
Writes OUT_DIR/gemma2_compare.json and exits 1 when a comparison fails."""
import json
import os
import subprocess
import sys

import numpy as np
import torch
import transformers

BIN = os.environ.get("XMIX_BIN", ".dev/gpu")
BOUND = 2e-2
GEMMA2_2B = dict(hidden_size=2304, intermediate_size=9216, num_attention_heads=8, num_key_value_heads=4,
                 head_dim=256, vocab_size=256000, rope_theta=10000.0, rms_norm_eps=1e-6,
                 query_pre_attn_scalar=256, attn_logit_softcapping=50.0, final_logit_softcapping=30.0,
                 hidden_activation="gelu_pytorch_tanh", max_position_embeddings=8192,
                 tie_word_embeddings=True, bos_token_id=2, eos_token_id=1, pad_token_id=0)
CUTS = {
    "gemma-2-2b-2layers": dict(layers=2, window=4096, kv=["bf16", "f32"]),
    "gemma-2-2b-2layers-window16": dict(layers=2, window=16, kv=["bf16"]),
    "gemma-2-2b": dict(layers=26, window=4096, kv=["bf16"]),
}
POSITIONS = 40
DECODE_TAIL = 8  # positions fed one at a time after a prefilled prompt


def rel(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def gemma2(layers, window):
    kw = dict(GEMMA2_2B, num_hidden_layers=layers, sliding_window=window)
    try:
        cfg = transformers.Gemma2Config(**kw, attn_implementation="eager")
    except TypeError:
        cfg = transformers.Gemma2Config(**kw)
        cfg._attn_implementation = "eager"
    model = transformers.Gemma2ForCausalLM(cfg)
    if getattr(model.config, "_attn_implementation", "eager") != "eager":
        model.config._attn_implementation = "eager"
    assert model.config._attn_implementation == "eager", "soft-capped scores need eager attention"
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):  # Gemma2RMSNorm's weights start at 0
                p.normal_(0.0, 0.2)
    return model


def reference(model, ids):
    """fp32 logits [n, vocab] and each decoder layer's output [layers, n, hidden]."""
    outs = []

    def hook(_module, _args, output):
        outs.append((output[0] if isinstance(output, tuple) else output)[0].float().cpu().numpy())

    handles = [layer.register_forward_hook(hook) for layer in model.model.layers]
    try:
        with torch.no_grad():
            r = model(torch.tensor([ids], device="cuda"), output_hidden_states=True, use_cache=False)
    finally:
        for h in handles:
            h.remove()
    hs = [h[0].float().cpu().numpy() for h in r.hidden_states]
    # transformers' hidden_states[l+1] is layer l's output below the last layer (the last is
    # after the final norm): the hooks must agree with it there.
    agree = max((rel(outs[l], hs[l + 1]) for l in range(len(outs) - 1)), default=0.0)
    return r.logits[0].float().cpu().numpy(), np.stack(outs), agree


def compare(got_logits, got_hidden, ref_logits, ref_hidden, first):
    n, layers = ref_logits.shape[0], ref_hidden.shape[0]
    errs, ties, mismatches = [], [], []
    for i, p in enumerate(range(first, n)):
        errs.append(rel(got_logits[i], ref_logits[p]))
        g, w = int(got_logits[i].argmax()), int(ref_logits[p].argmax())
        if g != w:
            top2 = np.sort(ref_logits[p])[-2:]
            margin = float(top2[1] - top2[0])
            err = float(np.abs(got_logits[i] - ref_logits[p]).max())
            (ties if margin < err else mismatches).append(dict(position=p, xmix=g, transformers=w, margin=margin, max_abs_err=err))
    hidden = [[rel(got_hidden[p, l], ref_hidden[l, p]) for p in range(n)] for l in range(layers)]
    worst = max(max(h) for h in hidden)
    return {
        "positions": n - first, "first": first,
        "max_logits_rel_err": max(errs), "top1_mismatches": mismatches, "top1_ties": ties,
        "max_hidden_rel_err": worst, "max_hidden_rel_err_per_layer": [max(h) for h in hidden],
        "pass": max(errs) < BOUND and not mismatches and worst < BOUND,
    }


def main(out):
    os.makedirs(out, exist_ok=True)
    results = {"transformers": transformers.__version__, "torch": torch.__version__, "bound": BOUND}
    chosen = os.environ.get("CUTS", ",".join(CUTS)).split(",")
    ok = True
    for name in chosen:
        c = CUTS[name]
        d = os.path.join("/tmp/gemma2cmp", name)
        os.makedirs(d, exist_ok=True)
        torch.manual_seed(0)
        model = gemma2(c["layers"], c["window"]).to(torch.bfloat16)
        model.save_pretrained(d, safe_serialization=True)
        gen = np.random.default_rng(1)
        ids = [GEMMA2_2B["bos_token_id"]] + [int(x) for x in gen.integers(3, GEMMA2_2B["vocab_size"], POSITIONS - 1)]
        model = model.to(torch.float32).to("cuda").eval()
        ref32, hid32, agree = reference(model, ids)
        ref16, _, _ = reference(model.to(torch.bfloat16), ids)
        del model
        torch.cuda.empty_cache()
        res = {"layers": c["layers"], "sliding_window": c["window"], "hooks_vs_hidden_states_rel_err": agree,
               "transformers_bf16_vs_fp32_max_rel_err": max(rel(ref16[i], ref32[i]) for i in range(len(ids)))}
        H, L = GEMMA2_2B["hidden_size"], c["layers"]
        app = os.path.join(d, "cap.yaml")
        with open(app, "w") as f:
            f.write(f"app: cap\nbuffers:\n  x: {{shape: [{L * H}], dtype: f32, export: true}}\n"
                    "ops:\n  - read: {at: {layers: all, hook: resid_post}, kernel: capture, into: x}\n")
        for kv in c["kv"]:
            spec = os.path.join(d, f"spec-{kv}.yaml")
            with open(spec, "w") as f:
                f.write(f"hf: {d}\nfamily: gemma2\ntokenizer: bytes\nkv_dtype: {kv}\n"
                        "serving: {decode_buckets: [1], prefill_chunks: [64], max_seq_len: 256, max_seqs: 1}\n")
            xmb = os.path.join(d, f"m-{kv}.xmb")
            subprocess.run([f"{BIN}/xmixc", "build", spec, app, "-q", "-o", xmb], check=True)
            for gemm in ("auto", "ptx"):
                for plen in (1, len(ids) - DECODE_TAIL):
                    key = f"kv_{kv}_gemm_{gemm}_prompt_{plen}"
                    lf, ex = os.path.join(d, f"logits-{key}.f32"), os.path.join(d, f"ex-{key}")
                    run = subprocess.run([f"{BIN}/xmix", "logits", xmb, "-q", "--backend", "cuda", "--gemm", gemm,
                                          "--ids", json.dumps(ids), "--prompt-len", str(plen), "--out", lf,
                                          "--apps", "cap", "--exports", ex], capture_output=True, text=True)
                    if run.returncode != 0:
                        res[key] = {"pass": False, "error": run.stderr[-2000:]}
                        ok = False
                        continue
                    got = np.fromfile(lf, dtype="<f4").reshape(len(ids) - plen + 1, -1)
                    hid = np.fromfile(os.path.join(ex, "cap.x.f32"), dtype="<f4").reshape(len(ids), L, H)
                    res[key] = compare(got, hid, ref32, hid32, plen - 1)
                    ok = ok and res[key]["pass"]
        results[name] = res
        print(name, json.dumps(res, indent=1), flush=True)
    results["pass"] = ok
    with open(os.path.join(out, "gemma2_compare.json"), "w") as f:
        json.dump(results, f, indent=2, sort_keys=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
