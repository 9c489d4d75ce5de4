"""sxwl.trainer: real LoRA fine-tunes of the tiny Llama on CPU, run as the agent runs them
(``python -m sxwl.trainer run.json``): progress lines the cloud parses, a loss that falls, eval
lines, checkpoint tars named by their lines, an adapter that peft loads and generates with, a resume
that goes on from a checkpoint's step, and bad input refused in one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="the trainer needs the extra: pip install -e '.[train]'")
pytest.importorskip("transformers")
pytest.importorskip("peft")
pytest.importorskip("tokenizers")

import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM, AutoTokenizer

from sxwl.protocol.finetune import ADAPTER_ARTIFACT, Progress, checkpoint_artifact, parse_progress
from sxwl.trainer.data import IGNORE, tokenize
from sxwl.trainer.tiny import build, sample_dataset

SRC = Path(__file__).resolve().parent.parent / "src"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build(tmp_path_factory.mktemp("tiny") / "model", seed=1)


def write_run(tmp: Path, model: Path, **fields: object) -> Path:
    run = {
        "hyperparameters": {"n_epochs": 2, "batch_size": 4, "learning_rate_multiplier": 10.0},
        "lora": {"rank": 8, "alpha": 16, "dropout": 0.0},
        "seed": 7,
        "max_seq_len": 48,
        "model_dir": str(model),
        "training_file": str(sample_dataset(tmp / "train.jsonl", 24)),
        "output_dir": str(tmp / "ignored"),
        **fields,
    }
    path = tmp / "run.json"
    path.write_text(json.dumps(run))
    return path


def run_trainer(
    run_file: Path, output: Path, max_log_points: int | None = None
) -> tuple[subprocess.CompletedProcess[str], list[Progress]]:
    """``python -m sxwl.trainer``; ``max_log_points``: the run's cap on metrics lines lowered, so a
    short run logs every few steps as a long one does."""
    env = dict(os.environ)
    env.update(
        SXWL_OUTPUT_DIR=str(output),
        CUDA_VISIBLE_DEVICES="",
        HF_HUB_OFFLINE="1",
        PYTHONPATH=os.pathsep.join([str(SRC), env.get("PYTHONPATH", "")]),
    )
    command = ["-m", "sxwl.trainer", str(run_file)]
    if max_log_points is not None:
        command = [
            "-c",
            f"import runpy, sys, sxwl.trainer.run as run; run.MAX_LOG_POINTS = {max_log_points}; "
            "sys.argv[0] = 'sxwl.trainer'; runpy.run_module('sxwl.trainer', run_name='__main__')",
            str(run_file),
        ]
    proc = subprocess.run(
        [sys.executable, *command],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    lines = [p for line in proc.stdout.splitlines() if (p := parse_progress(line)) is not None]
    return proc, lines


def of(lines: list[Progress], kind: str) -> list[Progress]:
    return [p for p in lines if p.kind == kind]


def test_a_fine_tune_learns_reports_and_leaves_a_loadable_adapter(model_dir: Path, tmp_path: Path) -> None:
    validation = sample_dataset(tmp_path / "val.jsonl", 8, seed=3)
    run = write_run(
        tmp_path,
        model_dir,
        hyperparameters={"n_epochs": 6, "batch_size": 4, "learning_rate_multiplier": 10.0},
        validation_file=str(validation),
    )
    output = tmp_path / "out"
    proc, lines = run_trainer(run, output)
    assert proc.returncode == 0, proc.stderr

    # First what the tokenizer made of each file, counted exactly as the trainer feeds them.
    train_count, valid_count = (line.dataset for line in lines[:2])
    assert train_count is not None and valid_count is not None
    assert (train_count.file, train_count.examples, train_count.dropped) == ("training_file", 24, 0)
    assert (valid_count.file, valid_count.examples) == ("validation_file", 8)
    assert 0 < train_count.loss_tokens < train_count.tokens <= 24 * 48  # max_seq_len 48
    started = lines[2]
    assert started.kind == "started" and started.total_steps == 36  # 24 examples / 4, 6 epochs
    assert started.message == "on cpu"
    metrics = of(lines, "metrics")
    assert [m.step for m in metrics] == list(range(1, 37))
    assert all(m.loss is not None and m.learning_rate is not None and m.trained_tokens for m in metrics)
    losses = [m.loss for m in metrics if m.loss is not None]
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5 - 0.2

    evals = of(lines, "eval")
    assert [e.step for e in evals] == [6, 12, 18, 24, 30, 36]
    assert all(e.eval_loss is not None for e in evals)

    checkpoints = of(lines, "checkpoint")
    assert [c.checkpoint for c in checkpoints] == [checkpoint_artifact(s) for s in (6, 12, 18, 24, 30, 36)]
    for c in checkpoints:
        assert c.checkpoint is not None
        with tarfile.open(output / c.checkpoint) as tar:
            assert {"adapter_model.safetensors", "trainer_state.json", "optimizer.pt"} <= set(tar.getnames())
    assert sorted(p.name for p in (output / "checkpoints").iterdir()) == [
        Path(c.checkpoint or "").name for c in checkpoints
    ]  # no partial tar left behind
    done = lines[-1]
    assert done.kind == "done" and done.step == done.total_steps == 36

    adapter = tmp_path / "adapter"
    with tarfile.open(output / ADAPTER_ARTIFACT) as tar:
        tar.extractall(adapter, filter="data")
    assert {"adapter_config.json", "adapter_model.safetensors", "tokenizer.json"} <= {
        p.name for p in adapter.iterdir()
    }
    tokenizer = AutoTokenizer.from_pretrained(adapter)
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(model_dir), str(adapter))
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Translate to Chinese: cat"}], tokenize=False, add_generation_prompt=True
    )
    assert isinstance(prompt, str)
    ids = tokenizer(prompt, return_tensors="pt", add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        out = model.generate(input_ids=ids, max_new_tokens=4, do_sample=False)  # type: ignore[no-untyped-call]
    assert out.shape[1] > ids.shape[1]


def test_a_resumed_run_goes_on_from_the_checkpoints_step(model_dir: Path, tmp_path: Path) -> None:
    first_out = tmp_path / "first"
    proc, first = run_trainer(write_run(tmp_path, model_dir), first_out)
    assert proc.returncode == 0, proc.stderr
    epoch_one = of(first, "checkpoint")[0]
    assert epoch_one.step == 6 and epoch_one.checkpoint is not None

    again = tmp_path / "again"
    again.mkdir()
    run = write_run(again, model_dir, resume_from=str(first_out / epoch_one.checkpoint))
    proc, second = run_trainer(run, tmp_path / "second")
    assert proc.returncode == 0, proc.stderr
    resumed = of(second, "resumed")[0]
    assert resumed.step == 6 and resumed.total_steps == 12
    assert not of(second, "started")
    assert [m.step for m in of(second, "metrics")] == list(range(7, 13))
    assert second[-1].kind == "done" and second[-1].step == first[-1].step == 12
    assert (tmp_path / "second" / ADAPTER_ARTIFACT).is_file()


def test_checkpoints_every_n_steps_when_asked(model_dir: Path, tmp_path: Path) -> None:
    run = write_run(tmp_path, model_dir, checkpoint_every_steps=4)
    proc, lines = run_trainer(run, tmp_path / "out")
    assert proc.returncode == 0, proc.stderr
    assert [c.step for c in of(lines, "checkpoint")] == [4, 8, 12]


def test_a_checkpoint_between_logging_steps_logs_its_step_timed_by_the_trainer(
    model_dir: Path, tmp_path: Path
) -> None:
    """A long run logs every few steps; a step it saves at is logged too, so the cloud finds the
    checkpoint's losses at its own step. Every line says when it ran (``elapsed_s``)."""
    run = write_run(tmp_path, model_dir, checkpoint_every_steps=4)
    proc, lines = run_trainer(run, tmp_path / "out", max_log_points=4)  # 12 steps: every 3rd logged
    assert proc.returncode == 0, proc.stderr
    metrics = of(lines, "metrics")
    assert [c.step for c in of(lines, "checkpoint")] == [4, 8, 12]
    assert [m.step for m in metrics] == [3, 4, 6, 8, 9, 12]
    times = [m.elapsed_s for m in metrics if m.elapsed_s is not None]
    assert len(times) == len(metrics) and times == sorted(times) and times[0] > 0
    assert lines[-1].kind == "done" and lines[-1].loss is None  # one training loss: the logged one


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "bad run file"),
        ('{"model_dir": "m"}', "hyperparameters"),
    ],
)
def test_a_bad_run_file_fails_in_one_line(tmp_path: Path, content: str, message: str) -> None:
    run = tmp_path / "run.json"
    run.write_text(content)
    proc, lines = run_trainer(run, tmp_path / "out")
    assert proc.returncode != 0 and not lines
    assert message in proc.stderr and proc.stderr.startswith("sxwl-trainer: error:")
    assert len(proc.stderr.strip().splitlines()) == 1


