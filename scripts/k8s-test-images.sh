#!/usr/bin/env bash
# Builds, offline of any registry, the container images the tests' real nodes run
# (docs/k8s-testing.md), as OCI image layouts cached under .cache/k8s/images/<key>/:
#
#   sxwl.test/pause:1   the pods' sandbox: the static pause program of scripts/k8s-test-bins.sh
#   sxwl.test/python:1  Debian (suite below) with python3, python3-numpy and /bin/sh, for test jobs
#
#   scripts/k8s-test-images.sh                 build what is missing
#   scripts/k8s-test-images.sh --print-layouts print "<image ref> <layout dir>" per image; builds nothing
#
# The Debian rootfs comes from mmdebstrap (the mirror of the machine's apt sources, or
# SXWL_DEBIAN_MIRROR), is added verbatim as one layer with umoci, and is keyed by the suite and the
# package list, so it is built once per machine (about a minute). Files of the repository that tests
# need inside an image go into a small layer on top at test time (tests/support/k8s_images.py), never
# into this cached base. Environment: SXWL_K8S_CACHE (default <repo>/.cache/k8s).
set -euo pipefail

# --- what the images hold: change it here; the cache key follows --------------------------------
DEBIAN_SUITE=bookworm
DEBIAN_PACKAGES=python3,python3-numpy,libopenblas0-pthread  # OpenBLAS, as the numpy wheels bundle: not the reference BLAS
PATH_ENV=PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
# --------------------------------------------------------------------------------------------------

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CACHE=${SXWL_K8S_CACHE:-$ROOT/.cache/k8s}
IMAGES=$CACHE/images
BIN=$(bash "$ROOT/scripts/k8s-test-bins.sh" --print-bin-dir)

log() { echo "[k8s-images] $*"; }
short_hash() { sha256sum | cut -c1-16; }

PYTHON_KEY=python-$DEBIAN_SUITE-$(echo "$DEBIAN_SUITE $DEBIAN_PACKAGES $PATH_ENV" | short_hash)
if [ -f "$BIN/pause" ]; then
  PAUSE_KEY=pause-$(short_hash <"$BIN/pause")
else
  PAUSE_KEY=pause-missing
fi

if [ "${1:-}" = "--print-layouts" ]; then
  echo "sxwl.test/pause:1 $IMAGES/$PAUSE_KEY"
  echo "sxwl.test/python:1 $IMAGES/$PYTHON_KEY"
  exit 0
elif [ -n "${1:-}" ]; then
  echo "usage: $0 [--print-layouts]" >&2
  exit 2
fi

for tool in umoci mmdebstrap; do
  command -v "$tool" >/dev/null || {
    echo "k8s-test-images: '$tool' is needed (scripts/install-test-deps.sh installs it)" >&2
    exit 1
  }
done
[ -x "$BIN/pause" ] || {
  echo "k8s-test-images: $BIN/pause is missing; run scripts/k8s-test-bins.sh first" >&2
  exit 1
}

# The first URIs: line of the machine's deb822 sources, so the build uses the mirror apt uses.
debian_mirror() {
  if [ -n "${SXWL_DEBIAN_MIRROR:-}" ]; then
    echo "$SXWL_DEBIAN_MIRROR"
    return
  fi
  local uri
  uri=$(sed -n 's/^URIs:[[:space:]]*\([^[:space:]]*\).*/\1/p' /etc/apt/sources.list.d/debian.sources \
    2>/dev/null | head -1)
  echo "${uri:-http://deb.debian.org/debian}"
}

# build KEY FUNCTION: runs FUNCTION WORKDIR LAYOUT into a temporary folder, then renames it into place,
# so an interrupted build never leaves a half image in the cache.
build() {
  local key=$1 make=$2
  if [ -f "$IMAGES/$key/index.json" ]; then
    log "$key: already built"
    return
  fi
  local start=$SECONDS
  mkdir -p "$IMAGES"
  WORK=$(mktemp -d "$IMAGES/.$key.XXXXXX")
  trap 'rm -rf "$WORK"' EXIT
  log "$key: building ..."
  umoci init --layout "$WORK/layout"
  umoci new --image "$WORK/layout:1"
  "$make" "$WORK" "$WORK/layout:1"
  umoci gc --layout "$WORK/layout"
  rm -rf "${IMAGES:?}/$key"
  mv "$WORK/layout" "$IMAGES/$key"
  rm -rf "$WORK"
  trap - EXIT
  log "$key: built in $((SECONDS - start))s, $(du -sh "$IMAGES/$key" | cut -f1)"
}

make_pause() {
  local work=$1 image=$2
  mkdir -p "$work/layer"
  install -m 0755 "$BIN/pause" "$work/layer/pause"
  tar -C "$work/layer" --owner=0 --group=0 --numeric-owner -cf "$work/layer.tar" ./pause
  umoci raw add-layer --image "$image" "$work/layer.tar"
  umoci config --image "$image" --config.entrypoint /pause --config.user 65535:65535 \
    --author sxwl-tests --history.created_by "scripts/k8s-test-images.sh: pause"
}

make_python() {
  local work=$1 image=$2 mirror
  mirror=$(debian_mirror)
  log "mmdebstrap $DEBIAN_SUITE ($DEBIAN_PACKAGES) from $mirror"
  # No /dev in the layer: the runtime mounts its own. Docs and man pages dropped: 40 MB nobody reads.
  mmdebstrap --quiet --variant=apt --include="$DEBIAN_PACKAGES" --skip=output/dev \
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' \
    "$DEBIAN_SUITE" "$work/rootfs.tar" "deb $mirror $DEBIAN_SUITE main"
  umoci raw add-layer --image "$image" "$work/rootfs.tar"
  umoci config --image "$image" --config.env "$PATH_ENV" --config.cmd /bin/sh --config.workingdir / \
    --author sxwl-tests \
    --history.created_by "scripts/k8s-test-images.sh: mmdebstrap $DEBIAN_SUITE $DEBIAN_PACKAGES"
}

build "$PAUSE_KEY" make_pause
build "$PYTHON_KEY" make_python
