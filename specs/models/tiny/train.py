"""Train xmix's embedded "tiny" Llama and derive its demo vectors and reference outputs.

One command on a GPU machine (torch + transformers) produces, under --out:
  model.safetensors   bf16 weights, Hugging Face Llama names, no lm_head (tied)
  config.json         Hugging Face LlamaConfig for those weights
  vectors.safetensors happy_dir, happy_probe, happy_probe_bias (f32, layer 3 resid_post)
  reference.json      greedy/steered continuations, last-position logits, probe scores
Everything after training runs on the CPU in float32 from the bf16-rounded weights, so the
reference numbers are what a float32 reimplementation of the saved model must reproduce.

    python3 train.py --out DIR                 # full run (GPU)
    python3 train.py --out DIR --smoke         # minutes-free check of every code path (CPU ok)

RECIPE.md records the exact command and its output.
"""

import argparse
import json
import math
import os
import struct
import sys
import time
import types

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import corpus  # noqa: E402

BOS, EOS, VOCAB = 256, 257, 258
LAYER = 3  # decoder layer (0-based) whose output (resid_post) the vectors live at
SEQ = 256

CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 256,
    "intermediate_size": 768,
    "num_hidden_layers": 6,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "vocab_size": VOCAB,
    "max_position_embeddings": 512,
    "rope_theta": 10000.0,
    "rope_scaling": None,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": True,
    "attention_bias": False,
    "attention_dropout": 0.0,
    "mlp_bias": False,
    "hidden_act": "silu",
    "initializer_range": 0.02,
    "bos_token_id": BOS,
    "eos_token_id": EOS,
    "torch_dtype": "bfloat16",
}


def log(*a):
    print(*a, flush=True)


# --- model -------------------------------------------------------------------------------


def hf_model(attn):
    """The Hugging Face LlamaForCausalLM for CONFIG, with the given attention implementation."""
    from transformers import LlamaConfig, LlamaForCausalLM

    keys = {k: v for k, v in CONFIG.items() if k not in ("architectures", "model_type", "torch_dtype")}
    try:
        cfg = LlamaConfig(**keys, attn_implementation=attn)
    except TypeError:
        cfg = LlamaConfig(**keys)
        cfg._attn_implementation = attn
    m = LlamaForCausalLM(cfg)
    m.config.use_cache = False
    return m


class RMSNorm(nn.Module):
    def __init__(self, n, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x):
        dt = x.dtype
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(dt)


def rotate_half(x):
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        h, d = c["hidden_size"], c["head_dim"]
        self.nh, self.nkv, self.hd = c["num_attention_heads"], c["num_key_value_heads"], d
        self.q_proj = nn.Linear(h, self.nh * d, bias=False)
        self.k_proj = nn.Linear(h, self.nkv * d, bias=False)
        self.v_proj = nn.Linear(h, self.nkv * d, bias=False)
        self.o_proj = nn.Linear(self.nh * d, h, bias=False)

    def forward(self, x, cos, sin):
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.nh, self.hd).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.nkv, self.hd).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.nkv, self.hd).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        rep = self.nh // self.nkv  # query head i reads kv head i // rep, as HF's repeat_kv
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        if self.training and hasattr(F, "scaled_dot_product_attention"):
            # Training speed only; the analysis runs in eval mode, written out below.
            z = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.o_proj(z.transpose(1, 2).reshape(b, t, self.nh * self.hd))
        s = (q @ k.transpose(-1, -2)) / math.sqrt(self.hd)
        mask = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
        s = s.masked_fill(mask, float("-inf"))
        p = torch.softmax(s.float(), dim=-1).to(q.dtype)
        z = (p @ v).transpose(1, 2).reshape(b, t, self.nh * self.hd)
        return self.o_proj(z)


class MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        h, i = c["hidden_size"], c["intermediate_size"]
        self.gate_proj = nn.Linear(h, i, bias=False)
        self.up_proj = nn.Linear(h, i, bias=False)
        self.down_proj = nn.Linear(i, h, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.input_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.self_attn = Attention(c)
        self.post_attention_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.mlp = MLP(c)

    def forward(self, x, cos, sin):
        h = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return h + self.mlp(self.post_attention_layernorm(h))


class Body(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.embed_tokens = nn.Embedding(c["vocab_size"], c["hidden_size"])
        self.layers = nn.ModuleList(Layer(c) for _ in range(c["num_hidden_layers"]))
        self.norm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])


