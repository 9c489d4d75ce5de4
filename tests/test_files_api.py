"""Uploaded files (/v1/files): validated line by line as they stream in, private to their owner."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from sxwl.cloud.app import create_app
from sxwl.cloud.context import CloudContext
from sxwl.cloud.db.finetune_models import DataFile
from sxwl.cloud.errors import AppError
from sxwl.cloud.services.finetune import datasets
from tests.conftest import MakeSettings, login, register
from tests.support.seaweedfs import SeaweedFS
from tests.test_s3_artifacts import s3_settings

CHAT = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
PROMPT = {"prompt": "2+2=", "completion": "4"}


def _user(client: TestClient, email: str) -> dict[str, str]:
    register(client, email, "user")
    return login(client, email)


def _upload(
    client: TestClient,
    headers: dict[str, str],
    body: bytes,
    purpose: str = "fine-tune",
    name: str = "train.jsonl",
) -> Any:
    return client.post(
        "/v1/files",
        headers=headers,
        data={"purpose": purpose},
        files={"file": (name, body, "application/jsonl")},
    )


def _jsonl(*rows: object) -> bytes:
    return b"".join(json.dumps(row).encode() + b"\n" for row in rows)


def _stored_files(client: TestClient) -> list[Path]:
    ctx: CloudContext = client.app.state.ctx  # type: ignore[attr-defined]
    root = ctx.settings.data_dir / "artifacts" / "files"
    return sorted(p for p in root.rglob("*") if p.is_file()) if root.exists() else []


def test_valid_chat_and_prompt_completion_files_are_processed(client: TestClient) -> None:
    user = _user(client, "dev@example.com")
    chat = _jsonl(CHAT, CHAT, {"messages": [{"role": "system", "content": "be brief"}, *CHAT["messages"]]})
    answer = _upload(client, user, chat + b"\n\n")  # blank lines are ignored
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["id"].startswith("file-") and len(body["id"]) == 5 + 24
    assert body["object"] == "file" and body["status"] == "processed" and body["status_details"] is None
    assert (
        body["bytes"] == len(chat) + 2
        and body["filename"] == "train.jsonl"
        and body["purpose"] == "fine-tune"
    )
    assert isinstance(body["created_at"], int)
    assert body["validation"] == {
        "format": "chat",
        "examples": 3,
        "problems": [],
        "problem_count": 0,
        "tokens": {},  # counted once a fine-tune has tokenized it with its base model
    }

    prompt = _upload(client, user, _jsonl(PROMPT, PROMPT)).json()
    assert prompt["status"] == "processed"
    assert prompt["validation"]["format"] == "prompt_completion" and prompt["validation"]["examples"] == 2

    # What was stored is what was sent.
    content = client.get(f"/v1/files/{body['id']}/content", headers=user)
    assert content.status_code == 200 and content.content == chat + b"\n\n"
    assert client.get(f"/v1/files/{body['id']}", headers=user).json() == body


def test_problems_are_reported_with_their_lines(client: TestClient) -> None:
    user = _user(client, "dev@example.com")
    lines = [
        json.dumps(CHAT),
        "{not json",  # 2
        json.dumps(CHAT),
        json.dumps(CHAT),
        json.dumps(
            {"messages": [{"role": "robot", "content": "x"}, {"role": "assistant", "content": "y"}]}
        ),  # 5
        json.dumps(CHAT),
        json.dumps(PROMPT),  # 7: another format than the first line's
        json.dumps(CHAT),
    ]
    body = _upload(client, user, "\n".join(lines).encode()).json()
    assert body["status"] == "error"
    validation = body["validation"]
    assert validation["format"] == "chat" and validation["examples"] == 5 and validation["problem_count"] == 3
    problems = {p["line"]: p["message"] for p in validation["problems"]}
    assert sorted(problems) == [2, 5, 7]
    assert problems[2].startswith("not JSON")
    assert "unknown role 'robot'" in problems[5] and "messages[0].role" in problems[5]
    assert "prompt_completion example in a chat file" in problems[7]
    assert body["status_details"].startswith("line 2: not JSON") and "2 more" in body["status_details"]


def test_each_kind_of_problem_names_what_is_wrong(client: TestClient) -> None:
    user = _user(client, "dev@example.com")
    cases: list[tuple[bytes, str]] = [
        (b"[1, 2]", "not a JSON object"),
        (json.dumps({"text": "x"}).encode(), "missing `messages`"),
        (json.dumps({"messages": []}).encode(), "`messages` must be a non-empty list"),
        (json.dumps({"messages": [{"role": "user", "content": ""}]}).encode(), "messages[0].content"),
        (json.dumps({"messages": [{"role": "user", "content": 3}]}).encode(), "non-empty string"),
        (json.dumps({"messages": [{"role": "user", "content": "q"}]}).encode(), "no assistant message"),
        (json.dumps({"prompt": "p"}).encode(), "missing `completion`"),
        (b"\xff\xfe", "not UTF-8"),
        (b"[" * 100_000, "not JSON"),
    ]
    for raw, expected in cases:
        validation = _upload(client, user, raw + b"\n").json()["validation"]
        assert validation["problems"][0]["line"] == 1 and expected in validation["problems"][0]["message"], (
            raw[:40]
        )


def test_a_line_past_the_limit_is_one_problem_and_the_rest_is_judged(client: TestClient) -> None:
    user = _user(client, "dev@example.com")
    long_line = json.dumps({"messages": [{"role": "user", "content": "x" * (1024 * 1024 + 10)}]}).encode()
    body = _upload(client, user, _jsonl(CHAT) + long_line + b"\n" + _jsonl(CHAT)).json()
    assert body["validation"]["problems"] == [{"line": 2, "message": "line is longer than 1048576 bytes"}]
    assert body["validation"]["examples"] == 2


def test_an_empty_file_is_an_error(client: TestClient) -> None:
    user = _user(client, "dev@example.com")
    for raw in (b"", b"\n  \n"):
        body = _upload(client, user, raw).json()
        assert body["status"] == "error" and body["validation"]["examples"] == 0
        assert "empty" in body["validation"]["problems"][0]["message"]


def test_a_file_too_large_is_refused_and_nothing_is_stored(make_client: Callable[..., TestClient]) -> None:
    client = make_client(file_max_bytes=1000)
    user = _user(client, "dev@example.com")
    big = _jsonl(*[CHAT] * 20)
    assert len(big) > 1000
    answer = _upload(client, user, big)
    assert answer.status_code == 413, answer.text
    assert answer.json()["error"]["details"] == {"max_bytes": 1000}
    assert client.get("/v1/files", headers=user).json()["data"] == []
    assert _stored_files(client) == []
    # Far past the limit, the body limit refuses it before it is read.
    assert _upload(client, user, b"x" * (3 * 1024 * 1024)).status_code == 413
    assert _stored_files(client) == []


def test_a_purpose_other_than_fine_tune_is_refused(client: TestClient) -> None:
    user = _user(client, "dev@example.com")
    answer = _upload(client, user, _jsonl(CHAT), purpose="assistants")
    assert answer.status_code == 422 and answer.json()["error"]["details"][0]["field"] == "purpose"
    missing = client.post("/v1/files", headers=user, data={"purpose": "fine-tune"})
    assert missing.status_code == 422
    assert client.get("/v1/files", headers=user).json()["data"] == []


def test_another_users_file_is_not_found(client: TestClient) -> None:
    owner = _user(client, "owner@example.com")
    other = _user(client, "other@example.com")
    file_id = _upload(client, owner, _jsonl(CHAT)).json()["id"]
    for method, path in (
        ("GET", f"/v1/files/{file_id}"),
        ("GET", f"/v1/files/{file_id}/content"),
        ("DELETE", f"/v1/files/{file_id}"),
    ):
        answer = client.request(method, path, headers=other)
        assert answer.status_code == 404, (method, path)
        assert answer.json()["error"]["code"] == "not_found"
    assert client.get("/v1/files", headers=other).json()["data"] == []
    assert client.get(f"/v1/files/{file_id}", headers=owner).status_code == 200
    assert client.get("/v1/files", headers={}).status_code == 401


def test_delete_forgets_the_file(client: TestClient) -> None:
    user = _user(client, "dev@example.com")
    file_id = _upload(client, user, _jsonl(CHAT)).json()["id"]
    assert client.delete(f"/v1/files/{file_id}", headers=user).json() == {
        "id": file_id,
        "object": "file",
        "deleted": True,
    }
    assert client.get(f"/v1/files/{file_id}", headers=user).status_code == 404
    ctx: CloudContext = client.app.state.ctx  # type: ignore[attr-defined]
    with ctx.db.session() as session:
        assert session.get(DataFile, file_id) is None
    assert _stored_files(client) == []  # the bytes went with the row
    assert client.delete(f"/v1/files/{file_id}", headers=user).status_code == 404


def test_list_pages_newest_first(client: TestClient) -> None:
    user = _user(client, "dev@example.com")
    ids = [_upload(client, user, _jsonl(CHAT), name=f"f{i}.jsonl").json()["id"] for i in range(5)]
    seen: list[str] = []
    after: str | None = None
    pages = 0
    while True:
        params: dict[str, Any] = {"limit": 2, **({"after": after} if after else {})}
        page = client.get("/v1/files", headers=user, params=params).json()
        assert page["object"] == "list" and len(page["data"]) <= 2
        seen += [f["id"] for f in page["data"]]
        pages += 1
        if not page["has_more"]:
            break
        after = page["data"][-1]["id"]
    assert pages == 3 and sorted(seen) == sorted(ids) and len(set(seen)) == 5
    names = [client.get(f"/v1/files/{i}", headers=user).json()["filename"] for i in seen]
    assert names == [f"f{i}.jsonl" for i in reversed(range(5))]
    unknown = client.get("/v1/files", headers=user, params={"after": "file-nope"})
    assert unknown.status_code == 422 and unknown.json()["error"]["details"][0]["field"] == "after"


def test_only_a_processed_file_of_ones_own_is_usable_for_a_fine_tune(client: TestClient) -> None:
    owner = _user(client, "owner@example.com")
    good = _upload(client, owner, _jsonl(CHAT)).json()["id"]
    bad = _upload(client, owner, b"{oops\n").json()["id"]
    ctx: CloudContext = client.app.state.ctx  # type: ignore[attr-defined]
    with ctx.db.session() as session:
        owner_id = session.get(DataFile, good).owner_id  # type: ignore[union-attr]
        assert datasets.usable(session, owner_id=owner_id, file_id=good, field="training_file").id == good
        for file_id, owner_of, expected in (
            (bad, owner_id, "has problems (line 1"),
            (good, "someone", "no file"),
        ):
            with pytest.raises(AppError) as refused:
                datasets.usable(session, owner_id=owner_of, file_id=file_id, field="validation_file")
            assert refused.value.status == 422 and expected in refused.value.message
            assert refused.value.details[0]["field"] == "validation_file"


def test_with_the_s3_store_files_and_models_download_by_redirect(
    make_settings: MakeSettings,
    seaweed: SeaweedFS,
    tmp_path: Path,
) -> None:
    from tests.test_models_api import archive, model_files

    client = TestClient(create_app(s3_settings(make_settings, seaweed, tmp_path)))
    with client:
        user = _user(client, "dev@example.com")
        data = _jsonl(CHAT, PROMPT)  # line 2: another format, judged on its way to the store
        body = _upload(client, user, data).json()
        assert body["validation"]["problems"][0]["line"] == 2
        model = archive(model_files())
        made = client.post(
            "/api/v1/models", headers=user, data={"name": "tiny"}, files={"file": ("m.tgz", model)}
        )
        assert made.status_code == 201, made.text
        for path, expected in (
            (f"/v1/files/{body['id']}/content", data),
            ("/api/v1/models/tiny/content", model),
        ):
            redirect = client.get(path, headers=user, follow_redirects=False)
            assert redirect.status_code == 307
            assert httpx.get(redirect.headers["location"]).content == expected
        # A deleted file's object goes too: the URL signed before the delete finds nothing.
        signed = client.get(f"/v1/files/{body['id']}/content", headers=user, follow_redirects=False)
        assert client.delete(f"/v1/files/{body['id']}", headers=user).status_code == 200
        assert httpx.get(signed.headers["location"]).status_code == 404


def test_the_first_hundred_problems_are_kept_and_all_are_counted(client: TestClient) -> None:
    user = _user(client, "dev@example.com")
    body = _upload(client, user, _jsonl(CHAT) + b"nope\n" * 150).json()
    validation = body["validation"]
    assert validation["problem_count"] == 150 and len(validation["problems"]) == 100
    assert [p["line"] for p in validation["problems"]] == list(range(2, 102))
    assert body["status_details"].endswith("(and 149 more problem(s))")
