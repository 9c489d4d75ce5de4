"""Reading the config file's YAML as nodes, not straight into Python objects, so that every problem
can name its line and column, show the line and suggest a fix."""

from __future__ import annotations

import difflib
import re
from pathlib import Path
from typing import Any

import yaml
from yaml.constructor import SafeConstructor
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from sxwl.ctl.cluster import Mark, Problem

TOP_LEVEL_KEYS = ("hosts", "roleGroups", "name", "ceph", "kubernetes", "network")
# `etcd: [master[1:3]]` (the guide's own example) is not valid YAML: `[` cannot start or sit in a
# plain scalar inside a flow sequence. Such unquoted range names are quoted before parsing.
BARE_RANGE_RE = re.compile(
    r"(?P<pre>[\[,]\s*|-\s+|:\s+)(?P<tok>[A-Za-z0-9][A-Za-z0-9._-]*\[\d+:\d+\][A-Za-z0-9._-]*)(?=\s*[\],#]|\s*$)"
)


def quote_ranges(text: str) -> str:
    """Quotes bare ``name[a:b]`` tokens so that ``[master[1:3]]`` parses; lines and the tokens'
    own columns stay where they were."""
    return "\n".join(
        BARE_RANGE_RE.sub(lambda m: f'{m["pre"]}"{m["tok"]}"', line) if "[" in line and ":" in line else line
        for line in text.split("\n")
    )


def node_mark(node: Node) -> Mark:
    return Mark(node.start_mark.line + 1, node.start_mark.column + 1)


def kind_of(node: Node) -> str:
    if isinstance(node, MappingNode):
        return "a mapping (key: value)"
    if isinstance(node, SequenceNode):
        return "a list"
    return f"the value {node.value!r}"


class NodeReader:
    """Reads YAML nodes and collects problems, each with its line and column."""

    def __init__(self, path: Path, text: str, check_keys: bool) -> None:
        self.path = path
        self.text = text
        self.lines = text.splitlines()
        self.check_keys = check_keys
        self.problems: list[Problem] = []
        self.checked_keys: set[Path] = set()
        self.listed_roles: set[str] = set()  # roles with entries, even ones that name no known host
        self._constructor = SafeConstructor()

    def error(self, message: str, fix: str, node: Node | Mark | None = None) -> None:
        mark = node_mark(node) if isinstance(node, Node) else node
        self.problems.append(Problem("error", message, fix, mark))

    def warn(self, message: str, fix: str, node: Node | Mark | None = None) -> None:
        mark = node_mark(node) if isinstance(node, Node) else node
        self.problems.append(Problem("warning", message, fix, mark))

    def scalar(self, node: Node) -> Any:
        return self._constructor.construct_object(node, deep=True)

    def mapping(self, node: Node, where: str, allowed: tuple[str, ...]) -> dict[str, tuple[Node, Node]]:
        """Keys (as text) → (key node, value node); reports duplicates and unknown keys."""
        if not isinstance(node, MappingNode):
            self.error(f"{where} must be a mapping (key: value), found {kind_of(node)}", "", node)
            return {}
        items: dict[str, tuple[Node, Node]] = {}
        for key_node, value_node in node.value:
            key = str(key_node.value) if isinstance(key_node, ScalarNode) else "?"
            if key in items:
                first = node_mark(items[key][0]).line
                self.error(
                    f"{where}: `{key}` appears twice (first at line {first})",
                    "keep one of them",
                    key_node,
                )
                continue
            if key not in allowed:
                self.unknown_key(where, key, key_node, allowed)
                continue
            items[key] = (key_node, value_node)
        return items

    def unknown_key(self, where: str, key: str, node: Node, allowed: tuple[str, ...]) -> None:
        close = difflib.get_close_matches(key, allowed, n=1, cutoff=0.6)
        if where.startswith("host") and key in TOP_LEVEL_KEYS:
            self.error(
                f"`{key}:` is indented into a host, so YAML reads it as a field of that host",
                f"`{key}:` belongs at the top level: start it in column 1, like `hosts:`",
                node,
            )
        elif close:
            self.error(f"{where}: unknown key `{key}`", f"did you mean `{close[0]}`?", node)
        else:
            self.error(f"{where}: unknown key `{key}`", f"allowed here: {', '.join(allowed)}", node)

    def string(self, node: Node, where: str) -> str | None:
        if not isinstance(node, ScalarNode):
            self.error(f"{where} must be a single value, found {kind_of(node)}", "", node)
            return None
        value = self.scalar(node)
        if value is None or value == "":
            self.error(f"{where} is empty", f"give {where} a value", node)
            return None
        return str(value)

    def yaml_error(self, exc: yaml.MarkedYAMLError) -> None:
        """Explains a YAML syntax error; an indented top-level key (the guide's own example indents
        `roleGroups:` under `hosts:`) is named as the cause, wherever YAML noticed it."""
        found = False
        for number, line in enumerate(self.lines, start=1):
            match = re.match(r"^(\s+)(-\s*)?(" + "|".join(TOP_LEVEL_KEYS[:2]) + r")\s*:", line)
            if match and not match.group(2):
                spaces = len(match.group(1))
                key = match.group(3)
                self.error(
                    f"`{key}:` is indented by {spaces} space{'s' if spaces != 1 else ''}, so YAML "
                    "reads it as part of the block above it" + (" (`hosts:`)" if key == "roleGroups" else ""),
                    f"top-level keys start in column 1: remove the {spaces} space"
                    f"{'s' if spaces != 1 else ''} before `{key}:` (the guide's example has this "
                    "mistake); keep the lines under it indented below it",
                    Mark(number, spaces + 1),
                )
                found = True
        if found:
            return
        mark = exc.problem_mark or exc.context_mark
        problem = (exc.problem or "invalid YAML").strip()
        context = f" ({exc.context})" if exc.context else ""
        at = Mark(mark.line + 1, mark.column + 1) if mark else None
        line = self.lines[at.line - 1] if at and at.line <= len(self.lines) else ""
        if "\t" in line or "'\\t'" in problem:
            fix = "YAML does not allow tabs for indentation: replace them with spaces"
        elif "mapping values are not allowed" in problem:
            fix = "a `key: value` starts inside another value: check for a missing space after ':' "
            fix += "or a value that needs quotes"
        elif "expected <block end>" in problem or "did not find expected" in problem:
            fix = (
                "the indentation of this line does not match its siblings: entries of one list or "
                "mapping start in the same column, and `- ` items sit under their key"
            )
        else:
            fix = "compare with `3kctl init`'s sample; quote values that contain ':' '{' or '#'"
        self.error(f"YAML syntax: {problem}{context}", fix, at)
