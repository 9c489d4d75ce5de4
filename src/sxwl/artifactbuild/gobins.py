"""bin/kubectl, bin/helm and bin/kk, built from their Go modules at the manifest's versions
(docs/artifact.md, "Building"), cached per tool, version and architecture in ``<cache>/bin/``.
The test control plane's builds (scripts/k8s-test-bins.sh) are taken where that script pins the same
version for linux/amd64."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from sxwl.artifactbuild.elf import file_arch
from sxwl.artifactbuild.parts import Missing, Progress

GO_MODULES = Path("deploy/artifact/go")
K8S_BINS = Path("scripts/k8s-test-bins.sh")
# KubeKey's module, which the build tries to fetch to say precisely why bin/kk is missing.
KUBEKEY_MODULE = "github.com/kubesphere/kubekey/v3"


@dataclass(frozen=True)
class Tool:
    name: str
    version: str


def _go_env(arch: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        GOOS="linux",
        GOARCH=arch,
        CGO_ENABLED="0",
        GOFLAGS="-trimpath -mod=readonly -buildvcs=false",
        GOTOOLCHAIN=env.get("GOTOOLCHAIN", "local"),
    )
    return env


def _k8s_version_flags(version: str) -> list[str]:
    major, minor = version.lstrip("v").split(".")[:2]
    flags = []
    for package in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        flags += [
            f"-X {package}.gitVersion={version}",
            f"-X {package}.gitMajor={major}",
            f"-X {package}.gitMinor={minor}",
            f"-X {package}.gitTreeState=clean",
        ]
    return flags


def _pinned_module(repo: Path, tool: str, module: str) -> str:
    text = (repo / GO_MODULES / tool / "go.mod").read_text()
    match = re.search(rf"^\s*(?:require\s+)?{re.escape(module)} (v\S+)", text, re.MULTILINE)
    return match.group(1) if match else ""


def _test_plane_copy(repo: Path, tool: Tool, arch: str) -> Path | None:
    """The test control plane's build of the same tool and version, if scripts/k8s-test-bins.sh pins it."""
    if arch != "amd64":
        return None
    script = (repo / K8S_BINS).read_text()
    pins = dict(re.findall(r"^([A-Z_]+_VERSION)=(\S+)", script, re.MULTILINE))
    pinned = {"kubectl": pins.get("K8S_VERSION"), "helm": pins.get("HELM_VERSION")}.get(tool.name)
    if pinned != tool.version:
        return None
    out = subprocess.run(
        ["bash", str(repo / K8S_BINS), "--print-bin-dir"], capture_output=True, text=True, check=False
    )
    candidate = Path(out.stdout.strip()) / tool.name
    return candidate if out.returncode == 0 and candidate.is_file() else None


def build_tool(repo: Path, cache: Path, tool: Tool, arch: str, progress: Progress) -> Path | Missing:
    if tool.name == "kk":
        return _kubekey(tool)
    target = cache / "bin" / f"{tool.name}-{tool.version}-linux-{arch}"
    if target.is_file():
        progress.say(f"{tool.name} {tool.version} linux/{arch}: cached ({target})")
        return target
    reused = _test_plane_copy(repo, tool, arch)
    if reused is not None:
        progress.say(f"{tool.name} {tool.version}: the test control plane's build ({reused})")
        return reused
    if shutil.which("go") is None:
        return Missing(f"bin/{tool.name}", "the 'go' command is needed to build it (Go >= 1.26)")
    module = {"kubectl": "k8s.io/kubectl", "helm": "helm.sh/helm/v3"}[tool.name]
    expected = "v0." + tool.version.lstrip("v").split(".", 1)[1] if tool.name == "kubectl" else tool.version
    pinned = _pinned_module(repo, tool.name, module)
    if pinned != expected:
        return Missing(
            f"bin/{tool.name}",
            f"{GO_MODULES / tool.name / 'go.mod'} requires {module} {pinned or '(none)'}, the manifest "
            f"pins {tool.name} {tool.version}: update the module (go mod edit -require, go mod tidy)",
        )
    if tool.name == "kubectl":
        package, flags = ".", _k8s_version_flags(tool.version)
    else:
        package = "helm.sh/helm/v3/cmd/helm"
        flags = [f"-X helm.sh/helm/v3/internal/version.version={tool.version}"]
    progress.say(f"{tool.name} {tool.version} linux/{arch}: go build {module} (minutes, once) ...")
    failed = go_build(repo / GO_MODULES / tool.name, package, flags, target, arch)
    if failed is not None:
        return Missing(f"bin/{tool.name}", f"go build failed: {failed}")
    return target


def go_build(module: Path, package: str, flags: list[str], target: Path, arch: str) -> str | None:
    """``go build`` of ``package`` in the module folder for linux/``arch`` (static, no cgo: it
    cross-compiles) into ``target``, written whole or not at all; then checked to be an ELF program for
    that machine. None when made, else why not."""
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.partial")
    result = subprocess.run(
        ["go", "build", "-p", "2", "-ldflags", " ".join(["-s -w", *flags]), "-o", str(partial), package],
        cwd=module,
        env=_go_env(arch),
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        partial.unlink(missing_ok=True)
        return result.stderr.strip()[-400:]
    made = file_arch(partial)
    if made != arch:
        partial.unlink(missing_ok=True)
        return f"go build made a {made or 'non-ELF'} program, not a linux/{arch} one"
    partial.replace(target)
    return None


def _kubekey(tool: Tool) -> Missing:
    """KubeKey's module is not served by the Go module proxy these builds reach; the answer is kept
    as the reason, so a build machine that can fetch it says so differently."""
    result = subprocess.run(
        ["go", "mod", "download", "-json", f"{KUBEKEY_MODULE}@{tool.version}"],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
        cwd="/",
        env={**os.environ, "GOFLAGS": "-mod=mod"},
    ) if shutil.which("go") else None  # fmt: skip
    if result is None:
        why = "the 'go' command is missing"
    else:
        try:
            why = str(json.loads(result.stdout).get("Error") or "")
        except ValueError:
            why = result.stderr.strip()
        why = why.splitlines()[0] if why else "fetched, but building KubeKey is not part of this build yet"
    return Missing(
        "bin/kk",
        f"KubeKey {tool.version} ({KUBEKEY_MODULE}) could not be built here: {why}. Build it on a machine "
        "that reaches github.com (`make kk` in kubesphere/kubekey at that tag) and pass --kk PATH",
    )
