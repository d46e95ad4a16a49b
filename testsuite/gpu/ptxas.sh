# Run on its own, on any machine with ptxas on the PATH (no GPU: Debian's nvidia-cuda-toolkit
# has one), it assembles every kernel of the bundles run.sh's check part builds, and of those
# EXTRA names ("NAME=MODEL [FLAGS];...", each built by xmixc build MODEL FLAGS):
#   bash testsuite/gpu/ptxas.sh BIN WORK
# writes WORK/ptxas.txt (a line per kernel, as below) and prints the count of kernels that
# assemble, fail and spill.
#
# build_bundles WORK CHECK (with $bin the binaries' folder): run.sh's bundles into WORK; with
# CHECK=1 also the shipped apps', Gemma 2's and the per-request slots' (for ptxas and the
# checks). GEMM_AB=0 and MOE_AB=0 leave out the staged-GEMM and grouped-MoE builds.
. "$(dirname "${BASH_SOURCE[0]}")/fit.sh"
build_bundles() {
  local work=$1 check=${2:-0} x="$bin/xmixc" l8
  l8="specs/models/llama-3.1-8b.yaml $(fit_flags specs/models/llama-3.1-8b.yaml)"
  "$x" build specs/models/tiny.yaml specs/apps/tiny-steer.yaml specs/apps/tiny-probe.yaml -q --embed-weights -o "$work/tiny.xmb"
  "$x" build specs/models/llama-3.2-1b.yaml -q -o "$work/llama-3.2-1b.xmb"
  "$x" build $l8 -q -o "$work/llama-3.1-8b.xmb"
  [ "${GEMM_AB:-1}" = 1 ] && "$x" build $l8 --gemm tc-staged -q -o "$work/llama-3.1-8b-staged.xmb"
  [ "${MOE_AB:-1}" = 1 ] && "$x" build specs/models/mixtral-8x7b.yaml --moe grouped -q -o "$work/mixtral-8x7b-moegrouped.xmb"
  "$x" build specs/models/qwen3-8b.yaml -q -o "$work/qwen3-8b.xmb"
  "$x" build specs/models/mixtral-8x7b.yaml -q -o "$work/mixtral-8x7b.xmb"
  [ "$check" = 1 ] || return 0
  # The shipped apps' kernels, for ptxas (the checks and benchmarks use the bundles above).
  "$x" build $l8 specs/apps/app[1-6]-*.yaml -q -o "$work/llama-3.1-8b-apps1-6.xmb"
  "$x" build specs/models/mixtral-8x7b.yaml specs/apps/app7-steermoe.yaml -q -o "$work/mixtral-8x7b-app7.xmb"
  "$x" build $l8 specs/apps/grid/*.yaml -q -o "$work/llama-3.1-8b-grid.xmb"
  # Gemma 2's kernels (GeGLU, post-norms, soft-capped and sliding-window attention at head
  # dim 256, the logits' soft-cap), bare and with ops fused into GeGLU and the post-normed adds.
  "$x" build specs/models/gemma-2-2b.yaml -q -o "$work/gemma-2-2b.xmb"
  "$x" build specs/models/gemma-2-9b.yaml -q -o "$work/gemma-2-9b.xmb"
  "$x" build specs/models/gemma-2-2b.yaml testsuite/gpu/gemma2-apps.yaml -q -o "$work/gemma-2-2b-apps.xmb"
  # Per-request vector slots and layer masks (row, SiLU and standalone MI kernels).
  "$x" build $l8 specs/apps/per-request.yaml -q -o "$work/llama-3.1-8b-per-request.xmb"
}

# ptxas_bundle BUNDLE PTXDIR LOG (sourced by run.sh and fuse_ab.sh): writes the bundle's
# kernels under PTXDIR (xmixc ptx, with $bin the binaries' folder), assembles each with
# ptxas for its .target (sm_90, or sm_90a for the warpgroup MMAs) and appends a line per kernel to LOG: "ok NAME KERNEL regs=R
# spill_stores=S [early_loads=L]" or "FAIL NAME KERNEL <ptxas's first lines>", NAME the bundle's
# file name without .xmb. Where cuobjdump is on the PATH too, L is the global loads (LDG) of a
# kernel launched early that ptxas placed ahead of its wait for the grid ahead (ACQBULK): the
# loads it issues while that grid still runs.
ptxas_bundle() {
  local b=$1 dir=$2 out=$3 name msg regs spill f arch early
  name=$(basename "$b" .xmb)
  "$bin/xmixc" ptx "$b" -d "$dir" 2>/dev/null
  for f in "$dir"/*.ptx; do
    arch=$(awk '$1 == ".target" {print $2; exit}' "$f")
    if msg=$(ptxas -arch="${arch:-sm_90}" -v "$f" -o "${f%.ptx}.cubin" 2>&1); then
      regs=$(echo "$msg" | grep -o 'Used [0-9]* registers' | head -1 | grep -o '[0-9]*')
      spill=$(echo "$msg" | grep -o '[0-9]* bytes spill stores' | head -1 | grep -o '^[0-9]*')
      early=
      if command -v cuobjdump > /dev/null && grep -q griddepcontrol.wait "$f"; then
        early=" early_loads=$(cuobjdump -sass "${f%.ptx}.cubin" | awk '/ACQBULK/ {exit} /LDG/ {n++} END {print n + 0}')"
      fi
      rm -f "${f%.ptx}.cubin"
      echo "ok $name $(basename "$f" .ptx) regs=${regs:-?} spill_stores=${spill:-0}$early" >> "$out"
    else
      echo "FAIL $name $(basename "$f" .ptx) $(echo "$msg" | head -3 | tr '\n' ' ')" >> "$out"
    fi
  done
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  set -eu
  bin=${1:?usage: ptxas.sh BIN WORK}
  work=${2:?usage: ptxas.sh BIN WORK}
  cd "$(dirname "$0")/../.."
  mkdir -p "$work/ptx"
  build_bundles "$work" 1
  IFS=';' read -ra extra <<< "${EXTRA:-}"
  for e in "${extra[@]}"; do
    # shellcheck disable=SC2086 # the model and its flags are words
    "$bin/xmixc" build ${e#*=} -q -o "$work/${e%%=*}.xmb"
  done
  : > "$work/ptxas.txt"
  for b in "$work"/*.xmb; do
    ptxas_bundle "$b" "$work/ptx/$(basename "$b" .xmb)" "$work/ptxas.txt"
  done
  echo "ptxas $(ptxas --version | grep -o "release.*"): $(grep -c '^ok' "$work/ptxas.txt") kernels assemble, $(grep -c '^FAIL' "$work/ptxas.txt") fail, $(grep '^ok' "$work/ptxas.txt" | grep -Evc 'spill_stores=0( |$)') spill"
fi
