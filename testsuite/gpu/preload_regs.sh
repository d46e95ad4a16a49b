#!/usr/bin/env bash
# Do the apps' preloading add+norm kernels find room beside the GEMM ahead? For each build
# of VARIANTS (name=xmixc build flags; by default the default build, whose preloading kernels
# are held to 48 registers, the build without that bound, and the default with coherent
# preloads): trace.sh at BUCKETS (default
# "8 16 32") and context 576 with apps 1-6 in the bundle, bare and with every row enabling
# all six; then apps_ab.sh, each variant but the first against the first (BUCKETS_AB,
# default "8 16 32 128", one row preloading nothing; ROUNDS, default 2). The trace gives each
# launch's CTAs that began only after the launch ahead had ended (late) and a thread's
# registers as the driver compiled the kernel: at 1024 threads a block, an add+norm of more
# than 48 fits no SM beside an 8-row copy-engine GEMM's CTA (512 threads at 32 registers),
# which the 8B's o and down place on 128 of 132 SMs (testsuite/gpu/RESULTS.md, session 69).
# TRACE=0 or AB=0 leaves a part out: an A/B of four buckets and two rounds took about 5
# minutes on an H100 (session 68) and the traces are not yet timed, so one call of at most
# 10 minutes may not hold the whole run. Build first (bash testsuite/gpu/build.sh; bash
# testsuite/gpu/pack.sh .dev/gpu), then:
#   run(command="bash testsuite/gpu/pack.sh --unpack >/dev/null && OUT=\$OUT bash testsuite/gpu/preload_regs.sh", carry=[".dev/pack"])
# Writes $OUT/trace-NAME/ (trace.sh's files), $OUT/ab-NAME/ (apps_ab.sh's) and
# $OUT/late.txt: each traced norm kernel's late CTAs and registers, variant by variant.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:?set OUT}
mkdir -p "$OUT"
IFS=';' read -ra variants <<< "${VARIANTS:-base=;nr0=--mi-preload-regs 0;pvc48=--mi-preload-coherent}"
apps=$(ls specs/apps/app[1-6]-*.yaml | tr '\n' ' ')
all6=refusal-ablation,seal,conditional-refusal,hallucination-probe,sake,side-effect-free
for v in "${variants[@]}"; do
  [ "${TRACE:-1}" = 1 ] || break
  name=${v%%=*} flags=${v#*=}
  echo "[$(date +%T)] trace $name: ${flags:-default}" >&2
  OUT=$OUT/trace-$name BUILD_FLAGS=$flags APPS=$apps ENABLE=$all6 BUCKETS=${BUCKETS:-8 16 32} CONTEXTS=576 \
    bash testsuite/gpu/trace.sh > "$OUT/trace-$name.log" 2>&1 || echo "trace $name failed: trace-$name.log" >&2
done
python3 - "$OUT" "${variants[@]%%=*}" > "$OUT/late.txt" <<'PY'
import glob, json, os, sys
out, names = sys.argv[1], sys.argv[2:]
print("variant trace role launches late_ctas/launch regs")
for name in names:
    for path in sorted(glob.glob(os.path.join(out, f"trace-{name}", "trace-*.json"))):
        for tmpl, spans in json.load(open(path)).items():
            roles = {}
            for s in spans:
                if "norm" in s["kernel"] or s["kernel"].startswith("embed"):
                    r = roles.setdefault(s["kernel"], [0, 0, s.get("regs", 0)])
                    r[0] += 1
                    r[1] += s.get("late_ctas", 0)
            for k, (n, late, regs) in sorted(roles.items()):
                print(f"{name} {os.path.basename(path)}:{tmpl} {k} {n} {late / n:.2f} {regs}")
PY
cat "$OUT/late.txt" >&2
base=${variants[0]#*=}
for v in "${variants[@]:1}"; do
  [ "${AB:-1}" = 1 ] || break
  name=${v%%=*} flags=${v#*=}
  echo "[$(date +%T)] apps_ab $name: ${flags} against ${base:-the default}" >&2
  OUT=$OUT/ab-$name PREV_BIN=${BIN:-.dev/gpu} PREV_BUILD=$base NEW_BUILD=$flags BUCKETS=${BUCKETS_AB:-8 16 32 128} \
    ROUNDS=${ROUNDS:-2} GRAPH_ITERS=${GRAPH_ITERS:-200} ROUND_BUDGET_S=${ROUND_BUDGET_S:-110} \
    bash testsuite/gpu/apps_ab.sh > "$OUT/ab-$name.log" 2>&1 || echo "apps_ab $name failed: ab-$name.log" >&2
done
