#!/usr/bin/env bash
# Installs the Debian packages the test suite starts for real: PostgreSQL, Chromium (driven by
# Playwright), a CJK font so screenshots of the zh-CN console are legible, and openssh-server + sudo
# for 3kctl's loopback SSH hosts (tests/ctl), and bubblewrap, the sandbox of jobs on local CPods
# (tests/test_local_isolation.py).
set -euo pipefail

missing=()
compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null || missing+=(postgresql)
command -v chromium >/dev/null || missing+=(chromium)
fc-list 2>/dev/null | grep -qi "wenquanyi\|noto sans cjk" || missing+=(fonts-wqy-microhei)
[ -x /usr/sbin/sshd ] || missing+=(openssh-server)
command -v sudo >/dev/null || missing+=(sudo)
command -v bwrap >/dev/null || missing+=(bubblewrap)

[ ${#missing[@]} -eq 0 ] && exit 0
echo "installing test dependencies: ${missing[*]}"
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get install -y -q "${missing[@]}" >/dev/null 2>&1 || {
  $SUDO apt-get update -q >/dev/null
  $SUDO apt-get install -y -q "${missing[@]}" >/dev/null
}
