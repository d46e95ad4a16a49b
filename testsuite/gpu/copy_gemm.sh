#!/usr/bin/env bash
# The copy-engine GEMMs (codegen/gemm_copy.go) on the GPU, in one device call: the GPU tests
# that run them against the CPU (TestCUDACopyGemmMatchesCPU) and the 1B cut that has none,
# then the decode step of MODEL (a spec of specs/models, default llama-3.1-8b) in each bucket
# of BUCKETS (default 8; every row live)
# with them (--gemm auto) and without (--gemm cublaslt, the library for every GEMM), rounds
# alternating, at contexts CONTEXTS (default 80 576 2112), the compiled PyTorch step at the
# same shapes (prompts of CONTEXT - 64 tokens, its 64 steps on top), and the online workload
# under both (ONLINE=0 skips it; PEER=0 the peer, TESTS=0 the tests; PEER_MODEL names the
# peer's model where MODEL is a spec's copy, e.g. the 8B's with a KV pool that fits an H100:
# RESULTS.md, "Session 63"); between the tests and
# the timings, ptxas's registers and spills for the bundle's copy-engine kernels. ROLE_COSTS=1
# adds each GEMM role's cost inside the graph (xmix bench --role-costs) to every bench line.
# BUILD_FLAGS go to the bundle's xmixc build (e.g. "--copy-gemms 4096x4096,4096x28672
# --copy-gemm-slots 2": other shapes, shorter rings). VARIANTS="NAME=FLAGS;..." builds one
# more bundle per entry (BUILD_FLAGS, then FLAGS) and times it with --gemm auto beside the
# others in every round (bench key auto-NAME), e.g. VARIANTS="slots2=--copy-gemm-slots 2;
# gateup=--copy-gemms 4096x4096,4096x6144,14336x4096,4096x28672"; the online part and ptxas
# take the first bundle only. PREV_BIN (below) adds another build of xmix and xmixc.
# Build first (bash testsuite/gpu/build.sh), then:
#   run(command="OUT=\$OUT bash testsuite/gpu/copy_gemm.sh", carry=[".dev/gpu"])
# Writes $OUT/copy_gemm.json (each bench's graph ms, its role costs with ROLE_COSTS=1, the peer's
# and the online figures where run) and $OUT/summary.txt.
. "$(dirname "$0")/start.sh"
MODEL=${MODEL:-llama-3.1-8b}
[ -f "specs/models/$MODEL.yaml" ] || { echo "MODEL=$MODEL: no specs/models/$MODEL.yaml" | tee -a "$S"; exit 1; }
build_flags="${BUILD_FLAGS:-} $(fit_flags "specs/models/$MODEL.yaml" ${BUILD_FLAGS:-})"
if [ "${TESTS:-1}" = 1 ]; then
  XMIX_GPU_RESULTS=$OUT/tests.json timeout 400 "$B/gpu.test" -test.run "${TEST_RUN:-TestCUDACopyGemmMatchesCPU|TestCUDAMatchesCPUOnLlama1BCut}" -test.v > "$W/test.txt" 2>&1
  echo "tests rc=$?" | tee -a "$S"
  grep -E "^(=== RUN|--- |ok|FAIL|PASS)|rror|panic" "$W/test.txt" | cut -c1-300 | head -40 | tee -a "$S"
  python3 -c "
import json
for k, v in json.load(open('$OUT/tests.json')).items():
    if 'copy-gemm' in k or 'llama-3.2-1b' in k:
        print(k, json.dumps(v)[:240])" 2>&1 | tee -a "$S"
