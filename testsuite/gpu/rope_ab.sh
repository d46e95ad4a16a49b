#!/usr/bin/env bash
# The q/k/v rotation and KV-cache write at 128 rows and more, where cuBLASLt serves the q/k/v
# GEMM and no copy-engine kernel takes the rotation (both defaults since session 92, each
# with the old layout's results bit for bit):
#  - rope_kv's work in the attention (xmixc build --rope-in-attention): where the decode
#    attention runs one block a row on tensor cores (Llama-class shapes from 128 rows), each
#    block writes its kv head's newest k and v and rotates its q heads in registers, and
#    rope_kv's launch goes (codegen's TestAttentionRope);
#  - rope_kv in one wave (xmixc build --rope-one-wave), where rope_kv stays: the 8B's rope_kv
#    takes three blocks of 1024 threads a row, 384 at 128 rows, where the card holds 264 at
#    once; two blocks a row at 128 rows and one at 256, each thread rotating more heads
#    (codegen's TestRopeKVFewerGroups).
# One device call, any card (about 3 minutes), in parts (PARTS, default "test rope"):
#  test   TestCUDARopeInAttention (a 2-layer 8B cut's 128-row bucket, bit for bit the bundle
#         with rope_kv apart, and against the CPU) and TestCUDARopeOneWaveMatchesCPU
#         (gpu_tests.sh; the verdicts in log.txt)
#  rope   the default bundle against --rope-in-attention=false (rope_kv apart, in one wave)
#         and against both =false (session 91's layout): the 8B at 128 and 256 rows, contexts
#         80 and 576 (2112 at 256 rows would need 71 GB of cache), the 1B at 128 rows,
#         contexts 576 and 2112 (its rope_kv fits a wave already: its two old layouts are one)
#         (runtime_ab.sh; NEW_TOKENS 64 as the grid; ROUNDS 2)
#   run(command="bash testsuite/gpu/pack.sh --unpack && OUT=\$OUT bash testsuite/gpu/rope_ab.sh",
#       carry=[".dev/pack"])
# Writes under OUT: log.txt, rope8b/ and rope1b/{runtime_ab.json,summary.txt}, test/checks.json.
cd "$(dirname "$0")/../.."
. testsuite/gpu/ab_parts.sh
ab_begin "test rope" test rope
for part in $parts; do
  echo "[$(date +%T)] $part" | tee -a "$log"
  case $part in
    test)
      ab_tests '^TestCUDARopeInAttention$|^TestCUDARopeOneWaveMatchesCPU$' 2
      ;;
    rope)
      for m in "8b llama-3.1-8b 128 256;80 576" "1b llama-3.2-1b 128;576 2112"; do
        read -r tag model buckets <<< "${m%%;*}"
        OUT=$OUT/rope$tag VARIANTS="def=.dev/gpu;apart=.dev/gpu;old=.dev/gpu" \
          BUILDS="apart=--rope-in-attention=false;old=--rope-in-attention=false --rope-one-wave=false" \
          MODELS=$model BUCKETS="$buckets" CONTEXTS="${m#*;}" NEW_TOKENS=64 ROUNDS=${ROUNDS:-2} \
          bash testsuite/gpu/runtime_ab.sh >> "$log" 2>&1 || echo "rope $tag failed: rc $?" | tee -a "$log"
        cat "$OUT/rope$tag/summary.txt" >> "$log" 2> /dev/null || true
      done
      ;;
  esac
done
echo "[$(date +%T)] done" | tee -a "$log"
