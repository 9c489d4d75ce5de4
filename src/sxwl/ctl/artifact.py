"""The offline artifact: its manifest (versions, images, charts, checksums) and its verification."""

from __future__ import annotations

import hashlib
import platform
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from sxwl.ctl.errors import EXIT_PARTIAL, CtlError

MANIFEST = "manifest.yaml"
CHUNK = 1 << 20


@dataclass(frozen=True)
class Chart:
    name: str
    version: str
    path: str
    release: str
    namespace: str
    values: dict[str, Any]


@dataclass(frozen=True)
class ImageArchive:
    image: str
    path: str
    digest: str


@dataclass
class Manifest:
    root: Path
    version: str
    kubernetes_version: str
    kubekey_artifact: str
    private_registry: str
    namespace_override: str
    tools: dict[str, str]  # name → path
    charts: list[Chart]
    ceph: list[Chart]
    images: list[str]
    checksums: dict[str, str]
    platform: str = ""  # linux/amd64
    python: str = ""  # 3kctl's CPython, "3.11"
    cloud: str = ""  # the cloud it was downloaded from (deploy all's default --cloud)
    image_archives: list[ImageArchive] = field(default_factory=list)
    # path → why the build could not make it: a PARTIAL artifact (docs/artifact.md, "Building")
    missing: dict[str, str] = field(default_factory=dict)

    @property
    def registry_prefix(self) -> str:
        return f"{self.private_registry}/{self.namespace_override}".rstrip("/")

    def path(self, relative: str) -> Path:
        return self.root / relative

    def chart(self, name: str) -> Chart:
        for chart in [*self.charts, *self.ceph]:
            if chart.name == name:
                return chart
        raise CtlError(f"the artifact's manifest has no chart {name!r}")

    def referenced(self) -> list[str]:
        return [
            *self.tools.values(),
            self.kubekey_artifact,
            *(c.path for c in [*self.charts, *self.ceph]),
            *(a.path for a in self.image_archives),
        ]


# "partial": a file the build recorded it could not make (build.missing).
Verdict = Literal["ok", "missing", "mismatch", "unlisted", "extra", "partial", "foreign"]


@dataclass
class Verification:
    manifest: Manifest
    files: list[tuple[str, Verdict, str]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(verdict in ("ok", "extra") for _, verdict, _ in self.files)

    @property
    def partial(self) -> bool:
        """Complete but for what the build said it could not make: a PARTIAL artifact, not a damaged one."""
        bad = [verdict for _, verdict, _ in self.files if verdict not in ("ok", "extra")]
        return bool(bad) and all(verdict == "partial" for verdict in bad)

    def problems(self) -> list[str]:
        return [f"{path}: {detail}" for path, verdict, detail in self.files if verdict not in ("ok", "extra")]


MACHINES = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}


def foreign(manifest: Manifest) -> str | None:
    """Why this host cannot use the artifact (built for another architecture or CPython), else None."""
    here = MACHINES.get(platform.machine(), platform.machine())
    if manifest.platform and manifest.platform != f"linux/{here}":
        return (
            f"this artifact was built for {manifest.platform}; this host is linux/{here}: download the "
            f"artifact for linux/{here} (make artifact ARTIFACT_ARGS='--arch {here}')"
        )
    python = f"{sys.version_info[0]}.{sys.version_info[1]}"
    if manifest.python and manifest.python != python:
        return (
            f"this artifact's 3kctl was built for CPython {manifest.python}; this is Python {python}: run "
            f"it with python{manifest.python}, or use an artifact built for Python {python}"
        )
    return None


def default_root() -> Path:
    """The artifact holding the running 3kctl (the guide runs ./3kctl from it), else the current dir."""
    here = Path.cwd()
    if (here / MANIFEST).exists():
        return here
    program = Path(sys.argv[0]).resolve().parent
    if (program / MANIFEST).exists():
        return program
    return here


def _chart(raw: dict[str, Any], where: str) -> Chart:
    try:
        return Chart(
            name=str(raw["name"]),
            version=str(raw["version"]),
            path=str(raw["path"]),
            release=str(raw.get("release", raw["name"])),
            namespace=str(raw["namespace"]),
            values=dict(raw.get("values") or {}),
        )
    except (KeyError, TypeError) as exc:
        raise CtlError(f"{where}: a chart lacks {exc} (needs name, version, path, namespace)") from None


