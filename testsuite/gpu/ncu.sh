#!/usr/bin/env bash
# The decode step's kernels one by one under Nsight Compute (issue 14 item 3: where the
# batch-1 step spends what it does not spend reading weights; the apps' add+norm kernels), one
# device call on the GPU machine from the repository root, after testsuite/gpu/build.sh and
# testsuite/gpu/pack.sh .dev/gpu here:
#   run(command="bash testsuite/gpu/pack.sh --unpack && bash testsuite/gpu/ncu.sh", carry=[".dev/pack"])
# For each model of MODELS (default "llama-3.2-1b llama-3.1-8b") it builds the bundle at the
# defaults and, with APP set to an app spec (e.g. APP=specs/apps/app1-refusal-ablation.yaml),
# a second bundle with that app, run with it enabled on the request. It runs one request of
# PROMPT_LEN tokens (16) and NEW_TOKENS (8) under ncu and profiles COUNT launches (default
# 150: a 1B decode step of 132 launches and more, 0.6 of an 8B one) from launch SKIP (600: past the prefill and the first decode
# step) of the kernels whose names match KERNELS (the decode step's own: CUDA-core GEMVs,
# decode attention, add+norm, SiLU, the sampler, the embedding and the final norm; add+norm
# and SiLU also run in the prefill, which SKIP passes). SECTIONS are ncu's sections (default
# "SpeedOfLight LaunchStats Occupancy WarpStateStats": time, DRAM, occupancy and the warp
# stalls per issued instruction; SET=detailed or full instead takes a whole set). The clocks
# are left alone (--clock-control none). Each kernel is replayed once per pass of its
# sections: the detailed set's 20 passes profiled about 230 launches of the 1B in 240 s, the
# four default sections the 1B's 150 in about 80 s (session 17), the 1B's add+norm kernels of
# a bundle with and without APP (KERNELS='^add_norm' COUNT=40) in 60 s; the 8B with APP and
# SET=detailed did not finish in 400 s (session 24). ncu serialises the kernels and
# flushes the caches between them (its default), so each time is the kernel alone, without
# early launch's overlap: compare kernels with each other and with their bytes, not with the
# graph's step (xmix bench --role-costs measures inside the graph). BENCH_FLAGS are added to the
# app-free bundle's xmix bench (BENCH_FLAGS="--prompts 8 --gemm ptx" KERNELS=_r8u4 SKIP=0: the
# bundle's tensor-core GEMMs of bucket 8). A bucket at a given context: BENCH_FLAGS="--prompts
# 8 --graph-buckets 8 --graph-context 2112" with SKIP past the run's own launches of KERNELS
# profiles the graph replays, every row at that context (session 54 call 8: SKIP=400 for the
# 8B's 8-row attention; without --graph-context the launches are the run's, whose buckets and
# contexts vary).
# Writes $OUT/NCU.md and $OUT/ncu.json (ncu.py) and $OUT/ncu.tgz (the .ncu-rep reports, their
# details and raw pages as CSV, the logs), renewed after each run.
set -u
bin=${XMIX_BIN:-.dev/gpu}
OUT=${OUT:-/tmp/xmix-gpu-out}
work=${WORK:-/tmp/xmix-ncu}
MODELS=${MODELS:-llama-3.2-1b llama-3.1-8b}
PROMPT_LEN=${PROMPT_LEN:-16}
NEW_TOKENS=${NEW_TOKENS:-8}
SKIP=${SKIP:-600}
COUNT=${COUNT:-150}
KERNELS=${KERNELS:-^(gemm_k|attention_h[0-9]+_kv[0-9]+_d[0-9]+_[a-z0-9]+_(warps|split|singles)|add_norm|final_norm|silu_mul|sample_v|embed)}
export PATH=/usr/local/cuda/bin:$PATH
NCU=${NCU:-ncu}
mkdir -p "$OUT" "$work"
log() { echo "[$(date +%T)] $*" >&2; }
if ! command -v "$NCU" > /dev/null; then
  echo "ncu.sh: Nsight Compute ($NCU) is not on this machine's PATH; set NCU to its path" >&2
  exit 2
fi
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader > "$work/device.txt" 2>&1
"$NCU" --version > "$work/ncu_version.txt" 2>&1
keep() { (cd "$work" && tar -czf "$OUT/ncu.tgz" --exclude='*.xmb' .); }

names=()
run() { # run NAME BUNDLE [xmix bench flags...]: profile one bundle's request
  local name=$1 b=$2
  shift 2
  log "ncu $name"
  local what=() s
  if [ -n "${SET:-}" ]; then
    what=(--set "$SET")
  else
    for s in ${SECTIONS:-SpeedOfLight LaunchStats Occupancy WarpStateStats}; do what+=(--section "$s"); done
  fi
  timeout "${NCU_TIMEOUT:-400}" "$NCU" --clock-control none "${what[@]}" --kernel-name "regex:$KERNELS" \
    --launch-skip "$SKIP" --launch-count "$COUNT" -f -o "$work/$name" \
    "$bin/xmix" bench "$b" --backend cuda --prompts 1 --prompt-len "$PROMPT_LEN" --new-tokens "$NEW_TOKENS" -q "$@" \
    > "$work/$name.log" 2>&1 || echo "ncu $name failed: see $name.log in ncu.tgz" >&2
  if [ -f "$work/$name.ncu-rep" ]; then
    "$NCU" --import "$work/$name.ncu-rep" --csv --page details > "$work/$name.details.csv" 2>> "$work/$name.log"
    "$NCU" --import "$work/$name.ncu-rep" --csv --page raw > "$work/$name.raw.csv" 2>> "$work/$name.log"
  fi
  names+=("$name")
  keep
}

for m in $MODELS; do
  "$bin/xmixc" build "specs/models/$m.yaml" -q -o "$work/$m.xmb" || { echo "build $m failed" >&2; continue; }
  # shellcheck disable=SC2086 # BENCH_FLAGS is a list of flags
  run "$m" "$work/$m.xmb" ${BENCH_FLAGS:-}
  if [ -n "${APP:-}" ]; then
    app=$(sed -n 's/^app: *//p' "$APP" | head -1)
    "$bin/xmixc" build "specs/models/$m.yaml" "$APP" -q -o "$work/$m-$app.xmb" || { echo "build $m with $APP failed" >&2; continue; }
    run "$m-$app" "$work/$m-$app.xmb" --apps "$app" --app-fraction 1
  fi
done

python3 testsuite/gpu/ncu.py "$work" "$OUT" "${names[@]}"
keep
cat "$OUT/NCU.md" >&2
