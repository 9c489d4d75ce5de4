"""What the trainer reads is what the cloud accepted (docs/trainer.md): a dataset's lines are cut by
the upload's check and by the trainer with the same code (sxwl/protocol/jsonl.py), so characters
that ``str.splitlines`` takes for line ends leave a line whole for both; and a base model's weights
are loaded from safetensors only, so pickled weights in its directory are never opened."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

pytest.importorskip("torch", reason="the trainer needs the extra: pip install -e '.[train]'")
pytest.importorskip("transformers")

import torch
from safetensors.torch import load_file

from sxwl.trainer import TrainerError
from sxwl.trainer.data import read_records
from sxwl.trainer.run import load_base
from sxwl.trainer.tiny import build
from tests.test_files_api import _upload, _user

# What str.splitlines ends a line at and JSON allows: inside a string, or (\r) between values.
SEPARATORS = ("\u2028", "\u2029", "\u0085")


def _dataset() -> tuple[bytes, list[tuple[str, str]]]:
    pairs = [(f"one{s}line", f"still{s}one") for s in SEPARATORS]
    lines = [json.dumps({"prompt": p, "completion": c}, ensure_ascii=False).encode() for p, c in pairs]
    lines.append(b'{"prompt": "carriage",\r"completion": "return"}')
    pairs.append(("carriage", "return"))
    return b"\r\n".join(lines) + b"\r\n", pairs


def _downloaded(client: TestClient, headers: dict[str, str], body: bytes, path: Path) -> tuple[str, Path]:
    answer = _upload(client, headers, body)
    assert answer.status_code == 200, answer.text
    file_id: str = answer.json()["id"]
    path.write_bytes(client.get(f"/v1/files/{file_id}/content", headers=headers).content)
    return file_id, path


def test_a_file_the_check_accepts_reads_the_same_in_the_trainer(client: TestClient, tmp_path: Path) -> None:
    user = _user(client, "dev@example.com")
    body, pairs = _dataset()
    file_id, path = _downloaded(client, user, body, tmp_path / "train.jsonl")
    checked = client.get(f"/v1/files/{file_id}", headers=user).json()
    assert checked["status"] == "processed", checked
    assert checked["validation"]["examples"] == len(pairs)
    assert read_records(path, where="training_file") == pairs


def test_the_check_and_the_trainer_name_the_same_line(client: TestClient, tmp_path: Path) -> None:
    user = _user(client, "dev@example.com")
    body, pairs = _dataset()
    bad = body + b'{"prompt": "no completion"}\n'
    file_id, path = _downloaded(client, user, bad, tmp_path / "bad.jsonl")
    problems = client.get(f"/v1/files/{file_id}", headers=user).json()["validation"]["problems"]
    assert [p["line"] for p in problems] == [len(pairs) + 1]
    with pytest.raises(TrainerError, match=f"^training_file line {len(pairs) + 1}: "):
        read_records(path, where="training_file")


def test_the_trainer_never_opens_pickled_weights(tmp_path: Path) -> None:
    model = build(tmp_path / "model", seed=1)
    weights = model / "model.safetensors"
    torch.save(load_file(weights), model / "pytorch_model.bin")  # the same weights, pickled
    weights.unlink()
    with pytest.raises(TrainerError, match="model_dir: cannot load") as refused:
        load_base(model)
    assert "safetensors" in str(refused.value)
