#!/usr/bin/env python3
"""Summarise `xmix bench --trace` files: where a replayed decode step's time goes.

For each launch, in step order: its contribution to the step is the time from the end of the
launch before it to its own end; the wait's latency is the time from the end of the launch
before it to the first return of its own wait for it; after the wait it ran until its end.
A cuBLASLt launch carries no stamps, so the launch after it takes its time. Roles are the
labels without the layer ("L3.qkv" -> qkv; a GEMM's cast is "qkv.cast"). Layer 1's launches
are listed with the SMs their working CTAs ran on and the most on one SM, and every launch
with the CTAs that began only after the launch ahead ended, its "late" CTAs, and layer 1's
with a thread's registers as the driver compiled the kernel, and how long its CTAs' last
warps outlived thread 0 (the last CTA's end less the last thread 0's; a producer warp shows
there), and for layer 1 each warp's (0-7; the last slot holds later warps) on average. Traces from before those fields show "-" or count none.

  python3 testsuite/gpu/trace_summary.py TRACE.json [...]   (prints; --json writes a summary)
"""
import json
import sys


def role(span):
    label = span["label"]
    if "." in label and (label[0] == "L" or label.startswith("slot")):
        label = label.split(".", 1)[1]
    if span["kernel"] == "xmix_cast_bf16":
        label += ".cast"
    if span["kernel"] == "cublasLt":
        label += ".cublaslt"
    return label


def summarise(spans):
    roles = {}
    prev_end = None
    step_end = 0.0
    layer = []
    for s in spans:
        r = roles.setdefault(role(s), {"n": 0, "contribution_us": 0.0, "wait_latency_us": 0.0, "after_wait_us": 0.0, "late_ctas": 0, "tail_us": 0.0})
        r["n"] += 1
        r["late_ctas"] += s.get("late_ctas", 0)
        if s["records"] == 0:
            continue
        end = s["ended_us"]
        if s.get("thread0_ended_us"):
            r["tail_us"] += end - s["thread0_ended_us"]
        if prev_end is not None:
            r["contribution_us"] += end - prev_end
            if s.get("first_waited_us"):
                r["wait_latency_us"] += s["first_waited_us"] - prev_end
        if s.get("first_waited_us"):
            r["after_wait_us"] += end - s["first_waited_us"]
        prev_end = end
        step_end = max(step_end, end)
        if s["label"].startswith("L1.") or s["label"] == "slot2.add_norm" or s["label"] == "slot3.add_norm":
            layer.append(s)
    return {"step_us": step_end, "roles": roles, "layer1": layer}


def main(paths, as_json):
    out = {}
    for path in paths:
        for tmpl, spans in json.load(open(path)).items():
            s = summarise(spans)
            out[f"{path}:{tmpl}"] = s
            if as_json:
                continue
            print(f"== {path} {tmpl}: {len(spans)} launches, {s['step_us']:.1f} us from the first CTA to the last")
            print(f"{'role':24} {'n':>4} {'contrib us':>11} {'/launch':>8} {'wait lat/launch':>16} {'after wait/launch':>18} {'late CTAs/launch':>17} {'tail/launch':>12}")
            for name, r in sorted(s["roles"].items(), key=lambda kv: -kv[1]["contribution_us"]):
                n = max(r["n"], 1)
                print(f"{name:24} {r['n']:4d} {r['contribution_us']:11.1f} {r['contribution_us'] / n:8.2f} {r['wait_latency_us'] / n:16.2f} {r['after_wait_us'] / n:18.2f} {r['late_ctas'] / n:17.2f} {r['tail_us'] / n:12.2f}")
            if s["layer1"]:
                t0 = s["layer1"][0]["began_us"]
                print("layer 1 (us from its first launch's first CTA): label kernel ctas began first_waited waited thread0_ended ended sms most_on_one_sm late_ctas regs, then warps 0-7's lag behind thread 0")
                for x in s["layer1"]:
                    print(f"  {x['label']:16} {x['kernel'][:44]:44} {x['ctas']:5d} {x['began_us'] - t0:8.2f} {x.get('first_waited_us', 0) - t0 if x.get('first_waited_us') else float('nan'):8.2f} {x.get('waited_us', 0) - t0 if x.get('waited_us') else float('nan'):8.2f} {x.get('thread0_ended_us', 0) - t0 if x.get('thread0_ended_us') else float('nan'):8.2f} {x['ended_us'] - t0:8.2f} {x.get('sms', '-'):>4} {x.get('most_on_one_sm', '-'):>4} {x.get('late_ctas', '-'):>4} {x.get('regs', '-'):>4}  {' '.join(f'{v:.2f}' for v in x.get('warp_lags_us', []))}")
    if as_json:
        json.dump(out, sys.stdout, indent=1)
        print()


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--json"]
    main(args, "--json" in sys.argv[1:])
