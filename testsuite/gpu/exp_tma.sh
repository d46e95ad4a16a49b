#!/usr/bin/env bash
# temp experiment driver
set -u
export PATH=/usr/local/cuda/bin:$PATH
B=.dev/gpu
W=/tmp/expw; rm -rf $W; mkdir -p $W $OUT
for f in .dev/tmaptx/*.ptx; do echo "== $f"; ptxas -arch=sm_90 -v $f -o /dev/null 2>&1 | tail -4; done > $W/ptxas.txt 2>&1
grep -i "error\|registers" $W/ptxas.txt | head -20
if [ "${TEST:-1}" = 1 ]; then
XMIX_EXP_TMA=1 XMIX_EXP_TMA_2D=1 timeout 200 $B/gpu.test -test.run 'TestExpTMAMatchesCPU' -test.v > $W/test.txt 2>&1
grep -E "exp-tma|FAIL|ok|PASS|panic|rror" $W/test.txt | head -20
fi
MODELS=${MODELS:-llama-3.1-8b}
for m in $MODELS; do $B/xmixc build specs/models/$m.yaml -q -o /tmp/$m.xmb; done
venv() { case $1 in
  tma) echo XMIX_EXP_TMA=1 ;;
  kc512) echo XMIX_EXP_TMA=1 XMIX_EXP_TMA_KC=512 ;;
  kc128) echo XMIX_EXP_TMA=1 XMIX_EXP_TMA_KC=128 ;;
  deep) echo XMIX_EXP_TMA=1 XMIX_EXP_TMA_SMEM=200000 ;;
  bc32) echo XMIX_EXP_TMA=1 XMIX_EXP_TMA_BC16_BELOW=1 ;;
  bc32deep) echo XMIX_EXP_TMA=1 XMIX_EXP_TMA_BC16_BELOW=1 XMIX_EXP_TMA_SMEM=200000 ;;
  kc512s4) echo XMIX_EXP_TMA=1 XMIX_EXP_TMA_KC=512 XMIX_EXP_TMA_SMEM=140000 ;;
  kc512s6) echo XMIX_EXP_TMA=1 XMIX_EXP_TMA_KC=512 XMIX_EXP_TMA_SMEM=210000 ;;
  kc512a16) echo XMIX_EXP_TMA=1 XMIX_EXP_TMA_KC=512 XMIX_EXP_TMA_BC16_BELOW=100000 ;;
  kc1024) echo XMIX_EXP_TMA=1 XMIX_EXP_TMA_KC=1024 ;;
  kc1024a16) echo XMIX_EXP_TMA=1 XMIX_EXP_TMA_KC=1024 XMIX_EXP_TMA_BC16_BELOW=100000 ;;
  kc1024s3) echo XMIX_EXP_TMA=1 XMIX_EXP_TMA_KC=1024 XMIX_EXP_TMA_SMEM=210000 XMIX_EXP_TMA_BC16_BELOW=100000 ;;
  kc512nox) echo XMIX_EXP_TMA=1 XMIX_EXP_TMA_KC=512 XMIX_EXP_TMA_NOX=1 ;;
  kc512nomma) echo XMIX_EXP_TMA=1 XMIX_EXP_TMA_KC=512 XMIX_EXP_TMA_NOMMA=1 ;;
  kc512none) echo XMIX_EXP_TMA=1 XMIX_EXP_TMA_KC=512 XMIX_EXP_TMA_NOX=1 XMIX_EXP_TMA_NOMMA=1 ;;
  kc512s2) echo XMIX_EXP_TMA=1 XMIX_EXP_TMA_KC=512 XMIX_EXP_TMA_SMEM=70000 ;;
  kc256none) echo XMIX_EXP_TMA=1 XMIX_EXP_TMA_NOX=1 XMIX_EXP_TMA_NOMMA=1 ;;
  2d) echo XMIX_EXP_TMA=1 XMIX_EXP_TMA_2D=1 ;;
  2d512) echo XMIX_EXP_TMA=1 XMIX_EXP_TMA_2D=1 XMIX_EXP_TMA_KC=512 ;;
  2d512none) echo XMIX_EXP_TMA=1 XMIX_EXP_TMA_2D=1 XMIX_EXP_TMA_KC=512 XMIX_EXP_TMA_NOX=1 XMIX_EXP_TMA_NOMMA=1 ;;
  2dnone) echo XMIX_EXP_TMA=1 XMIX_EXP_TMA_2D=1 XMIX_EXP_TMA_NOX=1 XMIX_EXP_TMA_NOMMA=1 ;;
  2dnox) echo XMIX_EXP_TMA=1 XMIX_EXP_TMA_2D=1 XMIX_EXP_TMA_NOX=1 ;;
  2d512s2) echo XMIX_EXP_TMA=1 XMIX_EXP_TMA_2D=1 XMIX_EXP_TMA_KC=512 XMIX_EXP_TMA_SMEM=70000 ;;
  2d1024) echo XMIX_EXP_TMA=1 XMIX_EXP_TMA_2D=1 XMIX_EXP_TMA_KC=1024 ;;
  *) echo X=1 ;;
esac; }
for r in 1 2; do
  for m in $MODELS; do for bs in ${BATCHES:-8}; do for v in ${VARS:-lt ptx tma}; do
    prof=""; [ $r = 1 ] && [[ " ${PROF:-lt tma} " == *" $v "* ]] && prof="--profile --role-costs"
    g=ptx; [ $v = lt ] && g=auto
    env $(venv $v) timeout 150 $B/xmix bench /tmp/$m.xmb --backend cuda --gemm $g --prompts $bs --prompt-len ${PL:-16} --new-tokens 8 \
      --graph-buckets $bs --graph-context $(( ${PL:-16} + 64 )) $prof --json -q > $W/bench_${m}_${v}_b${bs}_r$r.json 2>> $W/bench.log || echo "fail $m $v $bs" >> $W/bench.log
  done; done; done
done
tail -5 $W/bench.log
python3 - $W <<'PY'
import json,glob,sys,os
for f in sorted(glob.glob(sys.argv[1]+'/bench_*.json')):
    try: d=json.load(open(f))
    except Exception as e: print(os.path.basename(f),'bad',e); continue
    print(os.path.basename(f), d.get('graph_ms'))
    rc=d.get('role_cost_ms')
    if rc: print('   roles', {k:round(v,3) for k,v in list(rc.values())[0].items()})
PY
tar -czf $OUT/exp.tgz -C $W .
