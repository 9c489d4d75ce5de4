"""A training file's JSONL judged line by line as its bytes arrive (docs/finetune.md, "1. Prepare a
dataset"): the checker never holds more than one line, so a file of any size is validated in one
pass, while the same bytes are hashed and written to the store."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sxwl.protocol import jsonl
from sxwl.protocol.reasons import Reason, english, from_plain

MAX_LINE_BYTES = 1024 * 1024
MAX_PROBLEMS = 100  # kept with the file; the count goes on past them
ROLES = ("system", "user", "assistant")
CHAT = "chat"
PROMPT_COMPLETION = "prompt_completion"


@dataclass(frozen=True)
class Problem:
    line: int  # 1-based; 0 for the file as a whole
    said: Reason  # a code (protocol/reasons.py): each surface words it in its reader's language

    @property
    def message(self) -> str:
        return english(self.said) or ""

    def as_dict(self) -> dict[str, Any]:
        return {"line": self.line, **self.said.plain()}

    @classmethod
    def of(cls, kept: Mapping[str, Any]) -> Problem:
        """A problem as a file's row keeps it; one kept before the codes has only its words."""
        if "code" in kept:
            return cls(int(kept["line"]), from_plain(kept))
        return cls(int(kept.get("line", 0)), Reason.text(str(kept.get("message", ""))))


@dataclass(frozen=True)
class Verdict:
    format: str | None  # decided by the first valid line
    examples: int
    problems: list[Problem]
    problem_count: int

    @property
    def valid(self) -> bool:
        return self.problem_count == 0


def _shown(value: object) -> str:
    """A value quoted in a message: short, and printable whatever the user sent."""
    text = ascii(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _chat_problem(example: dict[str, Any]) -> Reason | None:
    messages = example["messages"]
    if not isinstance(messages, list) or not messages:
        return Reason.of("data.messages")
    for index, message in enumerate(messages):
        where = f"messages[{index}]"
        if not isinstance(message, dict):
            return Reason.of("data.message", where=where)
        if "role" not in message:
            return Reason.of("data.no_role", where=where)
        if message["role"] not in ROLES:
            return Reason.of("data.role", where=where, role=_shown(message["role"]), allowed=", ".join(ROLES))
        content = message.get("content")
        if not isinstance(content, str) or not content.strip():
            return Reason.of("data.content", where=where)
    if not any(message["role"] == "assistant" for message in messages):
        return Reason.of("data.no_assistant")
    return None


def _prompt_completion_problem(example: dict[str, Any]) -> Reason | None:
    for key in ("prompt", "completion"):
        if key not in example:
            return Reason.of("data.missing_key", field=key)
        value = example[key]
        if not isinstance(value, str) or not value.strip():
            return Reason.of("data.empty_key", field=key)
    return None


@dataclass
class JsonlChecker:
    """Feed it the file's bytes in any chunks, then ``finish()`` for the verdict."""

    max_line_bytes: int = MAX_LINE_BYTES
    format: str | None = None
    examples: int = 0
    problems: list[Problem] = field(default_factory=list)
    problem_count: int = 0
    _line: int = 0
    _pending: bytearray = field(default_factory=bytearray)
    _overlong: bool = False  # inside a line already reported as too long: its rest is skipped

    def feed(self, chunk: bytes) -> None:
        # Lines as the trainer reads them (sxwl/protocol/jsonl.py), or a file accepted here fails there.
        *ended, rest = jsonl.split_lines(chunk)
        for line in ended:
            self._take(line)
            self._end_line()
        self._take(rest)

    def finish(self) -> Verdict:
        if self._pending or self._overlong:
            self._end_line()
        if self.examples == 0 and self.problem_count == 0:
            self._problem(0, Reason.of("data.empty_file"))
        return Verdict(self.format, self.examples, list(self.problems), self.problem_count)

    def _take(self, piece: bytes) -> None:
        if self._overlong or not piece:
            return
        self._pending += piece
        if len(self._pending) > self.max_line_bytes:
            self._problem(self._line + 1, Reason.of("data.too_long", limit=self.max_line_bytes))
            self._pending.clear()
            self._overlong = True

    def _end_line(self) -> None:
        self._line += 1
        raw, overlong = bytes(self._pending), self._overlong
        self._pending.clear()
        self._overlong = False
        if not overlong:
            self._check(raw)

    def _problem(self, line: int, message: Reason) -> None:
        self.problem_count += 1
        if len(self.problems) < MAX_PROBLEMS:
            self.problems.append(Problem(line, message))

    def _check(self, raw: bytes) -> None:
        if jsonl.blank(raw):
            return  # blank lines separate nothing and are ignored
        problem = self._judge(raw)
        if problem is not None:
            self._problem(self._line, problem)

    def _judge(self, raw: bytes) -> Reason | None:
        try:
            example = jsonl.parse(raw)
        except UnicodeDecodeError:
            return Reason.of("data.utf8")
        except RecursionError:
            return Reason.of("data.json", why="nested too deeply")
        except ValueError as exc:
            return Reason.of("data.json", why=exc.msg if isinstance(exc, json.JSONDecodeError) else str(exc))
        if not isinstance(example, dict):
            return Reason.of("data.object", found=type(example).__name__)
        if "messages" in example:
            kind, problem = CHAT, _chat_problem(example)
        elif "prompt" in example or "completion" in example:
            kind, problem = PROMPT_COMPLETION, _prompt_completion_problem(example)
        else:
            return Reason.of("data.format")
        if self.format is not None and kind != self.format:
            return Reason.of("data.mixed", kind=kind, first=self.format)
        if problem is None:
            self.format = kind
            self.examples += 1
        return problem
