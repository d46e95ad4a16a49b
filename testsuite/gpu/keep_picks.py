#!/usr/bin/env python3
"""Choose the tuned cuBLASLt picks (xmix tune-gemm) that ship, from tune_gemm.sh's side-by-side
A/Bs of the decode graph (fuse_ab.sh). A pick is timed alone, back to back with itself; inside
the step its neighbours may undo what it gained, so the table ships only what the whole step
confirms, at every prompt length timed. Two stages:

  keep_picks.py sets OUT.json MAX_RATIO AB_DIR MODEL=PICKS.json...
      A bucket's picks as a set (variants nopicks and picks): keep them where the step with
      them is at most MAX_RATIO of the step without. Writes the kept picks to OUT.json.
  keep_picks.py singles DIR KEPT.json MODEL=PICKS.json...
      For every bucket whose set was dropped, one table per pick of it: KEPT.json plus that
      pick, as DIR/MODEL-bROWS-I.json, and DIR/kept.json. Prints "MODEL ROWS NAME..." per such
      bucket, NAME being the file's name without .json (fuse_ab.sh variant picks-NAME).
  keep_picks.py best OUT.json MAX_RATIO DIR AB_DIR
      Of each bucket's single picks (variants picks-NAME against picks-kept), keep the one
      with the shortest step where it is at most MAX_RATIO of the step without it at every
      prompt length: one pick a bucket, so that no combination ships untimed. Writes
      DIR/kept.json plus those picks to OUT.json.

Each prints its decisions. Standard library only."""
import glob
import json
import os
import sys


def ratios(ab_dir):
    """(model, batch, variant) -> the variant's step ratio to the base at each prompt length."""
    out = {}
    for path in sorted(glob.glob(f"{ab_dir}/**/fuse_ab.json", recursive=True)):
        with open(path) as f:
            for a in json.load(f)["ab"]:
                out.setdefault((a["model"], a["batch"], a["variant"]), []).append(a["ratio"])
    return out


def load(path):
    with open(path) as f:
        return json.load(f)


def write(path, picks):
    with open(path, "w") as f:
        f.write(json.dumps(picks, indent=1) + "\n")


def model_picks(pairs):
    for pair in pairs:
        model, path = pair.split("=", 1)
        yield model, load(path)


def sets(out, max_ratio, ab_dir, pairs):
    r = ratios(ab_dir)
    kept = []
    for model, picks in model_picks(pairs):
        for rows in sorted({p["m"] for p in picks}):
            got = r.get((model, rows, "picks"), [])
            keep = bool(got) and max(got) <= max_ratio
            shown = " ".join(f"{x:.3f}" for x in got) or "not timed"
            n = sum(p["m"] == rows for p in picks)
            print(f"{model} bucket {rows}: step with/without picks {shown} -> {'keep' if keep else 'drop'} {n} picks")
            if keep:
                kept += [p for p in picks if p["m"] == rows]
    write(out, kept)
    print(f"{len(kept)} picks kept in {out}")


def singles(dir, kept_path, pairs):
    os.makedirs(dir, exist_ok=True)
    kept = load(kept_path)
    write(f"{dir}/kept.json", kept)
    for model, picks in model_picks(pairs):
        for rows in sorted({p["m"] for p in picks}):
            bucket = [p for p in picks if p["m"] == rows]
            if any(p in kept for p in bucket):
                continue
            names = []
            for i, p in enumerate(bucket):
                names.append(f"{model}-b{rows}-{i}")
                write(f"{dir}/{names[-1]}.json", kept + [p])
            print(model, rows, *names)


def best(out, max_ratio, dir, ab_dir):
    r = ratios(ab_dir)
    kept = load(f"{dir}/kept.json")
    chosen = {}  # (model, rows) -> (worst ratio, name, pick)
    for (model, batch, variant), got in sorted(r.items()):
        name = variant.removeprefix("picks-")
        path = f"{dir}/{name}.json"
        if not variant.startswith("picks-") or name == "kept" or not os.path.exists(path):
            continue
        extra = [p for p in load(path) if p not in kept]
        if len(extra) != 1 or extra[0]["m"] != batch:
            continue  # a pick of another bucket, timed at this batch: nothing to decide
        p = extra[0]
        worst = max(got)
        shown = " ".join(f"{x:.3f}" for x in got)
        print(f"{model} bucket {batch}: {p['n']}x{p['k']} alone on the table {shown} -> {'candidate' if worst <= max_ratio else 'drop'}")
        if worst <= max_ratio and worst < chosen.get((model, batch), (max_ratio + 1,))[0]:
            chosen[(model, batch)] = (worst, name, p)
    for (model, batch), (worst, name, p) in sorted(chosen.items()):
        print(f"{model} bucket {batch}: keep {p['n']}x{p['k']} ({name}, {worst:.3f})")
    picked = kept + [c[2] for c in chosen.values()]
    write(out, picked)
    print(f"{len(picked)} picks in {out} ({len(chosen)} single picks added)")


if __name__ == "__main__":
    a = sys.argv[1:]
    if len(a) >= 5 and a[0] == "sets":
        sets(a[1], float(a[2]), a[3], a[4:])
    elif len(a) >= 4 and a[0] == "singles":
        singles(a[1], a[2], a[3:])
    elif len(a) == 5 and a[0] == "best":
        best(a[1], float(a[2]), a[3], a[4])
    else:
        sys.exit(__doc__)
