#!/usr/bin/env bash
# The issue-14 figures that only an H200 gives (its targets' absolute times are the H200's),
# in one device call, and only on an H200: on any other card it says which and runs only
# OTHER_PARTS (below; none by default, so such a call costs only the machine's start).
#   bash testsuite/gpu/build.sh && bash testsuite/gpu/pack.sh .dev/gpu
#   run(command="bash testsuite/gpu/pack.sh --unpack && OUT=\$OUT bash testsuite/gpu/issue14_h200.sh",
#       carry=[".dev/pack"], kind="nvidia-h200")
# Three parts by default, about 480 s together:
#  peer  the peer grid (run.sh PARTS=peer), both Llama specs, every shape of the issue
#  ab8   the 8-row bucket's gate/up on the 64-row wide gated kernel (e38a6f1's default)
#        against GemmTCGated (gated8_ab.sh part ab), never timed on an H200
#  rope  RoPE in the attention and rope_kv in one wave (session 92's defaults) against their
#        old layouts at 128 and 256 rows (rope_ab.sh part rope), timed on an H100 only
# and two more, on request:
#  apps  apps 1-6 online (apps.sh, PHASES=online, APPS_BUDGET_S, default 220)
#  suite the GPU suite (gpu_tests.sh, 4 shards), its logs and records in suite.tgz
# PARTS (default "peer ab8 rope") picks some. OTHER_PARTS (default none) are the parts run on
# any other card, so that a call asked for an H200 that gets an H100 still does work whose
# ratios count there, e.g. OTHER_PARTS="suite peer" (about 420 s). Writes under OUT (the
# device returns at most 8 files): log.txt (every part's summary), peer/{results.json,
# RESULTS.md}, ab8.json, rope8b.json, rope1b.json (runtime_ab.json of each A/B),
# apps/{apps.json,APPS.md}, suite.tgz.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:?set OUT}
mkdir -p "$OUT"
log=$OUT/log.txt
card=$(nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader | head -1)
echo "$card" | tee -a "$log"
parts=${PARTS:-peer ab8 rope}
case $card in
  *H200*) ;;
  *)
    parts=${OTHER_PARTS:-}
    echo "not an H200: the issue's absolute times must come from one; running OTHER_PARTS: ${parts:-none}" | tee -a "$log"
    ;;
esac
# Every part and what it needs, checked before any runs.
for part in $parts; do
  case $part in
    peer | ab8 | rope | apps | suite) ;;
    *) echo "unknown part $part (peer, ab8, rope, apps, suite)" | tee -a "$log"; exit 2 ;;
  esac
done
for part in $parts; do
  echo "[$(date +%T)] $part" | tee -a "$log"
  case $part in
    ab8 | rope)
      # Each script's own files stay on the card; its log (with its summaries) and the
      # runtime_ab.json of each A/B come back.
      w=$(mktemp -d)
      if [ "$part" = ab8 ]; then script=gated8_ab.sh sub=ab; else script=rope_ab.sh sub=rope; fi
      OUT=$w PARTS=$sub bash testsuite/gpu/$script > /dev/null 2>&1 || echo "$part failed: rc $?" | tee -a "$log"
      cat "$w/log.txt" >> "$log" 2> /dev/null || true
      for f in "$w"/*/runtime_ab.json; do
        [ -e "$f" ] || continue
        d=$(basename "$(dirname "$f")")
        if [ "$d" = ab ]; then cp "$f" "$OUT/ab8.json"; else cp "$f" "$OUT/$d.json"; fi
      done
      ;;
    peer)
      # run.sh writes many files; the two that hold the grid come back.
      w=$(mktemp -d)
      OUT=$w XMIX_BIN=.dev/gpu PARTS=peer PEER_MODELS="llama-3.1-8b llama-3.2-1b" GEMM_AB=0 MOE_AB=0 GEMMA2=0 HF=0 ONLINE=0 \
        bash testsuite/gpu/run.sh > "$w/run.log" 2>&1 || echo "peer failed: rc $?" | tee -a "$log"
      tail -30 "$w/run.log" >> "$log"
      mkdir -p "$OUT/peer"
      cp "$w/results.json" "$w/RESULTS.md" "$OUT/peer/" 2>> "$log" || true
      ;;
    apps)
      OUT=$OUT/apps MIXTRAL=0 PHASES=online TIME_BUDGET_S=${APPS_BUDGET_S:-220} bash testsuite/gpu/apps.sh > "$OUT/apps.log" 2>&1 ||
        echo "apps failed: rc $?" | tee -a "$log"
      tail -20 "$OUT/apps.log" >> "$log"
      rm -f "$OUT/apps.log" "$OUT/apps/raw.tgz" "$OUT/apps/runs.tsv" "$OUT/apps/notes.txt"
      ;;
    suite)
      w=$(mktemp -d)
      TEST_SHARDS=4 TEST_TIMEOUT=300s bash testsuite/gpu/gpu_tests.sh .dev/gpu "$w"
      echo "suite: $(grep -c -- '--- PASS' "$w/checks.log") PASS lines; $(grep -c -- '--- FAIL' "$w/checks.log") FAIL; $(grep -c -- '--- SKIP' "$w/checks.log") SKIP; shards: $(grep '^exit' "$w/checks.log" | tr '\n' ' ')" | tee -a "$log"
      tar czf "$OUT/suite.tgz" -C "$w" .
      ;;
  esac
done
echo "[$(date +%T)] done" | tee -a "$log"
