"""``python -m sxwl.trainer.gpucheck``: does the trainer train on this machine's NVIDIA GPU, and
how fast? Builds a Llama of about 30M parameters (the tiny model's tokenizer, wider and deeper so
the GPU has work), runs ``python -m sxwl.trainer`` on the toy dataset as the agent runs it, and
prints the device, the step rate and the token rate from its progress lines. Exit status 1 without
CUDA or when the run fails; offline, nothing downloaded. ``scripts/gpu-check.sh trainer`` runs it."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from sxwl.protocol.finetune import ADAPTER_ARTIFACT, Progress, parse_progress
from sxwl.trainer.tiny import build, sample_dataset


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m sxwl.trainer.gpucheck", description=__doc__)
    parser.add_argument("--examples", type=int, default=3200)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--keep", type=Path, help="work in this directory and keep it")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("FAIL: torch sees no CUDA device (torch.cuda.is_available() is False)", file=sys.stderr)
        return 1
    print(f"device: {torch.cuda.get_device_name()} (torch {torch.__version__}, CUDA {torch.version.cuda})")
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
        return check(args.keep, args)
    with tempfile.TemporaryDirectory(prefix="sxwl-trainer-gpucheck-") as work:
        return check(Path(work), args)


def check(work: Path, args: argparse.Namespace) -> int:
    model = build(work / "model", seed=0, hidden_size=512, layers=8, heads=8)
    run = {
        "hyperparameters": {
            "n_epochs": args.epochs,
            "batch_size": args.batch_size,
            "learning_rate_multiplier": 1,
        },
        "lora": {"rank": 16, "alpha": 32, "dropout": 0.05},
        "max_seq_len": 256,
        "model_dir": str(model),
        "training_file": str(sample_dataset(work / "train.jsonl", args.examples)),
        "validation_file": str(sample_dataset(work / "val.jsonl", 64, seed=1)),
        "output_dir": str(work / "output"),
    }
    (work / "run.json").write_text(json.dumps(run))
    env = dict(os.environ, SXWL_OUTPUT_DIR=str(work / "output"), HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1")
    metrics: list[tuple[float, Progress]] = []
    lines: list[Progress] = []
    with subprocess.Popen(
        [sys.executable, "-m", "sxwl.trainer", str(work / "run.json")],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    ) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            progress = parse_progress(line.rstrip("\n"))
            if progress is None:
                continue
            lines.append(progress)
            if progress.kind == "metrics":
                metrics.append((time.monotonic(), progress))
            elif progress.kind in ("dataset", "started", "eval", "checkpoint", "done"):
                print(
                    f"  {progress.kind}: step {progress.step}/{progress.total_steps}", progress.message or ""
                )
    if proc.returncode != 0:
        print(f"FAIL: the trainer exited with status {proc.returncode}", file=sys.stderr)
        return 1
    started = next((p for p in lines if p.kind == "started"), None)
    if started is None or "cuda" not in (started.message or ""):
        print(f"FAIL: the trainer did not say it trains on CUDA ({started or 'no started line'})")
        return 1
    if len(metrics) < 2 or not (work / "output" / ADAPTER_ARTIFACT).is_file():
        print("FAIL: too few metrics lines, or no adapter.tar")
        return 1
    # From the first logged step to the last: model loading and the first step's warm-up left out.
    (t0, first), (t1, last) = metrics[0], metrics[-1]
    steps_per_s = (last.step - first.step) / (t1 - t0)
    tokens_per_s = ((last.trained_tokens or 0) - (first.trained_tokens or 0)) / (t1 - t0)
    print(f"step rate: {steps_per_s:.2f} steps/s, {tokens_per_s:.0f} tokens/s (batch {args.batch_size})")
    print(f"loss: {first.loss:.3f} at step {first.step} → {last.loss:.3f} at step {last.step}")
    print(f"OK: trained {last.step} steps on {torch.cuda.get_device_name()}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
