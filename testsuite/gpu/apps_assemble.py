#!/usr/bin/env python3
"""The two bits of arithmetic of testsuite/gpu/apps.sh. Standard library only: it runs on the
GPU machine.

  apps_assemble.py plan WORK --left S ... GROUP:VARIANTS:RATE:PROBE_REQUESTS...
      From each model's online probe run, how many requests every online run gets so that all
      rounds fit in the S seconds left; prints shell assignments, notes what it cut on stderr.
  apps_assemble.py assemble WORK OUT
      WORK's raw bench outputs -> OUT/apps.json (raw + ratios) and OUT/APPS.md (tables).
  apps_assemble.py merge WORK OUT RAW:PHASES...
      One table from several device calls: each RAW (an apps.sh raw.tgz) gives the runs of
      the named PHASES (comma-separated: offline, grid, online); they are gathered in WORK and
      assembled into OUT. Every ratio still pairs runs of one call: a model's phase comes
      from one RAW.
"""
import argparse
import datetime
import glob
import json
import os
import re
import shutil
import sys
import tarfile

from assemble import load  # run.sh's assembler, beside this file

# Targets of issue 4: an app enabled on every request costs at most 1% in mean ITL and in
# throughput; all apps deployed but unused at most 0.3%.
APP_TARGET = 0.01
DEPLOYED_TARGET = 0.003
# Seconds kept back from the budget for assembling the results.
RESERVE_S = 10

GROUP_TITLES = {"l8": "Llama-3.1-8B, apps 1-6", "mx": "Mixtral-8x7B, app 7"}
# The nnsight comparison grid's rows (FACTS.md) that specs/apps/grid/ expresses.
GRID_ROWS = {
    "bare": "no-app bundle (generate)",
    "deployed": "every grid app deployed, none enabled",
    "grid-capture-l16": "capture 1 layer every step",
    "grid-capture-all": "capture every layer every step",
    "grid-steer-l16": "additive steering 1 layer",
    "grid-lens-l16": "logit lens every step (layer 16)",
    "grid-lens-all": "logit lens every step (every layer)",
    "grid-probe-l16": "linear probe every step",
    "grid-head-ablate": "zero one attention head every step",
    "grid-token-override": "override the sampled token every step",
}


def read_lines(path):
    try:
        with open(path) as f:
            return [l.rstrip("\n") for l in f if l.strip()]
    except OSError:
        return []


def walls(work):
    """Wall seconds of each bench invocation, from runs.tsv (id, exit status, seconds)."""
    out = {}
    for l in read_lines(os.path.join(work, "runs.tsv")):
        f = l.split("\t")
        if len(f) == 3:
            out[f[0]] = {"exit": int(f[1]), "wall_s": float(f[2])}
    return out


# ---- plan ----------------------------------------------------------------------------------

def probe_model(work, group, output_len, probe_requests, rate, wall):
    """A run's cost model from the probe, whose requests all arrive at once: the engine then
    serves capacity = requests / seconds per second, and a run of N requests at the planned
    rate takes load + N / min(rate, capacity) + tail seconds (N / capacity at rate 0, all at once), tail being the last request's
    own latency (its share of the probe's service time, then output_len - 1 loaded ITLs). At
    the probe's small concurrency the engine batches less than in a long run, so this errs
    towards fewer requests."""
    d = load(os.path.join(work, "r", f"probe-{group}.json"))
    r = (d or {}).get("online", {}).get("runs") or []
    if not r or r[0]["seconds"] <= 0:
        return None
    r = r[0]
    s = r["seconds"]
    capacity = probe_requests / s
    return {"load_s": max(0.0, wall - s), "tail_s": s / probe_requests + (output_len - 1) * r["mean_itl_ms"] / 1000,
            "per_request_s": 1 / (min(rate, capacity) if rate > 0 else capacity), "capacity_req_per_s": capacity, "probe_s": s}


def fit(avail, rounds, groups, models, cap):
    """Requests per run of each group when every variant gets the same arrival window."""
    if rounds == 0:
        return {g: 0 for g in groups}
    nv = sum(n for n, _ in groups.values())
    fixed = sum(n * (models[g]["load_s"] + models[g]["tail_s"]) for g, (n, _) in groups.items())
    window = (avail / rounds - fixed) / nv
    return {g: max(0, min(cap, int(window / models[g]["per_request_s"]))) for g in groups}


