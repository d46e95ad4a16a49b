#!/usr/bin/env bash
# The add+norm's rows spread over thread-block clusters (xmixc build --norm-cluster N, for
# measuring): one CTA a row asks one SM to load and store a row's every byte (a 4096-wide row:
# 40 KB in, 24-40 KB out), which at 8-32 rows leaves most SMs without a CTA of the kernel; each
# add+norm took 3.0-4.3 us after its wait and 4.4-5.2 us of the step in session 88's H100
# traces (64 a step on the 8B). Spread over N CTAs of 1024/N threads, each keeps its threads'
# columns of the one-CTA kernel and the sum of squares goes through the cluster's shared
# memory in the one-CTA kernel's order, so the results are the same bit for bit (codegen's
# TestRowNormCluster; part test checks it on the GPU). One device call, any card (about 6
# minutes), in parts (PARTS, default "test ab"):
#  test   TestCUDABuildKeepsBits: a 2-layer 1B cut built with --norm-cluster 4 in every
#         template gives the plain bundle's logits bit for bit, under both GEMM servers
#         (gpu_tests.sh; its verdicts in log.txt)
#  ab     the default bundle against --norm-cluster 2, 4 and 8 (in templates of up to 32 rows,
#         the default --norm-cluster-rows), side by side (runtime_ab.sh: MODELS, default both
#         Llamas; BUCKETS 1 8 32; CONTEXTS 80 2112; NEW_TOKENS 64 as the grid; ROUNDS 2)
#  trace  one traced replay of the 8B at 32 x 2112, with clusters of 4 and without (trace.sh)
#   run(command="bash testsuite/gpu/pack.sh --unpack && OUT=\$OUT bash testsuite/gpu/norm_cluster_ab.sh",
#       carry=[".dev/pack"])
# Writes under OUT: log.txt, ab/{runtime_ab.json,summary.txt}, test/checks.json,
# trace/{plain,c4}/summary.txt.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:?set OUT}
mkdir -p "$OUT"
log=$OUT/log.txt
export PATH=/usr/local/cuda/bin:$PATH
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader | tee -a "$log"
parts=${PARTS:-test ab}
for part in $parts; do
  case $part in ab | test | trace) ;; *) echo "unknown part $part (test, ab, trace)" | tee -a "$log"; exit 2 ;; esac
done
for part in $parts; do
  echo "[$(date +%T)] $part" | tee -a "$log"
  case $part in
    test)
      w=$(mktemp -d)
      TEST_SHARDS=1 TEST_RUN='^TestCUDABuildKeepsBits$' bash testsuite/gpu/gpu_tests.sh .dev/gpu "$w" > /dev/null 2>&1 ||
        echo "test failed: rc $?" | tee -a "$log"
      grep -E -- '--- (PASS|FAIL|SKIP)|gpu_test.go|^exit' "$w/checks.log" >> "$log" || true
      mkdir -p "$OUT/test"
      cp "$w/checks.json" "$OUT/test/" 2>> "$log" || true
      ;;
    ab)
      OUT=$OUT/ab VARIANTS="def=.dev/gpu;c2=.dev/gpu;c4=.dev/gpu;c8=.dev/gpu" BUILDS="c2=--norm-cluster 2;c4=--norm-cluster 4;c8=--norm-cluster 8" \
        MODELS=${MODELS:-llama-3.1-8b llama-3.2-1b} BUCKETS=${BUCKETS:-1 8 32} CONTEXTS=${CONTEXTS:-80 2112} NEW_TOKENS=64 ROUNDS=${ROUNDS:-2} \
        bash testsuite/gpu/runtime_ab.sh >> "$log" 2>&1 || echo "ab failed: rc $?" | tee -a "$log"
      cat "$OUT/ab/summary.txt" >> "$log" 2> /dev/null || true
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
