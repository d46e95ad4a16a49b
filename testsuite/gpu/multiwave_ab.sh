#!/usr/bin/env bash
# The preloading add+norm kernels' register bound in templates of more than 128 rows (the
# default since 1c4278b: 32 there, 48 in smaller templates) against the bound before it (48
# everywhere, `xmixc build --mi-preload-regs-multi-wave 0`), side by side in one device call,
# with each app of NAMES (default "refusal-ablation side-effect-free"; specs/apps/app*-NAME.yaml)
# enabled on every row:
#  step     runtime_ab.sh: Llama-3.1-8B at BUCKETS (default "32 128 256") and context 576,
#           the bare bundle and each app under both bounds (variants NAME and NAME48), ROUNDS
#           (default 3) rounds
#  prefill  app_prefill.sh once per bound: 32 prompts of 1000 tokens, each app enabled and not
# PARTS (default "step prefill") picks some. Build first (bash testsuite/gpu/build.sh; bash
# testsuite/gpu/pack.sh .dev/gpu), then:
#   run(command="bash testsuite/gpu/pack.sh --unpack >/dev/null && OUT=\$OUT bash testsuite/gpu/multiwave_ab.sh", carry=[".dev/pack"])
# Writes $OUT/log.txt, $OUT/step/{runtime_ab.json,summary.txt} and
# $OUT/prefill-{default,mw0}/{offline_ab.json,summary.txt}.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:?set OUT}
mkdir -p "$OUT"
log=$OUT/log.txt
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader | head -1 | tee -a "$log"
names=${NAMES:-refusal-ablation side-effect-free}
apps= variants="bare=.dev/gpu" builds=
for n in $names; do
  spec=$(ls specs/apps/app*-"$n".yaml 2>/dev/null | head -1)
  [ -n "$spec" ] || { echo "NAMES: no spec specs/apps/app*-$n.yaml" | tee -a "$log"; exit 2; }
  apps="$apps $spec"
  variants="$variants;$n=.dev/gpu -- --apps $n;${n}48=.dev/gpu -- --apps $n"
done
for n in $names; do builds="$builds;$n=$apps;${n}48=$apps --mi-preload-regs-multi-wave 0"; done
builds=${builds#;}
for part in ${PARTS:-step prefill}; do
  echo "[$(date +%T)] $part" | tee -a "$log"
  case $part in
    step)
      OUT=$OUT/step ROUNDS=${ROUNDS:-3} MODELS=llama-3.1-8b BUCKETS=${BUCKETS:-32 128 256} CONTEXTS=576 \
        VARIANTS=$variants BUILDS=$builds \
        bash testsuite/gpu/runtime_ab.sh >> "$log" 2>&1 || echo "step failed: rc $?" | tee -a "$log"
      ;;
    prefill)
      for bound in default mw0; do
        flags=
        [ "$bound" = mw0 ] && flags="--mi-preload-regs-multi-wave 0"
        OUT=$OUT/prefill-$bound BUILD_FLAGS=$flags APPS=$apps ENABLE=$names \
          bash testsuite/gpu/app_prefill.sh >> "$log" 2>&1 || echo "prefill $bound failed: rc $?" | tee -a "$log"
      done
      ;;
    *) echo "PARTS: unknown part $part (step, prefill)" | tee -a "$log"; exit 2 ;;
  esac
done
echo "[$(date +%T)] done" | tee -a "$log"
