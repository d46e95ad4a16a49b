#!/usr/bin/env python3
"""Assemble the GPU run's raw outputs (run.sh's work directory) into results.json and a
readable RESULTS.md. Standard library only: it runs on the GPU machine."""
import datetime
import glob
import json
import os
import re
import sys


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def main(work, out):
    device = open(os.path.join(work, "device.txt")).read().strip() if os.path.exists(os.path.join(work, "device.txt")) else "unknown"
    res = {"date": datetime.date.today().isoformat(), "device": device}

    lines = open(os.path.join(work, "ptxas.txt")).read().splitlines() if os.path.exists(os.path.join(work, "ptxas.txt")) else []
    fails = [l for l in lines if l.startswith("FAIL")]
    spills = [l for l in lines if l.startswith("ok") and "spill_stores=0" not in l]
    res["ptxas"] = {"kernels": len(lines), "ok": len(lines) - len(fails), "failed": fails, "spilling": spills}

    checks = load(os.path.join(work, "checks.json")) or {}
    log = open(os.path.join(work, "checks.log")).read() if os.path.exists(os.path.join(work, "checks.log")) else ""
    res["checks"] = checks
    res["checks_tests"] = {m.group(2): m.group(1) for m in re.finditer(r"--- (PASS|FAIL|SKIP): (\S+)", log)}

    bench = {}
    for p in sorted(glob.glob(os.path.join(work, "bench-*.json"))):
        d = load(p)
        if not d:
            continue
        m = re.match(r"bench-(.*)-b(\d+)\.json", os.path.basename(p))
        model, bs = m.group(1), int(m.group(2))
        off = d.get("offline", {})
        graph = list((d.get("graph_ms") or {}).values())
        g = graph[0] if graph else None
        row = {
            "batch": bs,
            "decode_step_ms": off.get("decode_step_ms"),
            "graph_replay_ms": g,
            "decode_tok_per_s": off.get("decode_tok_per_s"),
            "generated_tok_per_s": off.get("generated_tok_per_s"),
            "floor_ms": off.get("floor_ms"),
            "pct_of_floor_step": off.get("pct_of_floor"),
            "pct_of_floor_graph": (100 * off["floor_ms"] / g) if g and off.get("floor_ms") else None,
            "prompt_len": off.get("prompt_len"),
            "prefill_s": off.get("prefill_seconds"),
            "new_tokens": off.get("new_tokens"),
            "profile_ms": next(iter((d.get("profile_ms") or {}).values()), None),
        }
        bench.setdefault(model, []).append(row)
    for v in bench.values():
        v.sort(key=lambda r: r["batch"])
    res["decode"] = bench

    ttft = {}
    for p in glob.glob(os.path.join(work, "ttft-*.txt")):
        model = os.path.basename(p)[5:-4]
        try:
            ttft[model] = float(open(p).read().strip().splitlines()[-1])
        except (OSError, ValueError, IndexError):
            pass
    res["run_to_first_token_s"] = ttft

    res["peer"] = peer_rows(work)
    res["read_rate"] = load(os.path.join(work, "read_rate.json"))
    res["prefill"] = prefill_rows(work)
    res["ab"] = ab_rows(work)
    res["ab_online"] = {v: (load(os.path.join(work, f"ab-online-{v}.json")) or {}).get("online") for v in ("old", "new")}
    budget = {}
    for p in glob.glob(os.path.join(work, "budget-*.json")):
        d = load(p)
        if d and d.get("online"):
            budget[os.path.basename(p)[7:-5]] = d["online"]["mean"]
    if budget and res["ab_online"].get("new"):
        budget.setdefault("spec", res["ab_online"]["new"]["mean"])
    res["online_token_budget"] = budget

    online = {}
    for p in glob.glob(os.path.join(work, "online-*.json")):
        d = load(p)
        if d:
            online[os.path.basename(p)[7:-5]] = d.get("online")
    res["online"] = online
    res["transformers_comparison"] = load(os.path.join(work, "hf_compare.json"))
    res["gemma2_comparison"] = load(os.path.join(work, "gemma2_compare.json"))

    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(res, f, indent=2, sort_keys=True)
    with open(os.path.join(out, "RESULTS.md"), "w") as f:
        f.write(markdown(res))


