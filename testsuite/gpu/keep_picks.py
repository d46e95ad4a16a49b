#!/usr/bin/env python3
"""Keep the tuned cuBLASLt picks (xmix tune-gemm) of the decode buckets whose graph step they
made shorter in tune_gemm.sh's side-by-side A/B (fuse_ab.sh VARIANTS="nopicks picks"): a pick
is timed alone, back to back with itself, and inside the step its neighbours may undo what it
gained, so the table ships only what the whole step confirms, at every prompt length timed.

usage: keep_picks.py OUT.json MAX_RATIO AB_DIR MODEL=PICKS.json...
Writes the kept picks to OUT.json and prints each (model, bucket)'s decision. Standard library
only."""
import glob
import json
import sys


def main(out, max_ratio, ab_dir, pairs):
    ratios = {}  # (model, rows) -> the picks' step ratio at each prompt length
    for path in sorted(glob.glob(f"{ab_dir}/*/fuse_ab.json")):
        with open(path) as f:
            for a in json.load(f)["ab"]:
                if a["variant"] == "picks":
                    ratios.setdefault((a["model"], a["batch"]), []).append(a["ratio"])
    kept = []
    for pair in pairs:
        model, path = pair.split("=", 1)
        with open(path) as f:
            picks = json.load(f)
        for rows in sorted({p["m"] for p in picks}):
            r = ratios.get((model, rows), [])
            keep = bool(r) and max(r) <= max_ratio
            shown = " ".join(f"{x:.3f}" for x in r) or "not timed"
            n = sum(p["m"] == rows for p in picks)
            print(f"{model} bucket {rows}: step with/without picks {shown} -> {'keep' if keep else 'drop'} {n} picks")
            if keep:
                kept += [p for p in picks if p["m"] == rows]
    with open(out, "w") as f:
        f.write(json.dumps(kept, indent=1) + "\n")
    print(f"{len(kept)} picks kept in {out}")


if __name__ == "__main__":
    if len(sys.argv) < 5:
        sys.exit(__doc__)
    main(sys.argv[1], float(sys.argv[2]), sys.argv[3], sys.argv[4:])
