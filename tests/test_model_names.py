"""Model names are each owner's (docs/finetune.md, "Models"): two users may give one name, which
neither sees nor learns of; a public name is everyone's; where a user's own name is also a public
one's, it means theirs to them (listing, download, fine-tune). Existing rows keep their names
through migration 0015 (SQLite and PostgreSQL)."""

from __future__ import annotations

import hashlib

from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory
from fastapi.testclient import TestClient

from sxwl.cloud.db import migrate
from tests.test_admin_api import make_admin
from tests.test_fine_tunes_api import BASE, FineTunes
from tests.test_models_api import _ctx, _upload, _user, archive, model_files, safetensors_bytes


def _model(tensors: dict[str, list[int]]) -> bytes:
    """A model archive of its own bytes (and sha256), told apart by its tensors."""
    return archive(model_files(**{"model.safetensors": safetensors_bytes(tensors)}))


def _before_names_per_owner(config: Config) -> str:
    """The revision before the migration, found by its name (revision ids are renumbered when
    branches merge)."""
    script = ScriptDirectory.from_config(config)
    (revision,) = (r for r in script.walk_revisions() if r.path.endswith("_model_names_per_owner.py"))
    assert isinstance(revision.down_revision, str)
    return revision.down_revision


def test_two_users_may_give_one_name_and_neither_learns_of_the_other(client: TestClient) -> None:
    alice, bob, carol = (_user(client, f"{n}@example.com") for n in ("alice", "bob", "carol"))
    alices, bobs = _model({"a": [2]}), _model({"b": [3]})
    assert _upload(client, alice, "llama", alices).status_code == 201
    answer = _upload(client, bob, "llama", bobs)  # a private name blocks nobody else's
    assert answer.status_code == 201, answer.text
    again = _upload(client, alice, "llama", bobs)
    assert again.status_code == 409 and again.json()["error"]["code"] == "name_taken"

    for headers, body in ((alice, alices), (bob, bobs)):
        me = client.get("/api/v1/me", headers=headers).json()["id"]
        listed = client.get("/v1/models", headers=headers).json()["data"]
        assert [(m["id"], m["owned_by"]) for m in listed] == [("llama", me)]
        assert client.get("/v1/models/llama", headers=headers).json()["owned_by"] == me
        assert client.get("/api/v1/models/llama/content", headers=headers).content == body
    assert client.get("/v1/models", headers=carol).json()["data"] == []
    assert client.get("/v1/models/llama", headers=carol).status_code == 404
    assert client.get("/api/v1/models/llama/content", headers=carol).status_code == 404


def test_a_public_name_is_everyones_and_a_users_own_name_comes_first(client: TestClient) -> None:
    ft = FineTunes(client)  # the public BASE, and a user with files and a CPod to run on
    admin = make_admin(client)
    other = _user(client, "other@example.com")
    taken = _upload(client, ft.user, BASE, _model({"x": [1]}))  # every user sees the public one
    assert taken.status_code == 409 and taken.json()["error"]["code"] == "name_taken"

    mine, public = _model({"mine": [4]}), _model({"public": [5]})
    assert _upload(client, ft.user, "mine", mine).status_code == 201
    registered = _upload(client, admin, "mine", public, admin=True)  # only public names conflict
    assert registered.status_code == 201, registered.text
    assert _upload(client, admin, "mine", public, admin=True).status_code == 409

    owners = [(m["id"], m["owned_by"]) for m in client.get("/v1/models", headers=ft.user).json()["data"]]
    assert owners == [(BASE, "system"), ("mine", ft.user_id)]
    assert client.get("/api/v1/models/mine/content", headers=ft.user).content == mine
    assert client.get("/v1/models/mine", headers=other).json()["owned_by"] == "system"
    assert client.get("/api/v1/models/mine/content", headers=other).content == public

    fine_tune = ft.created(model="mine")
    assert fine_tune["model"] == "mine"
    (model_input,) = [i for i in ft.job_row(fine_tune["job_id"]).inputs if i["name"] == "model"]
    assert model_input["sha256"] == hashlib.sha256(mine).hexdigest()


def test_models_and_fine_tunes_from_before_keep_their_names(client: TestClient) -> None:
    ft = FineTunes(client)  # BASE's row as rows were before: its name is its id
    fine_tune = ft.created()
    engine = _ctx(client).db.engine
    config = migrate.alembic_config(engine.url.render_as_string(hide_password=False))
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        command.downgrade(config, _before_names_per_owner(config))
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, "head")
    assert [m["id"] for m in client.get("/v1/models", headers=ft.user).json()["data"]] == [BASE]
    assert ft.get(fine_tune["id"])["model"] == BASE
    second = ft.created(suffix="again")
    assert second["model"] == BASE
