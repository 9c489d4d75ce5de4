"""The build of ``dist/3k-artifact.tgz`` (docs/artifact.md, "Building"): each part in turn, with
progress and its time, then manifest.yaml with every checksum, then one reproducible archive.

What cannot be made here is named under ``build.missing`` in the manifest and in ``PARTIAL.txt``:
the artifact is then PARTIAL, which ``3kctl artifact verify`` reports (exit 3) and ``deploy all``
refuses, and the build exits 3 too."""

from __future__ import annotations

import hashlib
import platform
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from sxwl.artifactbuild import charts, gobins, image
from sxwl.artifactbuild.elf import file_arch, zip_arches
from sxwl.artifactbuild.pack import tar_gz
from sxwl.artifactbuild.parts import Missing, Progress
from sxwl.ctl import zipapp
from sxwl.ctl.artifact import write_checksums
from sxwl.ctl.sample import SAMPLE_CONFIG

TEMPLATE = Path("deploy/artifact/manifest.yaml")
EXIT_PARTIAL = 3
WHEEL_PLATFORM = {"amd64": "manylinux2014_x86_64", "arm64": "manylinux2014_aarch64"}
MACHINE = {"x86_64": "amd64", "aarch64": "arm64"}
KUBEKEY_WHY = (
    "made by `kk artifact export` (Kubernetes binaries, OS packages and the manifest's images), which "
    "needs bin/kk and the upstream registries (docker.io, registry.k8s.io, nvcr.io, quay.io), not "
    "reachable from this build machine: export it where they are and pass --kubekey-artifact PATH"
)


@dataclass
class Options:
    repo: Path
    output: Path
    arch: str = "amd64"
    cache: Path | None = None
    cloud: str = ""
    kk: Path | None = None
    kubekey_artifact: Path | None = None
    python: str = ""  # another target's CPython for 3kctl (from wheels; needs the package index)
    progress: Progress = field(default_factory=Progress)

    @property
    def cache_dir(self) -> Path:
        return self.cache or self.repo / ".cache" / "artifact"


@dataclass
class Result:
    output: Path
    sha256: str
    size: int
    missing: list[Missing]
    timings: dict[str, float]
    sizes: dict[str, int] = field(default_factory=dict)

    @property
    def partial(self) -> bool:
        return bool(self.missing)


def _copy(source: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, target)
    target.chmod(0o755)


def _part_sizes(root: Path) -> dict[str, int]:
    sizes: dict[str, int] = {}
    for path in root.rglob("*"):
        if path.is_file():
            top = path.relative_to(root).parts[0]
            sizes[top] = sizes.get(top, 0) + path.stat().st_size
    return dict(sorted(sizes.items()))


def _tools(
    opts: Options, data: dict[str, Any], root: Path, missing: list[Missing], supplied: list[str]
) -> None:
    for raw in data["tools"]:
        name, path = str(raw["name"]), str(raw["path"])
        if name == "3kctl":
            continue
        if name == "kk" and opts.kk is not None:
            _copy(opts.kk, root / path)
            supplied.append(path)
            continue
        made = gobins.build_tool(
            opts.repo, opts.cache_dir, gobins.Tool(name, str(raw["version"])), opts.arch, opts.progress
        )
        if isinstance(made, Missing):
            missing.append(Missing(path, made.reason))
        elif (found := file_arch(made)) != opts.arch:  # a cached or reused build of another machine
            missing.append(Missing(path, f"{made} is a {found or 'non-ELF'} program, not linux/{opts.arch}"))
        else:
            _copy(made, root / path)


def _helm_here(opts: Options, data: dict[str, Any], root: Path) -> Path | None:
    """A helm this machine can run, to package the charts: the artifact's own when it is for this
    machine's architecture; in a cross build (--arch arm64 on x86_64), the manifest's helm built for
    this machine the way bin/helm is (cached beside it); else one on PATH."""
    own, here = root / "bin" / "helm", MACHINE.get(platform.machine())
    if here == opts.arch and own.is_file():
        return own
    if here is not None and here != opts.arch:
        [version] = [str(t["version"]) for t in data["tools"] if t["name"] == "helm"]
        made = gobins.build_tool(opts.repo, opts.cache_dir, gobins.Tool("helm", version), here, opts.progress)
        if not isinstance(made, Missing):
            return made
    found = shutil.which("helm")
    return Path(found) if found else None


