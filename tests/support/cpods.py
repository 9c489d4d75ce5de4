"""Builders for agent-protocol bodies used by several tests."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

A100 = {"vendor": "nvidia", "product": "NVIDIA-A100-SXM4-80GB", "memory_mib": 81920}


def gpu_node(
    name: str,
    count: int = 8,
    allocatable: int | None = None,
    used: int = 0,
    status: str = "ready",
    **gpu: Any,
) -> dict[str, Any]:
    return {
        "name": name,
        "status": status,
        "cpu_cores": 64,
        "memory_mib": 512 * 1024,
        "gpu": {
            **A100,
            "count": count,
            "allocatable": count if allocatable is None else allocatable,
            "used": used,
            "driver": "550.54.15",
            "cuda": "12.4",
            **gpu,
        },
    }


def access_key(client: TestClient, headers: dict[str, str]) -> str:
    key: str = client.get("/api/v1/me/access-key", headers=headers).json()["access_key"]
    return key


def register_cpod(
    client: TestClient, key: str, cluster_uid: str = "cluster-0001", **extra: Any
) -> dict[str, Any]:
    response = client.post(
        "/api/v1/agent/register",
        headers={"Authorization": f"Bearer {key}"},
        json={"cluster_uid": cluster_uid, "runtime": "local", "agent_version": "test", **extra},
    )
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def beat(client: TestClient, token: str, seq: int, nodes: list[dict[str, Any]], **extra: Any) -> Any:
    return client.post(
        "/api/v1/agent/heartbeat",
        headers={"Authorization": f"Bearer {token}"},
        json={"seq": seq, "nodes": nodes, **extra},
    )
