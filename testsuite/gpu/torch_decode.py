# Copied unchanged below this header block from ../shared/peers/torch_decode.py (the team's shared
# peer, as the lead gave it on 2026-12-01) so that testsuite/gpu/run.sh can run it beside xmix bench.
#
# The peer to beat on the GPU machine: a vLLM-style PyTorch decode step (vLLM itself cannot be
# installed there). Each decoder layer's dense part is compiled by torch.compile (inductor fuses
# RMSNorm, RoPE and SiLU*mul; the GEMMs go to cuBLAS); the KV write and attention (SDPA) run
# between the compiled parts, as in vLLM's piecewise split; the whole step -- every layer, the LM
# head, argmax and the next ids/positions -- is captured in ONE CUDA graph and replayed. bf16
# weights and residual, random weights, a static KV cache of P + new + 8 positions.
#
# Usage (GPU machine, PyTorch there):
#   RES=/tmp/out python3 torch_decode.py llama-3.1-8b 16:1,16:8,16:32,16:128,512:1,2048:8
# prints one line per PROMPT_LEN:BATCH shape and writes $RES/torch-MODEL.json with ms_step (the
# best of three rounds of 64 replays) and tok_s. Compare with `xmix bench --graph-buckets B`'s
# graph replay time on the same shapes, in the same run on the GPU machine.
import json, os, sys, time
import torch
import torch.nn.functional as F

torch._inductor.config.coordinate_descent_tuning = True
torch._dynamo.config.cache_size_limit = 64
CFGS = {
    "llama-3.2-1b": dict(d=2048, inter=8192, L=16, H=32, KV=8, hd=64, V=128256, tied=True),
    "llama-3.1-8b": dict(d=4096, inter=14336, L=32, H=32, KV=8, hd=128, V=128256, tied=False),
}
dev, dt = "cuda", torch.bfloat16


def main(name, shapes, new=64):
    c = CFGS[name]
    d, H, KV, hd, L = c["d"], c["H"], c["KV"], c["hd"], c["L"]
    g = torch.Generator(device=dev).manual_seed(0)
    rnd = lambda *s: torch.randn(*s, device=dev, dtype=dt, generator=g) * 0.02
    one = lambda: torch.ones(d, device=dev, dtype=dt)
    emb = rnd(c["V"], d)
    head_w = emb if c["tied"] else rnd(c["V"], d)
    norm_w = one()
    Ws = [dict(n1=one(), qkv=rnd((H + 2 * KV) * hd, d), o=rnd(d, H * hd), n2=one(),
               gu=rnd(2 * c["inter"], d), down=rnd(d, c["inter"])) for _ in range(L)]
    inv = 1.0 / (500000.0 ** (torch.arange(0, hd, 2, device=dev, dtype=torch.float32) / hd))
    ang = torch.arange(4096, device=dev, dtype=torch.float32)[:, None] * inv[None]
    cos_t, sin_t = ang.cos(), ang.sin()

    def rope(x, cos, sin):
        x1, x2 = x.float().chunk(2, -1)
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1).to(dt)

    @torch.compile(fullgraph=True)
    def pre(h, cos, sin, n1, wqkv):
        B = h.shape[0]
        x = F.rms_norm(h, (d,), n1, 1e-5)
        q, k, v = F.linear(x, wqkv).split([H * hd, KV * hd, KV * hd], -1)
        return rope(q.view(B, H, hd), cos, sin), rope(k.view(B, KV, hd), cos, sin), v.view(B, KV, hd)

    @torch.compile(fullgraph=True)
    def post(h, a, wo, n2, wgu, wdown):
        h = h + F.linear(a, wo)
        gt, up = F.linear(F.rms_norm(h, (d,), n2, 1e-5), wgu).chunk(2, -1)
        return h + F.linear(F.silu(gt) * up, wdown)

    @torch.compile(fullgraph=True)
    def head(h):
        return F.linear(F.rms_norm(h, (d,), norm_w, 1e-5), head_w).argmax(-1)

    res = {}
    for P, B in shapes:
        T = P + new + 8
        Kc = [torch.randn(B, KV, T, hd, device=dev, dtype=dt) for _ in range(L)]
        Vc = [torch.randn(B, KV, T, hd, device=dev, dtype=dt) for _ in range(L)]
        ids = torch.zeros(B, dtype=torch.long, device=dev)
        pos = torch.full((B,), P, dtype=torch.long, device=dev)
        bidx = torch.arange(B, device=dev)
        ar = torch.arange(T, device=dev)

        def step():
            h = emb[ids]
            mask = (ar[None, :] <= pos[:, None]).view(B, 1, 1, T)
            cos, sin = cos_t[pos].unsqueeze(1), sin_t[pos].unsqueeze(1)
            for l, w in enumerate(Ws):
                q, k, v = pre(h, cos, sin, w["n1"], w["qkv"])
                Kc[l][bidx, :, pos] = k
                Vc[l][bidx, :, pos] = v
                a = F.scaled_dot_product_attention(q.unsqueeze(2), Kc[l], Vc[l], attn_mask=mask, enable_gqa=True)
                h = post(h, a.reshape(B, H * hd), w["o"], w["n2"], w["gu"], w["down"])
            ids.copy_(head(h))
            pos.add_(1)

        t0 = time.perf_counter()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                step()
        torch.cuda.current_stream().wait_stream(s)
        torch.cuda.synchronize()
        compile_s = time.perf_counter() - t0
        gr = torch.cuda.CUDAGraph()
        with torch.cuda.graph(gr):
            step()
        best = None
        for _ in range(3):  # three timed rounds of `new` steps; the best round is reported
            pos.fill_(P)
            torch.cuda.synchronize()
            t = time.perf_counter()
            for _ in range(new):
                gr.replay()
            torch.cuda.synchronize()
            ms = (time.perf_counter() - t) / new * 1e3
            best = ms if best is None else min(best, ms)
        key = f"{name}.p{P}.b{B}"
        res[key] = dict(ms_step=round(best, 4), tok_s=round(B * 1e3 / best, 1), warmup_compile_s=round(compile_s, 1))
        print(key, res[key], flush=True)
        del gr, Kc, Vc
        torch.cuda.empty_cache()
    return res


if __name__ == "__main__":
    shapes = [tuple(int(v) for v in s.split(":")) for s in sys.argv[2].split(",")]
    out = main(sys.argv[1], shapes)
    path = os.path.join(os.environ.get("RES", "/tmp"), f"torch-{sys.argv[1]}.json")
    json.dump(out, open(path, "w"), indent=1)
