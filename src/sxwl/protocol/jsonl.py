"""JSON Lines, read the same way by the cloud's check of an uploaded file and by the trainer
(docs/finetune.md, "1. Prepare a dataset"): a line ends at a newline byte and nowhere else; a line
of whitespace only is skipped; a line is UTF-8 JSON. ``str.splitlines`` would also end lines at
``\\r``, U+0085, U+2028, U+2029 and more, which JSON allows inside strings (``\\r`` between values
too), so a file the check accepted could fail in the trainer."""

from __future__ import annotations

import json

NEWLINE = b"\n"


def split_lines(data: bytes) -> list[bytes]:
    """``data`` cut at each newline: every piece but the last ended with one; the last is what
    follows the final newline (empty, the file's last line without one, or a line still arriving)."""
    return data.split(NEWLINE)


def blank(line: bytes) -> bool:
    return not line.strip()


def parse(line: bytes) -> object:
    """The line's JSON value; ``UnicodeDecodeError``, ``ValueError`` (``json.JSONDecodeError``) or
    ``RecursionError`` when it is not UTF-8 JSON."""
    return json.loads(line.decode("utf-8"))
