#!/usr/bin/env bash
# The online workload on build variants of one spec, side by side in one device call on the
# GPU machine from the repository root, after testsuite/gpu/build.sh here:
#   run(command="bash testsuite/gpu/online_ab.sh", carry=[".dev/gpu"])
# Builds MODEL (default llama-3.1-8b) once per build of VARIANTS (default "s7 default": the
# session-7 GEMVs against today's defaults) and runs xmix bench --online (ShareGPT-like
# prompts, OUTPUT_LEN tokens, REQUESTS requests arriving at RATE per second, 0: all at once) on
# each, one process per run, ROUNDS rounds with the order reversed every other round, after
# one discarded warm-up run of the first variant. A variant is BUILD, with any of +tN (run
# with --max-batched-tokens N) and +own (run with --cuda-own-thread). BUILD is old
# (the binaries in OLD_BIN, default .dev/old, with the spec they were built for,
# OLD_BIN/MODEL.yaml), seqsN (the spec with max_seqs N, its decode
# buckets up to N and no kv_cache_tokens: every resident sequence gets max_seq_len of pages),
# or a name of variants.sh (xmixc build flags). The greedy tokens' digest (tokens_sha256) says
# whether the variants computed the same tokens. Writes $OUT/online_ab.json and
# $OUT/ONLINE_AB.md. BACKEND=cpu MODEL=tiny REQUESTS=4 OUTPUT_LEN=4 tries it without a GPU.
set -uo pipefail
. testsuite/gpu/variants.sh
. testsuite/gpu/fit.sh
bin=${XMIX_BIN:-.dev/gpu}
OUT=${OUT:-/tmp/xmix-gpu-out}
work=/tmp/xmix-online-ab
rm -rf "$work"; mkdir -p "$OUT" "$work"
log() { echo "[$(date +%T)] $*" >&2; }
MODEL=${MODEL:-llama-3.1-8b}
VARIANTS=${VARIANTS:-s7 default}
OLD_BIN=${OLD_BIN:-.dev/old}
binof() { if [ "$1" = old ]; then echo "$OLD_BIN"; else echo "$bin"; fi; }
build_of() { echo "${1%%+*}"; }
bench() { # bench VARIANT OUTFILE
  local build part parts flags=()
  build=$(build_of "$1")
  IFS=+ read -ra parts <<< "$1"
  for part in "${parts[@]:1}"; do
    case $part in
      t*) flags+=(--max-batched-tokens "${part#t}") ;;
      own) flags+=(--cuda-own-thread) ;;
      *) echo "variant $1: unknown part +$part (+tN or +own)" >&2; return ;;
    esac
  done
  timeout "${BENCH_TIMEOUT:-200}" "$(binof "$build")/xmix" bench "$work/$build.xmb" --backend "${BACKEND:-cuda}" --online --rate "${RATE:-8}" \
    --requests "${REQUESTS:-160}" --output-len "${OUTPUT_LEN:-128}" --warmup 0 --runs 1 "${flags[@]}" --json -q > "$2" 2>> "$work/bench.log" \
    || echo "online $1 failed" >&2
}
# spec_of BUILD: the spec file BUILD compiles.
spec_of() { if [ "$1" = old ]; then echo "$OLD_BIN/$MODEL.yaml"; else variant_spec "$MODEL" "$1"; fi; }
# flags_of BUILD SPEC: BUILD's xmixc flags, and what fits SPEC on this card (fit.sh; the old
# binaries' build as it was).
flags_of() {
  [ "$1" = old ] && return 0
  local f
  f=$(variant_flags "$1")
  echo "$f $(fit_flags "$2" $f)"
}

nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader > "$work/device.txt" 2>&1
for b in $(for v in $VARIANTS; do build_of "$v"; done | sort -u); do
  spec=$(spec_of "$b")
  "$(binof "$b")/xmixc" build "$spec" $(flags_of "$b" "$spec") -q -o "$work/$b.xmb" || echo "build $b failed" >&2
  drop_variant_spec "$spec"
done
log "warm-up"
bench "${VARIANTS%% *}" "$work/warmup.json"
for r in $(seq 1 "${ROUNDS:-2}"); do
  order=$VARIANTS
  [ $((r % 2)) = 0 ] && order=$(echo "$VARIANTS" | tr ' ' '\n' | tac | tr '\n' ' ')
  for v in $order; do
    log "round $r: $v"
    bench "$v" "$work/online__${v}__r$r.json"
  done
done
python3 - "$work" "$OUT" "$MODEL" <<'PY'
import glob, json, os, re, statistics, sys
work, out, model = sys.argv[1:4]
runs = {}
for p in sorted(glob.glob(os.path.join(work, "online__*__r*.json"))):
    v = re.match(r"online__(.+)__r\d+\.json$", os.path.basename(p)).group(1)
    try:
        runs.setdefault(v, []).append(json.load(open(p))["online"]["runs"][0])
    except (OSError, ValueError, KeyError, IndexError):
        pass
keys = ["mean_itl_ms", "p99_itl_ms", "mean_ttft_ms", "total_tok_per_s"]
res = {"model": model, "device": open(os.path.join(work, "device.txt")).read().strip(), "variants": {}}
for v, rs in runs.items():
    if not rs:
        continue
    res["variants"][v] = {k: statistics.mean(r[k] for r in rs) for k in keys}
    gaps = [r["host_gap_us"] for r in rs if "host_gap_us" in r]
    res["variants"][v]["host_gap_us"] = statistics.mean(gaps) if gaps else None
    res["variants"][v]["rounds"] = len(rs)
    res["variants"][v]["tokens_sha256"] = sorted({r.get("tokens_sha256", "") for r in rs})
json.dump(res, open(os.path.join(out, "online_ab.json"), "w"), indent=1)
md = [f"# Online workload on build variants ({model}, {res['device']})", "",
      "| variant | mean ITL ms | P99 ITL ms | mean TTFT ms | total tok/s | host gap us | rounds | greedy tokens sha256 |", "|---|---|---|---|---|---|---|---|"]
for v, x in res["variants"].items():
    gap = "-" if x["host_gap_us"] is None else f"{x['host_gap_us']:.1f}"
    md.append(f"| {v} | {x['mean_itl_ms']:.3f} | {x['p99_itl_ms']:.3f} | {x['mean_ttft_ms']:.1f} | {x['total_tok_per_s']:.0f} | {gap} | {x['rounds']} | {' '.join(s[:12] for s in x['tokens_sha256'])} |")
open(os.path.join(out, "ONLINE_AB.md"), "w").write("\n".join(md) + "\n")
print("\n".join(md))
PY
