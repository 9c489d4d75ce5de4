"""CPod registration, heartbeats, liveness and isolation through the REST API (SQLite and PostgreSQL)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient

from sxwl.cloud.context import CloudContext
from sxwl.cloud.db.types import utcnow
from sxwl.cloud.services.fleet import cpods
from tests.conftest import login, register
from tests.support.cpods import access_key, beat, gpu_node, register_cpod
from tests.test_admin_api import make_admin


def provider(client: TestClient, email: str = "owner@example.com") -> tuple[dict[str, str], str]:
    register(client, email)
    headers = login(client, email)
    return headers, access_key(client, headers)


def ctx_of(client: TestClient) -> CloudContext:
    ctx: CloudContext = client.app.state.ctx  # type: ignore[attr-defined]
    return ctx


def test_register_then_heartbeat_shows_the_nodes(client: TestClient) -> None:
    headers, key = provider(client)
    reg = register_cpod(client, key, name="rack-1")
    assert reg["cpod_token"].startswith("sxcp_") and reg["cpod_token"] != key
    nodes = [
        gpu_node("worker1", used=2),
        gpu_node("worker2", allocatable=6),
        gpu_node("cpu1") | {"gpu": None},
    ]
    reply = beat(client, reg["cpod_token"], 1, nodes)
    assert reply.status_code == 200
    assert reply.json()["accepted"] is True and reply.json()["status"] == "online"

    (cpod,) = client.get("/api/v1/cpods", headers=headers).json()
    assert cpod["id"] == reg["cpod_id"] and cpod["name"] == "rack-1" and cpod["status"] == "online"
    assert [n["name"] for n in cpod["nodes"]] == ["worker1", "worker2", "cpu1"]
    assert cpod["nodes"][0]["gpu"]["driver"] == "550.54.15"
    assert cpod["gpu_summary"] == [
        {
            "product": "NVIDIA-A100-SXM4-80GB",
            "memory_mib": 81920,
            "total": 16,
            "allocatable": 14,
            "used": 2,
            "available": 12,
            "price_per_hour": None,  # prices are shown where users choose a GPU (gpu-types)
        }
    ]
    assert client.get(f"/api/v1/cpods/{reg['cpod_id']}", headers=headers).json()["last_heartbeat_at"]


def test_same_cluster_comes_back_as_the_same_cpod(client: TestClient) -> None:
    headers, key = provider(client)
    first = register_cpod(client, key, "cluster-a")
    again = register_cpod(client, key, "cluster-a")
    other = register_cpod(client, key, "cluster-b")
    assert first["cpod_id"] == again["cpod_id"] != other["cpod_id"]
    # The earlier token of that cluster stops working: one agent per CPod holds a token.
    assert beat(client, first["cpod_token"], 1, []).status_code == 401
    assert beat(client, again["cpod_token"], 1, []).status_code == 200
    assert len(client.get("/api/v1/cpods", headers=headers).json()) == 2


def test_access_key_rotation_does_not_disconnect_registered_cpods(client: TestClient) -> None:
    headers, key = provider(client)
    reg = register_cpod(client, key)
    client.post("/api/v1/me/access-key/rotate", headers=headers)
    assert beat(client, reg["cpod_token"], 1, [gpu_node("w1")]).status_code == 200
    # The old key can no longer register anything.
    refused = client.post(
        "/api/v1/agent/register",
        headers={"Authorization": f"Bearer {key}"},
        json={"cluster_uid": "cluster-new", "runtime": "local", "agent_version": "t"},
    )
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "bad_access_key"


@pytest.mark.parametrize("bearer", ["sxak_wrong", "sxwl_notakey", None])
def test_wrong_access_key_is_401(client: TestClient, bearer: str | None) -> None:
    provider(client)
    headers = {"Authorization": f"Bearer {bearer}"} if bearer else {}
    response = client.post(
        "/api/v1/agent/register",
        headers=headers,
        json={"cluster_uid": "cluster-0001", "runtime": "local", "agent_version": "t"},
    )
    assert response.status_code == 401


def test_a_users_login_token_cannot_register_or_heartbeat(client: TestClient) -> None:
    headers, _ = provider(client)
    assert (
        client.post(
            "/api/v1/agent/register",
            headers=headers,
            json={"cluster_uid": "cluster-0001", "runtime": "local", "agent_version": "t"},
        ).status_code
        == 401
    )
    user_headers = login(client, "owner@example.com")
    response = client.post("/api/v1/agent/heartbeat", headers=user_headers, json={"seq": 1, "nodes": []})
    assert response.status_code == 403 and response.json()["error"]["code"] == "not_a_cpod"


def test_tokens_do_not_cross_over(client: TestClient) -> None:
    _, key = provider(client)
    reg = register_cpod(client, key)
    # The accessKey only registers; the CPod token only speaks for its CPod.
    assert beat(client, key, 1, []).status_code == 401
    assert (
        client.get("/api/v1/me", headers={"Authorization": f"Bearer {reg['cpod_token']}"}).status_code == 401
    )
    other = register_cpod(client, key, "cluster-other")
    wrong = beat(client, reg["cpod_token"], 1, [], cpod_id=other["cpod_id"])
    assert wrong.status_code == 403 and wrong.json()["error"]["code"] == "wrong_cpod"


def test_unsupported_protocol_gets_a_clear_error(client: TestClient) -> None:
    _, key = provider(client)
    body = {"cluster_uid": "cluster-0001", "runtime": "local", "agent_version": "t"}
    via_body = client.post(
        "/api/v1/agent/register",
        headers={"Authorization": f"Bearer {key}"},
        json=body | {"protocol_version": 99},
    )
    via_header = client.post(
        "/api/v1/agent/register",
        headers={"Authorization": f"Bearer {key}", "X-SXWL-Protocol": "99"},
        json=body,
    )
    for response in (via_body, via_header):
        assert response.status_code == 400
        error = response.json()["error"]
        assert error["code"] == "unsupported_protocol" and "sxwl-agent" in error["message"]


BAD_HEARTBEATS: list[tuple[str, Callable[[dict[str, Any]], None], str]] = [
    ("negative count", lambda b: b["nodes"][0]["gpu"].update(count=-1), "nodes.0.gpu.count"),
    ("allocatable above count", lambda b: b["nodes"][0]["gpu"].update(allocatable=9), "nodes.0.gpu"),
    ("used above count", lambda b: b["nodes"][0]["gpu"].update(used=9), "nodes.0.gpu"),
    ("negative cpu", lambda b: b["nodes"][0].update(cpu_cores=-4), "nodes.0.cpu_cores"),
    ("duplicate names", lambda b: b["nodes"].append(copy.deepcopy(b["nodes"][0])), "nodes"),
    ("missing name", lambda b: b["nodes"][0].pop("name"), "nodes.0.name"),
    ("missing seq", lambda b: b.pop("seq"), "seq"),
    ("bad status", lambda b: b["nodes"][0].update(status="sleepy"), "nodes.0.status"),
]


@pytest.mark.parametrize(("what", "spoil", "field"), BAD_HEARTBEATS, ids=[b[0] for b in BAD_HEARTBEATS])
def test_malformed_heartbeat_is_422_and_changes_nothing(
    client: TestClient, what: str, spoil: Callable[[dict[str, Any]], None], field: str
) -> None:
    headers, key = provider(client)
    reg = register_cpod(client, key)
    assert beat(client, reg["cpod_token"], 1, [gpu_node("w1")]).status_code == 200
    before = client.get("/api/v1/cpods", headers=headers).json()

    body: dict[str, Any] = {"seq": 2, "nodes": [gpu_node("w1", count=8, used=1)]}
    spoil(body)
    response = client.post(
        "/api/v1/agent/heartbeat", headers={"Authorization": f"Bearer {reg['cpod_token']}"}, json=body
    )
    assert response.status_code == 422, what
    assert field in [d["field"] for d in response.json()["error"]["details"]]
    assert client.get("/api/v1/cpods", headers=headers).json() == before


def test_oversize_heartbeat_is_413_and_changes_nothing(make_client: Callable[..., TestClient]) -> None:
    client = make_client(heartbeat_max_bytes=4096)
    headers, key = provider(client)
    reg = register_cpod(client, key)
    node = gpu_node("w1")
    node["gpu"]["devices"] = [{"index": i, "utilization_pct": 50} for i in range(300)]
    response = beat(client, reg["cpod_token"], 1, [node])
    assert response.status_code == 413
    assert client.get("/api/v1/cpods", headers=headers).json()[0]["nodes"] == []
    assert beat(client, reg["cpod_token"], 1, [gpu_node("w1")]).status_code == 200


def test_node_count_limit_is_422_naming_nodes(make_client: Callable[..., TestClient]) -> None:
    client = make_client(heartbeat_max_nodes=3)
    _, key = provider(client)
    reg = register_cpod(client, key)
    response = beat(client, reg["cpod_token"], 1, [gpu_node(f"w{i}") for i in range(4)])
    assert response.status_code == 422
    assert response.json()["error"]["details"][0]["field"] == "nodes"


def test_stale_heartbeats_are_ignored(client: TestClient) -> None:
    headers, key = provider(client)
    reg = register_cpod(client, key)
    assert beat(client, reg["cpod_token"], 5, [gpu_node("new")]).json()["accepted"] is True
    stale = beat(client, reg["cpod_token"], 3, [gpu_node("old")]).json()
    assert stale["accepted"] is False and stale["last_seq"] == 5
    assert [n["name"] for n in client.get("/api/v1/cpods", headers=headers).json()[0]["nodes"]] == ["new"]


def test_providers_are_isolated_and_users_see_only_totals(client: TestClient) -> None:
    a_headers, a_key = provider(client, "a@example.com")
    _, b_key = provider(client, "b@example.com")
    a = register_cpod(client, a_key, "cluster-a")
    b = register_cpod(client, b_key, "cluster-b")
    beat(client, a["cpod_token"], 1, [gpu_node("a1", used=3)])
    beat(client, b["cpod_token"], 1, [gpu_node("b1", count=4)])

    assert [c["id"] for c in client.get("/api/v1/cpods", headers=a_headers).json()] == [a["cpod_id"]]
    for method, path, body in (
        ("GET", f"/api/v1/cpods/{b['cpod_id']}", None),
        ("PATCH", f"/api/v1/cpods/{b['cpod_id']}", {"name": "mine now"}),
        ("DELETE", f"/api/v1/cpods/{b['cpod_id']}", None),
        ("GET", f"/api/v1/cpods/{b['cpod_id']}/events", None),
    ):
        assert client.request(method, path, headers=a_headers, json=body).status_code == 403
    assert client.get("/api/v1/cpods/nope", headers=a_headers).status_code == 404
    assert beat(client, b["cpod_token"], 2, [gpu_node("b1", count=4)]).status_code == 200  # B unharmed

    register(client, "dev@example.com", "user")
    user = login(client, "dev@example.com")
    assert client.get("/api/v1/cpods", headers=user).status_code == 403
    assert client.get(f"/api/v1/cpods/{a['cpod_id']}", headers=user).status_code == 403
    types = client.get("/api/v1/gpu-types", headers=user).json()
    assert types == [
        {
            "product": "NVIDIA-A100-SXM4-80GB",
            "memory_mib": 81920,
            "available": 9,
            "total": 12,
            "price_per_hour": None,  # billing is off in this test: nothing is priced
        }
    ]
    assert "a@example.com" not in str(types)

    admin = make_admin(client)
    everything = client.get("/api/v1/cpods", headers=admin).json()
    assert {(c["id"], c["owner_email"]) for c in everything} == {
        (a["cpod_id"], "a@example.com"),
        (b["cpod_id"], "b@example.com"),
    }


def test_rename_revoke_and_event_history(client: TestClient) -> None:
    headers, key = provider(client)
    reg = register_cpod(client, key)
    beat(client, reg["cpod_token"], 1, [gpu_node("w1")])
    renamed = client.patch(f"/api/v1/cpods/{reg['cpod_id']}", headers=headers, json={"name": "beijing-a100"})
    assert renamed.status_code == 200 and renamed.json()["name"] == "beijing-a100"
    assert (
        client.patch(f"/api/v1/cpods/{reg['cpod_id']}", headers=headers, json={"name": ""}).status_code == 422
    )
    assert (
        client.patch(f"/api/v1/cpods/{reg['cpod_id']}", headers=headers, json={"name": "x" * 65}).status_code
        == 422
    )

    assert client.delete(f"/api/v1/cpods/{reg['cpod_id']}", headers=headers).status_code == 204
    refused = beat(client, reg["cpod_token"], 2, [gpu_node("w1")])
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "cpod_revoked"
    cpod = client.get(f"/api/v1/cpods/{reg['cpod_id']}", headers=headers).json()
    assert cpod["revoked"] is True and cpod["status"] == "offline"

    events = client.get(f"/api/v1/cpods/{reg['cpod_id']}/events", headers=headers).json()
    assert [e["kind"] for e in events] == ["revoked", "renamed", "online", "registered"]
    assert events[0]["actor"] == "owner@example.com"
    assert events[1]["detail"].endswith("→ beijing-a100")

    # Registering again (a provider redeploying) lifts the revocation, same CPod.
    again = register_cpod(client, key)
    assert again["cpod_id"] == reg["cpod_id"]
    assert beat(client, again["cpod_token"], 3, [gpu_node("w1")]).json()["accepted"] is True


def test_liveness_counts_missed_intervals(make_client: Callable[..., TestClient]) -> None:
    client = make_client(heartbeat_interval_s=10, unknown_after_missed=3, offline_grace_s=60)
    headers, key = provider(client)
    reg = register_cpod(client, key)
    beat(client, reg["cpod_token"], 1, [gpu_node("w1")])
    ctx = ctx_of(client)
    start = utcnow()

    def status() -> str:
        result: str = client.get(f"/api/v1/cpods/{reg['cpod_id']}", headers=headers).json()["status"]
        return result

    assert cpods.sweep_liveness(ctx, start + timedelta(seconds=25)) == [] and status() == "online"  # 2 missed
    assert [s for _, s in cpods.sweep_liveness(ctx, start + timedelta(seconds=31))] == ["unknown"]
    assert status() == "unknown"
    assert cpods.sweep_liveness(ctx, start + timedelta(seconds=80)) == [] and status() == "unknown"
    assert [s for _, s in cpods.sweep_liveness(ctx, start + timedelta(seconds=91))] == ["offline"]
    assert status() == "offline"
    # Nothing online is advertised for an offline CPod.
    assert client.get("/api/v1/gpu-types", headers=headers).json() == []
    beat(client, reg["cpod_token"], 2, [gpu_node("w1")])
    assert status() == "online"
    kinds = [e["kind"] for e in client.get(f"/api/v1/cpods/{reg['cpod_id']}/events", headers=headers).json()]
    assert kinds == ["online", "offline", "unknown", "online", "registered"]


def test_access_key_check_for_deployment_tools(client: TestClient) -> None:
    headers, key = provider(client)
    reg = register_cpod(client, key, name="rack-1")
    beat(client, reg["cpod_token"], 1, [gpu_node("w1")])
    ok = client.get("/api/v1/agent/access-key/check", headers={"Authorization": f"Bearer {key}"})
    assert ok.status_code == 200
    assert ok.json() == {
        "provider": "owner@example.com",
        "cpods": [{"id": reg["cpod_id"], "name": "rack-1", "status": "online", "revoked": False}],
        "min_artifact_version": "0.1.0",
    }
    for bearer in ("sxak_wrong", reg["cpod_token"], headers["Authorization"].split()[1]):
        bad = client.get("/api/v1/agent/access-key/check", headers={"Authorization": f"Bearer {bearer}"})
        assert bad.status_code == 401 and bad.json()["error"]["code"] == "bad_access_key"
    assert client.get("/api/v1/agent/access-key/check").status_code == 401


def test_a_cpod_says_whether_it_runs_fine_tunes_at_each_start(client: TestClient) -> None:
    headers, key = provider(client)
    local = register_cpod(client, key, "cluster-local")  # an agent from before the field: local runs them
    kube = register_cpod(client, key, "cluster-kube", runtime="kubernetes")
    shown = {c["id"]: c["fine_tunes"] for c in client.get("/api/v1/cpods", headers=headers).json()}
    assert shown == {local["cpod_id"]: True, kube["cpod_id"]: False}
    # The Kubernetes agent restarts with a trainer image and says so in its report.
    reply = client.put(
        "/api/v1/agent/isolation",
        headers={"Authorization": f"Bearer {kube['cpod_token']}"},
        json={"isolation": "isolated", "fine_tunes": True},
    )
    assert reply.status_code == 200
    assert client.get(f"/api/v1/cpods/{kube['cpod_id']}", headers=headers).json()["fine_tunes"] is True
    events = client.get(f"/api/v1/cpods/{kube['cpod_id']}/events", headers=headers).json()
    assert any(e["kind"] == "fine-tunes" and e["detail"] == "now takes fine-tunes" for e in events)
    bad = client.put(
        "/api/v1/agent/isolation",
        headers={"Authorization": f"Bearer {kube['cpod_token']}"},
        json={"isolation": "isolated", "fine_tunes": "yes"},
    )
    assert bad.status_code == 422 and "fine_tunes" in bad.text
    assert client.get(f"/api/v1/cpods/{kube['cpod_id']}", headers=headers).json()["fine_tunes"] is True
