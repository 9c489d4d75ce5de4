"""What one file of a base model's archive is, judged by its bytes, never by its name (docs/finetune.md,
"Models"): safetensors weights (the header read and checked against the file: known dtypes, shapes
that match their data offsets, offsets that tile the data), text (UTF-8 that is not a pickle), or a
SentencePiece tokenizer model. Anything else is refused: a loader may unpickle a weights file under
any name (an index can name ``shard.dat``), and running the uploader's code is what safetensors
exists to prevent."""

from __future__ import annotations

import codecs
import io
import json
import pickletools
import struct
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import IO

HEADER_MAX_BYTES = 100 * 1024 * 1024  # safetensors' own limit for a header
INDEX_MAX_BYTES = 16 * 1024 * 1024
PICKLE_PREFIX_BYTES = 64 * 1024  # how much of a file is parsed as pickle opcodes (nothing runs)
CHUNK = 1024 * 1024
# Name endings that loaders open with pickle; compared case-insensitively, at any of a name's
# suffixes (``model.PT.gz``, ``pytorch_model.bin.index.json``).
PICKLE_SUFFIXES = frozenset({".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle", ".joblib"})
# Bits per element of each dtype the safetensors format defines.
DTYPE_BITS = {
    "BOOL": 8,
    "U8": 8,
    "I8": 8,
    "F8_E5M2": 8,
    "F8_E4M3": 8,
    "F8_E8M0": 8,
    "I16": 16,
    "U16": 16,
    "F16": 16,
    "BF16": 16,
    "I32": 32,
    "U32": 32,
    "F32": 32,
    "I64": 64,
    "U64": 64,
    "F64": 64,
    "C64": 64,
    "F4": 4,
    "F6_E2M3": 6,
    "F6_E3M2": 6,
}
SAFETENSORS_ONLY = (
    "safetensors only (save with save_pretrained(..., safe_serialization=True) and leave the rest out)"
)


class FileProblem(ValueError):
    """What is wrong with one file, in words for its uploader (the message names the file)."""


@dataclass(frozen=True)
class Weights:
    parameters: int


@dataclass(frozen=True)
class Index:
    """A sharded checkpoint's index: the files its ``weight_map`` names, as archive paths."""

    shards: frozenset[str]


def pickle_named(name: str) -> bool:
    return any(suffix.lower() in PICKLE_SUFFIXES for suffix in PurePosixPath(name).suffixes)


def judge(name: str, handle: IO[bytes], size: int) -> Weights | Index | None:
    """``name``'s kind, read from ``handle`` (``size`` bytes, from its start), or ``FileProblem``."""
    head = handle.read(8)
    if _looks_like_safetensors(head, size):
        return Weights(_safetensors_parameters(name, head, handle, size))
    if name.lower().endswith(".safetensors"):
        raise FileProblem(f"{name!r}: not a safetensors file (its first 8 bytes are no header length)")
    if pickle_named(name):
        raise FileProblem(
            f"{name!r}: pickled files (.bin, .pt, .ckpt ...) can run code when loaded: {SAFETENSORS_ONLY}"
        )
    return _other(name, head, handle, size)


def _looks_like_safetensors(head: bytes, size: int) -> bool:
    """A header length that fits the file: an 8-byte little-endian number that text or a pickle
    almost never makes (eight ASCII bytes read as one are far past any file's size)."""
    if len(head) < 8:
        return False
    length: int = struct.unpack("<Q", head)[0]
    return 2 <= length <= min(HEADER_MAX_BYTES, size - 8)