class PlainLlama(nn.Module):
    """Llama written out from the definition, with Hugging Face's parameter names.

    It checks the HF model (both must agree on the saved weights) and stands in for it where
    transformers is missing (--smoke on a CPU box)."""

    def __init__(self, c=CONFIG):
        super().__init__()
        self.c = c
        self.model = Body(c)
        for mod in self.modules():
            if isinstance(mod, (nn.Linear, nn.Embedding)):
                nn.init.normal_(mod.weight, std=c["initializer_range"])

    def forward(self, input_ids, use_cache=False):
        c = self.c
        t = input_ids.shape[1]
        d = c["head_dim"]
        inv = 1.0 / (c["rope_theta"] ** (torch.arange(0, d, 2, device=input_ids.device).float() / d))
        ang = torch.arange(t, device=input_ids.device).float()[:, None] * inv[None]
        emb = torch.cat((ang, ang), dim=-1)
        x = self.model.embed_tokens(input_ids)
        cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
        for layer in self.model.layers:
            x = layer(x, cos, sin)
        x = self.model.norm(x)
        return types.SimpleNamespace(logits=x @ self.model.embed_tokens.weight.t())


# --- safetensors (written by hand so the layout is exactly what xmix reads) ---------------

_DT = {torch.bfloat16: ("BF16", torch.int16, np.int16), torch.float32: ("F32", torch.float32, np.float32)}
_DT_BY_NAME = {v[0]: (k, v[2]) for k, v in _DT.items()}


def save_safetensors(path, tensors, metadata):
    header, blobs, off = {}, [], 0
    for name in sorted(tensors):
        t = tensors[name].detach().cpu().contiguous()
        code, view, _ = _DT[t.dtype]
        arr = t.view(view).numpy()
        b = arr.astype(arr.dtype.newbyteorder("<")).tobytes()
        header[name] = {"dtype": code, "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    header["__metadata__"] = {k: str(v) for k, v in metadata.items()}
    hb = json.dumps(header, separators=(",", ":")).encode()
    hb += b" " * (-len(hb) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hb)))
        f.write(hb)
        for b in blobs:
            f.write(b)


def load_safetensors(path):
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    header.pop("__metadata__", None)
    out = {}
    for name, h in header.items():
        tdt, ndt = _DT_BY_NAME[h["dtype"]]
        a, b = h["data_offsets"]
        arr = np.frombuffer(raw[8 + n + a : 8 + n + b], dtype=np.dtype(ndt).newbyteorder("<")).copy()
        out[name] = torch.from_numpy(arr).view(tdt).reshape(h["shape"])
    return out


# --- data --------------------------------------------------------------------------------


def encode_docs(texts):
    """Documents packed as BOS text EOS BOS text EOS ... in one int64 array."""
    data = "".join("\x02" + s + "\x03" for s in texts).encode("ascii")
    arr = np.frombuffer(data, dtype=np.uint8).astype(np.int64)
    arr[arr == 2] = BOS
    arr[arr == 3] = EOS
    return arr


def prompt_ids(text):
    return [BOS] + list(text.encode("utf-8"))


def decode(ids):
    return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")


# --- training ----------------------------------------------------------------------------


def lr_at(step, total, peak, warmup):
    if step < warmup:
        return peak * (step + 1) / warmup
    frac = min(1.0, (step - warmup) / max(1, total - warmup))
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))


