#!/usr/bin/env python3
"""Summarise nvidia-smi samples taken while one `xmix bench` ran (runtime_ab.sh POWER=1).

Each line of the CSV is `power.draw, clocks.sm, clocks_throttle_reasons.active` as written by
`nvidia-smi --query-gpu=power.draw,clocks.sm,clocks_throttle_reasons.active
--format=csv,noheader,nounits -lms N`. The bench also loads, prefills and captures, so only the
busy samples count: those drawing at least BUSY of the highest draw seen (the graph replay
draws the most). Prints one line: the highest draw in W, the busy samples' median SM clock in
MHz, the share of them flagged with the software power cap (reason bit 0x4), and how many
there were; fields are "null" where no sample could be read.

  python3 testsuite/gpu/power_summary.py SAMPLES.csv
"""
import statistics
import sys

BUSY = 0.8
SW_POWER_CAP = 0x4


def parse(lines):
    """The (watts, MHz, reasons) of each line that reads as a sample."""
    out = []
    for line in lines:
        fields = [f.strip() for f in line.split(",")]
        if len(fields) != 3:
            continue
        try:
            out.append((float(fields[0]), float(fields[1]), int(fields[2], 16)))
        except ValueError:
            continue  # "[N/A]", a header, a line cut by the kill
    return out


def summary(samples):
    if not samples:
        return "null null null 0"
    top = max(w for w, _, _ in samples)
    busy = [s for s in samples if s[0] >= BUSY * top]
    mhz = statistics.median(m for _, m, _ in busy)
    capped = sum(1 for _, _, r in busy if r & SW_POWER_CAP) / len(busy)
    return f"{top:.0f} {mhz:.0f} {capped:.2f} {len(busy)}"


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        print(summary(parse(f)))
