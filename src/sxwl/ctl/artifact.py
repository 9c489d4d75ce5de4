"""The offline artifact: its manifest (versions, images, charts, checksums) and its verification."""

from __future__ import annotations

import hashlib
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from sxwl.ctl.errors import CtlError

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
        return [*self.tools.values(), self.kubekey_artifact, *(c.path for c in [*self.charts, *self.ceph])]


Verdict = Literal["ok", "missing", "mismatch", "unlisted", "extra"]


@dataclass
class Verification:
    manifest: Manifest
    files: list[tuple[str, Verdict, str]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(verdict in ("ok", "extra") for _, verdict, _ in self.files)

    def problems(self) -> list[str]:
        return [f"{path}: {detail}" for path, verdict, detail in self.files if verdict not in ("ok", "extra")]


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
    for relative in manifest.referenced():
        if relative not in manifest.checksums:
            exists = manifest.path(relative).exists()
            result.files.append(
                (
                    relative,
                    "unlisted",
                    "named by the manifest but has no checksum" + ("" if exists else " and is missing"),
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
