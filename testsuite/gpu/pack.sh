#!/usr/bin/env bash
# Carry more binaries than the device's 64 MiB allow raw: gzip them here, unpack them there.
#   bash testsuite/gpu/pack.sh .dev/gpu .dev/old ...   (here: each folder to .dev/pack/NAME/*.gz)
#   run(command="bash testsuite/gpu/pack.sh --unpack && ...", carry=[".dev/pack"])
# --unpack restores every .dev/pack/NAME to .dev/NAME (executables stay executable); files
# other than binaries (a spec beside old binaries) travel as they are.
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ "${1:-}" = --unpack ]; then
  for d in .dev/pack/*/; do
    name=$(basename "$d")
    mkdir -p ".dev/$name"
    for f in "$d"*; do
      case "$f" in
        *.gz) gunzip -c "$f" > ".dev/$name/$(basename "${f%.gz}")" && chmod +x ".dev/$name/$(basename "${f%.gz}")" ;;
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
    if [ -x "$f" ]; then gzip -9 -c "$f" > "$dst/$(basename "$f").gz"; else cp "$f" "$dst/"; fi
  done
done
du -sh .dev/pack >&2
