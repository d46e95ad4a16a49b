#!/usr/bin/env bash
# One bundle's decode graphs under several xmix binaries or run-time settings, side by side, in
# one device call: VARIANTS="NAME=BIN [VAR=VALUE ...] [-- BENCH FLAGS];..." (the first is the
# base), e.g. "base=.dev/gpu;hop=.dev/pf XMIX_PF_O_BYTES=hop" for a temporary build that reads
# an environment variable, or "s2=.dev/gpu -- --attn-splits 2". For each model of MODELS
# (default llama-3.1-8b; its bundle built by $BIN/xmixc with BUILD_FLAGS), bucket of BUCKETS
# (default 32) and context of CONTEXTS (default 80 576 2112), ROUNDS (default 2) rounds with the
# variants' order reversed every other round; each bench is `xmix bench --graph-buckets B
# --graph-context C` (every row live at that context) after a run of NEW_TOKENS (default 8)
# tokens a request, so the cache past them holds zeros: the 8B's 128-row step is up to 8%
# shorter so than after 64 (the grid's, run.sh; with generated tokens the card reaches its
# power cap and lowers the clock: RESULTS.md, session 54); NEW_TOKENS=64 times it as the grid
# does. POWER=1 samples nvidia-smi every POWER_MS (default 50) ms while each bench runs and
# adds to its line the highest draw, the busy samples' median SM clock (the measure to read:
# the cap's flag is set in some samples even far below the cap) and how many of them the
# power cap held (power_summary.py; $OUT/power.json). BUILDS="NAME=FLAGS;..." gives the
# variants it names a bundle of their own, built with FLAGS in place of BUILD_FLAGS (e.g.
# "cg=--copy-gemm-rows 8,128" against the default bundle). OWN_BUNDLES=1 builds each variant's
# bundle with its own BIN's xmixc (with its BUILDS flags, else BUILD_FLAGS), for comparing two
# commits' kernels (pack both folders: pack.sh .dev/gpu .dev/old); a variant's folder that
# holds xmixc alone runs the xmix of BIN (default .dev/gpu), so an older commit whose runtime
# is the same carries only its xmixc.
#   run(command="OUT=\$OUT VARIANTS=... bash testsuite/gpu/runtime_ab.sh", carry=[...])
# METRIC=step times the engine's decode step as the host sees it (the offline run's
# decode_step_ms: control upload, replay, readback and the host's work between steps, over
# NEW_TOKENS - 1 steps from context 16 on; no graph replays, CONTEXTS unused) in place of the
# bare graph replay, e.g. "base=.dev/gpu;own=.dev/gpu -- --cuda-own-thread" METRIC=step
# NEW_TOKENS=128 BUCKETS="1 8" CONTEXTS=16. METRIC=gap: the same run's host_gap_us (us from a
# step's return from the GPU to the next step's launch) in place of ms.
# Writes $OUT/runtime_ab.json ({"model|bucket|context": {variant: [ms per round]}}) and
# $OUT/summary.txt (each variant's mean and its change against the base).
VARIANTS=${VARIANTS:?set VARIANTS}
case ${METRIC:=graph} in graph | step | gap) ;; *) echo "METRIC=$METRIC: want graph, step or gap" >&2; exit 2 ;; esac
. "$(dirname "$0")/start.sh"
IFS=';' read -ra vs <<< "$VARIANTS"
IFS=';' read -ra builds <<< "${BUILDS:-}"
: > "$W/raw.tsv"; : > "$W/power.tsv"
# builder NAME: the folder whose xmixc builds variant NAME's bundle ($B unless OWN_BUNDLES=1).
builder() {
  local v bin=$B
  if [ "${OWN_BUNDLES:-0}" = 1 ]; then
    for v in "${vs[@]}"; do
      if [ "${v%%=*}" = "$1" ]; then bin=${v#*=}; bin=${bin%% *}; fi
    done
  fi
  echo "$bin"
}
for m in ${MODELS:-llama-3.1-8b}; do
  build_flags="${BUILD_FLAGS:-} $(fit_flags specs/models/$m.yaml ${BUILD_FLAGS:-})"
  "$B/xmixc" build specs/models/$m.yaml -q $build_flags -o "$W/$m.xmb" || { echo "build of $m failed" | tee -a "$S"; exit 1; }
  for b in "${builds[@]}"; do
    "$(builder "${b%%=*}")/xmixc" build specs/models/$m.yaml -q ${b#*=} $(fit_flags specs/models/$m.yaml ${b#*=}) -o "$W/$m-${b%%=*}.xmb" || { echo "build of $m for ${b%%=*} failed" | tee -a "$S"; exit 1; }
  done
  if [ "${OWN_BUNDLES:-0}" = 1 ]; then
    for v in "${vs[@]}"; do
      [ -f "$W/$m-${v%%=*}.xmb" ] && continue # BUILDS built it
      "$(builder "${v%%=*}")/xmixc" build specs/models/$m.yaml -q $build_flags -o "$W/$m-${v%%=*}.xmb" || { echo "build of $m for ${v%%=*} failed" | tee -a "$S"; exit 1; }
    done
  fi
  for bucket in ${BUCKETS:-32}; do
    for ctx in ${CONTEXTS:-80 576 2112}; do
      for r in $(seq ${ROUNDS:-2}); do
        round_order "$r" "${vs[@]}"
        for v in "${order[@]}"; do
          name=${v%%=*}; spec=${v#*=}; flags=""
          case "$spec" in *" -- "*) flags=${spec#* -- }; spec=${spec%% -- *} ;; esac
          bin=${spec%% *}; env=""
          [ "$spec" != "$bin" ] && env=${spec#* }
          f=$W/b.json xmb=$W/$m.xmb
          [ -f "$W/$m-$name.xmb" ] && xmb=$W/$m-$name.xmb
          if [ "${POWER:-0}" = 1 ]; then
            nvidia-smi --query-gpu=power.draw,clocks.sm,clocks_throttle_reasons.active --format=csv,noheader,nounits \
              -lms ${POWER_MS:-50} > "$W/power.csv" 2>/dev/null &
            sampler=$!
          fi
          graph=(--graph-buckets $bucket --graph-context $ctx)
          [ "$METRIC" = graph ] || graph=()
          xmix=$bin/xmix
          [ -x "$xmix" ] || xmix=$B/xmix
          env $env timeout 120 "$xmix" bench "$xmb" --backend cuda --prompts $bucket --prompt-len 16 --new-tokens ${NEW_TOKENS:-8} \
            "${graph[@]}" $flags --json -q > "$f" 2> "$W/e.txt"
          rc=$?
          power=""
          if [ "${POWER:-0}" = 1 ]; then
            kill $sampler 2>/dev/null; wait $sampler 2>/dev/null
            power=$(python3 "$(dirname "$0")/power_summary.py" "$W/power.csv")
            printf '%s|%s|%s\t%s\t%s\n' "$m" "$bucket" "$ctx" "$name" "$power" >> "$W/power.tsv"
            power=" (max W, busy MHz, power-capped share, busy samples: $power)"
          fi
          gap=""
          if [ "$METRIC" != graph ]; then
            read -r ms gap_us < <(python3 -c "import json; o = json.load(open('$f'))['offline']; print(o['decode_step_ms'], o.get('host_gap_us', '-'))" 2>/dev/null || echo "null -")
            [ "$METRIC" = gap ] && ms=${gap_us/-/null}
            gap=" (host gap $gap_us us)"
          else
            ms=$(python3 -c "import json; print(list(json.load(open('$f'))['graph_ms'].values())[0])" 2>/dev/null || echo null)
          fi
          echo "$m bucket $bucket ctx $ctx $name round $r rc=$rc $ms$power$gap" | tee -a "$S"
          [ $rc = 0 ] || tail -3 "$W/e.txt" | tee -a "$S"
          printf '%s|%s|%s\t%s\t%s\n' "$m" "$bucket" "$ctx" "$name" "$ms" >> "$W/raw.tsv"
        done
      done
    done
  done
done
python3 - "$W/raw.tsv" "$OUT/runtime_ab.json" "${vs[0]%%=*}" <<'PY' | tee -a "$S"
import json, sys
out = {}
for line in open(sys.argv[1]):
    shape, name, ms = line.rstrip("\n").split("\t")
    out.setdefault(shape, {}).setdefault(name, []).append(None if ms == "null" else float(ms))
json.dump(out, open(sys.argv[2], "w"), indent=1)
base = sys.argv[3]
for shape, vs in out.items():
    b = sum(vs[base]) / len(vs[base]) if None not in vs[base] else None
    cells = []
    for name, ms in vs.items():
        if None in ms:
            cells.append(f"{name} failed")
            continue
        mean = sum(ms) / len(ms)
        cells.append(f"{name} {mean:.3f}" + (f" ({100 * (mean / b - 1):+.2f}%)" if b and name != base else ""))
    print(shape, " | ".join(cells))
PY
if [ -s "$W/power.tsv" ]; then
  python3 - "$W/power.tsv" "$OUT/power.json" <<'PY'
import json, sys
out = {}
for line in open(sys.argv[1]):
    shape, name, fields = line.rstrip("\n").split("\t")
    w, mhz, capped, n = fields.split()
    num = lambda x, f: None if x == "null" else f(x)
    out.setdefault(shape, {}).setdefault(name, []).append(
        {"max_w": num(w, float), "busy_mhz": num(mhz, float), "capped_share": num(capped, float), "busy_samples": int(n)})
json.dump(out, open(sys.argv[2], "w"), indent=1)
PY
fi
