# variant_flags VARIANT (sourced by fuse_ab.sh and online_ab.sh): a build variant's xmixc build
# flags: default, prev, prevc and cublaslt (none; fuse_ab.sh builds prev and prevc with the
# previous build's xmixc and times cublaslt with --gemm auto), serial
# (--fuse none --pdl=false: the kernels as they ran before either), FUSE+serial (--fuse FUSE
# --pdl=false), pfN (--prefetch N), gcN (--gemv-cols N), guN (--gemv-unroll N), gsN
# (--gemv-split N), gwN (--gemv-warps N), tcrN (--tensor-core-rows N), awN
# (--attn-warps N), auN (--attn-unroll N), apN (--attn-prefetch N), cgrA-B-..
# (--copy-gemm-rows A,B,..), gtcN (--gated-tc-rows N; gtc0: cuBLASLt's gate/up and the
# activation kernel in every tensor-core bucket, as before session 44), gcpN
# (--gated-copy-rows N; gcp0: no copy-engine kernel for gate/up with its activation), cgsN
# (--copy-gemm-slots N), cgnask (--copy-gemm-next asked: the grid after a copy-engine kernel
# launched once its last stage of W is asked for), acc (--attn-tc=false: the decode attention on CUDA cores), tcA-B (--tc-chunks A,B), staged (--gemm tc-staged:
# time it with BENCH_GEMM=ptx; staged,tc8-6 with more in flight), s7 (the session-7 defaults:
# no prefetch, one GEMV column per warp, one K chunk a step), A,B,... (the flags of each, e.g.
# pf0,gate-act), seqsN (no flags: a spec, see variant_spec), asN, nopicks, picks and
# picks-NAME (no flags: the default bundle timed with other xmix bench flags, see
# variant_bench_flags), else --fuse VARIANT (none: no fusion).
variant_flags() {
  case "$1" in
    *,*) local part
      for part in ${1//,/ }; do variant_flags "$part"; done ;;
    default | cublaslt | prev | prevc) ;;
    serial) echo --fuse none --pdl=false ;;
    *+serial) echo --fuse "${1%+serial}" --pdl=false ;;
    pf[0-9]*) echo --prefetch "${1#pf}" ;;
    gc[0-9]*) echo --gemv-cols "${1#gc}" ;;
    gu[0-9]*) echo --gemv-unroll "${1#gu}" ;;
    gs[0-9]*) echo --gemv-split "${1#gs}" ;;
    gw[0-9]*) echo --gemv-warps "${1#gw}" ;;
    tcr[0-9]*) echo --tensor-core-rows "${1#tcr}" ;;
    tc[0-9]*-[0-9]*) local n=${1#tc}; echo --tc-chunks "${n/-/,}" ;;
    staged) echo --gemm tc-staged ;;
    aw[0-9]*) echo --attn-warps "${1#aw}" ;;
    au[0-9]*) echo --attn-unroll "${1#au}" ;;
    ap[0-9]*) echo --attn-prefetch "${1#ap}" ;;
    cgr[0-9]*) local n=${1#cgr}; echo --copy-gemm-rows "${n//-/,}" ;;
    gtc[0-9]*) echo --gated-tc-rows "${1#gtc}" ;;
    gcp[0-9]*) echo --gated-copy-rows "${1#gcp}" ;;
    cgs[0-9]*) echo --copy-gemm-slots "${1#cgs}" ;;
    cgnask) echo --copy-gemm-next asked ;;
    acc) echo --attn-tc=false ;;
    seqs[0-9]* | as[0-9]* | nopicks | picks | picks-*) ;;
    s7) echo --prefetch 0 --gemv-cols 1 --gemv-unroll 1 ;;
    *) echo --fuse "$1" ;;
  esac
}

# variant_bench_flags VARIANT: the xmix bench flags a variant is timed with: asN cuts every
# row's context over N splits of the decode attention (--attn-splits N; 1: none) instead of
# the engine's choice; nopicks gives cuBLASLt no tuned algorithm (--gemm-picks none), picks
# those of the file PICKS (xmix tune-gemm), picks-NAME those of PICKS_DIR/NAME.json
# (tune_gemm.sh's tables with one pick more); every other variant none.
variant_bench_flags() {
  case "$1" in
    as[0-9]*) echo --attn-splits "${1#as}" ;;
    nopicks) echo --gemm-picks none ;;
    picks) echo --gemm-picks "${PICKS:?picks: set PICKS to a file of xmix tune-gemm}" ;;
    picks-*) echo --gemm-picks "${PICKS_DIR:?$1: set PICKS_DIR to a folder of picks tables}/${1#picks-}.json" ;;
  esac
}

# variant_spec MODEL VARIANT: the spec file VARIANT compiles. seqsN is specs/models/MODEL.yaml
# with max_seqs N, its decode buckets up to N and no kv_cache_tokens (every resident sequence
# gets max_seq_len of pages), written beside it so that its relative paths still hold (remove
# it with drop_variant_spec); every other variant compiles specs/models/MODEL.yaml.
variant_spec() {
  case "$2" in
    seqs[0-9]*) python3 - "specs/models/$1.yaml" "${2#seqs}" "specs/models/.$1-$2.yaml" <<'PY'
import re, sys
src, n, dst = sys.argv[1], int(sys.argv[2]), sys.argv[3]
text = open(src).read()
def buckets(m):
    b = [int(x) for x in m.group(1).split(",") if int(x) <= n]
    return "decode_buckets: [" + ", ".join(str(x) for x in sorted(set(b + [n]))) + "]"
text = re.sub(r"decode_buckets: \[([^\]]*)\]", buckets, text)
text = re.sub(r"max_seqs: \d+", f"max_seqs: {n}", text)
text = re.sub(r"^[ \t]*kv_cache_tokens: \d+\n", "", text, flags=re.M)  # block style
text = re.sub(r",? *kv_cache_tokens: \d+", "", text)  # flow style
open(dst, "w").write(text)
PY
      echo "specs/models/.$1-$2.yaml" ;;
    *) echo "specs/models/$1.yaml" ;;
  esac
}
drop_variant_spec() { case "$1" in specs/models/.*) rm -f "$1" ;; esac; }