def plan(a):
    work = a.work
    w = walls(work)
    groups, models = {}, {}
    for spec in a.groups:
        g, n, rate, probe = spec.split(":")
        m = probe_model(work, g, a.output_len, int(probe), float(rate), w.get(f"probe-{g}", {}).get("wall_s", 0))
        if m is None:
            print(f"online {g}: no probe result, its online runs are skipped", file=sys.stderr)
            continue
        groups[g], models[g] = (int(n), float(rate)), m
        if float(rate) == 0:
            print(f"online {g}: every request arrives at once (vLLM's bench at request rate inf); "
                  f"the probe served about {m['capacity_req_per_s']:.2f} requests/s", file=sys.stderr)
        elif m["capacity_req_per_s"] < float(rate):
            print(f"online {g}: the engine serves about {m['capacity_req_per_s']:.2f} requests/s (probe, all at once), "
                  f"below the rate {float(rate):g}/s: runs are saturated, queueing inflates TTFT", file=sys.stderr)
    avail = a.left - RESERVE_S
    warm, runs = a.warmup, a.runs
    while True:
        n = fit(avail, warm + runs, groups, models, a.requests)
        short = [g for g in groups if n[g] < a.min_requests]
        if not short:
            break
        if warm > 0:
            warm -= 1
            print(f"online: {warm + 1} -> {warm} warm-up rounds (budget: {a.left}s left)", file=sys.stderr)
        elif runs > 1:
            runs -= 1
            print(f"online: {runs + 1} -> {runs} measured rounds (budget: {a.left}s left)", file=sys.stderr)
        elif "mx" in groups and len(groups) > 1:
            del groups["mx"]
            print("online mx: skipped, Mixtral's runs do not fit the budget beside Llama's", file=sys.stderr)
        else:
            for g in short:
                n[g] = a.min_requests
            print(f"online {','.join(short)}: not even {a.min_requests} requests fit; running "
                  f"{a.min_requests}, rounds that would overrun the budget are skipped", file=sys.stderr)
            break
    out = {"left_s": a.left, "warmup_rounds": warm, "run_rounds": runs, "groups": {}}
    round_s = 0.0
    for g, (nv, rate) in groups.items():
        m = models[g]
        run_s = m["load_s"] + m["tail_s"] + m["per_request_s"] * n[g]
        round_s += nv * run_s
        out["groups"][g] = dict(m, requests=n[g], rate=rate, variants=nv, run_s=run_s)
        if n[g] < a.requests:
            print(f"online {g}: {n[g]} requests per run instead of {a.requests} (each run about {run_s:.0f}s, "
                  f"{nv} variants x {warm + runs} rounds in {a.left}s)", file=sys.stderr)
        print(f"N_{g}={n[g]}\nRUN_S_{g}={run_s:.1f}")
    out["round_s"] = round_s
    print(f"WARMUP_ROUNDS={warm}\nRUN_ROUNDS={runs}\nROUND_S={round_s:.0f}")
    with open(os.path.join(work, "plan.json"), "w") as f:
        json.dump(out, f, indent=2)


# ---- assemble ------------------------------------------------------------------------------

def variants(work):
    out = []
    for l in read_lines(os.path.join(work, "variants.tsv")):
        f = l.split("\t")
        out.append({"phase": f[0], "name": f[1], "group": f[2], "kind": f[3], "args": f[4] if len(f) > 4 else ""})
    return out


def graph_phase(work, vs, phase):
    """Per variant: graph replay ms per decode bucket (CUDA) or the host step ms (CPU)."""
    rows = {}
    for v in vs:
        if v["phase"] != phase:
            continue
        d = load(os.path.join(work, "r", f"{phase}-{v['name']}.json"))
        row = {"group": v["group"], "kind": v["kind"], "ms": None, "profile_ms": None, "step_ms": None}
        if d:
            g = d.get("graph_ms") or {}
            row["ms"] = {k.replace("decode_", ""): x for k, x in g.items()} or None
            row["step_ms"] = d.get("offline", {}).get("decode_step_ms")
            p = d.get("profile_ms") or {}
            row["profile_ms"] = {k.replace("decode_", ""): x for k, x in p.items()} or None
            if row["ms"] is None and row["step_ms"]:
                row["ms"] = {"step": row["step_ms"]}
        rows[v["name"]] = row
    for row in rows.values():
        base = baseline(rows, row["group"], "bare")
        row["ratio"] = ratios(row["ms"], base["ms"] if base else None)
    return rows


def baseline(rows, group, kind):
    return next((r for r in rows.values() if r["group"] == group and r["kind"] == kind), None)


