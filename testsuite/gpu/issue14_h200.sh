#!/usr/bin/env bash
# The issue-14 figures that only an H200 gives (its targets' absolute times are the H200's),
# in one device call, and only on an H200: on any other card it says which and runs only
# OTHER_PARTS (below; none by default, so such a call costs only the machine's start).
#   bash testsuite/gpu/build.sh; (git worktree add /tmp/old 1c92fe5 && cd /tmp/old &&
#   bash testsuite/gpu/build.sh); mkdir -p .dev/old; cp /tmp/old/.dev/gpu/xmixc .dev/old/
#   bash testsuite/gpu/pack.sh .dev/gpu .dev/old
#   run(command="bash testsuite/gpu/pack.sh --unpack && bash testsuite/gpu/issue14_h200.sh",
#       carry=[".dev/pack"], kind="nvidia-h200")
# Three parts, about 520 s together:
#  ab    the default bundle's 16- and 32-row steps against 1c92fe5's (.dev/old's xmixc, whose
#        --gated-copy-wide default was own), Llama-3.1-8B at contexts 80 576 2112 (runtime_ab.sh)
#  peer  the peer grid (run.sh PARTS=peer), both Llama specs
#  apps  apps 1-6 online (apps.sh, PHASES=online, APPS_BUDGET_S, default 220)
# and one more, on no card by default:
#  suite the GPU suite (gpu_tests.sh, 4 shards), its logs and records in suite.tgz
# PARTS (default "ab peer apps") picks some. OTHER_PARTS (default none) are the parts run on
# any other card, so that a call asked for an H200 that gets an H100 still does work whose
# ratios count there, e.g. OTHER_PARTS="suite peer" (about 420 s). Writes under OUT (the
# device returns at most 8 files): log.txt, ab/{runtime_ab.json,summary.txt},
# peer/{results.json,RESULTS.md}, apps/{apps.json,APPS.md}, suite.tgz.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:?set OUT}
mkdir -p "$OUT"
log=$OUT/log.txt
card=$(nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader | head -1)
echo "$card" | tee -a "$log"
parts=${PARTS:-ab peer apps}
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
    ab) [ -x .dev/old/xmixc ] || { echo ".dev/old/xmixc missing: the old default's xmixc (1c92fe5), see the header" | tee -a "$log"; exit 2; } ;;
    peer | apps | suite) ;;
    *) echo "unknown part $part (ab, peer, apps, suite)" | tee -a "$log"; exit 2 ;;
  esac
done
for part in $parts; do
  echo "[$(date +%T)] $part" | tee -a "$log"
  case $part in
    ab)
      OUT=$OUT/ab VARIANTS="new=.dev/gpu;old=.dev/old" OWN_BUNDLES=1 MODELS=llama-3.1-8b BUCKETS="16 32" \
        CONTEXTS="80 576 2112" bash testsuite/gpu/runtime_ab.sh >> "$log" 2>&1 || echo "ab failed: rc $?" | tee -a "$log"
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
