"""The offline artifact this cloud serves at ``/downloads/3k-artifact.tgz`` (docs/artifact.md,
"Serving"): the operator names the built file (``SXWL_ARTIFACT_FILE``); the cloud serves a copy whose
manifest names this cloud's URL (``cloud:``), so ``3kctl deploy all`` run from it dials this cloud
without ``--cloud``. The copy is made once per source file and URL, reproducibly (the same source
and URL give the same bytes, so every replica serves the same sha256), and kept under the data dir.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import re
import tarfile
import threading
from dataclasses import dataclass
from pathlib import Path

from sxwl.cloud.config import Settings

NAME = "3k-artifact.tgz"
MANIFEST_MEMBER = "artifact/manifest.yaml"
# Copies made for earlier files or URLs are removed past this many.
KEEP = 4
_making = threading.Lock()


class NoArtifact(Exception):
    """This cloud serves no artifact: none is configured, or the configured file is missing."""


class BadArtifact(Exception):
    """The configured file is not an artifact (not a .tar.gz with artifact/manifest.yaml)."""


@dataclass(frozen=True)
class Served:
    path: Path
    sha256: str
    size: int
    version: str
    cloud: str

    def summary(self) -> dict[str, str | int]:
        return {"name": NAME, "sha256": self.sha256, "size": self.size, "version": self.version,
                "cloud": self.cloud}  # fmt: skip


def with_cloud(manifest: str, cloud: str) -> str:
    """The manifest with its top-level ``cloud:`` set to ``cloud`` (a JSON string is valid YAML)."""
    line = f"cloud: {json.dumps(cloud)}"
    if re.search(r"^cloud:.*$", manifest, re.MULTILINE):
        return re.sub(r"^cloud:.*$", lambda _: line, manifest, count=1, flags=re.MULTILINE)
    return manifest.rstrip("\n") + "\n" + line + "\n"


def _rewrite(source: Path, target: Path, cloud: str) -> str:
    """source with its manifest's cloud set, as target; returns the manifest's version."""
    version = ""
    with (
        target.open("wb") as raw,
        gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as zipped,
        tarfile.open(fileobj=zipped, mode="w", format=tarfile.GNU_FORMAT) as out,
    ):
        try:
            with tarfile.open(source, mode="r|gz") as tar:
                for member in tar:
                    content = tar.extractfile(member) if member.isreg() else None
                    if member.name == MANIFEST_MEMBER and content is not None:
                        text = with_cloud(content.read().decode(), cloud)
                        found = re.search(r"^version:\s*['\"]?([^'\"\s]+)", text, re.MULTILINE)
                        version = found.group(1) if found else "?"
                        data = text.encode()
                        member.size = len(data)
                        out.addfile(member, io.BytesIO(data))
                    else:
                        out.addfile(member, content)
        except (tarfile.TarError, EOFError, OSError, UnicodeDecodeError) as exc:
            raise BadArtifact(f"{source} is not a readable .tar.gz: {exc}") from None
    if not version:
        raise BadArtifact(f"{source} holds no {MANIFEST_MEMBER}: it is not a 3k artifact")
    return version


def _version_of(source: Path) -> str:
    """The version its manifest names (the build puts the manifest first: a short read)."""
    try:
        with tarfile.open(source, mode="r|gz") as tar:
            for member in tar:
                if member.name == MANIFEST_MEMBER and member.isreg():
                    content = tar.extractfile(member)
                    text = content.read().decode() if content is not None else ""
                    found = re.search(r"^version:\s*['\"]?([^'\"\s]+)", text, re.MULTILINE)
                    return found.group(1) if found else "?"
    except (tarfile.TarError, EOFError, OSError, UnicodeDecodeError) as exc:
        raise BadArtifact(f"{source} is not a readable .tar.gz: {exc}") from None
    raise BadArtifact(f"{source} holds no {MANIFEST_MEMBER}: it is not a 3k artifact")


def served(settings: Settings) -> Served:
    """The artifact as served (made on first use): with ``SXWL_PUBLIC_URL`` written into its
    manifest, so that `deploy all` needs no ``--cloud``; without one, the operator's file as it is.
    Never a URL taken from a request: each new Host header would cost a rewrite of the archive."""
    cloud = settings.public_url.rstrip("/")
    source = settings.artifact_file
    if source is None:
        raise NoArtifact("this cloud serves no offline artifact: its operator sets SXWL_ARTIFACT_FILE")
    try:
        info = source.stat()
    except OSError:
        raise NoArtifact(f"the configured artifact {source} is missing") from None
    key = hashlib.sha256(
        f"{source.resolve()}|{info.st_size}|{info.st_mtime_ns}|{info.st_ino}|{cloud}".encode()
    ).hexdigest()[:20]
    folder = settings.data_dir / "downloads"
    # Without a URL to write in, the operator's file is served itself: only its sha256 is kept.
    target = folder / f"3k-artifact-{key}.tgz" if cloud else source
    meta = folder / f"3k-artifact-{key}.json"
    with _making:
        if not meta.is_file():
            folder.mkdir(parents=True, exist_ok=True)
            version = _made(source, target, cloud) if cloud else _version_of(source)
            with target.open("rb") as handle:
                digest = hashlib.file_digest(handle, "sha256").hexdigest()
            size = target.stat().st_size
            meta.write_text(json.dumps({"sha256": digest, "size": size, "version": version, "cloud": cloud}))
            _evict(folder)
        recorded = json.loads(meta.read_text())
    return Served(target, str(recorded["sha256"]), int(recorded["size"]), str(recorded["version"]), cloud)


def _made(source: Path, target: Path, cloud: str) -> str:
    """``target``: source with ``cloud`` in its manifest, written whole or not at all."""
    partial = target.with_name(f".{target.name}.{threading.get_ident()}.partial")
    try:
        version = _rewrite(source, partial, cloud)
        partial.replace(target)
    finally:
        partial.unlink(missing_ok=True)
    return version


def _evict(folder: Path) -> None:
    copies = sorted(folder.glob("3k-artifact-*.json"), key=lambda p: p.stat().st_mtime, reverse=True)
    for meta in copies[KEEP:]:
        meta.with_suffix(".tgz").unlink(missing_ok=True)
        meta.unlink(missing_ok=True)
