#!/usr/bin/env bash
# The small kernels between the GEMMs in other layouts, each built for measuring (off by
# default) and each with the default layout's results bit for bit:
#  - the add+norm's rows spread over thread-block clusters (xmixc build --norm-cluster N): one
#    CTA a row asks one SM to load and store a row's every byte (a 4096-wide row: 40 KB in,
#    24-40 KB out), which at 1-32 rows leaves most SMs without a CTA of the kernel; each
#    add+norm took 3.0-4.3 us after its wait and 4.4-5.2 us of the step in session 88's H100
#    traces (64 a step on the 8B). Spread over N CTAs of 1024/N threads, each keeps its
#    threads' columns and the sum of squares goes through the cluster's shared memory in the
#    one-CTA kernel's order (codegen's TestRowNormCluster).
#  - rope_kv in one wave (xmixc build --rope-one-wave): the 8B's rope_kv takes three blocks of
#    1024 threads a row, 384 at 128 rows, where the card holds 264 at once; two blocks a row
#    at 128 rows and one at 256, each thread rotating more heads (codegen's
#    TestRopeKVFewerGroups). Session 86's H100 trace had rope_kv at 5.2 us a layer after
#    cuBLASLt's q/k/v at 128 rows.
#  - rope_kv's work in the attention (xmixc build --rope-in-attention): where the decode
#    attention runs one block a row on tensor cores (Llama-class shapes from 128 rows), each
#    block writes its kv head's newest k and v and rotates its q heads in registers, and
#    rope_kv's launch goes (codegen's TestAttentionRope).
# One device call, any card (about 8 minutes), in parts (PARTS, default "test norm rope"):
#  test   TestCUDABuildKeepsBits (a 2-layer 1B cut built with --norm-cluster 4 in every
#         template gives the plain bundle's logits bit for bit, both GEMM servers),
#         TestCUDARopeInAttention (a 2-layer 8B cut's 128-row bucket, bit for bit the default's
#         and against the CPU) and TestCUDARopeOneWaveMatchesCPU (gpu_tests.sh; the verdicts
#         in log.txt)
#  norm   the default bundle against --norm-cluster 4 and 8 (templates of up to 32 rows, the
#         default --norm-cluster-rows), side by side (runtime_ab.sh: MODELS, default both
#         Llamas; NORM_BUCKETS 1 8 32; CONTEXTS 80 2112; NEW_TOKENS 64 as the grid; ROUNDS 2)
#  rope   the default bundle against --rope-one-wave and --rope-in-attention: the 8B at 128
#         and 256 rows, contexts 80 and 576 (2112 at 256 rows would need 71 GB of cache), the
#         1B at 128 rows, contexts 576 and 2112 (its rope_kv fits a wave already, so its
#         one-wave bundle is the default's: the noise); runtime_ab.sh, as above
#  trace  one traced replay of the 8B at 32 x 2112 with clusters of 4 and without (trace.sh)
#   run(command="bash testsuite/gpu/pack.sh --unpack && OUT=\$OUT bash testsuite/gpu/small_kernels_ab.sh",
#       carry=[".dev/pack"])
# Writes under OUT: log.txt, {norm,rope8b,rope1b}/{runtime_ab.json,summary.txt}, test/checks.json,
# trace/{plain,c4}/summary.txt.
cd "$(dirname "$0")/../.."
. testsuite/gpu/ab_parts.sh
ab_begin "test norm rope" test norm rope trace
for part in $parts; do
  echo "[$(date +%T)] $part" | tee -a "$log"
  case $part in
    test)
      ab_tests '^TestCUDABuildKeepsBits$|^TestCUDARopeInAttention$|^TestCUDARopeOneWaveMatchesCPU$' 3
      ;;
    norm)
      OUT=$OUT/norm VARIANTS="def=.dev/gpu;c4=.dev/gpu;c8=.dev/gpu" BUILDS="c4=--norm-cluster 4;c8=--norm-cluster 8" \
        MODELS=${MODELS:-llama-3.1-8b llama-3.2-1b} BUCKETS=${NORM_BUCKETS:-1 8 32} CONTEXTS=${CONTEXTS:-80 2112} NEW_TOKENS=64 ROUNDS=${ROUNDS:-2} \
        bash testsuite/gpu/runtime_ab.sh >> "$log" 2>&1 || echo "norm failed: rc $?" | tee -a "$log"
      cat "$OUT/norm/summary.txt" >> "$log" 2> /dev/null || true
      ;;
    rope)
      for m in "8b llama-3.1-8b 128 256;80 576" "1b llama-3.2-1b 128;576 2112"; do
        read -r tag model buckets <<< "${m%%;*}"
        OUT=$OUT/rope$tag VARIANTS="def=.dev/gpu;wave=.dev/gpu;attn=.dev/gpu" BUILDS="wave=--rope-one-wave;attn=--rope-in-attention" \
          MODELS=$model BUCKETS="$buckets" CONTEXTS="${m#*;}" NEW_TOKENS=64 ROUNDS=${ROUNDS:-2} \
          bash testsuite/gpu/runtime_ab.sh >> "$log" 2>&1 || echo "rope $tag failed: rc $?" | tee -a "$log"
        cat "$OUT/rope$tag/summary.txt" >> "$log" 2> /dev/null || true
      done
      ;;
    trace)
      for v in plain c4; do
        flags=""
        [ $v = c4 ] && flags="--norm-cluster 4"
        OUT=$OUT/trace/$v BUILD_FLAGS="$flags" MODELS=llama-3.1-8b BUCKETS=32 CONTEXTS=2112 NEW_TOKENS=64 \
          bash testsuite/gpu/trace.sh >> "$log" 2>&1 || echo "trace $v failed: rc $?" | tee -a "$log"
        rm -f "$OUT"/trace/$v/*.json
      done
      ;;
  esac
done
echo "[$(date +%T)] done" | tee -a "$log"