def test_a_missing_model_dir_and_an_empty_dataset_are_refused(model_dir: Path, tmp_path: Path) -> None:
    proc, _ = run_trainer(write_run(tmp_path, tmp_path / "nowhere"), tmp_path / "out")
    assert proc.returncode != 0 and "model_dir" in proc.stderr and "not found" in proc.stderr

    run = write_run(tmp_path, model_dir)
    (tmp_path / "train.jsonl").write_text("\n")
    proc, lines = run_trainer(run, tmp_path / "out")
    assert proc.returncode != 0 and "has no examples" in proc.stderr
    assert not of(lines, "started")

    (tmp_path / "train.jsonl").write_text('{"messages": [{"role": "user", "content": "hi"}]}\n')
    proc, _ = run_trainer(run, tmp_path / "out")
    assert proc.returncode != 0 and "training_file line 1" in proc.stderr


def test_only_the_answer_is_trained(model_dir: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    chat = [{"role": "user", "content": "Translate to English: 猫"}, {"role": "assistant", "content": "cat"}]
    example = tokenize(tokenizer, chat, max_seq_len=64)
    trained = [t for t in example.labels if t != IGNORE]
    assert tokenizer.decode(trained) == "cat<|eos|>\n"
    assert example.labels[: len(example.labels) - len(trained)] == [IGNORE] * (
        len(example.labels) - len(trained)
    )

    pair = tokenize(tokenizer, ("Translate to Chinese: dog ->", " 狗"), max_seq_len=64)
    assert tokenizer.decode([t for t in pair.labels if t != IGNORE]) == " 狗<|eos|>"
    assert len(tokenize(tokenizer, chat, max_seq_len=5).input_ids) == 5
