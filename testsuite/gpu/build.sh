#!/usr/bin/env bash
# Build what the GPU machine needs (it has no Go): static binaries and the GPU test binary,
# into .dev/gpu/ (ignored by git). Then run the checks there with one device call:
#   run(command="bash testsuite/gpu/run.sh", carry=[".dev/gpu"])
set -euo pipefail
cd "$(dirname "$0")/../.."
out=.dev/gpu
mkdir -p "$out"
export CGO_ENABLED=0 GOOS=linux GOARCH=amd64
go build -trimpath -ldflags="-s -w" -o "$out/xmix" ./cmd/xmix
go build -trimpath -ldflags="-s -w" -o "$out/xmixc" ./cmd/xmixc
go test -c -trimpath -ldflags="-s -w" -o "$out/gpu.test" ./testsuite/gpu
du -sh "$out"/*