def ratios(a, b):
    if not a or not b:
        return None
    return {k: a[k] / b[k] for k in a if b.get(k)}


def buckets(rows):
    ks = set()
    for r in rows.values():
        ks.update((r["ms"] or {}).keys())
    return sorted(ks, key=lambda k: (k == "step", int(k[1:]) if k[1:].isdigit() else 0))


METRICS = [("mean_itl_ms", "mean ITL ms"), ("p99_itl_ms", "P99 ITL ms"), ("mean_ttft_ms", "mean TTFT ms"),
           ("total_tok_per_s", "total tok/s")]


def online_phase(work, vs, plan_):
    warm = plan_.get("warmup_rounds", 0)
    rows = {}
    for v in vs:
        if v["phase"] != "online":
            continue
        per = {}
        # Rounds beyond the plan are the extra ones the budget allowed.
        for p in glob.glob(os.path.join(work, "r", f"online-r*-{v['name']}.json")):
            m = re.fullmatch(r"online-r(\d+)-(.*)\.json", os.path.basename(p))
            runs = (load(p) or {}).get("online", {}).get("runs") or []
            if m and m.group(2) == v["name"] and runs:
                per[int(m.group(1))] = runs[0]
        measured = {r: x for r, x in per.items() if r >= warm}
        from_warmup = not measured and bool(per)
        use = measured or per
        mean = {k: sum(x[k] for x in use.values()) / len(use) for k, _ in METRICS + [("prompt_tokens", "")]} if use else None
        rows[v["name"]] = {"group": v["group"], "kind": v["kind"], "rounds": {str(r): x for r, x in sorted(per.items())},
                           "measured_rounds": sorted(use), "from_warmup_only": from_warmup, "mean": mean}
    for row in rows.values():
        base = baseline(rows, row["group"], "bare")
        bm = base["mean"] if base else None
        row["ratio"] = {k: row["mean"][k] / bm[k] for k, _ in METRICS if bm and bm.get(k)} if row["mean"] and bm else None
        # Same-round ratios: their spread shows what the noise of one pair of runs is.
        spread = {}
        for k, _ in METRICS:
            rs = [x[k] / base["rounds"][r][k] for r, x in row["rounds"].items()
                  if base and r in base["rounds"] and base["rounds"][r].get(k) and int(r) in row["measured_rounds"]]
            if rs:
                spread[k] = [min(rs), max(rs)]
        row["round_ratio_range"] = spread or None
        # The same workload must have been replayed (bench draws prompts and app coins from one
        # stream); a mismatch makes the ratios meaningless, so it is flagged.
        row["same_workload"] = bool(bm and row["mean"] and row["mean"]["prompt_tokens"] == bm["prompt_tokens"])
    return rows


def arrivals(plan_):
    rates = {gp["rate"] for gp in plan_.get("groups", {}).values()}
    if rates == {0}:
        return "Every request arrives at once (vLLM's bench at request rate inf, as in the paper's figures)"
    if 0 in rates:
        return "Poisson arrivals, or all at once where the rate is 0"
    return "Poisson arrivals"


def pct(r):
    return "-" if r is None else f"{100 * (r - 1):+.2f}%"


def fmt(x, nd=3):
    return "-" if x is None else f"{x:.{nd}f}"


def role_deltas(row, base, bucket, top=5):
    """The kernel roles a variant adds over the bare bundle in one bucket (ms, largest first)."""
    p, b = (row.get("profile_ms") or {}).get(bucket), (base.get("profile_ms") or {}).get(bucket) if base else None
    if not p or b is None:
        return []
    d = [(k, v - b.get(k, 0.0)) for k, v in p.items()]
    d = [(k, x) for k, x in d if x > 0.002]
    return sorted(d, key=lambda kx: -kx[1])[:top]


