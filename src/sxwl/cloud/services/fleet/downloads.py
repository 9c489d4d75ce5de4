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
from typing import IO

from sxwl.cloud.config import Settings

NAME = "3k-artifact.tgz"
MANIFEST_MEMBER = "artifact/manifest.yaml"
# Copies made for earlier files or URLs are removed past this many.
KEEP = 4
making = threading.Lock()


class NoArtifact(Exception):
    """This cloud serves no artifact: none is configured, or the configured file is missing."""


class BadArtifact(Exception):
    """The configured file is not an artifact (not a .tar.gz with artifact/manifest.yaml)."""


@dataclass(frozen=True)
class Served:
    """What /downloads/3k-artifact.tgz answers with: a file (``path``) or an object of the artifact
    store (``key``, services/fleet/download_object.py)."""

    sha256: str
    size: int
    version: str
    cloud: str
    path: Path | None = None
    key: str = ""

    def summary(self) -> dict[str, str | int]:
        return {"name": NAME, "sha256": self.sha256, "size": self.size, "version": self.version,
                "cloud": self.cloud}  # fmt: skip


def with_cloud(manifest: str, cloud: str) -> str:
    """The manifest with its top-level ``cloud:`` set to ``cloud`` (a JSON string is valid YAML)."""
    line = f"cloud: {json.dumps(cloud)}"
    if re.search(r"^cloud:.*$", manifest, re.MULTILINE):
        return re.sub(r"^cloud:.*$", lambda _: line, manifest, count=1, flags=re.MULTILINE)
    return manifest.rstrip("\n") + "\n" + line + "\n"


def rewrite(source: IO[bytes], name: str, target: Path, cloud: str) -> str:
    """The artifact read from ``source`` (named ``name`` in errors) with its manifest's cloud set, as
    target; returns the manifest's version."""
    version = ""
    with (
        target.open("wb") as raw,
        gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as zipped,
        tarfile.open(fileobj=zipped, mode="w", format=tarfile.GNU_FORMAT) as out,
    ):
        try:
            with tarfile.open(fileobj=source, mode="r|gz") as tar:
                for member in tar:
                    content = tar.extractfile(member) if member.isreg() else None
                    if member.name == MANIFEST_MEMBER and content is not None:
                        text = with_cloud(content.read().decode(), cloud)
                        version = _version_in(text)
                        data = text.encode()
                        member.size = len(data)
                        out.addfile(member, io.BytesIO(data))
                    else:
                        out.addfile(member, content)
        except (tarfile.TarError, EOFError, OSError, UnicodeDecodeError) as exc:
            raise BadArtifact(f"{name} is not a readable .tar.gz: {exc}") from None
    if not version:
        raise BadArtifact(f"{name} holds no {MANIFEST_MEMBER}: it is not a 3k artifact")
    return version


def _version_in(manifest: str) -> str:
    found = re.search(r"^version:\s*['\"]?([^'\"\s]+)", manifest, re.MULTILINE)
    return found.group(1) if found else "?"


def version_of(source: IO[bytes], name: str) -> str:
    """The version its manifest names (the build puts the manifest first: a short read)."""
    try:
        with tarfile.open(fileobj=source, mode="r|gz") as tar:
            for member in tar:
                if member.name == MANIFEST_MEMBER and member.isreg():
                    content = tar.extractfile(member)
                    return _version_in(content.read().decode() if content is not None else "")
    except (tarfile.TarError, EOFError, OSError, UnicodeDecodeError) as exc:
        raise BadArtifact(f"{name} is not a readable .tar.gz: {exc}") from None
    raise BadArtifact(f"{name} holds no {MANIFEST_MEMBER}: it is not a 3k artifact")


def served(settings: Settings) -> Served:
    """The artifact as served (made on first use): with ``SXWL_PUBLIC_URL`` written into its
    manifest, so that `deploy all` needs no ``--cloud``; without one, the operator's file as it is.
    Never a URL taken from a request: each new Host header would cost a rewrite of the archive."""
    cloud = settings.public_url.rstrip("/")
    source = settings.artifact_file
    if source is None:
        raise NoArtifact(
            "this cloud serves no offline artifact: its operator sets SXWL_ARTIFACT_FILE (a file) or "
            "SXWL_ARTIFACT_KEY (an object of the S3 artifact store)"
        )
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
    with making:
        if not meta.is_file():
            folder.mkdir(parents=True, exist_ok=True)
            version = _made(source, target, cloud) if cloud else _read_version(source)
            with target.open("rb") as handle:
                digest = hashlib.file_digest(handle, "sha256").hexdigest()
            size = target.stat().st_size
            meta.write_text(json.dumps({"sha256": digest, "size": size, "version": version, "cloud": cloud}))
            evict(folder)
        recorded = json.loads(meta.read_text())
    sha256, size, version = str(recorded["sha256"]), int(recorded["size"]), str(recorded["version"])
    return Served(sha256, size, version, cloud, path=target)


def _made(source: Path, target: Path, cloud: str) -> str:
    """``target``: source with ``cloud`` in its manifest, written whole or not at all."""
    partial = target.with_name(f".{target.name}.{threading.get_ident()}.partial")
    try:
        try:
            with source.open("rb") as opened:
                version = rewrite(opened, str(source), partial, cloud)
        except OSError as exc:
            raise BadArtifact(f"{source} cannot be read: {exc.strerror}") from None
        partial.replace(target)
    finally:
        partial.unlink(missing_ok=True)
    return version


def _read_version(source: Path) -> str:
    try:
        with source.open("rb") as opened:
            return version_of(opened, str(source))
    except OSError as exc:
        raise BadArtifact(f"{source} cannot be read: {exc.strerror}") from None


def evict(folder: Path) -> None:
    copies = sorted(folder.glob("3k-artifact-*.json"), key=lambda p: p.stat().st_mtime, reverse=True)
    for meta in copies[KEEP:]:
        meta.with_suffix(".tgz").unlink(missing_ok=True)
        meta.unlink(missing_ok=True)
