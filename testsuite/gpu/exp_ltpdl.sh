#!/usr/bin/env bash
# EXPERIMENT driver (session 31): cuBLASLt's kernel launched early behind the cast
# (XMIX_EXP_LTPDL: the cast asks for its dependents first, and the GEMM node takes a
# programmatic edge from it). Writes $OUT/summary.txt as it goes.
set -u
export PATH=/usr/local/cuda/bin:$PATH
B=.dev/gpu; mkdir -p $OUT; W=/tmp/expw; rm -rf $W; mkdir -p $W
S=$OUT/summary.txt
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader >> $S
for m in ${MODELS:-llama-3.1-8b}; do
  [ -f /tmp/$m.xmb ] || $B/xmixc build specs/models/$m.yaml -q -o /tmp/$m.xmb
done
venv() { case $1 in pdl) echo XMIX_EXP_LTPDL=start ;; pdlend) echo XMIX_EXP_LTPDL=end ;; nocast) echo XMIX_EXP_NOCAST=1 ;; pdlnocast) echo XMIX_EXP_NOCAST=1 XMIX_EXP_LTPDL=start ;; *) echo X=1 ;; esac; }
for r in $(seq 1 ${ROUNDS:-2}); do
 for m in ${MODELS:-llama-3.1-8b}; do
  for v in ${VARS:-lt pdl}; do
   t0=$(date +%s)
   env $(venv $v) timeout ${TO:-90} $B/xmix bench /tmp/$m.xmb --backend cuda --prompts ${BS:-128} --prompt-len ${PL:-16} --new-tokens 8 \
    --graph-buckets ${BUCKETS:-8,32,128} --graph-context ${CTX:-80} --json -q > $W/b_${m}_${v}_${r}.json 2> $W/e_${m}_${v}_${r}.txt
   python3 -c "
import json
try:
  d=json.load(open('$W/b_${m}_${v}_${r}.json')); print('$r $m $v', json.dumps(d.get('graph_ms')), '$(( $(date +%s) - t0 ))s')
except Exception as e: print('$r $m $v fail', open('$W/e_${m}_${v}_${r}.txt').read()[-600:])
" >> $S
   grep -m1 exp-ltpdl $W/e_${m}_${v}_${r}.txt >> $S
  done
 done
done
if [ -n "${ONLINE:-1}" ]; then
  for v in ${OVARS:-lt pdl}; do
    env $(venv $v) timeout ${TOO:-120} $B/xmix bench /tmp/llama-3.1-8b.xmb --backend cuda --online --requests ${REQ:-96} --rate 0 --output-len 32 \
      --runs 1 --warmup 0 --json -q > $W/o_$v.json 2> $W/oe_$v.txt
    echo "online $v $(grep -oE '"(tokens_sha256|mean_itl_ms)": *"?[^,"]+' $W/o_$v.json | head -4 | tr '\n' ' ') $(tail -c 300 $W/oe_$v.txt)" >> $S
  done
fi
if [ -n "${TESTS:-1}" ]; then
  for v in ${TVARS:-lt pdl}; do
    env $(venv $v) timeout ${TOT:-200} $B/gpu.test -test.run "${TESTRE:-TestCUDAMatchesCPUOnLlama1BCut|TestCUDABuildKeepsBits}" -test.v > $W/test_$v.txt 2>&1
    echo "tests $v: $(grep -cE '^--- PASS|^    --- PASS' $W/test_$v.txt) pass, $(grep -cE -- '--- FAIL' $W/test_$v.txt) fail" >> $S
    grep -E "FAIL|panic|rel err|relative error" $W/test_$v.txt | head -5 >> $S
  done
fi
if [ -n "${PEER:-}" ]; then
  mkdir -p $W/peer; RES=$W/peer timeout ${TOP:-200} python3 testsuite/gpu/torch_decode.py llama-3.1-8b $PEER > $W/peer.txt 2>&1
  tail -5 $W/peer.txt >> $S
fi
cat $S; tar -czf $OUT/w.tgz -C $W .
