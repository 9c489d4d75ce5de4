"""What fine-tune tests through the system share: the tiny Llama and the sample dataset built
offline by ``sxwl.trainer.tiny`` in a fresh interpreter (torch stays out of the test process), and
the model registered as public with ``sxwl admin register-model``, as an administrator does."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def run_python(code: str, *args: str) -> str:
    """Runs ``code`` in a fresh interpreter; its stdout."""
    done = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def build_model(model_dir: Path) -> Path:
    run_python(
        "import sys, pathlib; from sxwl.trainer import tiny; tiny.build(pathlib.Path(sys.argv[1]))",
        str(model_dir),
    )
    return model_dir


def write_dataset(path: Path, examples: int) -> Path:
    run_python(
        "import sys, pathlib; from sxwl.trainer import tiny; "
        "tiny.sample_dataset(pathlib.Path(sys.argv[1]), n=int(sys.argv[2]))",
        str(path),
        str(examples),
    )
    return path


def register_public_model(name: str, model_dir: Path, env: dict[str, str]) -> None:
    """``env``: the cloud's settings (its database and data dir)."""
    registered = subprocess.run(
        [sys.executable, "-m", "sxwl.cli", "admin", "register-model", "--name", name, str(model_dir)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert registered.returncode == 0, registered.stderr