def graph_ms(d):
    """The one timed decode bucket's graph replay ms and its attention's ms (profile) of a
    `xmix bench --graph-buckets B --profile --json` result."""
    if not d:
        return None, None
    g = list((d.get("graph_ms") or {}).values())
    prof = next(iter((d.get("profile_ms") or {}).values()), None) or {}
    return (g[0] if g else None), prof.get("attention")


def graph_floor_ms(d):
    """The one timed decode bucket's floor at --graph-context (graph_floor_ms: its weights once
    and every row's K and V at that context, read at xmix bench's MeasuredBandwidth)."""
    f = list(((d or {}).get("graph_floor_ms") or {}).values())
    return f[0] if f else None


# TARGET is issue 14's ratio to the peer; a shape where TARGET x PyTorch is under the floor
# cannot reach it (needs more than 100% of the read rate).
TARGET = 0.83
# BENCH_RATE is the read rate xmix bench's floors assume (cmd/xmix's MeasuredBandwidth, the
# H200's); run.sh measures the card's own (read_rate.py), and the peer rows' floors use that.
BENCH_RATE = 4.2e12


def read_rate(work):
    """The card's measured read rate in bytes/s (read_rate.json), or BENCH_RATE."""
    return (load(os.path.join(work, "read_rate.json")) or {}).get("read_bytes_per_s") or BENCH_RATE


def peer_rows(work):
    """run.sh's peer part: xmix bench (peer-MODEL-pP-bB.json) and torch_decode.py
    (torch-MODEL.json, keys MODEL.pP.bB) on the same shapes; floors at the card's read rate."""
    scale = BENCH_RATE / read_rate(work)
    rows = []
    for p in sorted(glob.glob(os.path.join(work, "peer-*.json"))):
        m = re.match(r"peer-(.*)-p(\d+)-b(\d+)\.json", os.path.basename(p))
        if not m:
            continue
        model, plen, bs = m.group(1), int(m.group(2)), int(m.group(3))
        d = load(p)
        xmix, attn = graph_ms(d)
        floor = graph_floor_ms(d)
        floor = floor * scale if floor else None
        torch = (load(os.path.join(work, f"torch-{model}.json")) or {}).get(f"{model}.p{plen}.b{bs}", {}).get("ms_step")
        rows.append({"model": model, "prompt_len": plen, "batch": bs, "xmix_ms": xmix, "torch_ms": torch,
                     "ratio": (xmix / torch) if xmix and torch else None, "xmix_attention_ms": attn, "floor_ms": floor,
                     "target_pct_of_floor_rate": (100 * floor / (TARGET * torch)) if floor and torch else None})
    rows.sort(key=lambda r: (r["model"], r["prompt_len"], r["batch"]))
    return rows


def prefill_rows(work):
    """run.sh's prefill part: per lone prompt, the host-timed run (one prefill, one token) and
    each prefill template's profile (GEMM TFLOP/s, share of the bf16 peak, time by role)."""
    rows = []
    for p in sorted(glob.glob(os.path.join(work, "prefill-*.json"))):
        d = load(p)
        m = re.match(r"prefill-(.*)-p(\d+)\.json", os.path.basename(p))
        if not d or not m:
            continue
        off = d.get("offline", {})
        for name, prof in sorted((off.get("prefill_profile") or {}).items(), key=lambda kv: -kv[1].get("tokens", 0)):
            rows.append({"model": m.group(1), "prompt_len": int(m.group(2)), "first_token_ms": 1000 * off.get("seconds", float("nan")),
                         "template": name, **prof})
    return rows


