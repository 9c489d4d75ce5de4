"""The `sxwl` command on a real pseudo-terminal of a given width, as a user's terminal runs it."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import struct
import subprocess
import sys
import termios

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")


def sxwl_on_terminal(*args: str, env: dict[str, str], columns: int) -> tuple[int, str]:
    """Exit status and the text a terminal ``columns`` wide shows (colours stripped)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, columns, 0, 0))
    # The terminal's own width, not a COLUMNS inherited from the test's environment.
    clean = {k: v for k, v in env.items() if k not in ("COLUMNS", "LINES")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "sxwl.cli", *args],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        env={**clean, "TERM": "xterm-256color"},
        close_fds=True,
    )
    os.close(slave)
    chunks = []
    try:
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            chunks.append(chunk)
        code = proc.wait(60)
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = ANSI.sub("", b"".join(chunks).decode(errors="replace")).replace("\r\n", "\n")
    return code, text
