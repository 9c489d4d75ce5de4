"""A command that a shell could not find, told apart from a program that ran and exited 127
(docs/billing.md, "Failed starts"): the same rule on both runtimes.

A shell that cannot find a command exits 127 and says so on stderr; a program may also exit 127
after any amount of work. The evidence that nothing of the user's ran: the exit status is 127,
the attempt's whole output is one line, the shell's own "not found" (``/bin/sh: 1: python: not
found`` from dash, ``… line 1: python: command not found`` from bash, ``/bin/sh: python: not
found`` from busybox), and it ended within ``WITHIN_S`` of its start. A start that fails so costs
nothing, as a command the sandbox's exec shim could not find at all (runtimes/sandbox.py)."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass

from sxwl.protocol.reasons import Reason

EXIT_STATUS = 127
# Longer than a shell takes to start and look a command up on a loaded machine (the local sandbox's
# set-up included), and as long as billing's provisional first slice (FIRST_SLICE_US): what ends
# sooner with nothing but the shell's line costs nothing.
WITHIN_S = 10.0
# More output than one shell line: not a start that failed (read no further).
OUTPUT_MAX = 1024
_SHELL_SAID = re.compile(
    r"[^:\n]+: (?:line )?(?:\d+: )?(?P<program>[^\s:][^:\n]*): "
    r"(?:command not found|not found|No such file or directory)"
)
# What the Kubernetes wrapper adds (runtimes/kube_wrapper.py), as the exec shim says it.
_WRAPPER_SAID = re.compile(r"command not found: (?P<program>[^\s:]+) \(on PATH: (?P<found>[^()]+)\)")
_MAX_SHOWN = 4


@dataclass(frozen=True)
class NotFound:
    program: str
    found: list[str]  # its versions on PATH, as the Kubernetes wrapper named them


def shell_not_found(output: str, exit_status: int | None, elapsed_s: float) -> NotFound | None:
    """The program a shell could not find, when the evidence says that nothing else ran. The
    output may end with the line that names its versions on PATH (the Kubernetes wrapper's, in the
    words of the local sandbox's exec shim)."""
    if exit_status != EXIT_STATUS or elapsed_s > WITHIN_S or len(output) > OUTPUT_MAX:
        return None
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    said = _SHELL_SAID.fullmatch(lines[0]) if lines else None
    if said is None:
        return None
    program = said["program"].strip()
    if len(lines) == 1:
        return NotFound(program, [])
    named = _WRAPPER_SAID.fullmatch(lines[1]) if len(lines) == 2 else None
    if named is None or named["program"] != program:
        return None
    return NotFound(program, named["found"].split(", "))


def on_path(program: str, path: str | None) -> list[str]:
    """Versions of ``program`` on ``path`` (python3 and python3.11 for python), shortest first, as
    the sandbox's exec shim names them."""
    if "/" in program or not path:
        return []
    versioned = re.compile(re.escape(program) + "[0-9][0-9.]*")
    found: set[str] = set()
    for folder in path.split(os.pathsep):
        try:
            names: Iterable[str] = os.listdir(folder or ".")
        except OSError:
            continue
        found |= {
            n for n in names if versioned.fullmatch(n) and os.access(os.path.join(folder or ".", n), os.X_OK)
        }
    return sorted(found, key=lambda n: (len(n), n))[:_MAX_SHOWN]


def reason(program: str, found: list[str]) -> Reason:
    """``command not found: X``, naming what is on PATH in its stead where something is."""
    if found:
        return Reason.of("agent.command_not_found_but", program=program, found=", ".join(found))
    return Reason.of("agent.command_not_found", program=program)
