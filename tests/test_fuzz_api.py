"""The REST API fuzzed from its own OpenAPI document (schemathesis), on SQLite and PostgreSQL: with a
compute user's token, a CPod's token, and (for the two endpoints that take it) the provider's
accessKey. Any 5xx fails, and so does an answer the document does not declare: its status code, its
content type, its headers or its body.

Bounded so the run stays short: ``MAX_EXAMPLES`` generated requests per operation and mode (valid
ones, then ones that break the schema), no deadline, no example database."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import hypothesis
import pytest
import schemathesis
import uvicorn
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import CheckFunction, not_a_server_error
from schemathesis.core.result import Ok
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from sxwl.cloud.app import create_app
from tests.support import cloud
from tests.support.net import free_port

MAX_EXAMPLES = 30
REQUEST_TIMEOUT_S = 60
Operation = schemathesis.APIOperation[Any, Any, Any, Any]
CHECKS: list[CheckFunction] = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]
PASSWORD = "correct horse"
ACCESS_KEY_PATHS = ("/api/v1/agent/register", "/api/v1/agent/access-key/check")
# Run last: they end the session or the CPod the other operations are called with.
LAST = ("POST /api/v1/auth/logout", "DELETE /api/v1/cpods/{cpod_id}")


@dataclass(frozen=True)
class Served:
    url: str
    user: dict[str, str]
    provider: dict[str, str]
    access_key: dict[str, str]
    cpod: dict[str, str]
    job_id: str
    cpod_id: str


@pytest.fixture
def served(tmp_path: Path, db_url: str) -> Iterator[Served]:
    """A cloud on loopback (uvicorn, as in production), with a user, a provider, a CPod and a job."""
    # Long-polls held for at most a moment: the fuzzer asks for any wait, and waits for every answer.
    app = create_app(cloud.test_settings(tmp_path / "data", db_url, longpoll_max_s=0.2))
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "the cloud did not start"
        time.sleep(0.05)
    try:
        yield _populate(url)
    finally:
        server.should_exit = True
        thread.join(30)


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _populate(url: str) -> Served:
    # httpx's 5 s default is too short for a registration's password hash on a loaded 2-core CI box.
    with httpx.Client(base_url=url, timeout=60) as http:
        tokens = {}
        for email, role in (("user@example.com", "user"), ("provider@example.com", "provider")):
            body = {"email": email, "password": PASSWORD, "role": role}
            http.post("/api/v1/auth/register", json=body).raise_for_status()
            login = http.post("/api/v1/auth/login", json={"email": email, "password": PASSWORD})
            tokens[role] = _bearer(login.raise_for_status().json()["access_token"])
        key = _bearer(http.get("/api/v1/me/access-key", headers=tokens["provider"]).json()["access_key"])
        registered = http.post(
            "/api/v1/agent/register",
            headers=key,
            json={"cluster_uid": "cluster-fuzz", "runtime": "local", "agent_version": "fuzz"},
        ).raise_for_status()
        job = http.post("/api/v1/jobs", headers=tokens["user"], json={"command": ["true"]}).raise_for_status()
    return Served(
        url=url,
        user=tokens["user"],
        provider=tokens["provider"],
        access_key=key,
        cpod=_bearer(registered.json()["cpod_token"]),
        job_id=job.json()["id"],
        cpod_id=registered.json()["cpod_id"],
    )


def _operations(schema: schemathesis.BaseSchema) -> list[Operation]:
    operations = [result.ok() for result in schema.get_all_operations() if isinstance(result, Ok)]
    return sorted(operations, key=lambda op: op.label in LAST)


@pytest.mark.parametrize("caller", ["user", "cpod"])
def test_no_answer_outside_the_document(served: Served, caller: str) -> None:
    # The document is built on its first request: on a loaded 2-core box that can take more than httpx's 5 s.
    spec = httpx.get(f"{served.url}/api/v1/openapi.json", timeout=60).raise_for_status().json()
    schema = schemathesis.openapi.from_dict(spec)
    ran, failures = 0, []
    for operation in _operations(schema):
        agent_side = operation.path.startswith("/api/v1/agent/")
        if agent_side != (caller == "cpod"):
            continue
        headers = (
            served.access_key
            if operation.path in ACCESS_KEY_PATHS
            else served.cpod
            if caller == "cpod"
            else served.user
        )
        try:
            _fuzz(operation, served.url, headers)
        except Exception as exc:  # every operation is fuzzed, and all that fail are reported together
            failures.append(f"{operation.label}: {_described(exc)}")
        ran += 1
    assert not failures, "\n\n".join(failures)
    assert ran >= (8 if caller == "cpod" else 20)


def _described(exc: BaseException) -> str:
    """The failure with the errors inside it: Hypothesis wraps a failure it could not reproduce in a
    group whose own message names none of them."""
    inner = exc.exceptions if isinstance(exc, BaseExceptionGroup) else ()
    return "\n".join([str(exc), *(f"  {type(e).__name__}: {e}" for e in inner)])


def _fuzz(operation: Operation, url: str, headers: dict[str, str]) -> None:
    cases = st.one_of(
        operation.as_strategy(GenerationMode.POSITIVE), operation.as_strategy(GenerationMode.NEGATIVE)
    )

    @hypothesis.given(case=cases)
    @hypothesis.settings(
        max_examples=MAX_EXAMPLES,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(hypothesis.HealthCheck),
        phases=[hypothesis.Phase.explicit, hypothesis.Phase.generate],
    )
    def run(case: schemathesis.Case[Any]) -> None:
        # schemathesis gives each request 10 s; a loaded 2-core CI box has taken longer to answer one.
        case.call_and_validate(base_url=url, headers=headers, checks=CHECKS, timeout=REQUEST_TIMEOUT_S)

    run()
