"""When an answer through the tunnel is whole (docs/tunnel.md): two real h2 sessions, the cloud's
and an agent's, joined by an in-memory pipe (tests/support/h2_pipe.py) that the test cuts where an
agent's death would."""

from __future__ import annotations

import asyncio

import pytest

from sxwl.cloud.tunnel import service
from sxwl.tunnel.headers import Headers
from sxwl.tunnel.session import Session, TunnelStream
from tests.support.h2_pipe import pipe
from tests.support.threads import run_on_thread


async def answered_then_cut(head: Headers, body: bytes) -> tuple[bytes, bool]:
    """An agent's end sends ``head`` and ``body`` and is cut before it ends the stream: what the
    cloud's end read of the answer, and whether it took the answer for a cut one."""
    cloud_end, agent_end = pipe()

    async def answer(stream: TunnelStream) -> None:
        await stream.send_head([(":status", "200"), *head])
        await stream.write(body)
        await stream.until_reset()

    cloud = Session(cloud_end, client_side=True)
    agent = Session(agent_end, client_side=False, on_stream=answer)
    running = [asyncio.create_task(cloud.run()), asyncio.create_task(agent.run())]
    opening = [(":method", "GET"), (":scheme", "http"), (":authority", "target"), (":path", "/")]
    stream = await cloud.open(opening, end=True)
    reply = service.TunnelResponse(stream, await stream.head(), None)
    chunks = reply.chunks()
    got = b""
    cut = False
    try:
        while len(got) < len(body):
            got += await anext(chunks)
        cloud_end.cut()  # the agent killed after its last byte, before the stream's end
        async for chunk in chunks:
            got += chunk
    except service.TunnelError:
        cut = True
    finally:
        reply.close()
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)
    return got, cut


def test_an_answer_with_all_its_declared_bytes_is_whole_though_the_tunnel_dies_before_its_end() -> None:
    body = b'[{"id": "kernel"}]'
    assert run_on_thread(answered_then_cut([("content-length", str(len(body)))], body)) == (body, False)


@pytest.mark.parametrize(
    "head",
    [[("content-length", "100")], []],
    ids=["fewer bytes than declared", "no declared length"],
)
def test_an_answer_the_tunnel_cuts_is_an_error(head: Headers) -> None:
    assert run_on_thread(answered_then_cut(head, b"partial")) == (b"partial", True)
