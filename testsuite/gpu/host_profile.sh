#!/usr/bin/env bash
# Where the host's time between decode steps goes in the paper's online workload (apps.sh's
# online phase reports it as host_gap_us): Llama-3.1-8B's bundle with apps 1-6 built as
# apps.sh builds it, then for each of VARIANTS (default "bare refusal-ablation
# conditional-refusal hallucination-probe": the two apps that export a value a row and one
# that exports none; bare enables nothing, any other name that app on every request)
# one `xmix bench --online --rate 0 --requests REQUESTS (250) --output-len 128 --warmup 1
# --runs RUNS (3) --cpu-profile`, with GODEBUG=gctrace=1 so the Go collector's cycles are
# counted. Build first (bash testsuite/gpu/build.sh; bash testsuite/gpu/pack.sh .dev/gpu), then:
#   run(command="bash testsuite/gpu/pack.sh --unpack >/dev/null && OUT=\$OUT bash testsuite/gpu/host_profile.sh", carry=[".dev/pack"])
# Writes $OUT/NAME.pprof (read here with `go tool pprof -top $OUT/NAME.pprof`, the profile
# names its functions), $OUT/bench.json ({NAME: the bench's "online" result}) and
# $OUT/summary.txt (each variant's mean ITL, host gap and GC cycles a measured run).
. "$(dirname "$0")/start.sh"
apps=$(ls specs/apps/app[1-6]-*.yaml | tr '\n' ' ')
m=specs/models/llama-3.1-8b.yaml
# shellcheck disable=SC2086 # apps is a list
"$B/xmixc" build $m $apps -q $(fit_flags $m) -o "$W/l8.xmb" || { echo "build failed" | tee -a "$S"; exit 1; }
echo '{}' > "$OUT/bench.json"
for name in ${VARIANTS:-bare refusal-ablation conditional-refusal hallucination-probe}; do
  flags=
  [ "$name" = bare ] || flags="--apps $name"
  # shellcheck disable=SC2086 # flags is a list
  GODEBUG=gctrace=1 timeout 300 "$B/xmix" bench "$W/l8.xmb" --backend cuda --online --rate 0 --requests "${REQUESTS:-250}" \
    --output-len 128 --warmup 1 --runs "${RUNS:-3}" $flags --cpu-profile "$OUT/$name.pprof" --json -q > "$W/b.json" 2> "$W/e.txt"
  rc=$?
  gcs=$(grep -c '^gc [0-9]' "$W/e.txt")
  python3 - "$W/b.json" "$OUT/bench.json" "$name" "$rc" "$gcs" "${RUNS:-3}" <<'PY' | tee -a "$S"
import json, sys
src, dst, name, rc, gcs, runs = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]), int(sys.argv[6])
try:
    on = json.load(open(src))["online"]
except Exception as e:
    print(f"{name}: rc={rc}, no result ({e})")
    sys.exit(0)
all_ = json.load(open(dst))
all_[name] = on
json.dump(all_, open(dst, "w"), indent=1)
m = on["mean"]
print(f"{name}: rc={rc} mean ITL {m['mean_itl_ms']:.3f} ms, host gap {m['host_gap_us']:.1f} us a step over {m['steps']} steps, "
      f"{gcs} GC cycles in {runs + on['warmup_runs']} runs and the load")
PY
  [ $rc = 0 ] || tail -3 "$W/e.txt" | tee -a "$S"
done
