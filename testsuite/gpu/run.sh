#!/usr/bin/env bash
# The GPU checks, run on the GPU machine from the repository root with .dev/gpu carried
# (see build.sh). Writes $OUT/results.json and $OUT/RESULTS.md; copy them to testsuite/gpu/.
#   PARTS="check bench peer prefill" (default all four): check = ptxas, CUDA-vs-CPU and MI checks
#   (with PTX and with cuBLASLt GEMMs), the transformers comparison (HF=0 skips it); bench =
#   offline decode per batch for each GEMM server, start-to-first-token, the online benchmark
#   (ONLINE=0 skips), Mixtral's grouped vs dense experts (MOE_AB=0 skips); peer = xmix bench and
#   the compiled PyTorch step (torch_decode.py) on the same shapes, one model after the other:
#   PEER_MODELS x PEER_PROMPTS x PEER_BATCHES (results.json "peer"; each side's figure the
#   best of three rounds, PEER_ROUNDS for xmix's), xmix with PEER_FLAGS
#   added (PEER_FLAGS="--gemm-picks FILE": a table tune_gemm.sh wrote in this call); prefill = a lone prompt of
#   each of PREFILL_LENS tokens (default 512 2048) on Llama-3.1-8B: its time to first token
#   (offline bench, one request, one token) and its prefill steps node by node with the
#   tensor-core GEMMs' TFLOP/s against the measured bf16 peak (results.json "prefill").
#   PTXAS_GLOB limits ptxas to the bundles it matches (default every bundle).
#   TEST_RUN / TEST_SKIP pick the GPU tests by name (gpu.test's -test.run / -test.skip) and
#   TEST_TIMEOUT bounds them (default 300s). On the H200 the whole suite takes about nine
#   minutes and the rest of PARTS=check (bundles, ptxas, Gemma 2 against transformers) five,
#   so one device call (ten minutes) holds only part of it: split it, e.g.
#   TEST_SKIP='Warpgroup|NextAtAsk|GatedTC|GatedCopy|Fed|RopeCopy|Trace|Mixtral|BuildKeeps'
#   in one call and PTXAS_GLOB=tiny GEMMA2=0 TEST_TIMEOUT=560s TEST_RUN='(the same)' in the next.
#   TEST_SHARDS=N runs the tests in N processes at once (gpu_tests.sh; not yet timed on the
#   GPU: session 57 made the CPU references 2-3x faster and added it, with no GPU lent).
#   XMIX_BIN names the binaries' folder (default .dev/gpu). OLD_BIN, when set, names another
#   build's binaries (the code before a change): its bundle and this one's are timed side by
#   side at AB_SHAPES (prompt:batch) on Llama-3.1-8B (OLD_SPEC: the spec as that build reads
#   it, default the shipped one) (results.json "ab"), and on the paper's
#   online workload, every request at once, with this build also at the token budgets BUDGETS
#   (ONLINE_AB=0 skips; results.json "ab_online", "online_token_budget").
#   On a card of less than 100 GiB (an 80 GB H100) the 8B's bundles get a smaller KV pool
#   (fit.sh's fit_flags, KV_TOKENS_80GB), as apps.sh's and the A/B scripts' do.
#   The work directory persists while the machine stays warm, so two calls (PARTS=check, then
#   PARTS=bench) assemble into one results.json.
set -uo pipefail
. testsuite/gpu/ptxas.sh
bin=${XMIX_BIN:-.dev/gpu}
OUT=${OUT:-/tmp/xmix-gpu-out}
work=/tmp/xmix-gpu
mkdir -p "$OUT" "$work/ptx"
export PATH=/usr/local/cuda/bin:$PATH
log() { echo "[$(date +%T)] $*" >&2; }

log "device"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader > "$work/device.txt" 2>&1
cat "$work/device.txt" >&2

log "bundles"
has() { [[ " ${PARTS:-check bench peer prefill} " == *" $1 "* ]]; }
check=0
has check && check=1
build_bundles "$work" "$check"

if has check; then
log "ptxas -arch=sm_90 on every kernel"
: > "$work/ptxas.txt"
for b in "$work"/${PTXAS_GLOB:-*}.xmb; do
  ptxas_bundle "$b" "$work/ptx/$(basename "$b" .xmb)" "$work/ptxas.txt"
