#!/usr/bin/env python3
"""This card's read rate, measured as FACTS.md's H200 figure was: the best of ROUNDS sums of
one GIB GiB bf16 tensor (torch), bytes read over the sum's time. run.sh's peer part writes it
to read_rate.json, and assemble.py states each shape's floor and what 0.83x of the peer needs
at this card's rate rather than the H200's (an H100 reads about 3.35 TB/s at most, not 4.8).

  python3 testsuite/gpu/read_rate.py OUT.json   (GIB=8 ROUNDS=10 by default)
"""
import json
import os
import sys

import torch


def main(out):
    gib, rounds = int(os.environ.get("GIB", "8")), int(os.environ.get("ROUNDS", "10"))
    x = torch.ones(gib << 29, dtype=torch.bfloat16, device="cuda")
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    x.sum()  # warm-up: the reduction kernel's first launch
    best = None
    for _ in range(rounds):
        start.record()
        x.sum()
        end.record()
        end.synchronize()
        ms = start.elapsed_time(end)
        best = ms if best is None else min(best, ms)
    rate = x.numel() * x.element_size() / (best / 1000)
    res = {"device": torch.cuda.get_device_name(), "bytes": x.numel() * x.element_size(), "best_ms": best,
           "rounds": rounds, "read_bytes_per_s": rate}
    with open(out, "w") as f:
        json.dump(res, f, indent=1)
    print(f"read rate: {rate / 1e12:.3f} TB/s ({gib} GiB bf16 summed, best of {rounds}: {best:.3f} ms)", file=sys.stderr)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
