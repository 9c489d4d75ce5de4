"""Cloud and agent as real processes on loopback."""

from __future__ import annotations

import os
import signal
import stat
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from sxwl.agent.inventory.local import memory_mib
from tests.support.agent import AgentProcess, eventually
from tests.support.cloud import CloudProcess, Provider
from tests.support.net import free_port

INTERVAL = "0.3"


@pytest.fixture
def cloud(tmp_path: Path, db_url: str) -> Iterator[CloudProcess]:
    process = CloudProcess(
        tmp_path / "cloud",
        free_port(),
        env={
            "SXWL_DATABASE_URL": db_url,
            "SXWL_HEARTBEAT_INTERVAL_MIN_S": "0.1",
            "SXWL_LIVENESS_CHECK_S": "0.1",
            "SXWL_OFFLINE_GRACE_S": "0.6",
        },
    )
    yield process
    process.stop()


def test_agent_registers_reports_goes_offline_and_comes_back(cloud: CloudProcess, tmp_path: Path) -> None:
    provider = Provider(cloud)
    state = tmp_path / "agent-state"
    agent = AgentProcess(cloud.url, state, provider.key, "--heartbeat-interval", INTERVAL, "--name", "lab")
    try:
        cpod = eventually(lambda: provider.only_cpod("online"), what="the CPod to be online")
        (node,) = cpod["nodes"]
        assert node["cpu_cores"] == os.cpu_count()
        assert node["memory_mib"] == memory_mib()
        assert node["gpu"] is None  # no NVIDIA driver on this machine
        assert cpod["name"] == "lab" and cpod["runtime"] == "local"
        token_file = state / "cpod.json"
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
        assert provider.key not in token_file.read_text()  # only the CPod's own token is kept

        agent.signal(signal.SIGKILL)
        agent.wait()
        eventually(lambda: provider.only_cpod("unknown"), what="unknown after missed heartbeats")
        eventually(lambda: provider.only_cpod("offline"), what="offline after the grace")

        # Restarted without the accessKey: the saved token is enough, and it is the same CPod.
        agent = AgentProcess(cloud.url, state, None, "--heartbeat-interval", INTERVAL)
        back = eventually(lambda: provider.only_cpod("online"), what="the CPod back online")
        assert back["id"] == cpod["id"]
        kinds = [
            e["kind"]
            for e in httpx.get(
                f"{cloud.url}/api/v1/cpods/{cpod['id']}/events", headers=provider.headers
            ).json()
        ]
        assert kinds == ["online", "offline", "unknown", "online", "registered"]

        agent.signal(signal.SIGTERM)
        assert agent.wait() == 0
        assert "stopping" in agent.log
    finally:
        agent.stop()


def test_rotating_the_access_key_keeps_the_agent_connected(cloud: CloudProcess, tmp_path: Path) -> None:
    provider = Provider(cloud)
    agent = AgentProcess(cloud.url, tmp_path / "state", provider.key, "--heartbeat-interval", INTERVAL)
    try:
        cpod = eventually(lambda: provider.only_cpod("online"), what="online")
        httpx.post(f"{cloud.url}/api/v1/me/access-key/rotate", headers=provider.headers).raise_for_status()
        seen = cpod["last_heartbeat_at"]
        eventually(
            lambda: (c := provider.only_cpod("online")) and c["last_heartbeat_at"] != seen,
            what="heartbeats after rotation",
        )
        assert agent.proc.poll() is None
    finally:
        agent.stop()


def test_revoked_cpod_makes_its_agent_stop(cloud: CloudProcess, tmp_path: Path) -> None:
    provider = Provider(cloud)
    agent = AgentProcess(cloud.url, tmp_path / "state", provider.key, "--heartbeat-interval", INTERVAL)
    try:
        cpod = eventually(lambda: provider.only_cpod("online"), what="online")
        httpx.delete(f"{cloud.url}/api/v1/cpods/{cpod['id']}", headers=provider.headers).raise_for_status()
        assert agent.wait() == 3
        assert "revoked" in agent.log
    finally:
        agent.stop()


def test_wrong_access_key_exits_non_zero_with_a_message(cloud: CloudProcess, tmp_path: Path) -> None:
    Provider(cloud)
    agent = AgentProcess(cloud.url, tmp_path / "state", "sxak_not-the-key")
    try:
        assert agent.wait() == 3
        assert "accessKey is not valid" in agent.log
        assert not (tmp_path / "state" / "cpod.json").exists()
    finally:
        agent.stop()


def test_missing_access_key_is_a_usage_error(cloud: CloudProcess, tmp_path: Path) -> None:
    agent = AgentProcess(cloud.url, tmp_path / "state", None)
    try:
        assert agent.wait() == 3
        assert "SXWL_ACCESS_KEY" in agent.log
    finally:
        agent.stop()


def test_unreachable_cloud_means_backoff_not_a_crash(tmp_path: Path) -> None:
    agent = AgentProcess(f"http://127.0.0.1:{free_port()}", tmp_path / "state", "sxak_whatever")
    try:
        eventually(lambda: agent.log.count("unreachable") >= 2, what="two retry log lines")
        assert "retrying in" in agent.log
        assert agent.proc.poll() is None
        agent.signal(signal.SIGTERM)
        assert agent.wait() == 0
    finally:
        agent.stop()