def train(args, dev):
    t0 = time.time()
    texts = corpus.corpus(args.seed, args.shards, args.per_shard, workers=None if not args.smoke else 1)
    data = encode_docs(texts)
    val = encode_docs(corpus.stories(args.seed + 10_000, 2000 if not args.smoke else 50))
    log(f"corpus: {len(texts)} stories, {len(data)} tokens ({len(data) / 1e6:.1f} MB), "
        f"val {len(val)} tokens, built in {time.time() - t0:.1f}s; first stories:")
    for t in texts[:3]:
        log("  " + t)
    del texts
    if dev == "cuda":  # only now: the corpus workers are forked before CUDA starts
        log(f"gpu: {torch.cuda.get_device_name(0)}")
        torch.backends.cuda.matmul.allow_tf32 = True

    torch.manual_seed(args.seed)
    model, kind = None, "plain"
    if not args.plain:
        try:
            model, kind = hf_model("sdpa"), "hf"
        except Exception as e:  # a transformers API change must not cost the device run
            log(f"cannot build the HF model ({e!r}); training PlainLlama (same names and math)")
    if model is not None:
        try:  # one tiny forward/backward, so an API mismatch shows now and not mid-run
            probe_x = torch.randint(0, VOCAB, (2, 8))
            model(input_ids=probe_x, use_cache=False).logits.float().mean().backward()
            model.zero_grad(set_to_none=True)
        except Exception as e:
            log(f"HF model forward failed ({e!r}); training PlainLlama (same names and math)")
            model, kind = None, "plain"
    if model is None:
        torch.manual_seed(args.seed)
        model = PlainLlama()
    model.to(dev).train()
    n_params = sum(p.numel() for p in model.parameters())
    log(f"model: {kind}, {n_params} parameters (tied embeddings counted once)")

    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt_kw = {"fused": True} if dev == "cuda" else {}
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr, betas=(0.9, 0.95), eps=1e-8, **opt_kw)

    tdata = torch.from_numpy(data).to(dev)
    g = torch.Generator(device=dev)
    g.manual_seed(args.seed)
    span = torch.arange(SEQ + 1, device=dev)
    total = args.steps or 10**9
    losses, acc, acc_n = [], torch.zeros((), device=dev), 0
    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
    t_train = time.time()
    step = 0
    while step < total:
        lr = lr_at(step, total, args.lr, args.warmup)
        for grp in opt.param_groups:
            grp["lr"] = lr
        starts = torch.randint(0, len(data) - SEQ - 1, (args.batch,), device=dev, generator=g)
        xy = tdata[starts[:, None] + span]
        with torch.autocast(device_type=dev, dtype=torch.bfloat16, enabled=(dev == "cuda")):
            logits = model(input_ids=xy[:, :-1], use_cache=False).logits
        loss = F.cross_entropy(logits.float().reshape(-1, VOCAB), xy[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        acc += loss.detach()
        acc_n += 1
        step += 1
        if step == 10:
            sync()
            t10 = time.time()
        if step == 40 and not args.steps:
            # Size the run from the measured step time so training takes --seconds; the
            # chosen count is logged, and --steps reproduces it exactly.
            sync()
            per = (time.time() - t10) / 30
            total = max(200, int((args.seconds - (time.time() - t_train)) / per) + 40)
            log(f"step time {per * 1000:.1f} ms -> {total} steps (rerun with --steps {total})")
        if step % args.log_every == 0 or step == total:
            m = (acc / acc_n).item()
            losses.append((step, m))
            log(f"step {step:6d}  lr {lr:.2e}  loss {m:.4f}  {time.time() - t_train:6.1f}s")
            acc, acc_n = torch.zeros((), device=dev), 0
    sync()
    train_s = time.time() - t_train
    model.eval()
    vloss = eval_loss(model, val, dev, args.batch)
    log(f"trained {total} steps x {args.batch} x {SEQ} tokens in {train_s:.1f}s; val loss {vloss:.4f}")
    summary = {"steps": total, "train_seconds": round(train_s, 1), "val_loss": round(vloss, 4),
               "losses": losses, "tokens": len(data), "params": n_params, "model_kind": kind}
    return model, summary


@torch.no_grad()
def eval_loss(model, val, dev, batch):
    t = torch.from_numpy(val).to(dev)
    n = (len(val) - 1) // SEQ
    xs = t[: n * SEQ + 1]
    tot, cnt = 0.0, 0
    for i in range(0, n, batch):
        idx = torch.arange(i, min(n, i + batch), device=dev)[:, None] * SEQ + torch.arange(SEQ + 1, device=dev)
        xy = xs[idx]
        with torch.autocast(device_type=dev, dtype=torch.bfloat16, enabled=(dev == "cuda")):
            logits = model(input_ids=xy[:, :-1], use_cache=False).logits
        tot += F.cross_entropy(logits.float().reshape(-1, VOCAB), xy[:, 1:].reshape(-1), reduction="sum").item()
        cnt += xy[:, 1:].numel()
    return tot / cnt


# --- analysis on the saved weights ---------------------------------------------------------


class Runner:
    """Forward passes of a float32 model on CPU with a hook at layer LAYER's output: records
    that residual and optionally adds a steering vector to it at every position."""

    def __init__(self, model):
        self.model = model.eval()
        self.steer = None
        self.resid = None
        model.model.layers[LAYER].register_forward_hook(self._hook)

    def _hook(self, mod, inp, out):
        h = out[0] if isinstance(out, tuple) else out
        if not torch.is_tensor(h):
            raise TypeError(f"decoder layer returned {type(out)}")
        if self.steer is not None:
            h = h + self.steer
        self.resid = h.detach()[0]
        if self.steer is None:
            return None
        return (h,) + tuple(out[1:]) if isinstance(out, tuple) else h

    @torch.no_grad()
    def __call__(self, ids, steer=None):
        self.steer = steer
        try:
            logits = self.model(input_ids=torch.tensor([ids]), use_cache=False).logits[0]
        finally:
            self.steer = None
        return logits.float(), self.resid.float()

    def greedy(self, ids, n, steer=None):
        out = []
        for _ in range(n):
            logits, _ = self(ids + out, steer)
            nxt = int(torch.argmax(logits[-1]))
            out.append(nxt)
            if nxt == EOS:
                break
        return out


def load_f32(model, weights):
    """Load bf16 weights into a float32 model; the tied head is the embedding."""
    w32 = {k: v.float() for k, v in weights.items()}
    missing, unexpected = model.load_state_dict(w32, strict=False)
    missing = [k for k in missing if k != "lm_head.weight"]
    if missing or unexpected:
        raise RuntimeError(f"weights do not fit the model: missing {missing}, unexpected {unexpected}")
    if hasattr(model, "lm_head"):
        model.lm_head.weight.data.copy_(w32["model.embed_tokens.weight"])
    return model.float().eval()


def read_lines(name):
    with open(os.path.join(HERE, name)) as f:
        return [ln.rstrip("\n") for ln in f if ln.strip()]


def class_tokens(run, prompts):
    """Layer-LAYER residuals of every prompt token except BOS, stacked over prompts."""
    return torch.cat([run(prompt_ids(p))[1][1:] for p in prompts])


def mood_score(text, vocab):
    happy, sad = corpus.mood_words()
    ws = corpus._words(text)[:-1]  # the last word may be cut off mid-way
    h = sum(w in happy for w in ws)
    s = sum(w in sad for w in ws)
    ok = sum(w in vocab for w in ws) / max(1, len(ws))
    return h, s, ok


def analyse(args, weights, summary):
    torch.set_num_threads(min(16, os.cpu_count() or 1))
    plain = load_f32(PlainLlama(), weights)
    demo = read_lines("prompts_demo.txt")
    happy_p = read_lines("prompts_happy.txt")
    sad_p = read_lines("prompts_sad.txt")
    model, kind = plain, "plain"
    if not args.plain:
        # The HF model must be the textbook Llama: compare with PlainLlama on the demo prompts
        # (and on a long run of random ids, which exercises RoPE at far positions).
        try:
            hf = load_f32(hf_model("eager"), weights)
            g = torch.Generator().manual_seed(0)
            worst = 0.0
            for ids in [prompt_ids(p) for p in demo] + [[BOS] + torch.randint(0, 256, (300,), generator=g).tolist()]:
                x = torch.tensor([ids])
                with torch.no_grad():
                    a = hf(input_ids=x, use_cache=False).logits[0].float()
                    b = plain(input_ids=x).logits[0]
                worst = max(worst, (a - b).abs().max().item())
            log(f"HF eager ({getattr(hf.config, '_attn_implementation', '?')}) vs PlainLlama: max |logit difference| {worst:.2e}")
            if worst < 1e-3:
                model, kind = hf, "hf-eager"
            else:
                log("WARNING: HF and PlainLlama disagree; reference outputs use PlainLlama")
        except Exception as e:
            log(f"WARNING: HF model unusable for analysis ({e!r}); reference outputs use PlainLlama")
    log(f"analysis model: {kind}")
    run = Runner(model)

    # Difference of means at layer LAYER, resid_post.
    th, ts = class_tokens(run, happy_p), class_tokens(run, sad_p)
    mh, ms = th.mean(0), ts.mean(0)
    happy_dir = mh - ms
    norm = happy_dir.norm().item()
    u = happy_dir / norm
    gap = (mh @ u - ms @ u).item()  # equals |happy_dir|
    mid = ((mh @ u + ms @ u) / 2).item()
    k = 4.0 / gap
    w, b = u * k, torch.tensor([-mid * k])
    resid_norm = th.norm(dim=-1).mean().item()
    log(f"happy_dir: |d| {norm:.4f}, mean token residual norm {resid_norm:.3f}; "
        f"probe k {k:.4f}, bias {b.item():.4f}")

    def probe(resid):
        return torch.sigmoid(resid @ w + b)

    # Probe sanity: per-prompt mean score on the derivation prompts and on fresh held-out pairs.
    fresh = corpus.prompt_pairs(args.seed + 99, 32)
    for label, hs, ss in (("derivation prompts", happy_p, sad_p),
                          ("fresh held-out prompts", [h for h, _ in fresh], [s for _, s in fresh])):
        ph = [probe(run(prompt_ids(p))[1][1:]).mean().item() for p in hs]
        ps = [probe(run(prompt_ids(p))[1][1:]).mean().item() for p in ss]
        accp = (sum(x > 0.5 for x in ph) + sum(x < 0.5 for x in ps)) / (len(ph) + len(ps))
        log(f"probe on {label}: mean happy {np.mean(ph):.3f}, mean sad {np.mean(ps):.3f}, "
            f"prompt accuracy {accp:.3f}")

    # Steering check: greedy continuations with alpha * happy_dir added at every position.
    vocab = corpus.vocabulary()
    alphas = [1.0, 2.0, 4.0, 8.0, 16.0, -1.0, -2.0, -4.0, -8.0, -16.0]
    gens = {}
    table = {}
    for a in [0.0] + alphas:
        steer = None if a == 0 else a * happy_dir
        hs = ss = 0
        oks = []
        for p in demo:
            ids = run.greedy(prompt_ids(p), args.demo_tokens, steer)
            gens[(a, p)] = ids
            txt = decode(ids)
            h, s, ok = mood_score(txt, vocab)
            hs, ss = hs + h, ss + s
            oks.append(ok)
            log(f"alpha {a:+6.1f} | {p}|{txt!r}  [happy {h} sad {s} known-words {ok:.2f}]")
        table[a] = (hs, ss, float(np.mean(oks)), min(oks))
        log(f"alpha {a:+6.1f} totals: happy words {hs}, sad words {ss}, known-word rate {np.mean(oks):.2f}")

    # Pick the smallest alpha whose continuations are clearly happier than unsteered ones and
    # still made of the corpus's words.
    base = table[0.0][0] - table[0.0][1]
    chosen = None
    for a in [x for x in alphas if x > 0]:
        hs, ss, mean_ok, min_ok = table[a]
        per_prompt_happy = all(
            mood_score(decode(gens[(a, p)]), vocab)[0] > mood_score(decode(gens[(a, p)]), vocab)[1]
            for p in demo)
        if per_prompt_happy and hs - ss > base and mean_ok >= 0.9 and min_ok >= 0.75:
            chosen = a
            break
    if chosen is None:
        ok_alphas = [x for x in alphas if x > 0 and table[x][2] >= 0.8] or [4.0]
        chosen = max(ok_alphas, key=lambda x: table[x][0] - table[x][1])
        log("no alpha met every criterion; taking the happiest readable one")
    log(f"chosen alpha {chosen}")
    for a in (chosen, -chosen):
        steer = a * happy_dir
        for p in demo:
            log(f"long alpha {a:+6.1f} | {p}|{decode(run.greedy(prompt_ids(p), args.long_tokens, steer))!r}")
    for p in demo:
        log(f"long alpha   +0.0 | {p}|{decode(run.greedy(prompt_ids(p), args.long_tokens))!r}")

    # Reference outputs.
    cases = []
    for p in demo + happy_p[:2] + sad_p[:2]:
        ids = prompt_ids(p)
        logits, resid = run(ids)
        case = {
            "prompt": p,
            "ids": ids,
            "greedy": _first(gens.get((0.0, p)), run, ids, None, args.ref_tokens),
            "last_logits": [round(x, 5) for x in logits[-1].tolist()],
            "steered": _first(gens.get((chosen, p)), run, ids, chosen * happy_dir, args.ref_tokens),
            "steered_by_alpha": {
                f"{a:g}": _first(gens.get((a, p)), run, ids, a * happy_dir, args.ref_tokens) for a in alphas},
            "probe": [round(x, 6) for x in probe(resid).tolist()],
        }
        cases.append(case)
    ref = {
        "model": "tiny",
        "evaluation": "bf16 weights in float32, eager attention, no KV cache, CPU",
        "bos": BOS,
        "eos": EOS,
        "layer": LAYER,
        "hook": "resid_post",
        "steer_alpha": chosen,
        "new_tokens": args.ref_tokens,
        "cases": cases,
    }
    vectors = {"happy_dir": happy_dir.float(), "happy_probe": w.float(), "happy_probe_bias": b.float()}
    meta = {"layer": LAYER, "hook": "resid_post", "alpha": chosen, "probe_k": round(k, 6)}
    return ref, vectors, meta


def _first(ids, run, prompt, steer, n):
    """The first n generated ids (cut after EOS); a greedy run's prefix is the shorter run."""
    if ids is None or (len(ids) < n and EOS not in ids):
        ids = run.greedy(prompt, n, steer)
    ids = ids[:n]
    return ids[: ids.index(EOS) + 1] if EOS in ids else ids


def main(argv):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--shards", type=int, default=256)
    ap.add_argument("--per-shard", type=int, default=1000)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--seconds", type=float, default=150.0, help="training time when --steps is 0")
    ap.add_argument("--steps", type=int, default=0, help="fixed step count (0: from --seconds)")
    ap.add_argument("--log-every", type=int, default=100)
    ap.add_argument("--demo-tokens", type=int, default=48)
    ap.add_argument("--ref-tokens", type=int, default=24)
    ap.add_argument("--long-tokens", type=int, default=120, help="length of the longer demo texts")
    ap.add_argument("--plain", action="store_true", help="use PlainLlama instead of HF throughout")
    ap.add_argument("--weights", help="skip training; analyse this model.safetensors")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes, to test the script on a CPU")
    args = ap.parse_args(argv)
    if args.smoke:
        args.shards, args.per_shard, args.batch = 2, 200, 4
        args.steps = args.steps or 30
        args.log_every, args.warmup = 10, 5
        args.demo_tokens, args.long_tokens = 12, 8
    os.makedirs(args.out, exist_ok=True)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    log(f"torch {torch.__version__}, device {dev}, args {vars(args)}")
    try:
        import transformers

        log(f"transformers {transformers.__version__}")
    except ImportError:
        pass

    wpath = os.path.join(args.out, "model.safetensors")
    if args.weights:
        # Analysis only, on weights from an earlier run.
        summary = {"model_kind": "plain" if args.plain else "hf", "weights_from": args.weights}
        save_safetensors(wpath, load_safetensors(args.weights), {"format": "pt"})
    else:
        model, summary = train(args, dev)
        weights = {k: v.detach().to("cpu", torch.bfloat16).contiguous()
                   for k, v in model.state_dict().items() if k.startswith("model.")}
        del model
        save_safetensors(wpath, weights, {"format": "pt"})
    size = os.path.getsize(wpath)
    log(f"model.safetensors: {len(weights)} tensors, {size} bytes")
    if size >= 20 * 2**20:
        raise RuntimeError(f"model.safetensors is {size} bytes, over 20 MiB")
    weights = load_safetensors(wpath)
    try:
        from safetensors.torch import load_file

        other = load_file(wpath)
        assert other.keys() == weights.keys() and all(torch.equal(other[k], weights[k]) for k in other)
        log("safetensors library reads model.safetensors identically")
    except ImportError:
        log("safetensors library not installed; skipped its cross-check")
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(CONFIG, f, indent=2)
        f.write("\n")

    ref, vectors, meta = analyse(args, weights, summary)
    save_safetensors(os.path.join(args.out, "vectors.safetensors"), vectors, meta)
    ref["training"] = summary
    with open(os.path.join(args.out, "reference.json"), "w") as f:
        json.dump(ref, f, indent=1)
        f.write("\n")
    log("done")


if __name__ == "__main__":
    main(sys.argv[1:])
