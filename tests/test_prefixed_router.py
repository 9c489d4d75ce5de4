"""cloud/edge/prefixed.py: a router refuses a path outside its prefix before trying its routes, and
paths inside it are routed as before (a match, a 405 naming the allowed methods, a 404, the
trailing-slash redirect)."""

from __future__ import annotations

import pytest
from fastapi import APIRouter, FastAPI
from fastapi.testclient import TestClient
from starlette.routing import Match
from starlette.types import Scope

from sxwl.cloud.edge.prefixed import PrefixedRouter


def app_with(tried: list[str]) -> FastAPI:
    api = PrefixedRouter(prefix="/api/v1")

    @api.get("/things/{thing_id}")
    def thing(thing_id: int) -> dict[str, int]:
        tried.append(f"thing {thing_id}")
        return {"id": thing_id}

    openai = PrefixedRouter(prefix="/v1")

    @openai.post("/chat/completions")
    def chat() -> dict[str, str]:
        return {"ok": "yes"}

    app = FastAPI()
    app.include_router(api)
    app.include_router(openai)
    return app


def test_paths_inside_the_prefix_are_routed_as_before() -> None:
    tried: list[str] = []
    client = TestClient(app_with(tried))
    assert client.get("/api/v1/things/7").json() == {"id": 7}
    assert tried == ["thing 7"]
    assert client.post("/v1/chat/completions").json() == {"ok": "yes"}
    wrong_method = client.post("/api/v1/things/7")
    assert wrong_method.status_code == 405 and wrong_method.headers["allow"] == "GET"
    assert client.get("/api/v1/nothing").status_code == 404
    assert client.get("/v1/chat/completions").status_code == 405
    redirected = client.get("/api/v1/things/7/", follow_redirects=False)
    assert redirected.status_code == 307 and redirected.headers["location"].endswith("/api/v1/things/7")


def test_a_path_outside_the_prefix_is_refused_without_trying_a_route(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    router = PrefixedRouter(prefix="/api/v1")

    @router.get("/{anything:path}")
    def anything(anything: str) -> str:
        return anything

    app = FastAPI()
    app.include_router(router)
    (included,) = (r for r in app.router.routes if getattr(r, "original_router", None) is router)
    asked: list[str] = []
    tried = APIRouter.matches

    def spy(self: APIRouter, scope: Scope) -> tuple[Match, Scope]:
        asked.append(scope["path"])
        return tried(self, scope)

    monkeypatch.setattr(APIRouter, "matches", spy)
    outside: Scope = {"type": "http", "path": "/v1/chat/completions", "method": "POST", "root_path": ""}
    inside: Scope = {"type": "http", "path": "/api/v1/x", "method": "GET", "root_path": ""}
    assert included.matches(outside)[0] == Match.NONE
    assert included.matches(inside)[0] == Match.FULL
    assert asked == ["/api/v1/x"]
