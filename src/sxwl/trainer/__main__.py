"""``python -m sxwl.trainer RUN_JSON``: the run file is checked before the training libraries load,
so a bad one fails in a moment with one line on stderr."""

from __future__ import annotations

import sys
from pathlib import Path

from pydantic import ValidationError

from sxwl.protocol.finetune import TrainerRun
from sxwl.trainer import TrainerError

USAGE = "usage: python -m sxwl.trainer RUN_JSON"


def fail(message: str, code: int = 1) -> int:
    print(f"sxwl-trainer: error: {message}", file=sys.stderr, flush=True)
    return code


def read_run(path: Path) -> TrainerRun:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise TrainerError(f"cannot read the run file {path}: {e}") from e
    try:
        return TrainerRun.model_validate_json(text)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(the file)"
        raise TrainerError(f"bad run file {path}: {where}: {first['msg']}") from e


def main(argv: list[str]) -> int:
    if len(argv) != 1 or argv[0].startswith("-"):
        return fail(USAGE, 2)
    try:
        run = read_run(Path(argv[0]))
        if not Path(run.model_dir).is_dir():
            raise TrainerError(f"model_dir: {run.model_dir} not found")
        from sxwl.trainer.run import train

        train(run)
    except TrainerError as e:
        return fail(str(e))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
