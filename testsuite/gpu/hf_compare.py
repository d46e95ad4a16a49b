#!/usr/bin/env python3
"""Issue 5's GPU check: 2-layer cuts of the Llama-3.1-8B and Qwen3-8B configs, written as
Hugging Face checkpoints by transformers itself (random init, bf16 safetensors), run by
transformers and by xmix (`hf: dir` spec, CUDA backend) on the same tokens; logits compared
at every position. Runs on the GPU machine (torch + transformers there), from the repository
root with .dev/gpu carried:  python3 testsuite/gpu/hf_compare.py OUT_DIR
Writes OUT_DIR/hf_compare.json."""
import json
import os
import subprocess
import sys

import numpy as np
import torch
import transformers

BIN = ".dev/gpu"
CUTS = {
    "llama-3.1-8b-2layers": dict(
        cls="LlamaForCausalLM", cfg="LlamaConfig", family="llama",
        kw=dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=2, num_attention_heads=32,
                num_key_value_heads=8, head_dim=128, vocab_size=128256, rope_theta=500000.0, rms_norm_eps=1e-5,
                max_position_embeddings=131072, tie_word_embeddings=False, bos_token_id=128000,
                eos_token_id=[128001, 128009],
                rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                  original_max_position_embeddings=8192))),
    "qwen3-8b-2layers": dict(
        cls="Qwen3ForCausalLM", cfg="Qwen3Config", family="qwen3",
        kw=dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=2, num_attention_heads=32,
                num_key_value_heads=8, head_dim=128, vocab_size=151936, rope_theta=1000000.0, rms_norm_eps=1e-6,
                max_position_embeddings=40960, tie_word_embeddings=False, bos_token_id=151643,
                eos_token_id=151645)),
}


def rel(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def main(out):
    os.makedirs(out, exist_ok=True)
    results = {"transformers": transformers.__version__, "torch": torch.__version__}
    for name, c in CUTS.items():
        d = os.path.join("/tmp/hfcmp", name)
        os.makedirs(d, exist_ok=True)
        torch.manual_seed(0)
        cfg = getattr(transformers, c["cfg"])(**c["kw"])
        model = getattr(transformers, c["cls"])(cfg).to(torch.bfloat16)
        model.save_pretrained(d, safe_serialization=True)
        gen = np.random.default_rng(1)
        ids = [c["kw"]["bos_token_id"]] + [int(x) for x in gen.integers(1000, 30000, 31)]
        x = torch.tensor([ids])
        with torch.no_grad():
            ref32 = model.to(torch.float32).to("cuda").eval()(x.to("cuda")).logits[0].float().cpu().numpy()
            ref16 = model.to(torch.bfloat16)(x.to("cuda")).logits[0].float().cpu().numpy()
        del model
        torch.cuda.empty_cache()
        spec = os.path.join(d, "spec.yaml")
        with open(spec, "w") as f:
            f.write(f"hf: {d}\nfamily: {c['family']}\ntokenizer: bytes\nbos: {ids[0]}\n"
                    "serving: {decode_buckets: [1], prefill_chunks: [64], max_seq_len: 256, max_seqs: 1}\n")
        xmb = os.path.join(d, "m.xmb")
        subprocess.run([f"{BIN}/xmixc", "build", spec, "-q", "-o", xmb], check=True)
        results[name] = {"positions": len(ids),
                         "transformers_bf16_vs_fp32_max_rel_err": max(rel(ref16[i], ref32[i]) for i in range(len(ids)))}
        # Both GEMM servers of the CUDA backend: cuBLASLt rounds x to bf16, PTX keeps hi+lo.
        for gemm in ("auto", "ptx"):
            lf = os.path.join(d, f"logits-{gemm}.f32")
            subprocess.run([f"{BIN}/xmix", "logits", xmb, "-q", "--backend", "cuda", "--gemm", gemm,
                            "--ids", json.dumps(ids), "--out", lf], check=True, capture_output=True, text=True)
            got = np.fromfile(lf, dtype="<f4").reshape(len(ids), -1)
            top = [int(v) for v in got.argmax(-1)]
            results[name]["xmix_gemm_" + gemm] = {
                "max_rel_err_vs_transformers_fp32": max(rel(got[i], ref32[i]) for i in range(len(ids))),
                "max_rel_err_vs_transformers_bf16": max(rel(got[i], ref16[i]) for i in range(len(ids))),
                "top1_equal_fp32": sum(int(a == b) for a, b in zip(top, ref32.argmax(-1))),
                "top1_equal_bf16": sum(int(a == b) for a, b in zip(top, ref16.argmax(-1))),
            }
        print(name, results[name], flush=True)
    with open(os.path.join(out, "hf_compare.json"), "w") as f:
        json.dump(results, f, indent=2, sort_keys=True)


if __name__ == "__main__":
    main(sys.argv[1])
