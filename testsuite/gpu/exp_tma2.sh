#!/usr/bin/env bash
# EXPERIMENT driver (session 30): the tensor-map form of the 8-row copy-engine GEMM, and every
# kernel's shared-memory carveout pinned (XMIX_EXP_CARVEOUT). Writes $OUT/summary.txt as it goes.
set -u
export PATH=/usr/local/cuda/bin:$PATH
B=.dev/gpu; mkdir -p $OUT; W=/tmp/exp2w; rm -rf $W; mkdir -p $W
S=$OUT/summary.txt
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader >> $S
for f in .dev/tmaptx/*.ptx; do echo "$f $(ptxas -arch=sm_90 -v $f -o /dev/null 2>&1 | grep -i 'error\|registers' | head -2 | tr '\n' ' ')"; done > $W/ptxas.txt 2>&1
cut -c1-300 $W/ptxas.txt >> $S
$B/xmixc build specs/models/llama-3.1-8b.yaml -q -o /tmp/l8.xmb
venv() { case $1 in
  lt|ptx) echo X=1 ;;
  lt_c100|ptx_c100|lt_bs1_c100) echo XMIX_EXP_CARVEOUT=100 ;;
  lt_c25|lt_bs1_c25) echo XMIX_EXP_CARVEOUT=25 ;;
  lt_c0|lt_bs1_c0) echo XMIX_EXP_CARVEOUT=0 ;;
  kc512) echo XMIX_EXP_TMA=1 XMIX_EXP_TMA_KC=512 ;;
  kc512_c100) echo XMIX_EXP_TMA=1 XMIX_EXP_TMA_KC=512 XMIX_EXP_CARVEOUT=100 ;;
  2d512p) echo XMIX_EXP_TMA=1 XMIX_EXP_TMA_2D=1 XMIX_EXP_TMA_KC=512 XMIX_EXP_TMA_PMAP=1 ;;
  2d512p_c100) echo XMIX_EXP_TMA=1 XMIX_EXP_TMA_2D=1 XMIX_EXP_TMA_KC=512 XMIX_EXP_TMA_PMAP=1 XMIX_EXP_CARVEOUT=100 ;;
  2d512pnone) echo XMIX_EXP_TMA=1 XMIX_EXP_TMA_2D=1 XMIX_EXP_TMA_KC=512 XMIX_EXP_TMA_PMAP=1 XMIX_EXP_TMA_NOX=1 XMIX_EXP_TMA_NOMMA=1 ;;
  2d512pnone_c100) echo XMIX_EXP_TMA=1 XMIX_EXP_TMA_2D=1 XMIX_EXP_TMA_KC=512 XMIX_EXP_TMA_PMAP=1 XMIX_EXP_TMA_NOX=1 XMIX_EXP_TMA_NOMMA=1 XMIX_EXP_CARVEOUT=100 ;;
  2d512p_s2) echo XMIX_EXP_TMA=1 XMIX_EXP_TMA_2D=1 XMIX_EXP_TMA_KC=512 XMIX_EXP_TMA_PMAP=1 XMIX_EXP_TMA_SMEM=70000 ;;
  2d512p_a16) echo XMIX_EXP_TMA=1 XMIX_EXP_TMA_2D=1 XMIX_EXP_TMA_KC=512 XMIX_EXP_TMA_PMAP=1 XMIX_EXP_TMA_BC16_BELOW=100000 ;;
  2d512p_a32) echo XMIX_EXP_TMA=1 XMIX_EXP_TMA_2D=1 XMIX_EXP_TMA_KC=512 XMIX_EXP_TMA_PMAP=1 XMIX_EXP_TMA_BC16_BELOW=1 ;;
  2d256p) echo XMIX_EXP_TMA=1 XMIX_EXP_TMA_2D=1 XMIX_EXP_TMA_KC=256 XMIX_EXP_TMA_PMAP=1 ;;
  2d256p_deep) echo XMIX_EXP_TMA=1 XMIX_EXP_TMA_2D=1 XMIX_EXP_TMA_KC=256 XMIX_EXP_TMA_PMAP=1 XMIX_EXP_TMA_SMEM=200000 ;;
  2d1024p) echo XMIX_EXP_TMA=1 XMIX_EXP_TMA_2D=1 XMIX_EXP_TMA_KC=1024 XMIX_EXP_TMA_PMAP=1 ;;
  2d256p_a32) echo XMIX_EXP_TMA=1 XMIX_EXP_TMA_2D=1 XMIX_EXP_TMA_KC=256 XMIX_EXP_TMA_PMAP=1 XMIX_EXP_TMA_BC=32 ;;
  2d256p_a32deep) echo XMIX_EXP_TMA=1 XMIX_EXP_TMA_2D=1 XMIX_EXP_TMA_KC=256 XMIX_EXP_TMA_PMAP=1 XMIX_EXP_TMA_BC=32 XMIX_EXP_TMA_SMEM=200000 ;;
  2d256p_b64) echo XMIX_EXP_TMA=1 XMIX_EXP_TMA_2D=1 XMIX_EXP_TMA_KC=256 XMIX_EXP_TMA_PMAP=1 XMIX_EXP_TMA_BC=64 ;;
  2d256p_b64deep) echo XMIX_EXP_TMA=1 XMIX_EXP_TMA_2D=1 XMIX_EXP_TMA_KC=256 XMIX_EXP_TMA_PMAP=1 XMIX_EXP_TMA_BC=64 XMIX_EXP_TMA_SMEM=200000 ;;
  2d512p_b64) echo XMIX_EXP_TMA=1 XMIX_EXP_TMA_2D=1 XMIX_EXP_TMA_KC=512 XMIX_EXP_TMA_PMAP=1 XMIX_EXP_TMA_BC=64 ;;
  2d512p_a32deep) echo XMIX_EXP_TMA=1 XMIX_EXP_TMA_2D=1 XMIX_EXP_TMA_KC=512 XMIX_EXP_TMA_PMAP=1 XMIX_EXP_TMA_BC=32 XMIX_EXP_TMA_SMEM=200000 ;;
  2d512p_b64ks2) echo XMIX_EXP_TMA=1 XMIX_EXP_TMA_2D=1 XMIX_EXP_TMA_PMAP=1 XMIX_EXP_TMA_KC=512 XMIX_EXP_TMA_BC=64 XMIX_EXP_TMA_KS=2 ;;
  2d512p_b64ks4) echo XMIX_EXP_TMA=1 XMIX_EXP_TMA_2D=1 XMIX_EXP_TMA_PMAP=1 XMIX_EXP_TMA_KC=512 XMIX_EXP_TMA_BC=64 XMIX_EXP_TMA_KS=4 ;;
  2d512p_b32ks2) echo XMIX_EXP_TMA=1 XMIX_EXP_TMA_2D=1 XMIX_EXP_TMA_PMAP=1 XMIX_EXP_TMA_KC=512 XMIX_EXP_TMA_BC=32 XMIX_EXP_TMA_KS=2 ;;
  2d512p_b32ks4) echo XMIX_EXP_TMA=1 XMIX_EXP_TMA_2D=1 XMIX_EXP_TMA_PMAP=1 XMIX_EXP_TMA_KC=512 XMIX_EXP_TMA_BC=32 XMIX_EXP_TMA_KS=4 ;;
  2d256p_b64deepks2) echo XMIX_EXP_TMA=1 XMIX_EXP_TMA_2D=1 XMIX_EXP_TMA_PMAP=1 XMIX_EXP_TMA_KC=256 XMIX_EXP_TMA_BC=64 XMIX_EXP_TMA_SMEM=200000 XMIX_EXP_TMA_KS=2 ;;
  2d256p_b128ks4) echo XMIX_EXP_TMA=1 XMIX_EXP_TMA_2D=1 XMIX_EXP_TMA_PMAP=1 XMIX_EXP_TMA_KC=256 XMIX_EXP_TMA_BC=128 XMIX_EXP_TMA_SMEM=200000 XMIX_EXP_TMA_KS=4 XMIX_EXP_TMA_KS_BELOW=200 ;;
  best) echo XMIX_EXP_TMA=1 XMIX_EXP_TMA_2D=1 XMIX_EXP_TMA_PMAP=1 XMIX_EXP_TMA_KC=256 XMIX_EXP_TMA_BC=64 XMIX_EXP_TMA_SMEM=200000 XMIX_EXP_TMA_KS=2 ;;
  best_np) echo XMIX_EXP_TMA=1 XMIX_EXP_TMA_2D=1 XMIX_EXP_TMA_PMAP=1 XMIX_EXP_TMA_KC=256 XMIX_EXP_TMA_BC=64 XMIX_EXP_TMA_SMEM=200000 XMIX_EXP_TMA_KS=2 XMIX_EXP_TMA_NOPRE=1 ;;
  best_ed) echo XMIX_EXP_TMA=1 XMIX_EXP_TMA_2D=1 XMIX_EXP_TMA_PMAP=1 XMIX_EXP_TMA_KC=256 XMIX_EXP_TMA_BC=64 XMIX_EXP_TMA_SMEM=200000 XMIX_EXP_TMA_KS=2 XMIX_EXP_TMA_EARLYDEP=1 ;;
  best_ks2below100) echo XMIX_EXP_TMA=1 XMIX_EXP_TMA_2D=1 XMIX_EXP_TMA_PMAP=1 XMIX_EXP_TMA_KC=256 XMIX_EXP_TMA_BC=64 XMIX_EXP_TMA_SMEM=200000 XMIX_EXP_TMA_KS=2 XMIX_EXP_TMA_KS_BELOW=90 ;;
  best_s3) echo XMIX_EXP_TMA=1 XMIX_EXP_TMA_2D=1 XMIX_EXP_TMA_PMAP=1 XMIX_EXP_TMA_KC=256 XMIX_EXP_TMA_BC=64 XMIX_EXP_TMA_SMEM=130000 XMIX_EXP_TMA_KS=2 ;;
  best_b128) echo XMIX_EXP_TMA=1 XMIX_EXP_TMA_2D=1 XMIX_EXP_TMA_PMAP=1 XMIX_EXP_TMA_KC=256 XMIX_EXP_TMA_BC=128 XMIX_EXP_TMA_SMEM=200000 XMIX_EXP_TMA_KS=2 XMIX_EXP_TMA_KS_BELOW=100 ;;
  best_b128ks4) echo XMIX_EXP_TMA=1 XMIX_EXP_TMA_2D=1 XMIX_EXP_TMA_PMAP=1 XMIX_EXP_TMA_KC=256 XMIX_EXP_TMA_BC=128 XMIX_EXP_TMA_SMEM=200000 XMIX_EXP_TMA_KS=4 XMIX_EXP_TMA_KS_BELOW=100 ;;
  2d512) echo XMIX_EXP_TMA=1 XMIX_EXP_TMA_2D=1 XMIX_EXP_TMA_KC=512 ;;
  *) echo X=1 ;;
esac; }
for v in ${VARS:-lt lt_c100 lt_c25 lt_bs1 lt_bs1_c100 lt_bs1_c25 kc512 kc512_c100 2d512p 2d512p_c100 2d512pnone 2d512pnone_c100 2d512}; do
  g=ptx; [[ $v == lt* ]] && g=auto
  bs=8; [[ $v == *_bs1* ]] && bs=1
  prof=""; to=${TO:-45}; [[ " ${PROF:-} " == *" $v "* ]] && { prof="--profile --role-costs"; to=${TOP:-150}; }
  t0=$(date +%s)
  env $(venv $v) timeout $to $B/xmix bench /tmp/l8.xmb --backend cuda --gemm $g --prompts $bs --prompt-len 16 --new-tokens 8 \
    --graph-buckets $bs --graph-context 80 $prof --json -q > $W/b_$v.json 2> $W/e_$v.txt
  rc=$?
  python3 -c "
import json,sys
try:
  d=json.load(open('$W/b_$v.json')); rc=d.get('role_cost_ms')
  print('$v', d.get('graph_ms'), {k:round(x,3) for k,x in list(rc.values())[0].items()} if rc else '', '$(( $(date +%s) - t0 ))s')
except Exception as e: print('$v rc=$rc', [l[:300] for l in open('$W/e_$v.txt').read().splitlines() if 'rror' in l or 'trap' in l][:4])
" >> $S
done
if [ -n "${TESTV:-}" ]; then
  env $(venv $TESTV) timeout ${TOT:-150} $B/gpu.test -test.run 'TestExpTMAMatchesCPU' -test.v > $W/test.txt 2>&1
  grep -E "exp-tma|FAIL|^ok|PASS|panic|rror" $W/test.txt | cut -c1-300 | head -12 >> $S
fi
if [ -n "${NCUV:-}" ]; then
  env $(venv $NCUV) OUT=$W/ncu_tma WORK=/tmp/ncu_tma MODELS=llama-3.1-8b KERNELS='^xmix_exp_tma' SKIP=0 COUNT=${NCUC:-12} NCU_TIMEOUT=200 \
    BENCH_FLAGS="--prompts 8 --gemm ptx" bash testsuite/gpu/ncu.sh > $W/ncu_tma.txt 2>&1
  grep -A30 "^|" $W/ncu_tma/NCU.md | head -30 >> $S
  OUT=$W/ncu_lt WORK=/tmp/ncu_lt MODELS=llama-3.1-8b KERNELS='nvjet|xmma|cutlass|sm90' SKIP=${NCUS:-200} COUNT=${NCUC:-12} NCU_TIMEOUT=200 \
    BENCH_FLAGS="--prompts 8 --gemm auto" bash testsuite/gpu/ncu.sh > $W/ncu_lt.txt 2>&1
  grep -A30 "^|" $W/ncu_lt/NCU.md | head -30 >> $S
fi
cat $S; tar -czf $OUT/w.tgz -C $W .