def assemble(work, out):
    vs = variants(work)
    cfg = load(os.path.join(work, "config.json")) or {}
    plan_ = load(os.path.join(work, "plan.json")) or {}
    device = " ".join(read_lines(os.path.join(work, "device.txt"))) or "unknown"
    notes = read_lines(os.path.join(work, "notes.txt"))
    offline = graph_phase(work, vs, "offline")
    grid = graph_phase(work, vs, "grid")
    online = online_phase(work, vs, plan_)
    misses = []

    def check(where, name, kind, key, r):
        if r is None or kind not in ("app", "deployed"):
            return
        lim = APP_TARGET if kind == "app" else DEPLOYED_TARGET
        cost = (1 - r) if key == "total_tok_per_s" else (r - 1)
        if cost > lim:
            misses.append(f"{where} {name} {key}: {100 * cost:+.2f}% (target {100 * lim:.1f}%)")

    for name, row in online.items():
        for key in ("mean_itl_ms", "total_tok_per_s"):
            check("online", name, row["kind"], key, (row["ratio"] or {}).get(key))
    for name, row in offline.items():
        for b, r in (row["ratio"] or {}).items():
            check("graph", name, row["kind"], b, r)

    res = {"date": datetime.date.today().isoformat(), "device": device, "config": cfg, "plan": plan_,
           "notes": notes, "invocations": walls(work), "offline_graph": offline, "grid": grid, "online": online,
           "targets": {"app_enabled_max": APP_TARGET, "deployed_unused_max": DEPLOYED_TARGET, "misses": misses}}
    with open(os.path.join(out, "apps.json"), "w") as f:
        json.dump(res, f, indent=2, sort_keys=True)

    cpu = cfg.get("backend") == "cpu"
    md = ["# The apps' cost (issue 4)\n\n",
          f"{res['date']}, {device}. " + (
              f"Merged by `apps_assemble.py merge` from {len(cfg['merged_from'])} runs of `testsuite/gpu/apps.sh` "
              f"({', '.join(cfg['merged_from'])}: each phase of a model from one device call); "
              if cfg.get("merged_from") else f"Produced by `testsuite/gpu/apps.sh` in {cfg.get('elapsed_s', '?')} s; ") +
          "raw data in apps.json.\n"]
    if cpu:
        md.append("\n**SMOKE run on the CPU backend with stand-in models: these figures say nothing about the GPU.**\n")
    md.append(f"\nTargets (issue 4): every app enabled on every request costs at most {100 * APP_TARGET:.0f}% "
              f"in mean ITL and in throughput; all apps deployed but unused at most {100 * DEPLOYED_TARGET:.1f}%. ")
    md.append(("Missed: " + "; ".join(misses) + ".\n") if misses else "Every measured row meets them.\n")

    # Online.
    md.append("\n## Online (the paper's method)\n\n")
    if plan_.get("groups"):
        md.append(f"{arrivals(plan_)}, ShareGPT-like prompt lengths, {cfg.get('output_len')} output tokens; "
                  f"{max((len(r['measured_rounds']) for r in online.values()), default=0)} measured round(s) "
                  f"(planned {plan_.get('run_rounds')}) after {plan_.get('warmup_rounds')} warm-up round(s), "
                  "variants interleaved in each round, one process per run. \"vs no-app\": the mean over rounds as a "
                  "change against the bundle compiled with no apps (apps.json has the ratios); \"range\": the "
                  "spread of the same-round ITL ratios, a gauge of the noise.\n")
    else:
        md.append("Not run (see notes).\n")
    for g, gp in plan_.get("groups", {}).items():
        at = "all at once" if gp["rate"] == 0 else f"at {gp['rate']:g}/s"
        md.append(f"\n### {GROUP_TITLES.get(g, g)}: {gp['requests']} requests {at} "
                  f"(REQUESTS {cfg.get('requests')})\n\n")
        md.append("| variant | mean ITL ms | vs no-app | range | P99 ITL ms | vs no-app | mean TTFT ms | vs no-app | "
                  "total tok/s | vs no-app | rounds |\n")
        md.append("|---|---|---|---|---|---|---|---|---|---|---|\n")
        for name, row in online.items():
            if row["group"] != g:
                continue
            m, r, sp = row["mean"] or {}, row["ratio"] or {}, row["round_ratio_range"] or {}
            rng = sp.get("mean_itl_ms")
            cells = [name]
            for k, _ in METRICS:
                cells += [fmt(m.get(k), 1 if k == "total_tok_per_s" else 3), pct(r.get(k)) if row["kind"] != "bare" else ""]
                if k == "mean_itl_ms":
                    cells.append(f"{pct(rng[0])} .. {pct(rng[1])}" if rng and row["kind"] != "bare" else "")
            flag = "" if row["same_workload"] or row["kind"] == "bare" or not m else " (other workload!)"
            done = ",".join(map(str, row["measured_rounds"])) or "none (see notes)"
            cells.append(done + (" warm-up only" if row["from_warmup_only"] else "") + flag)
            md.append("| " + " | ".join(cells) + " |\n")

    # Deployed but unused.
    md.append("\n## Deployed but unused (target at most "
              f"{100 * DEPLOYED_TARGET:.1f}%)\n\n| model | online mean ITL | online tok/s | "
              + " | ".join(f"graph {b}" for b in buckets(offline)) + " |\n|---|---|---|"
              + "---|" * len(buckets(offline)) + "\n")
    for g in sorted({r["group"] for r in list(offline.values()) + list(online.values())}):
        on = baseline(online, g, "deployed")
        off = baseline(offline, g, "deployed")
        cells = [GROUP_TITLES.get(g, g), pct(((on or {}).get("ratio") or {}).get("mean_itl_ms")),
                 pct(((on or {}).get("ratio") or {}).get("total_tok_per_s"))]
        cells += [pct(((off or {}).get("ratio") or {}).get(b)) for b in buckets(offline)]
        md.append("| " + " | ".join(cells) + " |\n")

    # Offline graph replay.
    what = "host-measured decode step ms (no graph timer on this backend)" if cpu else \
        "bare graph replay ms (CUDA events, back to back)"
    md.append(f"\n## Offline graph replay\n\n{what}; prompts of {cfg.get('prompt_len')} tokens, "
              f"{cfg.get('new_tokens')} generated, then the decode buckets replayed {cfg.get('graph_iters')} times "
              "with every row's apps as in the last step.\n\n")
    md.append(table(offline, "variant", lambda n: n))

    # Grid.
    md.append(f"\n## nnsight grid rows (Llama-3.1-8B dims, all deployed in one bundle)\n\n{what}; "
              f"prompts of {cfg.get('grid_prompt_len')} tokens. Share = the row's app enabled alone / the bundle "
              "compiled with no apps (\"deployed\": the grid bundle with nothing enabled).\n\n")
    md.append(table(grid, "row", lambda n: GRID_ROWS.get(n, n)))

    # Where the time goes.
    lines = []
    for phase, rows in (("graph", offline), ("grid", grid)):
        for name, row in rows.items():
            base = baseline(rows, row["group"], "bare")
            for b in buckets(rows):
                r = (row["ratio"] or {}).get(b)
                lim = APP_TARGET if row["kind"] in ("app", "all") else DEPLOYED_TARGET
                if row["kind"] == "bare" or r is None or r - 1 <= lim:
                    continue
                d = role_deltas(row, base, b)
                if d:
                    lines.append(f"- {phase} {name} {b} ({pct(r)}): " + ", ".join(f"{k} +{x:.3f} ms" for k, x in d) + "\n")
    if lines:
        md.append("\n## Where the extra time goes (nodes timed one by one, summed by role, minus the no-app "
                  "bundle's; rows above their target)\n\n")
        md += lines

    md.append("\n## Notes (skipped, shortened, failed)\n\n")
    md += [f"- {n}\n" for n in notes] or ["- none\n"]
    md.append("\nKnobs: " + ", ".join(f"{k}={v}" for k, v in sorted(cfg.items()) if k not in ("models", "elapsed_s")) + "\n")
    with open(os.path.join(out, "APPS.md"), "w") as f:
        f.write("".join(md))