fi
"$B/xmixc" build "specs/models/$MODEL.yaml" -q $build_flags -o "$W/m.xmb" || { echo "build failed" | tee -a "$S"; exit 1; }
# The copy-engine kernels through ptxas: registers and spills.
. "$(dirname "$0")/ptxas.sh"
bin=$B ptxas_bundle "$W/m.xmb" "$W/ptx" "$W/ptxas.txt"
grep gemm_copy "$W/ptxas.txt" | tee -a "$S"
servers="cublaslt auto"
IFS=';' read -ra variants <<< "${VARIANTS:-}"
for v in ${variants[@]+"${variants[@]}"}; do
  "$B/xmixc" build "specs/models/$MODEL.yaml" -q $build_flags ${v#*=} -o "$W/m-${v%%=*}.xmb" || { echo "build of variant $v failed" | tee -a "$S"; exit 1; }
  servers="$servers auto-${v%%=*}"
done
# PREV_BIN: another build's xmix and xmixc (e.g. the commit before a kernel change), its
# bundle built with the same BUILD_FLAGS and timed with --gemm auto in every round (key
# auto-prev).
if [ -n "${PREV_BIN:-}" ]; then
  "$PREV_BIN/xmixc" build "specs/models/$MODEL.yaml" -q $build_flags -o "$W/m-prev.xmb" || { echo "build with $PREV_BIN failed" | tee -a "$S"; exit 1; }
  servers="$servers auto-prev"
fi
shapes=""
for bucket in ${BUCKETS:-8}; do
  for ctx in ${CONTEXTS:-80 576 2112}; do
    shapes="$shapes,$((ctx - 64)):$bucket"
    for round in $(seq ${ROUNDS:-2}); do
      for g in $servers; do
        f=${bucket}_${ctx}_${g}_$round
        xmb=$W/m.xmb bin=$B
        case $g in auto-*) xmb=$W/m-${g#auto-}.xmb ;; esac
        [ "$g" = auto-prev ] && bin=$PREV_BIN
        timeout 120 "$bin/xmix" bench "$xmb" --backend cuda --gemm ${g%%-*} --prompts $bucket --prompt-len 16 --new-tokens 8 \
          --graph-buckets $bucket --graph-context $ctx ${ROLE_COSTS:+--role-costs} --json -q > "$W/b_$f.json" 2> "$W/e_$f.txt"
        echo "bench bucket $bucket ctx $ctx $g round $round rc=$? $(python3 -c "
import json
d = json.load(open('$W/b_$f.json'))
r = {k: round(v, 3) for t in (d.get('role_cost_ms') or {}).values() for k, v in t.items() if k in ('qkv', 'o', 'down', 'gate_up', 'attention')}
print(d.get('graph_ms'), r or '')" 2>&1 | tail -1)" | tee -a "$S"
      done
    done
  done
done
if [ "${PEER:-1}" = 1 ]; then
  RES=$W timeout 300 python3 testsuite/gpu/torch_decode.py "${PEER_MODEL:-$MODEL}" "${shapes#,}" > "$W/peer.txt" 2>&1
  echo "peer rc=$?" | tee -a "$S"; tail -4 "$W/peer.txt" | tee -a "$S"
fi
if [ "${ONLINE:-1}" = 1 ]; then
  for g in cublaslt auto; do
    timeout 200 "$B/xmix" bench "$W/m.xmb" --backend cuda --gemm $g --online --requests 96 --rate 0 --output-len 32 --runs 1 --warmup 0 --json -q > "$W/online_$g.json" 2> "$W/online_$g.txt"
    echo "online $g rc=$? $(python3 -c "import json;d=json.load(open('$W/online_$g.json'));m=d['online']['mean'];print({k:round(m[k],3) for k in ('mean_itl_ms','p99_itl_ms','mean_ttft_ms','total_tok_per_s')})" 2>&1 | tail -1)" | tee -a "$S"
  done
fi
python3 - "$W" "$OUT/copy_gemm.json" "$MODEL" <<'PY'
import glob, json, os, sys
w, out, model = sys.argv[1:4]
d = {"model": model, "bench": {}}
for f in sorted(glob.glob(os.path.join(w, "b_*.json"))):
    key = os.path.basename(f)[2:-5]
    try:
        b = json.load(open(f))
        d["bench"][key] = b.get("graph_ms")
        if b.get("role_cost_ms"):
            d.setdefault("role_cost_ms", {})[key] = b["role_cost_ms"]
    except Exception as e:
        d["bench"][key] = str(e)
p = os.path.join(w, f"torch-{os.environ.get('PEER_MODEL') or model}.json")
if os.path.exists(p):
    d["peer"] = json.load(open(p))
for g in ("cublaslt", "auto") if os.environ.get("ONLINE", "1") == "1" else ():
    try:
        o = json.load(open(os.path.join(w, f"online_{g}.json")))
        d.setdefault("online", {})[g] = o["online"]["mean"]
    except Exception as e:
        d.setdefault("online", {})[g] = str(e)
json.dump(d, open(out, "w"), indent=1)
PY
tar -czf "$OUT/logs.tgz" -C "$W" --exclude='*.xmb' .
