# ptxas_bundle BUNDLE PTXDIR LOG (sourced by run.sh and fuse_ab.sh): writes the bundle's
# kernels under PTXDIR (xmixc ptx, with $bin the binaries' folder), assembles each with
# ptxas for its .target (sm_90, or sm_90a for the warpgroup MMAs) and appends a line per kernel to LOG: "ok NAME KERNEL regs=R
# spill_stores=S" or "FAIL NAME KERNEL <ptxas's first lines>", NAME the bundle's file name
# without .xmb.
ptxas_bundle() {
  local b=$1 dir=$2 out=$3 name msg regs spill f arch
  name=$(basename "$b" .xmb)
  "$bin/xmixc" ptx "$b" -d "$dir" 2>/dev/null
  for f in "$dir"/*.ptx; do
    arch=$(awk '$1 == ".target" {print $2; exit}' "$f")
    if msg=$(ptxas -arch="${arch:-sm_90}" -v "$f" -o /dev/null 2>&1); then
      regs=$(echo "$msg" | grep -o 'Used [0-9]* registers' | head -1 | grep -o '[0-9]*')
      spill=$(echo "$msg" | grep -o '[0-9]* bytes spill stores' | head -1 | grep -o '^[0-9]*')
      echo "ok $name $(basename "$f" .ptx) regs=${regs:-?} spill_stores=${spill:-0}" >> "$out"
    else
      echo "FAIL $name $(basename "$f" .ptx) $(echo "$msg" | head -3 | tr '\n' ' ')" >> "$out"
    fi
  done
}
