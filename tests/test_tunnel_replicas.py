"""The tunnel with two replicas on one PostgreSQL (docs/tunnel.md, "Several replicas"): the agent's
connections reach replica r1 through a load balancer, the request reaches r2 (in this process, where
the test calls the tunnel's service), which finds r1 in ``tunnel_holders`` and relays to it. When r1
stops, the agent dials again, lands on r2, and r2 serves the CPod itself."""

from __future__ import annotations

import asyncio
import json
import secrets
from pathlib import Path

import websockets
from websockets.exceptions import InvalidStatus

from sxwl.cloud.tunnel import relay, service
from tests.support.agent import eventually, simulated_agent
from tests.support.cloud import CloudProcess
from tests.support.cloud import test_settings as cloud_settings
from tests.support.net import free_port
from tests.support.postgres import TempPostgres
from tests.support.replicas import Balancer
from tests.support.threads import run_on_thread
from tests.support.tunnel import InProcessCloud, Target, provider_key, request


def test_a_request_on_another_replica_is_relayed_and_a_stopping_replica_hands_its_tunnels_over(
    tmp_path: Path, postgres: TempPostgres
) -> None:
    database = postgres.create_database()
    key = secrets.token_urlsafe(48)
    port1 = free_port()
    r1 = CloudProcess(
        tmp_path / "r1",
        port1,
        env={
            "SXWL_DATABASE_URL": database,
            "SXWL_SECRET_KEY": key,
            "SXWL_REPLICA_URL": f"http://127.0.0.1:{port1}",
        },
    )
    port2 = free_port()
    settings = cloud_settings(
        tmp_path / "r2", database, secret_key=key, replica_url=f"http://127.0.0.1:{port2}"
    )
    r2 = InProcessCloud(settings, port=port2)
    target, balancer = Target(), Balancer(port1)
    state = tmp_path / "agent"
    agent = simulated_agent(
        balancer.url,
        state,
        provider_key(r1.url),
        "--tunnel-allow",
        target.address,
        name="behind-nat",
        gpus=1,
        product="SIM-GPU",
    )
    try:
        eventually(lambda: (state / "cpod.json").exists(), what="the agent to register")
        cpod = json.loads((state / "cpod.json").read_text())["cpod_id"]
        eventually(lambda: r2.tunnels._holders(cpod), what="r1 to record that it holds the tunnel")
        assert r2.connections(cpod) == 0

        async def through(path: str, body: bytes) -> tuple[int, bytes]:
            reply = await service.open_stream(r2.tunnels, cpod, target.address, request("POST", path, body))
            async with reply:
                return reply.status, await reply.read()

        async def many() -> list[tuple[int, bytes]]:
            return await asyncio.gather(*(through("/echo", f"relayed {i}".encode()) for i in range(20)))

        assert r2.call(many) == [(200, f"relayed {i}".encode()) for i in range(20)]

        async def abandon() -> bytes:
            reply = await service.open_stream(
                r2.tunnels, cpod, target.address, request("GET", "/hold?id=relayed")
            )
            first = await reply.chunks().__anext__()
            reply.close()
            return first

        assert r2.call(abandon) == b"started\n"
        eventually(lambda: "relayed" in target.gone, what="a reset relayed to the target's request")

        # r1 stops: its tunnels close and its rows go; the balancer now sends new connections to r2.
        balancer.target = port2
        r1.stop()
        eventually(lambda: r2.connections(cpod) == 2, timeout=30, what="the agent to dial r2")
        assert r2.tunnels._holders(cpod) == []
        assert r2.call(lambda: through("/echo", b"local now")) == (200, b"local now")
    finally:
        agent.stop()
        balancer.close()
        r1.stop()
        r2.stop()
        target.stop()


def test_the_relay_route_refuses_whoever_is_not_a_replica(tmp_path: Path) -> None:
    cloud = InProcessCloud(cloud_settings(tmp_path / "cloud", f"sqlite:///{tmp_path / 'sxwl.db'}"))
    url = cloud.url.replace("http://", "ws://") + relay.PATH

    async def status(headers: dict[str, str]) -> int:
        try:
            async with websockets.connect(url, additional_headers=headers, open_timeout=5):
                return 101
        except InvalidStatus as exc:
            return exc.response.status_code

    try:
        stale = f"1000.{'0' * 64}"
        for headers in ({}, {relay.RELAY_HEADER: "x"}, {relay.RELAY_HEADER: stale}):
            assert run_on_thread(status(headers)) == 403
        assert run_on_thread(status({relay.RELAY_HEADER: cloud.tunnels.relay_token()})) == 101
    finally:
        cloud.stop()
