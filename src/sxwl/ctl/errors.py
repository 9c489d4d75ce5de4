"""Errors 3kctl prints as one message and an exit status (docs/provider-guide.en.md: 1 failed, 2 bad
usage or config, 3 a PARTIAL artifact: docs/artifact.md)."""

from __future__ import annotations

EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_PARTIAL = 3


class CtlError(Exception):
    """A failure to print as a message (possibly several lines) and exit with ``exit_code``."""

    def __init__(self, message: str, exit_code: int = EXIT_FAILED) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class UsageError(CtlError):
    def __init__(self, message: str) -> None:
        super().__init__(message, EXIT_USAGE)
