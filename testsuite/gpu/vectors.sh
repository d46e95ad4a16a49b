#!/usr/bin/env bash
# Issue 15's per-request vectors on the GPU: rows that read a request's own vector slot
# against rows that read the compiled vector, same bundle (Llama-3.1-8B dims with
# specs/apps/per-request.yaml), same workload, one call. Run from the repository root with the
# binaries carried (testsuite/gpu/build.sh first):
#   run(command="bash testsuite/gpu/vectors.sh", carry=[".dev/gpu"])
# Per variant (bare: no app enabled; compiled: the app on every request with its compiled
# values; own: the app with each request's own random values, xmix bench --vectors):
#   offline: graph replay of decode buckets 1 and 8 (CUDA events), 8 prompts of 128 tokens;
#   online: the paper's workload, REQUESTS (250) at once, 128 new tokens, ignore_eos, RUNS
#   (2) measured runs after one warm-up, variants in turn within each round, ROUNDS (1).
# Writes $OUT/vectors.json and $OUT/VECTORS.md. Env: BIN (.dev/gpu), OUT, WORK.
set -uo pipefail
bin=${BIN:-.dev/gpu}
OUT=${OUT:-/tmp/xmix-vectors-out}
work=${WORK:-/tmp/xmix-vectors}
mkdir -p "$OUT" "$work"
log() { echo "[$(date +%T)] $*" >&2; }
"$bin/xmixc" build specs/models/llama-3.1-8b.yaml specs/apps/per-request.yaml -q -o "$work/pr.xmb" || exit 1
flags() { case $1 in bare) ;; compiled) echo --apps per-request ;; own) echo --apps per-request --vectors ;; esac; }
for v in bare compiled own; do
  log "offline $v"
  "$bin/xmix" bench "$work/pr.xmb" --backend cuda --prompts 8 --prompt-len 128 --new-tokens 32 --ignore-eos --graph-buckets 1,8 \
    --graph-iters 200 --json -q $(flags $v) > "$work/offline-$v.json" || log "offline $v failed"
done
for r in $(seq "${ROUNDS:-1}"); do
  for v in bare compiled own; do
    log "online $v round $r"
    "$bin/xmix" bench "$work/pr.xmb" --backend cuda --online --requests "${REQUESTS:-250}" --rate 0 --output-len 128 --ignore-eos \
      --warmup 1 --runs "${RUNS:-2}" --json -q $(flags $v) > "$work/online-$v-$r.json" || log "online $v round $r failed"
  done
done
python3 - "$work" "$OUT" <<'PY'
import glob, json, os, sys
work, out = sys.argv[1:]
res = {"offline": {}, "online": {}}
for v in ("bare", "compiled", "own"):
    try:
        res["offline"][v] = json.load(open(f"{work}/offline-{v}.json"))["graph_ms"]
    except Exception as e:
        res["offline"][v] = {"error": str(e)}
    runs = []
    for f in sorted(glob.glob(f"{work}/online-{v}-*.json")):
        try:
            runs += json.load(open(f))["online"]["runs"]
        except Exception:
            pass
    if runs:
        keys = ("mean_itl_ms", "p99_itl_ms", "mean_ttft_ms", "total_tok_per_s")
        res["online"][v] = {k: sum(r[k] for r in runs) / len(runs) for k in keys} | {"runs": len(runs)}
json.dump(res, open(f"{out}/vectors.json", "w"), indent=2)
L = ["# Per-request vectors against compiled vectors (issue 15)", "",
     "Llama-3.1-8B dims + specs/apps/per-request.yaml, one bundle; `own` = each request its own vectors (`xmix bench --vectors`).", "",
     "| variant | graph b1 ms | graph b8 ms | mean ITL ms | P99 ITL ms | mean TTFT ms | tok/s |", "|---|---|---|---|---|---|---|"]
for v in ("bare", "compiled", "own"):
    g, o = res["offline"].get(v, {}), res["online"].get(v, {})
    cell = lambda d, k: f"{d[k]:.4f}" if isinstance(d.get(k), (int, float)) else "-"
    L.append(f"| {v} | {cell(g, 'decode_b1')} | {cell(g, 'decode_b8')} | {cell(o, 'mean_itl_ms')} | {cell(o, 'p99_itl_ms')} | {cell(o, 'mean_ttft_ms')} | {cell(o, 'total_tok_per_s')} |")
c, w = res["online"].get("compiled"), res["online"].get("own")
if c and w:
    L += ["", f"own / compiled: mean ITL {w['mean_itl_ms'] / c['mean_itl_ms']:.4f}, throughput {w['total_tok_per_s'] / c['total_tok_per_s']:.4f}"]
open(f"{out}/VECTORS.md", "w").write("\n".join(L) + "\n")
print("\n".join(L))
PY
