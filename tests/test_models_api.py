"""The model catalogue: base models uploaded as archives of a model directory (checked before they are
stored), public ones registered by admins (API and CLI), adapters, and who sees what."""

from __future__ import annotations

import io
import json
import struct
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient
from typer.testing import CliRunner

from sxwl.cli.client import CliError
from sxwl.cli.main import app as cli
from sxwl.cloud.context import CloudContext
from sxwl.cloud.db.finetune_models import CatalogModel, ModelKind
from sxwl.cloud.db.models import User
from tests.conftest import login, register
from tests.test_admin_api import make_admin

TENSORS = {"embed.weight": [4, 3], "head.weight": [3, 4], "norm": [3]}  # 12 + 12 + 3 parameters
PARAMETERS = 27
# The start of a SentencePiece ModelProto: field 1 (a piece: "<unk>", score 0.0).
SENTENCEPIECE = b"\x0a\x0c\x0a\x05<unk>\x15\x00\x00\x00\x00"


def safetensors_bytes(tensors: dict[str, list[int]]) -> bytes:
    """A safetensors file by hand: an 8-byte little-endian header length, the JSON header, the data."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, shape in tensors.items():
        size = 4
        for dim in shape:
            size *= dim
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw + bytes(offset)


def model_files(**changes: bytes | None) -> dict[str, bytes]:
    files: dict[str, bytes | None] = {
        "config.json": json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}).encode(),
        "tokenizer.json": json.dumps({"version": "1.0", "model": {"type": "BPE"}}).encode(),
        "model.safetensors": safetensors_bytes(TENSORS),
        **changes,
    }
    return {name: data for name, data in files.items() if data is not None}


def archive(
    files: dict[str, bytes], gzip: bool = True, extra: Callable[[tarfile.TarFile], None] | None = None
) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz" if gzip else "w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        if extra is not None:
            extra(tar)
    return buffer.getvalue()


def _user(client: TestClient, email: str) -> dict[str, str]:
    register(client, email, "user")
    return login(client, email)


def _upload(client: TestClient, headers: dict[str, str], name: str, body: bytes, admin: bool = False) -> Any:
    path = "/api/v1/admin/models" if admin else "/api/v1/models"
    return client.post(path, headers=headers, data={"name": name}, files={"file": ("m.tar.gz", body)})


def _ctx(client: TestClient) -> CloudContext:
    ctx: CloudContext = client.app.state.ctx  # type: ignore[attr-defined]
    return ctx


def _stored_models(client: TestClient) -> list[Path]:
    root = _ctx(client).settings.data_dir / "artifacts" / "models"
    return sorted(p for p in root.rglob("*") if p.is_file()) if root.exists() else []


def test_a_model_archive_is_checked_stored_and_private_to_its_owner(client: TestClient) -> None:
    owner = _user(client, "owner@example.com")
    other = _user(client, "other@example.com")
    body = archive(model_files())
    answer = _upload(client, owner, "tiny-llama", body)
    assert answer.status_code == 201, answer.text
    model = answer.json()
    assert model["id"] == "tiny-llama" and model["object"] == "model" and model["kind"] == "base"
    assert model["architecture"] == "LlamaForCausalLM" and model["parameters"] == PARAMETERS
    assert model["bytes"] == len(body) and model["base_model"] is None and isinstance(model["created"], int)

    assert [m["id"] for m in client.get("/v1/models", headers=owner).json()["data"]] == ["tiny-llama"]
    assert client.get("/v1/models/tiny-llama", headers=owner).json() == model
    download = client.get("/api/v1/models/tiny-llama/content", headers=owner)
    assert download.status_code == 200 and download.content == body

    assert client.get("/v1/models", headers=other).json() == {"object": "list", "data": []}
    assert client.get("/v1/models/tiny-llama", headers=other).status_code == 404
    assert client.get("/api/v1/models/tiny-llama/content", headers=other).status_code == 404


def test_an_uncompressed_tar_with_a_sentencepiece_tokenizer_is_accepted(client: TestClient) -> None:
    user = _user(client, "dev@example.com")
    files = model_files(**{"tokenizer.json": None, "tokenizer.model": SENTENCEPIECE})
    files["config.json"] = json.dumps({"model_type": "qwen2"}).encode()
    # Sharded, and larger than the default body limit (1 MiB): the upload route has its own.
    files["model-00001-of-00002.safetensors"] = files.pop("model.safetensors")
    files["model-00002-of-00002.safetensors"] = safetensors_bytes({"big": [512, 1024]})
    body = archive(files, gzip=False)
    assert len(body) > 2 * 1024 * 1024
    answer = _upload(client, user, "qwen-tiny", body)
    assert answer.status_code == 201, answer.text
    assert answer.json()["architecture"] == "qwen2"
    assert answer.json()["parameters"] == PARAMETERS + 512 * 1024


def _add_symlink(tar: tarfile.TarFile) -> None:
    info = tarfile.TarInfo("weights.safetensors")
    info.type = tarfile.SYMTYPE
    info.linkname = "/etc/passwd"
    tar.addfile(info)


def test_unsafe_or_incomplete_archives_are_refused_and_nothing_is_stored(client: TestClient) -> None:
    user = _user(client, "dev@example.com")
    refused: list[tuple[bytes, str]] = [
        (archive(model_files(**{"../evil.txt": b"x"})), "'..' is not allowed"),
        (archive(model_files(**{"/etc/cron.d/x": b"x"})), "absolute paths are not allowed"),
        (archive(model_files(), extra=_add_symlink), "links are not allowed"),
        (archive(model_files(**{"config.json": None})), "no config.json"),
        (archive(model_files(**{"tokenizer.json": None})), "no tokenizer"),
        (
            archive(model_files(**{"model.safetensors": None, "pytorch_model.bin": b"\x80\x04pickle"})),
            "safetensors only",
        ),
        (archive(model_files(**{"training_args.bin": b"\x80\x04pickle"})), "safetensors only"),
        (archive(model_files(**{"model.safetensors": None})), "no *.safetensors"),
        (archive(model_files(**{"model.safetensors": b"\xff" * 16})), "not a safetensors file"),
        (archive(model_files(**{"config.json": b"{}"})), "`architectures`"),
        (archive(model_files(**{"config.json": b"{"})), "config.json is not JSON"),
        (
            archive({f"m/{k}": v for k, v in model_files().items()}),
            "config.json must be at the archive's root",
        ),
        (b"not an archive at all", "not a tar"),
    ]
    for number, (body, expected) in enumerate(refused):
        answer = _upload(client, user, f"bad-{number}", body)
        assert answer.status_code == 422, (expected, answer.text)
        error = answer.json()["error"]
        assert expected in error["message"], (expected, error)
        assert error["details"][0]["field"] == "file"
    assert client.get("/v1/models", headers=user).json()["data"] == []
    assert _stored_models(client) == []


def test_names_are_checked_and_a_taken_one_is_a_conflict(client: TestClient) -> None:
    user = _user(client, "dev@example.com")
    body = archive(model_files())
    assert _upload(client, user, "tiny", body).status_code == 201
    taken = _upload(client, user, "tiny", body)  # another user's may: tests/test_model_names.py
    assert taken.status_code == 409 and taken.json()["error"]["code"] == "name_taken"
    for bad in ("-dash-first", "has space", "a/b", "x" * 101, ""):
        answer = _upload(client, user, bad, body)
        assert answer.status_code == 422, bad
        assert answer.json()["error"]["details"][0]["field"] == "name"


def test_a_model_too_large_is_refused(make_client: Callable[..., TestClient]) -> None:
    client = make_client(model_max_bytes=200)
    user = _user(client, "dev@example.com")
    answer = _upload(client, user, "tiny", archive(model_files()))
    assert answer.status_code == 413 and answer.json()["error"]["details"] == {"max_bytes": 200}
    assert _stored_models(client) == []


def test_public_models_are_registered_by_admins_only_and_seen_by_all(client: TestClient) -> None:
    admin = make_admin(client)
    user = _user(client, "dev@example.com")
    body = archive(model_files())
    refused = _upload(client, user, "public-tiny", body, admin=True)
    assert refused.status_code == 403
    assert client.get("/v1/models", headers=user).json()["data"] == []

    made = _upload(client, admin, "public-tiny", body, admin=True)
    assert made.status_code == 201 and made.json()["owned_by"] == "system"
    assert _upload(client, user, "mine", body).status_code == 201
    seen = {m["id"]: m["owned_by"] for m in client.get("/v1/models", headers=user).json()["data"]}
    assert seen["public-tiny"] == "system" and seen["mine"] != "system"
    third = _user(client, "third@example.com")
    assert [m["id"] for m in client.get("/v1/models", headers=third).json()["data"]] == ["public-tiny"]
    assert client.get("/api/v1/models/public-tiny/content", headers=third).content == body
    # The same bytes are one object in the store, whatever the names.
    assert len(_stored_models(client)) == 1


def test_adapters_are_listed_and_downloaded_by_their_owner(client: TestClient) -> None:
    admin = make_admin(client)
    owner = _user(client, "owner@example.com")
    other = _user(client, "other@example.com")
    registered = _upload(client, admin, "base", archive(model_files()), admin=True)
    assert registered.status_code == 201
    ctx = _ctx(client)
    job_id = "a" * 32
    adapter = b"adapter tar bytes"
    where = ctx.settings.data_dir / "artifacts" / job_id / "adapter.tar"
    where.parent.mkdir(parents=True)
    where.write_bytes(adapter)
    name = "ft:base::ftjob-abc"
    with ctx.db.session() as session:
        owner_id = session.query(User).filter_by(email="owner@example.com").one().id
        base_id = session.query(CatalogModel.id).filter_by(name="base").scalar()
        session.add(
            CatalogModel(
                id=name,
                name=name,
                owner_id=owner_id,
                kind=ModelKind.ADAPTER,
                base_model_id=base_id,
                bytes=len(adapter),
                sha256="0" * 64,
                object={"job_id": job_id, "attempt": 1, "path": "adapter.tar"},
                fine_tune_id="ftjob-abc",
            )
        )
    listed = {m["id"]: m for m in client.get("/v1/models", headers=owner).json()["data"]}
    assert listed[name]["kind"] == "adapter" and listed[name]["base_model"] == "base"
    assert client.get(f"/api/v1/models/{name}/content", headers=owner).content == adapter
    assert name not in {m["id"] for m in client.get("/v1/models", headers=other).json()["data"]}
    assert client.get(f"/v1/models/{name}", headers=other).status_code == 404


def test_the_cli_registers_a_public_model_from_a_directory(tmp_path: Path, client: TestClient) -> None:
    model_dir = tmp_path / "hub-model"
    model_dir.mkdir()
    for name, data in model_files().items():
        (model_dir / name).write_bytes(data)
    (model_dir / ".cache").mkdir()  # what a hub download leaves: not part of the model
    settings = _ctx(client).settings
    env = {
        "SXWL_DATABASE_URL": settings.resolved_database_url(),
        "SXWL_SECRET_KEY": settings.secret_key,
        "SXWL_DATA_DIR": str(settings.data_dir),
    }
    runner = CliRunner()
    result = runner.invoke(cli, ["admin", "register-model", "--name", "cli-tiny", str(model_dir)], env=env)
    assert result.exit_code == 0, result.output
    assert "cli-tiny" in result.output and f"{PARAMETERS} parameters" in result.output
    again = runner.invoke(cli, ["admin", "register-model", "--name", "cli-tiny", str(model_dir)], env=env)
    # main() prints a CliError as one line and exits with its code; the runner hands it back.
    assert isinstance(again.exception, CliError) and again.exception.exit_code == 1
    assert "already exists" in str(again.exception)
    tarball = tmp_path / "m.tar"
    tarball.write_bytes(archive(model_files(**{"config.json": None}), gzip=False))
    bad = runner.invoke(cli, ["admin", "register-model", "--name", "cli-bad", str(tarball)], env=env)
    assert isinstance(bad.exception, CliError) and "no config.json" in str(bad.exception)
    assert str(tarball) in str(bad.exception)

    user = _user(client, "dev@example.com")
    model = client.get("/v1/models/cli-tiny", headers=user).json()
    assert model["owned_by"] == "system" and model["parameters"] == PARAMETERS
