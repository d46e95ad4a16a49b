#!/usr/bin/env bash
# cuBLASLt's tuned algorithms for the Llama specs' decode GEMMs on this GPU (xmix tune-gemm),
# one device call from the repository root after testsuite/gpu/build.sh here:
#   run(command="bash testsuite/gpu/tune_gemm.sh", carry=[".dev/gpu"])
# 1. Builds MODELS' bundles (default llama-3.2-1b llama-3.1-8b) and tunes each one's GEMMs of
#    up to 128 rows (tables in $OUT/tune_gemm.txt, every pick in $OUT/tuned_picks.json).
# 2. Times the picks against none inside the decode graphs, side by side (fuse_ab.sh
#    VARIANTS="nopicks picks" at PROMPT_LENS, default "16 512", x BATCHES, default the tuned
#    buckets "8 16 32 64 128"), into $OUT/ab.
# 3. Keeps the picks of each bucket whose step they shortened to at most KEEP_RATIO (default
#    0.995) of the step without them at every prompt length (keep_picks.py), into
#    $OUT/gemm_picks.json: the table xmix ships is loader/cuda/gemm_picks.json; copy this file
#    there and commit it.
set -euo pipefail
bin=${XMIX_BIN:-.dev/gpu}
OUT=${OUT:-/tmp/xmix-gpu-out}
MODELS=${MODELS:-llama-3.2-1b llama-3.1-8b}
work=/tmp/xmix-tune-gemm
rm -rf "$work"
mkdir -p "$OUT" "$work"
: > "$OUT/tune_gemm.txt"
pairs=()
for m in $MODELS; do
  "$bin/xmixc" build "specs/models/$m.yaml" -q -o "$work/$m.xmb"
  echo "## $m" >> "$OUT/tune_gemm.txt"
  "$bin/xmix" tune-gemm "$work/$m.xmb" -o "$work/$m.json" >> "$OUT/tune_gemm.txt" 2> "$work/$m.log"
  pairs+=("$m=$work/$m.json")
done
python3 -c 'import json, sys; print(json.dumps([p for f in sys.argv[1:] for p in json.load(open(f))], indent=1))' \
  "${pairs[@]#*=}" > "$OUT/tuned_picks.json"
PICKS=$OUT/tuned_picks.json OUT=$OUT/ab MODELS="$MODELS" VARIANTS="nopicks picks" BASE=nopicks \
  PROMPT_LENS="${PROMPT_LENS:-16 512}" BATCHES="${BATCHES:-8 16 32 64 128}" ROUNDS="${ROUNDS:-2}" PARTS=bench \
  bash testsuite/gpu/fuse_ab.sh
rm -f "$OUT"/ab/*/raw.tgz # fuse_ab.json holds what they measured; the device returns at most 8 files
echo "## kept (keep_picks.py)" >> "$OUT/tune_gemm.txt"
python3 testsuite/gpu/keep_picks.py "$OUT/gemm_picks.json" "${KEEP_RATIO:-0.995}" "$OUT/ab" "${pairs[@]}" >> "$OUT/tune_gemm.txt"
cat "$OUT/tune_gemm.txt"
