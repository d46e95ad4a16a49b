# variant_flags VARIANT (sourced by fuse_ab.sh and online_ab.sh): a build variant's xmixc build
# flags: default (none), serial (--fuse none --pdl=false: the kernels as they ran before
# either), FUSE+serial (--fuse FUSE --pdl=false), pfN (--prefetch N), gcN (--gemv-cols N), guN
# (--gemv-unroll N), s7 (the session-7 defaults: no prefetch, one GEMV column per warp, one K
# chunk a step), A,B,... (the flags of each, e.g. pf0,gate-act),
# else --fuse VARIANT (none: no fusion).
variant_flags() {
  case "$1" in
    *,*) local part
      for part in ${1//,/ }; do variant_flags "$part"; done ;;
    default) ;;
    serial) echo --fuse none --pdl=false ;;
    *+serial) echo --fuse "${1%+serial}" --pdl=false ;;
    pf[0-9]*) echo --prefetch "${1#pf}" ;;
    gc[0-9]*) echo --gemv-cols "${1#gc}" ;;
    gu[0-9]*) echo --gemv-unroll "${1#gu}" ;;
    s7) echo --prefetch 0 --gemv-cols 1 --gemv-unroll 1 ;;
    *) echo --fuse "$1" ;;
  esac
}
