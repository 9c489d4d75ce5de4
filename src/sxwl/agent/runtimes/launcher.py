"""Runs one job's command and records its exit status in the job's directory.

The agent starts this as the leader of a new process group, so a stop reaches the whole job, and
the exit status survives an agent restart: a re-adopted job's outcome is read from the file."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

EXIT_FILE = "exit_status"


def main(workdir: Path) -> int:
    spec = json.loads((workdir / "launch.json").read_text())
    # A handler (not SIG_IGN) so the child gets the default action back at exec, while this process
    # outlives a SIGTERM to the group long enough to record the child's status.
    signal.signal(signal.SIGTERM, lambda *_: None)
    with (workdir / "output.log").open("ab") as log:
        child = subprocess.Popen(
            spec["argv"],
            cwd=spec["cwd"],
            env=spec["env"],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        code = child.wait()
    status = 128 - code if code < 0 else code  # killed by signal N → 128 + N, as shells report it
    temp = workdir / (EXIT_FILE + ".tmp")
    temp.write_text(str(status))
    os.replace(temp, workdir / EXIT_FILE)
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
