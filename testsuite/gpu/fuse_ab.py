#!/usr/bin/env python3
"""Assemble fuse_ab.sh's raw files (RAW) into OUT/fuse_ab.json and OUT/FUSE_AB.md: graph
replay ms per decode step of each variant beside the base variant's (BASE, default "none": no fusion), the
same run, per model and batch; the issue's batch-1 targets; time per node role at batch 1
(round 1, --profile); ptxas; the checks on fused bundles. Standard library only."""
import datetime
import glob
import json
import os
import re
import statistics
import sys

from assemble import load  # beside this script: run.sh's assembler

# Issue 14 item 3's targets: graph replay ms per decode step at batch 1.
TARGETS = {"llama-3.1-8b": 4.05, "llama-3.2-1b": 0.80}
# The card's measured read bandwidth (FACTS.md; xmix's MeasuredBandwidth), bytes per second.
READ_BW = 4.25e12


def text(path, default=""):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return default


BASE = os.environ.get("BASE", "none")


def graph_context():
    """Every row's context in the timed graphs (fuse_ab.sh's GRAPH_CONTEXT, else PROMPT_LEN + 64)."""
    return int(os.environ.get("GRAPH_CONTEXT") or int(os.environ.get("PROMPT_LEN", "16")) + 64)


def main(raw, out):
    res = {"base": BASE, "date": datetime.date.today().isoformat(), "device": text(os.path.join(raw, "device.txt"), "unknown"),
           "commit": text(os.path.join(raw, "commit.txt"), "unknown"), "prompt_len": int(os.environ.get("PROMPT_LEN", "16")),
           "graph_context": graph_context(), "gemm": os.environ.get("BENCH_GEMM", "auto")}
    runs = {}  # (model, batch, variant) -> [ms per round]
    profile, role_costs, attention = {}, {}, []
    for p in sorted(glob.glob(os.path.join(raw, "bench__*.json"))):
        m = re.match(r"bench__(.+)__(.+)__b(\d+)__r(\d+)\.json$", os.path.basename(p))
        d = load(p)
        if not m or not d:
            continue
        model, variant, bs = m.group(1), m.group(2), int(m.group(3))
        g = list((d.get("graph_ms") or {}).values())
        if g:
            runs.setdefault((model, bs, variant), []).append(g[0])
        prof = next(iter((d.get("profile_ms") or {}).values()), None)
        if prof:
            profile.setdefault(model, {}).setdefault(str(bs), {})[variant] = prof
        costs = next(iter((d.get("role_cost_ms") or {}).values()), None)
        if costs:
            role_costs.setdefault(model, {}).setdefault(str(bs), {})[variant] = costs
            off = d.get("offline") or {}
            # The bench's KV bytes are at its mean context; per position they scale to the
            # graph's context, the same for every row.
            positions = off.get("prompts", 0) * (off.get("prompt_len", 0) + 1 + off.get("new_tokens", 0) // 2)
            if positions and "attention" in costs:
                ctx = graph_context()
                floor = off["kv_bytes_per_step"] / positions * bs * ctx / READ_BW * 1e3
                attention.append({"model": model, "batch": bs, "variant": variant, "context": ctx,
                                  "attention_ms": costs["attention"], "kv_floor_ms": floor, "ratio": costs["attention"] / floor})
    res["graph"] = [{"model": k[0], "batch": k[1], "variant": k[2], "rounds_ms": v, "mean_ms": statistics.mean(v)}
                    for k, v in sorted(runs.items())]
    ab = []
    for (model, bs, variant), v in sorted(runs.items()):
        base = runs.get((model, bs, BASE))
        if variant == BASE or not base:
            continue
        b, f = statistics.mean(base), statistics.mean(v)
        ab.append({"model": model, "batch": bs, "variant": variant, "base_ms": b, "variant_ms": f,
                   "ratio": f / b, "saved_ms": b - f})
    res["ab"] = ab
    res["profile_ms"] = profile
    res["role_cost_ms"] = role_costs
    res["attention_in_graph"] = attention
    res["targets"] = []
    for r in ab:
        if r["batch"] == 1 and r["model"] in TARGETS:
            t = TARGETS[r["model"]]
            res["targets"].append({"model": r["model"], "variant": r["variant"], "target_ms": t, "ms": r["variant_ms"], "met": r["variant_ms"] <= t})

    lines = text(os.path.join(raw, "ptxas.txt")).splitlines()
    fails = [l for l in lines if l.startswith("FAIL")]
    spills = [l for l in lines if l.startswith("ok") and "spill_stores=0" not in l]
    res["ptxas"] = {"kernels": len(lines), "ok": len(lines) - len(fails), "failed": fails, "spilling": spills}
    log = text(os.path.join(raw, "checks.log"))
    res["checks"] = load(os.path.join(raw, "checks.json")) or {}
    res["checks_tests"] = {m.group(2): m.group(1) for m in re.finditer(r"--- (PASS|FAIL|SKIP): (\S+)", log)}

    with open(os.path.join(out, "fuse_ab.json"), "w") as f:
        json.dump(res, f, indent=1)
    with open(os.path.join(out, "FUSE_AB.md"), "w") as f:
        f.write(markdown(res))


def role_table(title, by_variant, base):
    """A table of ms per role (rows, largest first) and variant (columns, the base first)."""
    variants = sorted(by_variant, key=lambda v: (v != base, v))
    roles = sorted({k for v in by_variant.values() for k in v}, key=lambda k: -max(v.get(k, 0) for v in by_variant.values()))
    md = ["", title, "", "| role | " + " | ".join(variants) + " |", "|---|" + "---|" * len(variants)]
    for k in roles:
        md.append(f"| {k} | " + " | ".join(f"{by_variant[v].get(k, 0):.3f}" for v in variants) + " |")
    return md


def markdown(res):
    md = [f"# Decode fusions A/B ({res['date']}, {res['device']}, commit {res['commit']})", "",
          f"Graph replay ms per decode step, every row at context {res['graph_context']} ({res['prompt_len']}-token prompts), each variant and the base ({res['base']}) in this run "
          "(mean of the rounds; ratio < 1: the variant is faster).", "",
          "| model | batch | variant | base ms | variant ms | ratio | saved ms | rounds (variant) |", "|---|---|---|---|---|---|---|---|"]
    for r in res["ab"]:
        rounds = next((g["rounds_ms"] for g in res["graph"] if (g["model"], g["batch"], g["variant"]) == (r["model"], r["batch"], r["variant"])), [])
        md.append(f"| {r['model']} | {r['batch']} | {r['variant']} | {r['base_ms']:.3f} | {r['variant_ms']:.3f} | {r['ratio']:.3f} | "
                  f"{r['saved_ms']:.3f} | {' '.join(f'{x:.3f}' for x in rounds)} |")
    md.append("")
    for t in res["targets"]:
        md.append(f"- target {t['model']} b1 <= {t['target_ms']} ms: {t['variant']} {t['ms']:.3f} ms, {'met' if t['met'] else 'not met'}")
    for model, by in sorted(res["profile_ms"].items()):
        if by.get("1"):
            md += role_table(f"Time per node role, {model} batch 1 (nodes launched one by one, ms):", by["1"], res["base"])
    for model, by in sorted(res["role_cost_ms"].items()):
        for bs, costs in sorted(by.items(), key=lambda kv: int(kv[0])):
            md += role_table(f"What each node role costs inside the graph, {model} batch {bs} (xmix bench --role-costs: "
                             "the graph's time less its time without the role, ms):", costs, res["base"])
    if res["attention_in_graph"]:
        md += ["", f"Decode attention inside the graph (--role-costs) against its KV-read floor at {READ_BW / 1e12:.2f} TB/s (issue 14 item 1):", "",
               "| model | batch | variant | context | attention ms | KV floor ms | ratio |", "|---|---|---|---|---|---|---|"]
        for a in sorted(res["attention_in_graph"], key=lambda a: (a["model"], a["batch"], a["variant"])):
            md.append(f"| {a['model']} | {a['batch']} | {a['variant']} | {a['context']} | {a['attention_ms']:.3f} | {a['kv_floor_ms']:.3f} | {a['ratio']:.2f} |")
    p = res["ptxas"]
    md += ["", f"ptxas: {p['ok']} of {p['kernels']} kernels of the variants' bundles assemble, {len(p['failed'])} fail, {len(p['spilling'])} spill."]
    tests = res["checks_tests"]
    failed = sorted(k for k, v in tests.items() if v == "FAIL")
    md.append(f"Checks on the XMIX_FUSE/XMIX_PREFETCH bundles: {sum(v == 'PASS' for v in tests.values())} tests pass, {len(failed)} fail{': ' + ', '.join(failed) if failed else ''}.")
    for k, v in sorted(res["checks"].items()):
        if k.startswith(("agreement.", "build_bits.")):
            md.append(f"- {k}: {json.dumps(v)}")
    return "\n".join(md) + "\n"


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