def _safetensors_parameters(name: str, head: bytes, handle: IO[bytes], size: int) -> int:
    (length,) = struct.unpack("<Q", head)
    try:
        header = json.loads(handle.read(length).decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise FileProblem(f"{name!r}: not a safetensors file (its header is not JSON)") from None
    if not isinstance(header, dict):
        raise FileProblem(f"{name!r}: not a safetensors file (its header is not a JSON object)")
    data_bytes = size - 8 - length
    spans: list[tuple[int, int]] = []
    parameters = 0
    for key, entry in header.items():
        if key == "__metadata__":
            continue
        count, span = _tensor(f"{name!r}: tensor {_shown(key)}", entry, data_bytes)
        parameters += count
        spans.append(span)
    end = 0
    for begin, stop in sorted(spans):
        if begin != end:
            raise FileProblem(f"{name!r}: the tensors' data_offsets overlap or leave gaps (at byte {begin})")
        end = stop
    if end != data_bytes:
        raise FileProblem(f"{name!r}: the tensors' data_offsets cover {end} of the {data_bytes} data bytes")
    return parameters


def _tensor(where: str, entry: object, data_bytes: int) -> tuple[int, tuple[int, int]]:
    """The tensor's element count and byte span, its shape checked against its span: a shape whose
    product is past any file (past 2^63) is refused here, before it is counted."""
    if not isinstance(entry, dict):
        raise FileProblem(f"{where}: not an object with dtype, shape and data_offsets")
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if not isinstance(dtype, str) or dtype not in DTYPE_BITS:
        raise FileProblem(f"{where}: unknown dtype {_shown(dtype)}")
    if not isinstance(shape, list) or not all(_natural(d) for d in shape):
        raise FileProblem(f"{where}: `shape` is not a list of non-negative integers")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(_natural(o) for o in offsets)):
        raise FileProblem(f"{where}: `data_offsets` is not two non-negative integers")
    begin, end = offsets
    if not begin <= end <= data_bytes:
        raise FileProblem(
            f"{where}: data_offsets [{begin}, {end}] are outside the file's {data_bytes} data bytes"
        )
    bits, span_bits = DTYPE_BITS[dtype], (end - begin) * 8
    count = 0 if 0 in shape else 1
    for dim in shape:
        count *= dim
        if count * bits > span_bits:  # stops a product of huge dimensions early
            break
    if count * bits != span_bits:
        raise FileProblem(
            f"{where}: its shape has more or fewer {dtype} elements than its {end - begin} bytes of data hold"
        )
    return count, (begin, end)


def _natural(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _shown(value: object) -> str:
    text = ascii(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _other(name: str, head: bytes, handle: IO[bytes], size: int) -> Index | None:
    """Text, or a SentencePiece model; an index's shards are returned for the archive to check."""
    prefix = bytearray(head)
    while len(prefix) < min(size, PICKLE_PREFIX_BYTES):
        if not (chunk := handle.read(PICKLE_PREFIX_BYTES - len(prefix))):
            break
        prefix += chunk
    if _is_pickle(bytes(prefix), whole=len(prefix) >= size):
        raise FileProblem(f"{name!r}: a pickle, which can run code when loaded: {SAFETENSORS_ONLY}")
    if name.lower().endswith(".model") and prefix[:1] == b"\x0a":
        return None  # a SentencePiece ModelProto: its first field, the pieces
    decoder = codecs.getincrementaldecoder("utf-8")()
    kept = bytearray() if name.lower().endswith(".index.json") else None
    chunk = bytes(prefix)
    while chunk:
        try:
            decoder.decode(chunk)
        except UnicodeDecodeError:
            raise _binary(name) from None
        if b"\x00" in chunk:
            raise _binary(name)
        if kept is not None:
            kept += chunk
            if len(kept) > INDEX_MAX_BYTES:
                raise FileProblem(f"{name!r}: an index larger than {INDEX_MAX_BYTES} bytes")
        chunk = handle.read(CHUNK)
    try:
        decoder.decode(b"", final=True)
    except UnicodeDecodeError:
        raise FileProblem(f"{name!r}: text that ends in the middle of a UTF-8 character") from None
    return None if kept is None else _index(name, bytes(kept))


def _binary(name: str) -> FileProblem:
    return FileProblem(
        f"{name!r}: a binary file that is not safetensors: weights are accepted as {SAFETENSORS_ONLY}; "
        "any other file must be text (JSON, vocabularies) or a SentencePiece .model"
    )


def _is_pickle(prefix: bytes, *, whole: bool) -> bool:
    """Whether the bytes are a pickle of any protocol (the text ones too), by parsing its opcodes
    without running any: a stream that reaches STOP, or is still a valid one where the prefix ends."""
    stream = io.BytesIO(prefix)
    try:
        for opcode, _arg, _pos in pickletools.genops(stream):
            if opcode.name == "STOP":
                return True
    except Exception:  # any malformed opcode or argument: not a pickle, or one cut short
        return not whole and stream.tell() >= len(prefix)
    return False


def _index(name: str, raw: bytes) -> Index:
    try:
        index = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError):
        raise FileProblem(f"{name!r}: an index that is not JSON") from None
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise FileProblem(f"{name!r}: an index without a `weight_map` of tensor names to files")
    folder = PurePosixPath(name).parent
    return Index(frozenset((folder / shard).as_posix() for shard in weight_map.values()))
