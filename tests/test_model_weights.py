"""A base model's files are judged by their bytes, never by their names (docs/finetune.md, "Models"):
safetensors weights with a header that fits the file (a shape past 2^63 is a 422 naming the tensor,
not a 500 with the archive left in the store), text that is not a pickle, a SentencePiece model;
any other file is refused whatever it is called, and an index may name only safetensors files."""

from __future__ import annotations

import gzip
import json
import os
import pickle
import struct
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.test_models_api import (
    PARAMETERS,
    SENTENCEPIECE,
    _stored_models,
    _upload,
    _user,
    archive,
    model_files,
    safetensors_bytes,
)


def _header_only(header: dict[str, Any], data: bytes) -> bytes:
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + data


class Payload:
    """What unpickling these bytes would do: write a file. Nothing may ever run it."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize(
    ("header", "data", "expected"),
    [
        # 2^96 elements in 4 bytes: the product that was a 500 and an orphaned archive.
        ({"huge": {"dtype": "F32", "shape": [2**32, 2**32, 2**32], "data_offsets": [0, 4]}}, 4, "'huge'"),
        ({"big": {"dtype": "U8", "shape": [2**62, 4], "data_offsets": [0, 8]}}, 8, "'big'"),
        ({"past": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, 8, "outside the file"),
        ({"odd": {"dtype": "Q7", "shape": [2], "data_offsets": [0, 2]}}, 2, "unknown dtype 'Q7'"),
        ({"neg": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}}, 4, "non-negative integers"),
        (
            {
                "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]},
            },
            12,
            "overlap or leave gaps",
        ),
    ],
    ids=["past-2^96", "past-2^63", "outside", "dtype", "negative", "overlap"],
)
def test_a_header_that_does_not_fit_its_file_is_a_422_naming_the_tensor_and_stores_nothing(
    client: TestClient, header: dict[str, Any], data: int, expected: str
) -> None:
    user = _user(client, "dev@example.com")
    weights = _header_only(header, bytes(data))
    answer = _upload(client, user, "huge", archive(model_files(**{"model.safetensors": weights})))
    assert answer.status_code == 422, answer.text
    message = answer.json()["error"]["message"]
    assert "'model.safetensors'" in message and expected in message, message
    assert answer.json()["error"]["details"][0]["field"] == "file"
    assert client.get("/v1/models", headers=user).json()["data"] == []
    assert _stored_models(client) == []


def test_weights_other_than_safetensors_are_refused_whatever_their_names(
    client: TestClient, tmp_path: Path
) -> None:
    user = _user(client, "dev@example.com")
    marker = tmp_path / "ran"
    binary_pickle = pickle.dumps(Payload(marker), protocol=4)
    text_pickle = pickle.dumps(Payload(marker), protocol=0)  # ASCII: passes for text
    index = {"metadata": {}, "weight_map": {"embed.weight": "shard.dat"}}
    refused: list[tuple[dict[str, bytes | None], str]] = [
        ({"pytorch_model.BIN": binary_pickle}, "safetensors only"),
        ({"weights.PTH": binary_pickle}, "safetensors only"),
        ({"model.pt.gz": gzip.compress(binary_pickle)}, "safetensors only"),
        ({"shard.dat": binary_pickle}, "a pickle"),
        ({"notes.txt": text_pickle}, "a pickle"),
        ({"logo.png": b"\x89PNG\r\n\x1a\n" + bytes(64)}, "a binary file that is not safetensors"),
        ({"extra.safetensors": b"# not weights at all\n"}, "not a safetensors file"),
        (
            {"pytorch_model.bin.index.json": json.dumps(index).encode(), "shard.dat": text_pickle},
            "safetensors only",
        ),
        (
            {"model.safetensors.index.json": json.dumps(index).encode(), "shard.dat": b"vocab\n"},
            "names 'shard.dat'",
        ),
        ({"model.safetensors.index.json": json.dumps(index).encode()}, "names 'shard.dat'"),
    ]
    for number, (extra, expected) in enumerate(refused):
        answer = _upload(client, user, f"bad-{number}", archive(model_files(**extra)))
        assert answer.status_code == 422, (extra.keys(), answer.text)
        assert expected in answer.json()["error"]["message"], (expected, answer.json())
    assert client.get("/v1/models", headers=user).json()["data"] == []
    assert _stored_models(client) == []
    assert not marker.exists()


def test_safetensors_under_any_name_text_and_sentencepiece_are_accepted(client: TestClient) -> None:
    """Written by the safetensors library itself, in several dtypes; a shard whose name says
    nothing, found through its index."""
    numpy = pytest.importorskip("numpy")
    safetensors_numpy = pytest.importorskip("safetensors.numpy")
    user = _user(client, "dev@example.com")
    shard = safetensors_numpy.save(
        {
            "half": numpy.zeros((3, 5), dtype=numpy.float16),
            "ids": numpy.arange(7, dtype=numpy.int64),
            "mask": numpy.ones((2, 2), dtype=numpy.bool_),
            "empty": numpy.zeros((0, 9), dtype=numpy.float32),
        }
    )
    index = {"weight_map": {"embed.weight": "model.safetensors", "half": "weights/shard.dat"}}
    files = model_files(
        **{
            "model.safetensors.index.json": json.dumps(index).encode(),
            "weights/shard.dat": shard,
            "tokenizer.model": SENTENCEPIECE,
            "README.md": "# 一个模型\n\nA model card.\n".encode(),
            "merges.txt": b"#version: 0.2\nh e\n",
        }
    )
    answer = _upload(client, user, "any-names", archive(files))
    assert answer.status_code == 201, answer.text
    assert answer.json()["parameters"] == PARAMETERS + 15 + 7 + 4


def test_a_safetensors_file_the_library_would_refuse_is_refused(client: TestClient) -> None:
    user = _user(client, "dev@example.com")
    short = safetensors_bytes({"w": [2, 2]})[:-4]  # the data ends before the last tensor's does
    answer = _upload(client, user, "short", archive(model_files(**{"model.safetensors": short})))
    assert answer.status_code == 422 and "outside the file" in answer.json()["error"]["message"]
