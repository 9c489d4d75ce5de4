"""The between-bytes timeout of a relayed stream (api/openai/pacing.py): a stalled
engine ends the stream with a TimeoutError, a slow client does not, and a cancellation from
elsewhere (the client gone) stays a cancellation."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from sxwl.cloud.api.openai.pacing import paced
from tests.support.threads import run_on_thread

LIMIT_S = 0.3


async def _engine(chunks: int, then_stall: bool, gap_s: float = 0.0) -> AsyncIterator[bytes]:
    for index in range(chunks):
        if gap_s:
            await asyncio.sleep(gap_s)
        yield f"data: {index}\n\n".encode()
    if then_stall:
        await asyncio.Event().wait()


async def _take(stream: AsyncIterator[bytes], client_pause_s: float = 0.0) -> list[bytes]:
    got = []
    async for chunk in stream:
        got.append(chunk)
        if client_pause_s:
            await asyncio.sleep(client_pause_s)
    return got


def test_a_stalled_engine_times_out_after_its_chunks() -> None:
    async def main() -> list[bytes]:
        got: list[bytes] = []
        with pytest.raises(TimeoutError, match="nothing for"):
            async for chunk in paced(_engine(3, then_stall=True), None, between_s=LIMIT_S):
                got.append(chunk)
        return got

    assert run_on_thread(main()) == [b"data: 0\n\n", b"data: 1\n\n", b"data: 2\n\n"]


def test_a_slow_client_and_an_engine_under_the_limit_are_not_cut() -> None:
    # The client takes longer than the limit for each chunk, and the engine's gaps together pass it:
    # only one wait for a chunk that is longer than the limit counts.
    stream = paced(_engine(4, then_stall=False, gap_s=LIMIT_S / 2), None, between_s=LIMIT_S)
    got = run_on_thread(_take(stream, client_pause_s=LIMIT_S * 1.5))
    assert len(got) == 4


def test_a_cancellation_from_elsewhere_stays_one() -> None:
    async def main() -> bool:
        task = asyncio.create_task(_take(paced(_engine(1, then_stall=True), None, between_s=60.0)))
        await asyncio.sleep(0.1)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            return True
        return False

    assert run_on_thread(main())


def test_keepalives_until_the_first_chunk() -> None:
    async def late() -> AsyncIterator[bytes]:
        await asyncio.sleep(LIMIT_S * 2.5)
        yield b"data: late\n\n"

    got = run_on_thread(_take(paced(late(), LIMIT_S, between_s=LIMIT_S)))
    assert got[-1] == b"data: late\n\n"
    assert got[:-1] and all(chunk.startswith(b":") for chunk in got[:-1])
