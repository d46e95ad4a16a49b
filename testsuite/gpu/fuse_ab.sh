#!/usr/bin/env bash
# The decode fusions' A/B (issue 14 item 3: xmixc build --fuse), one device call on the GPU
# machine from the repository root, after testsuite/gpu/build.sh here:
#   run(command="bash testsuite/gpu/fuse_ab.sh", carry=[".dev/gpu"])
# For Llama-3.2-1B and Llama-3.1-8B it builds one bundle per variant of VARIANTS (default
# "none default all"; variants.sh says what each name builds, e.g. "none qkv-rope gate-act
# all serial" to see each fusion's share; seqsN builds a spec variant; prev is the previous
# build, the binaries in PREV_BIN; every variant is timed against BASE, default none) and
# times their graph replays side by side in this one run: xmix bench --graph-buckets B --graph-context
# PROMPT_LEN+64 (every row at that context, as the peer grid of RESULTS.md runs) at BATCHES
# (default 1 8 32 128), ROUNDS rounds (default 2) with the variants' order reversed every
# other round, --profile (time per node role) in the first. Then (PARTS check) ptxas on the
# variants' kernels, and the GPU suite with XMIX_FUSE=FUSE (default all; FUSE= empty: the default fusions) and XMIX_SERIAL=CHECK_SERIAL
# (default 0: kernels built for programmatic dependent launch, the default) and
# XMIX_PREFETCH=CHECK_PREFETCH and XMIX_ATTN_PREFETCH=CHECK_ATTN_PREFETCH (default: the build's defaults): the CUDA-vs-CPU agreement and every MI check on such bundles under both GEMM
# servers, and TestCUDABuildKeepsBits (their logits against a plain bundle's, no fusions
# and --pdl=false, bit for bit). Writes $OUT/fuse_ab.json and $OUT/FUSE_AB.md (fuse_ab.py), the raw files as
# $OUT/raw.tgz, renewed as each comes (a call that runs out of time still brings back what it
# measured). PARTS="bench check" (default both); if one call cannot hold both, run
# PARTS=bench, then PARTS=check: the raw files of the first stay in the work directory while
# the machine is warm.
# BENCH_GEMM=ptx times the bundles' own tensor-core GEMMs (xmix bench --gemm; default auto:
# cuBLASLt where it loads); the variant cublaslt, the default bundle, is timed with --gemm auto
# whatever BENCH_GEMM says, so that VARIANTS="cublaslt default staged" BASE=cublaslt
# BENCH_GEMM=ptx sets the bundle's kernels against cuBLASLt in one run. ROLE_COSTS=1 adds xmix bench --role-costs to the first round: what
# each node role costs inside the replayed graph (the graph's time less its time without the
# role), in FUSE_AB.md beside --profile's one-by-one times.
# PROMPT_LENS="2048 16" runs the whole script once per prompt length, each into $OUT/pLEN, with
# batches BATCHES_LEN where set (BATCHES_2048="1 8 32"), else BATCHES. GRAPH_CONTEXT=N times
# every row at context N instead of PROMPT_LEN+64 (issue 14 item 1's ~50-token contexts at
# batch 128: GRAPH_CONTEXT=50 BATCHES=128 ROLE_COSTS=1). BENCH_FLAGS are added to every
# xmix bench (BENCH_FLAGS="--temperature 1 --top-p 0.9": every row samples from a nucleus).
set -uo pipefail
. testsuite/gpu/ptxas.sh
. testsuite/gpu/variants.sh
bin=${XMIX_BIN:-.dev/gpu}
OUT=${OUT:-/tmp/xmix-gpu-out}
work=/tmp/xmix-fuse-ab
raw=$work/raw
if [ -n "${PROMPT_LENS:-}" ]; then
  for len in $PROMPT_LENS; do
    rm -rf "$raw"
    b=BATCHES_$len
    OUT=$OUT/p$len PROMPT_LEN=$len BATCHES=${!b:-${BATCHES:-1 8 32 128}} PROMPT_LENS= bash "$0"
  done
  exit 0
fi
mkdir -p "$OUT" "$raw" "$work/ptx"
export PATH=/usr/local/cuda/bin:$PATH
log() { echo "[$(date +%T)] $*" >&2; }
has() { [[ " ${PARTS:-bench check} " == *" $1 "* ]]; }
# What is measured so far goes back as one tarball (the device returns at most 8 files).
keep() { tar -czf "$OUT/raw.tgz" -C "$raw" .; }
MODELS=${MODELS:-llama-3.2-1b llama-3.1-8b}
VARIANTS=${VARIANTS:-none default all}
FUSE=${FUSE-all} # FUSE= (empty): the default fusions
PROMPT_LEN=${PROMPT_LEN:-16}
GRAPH_CONTEXT=${GRAPH_CONTEXT:-$((PROMPT_LEN + 64))}

nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader > "$raw/device.txt" 2>&1
git rev-parse --short HEAD > "$raw/commit.txt" 2>/dev/null || echo unknown > "$raw/commit.txt"
keep "$raw/device.txt" "$raw/commit.txt"

# The variant prev is the previous build: the bundle at the defaults built and run by the
# binaries in PREV_BIN (default .dev/prev), timed against this build's. prevc is the previous
# compiler's bundle run by this build's xmix (a kernel change timed with flags only this xmix
# has, e.g. BENCH_FLAGS="--temperature 1").
PREV_BIN=${PREV_BIN:-.dev/prev}
compiler_of() { case "$1" in prev | prevc) echo "$PREV_BIN" ;; *) echo "$bin" ;; esac; }
runner_of() { if [ "$1" = prev ]; then echo "$PREV_BIN"; else echo "$bin"; fi; }

log "bundles"
for m in $MODELS; do
  for v in $VARIANTS; do
    spec=$(variant_spec "$m" "$v")
    # fit_flags (fit.sh, through ptxas.sh): the 8B's KV pool cut to fit an 80 GB card.
    flags=$(variant_flags "$v")
    "$(compiler_of "$v")/xmixc" build "$spec" $flags $(fit_flags "specs/models/$m.yaml" $flags) -q -o "$work/$m-$v.xmb" || echo "build $m $v failed" >&2
    drop_variant_spec "$spec"
  done
done

if has bench; then
  log "graph replay, side by side"
  rm -f "$raw"/bench__* # a warm machine keeps an earlier call's files; the check files stay for PARTS=check
  for r in $(seq 1 "${ROUNDS:-2}"); do
    order=$VARIANTS
    [ $((r % 2)) = 0 ] && order=$(echo "$VARIANTS" | tr ' ' '\n' | tac | tr '\n' ' ')
    prof=""
    [ "$r" = 1 ] && prof="--profile${ROLE_COSTS:+ --role-costs}"
    for m in $MODELS; do
      for bs in ${BATCHES:-1 8 32 128}; do
        for v in $order; do
          gemm=${BENCH_GEMM:-auto}
          [ "$v" = cublaslt ] && gemm=auto
          timeout "${BENCH_TIMEOUT:-120}" "$(runner_of "$v")/xmix" bench "$work/$m-$v.xmb" --backend cuda --gemm "$gemm" --prompts "$bs" --prompt-len "$PROMPT_LEN" --new-tokens 8 \
            --graph-buckets "$bs" --graph-context "$GRAPH_CONTEXT" $(variant_bench_flags "$v") ${BENCH_FLAGS:-} $prof --json -q > "$raw/bench__${m}__${v}__b${bs}__r${r}.json" 2>> "$raw/bench.log" \
            || echo "bench $m $v b$bs round $r failed" >&2
          keep "$raw/bench__${m}__${v}__b${bs}__r${r}.json"
        done
      done
    done
  done
  tail -3 "$raw/bench.log" >&2
fi

if has check; then
  log "ptxas -arch=sm_90 on the fused bundles' kernels"
  : > "$raw/ptxas.txt"
  for m in $MODELS; do
    for v in $VARIANTS; do
      [ "$v" = none ] && continue # ptxas on every other variant's kernels
      ptxas_bundle "$work/$m-$v.xmb" "$work/ptx/$m-$v" "$raw/ptxas.txt"
    done
  done
  keep "$raw/ptxas.txt"
  grep -c '^ok' "$raw/ptxas.txt" >&2; grep '^FAIL' "$raw/ptxas.txt" >&2

  log "CUDA vs CPU, MI checks and fused-vs-unfused bits on bundles built with --fuse $FUSE"
  XMIX_FUSE=$FUSE XMIX_SERIAL=${CHECK_SERIAL:-0} XMIX_PREFETCH=${CHECK_PREFETCH:-} XMIX_ATTN_PREFETCH=${CHECK_ATTN_PREFETCH:-} XMIX_GPU_RESULTS="$raw/checks.json" timeout "${CHECK_TIMEOUT:-420}" "$bin/gpu.test" -test.v -test.timeout 400s > "$raw/checks.log" 2>&1
  echo "exit $?" >> "$raw/checks.log"
  keep "$raw/checks.log" "$raw"/checks.json 2>/dev/null
  tail -5 "$raw/checks.log" >&2
fi

log "assemble"
keep
BASE=${BASE:-none} PROMPT_LEN=$PROMPT_LEN GRAPH_CONTEXT=$GRAPH_CONTEXT python3 testsuite/gpu/fuse_ab.py "$raw" "$OUT"
cat "$OUT/FUSE_AB.md" >&2
