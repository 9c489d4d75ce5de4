"""A fine-tune's attempt on the local runtime: the agent's own trainer, run on the attempt's inputs
instead of its command (docs/finetune.md)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from sxwl.agent.runtimes.sandbox import SandboxPaths
from sxwl.protocol.finetune import TrainerRun, TrainerSpec

TRAINER_RUN_FILE = "trainer-run.json"


def trainer_command(spec: TrainerSpec, placed: Path, paths: SandboxPaths, isolated: bool) -> list[str]:
    """Writes the ``TrainerRun`` (every path as the job sees it) into the work dir and returns the
    command that runs the agent's own trainer on it."""

    def seen(path: Path) -> Path:
        return paths.inside(path) if isolated else path

    def where(name: str) -> str | None:
        return str(seen(placed / name)) if (placed / name).exists() else None

    model_dir, training_file = where("model"), where("training_file")
    if model_dir is None or training_file is None:
        raise RuntimeError("a fine-tune needs the inputs model and training_file")
    run = TrainerRun(
        **spec.model_dump(),
        model_dir=model_dir,
        training_file=training_file,
        validation_file=where("validation_file"),
        resume_from=where("resume"),
        output_dir=str(seen(paths.output)),
    )
    run_file = paths.work / TRAINER_RUN_FILE
    run_file.write_text(run.model_dump_json())
    os.chmod(run_file, 0o444)
    return [sys.executable, "-m", "sxwl.trainer", str(seen(run_file))]
