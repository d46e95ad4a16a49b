#!/usr/bin/env bash
# The 8-row bucket's gate/up projection: the 64-row wide gated copy-engine kernel, which the
# loader serves to any bucket of up to half its rows (bundle.GatedCopyFor) and which the 8B's
# default bundle gives its 8-row bucket since e38a6f1 (the gated tensor-core kernel,
# GemmTCGated, yields wherever a gated copy-engine kernel serves the bucket), against
# GemmTCGated, which the same bucket runs in a build with `--gated-copy-wide own` (the 32-row
# bucket then runs its own 32-row kernel, which serves no 8-row pair). On an H100 the wide
# kernel made the 8B's 8-row step 2.05-2.37% shorter (session 90, as `--gated-tc-rows 0`
# before e38a6f1); on the H200 it is not yet timed. The 1B's two builds have the same kernels
# and templates (its 8-row bucket keeps GemmTCGated either way), so its rows give the A/B's
# noise. One device call, any card (about 2.5 minutes), in three parts (PARTS, default
# "ab peer trace"), and a fourth on request:
#  ab     both builds side by side, graph replay after 64 generated tokens as the grid does
#         (runtime_ab.sh: MODELS, default both Llamas; bucket 8; CONTEXTS 80 576 2112; ROUNDS 2)
#  peer   the grid's method at batch 8 on the default bundle, xmix and the compiled PyTorch
#         step (run.sh PARTS=peer, PEER_BATCHES=8, the 8B), so the A/B's change gives ratios
#  trace  one traced replay of the default bundle's 8B at 8 x 576 (trace.sh)
#  test   the GPU tests of the gated kernels against the CPU (TestCUDAGatedTCMatchesCPU,
#         TestCUDAGatedCopyMatchesCPU; gpu_tests.sh, about 1 minute), their verdicts in log.txt
#   run(command="bash testsuite/gpu/pack.sh --unpack && bash testsuite/gpu/gated8_ab.sh",
#       carry=[".dev/pack"])
# Writes under OUT: log.txt, ab/{runtime_ab.json,summary.txt}, peer/{results.json,RESULTS.md},
# trace/summary.txt, test/checks.json.
cd "$(dirname "$0")/../.."
. testsuite/gpu/ab_parts.sh
ab_begin "ab peer trace" ab peer trace test
for part in $parts; do
  echo "[$(date +%T)] $part" | tee -a "$log"
  case $part in
    ab)
      OUT=$OUT/ab VARIANTS="def=.dev/gpu;tcg=.dev/gpu" BUILDS="tcg=--gated-copy-wide own" \
        MODELS=${MODELS:-llama-3.1-8b llama-3.2-1b} BUCKETS=8 CONTEXTS=${CONTEXTS:-80 576 2112} NEW_TOKENS=64 ROUNDS=${ROUNDS:-2} \
        bash testsuite/gpu/runtime_ab.sh >> "$log" 2>&1 || echo "ab failed: rc $?" | tee -a "$log"
      cat "$OUT/ab/summary.txt" >> "$log" 2> /dev/null || true
      ;;
    peer)
      w=$(mktemp -d)
      OUT=$w XMIX_BIN=.dev/gpu PARTS=peer PEER_MODELS=llama-3.1-8b PEER_BATCHES=8 GEMM_AB=0 MOE_AB=0 GEMMA2=0 HF=0 ONLINE=0 \
        bash testsuite/gpu/run.sh > "$w/run.log" 2>&1 || echo "peer failed: rc $?" | tee -a "$log"
      tail -12 "$w/run.log" >> "$log"
      mkdir -p "$OUT/peer"
      cp "$w/results.json" "$w/RESULTS.md" "$OUT/peer/" 2>> "$log" || true
      ;;
    trace)
      OUT=$OUT/trace MODELS=llama-3.1-8b BUCKETS=8 CONTEXTS=576 NEW_TOKENS=64 \
        bash testsuite/gpu/trace.sh >> "$log" 2>&1 || echo "trace failed: rc $?" | tee -a "$log"
      rm -f "$OUT"/trace/*.json
      ;;
    test)
      ab_tests '^TestCUDAGatedTCMatchesCPU$|^TestCUDAGatedCopyMatchesCPU$' 2
      ;;
  esac
done
echo "[$(date +%T)] done" | tee -a "$log"
