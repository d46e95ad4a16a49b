#!/usr/bin/env bash
# Two builds' app costs side by side: apps.sh's offline phase (graph replay of the bundle with
# no apps, apps 1-6 deployed and none enabled, each app enabled on every row, all six; Llama-3.1-8B)
# run with the previous build's binaries (PREV_BIN) and with this build's (BIN), ROUNDS rounds,
# the two alternating so that drift hits both alike. An app's cost is its step less its own
# build's bare step, per round; APPS_AB.md gives their means side by side. Here:
#   mkdir -p .dev/prev && cp OLD/xmix OLD/xmixc .dev/prev/
#   bash testsuite/gpu/build.sh && bash testsuite/gpu/pack.sh .dev/gpu .dev/prev
# then on the GPU machine:
#   run(command="bash testsuite/gpu/pack.sh --unpack && bash testsuite/gpu/apps_ab.sh", carry=[".dev/pack"])
# PREV_BUILD and NEW_BUILD (both "") are xmixc build flags for each side's bundles (apps.sh's
# L8_BUILD), so one folder of binaries can time a build flag against the default:
#   PREV_BIN=.dev/gpu NEW_BUILD=--mi-preload-coherent bash testsuite/gpu/apps_ab.sh
# Knobs (env): PREV_BIN (.dev/prev), BIN (.dev/gpu), PREV_BUILD, NEW_BUILD, ROUNDS (3), GRAPH_ITERS (300), BUCKETS
# ("1 8"), ROUND_BUDGET_S (120: each apps.sh run's TIME_BUDGET_S; one takes about 40 s on the
# H200), SMOKE (1: apps.sh's CPU stand-ins, to check the script anywhere), OUT, WORK.
# Writes $OUT/APPS_AB.md, $OUT/apps_ab.json and $OUT/raw.tgz (each run's apps.json and log).
set -uo pipefail
cd "$(dirname "$0")/../.."
prev=${PREV_BIN:-.dev/prev}
new=${BIN:-.dev/gpu}
OUT=${OUT:-/tmp/xmix-gpu-out}
work=${WORK:-/tmp/xmix-apps-ab}
ROUNDS=${ROUNDS:-3}
for b in "$prev" "$new"; do
  for x in xmix xmixc; do
    [ -x "$b/$x" ] || { echo "apps_ab.sh: $b/$x is missing: PREV_BIN and BIN name folders with xmix and xmixc (see the header)" >&2; exit 2; }
  done
done
rm -rf "$work"
mkdir -p "$OUT" "$work"
for r in $(seq 1 "$ROUNDS"); do
  for v in prev new; do
    b=$new flags=${NEW_BUILD:-}
    [ "$v" = prev ] && b=$prev flags=${PREV_BUILD:-}
    echo "[$(date +%T)] round $r: $v ($b)" >&2
    BIN=$b L8_BUILD=$flags WORK="$work/apps-$v$r" OUT="$work/$v$r" PHASES=offline MIXTRAL=0 \
      GRAPH_ITERS=${GRAPH_ITERS:-$([ "${SMOKE:-0}" = 1 ] && echo 5 || echo 300)} BUCKETS=${BUCKETS:-1 8} TIME_BUDGET_S=${ROUND_BUDGET_S:-120} \
      bash testsuite/gpu/apps.sh > "$work/$v$r.log" 2>&1 || echo "round $r $v: apps.sh failed, see $v$r.log in raw.tgz" >&2
  done
done
python3 testsuite/gpu/apps_ab.py "$work" "$OUT" "$ROUNDS" "$prev ${PREV_BUILD:-}" "$new ${NEW_BUILD:-}"
(cd "$work" && tar -czf "$OUT/raw.tgz" --exclude='apps-*' .)
cat "$OUT/APPS_AB.md" >&2