def table(rows, first, label):
    """Per variant and bucket: ms, share of the no-app bundle, change against the deployed
    bundle; then the host-measured decode step (control upload, replay, export read-back: what
    graph replay leaves out, e.g. copying every layer's capture back) as a share."""
    bs = buckets(rows)
    if not bs:
        return "No results (see notes).\n"
    step = "step" not in bs and any(r["step_ms"] for r in rows.values())
    head = f"| {first} | " + " | ".join(f"{b} ms | {b} share | {b} vs deployed" for b in bs)
    head += " | host step ms | step share |\n" if step else " |\n"
    out = [head, "|---|" + "---|---|---|" * len(bs) + ("---|---|" if step else "") + "\n"]
    for name, row in rows.items():
        dep = baseline(rows, row["group"], "deployed")
        cells = [label(name)]
        for b in bs:
            ms = (row["ms"] or {}).get(b)
            r = (row["ratio"] or {}).get(b)
            d = (dep["ms"] or {}).get(b) if dep and dep["ms"] else None
            cells += [fmt(ms, 4), "-" if r is None else f"{r:.4f}",
                      pct(ms / d) if ms and d and row["kind"] in ("app", "all") else ""]
        if step:
            base = baseline(rows, row["group"], "bare")
            sb = base["step_ms"] if base else None
            cells += [fmt(row["step_ms"], 3), f"{row['step_ms'] / sb:.4f}" if row["step_ms"] and sb else "-"]
        out.append("| " + " | ".join(cells) + " |\n")
    return "".join(out)


