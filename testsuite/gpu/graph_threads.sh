#!/usr/bin/env bash
# What capturing a bundle's CUDA graphs on several threads saves at load (`xmix
# --graph-threads`), and that it computes the same: the shipped Llama-3.1-8B spec (synthetic
# weights, fit to the card) with APPS deployed, whose one-app lists make eight graphs a
# template, loaded by `xmix run -n 1` with each thread count of THREADS in turn, ROUNDS times;
# then TestCUDAGraphThreadsMatchCPU (TESTS=0 skips it). Run on the GPU machine from the
# repository root, the binaries of build.sh carried:
#   run(command="bash testsuite/gpu/graph_threads.sh", carry=[".dev/gpu"])
# Env: XMIX_BIN (.dev/gpu), OUT, APPS (default specs/apps/app[1-6]-*.yaml), THREADS ("1 8"),
# ROUNDS (2). Writes $OUT/graph_threads.tsv (round, threads, graphs, seconds to instantiate,
# seconds to prepare the launches, loaded in), $OUT/graph_threads.md and, with the test,
# $OUT/checks.log and $OUT/checks.json.
set -euo pipefail
cd "$(dirname "$0")/../.."
. testsuite/gpu/fit.sh
bin=${XMIX_BIN:-.dev/gpu}
OUT=${OUT:?set OUT}
mkdir -p "$OUT"
work=$(mktemp -d)
# shellcheck disable=SC2206 # APPS is a list of specs (globs allowed)
apps=(${APPS:-specs/apps/app[1-6]-*.yaml})
spec=specs/models/llama-3.1-8b.yaml
card=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | head -1)
echo "$card" > "$OUT/card.txt"
# shellcheck disable=SC2046 # fit_flags is a list of flags
"$bin/xmixc" build "$spec" "${apps[@]}" -q $(fit_flags "$spec") -o "$work/apps.xmb"
tsv=$OUT/graph_threads.tsv
printf 'round\tthreads\tgraphs\tinstantiated_s\tprepared_s\tloaded_s\n' > "$tsv"
for r in $(seq 1 "${ROUNDS:-2}"); do
  for n in ${THREADS:-1 8}; do
    "$bin/xmix" run "$work/apps.xmb" --backend cuda -p Hello -n 1 --graph-threads "$n" > /dev/null 2> "$work/err" ||
      { cat "$work/err" >&2; exit 1; }
    # "cuda: G graphs instantiated for T templates in S s (launches prepared in P s, ..."
    sed -n 's/^cuda: \([0-9]*\) graphs instantiated for [0-9]* templates in \([0-9.]*\) s (launches prepared in \([0-9.]*\) s.*/\1\t\2\t\3/p' "$work/err" > "$work/g"
    loaded=$(sed -n 's/.*: loaded in \([0-9.]*\)s$/\1/p' "$work/err")
    [ -s "$work/g" ] || { echo "no graph line in xmix's progress:" >&2; cat "$work/err" >&2; exit 1; }
    printf '%s\t%s\t%s\t%s\n' "$r" "$n" "$(cat "$work/g")" "$loaded" >> "$tsv"
  done
done
{
  echo "$card; $spec with ${#apps[*]} apps; \`xmix run -n 1 --graph-threads N\`, ${ROUNDS:-2} rounds"
  echo
  echo "| round | threads | graphs | instantiated s | launches prepared s | loaded in s |"
  echo "|---|---|---|---|---|---|"
  tail -n +2 "$tsv" | awk -F'\t' '{ printf "| %s | %s | %s | %s | %s | %s |\n", $1, $2, $3, $4, $5, $6 }'
} | tee "$OUT/graph_threads.md"
if [ "${TESTS:-1}" = 1 ]; then
  TEST_RUN='^TestCUDAGraphThreadsMatchCPU$' bash testsuite/gpu/gpu_tests.sh "$bin" "$OUT"
  grep -- '--- \|^exit' "$OUT/checks.log"
fi
