#!/usr/bin/env bash
# What a bundle with apps costs the CUDA backend's load between its weights and its first
# step: preparing every node list's launches, then capturing and instantiating their graphs.
# The shipped Llama-3.1-8B spec (synthetic weights, fit to the card) with APPS deployed,
# whose one-app node lists make eight graphs a template, loaded by `xmix run -n 1` with each
# variant's binaries in turn, ROUNDS times. Run on the GPU machine from the repository root
# with the binaries of build.sh carried (packed: pack.sh):
#   run(command="bash testsuite/gpu/load_graphs.sh", carry=[".dev/gpu"])
# Env: VARIANTS ("name=bindir;...", default "new=.dev/gpu"; the first one's xmixc builds the
# bundle), OUT, APPS (default specs/apps/app[1-6]-*.yaml), ROUNDS (3). A first run per
# variant, not counted, lets the driver compile and cache the kernels. Writes
# $OUT/load_graphs.tsv (round, variant, graphs, seconds to prepare and instantiate, of which
# preparing the launches, loaded in), $OUT/load_graphs.md and each variant's last progress
# output, $OUT/load_VARIANT.log (which GEMM servers it chose, to compare). PROFILE=1 also
# writes the Go CPU profile of each variant's last load (`xmix run --load-profile`) to
# $OUT/load_VARIANT.pprof, for `go tool pprof -top`.
set -euo pipefail
cd "$(dirname "$0")/../.."
. testsuite/gpu/fit.sh
OUT=${OUT:?set OUT}
mkdir -p "$OUT"
work=$(mktemp -d)
IFS=';' read -r -a variants <<< "${VARIANTS:-new=.dev/gpu}"
for v in "${variants[@]}"; do
  [ -x "${v#*=}/xmix" ] || { echo "VARIANTS: $v: no xmix in ${v#*=} (want name=bindir)" >&2; exit 2; }
done
# shellcheck disable=SC2206 # APPS is a list of specs (globs allowed)
apps=(${APPS:-specs/apps/app[1-6]-*.yaml})
spec=specs/models/llama-3.1-8b.yaml
card=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | head -1)
first=${variants[0]#*=}
# shellcheck disable=SC2046 # fit_flags is a list of flags
"$first/xmixc" build "$spec" "${apps[@]}" -q $(fit_flags "$spec") -o "$work/apps.xmb"
# load VARIANT BIN [FLAGS...]: one `xmix run -n 1` (FLAGS added), its graph line as
# "graphs<TAB>instantiated<TAB>prepared<TAB>loaded".
load() {
  "$2/xmix" run "$work/apps.xmb" --backend cuda -p Hello -n 1 "${@:3}" > /dev/null 2> "$work/err" ||
    { echo "$1: xmix run failed:" >&2; cat "$work/err" >&2; exit 1; }
  # "cuda: G graphs instantiated for T templates in S s (launches prepared in P s)"
  local g loaded
  g=$(sed -n 's/^cuda: \([0-9]*\) graphs instantiated for [0-9]* templates in \([0-9.]*\) s (launches prepared in \([0-9.]*\) s.*/\1\t\2\t\3/p' "$work/err")
  loaded=$(sed -n 's/.*: loaded in \([0-9.]*\)s$/\1/p' "$work/err")
  [ -n "$g" ] || { echo "$1: no graph line in xmix's progress:" >&2; cat "$work/err" >&2; exit 1; }
  printf '%s\t%s' "$g" "$loaded"
}
for v in "${variants[@]}"; do load "${v%%=*}" "${v#*=}" > /dev/null; done
tsv=$OUT/load_graphs.tsv
printf 'round\tvariant\tgraphs\tinstantiated_s\tprepared_s\tloaded_s\n' > "$tsv"
for r in $(seq 1 "${ROUNDS:-3}"); do
  for v in "${variants[@]}"; do
    prof=()
    [ "${PROFILE:-0}" = 1 ] && [ "$r" = "${ROUNDS:-3}" ] && prof=(--load-profile "$OUT/load_${v%%=*}.pprof")
    printf '%s\t%s\t%s\n' "$r" "${v%%=*}" "$(load "${v%%=*}" "${v#*=}" "${prof[@]}")" >> "$tsv"
    if [ "$r" = "${ROUNDS:-3}" ]; then cp "$work/err" "$OUT/load_${v%%=*}.log"; fi
  done
done
{
  echo "$card; $spec with ${#apps[*]} apps; \`xmix run -n 1\`, ${ROUNDS:-3} rounds after one uncounted run a variant"
  echo
  echo "| round | variant | graphs | prepared and instantiated s | launches prepared s | loaded in s |"
  echo "|---|---|---|---|---|---|"
  tail -n +2 "$tsv" | awk -F'\t' '{ printf "| %s | %s | %s | %s | %s | %s |\n", $1, $2, $3, $4, $5, $6 }'
} | tee "$OUT/load_graphs.md"
