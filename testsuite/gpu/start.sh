# Sourced by the GPU scripts that write a summary as they go (copy_gemm.sh, trace.sh,
# runtime_ab.sh, offline_ab.sh): unset variables are errors, CUDA's tools are on PATH, B is the binaries'
# folder ($BIN, default .dev/gpu), OUT (required) exists, W is a scratch folder, S the summary
# file, whose first line is the GPU's name, memory, driver and clock. round_order R NAME...
# sets the array order to the names, reversed in even rounds R, so that no variant always
# runs first. fit_flags (fit.sh) gives the build flags that fit a spec on this card.
set -u
. "$(dirname "${BASH_SOURCE[0]}")/fit.sh"
export PATH=/usr/local/cuda/bin:$PATH
B=${BIN:-.dev/gpu}
OUT=${OUT:?set OUT}
mkdir -p "$OUT"
W=$(mktemp -d)
S=$OUT/summary.txt
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader | tee -a "$S"
round_order() {
  local r=$1 i
  shift
  order=("$@")
  if [ $((r % 2)) = 0 ]; then
    order=()
    for ((i = $#; i >= 1; i--)); do order+=("${!i}"); done
  fi
}
