#!/usr/bin/env bash
# Builds the binaries of the test control plane and of its real nodes (docs/k8s-testing.md) from the
# upstream Go modules, at the versions pinned below, into .cache/k8s/<versions-key>/bin/. Binaries
# already there are kept.
#
#   scripts/k8s-test-bins.sh                 build what is missing
#   scripts/k8s-test-bins.sh --print-bin-dir print the bin folder for the pinned versions; builds nothing
#   scripts/k8s-test-bins.sh --sync          rewrite deploy/k8s-test/*/go.mod and go.sum from the pins
#                                            (after changing a version here), then build
#
# Environment: SXWL_K8S_CACHE (default <repo>/.cache/k8s), K8S_BUILD_JOBS (default: number of CPUs,
# at most 2; each build also links one binary at a time to keep memory low on small machines).
set -euo pipefail

# --- the pinned versions: change them here only, then run with --sync ---------------------------
K8S_VERSION=v1.37.2   # k8s.io/kubernetes: kube-apiserver, -controller-manager, -scheduler, kubectl, kubelet
ETCD_VERSION=v3.7.0   # go.etcd.io/etcd/server/v3 (what Kubernetes 1.37 ships; it refuses etcd < 3.5.24)
KWOK_VERSION=v0.8.0   # sigs.k8s.io/kwok/cmd/kwok
HELM_VERSION=v3.22.0  # helm.sh/helm/v3/cmd/helm
COREDNS_VERSION=v1.15.0 # github.com/coredns/coredns (the first release on Go 1.26 and k8s.io/* v0.37)
# --------------------------------------------------------------------------------------------------

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
MODS=$ROOT/deploy/k8s-test
KEY="k8s-${K8S_VERSION}_etcd-${ETCD_VERSION}_kwok-${KWOK_VERSION}_helm-${HELM_VERSION}_coredns-${COREDNS_VERSION}"
CACHE=${SXWL_K8S_CACHE:-$ROOT/.cache/k8s}
BIN=$CACHE/$KEY/bin

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
  echo "k8s-test-bins: the 'go' command is needed (Go >= 1.26)" >&2
  exit 1
}

