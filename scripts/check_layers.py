"""The layering of src/sxwl, checked by `make lint` (docs/architecture.md, "Layers").

Fails, naming each offending import, when:
- a module imports a package that sits above it (LAYERS: each entry may import only itself and the
  entries before it);
- a services domain imports a domain that sits above it (DOMAINS, same rule), so that no loop runs
  between domains;
- modules import each other in a circle;
- a source file is over MAX_LINES lines, unless it is a data table named in LONG_TABLES.

Usage: python scripts/check_layers.py [SRC_DIR]   (default: the checkout's src/)
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

MAX_LINES = 450
# Lowest first. A prefix names a package and everything in it; the longest matching prefix wins.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("sxwl.protocol", "sxwl.tunnel"),
    ("sxwl.trainer", "sxwl.engine"),
    ("sxwl.agent",),
    ("sxwl.ctl",),
    ("sxwl.cloud.errors", "sxwl.cloud.kit.logs"),
    ("sxwl.cloud.config",),
    ("sxwl.cloud.db",),
    ("sxwl.cloud.kit", "sxwl.cloud.storage", "sxwl.cloud.tunnel", "sxwl.cloud.edge"),
    ("sxwl.cloud.context",),
    ("sxwl.cloud.services",),
    ("sxwl.cloud.background", "sxwl.cloud.api"),
    ("sxwl.cloud.web",),
    ("sxwl.cloud.app", "sxwl.cloud"),
    ("sxwl.cli", "sxwl"),
)
# The services domains, lowest first.
DOMAINS = ("accounts", "money", "catalog", "jobs", "fleet", "scheduling", "finetune", "endpoints", "devenvs")
# Imports that run against LAYERS on purpose, each with its reason.
ALLOWED_UP: dict[tuple[str, str], str] = {
    ("sxwl.cloud.context", "sxwl.cloud.services.fleet.beat"): "the context owns the heartbeats' group commit",
    ("sxwl.cloud.context", "sxwl.cloud.services.fleet.engine_loads"): "the context keeps the engines' loads",
    ("sxwl.cloud.context", "sxwl.cloud.services.scheduling.capacity"): "the context owns the capacity cache",
    ("sxwl.cloud.context", "sxwl.cloud.services.endpoints.call_cache"): "the context owns the /v1 call cache",
}
# Data tables that may be long: one entry per line reads better than a split table.
LONG_TABLES: frozenset[str] = frozenset()


def modules(src: Path) -> dict[str, Path]:
    found = {}
    for path in sorted(src.rglob("*.py")):
        parts = path.relative_to(src).with_suffix("").parts
        if "migrations" in parts:
            continue
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def imports(name: str, path: Path, known: dict[str, Path]) -> Iterator[tuple[str, int]]:
    """The sxwl modules `name` imports, with line numbers (a package's name for its __init__)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in known:
                    yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                full = f"{base}.{alias.name}"
                if full in known:
                    yield full, node.lineno
                elif base in known:
                    yield base, node.lineno


def rank(name: str, table: tuple[tuple[str, ...], ...]) -> int | None:
    best: tuple[int, int] | None = None  # (prefix length, rank)
    for index, prefixes in enumerate(table):
        for prefix in prefixes:
            if (name == prefix or name.startswith(prefix + ".")) and (best is None or len(prefix) > best[0]):
                best = (len(prefix), index)
    return None if best is None else best[1]


def domain(name: str) -> int | None:
    parts = name.split(".")
    if parts[:3] == ["sxwl", "cloud", "services"] and len(parts) > 3 and parts[3] in DOMAINS:
        return DOMAINS.index(parts[3])
    return None


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def problems(src: Path) -> list[str]:
    known = modules(src)
    graph: dict[str, set[str]] = {name: set() for name in known}
    found: list[str] = []
    for name, path in known.items():
        where = path.relative_to(src.parent)
        lines = len(path.read_text().splitlines())
        if lines > MAX_LINES and name not in LONG_TABLES:
            found.append(f"{where}: {lines} lines (at most {MAX_LINES}; split it by what it does)")
        for target, line in imports(name, path, known):
            if target == name or name.startswith(target + "."):
                continue  # a package's own __init__, imported by its modules
            graph[name].add(target)
            if (name, target) in ALLOWED_UP:
                continue
            own, theirs = rank(name, LAYERS), rank(target, LAYERS)
            if own is not None and theirs is not None and theirs > own:
                found.append(f"{where}:{line}: imports {target}, a layer above it")
            own_domain, their_domain = domain(name), domain(target)
            if own_domain is not None and their_domain is not None and their_domain > own_domain:
                found.append(
                    f"{where}:{line}: the {DOMAINS[own_domain]} domain imports {target}, "
                    f"from the {DOMAINS[their_domain]} domain above it"
                )
    for component in circles(graph):
        found.append("import circle: " + " -> ".join(component))
    return found


def main() -> int:
    src = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent.parent / "src"
    found = problems(src)
    for problem in found:
        print(problem)
    if found:
        print(f'{len(found)} layering problem(s); the rules are in docs/architecture.md, "Layers"')
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