def ab_rows(work):
    """run.sh's A/B of this build against OLD_BIN (ab-old|new-pP-bB.json)."""
    rows = {}
    for p in glob.glob(os.path.join(work, "ab-*.json")):
        m = re.match(r"ab-(old|new)-p(\d+)-b(\d+)\.json", os.path.basename(p))
        if not m:
            continue
        g, attn = graph_ms(load(p))
        r = rows.setdefault((int(m.group(2)), int(m.group(3))), {"model": "llama-3.1-8b", "prompt_len": int(m.group(2)), "batch": int(m.group(3))})
        r[m.group(1) + "_ms"], r[m.group(1) + "_attention_ms"] = g, attn
    return [rows[k] for k in sorted(rows)]


def fmt(x, spec=".3f"):
    return "-" if x is None else format(x, spec)


def pct(x):
    return "-" if x is None else f"{x:.0f}%"


def markdown(r):
    s = [f"# GPU results\n\n{r['date']}, {r['device']}. Produced by `testsuite/gpu/run.sh`; raw data in results.json.\n"]
    for line in r.get("provenance", []):
        s.append(f"- {line}\n")
    p = r["ptxas"]
    s.append(f"## ptxas -arch=sm_90\n\n{p['ok']} of {p['kernels']} kernels assemble; {len(p['failed'])} fail; {len(p['spilling'])} spill.\n")
    for l in p["failed"]:
        s.append(f"- {l}\n")
    s.append("\n## Correctness (CUDA backend)\n\n| check | result |\n|---|---|\n")
    for k, v in sorted(r["checks"].items()):
        if k == "device":
            continue
        s.append(f"| {k} | {json.dumps(v, sort_keys=True)} |\n")
    for k, v in sorted(r["checks_tests"].items()):
        s.append(f"| test {k} | {v} |\n")
    s.append("\n## Decode (offline: batch prompts, see results.json for prompt and output lengths)\n\n")
    s.append("Floor = bytes a step must read (weights + KV cache at the mean context) / 4.2 TB/s. "
             "Step = host-measured engine step (control upload, graph replay, readback); graph = bare replays timed with CUDA events.\n\n")
    s.append("Prefill s = the whole batch's prompts (batch x prompt tokens), chunk by chunk.\n\n")
    s.append("| model | batch | prompt tokens | prefill s | step ms | graph ms | floor ms | % of floor (graph) | % of floor (step) | decode tok/s |\n"
             "|---|---|---|---|---|---|---|---|---|---|\n")
    for model, rows in sorted(r["decode"].items()):
        for x in rows:
            s.append(f"| {model} | {x['batch']} | {x.get('prompt_len', '-')} | {fmt(x.get('prefill_s'))} | {fmt(x['decode_step_ms'])} | "
                     f"{fmt(x['graph_replay_ms'])} | {fmt(x['floor_ms'])} | "
                     f"{fmt(x['pct_of_floor_graph'], '.1f')} | {fmt(x['pct_of_floor_step'], '.1f')} | {fmt(x['decode_tok_per_s'], '.0f')} |\n")
    servers = {}
    for model, rows in r["decode"].items():
        base = model.split("+")[0].replace("-staged", "")
        server = {"": "cuBLASLt (auto)", "+ptx": "PTX mma.sync"}.get(model[len(model.split("+")[0]):], model)
        if "-staged" in model:
            server = "PTX staged split-K"
        for x in rows:
            servers.setdefault(base, {}).setdefault(x["batch"], {})[server] = x["graph_replay_ms"]
    if any(len(c) > 1 for b in servers.values() for c in b.values()):
        s.append("\n## GEMM servers side by side (graph replay ms per decode step; batch 1 always runs the CUDA-core GEMV)\n\n")
        names = sorted({n for b in servers.values() for c in b.values() for n in c})
        s.append("| model | batch | " + " | ".join(names) + " |\n|---|---|" + "---|" * len(names) + "\n")
        for base, by in sorted(servers.items()):
            for bs, c in sorted(by.items()):
                s.append(f"| {base} | {bs} | " + " | ".join(fmt(c.get(n)) for n in names) + " |\n")
    s.append("\n## Where a decode step's time goes (nodes launched one by one, summed by role, ms)\n\n")
    for model, rows in sorted(r["decode"].items()):
        for x in rows:
            prof = x.get("profile_ms")
            if prof:
                parts = ", ".join(f"{k} {v:.3f}" for k, v in sorted(prof.items(), key=lambda kv: -kv[1]))
                s.append(f"- {model} batch {x['batch']}: {parts}\n")
    if r.get("peer"):
        s.append("\n## Against the compiled PyTorch step (testsuite/gpu/torch_decode.py), same run, same shapes\n\n")
        rr = r.get("read_rate") or {}
        rate = (f"this card's read rate, {rr['read_bytes_per_s'] / 1e12:.2f} TB/s ({rr['bytes'] >> 30} GiB of bf16 summed, "
                "testsuite/gpu/read_rate.py)") if rr.get("read_bytes_per_s") else f"{BENCH_RATE / 1e12:.1f} TB/s"
        s.append("Graph replay ms per decode step: xmix with every row of the batch at context prompt + 64 (`--graph-context`), "
                 "the best of three rounds of 50 replays (`--graph-rounds 3`), "
                 "PyTorch the best of three rounds of 64 steps from the prompt on (its attention reads the prompt + 72 positions of "
                 "its static cache). Ratio = xmix / PyTorch (< 1: xmix faster). xmix attention = the attention nodes' time, "
                 "launched one by one (`--profile`, launch gaps included). Floor = the bytes xmix's graph must read (the weights "
                 f"once, every row's K and V at its context) at {rate}; 0.83x needs = the share of that read rate a step of 0.83 x "
                 "PyTorch's time would run at (over 100%: below the floor, out of reach).\n\n")
        s.append("| model | prompt tokens | batch | xmix ms | PyTorch ms | ratio | xmix attention ms | floor ms | 0.83x needs |\n"
                 "|---|---|---|---|---|---|---|---|---|\n")
        for x in r["peer"]:
            s.append(f"| {x['model']} | {x['prompt_len']} | {x['batch']} | {fmt(x['xmix_ms'])} | {fmt(x['torch_ms'])} | "
                     f"{fmt(x['ratio'], '.2f')} | {fmt(x['xmix_attention_ms'])} | {fmt(x.get('floor_ms'))} | "
                     f"{pct(x.get('target_pct_of_floor_rate'))} |\n")
    if r.get("prefill"):
        s.append("\n## A lone prompt: first token and prefill GEMMs (Llama-3.1-8B)\n\n")
        s.append("First token ms = the offline bench's one request, one generated token, host-timed after a warm-up request. "
                 "The prefill templates of the warm-up request, nodes launched one by one: step ms (their sum), the tensor-core "
                 "GEMMs' ms and rate (2*M*N*K over every row of the template), and that rate as a share of the measured 770 TFLOP/s.\n\n")
        s.append("| prompt tokens | first token ms | template | step ms | GEMM ms | GEMM TFLOP/s | % of peak | attention ms |\n|---|---|---|---|---|---|---|---|\n")
        for x in r["prefill"]:
            s.append(f"| {x['prompt_len']} | {fmt(x['first_token_ms'], '.1f')} | {x['template']} | {fmt(x.get('step_ms'))} | {fmt(x.get('gemm_ms'))} | "
                     f"{fmt(x.get('gemm_tflop_per_s'), '.0f')} | {fmt(x.get('gemm_pct_of_peak'), '.0f')} | {fmt((x.get('roles_ms') or {}).get('attention'))} |\n")
    if r.get("ab"):
        s.append("\n## This build against the previous one (OLD_BIN), same run, graph replay ms per decode step\n\n")
        s.append("Both builds time the bucket as their last step left it: compare them with each other, not with the peer grid "
                 "(whose rows are all at the full context).\n\n")
        s.append("| model | prompt tokens | batch | before ms | after ms | attention before ms | attention after ms |\n|---|---|---|---|---|---|---|\n")
        for x in r["ab"]:
            s.append(f"| {x['model']} | {x['prompt_len']} | {x['batch']} | {fmt(x.get('old_ms'))} | {fmt(x.get('new_ms'))} | "
                     f"{fmt(x.get('old_attention_ms'))} | {fmt(x.get('new_attention_ms'))} |\n")
    abo = r.get("ab_online") or {}
    if abo.get("old") and abo.get("new"):
        s.append("\n## The paper's online workload on both builds (Llama-3.1-8B, every request at once), same run\n\n")
        s.append("| build | mean ITL ms | P99 ITL ms | mean TTFT ms | total tok/s |\n|---|---|---|---|---|\n")
        for v in ("old", "new"):
            m = abo[v]["mean"]
            s.append(f"| {'before' if v == 'old' else 'after'} | {m['mean_itl_ms']:.2f} | {m['p99_itl_ms']:.2f} | {m['mean_ttft_ms']:.1f} | {m['total_tok_per_s']:.0f} |\n")
    if r.get("online_token_budget"):
        s.append("\n## The same workload at other token budgets per step (this build, `--max-batched-tokens`, same run)\n\n")
        s.append("| budget | mean ITL ms | P99 ITL ms | mean TTFT ms | total tok/s |\n|---|---|---|---|---|\n")
        for k, m in sorted(r["online_token_budget"].items(), key=lambda kv: int(kv[0]) if kv[0].isdigit() else 0):
            s.append(f"| {k} | {m['mean_itl_ms']:.2f} | {m['p99_itl_ms']:.2f} | {m['mean_ttft_ms']:.1f} | {m['total_tok_per_s']:.0f} |\n")
    s.append("\n## `xmix run` start to first token (load, instantiate graphs, one token)\n\n")
    for k, v in sorted(r["run_to_first_token_s"].items()):
        s.append(f"- {k}: {v:.2f} s\n")
    if r.get("transformers_comparison"):
        s.append("\n## Against Hugging Face transformers (same checkpoint, same tokens)\n\n")
        for k, v in sorted(r["transformers_comparison"].items()):
            if isinstance(v, dict):
                s.append(f"- {k}: {json.dumps(v, sort_keys=True)}\n")
    if r.get("gemma2_comparison"):
        g = r["gemma2_comparison"]
        s.append(f"\n## Gemma 2 against transformers (fp32, same bf16 weights; bound {g.get('bound')}): "
                 f"{'pass' if g.get('pass') else 'FAIL'}\n\n")
        for cut, v in sorted(g.items()):
            if not isinstance(v, dict):
                continue
            for run, c in sorted(v.items()):
                if isinstance(c, dict):
                    s.append(f"- {cut} {run}: logits {c.get('max_logits_rel_err', float('nan')):.3g}, "
                             f"hidden {c.get('max_hidden_rel_err', float('nan')):.3g}, "
                             f"top-1 mismatches {len(c.get('top1_mismatches', []))} (ties {len(c.get('top1_ties', []))})"
                             f"{'' if c.get('pass') else ' FAIL ' + c.get('error', '')}\n")
    s.append("\n## Online (Poisson arrivals, ShareGPT-like prompts, 128 output tokens)\n\n")
    for k, v in sorted(r["online"].items()):
        if not v:
            continue
        m = v["mean"]
        s.append(f"- {k}: {v['requests']} requests at {v['rate']}/s, {len(v['runs'])} measured runs after {v['warmup_runs']} warm-up: "
                 f"mean ITL {m['mean_itl_ms']:.3f} ms, P99 ITL {m['p99_itl_ms']:.3f} ms, mean TTFT {m['mean_ttft_ms']:.2f} ms, "
                 f"total throughput {m['total_tok_per_s']:.0f} tok/s\n")
    return "".join(s)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
