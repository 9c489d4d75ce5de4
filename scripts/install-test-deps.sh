#!/usr/bin/env bash
# Installs the Debian packages the test suite starts for real: PostgreSQL, Chromium (driven by
# Playwright), a CJK font so screenshots of the zh-CN console are legible, and openssh-server + sudo
# for 3kctl's loopback SSH hosts (tests/ctl), bubblewrap, the sandbox of jobs on local CPods
# (tests/test_local_isolation.py), slirp4netns, their outbound network where a provider allows it
# (tests/test_local_bounds.py), and what the real test nodes run and their images are built with
# (docs/k8s-testing.md): containerd, runc, the CNI plugins, iptables/nftables and iproute2 (the
# kubelet's and the bridge plugin's tools), mmdebstrap and umoci.
set -euo pipefail

missing=()
compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null || missing+=(postgresql)
command -v chromium >/dev/null || missing+=(chromium)
fc-list 2>/dev/null | grep -qi "wenquanyi\|noto sans cjk" || missing+=(fonts-wqy-microhei)
[ -x /usr/sbin/sshd ] || missing+=(openssh-server)
command -v sudo >/dev/null || missing+=(sudo)
command -v bwrap >/dev/null || missing+=(bubblewrap)
command -v slirp4netns >/dev/null || missing+=(slirp4netns)
command -v containerd >/dev/null || missing+=(containerd)
command -v runc >/dev/null || missing+=(runc)
[ -x /usr/lib/cni/bridge ] || missing+=(containernetworking-plugins)
command -v iptables >/dev/null || missing+=(iptables)
command -v nft >/dev/null || missing+=(nftables)
command -v ip >/dev/null || missing+=(iproute2)
command -v mmdebstrap >/dev/null || missing+=(mmdebstrap)
command -v umoci >/dev/null || missing+=(umoci)

[ ${#missing[@]} -eq 0 ] && exit 0
echo "installing test dependencies: ${missing[*]}"
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get install -y -q "${missing[@]}" >/dev/null 2>&1 || {
  $SUDO apt-get update -q >/dev/null
  $SUDO apt-get install -y -q "${missing[@]}" >/dev/null
}
