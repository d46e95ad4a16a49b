#!/usr/bin/env bash
# The GPU test binary (build.sh's gpu.test), as run.sh's check part runs it:
#   bash testsuite/gpu/gpu_tests.sh BIN WORK
# writes WORK/checks.log (the -test.v output, ending "exit STATUS") and WORK/checks.json (what
# the tests recorded). TEST_RUN / TEST_SKIP pick tests (gpu.test's -test.run / -test.skip),
# TEST_TIMEOUT bounds a process (default 300s).
#
# TEST_SHARDS=N (default 1) runs the top-level tests TEST_RUN selects (default all) in N
# processes at once, dealt round-robin in gpu.test's order, so that one test's CPU reference
# runs while another's kernels do (each process holds a CUDA context of its own on the one
# GPU); checks.log holds each shard's log in turn, each ending with its exit status, and
# checks.json their records merged. With shards, TEST_RUN names top-level tests only.
set -uo pipefail
bin=${1:?usage: gpu_tests.sh BIN WORK}
work=${2:?usage: gpu_tests.sh BIN WORK}
shards=${TEST_SHARDS:-1}
case "$shards" in
  '' | *[!0-9]* | 0) echo "TEST_SHARDS=$shards: want a count of processes, 1 or more" >&2; exit 2 ;;
esac

# run_tests OUT_STEM RUN_REGEX: one gpu.test process over the tests RUN_REGEX selects.
run_tests() {
  XMIX_GPU_RESULTS="$1.json" "$bin/gpu.test" -test.v -test.timeout "${TEST_TIMEOUT:-300s}" \
    ${2:+-test.run "$2"} ${TEST_SKIP:+-test.skip "$TEST_SKIP"} > "$1.log" 2>&1
  echo "exit $?" >> "$1.log"
}

if [ "$shards" = 1 ]; then
  run_tests "$work/checks" "${TEST_RUN:-}"
  exit 0
fi

mapfile -t tests < <("$bin/gpu.test" -test.list "${TEST_RUN:-.}" | grep '^Test')
if [ ${#tests[@]} = 0 ]; then
  echo "gpu_tests.sh: no test matches TEST_RUN=${TEST_RUN:-.}" | tee "$work/checks.log" >&2
  echo "exit 1" >> "$work/checks.log"
  exit 0
fi
shards=$((shards < ${#tests[@]} ? shards : ${#tests[@]}))
for s in $(seq 0 $((shards - 1))); do
  names=()
  for ((i = s; i < ${#tests[@]}; i += shards)); do names+=("${tests[i]}"); done
  run_tests "$work/checks-$s" "^($(IFS='|'; echo "${names[*]}"))\$" &
done
wait
: > "$work/checks.log"
for s in $(seq 0 $((shards - 1))); do
  echo "=== shard $((s + 1)) of $shards" >> "$work/checks.log"
  cat "$work/checks-$s.log" >> "$work/checks.log"
done
python3 - "$work" "$shards" <<'EOF'
import json, os, sys
work, shards = sys.argv[1], int(sys.argv[2])
paths = [p for p in (os.path.join(work, f"checks-{s}.json") for s in range(shards)) if os.path.exists(p)]
if paths:  # gpu.test writes its records only where it found a GPU
    merged = {}
    for p in paths:
        merged.update(json.load(open(p)))
    json.dump(merged, open(os.path.join(work, "checks.json"), "w"), indent=2, sort_keys=True)
EOF
