#!/usr/bin/env bash
# The seven apps' cost on the GPU (issue 4), run on the GPU machine like run.sh (.dev/gpu
# carried). For each decode batch: the bundle compiled with no apps, the bundle with apps 1-6
# deployed and none enabled, and each app enabled on every row; graph replay times measured
# back to back in one session, as ratios to the no-app bundle. App 7 likewise on Mixtral.
# Writes $OUT/apps.json and $OUT/APPS.md.
set -uo pipefail
bin=.dev/gpu
OUT=${OUT:-/tmp/xmix-gpu-out}
work=/tmp/xmix-apps
mkdir -p "$OUT" "$work"
"$bin/xmixc" build specs/models/llama-3.1-8b.yaml -q -o "$work/l8-bare.xmb"
"$bin/xmixc" build specs/models/llama-3.1-8b.yaml specs/apps/app[1-6]-*.yaml -q -o "$work/l8-apps.xmb"
"$bin/xmixc" build specs/models/mixtral-8x7b.yaml -q -o "$work/mx-bare.xmb"
"$bin/xmixc" build specs/models/mixtral-8x7b.yaml specs/apps/app7-steermoe.yaml -q -o "$work/mx-apps.xmb"
bench() { # name bundle batch [apps]
  local apps=()
  [ -n "${4:-}" ] && apps=(--apps "$4")
  "$bin/xmix" bench "$work/$2.xmb" --backend cuda --prompts "$3" --prompt-len 16 --new-tokens 32 \
    --graph-buckets "$3" --graph-iters 100 "${apps[@]}" --json -q > "$work/r-$1-b$3.json" 2>> "$work/log" || echo "failed: $1 b$3" >&2
}
for bs in ${BATCHES:-1 8}; do
  bench bare l8-bare $bs
  bench deployed l8-apps $bs
  for a in refusal-ablation seal conditional-refusal hallucination-probe sake side-effect-free; do bench "$a" l8-apps $bs "$a"; done
  bench all6 l8-apps $bs refusal-ablation,seal,conditional-refusal,hallucination-probe,sake,side-effect-free
  [ "${MIXTRAL:-1}" = 1 ] && { bench mx-bare mx-bare $bs; bench mx-deployed mx-apps $bs; bench steermoe mx-apps $bs steermoe; }
done
python3 - "$work" "$OUT" <<'PY'
import glob, json, os, re, sys
work, out = sys.argv[1], sys.argv[2]
rows = {}
for p in glob.glob(os.path.join(work, "r-*.json")):
    m = re.match(r"r-(.*)-b(\d+)\.json", os.path.basename(p))
    try:
        d = json.load(open(p))
    except ValueError:
        continue
    g = list((d.get("graph_ms") or {}).values())
    rows.setdefault(int(m.group(2)), {})[m.group(1)] = {"graph_ms": g[0] if g else None,
        "step_ms": d.get("offline", {}).get("decode_step_ms")}
json.dump(rows, open(os.path.join(out, "apps.json"), "w"), indent=2, sort_keys=True)
md = ["# Seven apps on the H200 (graph replay ms; ratio to the bundle without apps)\n"]
for bs, r in sorted(rows.items()):
    md.append(f"\n## batch {bs}\n\n| variant | graph ms | vs no-app bundle |\n|---|---|---|\n")
    for k, v in sorted(r.items()):
        base = r.get("mx-bare" if k in ("mx-deployed", "steermoe", "mx-bare") else "bare", {}).get("graph_ms")
        ratio = f"{v['graph_ms'] / base:.4f}" if base and v["graph_ms"] else "-"
        md.append(f"| {k} | {v['graph_ms']} | {ratio} |\n")
open(os.path.join(out, "APPS.md"), "w").write("".join(md))
PY
cat "$OUT/APPS.md" >&2