def load_manifest(root: Path) -> Manifest:
    path = root / MANIFEST
    if not root.is_dir():
        raise CtlError(
            f"artifact directory {root} does not exist: unpack 3k-artifact.tgz and pass its folder"
        )
    try:
        data = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise CtlError(
            f"{path} not found: {root} is not an unpacked artifact (cd into the folder `tar xvf "
            "3k-artifact.tgz` "
            "made, or pass --artifact PATH)"
        ) from None
    except yaml.YAMLError as exc:
        raise CtlError(f"{path} is not valid YAML: {exc}") from None
    if not isinstance(data, dict) or data.get("kind") != "ArtifactManifest":
        raise CtlError(f"{path} is not an artifact manifest (kind: ArtifactManifest)")
    if "checksums" not in data:  # the last key: a manifest cut short lacks it
        raise CtlError(f"{path} is incomplete (no checksums): the download was cut short; download it again")
    try:
        kube = data["kubernetes"]
        registry = data.get("registry") or {}
        return Manifest(
            root=root,
            version=str(data["version"]),
            kubernetes_version=str(kube["version"]),
            kubekey_artifact=str(kube["kubekeyArtifact"]),
            private_registry=str(registry.get("privateRegistry", "dockerhub.kubekey.local")),
            namespace_override=str(registry.get("namespaceOverride", "")),
            tools={str(t["name"]): str(t["path"]) for t in data.get("tools") or []},
            charts=[_chart(c, f"{path}: charts") for c in data.get("charts") or []],
            ceph=[_chart(c, f"{path}: ceph") for c in data.get("ceph") or []],
            images=[str(i) for i in data.get("images") or []],
            checksums={str(k): str(v).lower() for k, v in (data.get("checksums") or {}).items()},
            platform=str(data.get("platform") or ""),
            python=str(data.get("python") or ""),
            cloud=str(data.get("cloud") or "").rstrip("/"),
            image_archives=[
                ImageArchive(str(a["image"]), str(a["path"]), str(a.get("digest") or ""))
                for a in data.get("imageArchives") or []
            ],
            missing={
                str(m["path"]): str(m.get("reason", ""))
                for m in (data.get("build") or {}).get("missing") or []
            },
        )
    except (KeyError, TypeError, AttributeError) as exc:
        raise CtlError(f"{path}: missing or malformed field {exc}") from None


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def verify(root: Path) -> Verification:
    manifest = load_manifest(root)
    result = Verification(manifest)
    seen: set[str] = set()
    reason = foreign(manifest)
    if reason:
        result.files.append((MANIFEST, "foreign", reason))
    for relative, why in sorted(manifest.missing.items()):
        if relative not in manifest.checksums:
            result.files.append((relative, "partial", f"not in this PARTIAL artifact: {why}"))
            seen.add(relative)
    for relative in manifest.referenced():
        if relative in seen:
            continue
        if relative not in manifest.checksums:
            exists = manifest.path(relative).exists()
            result.files.append(
                (
                    relative,
                    "unlisted",
                    "named by the manifest but has no checksum"
                    + ("" if exists else " and is missing")
                    + ": the manifest was changed or the artifact is damaged; download it again",
                )
            )
            seen.add(relative)
    for relative, expected in sorted(manifest.checksums.items()):
        seen.add(relative)
        file = manifest.path(relative)
        if not file.is_file():
            result.files.append(
                (relative, "missing", "missing: the artifact is incomplete, download it again")
            )
            continue
        actual = sha256(file)
        if actual != expected:
            result.files.append(
                (
                    relative,
                    "mismatch",
                    f"sha256 {actual[:12]}… differs from the manifest's {expected[:12]}…: the file "
                    "is damaged or was changed; download the artifact again",
                )
            )
        else:
            result.files.append((relative, "ok", actual[:12] + "…"))
    for file in sorted(p for p in root.rglob("*") if p.is_file()):
        relative = file.relative_to(root).as_posix()
        if relative not in seen and relative != MANIFEST:
            result.files.append((relative, "extra", "not in the manifest (ignored)"))
    return result


def write_checksums(root: Path) -> int:
    """Fills ``checksums`` of root/manifest.yaml with every file under root (used by the build)."""
    path = root / MANIFEST
    text = path.read_text()
    sums = {
        p.relative_to(root).as_posix(): sha256(p)
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.relative_to(root).as_posix() != MANIFEST
    }
    head, sep, _ = text.partition("\nchecksums:")
    if not sep:
        head = text.rstrip("\n")
    body = "".join(f"  {k}: {v}\n" for k, v in sums.items())
    path.write_text(head + "\nchecksums:\n" + body if sums else head + "\nchecksums: {}\n")
    return len(sums)


def usable(root: Path) -> Manifest | None:
    """The artifact's manifest when this host can deploy from it, checked before anything else (the
    accessKey, any host): built for another architecture or CPython, or PARTIAL, it stops here. None
    when there is no readable manifest: the artifact step names that."""
    try:
        manifest = load_manifest(root)
    except CtlError:
        return None
    reason = foreign(manifest)
    if reason:
        raise CtlError(f"{root}: {reason}")
    if manifest.missing:
        parts = ", ".join(sorted(manifest.missing))
        raise CtlError(
            f"{root} is a PARTIAL artifact (its build could not make {parts}; see PARTIAL.txt): it cannot "
            "deploy a CPod; use a complete artifact",
            EXIT_PARTIAL,
        )
    return manifest