def merge(work, out, sources):
    if os.path.exists(work):
        shutil.rmtree(work)
    os.makedirs(os.path.join(work, "r"))
    lines = {"variants.tsv": [], "runs.tsv": [], "notes.txt": []}
    configs, plan_, phases, device = [], {}, [], None
    for src in sources:
        path, _, keep = src.rpartition(":")
        keep = keep.split(",")
        if not path or not set(keep) <= {"offline", "grid", "online"}:
            sys.exit(f"merge: {src}: want RAW.tgz:PHASES with PHASES from offline, grid, online (comma-separated)")
        tmp = os.path.join(work, "src")
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            with tarfile.open(path) as t:
                t.extractall(tmp, filter="data")
        except (OSError, tarfile.TarError) as e:
            sys.exit(f"merge: {path}: {e} (give a raw.tgz that apps.sh wrote)")
        # An id's phase: offline-*, grid-*, online-r*-* and probe-* (the online phase's probe).
        def kept(run_id):
            ph = run_id.split("-", 1)[0]
            return (ph if ph in ("offline", "grid") else "online") in keep
        for f in glob.glob(os.path.join(tmp, "r", "*")):
            if kept(os.path.basename(f)):
                shutil.copy(f, os.path.join(work, "r"))
        lines["variants.tsv"] += [l for l in read_lines(os.path.join(tmp, "variants.tsv")) if l.split("\t")[0] in keep]
        lines["runs.tsv"] += [l for l in read_lines(os.path.join(tmp, "runs.tsv")) if kept(l.split("\t")[0])]
        # A note on the online phase (its probes, plan and runs) goes with that phase.
        lines["notes.txt"] += [f"{os.path.basename(path)}: {l}" for l in read_lines(os.path.join(tmp, "notes.txt"))
                               if "online" in keep or not re.search(r"\bonline\b|probe", l)]
        # Knobs that differ between the sources are kept per source.
        c = load(os.path.join(tmp, "config.json")) or {}
        c.pop("elapsed_s", None)
        configs.append(c)
        device = device or " ".join(read_lines(os.path.join(tmp, "device.txt")))
        phases += [p for p in keep if p not in phases]
        if "online" in keep:
            pj = load(os.path.join(tmp, "plan.json")) or {}
            plan_.setdefault("groups", {}).update(pj.get("groups", {}))
            for k in ("warmup_rounds", "run_rounds"):
                if plan_.get(k, pj.get(k)) != pj.get(k):
                    sys.exit(f"merge: {path} planned {k}={pj.get(k)}, an earlier source {plan_[k]}: its online rows would not compare")
                plan_[k] = pj.get(k)
        shutil.rmtree(tmp)
    for name, ls in lines.items():
        with open(os.path.join(work, name), "w") as f:
            f.writelines(l + "\n" for l in dict.fromkeys(ls))
    keys = dict.fromkeys(k for c in configs for k in c)
    cfg = {k: configs[0].get(k) if all(c.get(k) == configs[0].get(k) for c in configs) else [c.get(k) for c in configs]
           for k in keys}
    cfg.update(phases=" ".join(phases), merged_from=[os.path.basename(x) for x in sources])
    for name, obj in (("config.json", cfg), ("plan.json", plan_)):
        with open(os.path.join(work, name), "w") as f:
            json.dump(obj, f)
    with open(os.path.join(work, "device.txt"), "w") as f:
        f.write((device or "unknown") + "\n")
    os.makedirs(out, exist_ok=True)
    assemble(work, out)


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("plan")
    p.add_argument("work")
    p.add_argument("--left", type=float, required=True)
    p.add_argument("--requests", type=int, required=True)
    p.add_argument("--min-requests", type=int, required=True)
    p.add_argument("--output-len", type=int, required=True)
    p.add_argument("--warmup", type=int, required=True)
    p.add_argument("--runs", type=int, required=True)
    p.add_argument("groups", nargs="+", help="GROUP:VARIANTS:RATE:PROBE_REQUESTS (rate 0: all at once)")
    s = sub.add_parser("assemble")
    s.add_argument("work")
    s.add_argument("out")
    m = sub.add_parser("merge")
    m.add_argument("work")
    m.add_argument("out")
    m.add_argument("sources", nargs="+", help="RAW.tgz:PHASES (comma-separated)")
    a = ap.parse_args()
    if a.cmd == "plan":
        plan(a)
    elif a.cmd == "merge":
        merge(a.work, a.out, a.sources)
    else:
        assemble(a.work, a.out)


if __name__ == "__main__":
    main()
