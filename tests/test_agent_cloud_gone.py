"""A real agent whose cloud goes away backs off instead of asking again at once, and returns to it.

The agent reaches the cloud through a proxy that counts its long-polls, also while nothing listens
behind it. A stopping cloud ends every held long-poll at once with an empty answer, and answers so
until it stops taking requests; the agent once asked again at once each time (issue 25: twenty
polls in 50 ms)."""

from __future__ import annotations

import signal
import time
from pathlib import Path

from tests.support.agent import AgentProcess, eventually
from tests.support.cloud import CloudProcess, Provider
from tests.support.counting_proxy import CountingProxy
from tests.support.net import free_port

POLLS = b"GET /api/v1/agent/assignments?"
GONE_S = 2.5
# Backing off from 0.5-1 s and doubling, an agent asks once at once when its held poll ends, then
# after each delay (0.5-1 s, then 1-2 s): once in the first half second, at most 3 times in GONE_S.
FIRST_S = 0.5
AT_MOST = 3


def test_an_agent_backs_off_while_its_cloud_is_gone_and_comes_back(tmp_path: Path) -> None:
    port = free_port()
    data_dir = tmp_path / "cloud"
    cloud = CloudProcess(data_dir, port)
    proxy = CountingProxy(port, POLLS)
    agent = None
    try:
        provider = Provider(cloud)
        agent = AgentProcess(proxy.url, tmp_path / "agent", provider.key, "--heartbeat-interval", "1")
        eventually(lambda: provider.only_cpod("online"), what="the CPod online")
        eventually(lambda: proxy.served_since(0) >= 1, what="the agent's first long-poll")

        stopped = time.monotonic()
        cloud.stop()  # SIGTERM: the held long-poll ends at once, then nothing listens
        time.sleep(GONE_S)
        at_once = proxy.since(stopped, stopped + FIRST_S)
        assert at_once <= 1, f"{at_once} long-polls in the first {FIRST_S} s"
        asked = proxy.since(stopped)
        assert 1 <= asked <= AT_MOST, f"{asked} long-polls in {GONE_S} s without a cloud"
        assert agent.proc.poll() is None, agent.log  # still running, waiting for its cloud

        back = time.monotonic()
        cloud = CloudProcess(data_dir, port)
        eventually(lambda: proxy.served_since(back) >= 1, timeout=60, what="a long-poll to the cloud again")
        eventually(lambda: provider.only_cpod("online"), what="the CPod online again")
    finally:
        if agent is not None:
            agent.signal(signal.SIGTERM)
            agent.wait()
        proxy.close()
        cloud.stop()
