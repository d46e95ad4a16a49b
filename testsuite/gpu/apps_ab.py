#!/usr/bin/env python3
"""Tabulates apps_ab.sh's rounds into APPS_AB.md and apps_ab.json.

usage: apps_ab.py WORK OUT ROUNDS PREV_BIN BIN

WORK/{prev,new}R/apps.json are apps.sh's results of round R with each build. Per variant and
bucket: each build's step (ms, mean of the rounds) and the variant's cost over that build's
bare step in the same round (ms and percent, mean of the rounds, with the rounds' spread).
A round whose apps.json is missing or lacks a variant leaves that cell empty.
"""
import json
import os
import sys


def load(work, build, rounds):
    runs = []
    for r in range(1, rounds + 1):
        path = os.path.join(work, f"{build}{r}", "apps.json")
        if os.path.exists(path):
            with open(path) as f:
                runs.append(json.load(f))
    return runs


def steps(runs):
    """{variant: {bucket: [ms per round]}} from the offline graph replays."""
    out = {}
    for run in runs:
        for variant, rec in run.get("offline_graph", {}).items():
            for bucket, ms in (rec.get("ms") or {}).items():
                if ms is not None:
                    out.setdefault(variant, {}).setdefault(bucket, []).append(ms)
    return out


def costs(st):
    """{variant: {bucket: [cost over bare per round]}}; rounds pair by position."""
    out = {}
    for variant, buckets in st.items():
        for bucket, ms in buckets.items():
            bare = st.get("bare", {}).get(bucket, [])
            if variant != "bare" and len(bare) == len(ms):
                out.setdefault(variant, {})[bucket] = [m - b for m, b in zip(ms, bare)]
    return out


def mean(v):
    return sum(v) / len(v) if v else None


def main():
    if len(sys.argv) != 6:
        sys.exit("usage: apps_ab.py WORK OUT ROUNDS PREV_BIN BIN")
    work, out, rounds, prev_bin, new_bin = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]
    builds = {b: load(work, b, rounds) for b in ("prev", "new")}
    st = {b: steps(r) for b, r in builds.items()}
    co = {b: costs(s) for b, s in st.items()}
    device = next((r.get("device", "") for r in builds["new"] + builds["prev"]), "")
    res = {"device": device, "rounds": {b: len(r) for b, r in builds.items()}, "bins": {"prev": prev_bin, "new": new_bin},
           "step_ms": st, "cost_ms": co}
    with open(os.path.join(out, "apps_ab.json"), "w") as f:
        json.dump(res, f, indent=1)
    md = [f"# Apps on two builds, offline graph replay ({device})", "",
          f"testsuite/gpu/apps_ab.sh: prev = {prev_bin}, new = {new_bin}; {res['rounds']['prev']} / {res['rounds']['new']} rounds, "
          "the builds alternating. Cost: the variant's step less its build's bare step in the same round, mean of the rounds "
          "(min..max); percent of the bare step.", "",
          "| variant | bucket | prev step ms | new step ms | prev cost ms | new cost ms | prev % | new % |", "|---|---|---|---|---|---|---|---|"]

    def cell(v, digits=4):
        return "" if v is None else f"{v:.{digits}f}"

    def spread(v):
        return "" if not v else f"{mean(v):+.4f} ({min(v):+.4f}..{max(v):+.4f})"

    variants = sorted(set(st["prev"]) | set(st["new"]), key=lambda v: (v != "bare", v != "deployed", v))
    for v in variants:
        for bucket in sorted(set(st["prev"].get(v, {})) | set(st["new"].get(v, {}))):
            row = [v, bucket]
            for b in ("prev", "new"):
                row.append(cell(mean(st[b].get(v, {}).get(bucket, []))))
            for b in ("prev", "new"):
                row.append(spread(co[b].get(v, {}).get(bucket, [])))
            for b in ("prev", "new"):
                c, bare = mean(co[b].get(v, {}).get(bucket, [])), mean(st[b].get("bare", {}).get(bucket, []))
                row.append("" if c is None or not bare else f"{100 * c / bare:+.2f}%")
            md.append("| " + " | ".join(row) + " |")
    with open(os.path.join(out, "APPS_AB.md"), "w") as f:
        f.write("\n".join(md) + "\n")


if __name__ == "__main__":
    main()
