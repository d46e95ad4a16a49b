#!/usr/bin/env bash
# Carry more binaries than the device's 64 MiB allow raw: compress them here, unpack them there.
#   bash testsuite/gpu/pack.sh .dev/gpu .dev/old ...   (here: each folder to .dev/pack/NAME/*.xz)
#   run(command="bash testsuite/gpu/pack.sh --unpack && ...", carry=[".dev/pack"])
# --unpack restores every .dev/pack/NAME to .dev/NAME (executables stay executable); files
# other than binaries (a spec beside old binaries) travel as they are. xz packs a binary of
# xmix in 11 MB where gzip takes 13 (the tree itself is some 26 MB), so three folders of
# binaries fit; gzip serves where this machine has no xz, and Python's lzma unpacks where the
# device has none.
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ "${1:-}" = --unpack ]; then
  for d in .dev/pack/*/; do
    name=$(basename "$d")
    mkdir -p ".dev/$name"
    for f in "$d"*; do
      case "$f" in
        *.gz | *.xz)
          bin=.dev/$name/$(basename "${f%.*}")
          if [[ $f == *.gz ]]; then gunzip -c "$f" > "$bin"
          elif command -v xz > /dev/null; then xz -dc "$f" > "$bin"
          else python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' "$f" "$bin"; fi
          chmod +x "$bin" ;;
        *) cp "$f" ".dev/$name/" ;;
      esac
    done
  done
  du -sh .dev/*/ >&2
  exit 0
fi
rm -rf .dev/pack
for src in "$@"; do
  dst=.dev/pack/$(basename "$src")
  mkdir -p "$dst"
  for f in "$src"/*; do
    if [ ! -x "$f" ]; then cp "$f" "$dst/"
    elif command -v xz > /dev/null; then xz -9 -T0 -c "$f" > "$dst/$(basename "$f").xz"
    else gzip -9 -c "$f" > "$dst/$(basename "$f").gz"; fi
  done
done
du -sh .dev/pack >&2