def _charts(opts: Options, data: dict[str, Any], root: Path, missing: list[Missing]) -> None:
    helm = _helm_here(opts, data, root)
    for raw in [*data.get("charts", []), *data.get("ceph", [])]:
        name, version, path = str(raw["name"]), str(raw["version"]), str(raw["path"])
        if helm is None:
            missing.append(Missing(path, "no helm to package it (none built for this machine, none on PATH)"))
            continue
        if name == "sxwl-agent":
            made = charts.agent_chart(opts.repo, helm, version, root, path)
        elif raw.get("source"):
            source = raw["source"]
            made = charts.third_party(
                charts.ChartSource(str(source["module"]), str(source["version"]), str(source["folder"])),
                helm, version, root, path,
            )  # fmt: skip
        else:
            made = Missing(path, "the manifest names no source for this chart")
        if isinstance(made, Missing):
            missing.append(made)


def _images(opts: Options, data: dict[str, Any], root: Path, missing: list[Missing]) -> None:
    for raw in data.get("imageArchives", []):
        ref, path = str(raw["image"]), str(raw["path"])
        if not ref.startswith("sxwl/sxwl-agent:"):
            missing.append(Missing(path, f"this build makes only the agent's image, not {ref}"))
            continue
        made = image.agent_archive(opts.repo, ref, root, path, opts.arch)
        if isinstance(made, Missing):
            missing.append(made)
        else:
            raw["digest"] = made[1]


def build(opts: Options) -> Result:
    progress = opts.progress
    work = opts.output.parent / f".{opts.output.name}.build"
    shutil.rmtree(work, ignore_errors=True)
    root = work / "artifact"
    root.mkdir(parents=True)
    data: dict[str, Any] = yaml.safe_load((opts.repo / TEMPLATE).read_text())
    data["platform"] = f"linux/{opts.arch}"
    data["cloud"] = opts.cloud.rstrip("/")
    missing: list[Missing] = []
    supplied: list[str] = []
    with progress.part("3kctl"):
        if opts.python or MACHINE.get(platform.machine()) != opts.arch:
            python = opts.python or f"{sys.version_info[0]}.{sys.version_info[1]}"
            zipapp.build(root / "3kctl", WHEEL_PLATFORM[opts.arch], python)
        else:
            python = f"{sys.version_info[0]}.{sys.version_info[1]}"
            zipapp.build(root / "3kctl")
        data["python"] = python
        foreign = {member: arch for member, arch in zip_arches(root / "3kctl").items() if arch != opts.arch}
        if foreign:
            (root / "3kctl").unlink()
            member, arch = next(iter(foreign.items()))
            missing.append(Missing("3kctl", f"its compiled part {member} is for {arch}, not {opts.arch}"))
    with progress.part("conf"):
        (root / "conf").mkdir()
        (root / "conf" / "config-sample.conf").write_text(SAMPLE_CONFIG)
    with progress.part("tools (kubectl, helm, kk)"):
        _tools(opts, data, root, missing, supplied)
    with progress.part("charts"):
        _charts(opts, data, root, missing)
    with progress.part("images"):
        _images(opts, data, root, missing)
    with progress.part("kubekey"):
        relative = str(data["kubernetes"]["kubekeyArtifact"])
        if opts.kubekey_artifact is not None:
            _copy(opts.kubekey_artifact, root / relative)
            (root / relative).chmod(0o644)
            supplied.append(relative)
        else:
            missing.append(Missing(relative, KUBEKEY_WHY))
    with progress.part("manifest and checksums"):
        data["build"] = {
            "partial": bool(missing),
            "missing": [{"path": m.path, "reason": m.reason} for m in missing],
            "supplied": supplied,
        }
        if missing:
            (root / "PARTIAL.txt").write_text(
                "PARTIAL ARTIFACT: it cannot deploy a CPod. Missing:\n"
                + "".join(f"- {m.path}: {m.reason}\n" for m in missing)
            )
        data.pop("checksums", None)
        data["checksums"] = {}  # last: write_checksums rewrites the manifest from this key on
        (root / "manifest.yaml").write_text(yaml.safe_dump(data, sort_keys=False, allow_unicode=True))
        write_checksums(root)
    sizes = _part_sizes(root)
    with progress.part("pack"):
        partial_out = opts.output.with_name(opts.output.name + ".partial")
        tar_gz(root, partial_out, "artifact")
        partial_out.replace(opts.output)
    shutil.rmtree(work, ignore_errors=True)
    with opts.output.open("rb") as handle:
        digest = hashlib.file_digest(handle, "sha256").hexdigest()
    opts.output.with_name(opts.output.name + ".sha256").write_text(f"{digest}  {opts.output.name}\n")
    return Result(opts.output, digest, opts.output.stat().st_size, missing, progress.timings, sizes)
