"""Typed rows and keys: the JSON columns' rows declare their wire models' fields, the artifact
upload routes declare their answer, and the key of a job's attempt is written and read by one pair
of functions."""

from __future__ import annotations

from collections.abc import Mapping

import pytest
from fastapi.testclient import TestClient
from pydantic import BaseModel

from sxwl.cloud.db.json_rows import CachedRow, GpuDeviceRow, GpuRow, NodeRow, StoredInput
from sxwl.protocol import GpuDevice, GpuInfo, Node, attempt_key, split_attempt_key
from sxwl.protocol.finetune import CachedInput, JobInput


def test_the_four_artifact_upload_routes_declare_what_they_answer(client: TestClient) -> None:
    spec = client.get("/api/v1/openapi.json").json()
    routes = [
        ("put", "/api/v1/agent/jobs/{job_id}/artifacts/{path}"),
        ("put", "/api/v1/agent/uploads/{job_id}/{attempt}/{path}"),
        ("post", "/api/v1/agent/jobs/{job_id}/upload-targets/done"),
        ("post", "/api/v1/agent/upload-targets/{job_id}/{attempt}/done"),
    ]
    for method, path in routes:
        created = spec["paths"][path][method]["responses"]["201"]["content"]["application/json"]["schema"]
        assert created == {"$ref": "#/components/schemas/ArtifactRecorded"}, (method, path)
    fields = spec["components"]["schemas"]["ArtifactRecorded"]
    assert sorted(fields["required"]) == ["path", "sha256", "size"]


@pytest.mark.parametrize(
    ("key", "parts"),
    [
        (attempt_key("0f3a", 2), ("0f3a", 2)),
        (attempt_key("a:b", 12), ("a:b", 12)),  # the attempt is what follows the last colon
        ("0f3a", None),
        ("0f3a:", None),
        (":3", None),
        ("0f3a:²", None),  # a digit to Unicode, not to int()
    ],
)
def test_an_attempt_key_reads_back_as_its_job_and_attempt(key: str, parts: tuple[str, int] | None) -> None:
    assert split_attempt_key(key) == parts


@pytest.mark.parametrize(
    ("row", "model", "beside"),
    [
        (NodeRow, Node, set()),
        (GpuRow, GpuInfo, set()),
        (GpuDeviceRow, GpuDevice, set()),
        (StoredInput, JobInput, {"object"}),
        (CachedRow, CachedInput, set()),
    ],
)
def test_each_json_rows_keys_are_its_wire_models_fields(
    row: type[Mapping[str, object]], model: type[BaseModel], beside: set[str]
) -> None:
    """A field added to a wire model is a key its row declares too; an optional field's key may be
    absent (rows are dumped with exclude_none)."""
    keys: frozenset[str] = row.__required_keys__ | row.__optional_keys__  # type: ignore[attr-defined]
    assert keys == set(model.model_fields) | beside
    optional = {name for name, field in model.model_fields.items() if not field.is_required()}
    assert row.__optional_keys__ <= optional  # type: ignore[attr-defined]
