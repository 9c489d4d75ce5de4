"""A base model's archive judged before it is stored: a tar (optionally gzip) of a hub-style model
directory, with its files at the archive's root. Only regular files and directories with relative
names inside it, a bounded number and size of them; ``config.json``, a tokenizer and safetensors
weights, every file judged by its bytes (model_files.py: pickled weights can run code when loaded,
under any name: refused). The parameter count is read from the safetensors headers, never by
loading the weights."""

from __future__ import annotations

import json
import tarfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import IO

from sxwl.cloud.services.catalog import model_files

MAX_MEMBERS = 10_000
CONFIG_MAX_BYTES = 4 * 1024 * 1024
TOKENIZER_FILES = frozenset({"tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "spiece.model"})
HOW_TO_PACK = "pack the model directory from inside it: tar -C MODEL_DIR -czf model.tar.gz ."


class ArchiveProblem(ValueError):
    """What is wrong with the archive, in words for its uploader."""


@dataclass(frozen=True)
class ModelFacts:
    architecture: str | None
    parameters: int
    files: int
    unpacked_bytes: int


def _member_name(member: tarfile.TarInfo) -> str:
    raw = member.name
    if raw.startswith("/") or PurePosixPath(raw).is_absolute():
        raise ArchiveProblem(f"{raw!r}: absolute paths are not allowed in the archive")
    parts = [p for p in raw.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise ArchiveProblem(f"{raw!r}: '..' is not allowed in the archive's paths")
    if member.issym() or member.islnk():
        raise ArchiveProblem(f"{raw!r}: links are not allowed in the archive")
    if not (member.isreg() or member.isdir()):
        raise ArchiveProblem(f"{raw!r}: only regular files and directories are allowed (no devices or FIFOs)")
    return "/".join(parts)


def _architecture(handle: IO[bytes], size: int) -> str | None:
    if size > CONFIG_MAX_BYTES:
        raise ArchiveProblem(f"config.json is larger than {CONFIG_MAX_BYTES} bytes")
    try:
        config = json.loads(handle.read(size).decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ArchiveProblem(f"config.json is not JSON: {exc}") from None
    if not isinstance(config, dict):
        raise ArchiveProblem("config.json must be a JSON object")
    architectures = config.get("architectures")
    if isinstance(architectures, list) and architectures and isinstance(architectures[0], str):
        return architectures[0][:100]
    model_type = config.get("model_type")
    if isinstance(model_type, str) and model_type:
        return model_type[:100]
    raise ArchiveProblem("config.json names no `architectures` (a list of class names) nor `model_type`")


@dataclass
class _Seen:
    names: set[str]
    architecture: str | None = None
    parameters: int = 0
    weights: set[str] = field(default_factory=set)  # the files that are safetensors by content
    indexed: dict[str, frozenset[str]] = field(default_factory=dict)  # index file -> files it names
    total: int = 0


def _judge_member(tar: tarfile.TarFile, member: tarfile.TarInfo, seen: _Seen, max_bytes: int) -> None:
    name = _member_name(member)
    if not member.isreg():
        return
    seen.names.add(name)
    seen.total += member.size
    if seen.total > max_bytes:
        raise ArchiveProblem(f"the archive's files add up to more than {max_bytes} bytes")
    base = name.rsplit("/", 1)[-1]
    if base == "config.json" and name != base:
        raise ArchiveProblem(f"config.json must be at the archive's root, found {name!r}: {HOW_TO_PACK}")
    handle = tar.extractfile(member)
    if handle is None:  # never for a regular file; kept for the type checker
        raise ArchiveProblem(f"{name!r}: cannot be read")
    with handle:
        if name == "config.json":
            seen.architecture = _architecture(handle, member.size)
            return
        # Every file is judged by its bytes, whatever its name: pickles may hide under any.
        try:
            kind = model_files.judge(name, handle, member.size)
        except model_files.FileProblem as exc:
            raise ArchiveProblem(str(exc)) from None
    if isinstance(kind, model_files.Weights):
        seen.parameters += kind.parameters
        seen.weights.add(name)
    elif isinstance(kind, model_files.Index):
        seen.indexed[name] = kind.shards


def _check_indexes(seen: _Seen) -> None:
    """A sharded checkpoint's index names only safetensors files of the archive: a loader opens
    what the index names, whatever its name."""
    for index, shards in sorted(seen.indexed.items()):
        if missing := sorted(shards - seen.weights):
            raise ArchiveProblem(f"{index!r} names {missing[0]!r}: no safetensors file of the archive")


def inspect(archive: IO[bytes], *, max_bytes: int, max_members: int = MAX_MEMBERS) -> ModelFacts:
    """The facts of the model in ``archive`` (a seekable file, read from its start), or
    ``ArchiveProblem`` saying what is wrong. Members are judged as they are read, so a gzip archive
    is decompressed once, front to back."""
    seen = _Seen(names=set())
    count = 0
    archive.seek(0)
    try:
        with tarfile.open(fileobj=archive, mode="r:*") as tar:
            while (member := tar.next()) is not None:
                count += 1
                if count > max_members:
                    raise ArchiveProblem(f"the archive holds more than {max_members} entries")
                _judge_member(tar, member, seen, max_bytes)
    except ArchiveProblem:
        raise
    except (tarfile.TarError, EOFError, zlib.error, OSError, ValueError) as exc:
        raise ArchiveProblem(f"not a tar or tar.gz archive, or a damaged one ({exc})") from None
    if "config.json" not in seen.names:
        raise ArchiveProblem(f"no config.json at the archive's root: {HOW_TO_PACK}")
    if not seen.names & TOKENIZER_FILES:
        raise ArchiveProblem("no tokenizer: the archive needs tokenizer.json, tokenizer.model or vocab files")
    if not seen.weights:
        raise ArchiveProblem("no *.safetensors weights in the archive")
    _check_indexes(seen)
    return ModelFacts(seen.architecture, seen.parameters, len(seen.names), seen.total)


def pack_directory(model_dir: Path, target: Path) -> None:
    """The model directory as a tar with its files at the root. Links are followed (a hub cache's
    snapshot is links to blobs); hidden entries at the top (.git, .cache) are left out."""
    with tarfile.open(target, "w", dereference=True) as tar:
        for child in sorted(model_dir.iterdir()):
            if not child.name.startswith("."):
                tar.add(child, arcname=child.name)
