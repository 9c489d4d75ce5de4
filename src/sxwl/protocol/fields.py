"""Field types that every boundary shares (REST API, console forms, agent protocol), declared once.

Integers are bounded to the database column they reach or are compared with, so an oversized value
is a 422 naming its field instead of an overflow in the driver. Names refuse control and invisible
formatting characters: a bidirectional override in a job's or a CPod's name would make the console
show something other than what is stored (docs/architecture.md, "Input at the boundary")."""

from __future__ import annotations

import unicodedata
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1

# Counts, attempts, ids, exit codes and page numbers: INTEGER columns (32 bits on PostgreSQL).
Int32 = Annotated[int, Field(ge=INT32_MIN, le=INT32_MAX)]
# Sequence numbers, byte offsets and sizes: BIGINT columns (and SQLite's INTEGER).
Int64 = Annotated[int, Field(ge=INT64_MIN, le=INT64_MAX)]
# Narrower lower bounds come after the wide ones: of two, pydantic keeps the last. A field that
# narrows further does so the same way: Annotated[NonNegInt32, Field(le=100)].
NonNegInt32 = Annotated[Int32, Field(ge=0)]
PosInt32 = Annotated[Int32, Field(ge=1)]
NonNegInt64 = Annotated[Int64, Field(ge=0)]

# Cc: C0/C1 controls; Cf: format characters (bidi overrides and isolates, zero-width space and
# joiners, BOM); Cs: lone surrogates, which no database encoding takes; Zl/Zp: line and paragraph
# separators, which break a name over lines.
_REFUSED_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})
CONTROL_CHARS = "control or invisible formatting characters"


def refuse_control(value: str) -> str:
    for char in value:
        if unicodedata.category(char) in _REFUSED_CATEGORIES:
            raise ValueError(f"must not contain {CONTROL_CHARS} (U+{ord(char):04X})")
    return value


def refuse_nul(value: str) -> str:
    """Free text (commands, env values, reasons) may hold tabs and newlines, but not NUL, which
    PostgreSQL's text and JSON cannot store, nor lone surrogates, which no encoding can."""
    for char in value:
        if char == "\0" or 0xD800 <= ord(char) <= 0xDFFF:
            raise ValueError(f"must not contain U+{ord(char):04X}")
    return value


Name = Annotated[str, AfterValidator(refuse_control)]
Text = Annotated[str, AfterValidator(refuse_nul)]


class Strict(BaseModel):
    """A request body: unknown fields refused, and strict types (``"2"`` or ``true`` for a number is
    a 422, not coerced). The console's forms, whose values are all text, validate with
    ``strict=False``."""

    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True, strict=True)


class Wire(BaseModel):
    # Unknown fields are ignored so a newer agent can add fields without breaking an older cloud.
    model_config = ConfigDict(extra="ignore")


class WireIn(Wire):
    """What agents send: strict types, so ``"seq": "7"`` or ``true`` for a number is refused, not coerced."""

    model_config = ConfigDict(extra="ignore", strict=True)
