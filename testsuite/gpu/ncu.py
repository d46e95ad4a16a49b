#!/usr/bin/env python3
"""Summarises ncu.sh's Nsight Compute reports into NCU.md and ncu.json.

usage: ncu.py WORK OUT NAME...

For each NAME, WORK/NAME.details.csv and WORK/NAME.raw.csv are the report's pages
(`ncu --import NAME.ncu-rep --csv --page details|raw`). Per kernel name: launches, mean
duration, DRAM bytes read and the rate they imply, the DRAM and memory throughput and
achieved occupancy ncu gives (percent of peak), registers, grid and waves, and the three warp
stall reasons with the most warps per issued instruction. A page that is missing or that ncu
wrote differently leaves its columns empty rather than stopping the summary.
"""
import csv
import json
import os
import sys
from collections import defaultdict

# The details page's metrics kept, by the name ncu prints, and the column they go to.
DETAILS = {
    "Duration": "us",
    "DRAM Throughput": "dram_pct",
    "Memory Throughput": "mem_pct",
    "Achieved Occupancy": "occupancy_pct",
    "Registers Per Thread": "registers",
    "Grid Size": "grid",
    "Block Size": "block",
    "Waves Per SM": "waves",
    "Warp Cycles Per Issued Instruction": "cycles_per_issue",
}
# ncu 2025 prints "us"; older versions "usecond".
TIME_TO_US = {"nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3, "second": 1e6, "ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6}
BYTES = {"byte": 1.0, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "Tbyte": 1e12}
STALL_PREFIX = "smsp__average_warps_issue_stalled_"
STALL_SUFFIX = "_per_issue_active.ratio"


def number(text):
    try:
        return float(str(text).replace(",", ""))
    except ValueError:
        return None


def read_details(path):
    """{(launch id, kernel): {column: value}} from a details page."""
    out = defaultdict(dict)
    if not os.path.exists(path):
        return out
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            col = DETAILS.get(row.get("Metric Name", ""))
            v = number(row.get("Metric Value", ""))
            if col is None or v is None:
                continue
            if col == "us":
                scale = TIME_TO_US.get(row.get("Metric Unit", ""))
                if scale is None:
                    continue
                v *= scale
            out[(row.get("ID", ""), row.get("Kernel Name", ""))][col] = v
    return out


def read_raw(path):
    """{(launch id, kernel): {"dram_read_bytes": B, "stalls": {reason: ratio}}} from a raw page,
    whose second row holds the units."""
    out = {}
    if not os.path.exists(path):
        return out
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    if len(rows) < 3:
        return out
    head, units = rows[0], rows[1]
    idx = {name: i for i, name in enumerate(head)}
    for row in rows[2:]:
        if len(row) != len(head):
            continue
        rec = {"stalls": {}}
        if "dram__bytes_read.sum" in idx:
            i = idx["dram__bytes_read.sum"]
            v, scale = number(row[i]), BYTES.get(units[i])
            if v is not None and scale is not None:
                rec["dram_read_bytes"] = v * scale
        for name, i in idx.items():
            if name.startswith(STALL_PREFIX) and name.endswith(STALL_SUFFIX):
                v = number(row[i])
                if v is not None:
                    rec["stalls"][name[len(STALL_PREFIX):-len(STALL_SUFFIX)]] = v
        out[(row[idx["ID"]] if "ID" in idx else "", row[idx["Kernel Name"]] if "Kernel Name" in idx else "")] = rec
    return out


def summarise(work, name):
    details, raw = read_details(os.path.join(work, name + ".details.csv")), read_raw(os.path.join(work, name + ".raw.csv"))
    by_kernel = defaultdict(list)
    for key in sorted(set(details) | set(raw), key=lambda k: (k[1], number(k[0]) or 0)):
        rec = dict(details.get(key, {}))
        r = raw.get(key, {})
        if "dram_read_bytes" in r:
            rec["dram_read_bytes"] = r["dram_read_bytes"]
        rec["stalls"] = r.get("stalls", {})
        by_kernel[key[1]].append(rec)
    kernels = []
    for kernel, recs in by_kernel.items():
        k = {"kernel": kernel, "launches": len(recs)}
        for col in list(DETAILS.values()) + ["dram_read_bytes"]:
            vals = [r[col] for r in recs if col in r]
            if vals:
                k[col] = sum(vals) / len(vals)
        if "dram_read_bytes" in k and k.get("us"):
            k["dram_read_gb_per_s"] = k["dram_read_bytes"] / (k["us"] * 1e-6) / 1e9
        stalls = defaultdict(list)
        for r in recs:
            for reason, v in r["stalls"].items():
                stalls[reason].append(v)
        k["stalls"] = {reason: sum(v) / len(v) for reason, v in stalls.items()}
        kernels.append(k)
    kernels.sort(key=lambda k: -k.get("us", 0) * k["launches"])
    return kernels


def fmt(v, digits=1):
    return "" if v is None else f"{v:.{digits}f}"


def main():
    if len(sys.argv) < 4:
        sys.exit("usage: ncu.py WORK OUT NAME...")
    work, out, names = sys.argv[1], sys.argv[2], sys.argv[3:]
    device = ""
    if os.path.exists(os.path.join(work, "device.txt")):
        device = open(os.path.join(work, "device.txt")).read().strip()
    res = {"device": device, "runs": {}}
    md = [f"# Decode kernels one by one under Nsight Compute ({device})", "",
          "testsuite/gpu/ncu.sh: kernels serialised, caches flushed between them (ncu's default), so each time is the kernel alone, without early launch's overlap. Means over the launches profiled; rows by total time. Stalls: warps per issued instruction, the three largest.", ""]
    for name in names:
        kernels = summarise(work, name)
        res["runs"][name] = kernels
        md += [f"## {name}", "", "| kernel | launches | µs | DRAM read MB | GB/s | DRAM % | memory % | occupancy % | registers | grid | waves | cycles/issue | top stalls |",
               "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        if not kernels:
            md.append("| (no kernels: see ncu.log in ncu.tgz) | | | | | | | | | | | | |")
        for k in kernels:
            top = sorted(k["stalls"].items(), key=lambda kv: -kv[1])[:3]
            md.append("| " + " | ".join([
                k["kernel"], str(k["launches"]), fmt(k.get("us"), 2),
                fmt(k["dram_read_bytes"] / 1e6 if "dram_read_bytes" in k else None, 2), fmt(k.get("dram_read_gb_per_s"), 0),
                fmt(k.get("dram_pct")), fmt(k.get("mem_pct")), fmt(k.get("occupancy_pct")), fmt(k.get("registers"), 0),
                fmt(k.get("grid"), 0), fmt(k.get("waves"), 2), fmt(k.get("cycles_per_issue")),
                ", ".join(f"{r} {v:.1f}" for r, v in top)]) + " |")
        md.append("")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "ncu.json"), "w") as f:
        json.dump(res, f, indent=1)
    with open(os.path.join(out, "NCU.md"), "w") as f:
        f.write("\n".join(md))


if __name__ == "__main__":
    main()
