"""Group commit: requests that arrive while a write is in progress are written together by the next
one, in one transaction on one worker thread.

A lone request is written at once (no timer, so no added latency when the cloud is quiet); under load
the batches grow by themselves to what the database can take, and the thread hops, round trips and
commits per request shrink with them."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

Item = TypeVar("Item")
Result = TypeVar("Result")


class GroupCommit(Generic[Item, Result]):
    def __init__(
        self, write: Callable[[Sequence[Item]], Sequence[Result | Exception]], max_batch: int = 256
    ) -> None:
        """``write`` runs on a worker thread and returns one result per item, in order; a result that
        is an exception is raised to that item's caller alone. When ``write`` itself raises (the
        transaction failed), the batch's items are written again one by one, so an item that breaks
        the transaction fails alone and the others get their own answers. One batch is written at
        a time: a second writer was measured to split the batches and lengthen the tail on PostgreSQL, and
        SQLite takes one writer anyway."""
        self._write = write
        self._max_batch = max_batch
        self._pending: list[tuple[Item, asyncio.Future[Result]]] = []
        # Cleared by the writer with no await after its last look at the queue: never stale.
        self._writing = False
        self._writer: asyncio.Task[None] | None = None  # a reference, so the running writer is kept

    async def submit(self, item: Item) -> Result:
        future: asyncio.Future[Result] = asyncio.get_running_loop().create_future()
        self._pending.append((item, future))
        if not self._writing:
            self._writing = True
            self._writer = asyncio.create_task(self._drain())
        return await future

    async def _drain(self) -> None:
        try:
            await self._drain_pending()
        finally:
            self._writing = False

    async def _drain_pending(self) -> None:
        while self._pending:
            batch = self._pending[: self._max_batch]
            del self._pending[: self._max_batch]
            try:
                results = await asyncio.to_thread(self._write, [item for item, _ in batch])
            except Exception as exc:
                # One item may have broken the transaction for all: each is tried alone.
                results = [exc] if len(batch) == 1 else [await self._write_alone(item) for item, _ in batch]
            for (_, future), result in zip(batch, results, strict=True):
                if future.done():  # its caller went away
                    continue
                if isinstance(result, Exception):
                    future.set_exception(result)
                else:
                    future.set_result(result)

    async def _write_alone(self, item: Item) -> Result | Exception:
        try:
            (result,) = await asyncio.to_thread(self._write, [item])
        except Exception as exc:  # this item's own transaction failed: its caller alone hears why
            return exc
        return result
