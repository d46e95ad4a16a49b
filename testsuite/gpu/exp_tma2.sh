#!/usr/bin/env bash
set -u
export PATH=/usr/local/cuda/bin:$PATH
B=.dev/gpu; mkdir -p $OUT; W=/tmp/exp2w; rm -rf $W; mkdir -p $W
S=$OUT/summary.txt
for f in .dev/tmaptx/*.ptx; do ptxas -arch=sm_90 -v $f -o /dev/null 2>&1 | grep -i "error\|registers" | head -2; done > $W/ptxas.txt 2>&1
head -4 $W/ptxas.txt >> $S
$B/xmixc build specs/models/llama-3.1-8b.yaml -q -o /tmp/l8.xmb
venv() { case $1 in
  2d512) echo XMIX_EXP_TMA=1 XMIX_EXP_TMA_2D=1 XMIX_EXP_TMA_KC=512 ;;
  2d512p) echo XMIX_EXP_TMA=1 XMIX_EXP_TMA_2D=1 XMIX_EXP_TMA_KC=512 XMIX_EXP_TMA_PMAP=1 ;;
  2dp) echo XMIX_EXP_TMA=1 XMIX_EXP_TMA_2D=1 XMIX_EXP_TMA_PMAP=1 ;;
  2d512pnone) echo XMIX_EXP_TMA=1 XMIX_EXP_TMA_2D=1 XMIX_EXP_TMA_KC=512 XMIX_EXP_TMA_PMAP=1 XMIX_EXP_TMA_NOX=1 XMIX_EXP_TMA_NOMMA=1 ;;
  2d1024p) echo XMIX_EXP_TMA=1 XMIX_EXP_TMA_2D=1 XMIX_EXP_TMA_KC=1024 XMIX_EXP_TMA_PMAP=1 ;;
  kc512) echo XMIX_EXP_TMA=1 XMIX_EXP_TMA_KC=512 ;;
  *) echo X=1 ;;
esac; }
for v in ${VARS:-lt 2d512p 2d512}; do
  g=ptx; [ $v = lt ] && g=auto
  prof=""; [[ " ${PROF:-} " == *" $v "* ]] && prof="--profile --role-costs"
  env $(venv $v) timeout ${TO:-25} $B/xmix bench /tmp/l8.xmb --backend cuda --gemm $g --prompts 8 --prompt-len 16 --new-tokens 8 \
    --graph-buckets 8 --graph-context 80 $prof --json -q > $W/b_$v.json 2> $W/e_$v.txt
  rc=$?
  python3 -c "
import json,sys
try:
  d=json.load(open('$W/b_$v.json')); rc=d.get('role_cost_ms')
  print('$v', d.get('graph_ms'), {k:round(x,3) for k,x in list(rc.values())[0].items()} if rc else '')
except Exception as e: print('$v rc=$rc', [l for l in open('$W/e_$v.txt').read().splitlines() if 'rror' in l][:4])
" >> $S
done
cat $S; tar -czf $OUT/w.tgz -C $W .
