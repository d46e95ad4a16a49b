#!/usr/bin/env bash
# cuBLASLt's tuned algorithms for the Llama specs' decode GEMMs on this GPU (xmix tune-gemm),
# one device call from the repository root after testsuite/gpu/build.sh here:
#   run(command="bash testsuite/gpu/tune_gemm.sh", carry=[".dev/gpu"])
# 1. Builds MODELS' bundles (default llama-3.2-1b llama-3.1-8b) and tunes each one's GEMMs of
#    up to 128 rows (tables in $OUT/tune_gemm.txt, every pick in $OUT/tuned_picks.json).
#    TUNED="MODEL=FILE ..." skips this and uses earlier tune-gemm output instead.
# 2. Times each bucket's picks as a set against none inside the decode graphs, side by side
#    (fuse_ab.sh VARIANTS="nopicks picks" at PROMPT_LENS, default "16 512", x BATCHES, default
#    the tuned buckets "8 16 32 64 128"), into $OUT/ab, and keeps the sets that shortened the
#    step to at most KEEP_RATIO (default 0.995) of the step without them at every prompt
#    length (keep_picks.py sets). KEPT=FILE skips this and starts from that table.
# 3. For each bucket whose set was dropped, times each of its picks alone on top of the kept
#    table (fuse_ab.sh, variants picks-NAME against picks-kept, that bucket only), into
#    $OUT/ab1, and adds the one that shortens the step most, if to at most KEEP_RATIO at every
#    prompt length (keep_picks.py singles, best). SINGLES=0 skips this.
# The result is $OUT/gemm_picks.json: the table xmix ships is loader/cuda/gemm_picks.json;
# copy this file there and commit it.
set -euo pipefail
bin=${XMIX_BIN:-.dev/gpu}
OUT=${OUT:-/tmp/xmix-gpu-out}
MODELS=${MODELS:-llama-3.2-1b llama-3.1-8b}
KEEP_RATIO=${KEEP_RATIO:-0.995}
work=/tmp/xmix-tune-gemm
rm -rf "$work"
mkdir -p "$OUT" "$work"
: > "$OUT/tune_gemm.txt"
note() { echo "$*" >> "$OUT/tune_gemm.txt"; }
ab() { # ab OUT_DIR VARIANTS BASE BATCHES MODELS; PICKS or PICKS_DIR come from the caller's environment
  OUT=$1 VARIANTS=$2 BASE=$3 BATCHES=$4 MODELS=$5 PROMPT_LENS="${PROMPT_LENS:-16 512}" ROUNDS="${ROUNDS:-2}" PARTS=bench \
    bash testsuite/gpu/fuse_ab.sh
  find "$1" -name raw.tgz -delete # fuse_ab.json holds what they measured; the device returns at most 8 files
}
pairs=(${TUNED:-})
if [ ${#pairs[@]} = 0 ]; then
  for m in $MODELS; do
    "$bin/xmixc" build "specs/models/$m.yaml" -q -o "$work/$m.xmb"
    note "## $m"
    "$bin/xmix" tune-gemm "$work/$m.xmb" -o "$work/$m.json" >> "$OUT/tune_gemm.txt" 2> "$work/$m.log"
    pairs+=("$m=$work/$m.json")
  done
fi
python3 -c 'import json, sys; print(json.dumps([p for f in sys.argv[1:] for p in json.load(open(f))], indent=1))' \
  "${pairs[@]#*=}" > "$OUT/tuned_picks.json"
kept=${KEPT:-}
if [ -z "$kept" ]; then
  PICKS=$OUT/tuned_picks.json ab "$OUT/ab" "nopicks picks" nopicks "${BATCHES:-8 16 32 64 128}" "$MODELS"
  note "## kept as sets (keep_picks.py sets)"
  kept=$work/sets.json
  python3 testsuite/gpu/keep_picks.py sets "$kept" "$KEEP_RATIO" "$OUT/ab" "${pairs[@]}" >> "$OUT/tune_gemm.txt"
fi
cp "$kept" "$OUT/gemm_picks.json"
if [ "${SINGLES:-1}" = 1 ]; then
  note "## single picks of the dropped buckets (keep_picks.py singles, best)"
  python3 testsuite/gpu/keep_picks.py singles "$work/singles" "$kept" "${pairs[@]}" > "$work/singles.txt"
  while read -r model rows names <&3; do
    vs=$(for n in $names; do printf 'picks-%s ' "$n"; done)
    PICKS_DIR=$work/singles ab "$OUT/ab1/$model-b$rows" "picks-kept $vs" picks-kept "$rows" "$model"
  done 3< "$work/singles.txt"
  python3 testsuite/gpu/keep_picks.py best "$OUT/gemm_picks.json" "$KEEP_RATIO" "$work/singles" "$OUT/ab1" >> "$OUT/tune_gemm.txt"
fi
cat "$OUT/tune_gemm.txt"
