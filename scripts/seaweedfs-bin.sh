#!/usr/bin/env bash
# Builds SeaweedFS's `weed`, the S3-compatible server of the artifact-store tests
# (docs/object-storage.md), from its Go module at the version pinned below, into
# .cache/seaweedfs/<version>/bin/weed. A binary already there is kept.
#
#   scripts/seaweedfs-bin.sh                 build it if missing
#   scripts/seaweedfs-bin.sh --print-bin-dir print the bin folder for the pinned version; builds nothing
#   scripts/seaweedfs-bin.sh --sync          rewrite deploy/k8s-test/seaweedfs/go.mod and go.sum from the
#                                            pin (after changing it here), then build
#
# Environment: SXWL_SEAWEEDFS_CACHE (default <repo>/.cache/seaweedfs), SEAWEEDFS_BUILD_JOBS (default:
# number of CPUs, at most 2).
set -euo pipefail

# --- the pinned version: change it here only, then run with --sync ------------------------------
SEAWEEDFS_VERSION=v0.0.0-20261109003541-7506e5f91cd6 # github.com/seaweedfs/seaweedfs
# --------------------------------------------------------------------------------------------------

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
MOD=$ROOT/deploy/k8s-test/seaweedfs
MODULE=github.com/seaweedfs/seaweedfs
CACHE=${SXWL_SEAWEEDFS_CACHE:-$ROOT/.cache/seaweedfs}
BIN=$CACHE/$SEAWEEDFS_VERSION/bin

if [ "${1:-}" = "--print-bin-dir" ]; then
  echo "$BIN"
  exit 0
fi
SYNC=0
if [ "${1:-}" = "--sync" ]; then
  SYNC=1
elif [ -n "${1:-}" ]; then
  echo "usage: $0 [--print-bin-dir | --sync]" >&2
  exit 2
fi

command -v go >/dev/null || {
  echo "seaweedfs-bin: the 'go' command is needed (Go >= 1.26)" >&2
  exit 1
}

JOBS=${SEAWEEDFS_BUILD_JOBS:-$(nproc)}
[ "$JOBS" -gt 2 ] && [ -z "${SEAWEEDFS_BUILD_JOBS:-}" ] && JOBS=2
export GOFLAGS="-trimpath -mod=readonly -buildvcs=false"
export CGO_ENABLED=0
export GOTOOLCHAIN=${GOTOOLCHAIN:-local}

log() { echo "[seaweedfs-bin] $*"; }

if [ "$SYNC" = 1 ]; then
  log "sync deploy/k8s-test/seaweedfs: $MODULE@$SEAWEEDFS_VERSION"
  (
    cd "$MOD"
    rm -f go.mod go.sum
    GOFLAGS=-mod=mod go mod init sxwl.ai/k8s-test/seaweedfs >/dev/null 2>&1
    GOFLAGS=-mod=mod go mod edit -go=1.26.0 # tidy raises it if a dependency needs more
    GOFLAGS=-mod=mod go mod edit -require="$MODULE@$SEAWEEDFS_VERSION"
    GOFLAGS=-mod=mod go mod tidy
  )
fi
if ! grep -Eq "^[[:space:]]*(require[[:space:]]+)?$MODULE $SEAWEEDFS_VERSION( |$)" "$MOD/go.mod"; then
  echo "seaweedfs-bin: deploy/k8s-test/seaweedfs/go.mod does not require $MODULE $SEAWEEDFS_VERSION;" \
    "run: scripts/seaweedfs-bin.sh --sync" >&2
  exit 1
fi

if [ -x "$BIN/weed" ]; then
  log "weed: already built in $BIN"
  exit 0
fi
mkdir -p "$BIN"
START=$SECONDS
log "weed: building $MODULE/weed (-p $JOBS) ..."
(cd "$MOD" && go build -p "$JOBS" -ldflags "-s -w" -o "$BIN/.weed.partial" "$MODULE/weed")
mv "$BIN/.weed.partial" "$BIN/weed"
log "weed: built in $((SECONDS - START))s; $(du -sh "$BIN/weed" | cut -f1) in $BIN"