done
grep -c '^ok' "$work/ptxas.txt" >&2; grep '^FAIL' "$work/ptxas.txt" >&2

log "correctness: CUDA vs CPU, MI exactness"
bash testsuite/gpu/gpu_tests.sh "$bin" "$work"
tail -30 "$work/checks.log" >&2

if [ "${HF:-1}" = 1 ]; then
  log "transformers comparison (2-layer cuts of Llama-3.1-8B and Qwen3-8B)"
  PYTHONUNBUFFERED=1 python3 testsuite/gpu/hf_compare.py "$work" >&2 || echo "hf_compare failed" >&2
fi
if [ "${GEMMA2:-1}" = 1 ]; then
  log "Gemma 2 against transformers (2-layer cuts and full depth of Gemma-2-2B)"
  PYTHONUNBUFFERED=1 python3 testsuite/gpu/gemma2_compare.py "$work" >&2 || echo "gemma2_compare failed" >&2
fi
fi

if has bench; then
  log "benchmarks"
  # variant = bundle+GEMM server; the result name drops "+auto" (auto = cuBLASLt when it loads).
  variants="llama-3.2-1b+auto llama-3.1-8b+auto"
  [ "${GEMM_AB:-1}" = 1 ] && variants="$variants llama-3.2-1b+ptx llama-3.1-8b+ptx llama-3.1-8b-staged+ptx"
  for v in $variants; do
    m=${v%+*} gemm=${v#*+} name=${v%+auto}
    for bs in ${BATCHES:-1 8 32 128}; do
      [ "$gemm" != auto ] && [ "$bs" = 1 ] && continue # batch 1 runs the CUDA-core GEMV under every server
      timeout ${BENCH_TIMEOUT:-150} "$bin/xmix" bench "$work/$m.xmb" --backend cuda --gemm "$gemm" --prompts $bs --prompt-len ${PROMPT_LEN:-16} --new-tokens ${NEW_TOKENS:-64} \
        --graph-buckets $bs --profile --json -q > "$work/bench-$name-b$bs.json" 2>> "$work/bench.log" || echo "bench $name b$bs failed" >&2
    done
    [ "$gemm" = auto ] && /usr/bin/time -f "%e" -o "$work/ttft-$m.txt" "$bin/xmix" run "$work/$m.xmb" --backend cuda -p x -n 1 -q > /dev/null 2>> "$work/bench.log"
  done
  if [ "${MOE_AB:-1}" = 1 ]; then
    # Mixtral experts A/B: every expert as GEMMs (the default, --moe dense) vs the grouped
    # expert kernels (--moe grouped), on 512-token prompts (prefill_s in results.json) and the
    # decode graph.
    for m in mixtral-8x7b mixtral-8x7b-moegrouped; do
      for bs in ${MOE_BATCHES:-8 32}; do
        timeout ${BENCH_TIMEOUT:-150} "$bin/xmix" bench "$work/$m.xmb" --backend cuda --prompts $bs --prompt-len 512 --new-tokens 16 \
          --graph-buckets $bs --profile --json -q > "$work/bench-$m-p512-b$bs.json" 2>> "$work/bench.log" || echo "bench $m p512 b$bs failed" >&2
      done
    done
  fi
  if [ "${ONLINE:-1}" = 1 ]; then
    timeout ${ONLINE_TIMEOUT:-300} "$bin/xmix" bench "$work/llama-3.1-8b.xmb" --backend cuda --online --requests ${REQUESTS:-250} --rate ${RATE:-8} --warmup ${WARMUP:-1} --runs ${RUNS:-1} \
      --json -q > "$work/online-llama-3.1-8b.json" 2>> "$work/bench.log" || echo "online bench failed" >&2
  fi
  tail -5 "$work/bench.log" >&2
fi

if has peer; then
  log "peer: xmix bench and the compiled PyTorch step on the same shapes"
  timeout 120 python3 testsuite/gpu/read_rate.py "$work/read_rate.json" || echo "peer: read rate not measured" >&2
  for m in ${PEER_MODELS:-llama-3.2-1b llama-3.1-8b}; do
    shapes=""
    for p in ${PEER_PROMPTS:-16 512 2048}; do
      for bs in ${PEER_BATCHES:-1 8 32 128}; do
        # The graph is timed with all bs rows at context p+new, as the peer's step runs them
        # (the last step of the run itself has fewer: requests prefilled first finish first),
        # and reported as the best of PEER_ROUNDS (default 3) rounds, as the peer reports its
        # best of three.
        timeout ${BENCH_TIMEOUT:-150} "$bin/xmix" bench "$work/$m.xmb" --backend cuda --prompts $bs --prompt-len $p --new-tokens ${PEER_NEW:-64} \
          --graph-buckets $bs --graph-context $((p + ${PEER_NEW:-64})) --graph-rounds ${PEER_ROUNDS:-3} --profile ${PEER_FLAGS:-} --json -q > "$work/peer-$m-p$p-b$bs.json" 2>> "$work/bench.log" || echo "peer: xmix $m p$p b$bs failed" >&2
        shapes="$shapes,$p:$bs"
      done
    done
    RES="$work" PYTHONUNBUFFERED=1 timeout ${PEER_TIMEOUT:-600} python3 testsuite/gpu/torch_decode.py "$m" "${shapes#,}" >&2 || echo "peer: torch $m failed" >&2
  done
fi

if has prefill; then
  log "prefill: a lone prompt's first token and its GEMMs' rate"
  for p in ${PREFILL_LENS:-512 2048}; do
    timeout ${BENCH_TIMEOUT:-150} "$bin/xmix" bench "$work/llama-3.1-8b.xmb" --backend cuda --prompts 1 --prompt-len $p --new-tokens 1 \
      --profile --json -q > "$work/prefill-llama-3.1-8b-p$p.json" 2>> "$work/bench.log" || echo "prefill p$p failed" >&2
  done
fi

if [ -n "${OLD_BIN:-}" ]; then
  log "A/B: this build against $OLD_BIN on Llama-3.1-8B"
  "$OLD_BIN/xmixc" build "${OLD_SPEC:-specs/models/llama-3.1-8b.yaml}" -q -o "$work/old-llama-3.1-8b.xmb"
  # Both builds time the rows as their last step left them (the other build may not know
  # --graph-context): the same workload and the same 512-row prefill steps, so the same rows.
  for shape in ${AB_SHAPES:-1984:1 1984:32 4:128}; do
    p=${shape%:*} bs=${shape#*:}
    for v in old new; do
      b=$bin x="$work/llama-3.1-8b.xmb"
      [ $v = old ] && b=$OLD_BIN x="$work/old-llama-3.1-8b.xmb"
      timeout ${BENCH_TIMEOUT:-150} "$b/xmix" bench "$x" --backend cuda --prompts $bs --prompt-len $p --new-tokens 32 \
        --graph-buckets $bs --profile --json -q > "$work/ab-$v-p$p-b$bs.json" 2>> "$work/bench.log" || echo "A/B: $v p$p b$bs failed" >&2
    done
  done
  if [ "${ONLINE_AB:-1}" = 1 ]; then
    # The paper's online workload (every request at once) on both builds, one round each.
    for v in old new; do
      b=$bin x="$work/llama-3.1-8b.xmb"
      [ $v = old ] && b=$OLD_BIN x="$work/old-llama-3.1-8b.xmb"
      timeout ${ONLINE_TIMEOUT:-300} "$b/xmix" bench "$x" --backend cuda --online --requests ${REQUESTS:-250} --rate 0 --warmup 1 --runs 1 \
        --json -q > "$work/ab-online-$v.json" 2>> "$work/bench.log" || echo "A/B: online $v failed" >&2
    done
    # This build at other token budgets per step (serving.max_batched_tokens; no rebuild).
    for n in ${BUDGETS:-1024 2048}; do
      timeout ${ONLINE_TIMEOUT:-300} "$bin/xmix" bench "$work/llama-3.1-8b.xmb" --backend cuda --online --requests ${REQUESTS:-250} --rate 0 --warmup 1 --runs 1 \
        --max-batched-tokens $n --json -q > "$work/budget-$n.json" 2>> "$work/bench.log" || echo "budget $n failed" >&2
    done
  fi
fi

log "assemble"
python3 testsuite/gpu/assemble.py "$work" "$OUT"
cp "$work/ptxas.txt" "$work/checks.log" "$OUT/" 2>/dev/null
ls -la "$OUT" >&2
