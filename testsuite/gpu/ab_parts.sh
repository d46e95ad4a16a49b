# Sourced by the one-call scripts that run in parts (gated8_ab.sh, rope_ab.sh), from
# the repository root. ab_begin DEFAULT KNOWN...: unset variables and failures are errors,
# CUDA's tools are on PATH, OUT (required) exists, log is OUT/log.txt, whose first line is the
# GPU's name, memory, driver and clock, and parts is PARTS (default DEFAULT), each checked to
# be one of KNOWN. ab_tests PATTERN SHARDS runs the GPU tests PATTERN names (gpu_tests.sh
# over SHARDS processes), their verdicts into the log and their records into OUT/test.
ab_begin() {
  set -euo pipefail
  OUT=${OUT:?set OUT}
  mkdir -p "$OUT"
  log=$OUT/log.txt
  export PATH=/usr/local/cuda/bin:$PATH
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader | tee -a "$log"
  parts=${PARTS:-$1}
  shift
  local part
  for part in $parts; do
    case " $* " in *" $part "*) ;; *) echo "unknown part $part ($*)" | tee -a "$log"; exit 2 ;; esac
  done
}

ab_tests() {
  local w
  w=$(mktemp -d)
  TEST_SHARDS=$2 TEST_RUN=$1 bash testsuite/gpu/gpu_tests.sh .dev/gpu "$w" > /dev/null 2>&1 ||
    echo "test failed: rc $?" | tee -a "$log"
  grep -E -- '--- (PASS|FAIL|SKIP)|gpu_test.go|^exit' "$w/checks.log" >> "$log" || true
  mkdir -p "$OUT/test"
  cp "$w/checks.json" "$OUT/test/" 2>> "$log" || true
}