# v1.37.2 -> staging modules v0.37.2, major 1, minor 37
K8S_NUM=${K8S_VERSION#v}
K8S_MAJOR=${K8S_NUM%%.*}
K8S_MINOR=$(echo "$K8S_NUM" | cut -d. -f2)
STAGING_VERSION="v0.${K8S_NUM#*.}"

JOBS=${K8S_BUILD_JOBS:-$(nproc)}
[ "$JOBS" -gt 2 ] && [ -z "${K8S_BUILD_JOBS:-}" ] && JOBS=2
export GOFLAGS="-trimpath -mod=readonly -buildvcs=false"
export CGO_ENABLED=0
export GOTOOLCHAIN=${GOTOOLCHAIN:-local}

log() { echo "[k8s-bins] $*"; }

# Writes go.mod/go.sum of one helper module: requires the given module@version (and any extra ones),
# replaces Kubernetes' staging modules by their published versions when asked.
sync_module() {
  local dir=$1 path=$2
  shift 2
  log "sync $dir: $*"
  (
    cd "$MODS/$dir"
    rm -f go.mod go.sum
    GOFLAGS=-mod=mod go mod init "$path" >/dev/null 2>&1
    GOFLAGS=-mod=mod go mod edit -go=1.26.0 # tidy raises it if a dependency needs more
    local req
    for req in "$@"; do
      GOFLAGS=-mod=mod go mod edit -require="$req"
    done
    if [ "$dir" = kubernetes ]; then
      # k8s.io/kubernetes requires its staging modules at v0.0.0 and replaces them by ./staging/...,
      # which a dependant cannot see: point each one at its published release instead.
      local gomod staging
      gomod=$(GOFLAGS=-mod=mod go mod download -json "k8s.io/kubernetes@$K8S_VERSION" |
        sed -n 's/.*"GoMod": "\(.*\)",*/\1/p')
      sed -n 's#^[[:space:]]*\(k8s.io/[a-z0-9-]*\) => ./staging/.*#\1#p' "$gomod" | while read -r staging; do
        GOFLAGS=-mod=mod go mod edit -replace="$staging=$staging@$STAGING_VERSION"
      done
    fi
    GOFLAGS=-mod=mod go mod tidy
  )
}

# Refuses to build when a helper module's go.mod does not carry the pinned version.
check_pin() {
  local dir=$1 module=$2 version=$3
  if ! grep -Eq "^[[:space:]]*(require[[:space:]]+)?$module $version( |$)" "$MODS/$dir/go.mod"; then
    echo "k8s-test-bins: deploy/k8s-test/$dir/go.mod does not require $module $version;" \
      "run: scripts/k8s-test-bins.sh --sync" >&2
    exit 1
  fi
}

if [ "$SYNC" = 1 ]; then
  sync_module kubernetes sxwl.ai/k8s-test/kubernetes \
    "k8s.io/kubernetes@$K8S_VERSION" "go.etcd.io/etcd/server/v3@$ETCD_VERSION"
  sync_module kwok sxwl.ai/k8s-test/kwok "sigs.k8s.io/kwok@$KWOK_VERSION"
  sync_module helm sxwl.ai/k8s-test/helm "helm.sh/helm/v3@$HELM_VERSION"
  sync_module coredns sxwl.ai/k8s-test/coredns "github.com/coredns/coredns@$COREDNS_VERSION"
fi
check_pin kubernetes k8s.io/kubernetes "$K8S_VERSION"
check_pin kubernetes go.etcd.io/etcd/server/v3 "$ETCD_VERSION"
check_pin kwok sigs.k8s.io/kwok "$KWOK_VERSION"
check_pin helm helm.sh/helm/v3 "$HELM_VERSION"
check_pin coredns github.com/coredns/coredns "$COREDNS_VERSION"

mkdir -p "$BIN"
TOTAL_START=$SECONDS
BUILT=0

# build NAME MODULE-DIR PACKAGE [LDFLAGS...]
build() {
  local name=$1 dir=$2 pkg=$3
  shift 3
  if [ -x "$BIN/$name" ]; then
    log "$name: already built"
    return
  fi
  local start=$SECONDS
  log "$name: building $pkg (-p $JOBS) ..."
  (cd "$MODS/$dir" && go build -p "$JOBS" -ldflags "-s -w $*" -o "$BIN/.$name.partial" "$pkg")
  mv "$BIN/.$name.partial" "$BIN/$name"
  BUILT=$((BUILT + 1))
  log "$name: built in $((SECONDS - start))s (total $((SECONDS - TOTAL_START))s)"
}

K8S_LDFLAGS=()
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  K8S_LDFLAGS+=("-X $pkg.gitVersion=$K8S_VERSION" "-X $pkg.gitMajor=$K8S_MAJOR"
    "-X $pkg.gitMinor=$K8S_MINOR" "-X $pkg.gitTreeState=clean")
done

build kube-apiserver kubernetes k8s.io/kubernetes/cmd/kube-apiserver "${K8S_LDFLAGS[@]}"
build kube-controller-manager kubernetes k8s.io/kubernetes/cmd/kube-controller-manager "${K8S_LDFLAGS[@]}"
build kube-scheduler kubernetes k8s.io/kubernetes/cmd/kube-scheduler "${K8S_LDFLAGS[@]}"
build kubectl kubernetes k8s.io/kubernetes/cmd/kubectl "${K8S_LDFLAGS[@]}"
build kubelet kubernetes k8s.io/kubernetes/cmd/kubelet "${K8S_LDFLAGS[@]}"
build etcd kubernetes go.etcd.io/etcd/server/v3
build kwok kwok sigs.k8s.io/kwok/cmd/kwok "-X sigs.k8s.io/kwok/pkg/consts.Version=$KWOK_VERSION"
build helm helm helm.sh/helm/v3/cmd/helm \
  "-X helm.sh/helm/v3/internal/version.version=$HELM_VERSION" \
  "-X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=$K8S_MAJOR" \
  "-X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=$K8S_MINOR" \
  "-X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=$K8S_MAJOR" \
  "-X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=$K8S_MINOR"
build coredns coredns . # CoreDNS with the few plugins the tests use (deploy/k8s-test/coredns/main.go)
build pause pause .     # the pods' sandbox program (deploy/k8s-test/pause/main.go); no dependencies

if [ "$BUILT" -gt 0 ]; then
  log "done: $BUILT built in $((SECONDS - TOTAL_START))s; $(du -sh "$CACHE/$KEY" | cut -f1) in $BIN"
else
  log "all binaries present in $BIN"
fi

# The real nodes' images (pause, Debian with python3) are built from these binaries and the Debian
# mirror, cached next to them; `make k8s-bins` thereby prepares everything the k8s tests start.
bash "$ROOT/scripts/k8s-test-images.sh"
