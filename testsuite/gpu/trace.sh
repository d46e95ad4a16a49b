#!/usr/bin/env bash
# Where a replayed decode step's time goes, kernel by kernel (xmix bench --trace), in one device
# call: for each model of MODELS (default llama-3.1-8b), bucket of BUCKETS (default 32) and
# context of CONTEXTS (default 80 2112), the graph's time untraced, then one traced replay
# (every kernel stamps when its CTAs began, waited for the kernel ahead and ended), summarised
# by trace_summary.py; TEST_RUN (a -test.run pattern) runs GPU tests first
# (TestCUDATraceFollowsTheGraph checks the stamps against the graph's order). BUILD_FLAGS go to
# xmixc build, BENCH_FLAGS to xmix bench (e.g. --attn-splits 2); NEW_TOKENS (default 8)
# is the run ahead of the timed graphs, as in runtime_ab.sh (64: every position of the cache
# generated, as the grid's run.sh). Each
# launch's CTAs also say which SMs they ran on. APPS (app spec files) go into the build, and
# ENABLE (sets of app names, each comma-separated) traces each shape once more per set with
# every row enabling those apps (files -APP_APP), e.g.
# APPS=specs/apps/app3-conditional-refusal.yaml ENABLE=conditional-refusal: where an app's
# time goes. Build first (bash testsuite/gpu/build.sh), then:
#   run(command="OUT=\$OUT bash testsuite/gpu/trace.sh", carry=[".dev/gpu"])
# Writes $OUT/trace-MODEL-bBUCKET-cCONTEXT.json, $OUT/bench-*.json and $OUT/summary.txt.
. "$(dirname "$0")/start.sh"
if [ -n "${TEST_RUN:-}" ]; then
  XMIX_GPU_RESULTS=$OUT/tests.json timeout ${TEST_TIMEOUT:-400} "$B/gpu.test" -test.run "$TEST_RUN" -test.v > "$OUT/test.txt" 2>&1
  echo "tests rc=$?" | tee -a "$S"
  grep -E "^(=== RUN|--- |ok|FAIL|PASS)|rror|panic" "$OUT/test.txt" | cut -c1-300 | head -60 | tee -a "$S"
fi
for m in ${MODELS:-llama-3.1-8b}; do
  # shellcheck disable=SC2086 # APPS and BUILD_FLAGS are lists
  "$B/xmixc" build specs/models/$m.yaml ${APPS:-} -q ${BUILD_FLAGS:-} $(fit_flags specs/models/$m.yaml ${BUILD_FLAGS:-}) -o "$W/$m.xmb" || { echo "build of $m failed" | tee -a "$S"; exit 1; }
  for bucket in ${BUCKETS:-32}; do
    for ctx in ${CONTEXTS:-80 2112}; do
      for apps in "" ${ENABLE:-}; do
        f=$m-b$bucket-c$ctx${apps:+-${apps//,/_}}
        common=("$W/$m.xmb" --backend cuda --prompts $bucket --prompt-len 16 --new-tokens ${NEW_TOKENS:-8} --graph-buckets $bucket --graph-context $ctx --json -q ${apps:+--apps $apps --app-fraction 1} ${BENCH_FLAGS:-})
        timeout 120 "$B/xmix" bench "${common[@]}" > "$OUT/bench-$f.json" 2> "$W/e-$f.txt"
        echo "bench $f rc=$? graph_ms $(python3 -c "import json; print(json.load(open('$OUT/bench-$f.json')).get('graph_ms'))" 2>&1 | tail -1)" | tee -a "$S"
        timeout 120 "$B/xmix" bench "${common[@]}" --trace "$OUT/trace-$f.json" > "$OUT/bench-traced-$f.json" 2> "$W/et-$f.txt"
        echo "traced $f rc=$? graph_ms $(python3 -c "import json; print(json.load(open('$OUT/bench-traced-$f.json')).get('graph_ms'))" 2>&1 | tail -1)" | tee -a "$S"
        tail -3 "$W/et-$f.txt" | tee -a "$S"
        python3 "$(dirname "$0")/trace_summary.py" "$OUT/trace-$f.json" 2>&1 | tee -a "$S"
      done
    done
  done
done
